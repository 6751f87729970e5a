"""Training metadata from a restricted-unpickled checkpoint tree: epoch, step, loss, keys, weights summary.

Pure functions over the stub tree safe_unpickle.py builds. A scalar saved as a tensor
(`loss.detach()` instead of `loss.item()`, Lightning's `best_model_score`) has its value
in the zip: `wanted_scalars` names those few tensors so the reader can fetch their bytes,
and `decode_scalar` turns the bytes into a number.
"""

from __future__ import annotations

import collections
import itertools
import math
import re
import struct
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from opsconsole.checkpoints.records import CheckpointMeta, ModelCheckpointState, StateDictSummary
from opsconsole.checkpoints.safe_unpickle import DTYPE_SIZES, DtypeStub, TensorStub, Unresolved
from opsconsole.units import format_bytes

EPOCH_KEYS = ("epoch", "current_epoch", "cur_epoch", "epochs")
STEP_KEYS = ("global_step", "step", "iteration", "iter", "num_updates", "steps")
LOSS_KEYS = ("loss", "val_loss", "valid_loss", "eval_loss", "current_loss", "train_loss")
BEST_KEYS = ("best_loss", "best_val_loss", "best_metric", "best_score")
TIME_KEYS = ("timestamp", "saved_at", "time", "date", "datetime")
METRICS_KEYS = ("metrics", "eval_metrics", "val_metrics")
STATE_DICT_KEYS = ("model_state_dict", "state_dict", "model", "module", "model_state", "net", "weights", "ema")
OPTIMIZER_KEYS = ("optimizer_state_dict", "optimizer", "optimizer_states", "optim", "optimizer_state", "opt")
SCHEDULER_KEYS = ("scheduler_state_dict", "scheduler", "lr_scheduler", "lr_schedulers", "scheduler_state")
MAX_DETAILS = 200
MAX_TEXT = 80
MAX_KEY_TEXT = 200
MAX_FLOAT_INT = 2**1000  # ints past this have no float (and past ~4300 digits no str either)
MAX_CALLBACKS = 16  # ModelCheckpoint states read from one checkpoint
MAX_TOP_K = 1000  # best_k_models entries read from one state
MAX_SCORES_READ = 20  # of their scores fetched from the zip (one member read each)
MAX_PATH_TEXT = 4096
CALLBACK_MODE = re.compile(r"""['"]mode['"]\s*:\s*['"](min|max)['"]""")

_SCALAR_FORMATS = {
    "float64": "<d",
    "float32": "<f",
    "float16": "<e",
    "int64": "<q",
    "int32": "<i",
    "int16": "<h",
    "int8": "<b",
    "uint8": "<B",
    "bool": "<?",
}


def decode_scalar(dtype: str, data: bytes, element: int = 0) -> Optional[float]:
    """Element `element` of little-endian storage bytes as a number (None for a dtype we do not decode)."""
    size = DTYPE_SIZES.get(dtype)
    if size is None or element < 0:  # a negative offset would read from the end
        return None
    raw = data[element * size : (element + 1) * size]
    if len(raw) != size:
        return None
    if dtype == "bfloat16":
        return struct.unpack("<f", b"\x00\x00" + raw)[0]
    fmt = _SCALAR_FORMATS.get(dtype)
    return None if fmt is None else float(struct.unpack(fmt, raw)[0])


def _first(tree: Mapping[Any, Any], keys: Iterable[str]) -> Tuple[Optional[str], Any]:
    for key in keys:
        if key in tree:
            return key, tree[key]
    return None, None


def _lightning_scores(tree: Mapping[Any, Any]) -> Tuple[Any, Any, Optional[str]]:
    """(current_score, best_model_score, monitor) of Lightning's ModelCheckpoint callback state."""
    callbacks = tree.get("callbacks")
    if not isinstance(callbacks, Mapping):
        return None, None, None
    for name, state in callbacks.items():
        if isinstance(name, str) and name.startswith("ModelCheckpoint") and isinstance(state, Mapping):
            return state.get("current_score"), state.get("best_model_score"), state.get("monitor")
    return None, None, None


def _model_checkpoint_items(tree: Mapping[Any, Any]) -> List[Tuple[str, Mapping[Any, Any]]]:
    """(key, state) of every ModelCheckpoint callback state in a Lightning checkpoint (bounded)."""
    callbacks = tree.get("callbacks")
    if not isinstance(callbacks, Mapping):
        return []
    out = []
    for name, state in itertools.islice(callbacks.items(), MAX_CALLBACKS * 8):
        if isinstance(name, str) and name.startswith("ModelCheckpoint") and isinstance(state, Mapping):
            out.append((name, state))
            if len(out) >= MAX_CALLBACKS:
                break
    return out


def _path_text(value: Any) -> Optional[str]:
    """A recorded path: a non-empty str (Lightning writes "" for none), bounded."""
    return value[:MAX_PATH_TEXT] if isinstance(value, str) and value else None


def model_checkpoint_states(tree: Any, scalars: Mapping[TensorStub, float] = {}) -> Tuple[ModelCheckpointState, ...]:
    """What each ModelCheckpoint recorded: monitor, mode, best_model_path and score, best_k_models, kth and last paths."""
    if not isinstance(tree, Mapping):
        return ()
    states = []
    for key, state in _model_checkpoint_items(tree):
        mode = CALLBACK_MODE.search(key[:MAX_PATH_TEXT])
        monitor = state.get("monitor")
        top_k = state.get("best_k_models")
        best_k: List[Tuple[str, Optional[float]]] = []
        if isinstance(top_k, Mapping):
            for path, score in itertools.islice(top_k.items(), MAX_TOP_K):
                text = _path_text(path)
                if text is not None:
                    best_k.append((text, _number(score, scalars)))
        states.append(
            ModelCheckpointState(
                key=key[:MAX_PATH_TEXT],
                monitor=monitor[:MAX_KEY_TEXT] if isinstance(monitor, str) else None,
                mode=mode.group(1) if mode else None,
                best_model_path=_path_text(state.get("best_model_path")),
                best_model_score=_number(state.get("best_model_score"), scalars),
                kth_best_model_path=_path_text(state.get("kth_best_model_path")),
                last_model_path=_path_text(state.get("last_model_path")),
                dirpath=_path_text(state.get("dirpath")),
                best_k_models=tuple(best_k),
            )
        )
    return tuple(states)


def wanted_scalars(tree: Any) -> List[TensorStub]:
    """The one-element tensors whose values the metadata needs (loss, epoch, scores, metrics)."""
    if not isinstance(tree, Mapping):
        return []
    values: List[Any] = []
    for keys in (EPOCH_KEYS, STEP_KEYS, LOSS_KEYS, BEST_KEYS):
        values.append(_first(tree, keys)[1])
    values.extend(_lightning_scores(tree)[:2])
    for _, state in _model_checkpoint_items(tree):
        values.append(state.get("best_model_score"))
        top_k = state.get("best_k_models")
        if isinstance(top_k, Mapping):
            values.extend(itertools.islice(top_k.values(), MAX_SCORES_READ))
    metrics = _first(tree, METRICS_KEYS)[1]
    if isinstance(metrics, Mapping):
        values.extend(list(metrics.values())[:50])
    return [v for v in values if isinstance(v, TensorStub) and v.numel == 1]


def _number(value: Any, scalars: Mapping[TensorStub, float]) -> Optional[float]:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int):
        return float(value) if -MAX_FLOAT_INT < value < MAX_FLOAT_INT else None  # float(10**400) raises
    if isinstance(value, float):
        return float(value)
    if isinstance(value, TensorStub):
        return scalars.get(value)
    return None


COUNT_LIMIT = 2**63  # an epoch or step at or beyond this is no run's (the frames' INT_LIMIT too)


def plausible_count(number: Any) -> Optional[int]:
    """An epoch or step as an int: None for what no run reaches (NaN, infinities, 1e308, 10**30, not a number).

    Read as they were, such numbers were listed whole: an epoch of 1e308 took 309 digits of the listing.
    """
    if type(number) is float:
        if not math.isfinite(number) or not -COUNT_LIMIT < number < COUNT_LIMIT:
            return None
        number = int(number)
    if type(number) is not int or not -COUNT_LIMIT < number < COUNT_LIMIT:
        return None
    return number


def _integer(value: Any, scalars: Mapping[TensorStub, float]) -> Optional[int]:
    number = _number(value, scalars)
    if number is None or not math.isfinite(number):
        return None
    return plausible_count(int(number))


def _walk_tensors(value: Any) -> Iterable[TensorStub]:
    """Every tensor below `value`, each container visited once.

    A pickle can share one list many times over (l1 = [l0, l0], l2 = [l1, l1] ...): a tiny
    file whose naive walk never ends. Visiting each container once keeps it linear.
    """
    stack = [(value, 0)]
    seen = set()
    while stack:
        item, depth = stack.pop()
        if type(item) is TensorStub:
            yield item
            continue
        if depth > 12 or not isinstance(item, (dict, list, tuple)) or id(item) in seen:
            continue
        seen.add(id(item))
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)


def summarize_tensors(value: Any, source: str = "") -> StateDictSummary:
    """Tensor count, dtypes (most common first) and bytes (each storage once) below `value`."""
    dtypes: "collections.Counter[str]" = collections.Counter()
    storages: Dict[str, int] = {}
    count = 0
    for tensor in _walk_tensors(value):
        count += 1
        dtypes[tensor.dtype] += 1
        storages[tensor.storage.key] = tensor.storage.numel * DTYPE_SIZES.get(tensor.storage.dtype, 1)
    return StateDictSummary(keys=count, dtypes=tuple(dtypes.most_common()), bytes=sum(storages.values()), source=source)


def _is_state_dict(value: Any) -> bool:
    if not isinstance(value, Mapping) or not value:
        return False
    known = set(EPOCH_KEYS + STEP_KEYS + LOSS_KEYS + STATE_DICT_KEYS + OPTIMIZER_KEYS + METRICS_KEYS)
    if any(isinstance(key, str) and key in known for key in value):
        return False  # a training checkpoint that happens to hold tensors at the top
    tensors = sum(1 for item in value.values() if isinstance(item, TensorStub))
    return tensors * 10 >= len(value) * 9


def _present(tree: Mapping[Any, Any], keys: Iterable[str]) -> bool:
    for key in keys:
        if key in tree:
            value = tree[key]
            if value is None:
                continue
            if isinstance(value, (Mapping, list, tuple)) and not value:
                continue
            return True
    return False


def describe_value(value: Any, scalars: Mapping[TensorStub, float] = {}) -> str:
    """One line for the detail view: `3`, `tensor float32 [] = 0.25`, `dict: 12 keys, 10 tensors, 40 MiB`."""
    if isinstance(value, TensorStub):
        text = "tensor %s %s" % (value.dtype, list(value.shape))
        if value in scalars:
            text += " = %g" % scalars[value]
        return text
    if isinstance(value, Unresolved):
        return "<%s: not loaded (outside the safe list)>" % value.qualname[:MAX_KEY_TEXT]
    if isinstance(value, type) and issubclass(value, Unresolved):
        return "<%s: not loaded>" % value.qualname[:MAX_KEY_TEXT]
    if isinstance(value, (dict, Mapping, list, tuple, set, frozenset)):
        kind = type(value).__name__
        size = len(value)
        summary = summarize_tensors(value) if isinstance(value, (Mapping, list, tuple)) else StateDictSummary()
        text = "%s: %d %s" % (kind, size, "keys" if isinstance(value, Mapping) else "items")
        if summary.keys:
            text += ", %d tensors (%s), %s" % (
                summary.keys,
                ", ".join(d for d, _ in summary.dtypes[:3]),
                format_bytes(summary.bytes),
            )
        elif isinstance(value, Mapping) and size:
            keys = [_key_text(k)[:MAX_TEXT] for k in list(value)[:6]]
            text += ": " + ", ".join(keys) + (", ..." if size > 6 else "")
        return text[: MAX_TEXT * 2]
    return short_text(value)


def short_text(value: Any, limit: int = MAX_TEXT) -> str:
    """A bounded one-line text of any unpickled value, without calling its repr on a container.

    repr of a container walks all of it (2**60 steps for a shared nested list), repr of a
    huge int raises past 4300 digits, and an object of a class we never loaded has no repr
    worth calling: the text is built from the few types whose repr is cheap and bounded.
    """
    if isinstance(value, (str, bytes, bytearray)):
        text = repr(value[:limit])
    elif isinstance(value, bool) or value is None or isinstance(value, (float, complex, DtypeStub)):
        text = repr(value)
    elif isinstance(value, int):
        text = repr(value) if -(10**60) < value < 10**60 else "<int of %d bits>" % value.bit_length()
    elif isinstance(value, TensorStub):
        text = repr(value)
    elif isinstance(value, Unresolved) or (isinstance(value, type) and issubclass(value, Unresolved)):
        text = "<%s>" % value.qualname[:limit]
    elif isinstance(value, tuple) and len(value) <= 4 and all(type(v) in (int, str, float, bool) for v in value):
        text = "(" + ", ".join(short_text(v, limit) for v in value) + ("," if len(value) == 1 else "") + ")"
    else:
        size = len(value) if isinstance(value, (tuple, list, dict, set, frozenset)) else None
        text = "<%s%s>" % (type(value).__name__, "" if size is None else " of %d" % size)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _key_text(key: Any) -> str:
    return key[:MAX_KEY_TEXT] if isinstance(key, str) else short_text(key, MAX_KEY_TEXT)


def metadata_from_tree(
    tree: Any, scalars: Mapping[TensorStub, float] = {}, unsafe_globals: Iterable[str] = ()
) -> CheckpointMeta:
    """CheckpointMeta of an unpickled checkpoint tree (a dict as CheckpointManager saves it, or a bare state dict)."""
    unsafe = tuple(unsafe_globals)
    if not isinstance(tree, Mapping):
        summary = summarize_tensors(tree)
        return CheckpointMeta(
            details=(("(root)", describe_value(tree, scalars)),),
            state_dict=summary if summary.keys else None,
            has_optimizer=False,
            has_scheduler=False,
            unsafe_globals=unsafe,
        )
    if _is_state_dict(tree):
        return CheckpointMeta(
            top_keys=tuple(_key_text(k) for k in list(tree)[:MAX_DETAILS]),
            details=(("(state dict)", describe_value(tree, scalars)),),
            state_dict=summarize_tensors(tree),
            has_optimizer=False,
            has_scheduler=False,
            unsafe_globals=unsafe,
        )
    current, best_score, monitor = _lightning_scores(tree)
    loss = _number(_first(tree, LOSS_KEYS)[1], scalars)
    best_loss = _number(_first(tree, BEST_KEYS)[1], scalars)
    monitor = monitor if monitor is None or isinstance(monitor, str) else short_text(monitor)
    if loss is None and current is not None and (monitor is None or "loss" in monitor):
        loss = _number(current, scalars)
    if best_loss is None and best_score is not None and (monitor is None or "loss" in monitor):
        best_loss = _number(best_score, scalars)
    stamp = _first(tree, TIME_KEYS)[1]
    timestamp = None
    if isinstance(stamp, str):
        timestamp = stamp[:64]
    elif isinstance(stamp, (int, float)) and not isinstance(stamp, bool):
        number = _number(stamp, scalars)
        timestamp = "%g" % number if number is not None else short_text(stamp, 64)
    metrics: List[Tuple[str, Any]] = []
    metric_tree = _first(tree, METRICS_KEYS)[1]
    if isinstance(metric_tree, Mapping):
        for key, value in list(metric_tree.items())[:50]:
            number = _number(value, scalars)
            metrics.append((_key_text(key), number if number is not None else describe_value(value, scalars)))
    state_key, state = _first(tree, STATE_DICT_KEYS)
    summary = None
    if isinstance(state, Mapping):
        summary = summarize_tensors(state, state_key or "")
    else:
        everything = summarize_tensors(tree)
        summary = everything if everything.keys else None
    details = tuple((_key_text(key), describe_value(value, scalars)) for key, value in list(tree.items())[:MAX_DETAILS])
    return CheckpointMeta(
        epoch=_integer(_first(tree, EPOCH_KEYS)[1], scalars),
        step=_integer(_first(tree, STEP_KEYS)[1], scalars),
        loss=loss,
        best_loss=best_loss,
        timestamp=timestamp,
        metrics=tuple(metrics),
        top_keys=tuple(_key_text(k) for k in list(tree)[:MAX_DETAILS]),
        details=details,
        state_dict=summary,
        has_optimizer=_present(tree, OPTIMIZER_KEYS),
        has_scheduler=_present(tree, SCHEDULER_KEYS),
        unsafe_globals=unsafe,
        callbacks=model_checkpoint_states(tree, scalars),
    )
