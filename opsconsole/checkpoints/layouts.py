"""What each training library calls one checkpoint, from the names it writes. Pure: names in, units out.

A unit is listed, judged and deleted whole. Each library has its function here:

- CheckpointManager: `checkpoint_epoch_N.pt`, `checkpoint_best.pt`, the `checkpoint_latest.pt` link.
- Lightning ModelCheckpoint: `epoch=N-step=M.ckpt` and `last.ckpt`; best and top-k come from the
  callback state inside the newest .ckpt (see scan.py), never from names.
- HF Trainer: `checkpoint-N/` directories; the files at the top of an output directory
  (model.safetensors, config.json, training_args.bin, tokenizer files ...) are the final model.
- accelerate: a `save_state` directory (model, optimizer.bin, scheduler.bin, random_states_N.pkl);
  automatic naming puts them in `checkpoints/checkpoint_N/`.
- DeepSpeed: `global_stepN/` tags (mp_rank_00_model_states.pt, *_optim_states.pt); `latest` names the current one.
- Megatron: `iter_NNNNNNN/` (mp_rank_XX/model_optim_rng.pt, or DCP); `latest_checkpointed_iteration.txt`.
- torch.distributed.checkpoint: `.metadata` and `__R_N.distcp` shards; torchtitan names them `step-N/`.
- Sharded safetensors: `model.safetensors.index.json` and the shards it names, one unit.

Only members of a numbered series (the names above with N in them) are retention candidates.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

from opsconsole.checkpoints.records import (
    FORMAT_ACCELERATE,
    FORMAT_DCP,
    FORMAT_DEEPSPEED,
    FORMAT_HF,
    FORMAT_MEGATRON,
    LAYOUT_ACCELERATE,
    LAYOUT_CHECKPOINT_MANAGER,
    LAYOUT_DCP,
    LAYOUT_DEEPSPEED,
    LAYOUT_FILE,
    LAYOUT_HF_CHECKPOINT,
    LAYOUT_HF_FINAL,
    LAYOUT_LIGHTNING,
    LAYOUT_MEGATRON,
    LAYOUT_NUMBERED,
    LAYOUT_SHARDED,
    LAYOUT_TORCHTITAN,
)

# Directory names each library gives one checkpoint, with the series they form.
NAMED_DIRS: Tuple[Tuple["re.Pattern[str]", str, str], ...] = (
    (re.compile(r"^checkpoint-(\d+)$"), "checkpoint-N/", LAYOUT_HF_CHECKPOINT),
    (re.compile(r"^checkpoint_(\d+)$"), "checkpoint_N/", LAYOUT_ACCELERATE),
    (re.compile(r"^global_step(\d+)$"), "global_stepN/", LAYOUT_DEEPSPEED),
    (re.compile(r"^iter_(\d+)$"), "iter_N/", LAYOUT_MEGATRON),
    (re.compile(r"^step-(\d+)$"), "step-N/", LAYOUT_TORCHTITAN),
)
# Other numbered directory names (step_40/, epoch_3/): a series when the content is a known unit.
NUMBERED_DIR = re.compile(r"^([A-Za-z][A-Za-z_]*?)[_\-]?(\d+)$")
NESTED_SERIES_DIRS = ("checkpoints", "checkpoint")  # accelerate's automatic naming, torchtitan's folder

DCP_SHARD = re.compile(r"^__(\d+)_(\d+)\.distcp$")
DEEPSPEED_FILE = re.compile(r"(^|_)mp_rank_\d+_model_states\.pt$|_optim_states\.pt$")
MEGATRON_RANK_DIR = re.compile(r"^mp_rank_\d+(_\d+)*$")
ACCELERATE_FILE = re.compile(
    r"^(optimizer(_\d+)?\.bin|scheduler(_\d+)?\.bin|sampler(_\d+)?\.bin|random_states_\d+\.pkl|scaler\.pt|custom_checkpoint_\d+\.pkl)$"
)
ACCELERATE_RNG_STATES = re.compile(r"^random_states_\d+\.pkl$")  # what save_state writes last
WEIGHT_FILE = re.compile(
    r"^(model|pytorch_model|adapter_model|diffusion_pytorch_model)(_\d+)?(-\d+-of-\d+)?\.(safetensors|bin)$"
)
SHARD_FILE = re.compile(r"^(.+)-(\d+)-of-(\d+)\.safetensors$")
INDEX_SUFFIX = ".safetensors.index.json"
# Files a save_model()/save_pretrained() writes beside the weights (the final model's members).
HF_COMPANIONS = frozenset(
    (
        "config.json",
        "generation_config.json",
        "training_args.bin",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "spiece.model",
        "tokenizer.model",
        "sentencepiece.bpe.model",
        "chat_template.jinja",
        "chat_template.json",
        "preprocessor_config.json",
        "processor_config.json",
        "adapter_config.json",
        "pytorch_model.bin.index.json",
        "model.safetensors.index.json",
    )
)
HF_FINAL_MARKERS = ("config.json", "adapter_config.json", "training_args.bin")
CHECKPOINT_MANAGER = re.compile(r"^checkpoint_(epoch_(\d+)|best|latest)\.pt$")
# <prefix><word><sep>N<suffix>: run_step_1200.pt, model_epoch_3.pth, ckpt-iter-500.safetensors
NUMBERED_FILE = re.compile(
    r"^(?P<prefix>.*?)(?P<word>epoch|global_step|step|iteration|iter)(?P<sep>[_\-=]?)(?P<n>\d+)"
    r"(?P<suffix>\.(?:pth\.tar|pt|pth|bin|ckpt|safetensors))$",
    re.I,
)
LIGHTNING_LAST = re.compile(r"^last(-v\d+)?\.ckpt$")
DEEPSPEED_LATEST = "latest"
MEGATRON_LATEST = "latest_checkpointed_iteration.txt"


@dataclass(frozen=True)
class DirKind:
    """A directory recognised as one checkpoint: its format, layout and (when numbered) its series."""

    format: str
    layout: str
    series: Optional[str] = None
    number: Optional[int] = None
    unit: str = "checkpoint"


@dataclass(frozen=True)
class FileGroup:
    """Files at the top of a directory that form one unit (a final model, a sharded model) or a lone file."""

    name: str  # shown name: the main file, or "final model"
    layout: str
    members: Tuple[str, ...]
    weights: Tuple[str, ...]  # the members whose headers are read
    unit: str
    unmanaged: Optional[str] = None
    missing: Tuple[str, ...] = ()  # shards an index names that are not there


def content_format(names: Iterable[str]) -> Optional[str]:
    """Which library wrote a directory, from the names inside it; None when none did."""
    names = set(names)
    if "trainer_state.json" in names:
        return FORMAT_HF
    if ".metadata" in names or any(DCP_SHARD.match(n) for n in names):
        return FORMAT_DCP
    if any(DEEPSPEED_FILE.search(n) for n in names):
        return FORMAT_DEEPSPEED
    if any(MEGATRON_RANK_DIR.match(n) for n in names) and not any(WEIGHT_FILE.match(n) for n in names):
        return FORMAT_MEGATRON
    if any(ACCELERATE_FILE.match(n) for n in names):
        return FORMAT_ACCELERATE
    return None


def dir_kind(name: str, names: Iterable[str]) -> Optional[DirKind]:
    """The unit a directory named `name` holding `names` is, or None when it is no checkpoint."""
    names = frozenset(names)
    # A rescan asks again of every directory with the same names: small ones are remembered.
    return _remembered_dir_kind(name, names) if len(names) <= 64 else _dir_kind(name, names)


def _dir_kind(name: str, names: FrozenSet[str]) -> Optional[DirKind]:
    fmt = content_format(names)
    for pattern, series, layout in NAMED_DIRS:
        match = pattern.match(name)
        if match is None:
            continue
        if fmt is None:
            # The library's name without its files: only weights make it a (partial) checkpoint.
            if not any(WEIGHT_FILE.match(n) for n in names):
                return None
            fmt = FORMAT_HF if layout == LAYOUT_HF_CHECKPOINT else FORMAT_ACCELERATE
        return DirKind(fmt, layout, series, int(match.group(1)))
    if fmt is None:
        return None
    layout = {
        FORMAT_HF: LAYOUT_HF_CHECKPOINT,
        FORMAT_DCP: LAYOUT_DCP,
        FORMAT_DEEPSPEED: LAYOUT_DEEPSPEED,
        FORMAT_MEGATRON: LAYOUT_MEGATRON,
        FORMAT_ACCELERATE: LAYOUT_ACCELERATE,
    }[fmt]
    unit = "save_state" if fmt == FORMAT_ACCELERATE else "checkpoint"
    numbered = NUMBERED_DIR.match(name)
    if numbered:
        return DirKind(fmt, layout, dir_series(name), int(numbered.group(2)), unit)
    return DirKind(fmt, layout, None, None, unit)


_remembered_dir_kind = functools.lru_cache(maxsize=4096)(_dir_kind)


def group_top_files(
    names: Sequence[str], index_maps: Mapping[str, Sequence[str]] = {}
) -> Tuple[List[FileGroup], List[str]]:
    """The units among a directory's top-level files, and the names that are no checkpoint at all.

    A final model (weights beside config.json, training_args.bin or adapter_config.json) is one
    unit with every companion file; a `*.safetensors.index.json` with the shards it names
    (`index_maps`: index name -> shard names, as read) is another; every other checkpoint
    file is its own. Companion files without weights (a training_args.bin beside checkpoint-N/)
    are not checkpoints.
    """
    present = set(names)
    used: set = set()
    groups: List[FileGroup] = []
    indexes = sorted(n for n in present if n.endswith(INDEX_SUFFIX) or n == "pytorch_model.bin.index.json")
    sharded: Dict[str, Tuple[List[str], List[str]]] = {}
    for index in indexes:
        named = list(index_maps.get(index, ()))
        if not named:  # unread: the shard names say which files belong to it
            stem = index[: -len(".index.json")].rsplit(".", 1)[0]
            named = [n for n in present if SHARD_FILE.match(n) and SHARD_FILE.match(n).group(1) == stem]
        sharded[index] = (sorted(n for n in named if n in present), sorted(n for n in set(named) if n not in present))
    final_weights = sorted(n for n in present if WEIGHT_FILE.match(n))
    for shards, _ in sharded.values():
        final_weights.extend(s for s in shards if s not in final_weights)
    if final_weights and any(m in present for m in HF_FINAL_MARKERS):
        members = sorted(set(final_weights) | {n for n in present if n in HF_COMPANIONS} | set(indexes))
        missing = tuple(sorted({m for _, miss in sharded.values() for m in miss}))
        weights = tuple(sorted(set(final_weights)))
        groups.append(
            FileGroup(
                weights[0],
                LAYOUT_HF_FINAL,
                tuple(members),
                weights,
                "final model (%d files)" % len(members),
                "final model (save_model/save_pretrained output): never a deletion candidate",
                missing,
            )
        )
        used.update(members)
    for index, (shards, missing) in sharded.items():
        if index in used:
            continue
        members = tuple(sorted({index, *shards}))
        groups.append(
            FileGroup(
                index,
                LAYOUT_SHARDED,
                members,
                tuple(shards),
                "sharded model (%d shards)" % len(shards),
                "a sharded model without epoch or step: not part of a series",
                tuple(missing),
            )
        )
        used.update(members)
    others = []
    for name in sorted(present - used):
        if name in HF_COMPANIONS or ACCELERATE_FILE.match(name) or not is_checkpoint_file_name(name):
            others.append(name)
        else:
            groups.append(FileGroup(name, LAYOUT_FILE, (name,), (name,), "file"))
    return groups, others


def is_checkpoint_file_name(name: str) -> bool:
    lower = name.lower()
    return lower.endswith((".pt", ".pth", ".bin", ".ckpt", ".pth.tar", ".safetensors"))


def lightning_name(name: str) -> bool:
    """epoch=N-step=M.ckpt (any metric fields) or last.ckpt: a name ModelCheckpoint writes."""
    from opsconsole.checkpoints.formats import lightning_fields

    return lightning_fields(name) is not None


def file_series(name: str) -> Tuple[str, Optional[str]]:
    """(layout, series) of a lone checkpoint file by its name; series None when it belongs to none.

    Lightning's files are left to the callback state (scan.py decides their series).
    """
    manager = CHECKPOINT_MANAGER.match(name)
    if manager:
        return LAYOUT_CHECKPOINT_MANAGER, "checkpoint_epoch_N.pt" if manager.group(2) is not None else None
    if name.endswith(".ckpt") and lightning_name(name):
        return LAYOUT_LIGHTNING, None
    numbered = NUMBERED_FILE.match(name)
    if numbered:
        return LAYOUT_NUMBERED, "%s%s%sN%s" % (
            numbered.group("prefix"),
            numbered.group("word"),
            numbered.group("sep"),
            numbered.group("suffix"),
        )
    return LAYOUT_FILE, None


def deepspeed_latest_tag(text: bytes) -> Optional[str]:
    """The tag DeepSpeed's `latest` file names (a directory name), or None for anything else."""
    tag = text.decode("utf-8", "replace").strip()
    return tag if tag and "/" not in tag and "\n" not in tag and tag not in (".", "..") and len(tag) <= 255 else None


def megatron_latest_dir(text: bytes) -> Optional[str]:
    """`iter_0000100` for a latest_checkpointed_iteration.txt holding 100 (`release` as itself)."""
    value = text.decode("utf-8", "replace").strip()
    if value == "release":
        return "release"
    return "iter_%07d" % int(value) if value.isdigit() and len(value) <= 18 else None


def basename_of_recorded(path: Optional[str]) -> Optional[str]:
    """The last part of a path a library recorded (any OS, a trailing slash allowed)."""
    if not path:
        return None
    base = re.split(r"[\\/]", path.rstrip("/\\"))[-1]
    return base or None


def hf_resumable_weights(rel: str) -> bool:
    """Whether a file of a checkpoint-N/ (path relative to it) is weights the Trainer resumes from:
    what Trainer._load_from_checkpoint looks for (model.safetensors, pytorch_model.bin, their index,
    adapter_model.*, FSDP's pytorch_model_fsdp*), or any file in a subdirectory (DeepSpeed's
    global_stepN/, FSDP's sharded state, adapters saved per name)."""
    if "/" in rel:
        return True
    return bool(WEIGHT_FILE.match(rel)) or rel.endswith(".index.json") or rel.startswith("pytorch_model_fsdp")


# What the Trainer writes beside the weights, none of it weights (tokenizer and config files are JSON
# or text, never of TENSOR_FILE's types).
HF_TRAINER_STATE_FILE = re.compile(
    r"^(training_args\.bin|optimizer\.(pt|bin)|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth)$"
)
TENSOR_FILE = re.compile(r"\.(pt|pth|bin|safetensors|ckpt|pkl|pickle|msgpack|h5|npz|npy|gguf|onnx)$")


def hf_other_weights(rel: str) -> bool:
    """Whether a top file of a checkpoint-N/ may be weights under a name the Trainer does not write
    (a subclass's model.pt, flax_model.msgpack): a checkpoint-N/ without standard weights but with
    such a file is not judged broken on names alone."""
    return bool(TENSOR_FILE.search(rel)) and not HF_TRAINER_STATE_FILE.match(rel)


def named_dir_layout(name: str) -> str:
    """The layout a directory's name alone says (checkpoint-N/: HF Trainer ...), else a plain file's."""
    for pattern, _, layout in NAMED_DIRS:
        if pattern.match(name):
            return layout
    return LAYOUT_FILE


@functools.lru_cache(maxsize=8192)  # asked of every unit at every rescan
def dir_series(name: str) -> Optional[str]:
    """The series a checkpoint directory's name makes it a member of (checkpoint-N/, global_stepN/ ...), or None."""
    for pattern, series, _ in NAMED_DIRS:
        if pattern.match(name):
            return series
    numbered = NUMBERED_DIR.match(name)
    return "%s_N/" % numbered.group(1).rstrip("_-") if numbered else None
