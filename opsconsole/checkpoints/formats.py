"""Recognising checkpoint formats by name and first bytes, and reading each one's metadata.

File readers are generators of read requests (see zipmeta.py), so one reader serves a
local file and a remote one. Nothing here calls torch.load or pickle.load: a torch zip's
data.pkl goes through the restricted unpickler, a legacy pickle is listed and never
opened, safetensors is a bounds-checked JSON header, and HF / DCP directories are read
from their JSON and their file names.
"""

from __future__ import annotations

import itertools
import json
import re
import struct
import zlib
from dataclasses import dataclass, replace
from typing import Any, Dict, Generator, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import orjson

from opsconsole.checkpoints import zipmeta
from opsconsole.checkpoints.metadata import decode_scalar, metadata_from_tree, plausible_count, wanted_scalars
from opsconsole.checkpoints.records import (
    FORMAT_DCP,
    FORMAT_HF,
    FORMAT_LEGACY,
    FORMAT_LIGHTNING,
    FORMAT_SAFETENSORS,
    FORMAT_TORCH,
    FORMAT_UNKNOWN,
    INTEGRITY_CORRUPT,
    INTEGRITY_OK,
    INTEGRITY_TRUNCATED,
    INTEGRITY_UNCHECKED,
    CheckpointMeta,
    StateDictSummary,
)
from opsconsole.checkpoints.safe_unpickle import Unresolved, error_text, restricted_loads, unsafe_message
from opsconsole.checkpoints.zipmeta import ReadRequest, ZipProblem

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".pth.tar")
SAFETENSORS_SUFFIX = ".safetensors"
HEAD_BYTES = 64 * 1024  # first read of a file: the sniff, and data.pkl of a small checkpoint
MAX_PICKLE_READ = 256 * 1024 * 1024
SAFETENSORS_FIRST_READ = 16 * 1024  # the length and a small model's whole header; a bigger header is a second read
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the safetensors spec's own limit
JSON_WHITESPACE = b" \t\n\r"
NO_SAFETENSORS_START = (
    "no `{` after its header length, where the safetensors library starts a header: never a deletion candidate"
)
MAX_JSON_BYTES = 32 * 1024 * 1024
MAX_DCP_METADATA = 64 * 1024 * 1024  # a .metadata of millions of chunks is still far under this
MAX_NAME_TEXT = 200  # of a key or tensor name shown
TORCH_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"  # pickled 0x1950a86a20f9469cfc6c
DCP_SHARD = re.compile(r"^__(\d+)_(\d+)\.distcp$")
HF_DIR = re.compile(r"^checkpoint-(\d+)$")
LIGHTNING_PART = re.compile(r"^([A-Za-z_][\w.]*)=(.+)$")
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "C64": "complex64",
}


@dataclass(frozen=True)
class ReadResult:
    """What reading one checkpoint gave: its format, metadata, integrity and a problem line."""

    format: str
    meta: CheckpointMeta
    integrity: str
    problem: Optional[str] = None
    unreadable: Optional[str] = None  # what could not be read (our limits, a parse we cannot do): not damage
    # Why the file is no member of any series, whatever its name says (a lone file's entry takes it).
    unmanaged: Optional[str] = None


# --- names -----------------------------------------------------------------------------------


def is_checkpoint_file_name(name: str) -> bool:
    """Whether a file name looks like a checkpoint (by suffix)."""
    lower = name.lower()
    return lower.endswith(TORCH_SUFFIXES) or lower.endswith(SAFETENSORS_SUFFIX)


def strip_suffix(name: str) -> str:
    lower = name.lower()
    for suffix in (".pth.tar",) + TORCH_SUFFIXES + (SAFETENSORS_SUFFIX,):
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    return name


def lightning_fields(name: str) -> Optional[Dict[str, str]]:
    """`epoch=3-step=300-val_loss=0.25.ckpt` as {"epoch": "3", ...}; `last.ckpt` as {}; None if not Lightning's."""
    if not name.endswith(".ckpt"):
        return None
    stem = re.sub(r"-v\d+$", "", name[: -len(".ckpt")])
    if stem == "last":
        return {}
    parts = re.split(r"-(?=[A-Za-z_][\w.]*=)", stem)
    fields: Dict[str, str] = {}
    for part in parts:
        match = LIGHTNING_PART.match(part)
        if not match:
            return None
        fields[match.group(1).split("/")[-1]] = match.group(2)
    return fields if "epoch" in fields or "step" in fields else None


def _int_or_none(text: Optional[str]) -> Optional[int]:
    """An epoch or step written as text (a name's, safetensors metadata's); None when it is none or no run's."""
    try:
        return plausible_count(int(text)) if text is not None else None
    except ValueError:
        return None


def _float_or_none(text: Any) -> Optional[float]:
    try:
        return float(text) if text is not None else None
    except (TypeError, ValueError, OverflowError):  # float(10**400) overflows
        return None


def _json(text: bytes) -> Any:
    """json.loads of untrusted bytes; deep nesting is a ValueError like any other bad JSON.

    orjson first: a listing parses a trainer_state.json and a weights header per unit, and it
    does so 3-4x faster than the standard library. What orjson refuses (NaN and Infinity,
    which Python's json.dumps writes into trainer_state.json, lone surrogates, nesting past
    1024, bad UTF-8) goes to the standard library, which decides as it always did. orjson
    reads an integer past 64 bits as a float: as a data offset it is refused as before (not
    an int), as a step it is no step.
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(text.decode("utf-8"))
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _json_text(value: Any, limit: int = 80) -> str:
    """A JSON value as bounded text: str() of a big list builds all of it before the cut."""
    kind = type(value)
    if kind is str:
        return value[:limit]
    if kind is list or kind is dict:
        return "<%s of %d>" % ("list" if kind is list else "object", len(value))
    if kind is int and not -(10**60) < value < 10**60:
        return "<int of %d bits>" % value.bit_length()
    return str(value)[:limit]


def meta_from_name(name: str) -> CheckpointMeta:
    """Epoch, step and loss that the name alone says (checkpoint_epoch_7.pt, epoch=3-step=300.ckpt, checkpoint-500)."""
    fields = lightning_fields(name)
    if fields:
        loss_key = next((k for k in fields if "loss" in k), None)
        return CheckpointMeta(
            epoch=_int_or_none(fields.get("epoch")),
            step=_int_or_none(fields.get("step")),
            loss=_float_or_none(fields.get(loss_key)) if loss_key else None,
        )
    stem = strip_suffix(name)
    hf = HF_DIR.match(stem)
    if hf:
        # The number get_last_checkpoint orders by, of any length (a name's length bounds it): kept
        # whole, as _trailing_number keeps it, or a unit past 2**63 would order as one with no step.
        return CheckpointMeta(step=int(hf.group(1)))
    epoch = re.search(r"(?:^|[_\-.])(?:epoch|ep|e)[_\-=]?(\d+)(?![\w])", stem, re.I) or re.search(
        r"epoch[_\-=]?(\d+)", stem, re.I
    )
    step = re.search(r"(?:^|[_\-.])(?:global_step|step|iter|iteration|it)[_\-=]?(\d+)(?![\w])", stem, re.I)
    return CheckpointMeta(
        epoch=plausible_count(int(epoch.group(1))) if epoch else None,
        step=plausible_count(int(step.group(1))) if step else None,
    )


def merge_meta(read: CheckpointMeta, named: CheckpointMeta) -> CheckpointMeta:
    """The content's metadata, with gaps filled from the name."""
    return replace(
        read,
        epoch=read.epoch if read.epoch is not None else named.epoch,
        step=read.step if read.step is not None else named.step,
        loss=read.loss if read.loss is not None else named.loss,
    )


def dir_format(names: Iterable[str]) -> Optional[str]:
    """hf-trainer for a dir with trainer_state.json, dcp for .metadata + __R_N.distcp; None otherwise."""
    names = set(names)
    if "trainer_state.json" in names:
        return FORMAT_HF
    if ".metadata" in names and any(DCP_SHARD.match(n) for n in names):
        return FORMAT_DCP
    return None


# --- serving requests from buffers already read -----------------------------------------------


def _served(
    buffers: Sequence[Tuple[int, bytes]], size: int, inner: Generator[ReadRequest, bytes, Any]
) -> Generator[ReadRequest, bytes, Any]:
    """Run `inner`, answering its requests from bytes already in hand where they cover them."""
    try:
        request = next(inner)
        while True:
            offset, length = request
            end = min(offset + length, size)
            answer = None
            for start, data in buffers:
                if start <= offset and end <= start + len(data):
                    answer = data[offset - start : end - start]
                    break
            if answer is None:
                answer = yield request
            request = inner.send(answer)
    except StopIteration as stop:
        return stop.value


# --- torch zip, legacy pickle, safetensors ------------------------------------------------------


def file_reader(name: str, size: int, window: int = HEAD_BYTES) -> Generator[ReadRequest, bytes, ReadResult]:
    """Read one checkpoint file of `size` bytes: sniff its first bytes, then the reader of its format.

    `window` is the size of the first reads at the start and at the end: large locally (one
    read holds data.pkl and the directory of a small checkpoint), small over a network
    (where bytes cost more than one more round trip).
    """
    named = meta_from_name(name)
    if size == 0:
        return ReadResult(_named_format(name), named, INTEGRITY_TRUNCATED, "empty file (0 bytes)")
    head = yield (0, min(size, window))
    if head[:4] in (zipmeta.SIG_LOCAL, zipmeta.SIG_EOCD):
        result = yield from torch_zip_reader(size, head, window)
        if result.format == FORMAT_TORCH and (
            lightning_fields(name) is not None or "pytorch-lightning_version" in result.meta.top_keys
        ):
            result = replace(result, format=FORMAT_LIGHTNING)
        return replace(result, meta=merge_meta(result.meta, named))
    if head[:1] == b"\x80":
        legacy = "legacy torch file" if head.startswith(TORCH_LEGACY_MAGIC) else "non-zip pickle"
        return ReadResult(
            FORMAT_LEGACY,
            named,
            INTEGRITY_UNCHECKED,
            "%s: listed, not opened (loading it would run its pickle)" % legacy,
        )
    if len(head) >= 9 and head[8:9] == b"{":
        result = yield from safetensors_reader(size, head)
        return replace(result, meta=merge_meta(result.meta, named))
    if head[:4] == b"PK\x01\x02" or head[:2] == b"PK":
        return ReadResult(FORMAT_TORCH, named, INTEGRITY_CORRUPT, "damaged zip (no local header at the start)")
    if not head.strip(b"\x00"):
        return ReadResult(
            _named_format(name), named, INTEGRITY_TRUNCATED, "starts with zero bytes: preallocated or never written"
        )
    if name.lower().endswith(SAFETENSORS_SUFFIX):
        # Named safetensors but no `{` where its header starts: the header length and header judge
        # it (a length past the end or over the limit, a header that is no JSON: damage the
        # safetensors library refuses too), not "format not recognised". It stays out of every
        # series all the same: before, such a file was never a deletion candidate.
        result = yield from safetensors_reader(size, head)
        return replace(result, meta=merge_meta(result.meta, named), unmanaged=NO_SAFETENSORS_START)
    return ReadResult(FORMAT_UNKNOWN, named, INTEGRITY_UNCHECKED, "not a torch zip, pickle or safetensors file")


def _named_format(name: str) -> str:
    if name.lower().endswith(SAFETENSORS_SUFFIX):
        return FORMAT_SAFETENSORS
    return FORMAT_LIGHTNING if lightning_fields(name) is not None else FORMAT_TORCH


def torch_zip_reader(
    size: int, head: bytes = b"", window: int = HEAD_BYTES
) -> Generator[ReadRequest, bytes, ReadResult]:
    """A torch.save zip: directory (quick integrity), data.pkl through the restricted unpickler, scalar tensors."""
    buffers: List[Tuple[int, bytes]] = [(0, head)] if head else []
    try:
        directory = yield from _served(buffers, size, zipmeta.directory_reader(size, max(window, 1024)))
    except ZipProblem as problem:
        return ReadResult(FORMAT_TORCH, CheckpointMeta(), problem.integrity, problem.reason)
    integrity = zipmeta.quick_integrity(directory)
    counts = dict(
        tensor_count=directory.tensor_count, tensor_bytes=directory.tensor_bytes, crc_recorded=directory.crc_recorded
    )
    pkl = directory.find("data.pkl")
    if pkl is None:
        return ReadResult(
            FORMAT_UNKNOWN, CheckpointMeta(**counts), integrity, "a zip without data.pkl: not a torch.save file"
        )
    if max(pkl.size, pkl.compressed_size) > MAX_PICKLE_READ:
        # torch.load reads it: only our reader's bound is passed. The zip's own integrity stands.
        why = "could not read: %s is %d bytes, over the reader's %d limit" % (
            pkl.name[-MAX_NAME_TEXT:],
            max(pkl.size, pkl.compressed_size),
            MAX_PICKLE_READ,
        )
        return ReadResult(FORMAT_TORCH, CheckpointMeta(**counts), integrity, why, unreadable=why)
    try:
        data = yield from _served(buffers, size, zipmeta.member_reader(pkl, MAX_PICKLE_READ))
    except ZipProblem as problem:
        return ReadResult(FORMAT_TORCH, CheckpointMeta(**counts), problem.integrity, problem.reason)
    loaded = restricted_loads(data)
    if loaded.error:
        # Damage only when the bytes are not the ones the zip recorded; otherwise it is our
        # reader that could not follow them (a work bound, an opcode it does not take).
        if directory.crc_recorded and zlib.crc32(data) != pkl.crc:
            return ReadResult(
                FORMAT_TORCH,
                CheckpointMeta(**counts),
                INTEGRITY_CORRUPT,
                "%s: CRC mismatch (%s)" % (pkl.name[-MAX_NAME_TEXT:], loaded.error),
            )
        return ReadResult(
            FORMAT_TORCH,
            CheckpointMeta(**counts),
            integrity,
            loaded.error,
            unreadable="could not read: %s" % loaded.error,
        )
    scalars: Dict[Any, float] = {}
    for tensor in wanted_scalars(loaded.value):
        entry = directory.storage_entry(tensor.storage.key)
        if entry is None:
            continue
        try:
            raw = yield from _served(buffers, size, zipmeta.member_reader(entry, 64 * 1024))
        except ZipProblem:
            continue
        value = decode_scalar(tensor.dtype, raw, tensor.offset)
        if value is not None:
            scalars[tensor] = value
    try:
        meta = replace(metadata_from_tree(loaded.value, scalars, loaded.unsafe_globals), **counts)
    except (ArithmeticError, ValueError, TypeError, RecursionError, MemoryError) as exc:
        # Last line of defence: the tree is hostile in a way the extraction did not foresee.
        why = "metadata unreadable: %s" % error_text(exc)
        return ReadResult(FORMAT_TORCH, CheckpointMeta(**counts), integrity, why, unreadable="could not read: " + why)
    return ReadResult(FORMAT_TORCH, meta, integrity, unsafe_message(loaded.unsafe_globals))


def safetensors_reader(size: int, head: bytes = b"") -> Generator[ReadRequest, bytes, ReadResult]:
    """A safetensors file: the 8-byte header length and the JSON header, every offset bounds-checked."""
    found = yield from _safetensors_header(size, head)
    if isinstance(found, ReadResult):
        return found
    raw, length = found
    return safetensors_result(raw, size, length)


def safetensors_proof_reader(
    size: int,
) -> Generator[ReadRequest, bytes, Tuple[str, Optional[str], Optional[StateDictSummary]]]:
    """(integrity, problem, tensors' summary) of a safetensors file: safetensors_reader's checks,
    without the record of its metadata (a listing proves each member of a unit so; scan.py)."""
    found = yield from _safetensors_header(size, b"")
    if isinstance(found, ReadResult):
        return found.integrity, found.problem, None
    raw, length = found
    scanned = _safetensors_scan(raw, size, length)
    if isinstance(scanned, ReadResult):
        return scanned.integrity, scanned.problem, None
    _, summary, end_max, data_size = scanned
    return (*_safetensors_extent(end_max, data_size), summary)


def _safetensors_header(size: int, head: bytes) -> Generator[ReadRequest, bytes, Union[ReadResult, Tuple[bytes, int]]]:
    """(raw JSON header, its length), or the ReadResult of a file whose header cannot be there."""
    if size < 8:
        return ReadResult(
            FORMAT_SAFETENSORS, CheckpointMeta(), INTEGRITY_TRUNCATED, "shorter than its 8-byte header length"
        )
    if len(head) < 8:
        head = yield (0, min(size, SAFETENSORS_FIRST_READ))
    (length,) = struct.unpack("<Q", head[:8])
    if length > MAX_SAFETENSORS_HEADER:
        return ReadResult(
            FORMAT_SAFETENSORS,
            CheckpointMeta(),
            INTEGRITY_CORRUPT,
            "header length %d is over the 100 MB limit" % length,
        )
    if 8 + length > size:
        # Cut short inside its header, when what there is of the header starts as one does (JSON
        # whitespace, then `{`); other bytes there were never a safetensors header: damage.
        start = head[8:].lstrip(JSON_WHITESPACE)[:1]
        if start not in (b"", b"{"):
            return ReadResult(
                FORMAT_SAFETENSORS,
                CheckpointMeta(),
                INTEGRITY_CORRUPT,
                "header length %d points past the end of the file (%d bytes), and no JSON header follows it"
                % (length, size),
            )
        return ReadResult(
            FORMAT_SAFETENSORS,
            CheckpointMeta(),
            INTEGRITY_TRUNCATED,
            "header of %d bytes runs past the end of the file (%d bytes)" % (length, size),
        )
    raw = head[8 : 8 + length] if 8 + length <= len(head) else (yield (8, length))
    return raw, length


def _safetensors_scan(raw: bytes, size: int, length: int) -> Union[ReadResult, Tuple[dict, StateDictSummary, int, int]]:
    """(header, tensors' summary, where their data ends, data bytes after the header), or the
    ReadResult of a header that is no JSON object or holds a tensor with bad offsets."""
    try:
        header = _json(raw)
    except ValueError as exc:  # UnicodeDecodeError is one
        return ReadResult(
            FORMAT_SAFETENSORS, CheckpointMeta(), INTEGRITY_CORRUPT, "header is not JSON: %s" % error_text(exc)
        )
    if type(header) is not dict:
        return ReadResult(FORMAT_SAFETENSORS, CheckpointMeta(), INTEGRITY_CORRUPT, "header is not a JSON object")
    data_size = size - 8 - length
    dtypes: Dict[str, int] = {}
    total = 0
    end_max = 0
    count = 0
    # One pass, plain type checks: a sharded model's headers hold thousands of tensors each.
    for key, info in header.items():
        if key == "__metadata__":
            continue
        offsets = info.get("data_offsets") if type(info) is dict else None
        if type(offsets) is not list or len(offsets) != 2:
            return ReadResult(
                FORMAT_SAFETENSORS,
                CheckpointMeta(),
                INTEGRITY_CORRUPT,
                "tensor %r has no data_offsets" % key[:MAX_NAME_TEXT],
            )
        begin, end = offsets
        if type(begin) is not int or type(end) is not int or begin < 0 or end < begin or end >= 2**63:
            return ReadResult(
                FORMAT_SAFETENSORS,
                CheckpointMeta(),
                INTEGRITY_CORRUPT,
                "tensor %r has bad data_offsets" % key[:MAX_NAME_TEXT],
            )
        named = info.get("dtype")
        dtype = (
            (SAFETENSORS_DTYPES.get(named) or named.lower()[:32])
            if type(named) is str
            else "<%s>" % type(named).__name__
        )
        dtypes[dtype] = dtypes.get(dtype, 0) + 1
        total += end - begin
        if end > end_max:
            end_max = end
        count += 1
    summary = StateDictSummary(keys=count, dtypes=tuple(sorted(dtypes.items(), key=lambda kv: -kv[1])), bytes=total)
    return header, summary, end_max, data_size


def _safetensors_extent(end_max: int, data_size: int) -> Tuple[str, Optional[str]]:
    if end_max > data_size:
        return INTEGRITY_TRUNCATED, "tensor data ends at %d but only %d bytes follow the header" % (end_max, data_size)
    return INTEGRITY_OK, None


def safetensors_result(raw: bytes, size: int, length: int) -> ReadResult:
    """Parse and check a safetensors JSON header (`raw`, `length` bytes) of a file of `size` bytes."""
    scanned = _safetensors_scan(raw, size, length)
    if isinstance(scanned, ReadResult):
        return scanned
    header, summary, end_max, data_size = scanned
    count, total = summary.keys, summary.bytes
    metadata = header.get("__metadata__") if isinstance(header.get("__metadata__"), dict) else {}
    details = tuple(("__metadata__." + k[:MAX_NAME_TEXT], _json_text(v)) for k, v in list(metadata.items())[:50])
    meta = CheckpointMeta(
        epoch=_int_or_none(_json_text(metadata.get("epoch"))) if "epoch" in metadata else None,
        step=_int_or_none(_json_text(metadata.get("step", metadata.get("global_step"))))
        if ("step" in metadata or "global_step" in metadata)
        else None,
        loss=_float_or_none(metadata.get("loss")),
        top_keys=tuple(itertools.islice((k[:MAX_NAME_TEXT] for k in header if k != "__metadata__"), 200)),
        details=details + (("tensors", "%d tensors, %d bytes" % (count, total)),),
        state_dict=summary,
        has_optimizer=False,
        has_scheduler=False,
        tensor_count=count,
        tensor_bytes=total,
    )
    integrity, problem = _safetensors_extent(end_max, data_size)
    return ReadResult(FORMAT_SAFETENSORS, meta, integrity, problem)


def safetensors_state(results: Sequence[ReadResult]) -> Optional[StateDictSummary]:
    """One summary over the shards of a sharded model (model-00001-of-00002.safetensors ...)."""
    return summaries_total([r.meta.state_dict for r in results if r.meta.state_dict is not None])


def summaries_total(summaries: Sequence[StateDictSummary]) -> Optional[StateDictSummary]:
    """One summary of several (a sharded model's shards); None for none."""
    if not summaries:
        return None
    dtypes: Dict[str, int] = {}
    for summary in summaries:
        for dtype, count in summary.dtypes:
            dtypes[dtype] = dtypes.get(dtype, 0) + count
    return StateDictSummary(
        keys=sum(s.keys for s in summaries),
        dtypes=tuple(sorted(dtypes.items(), key=lambda kv: -kv[1])),
        bytes=sum(s.bytes for s in summaries),
    )


# --- Hugging Face Trainer and DCP directories -----------------------------------------------------


def trainer_state_meta(text: bytes) -> Tuple[CheckpointMeta, Optional[str]]:
    """trainer_state.json: epoch, global_step, best_metric, best_model_checkpoint, the last logged loss."""
    fields, problem = trainer_state_fields(text)
    return CheckpointMeta(**fields), problem


def trainer_state_fields(text: bytes) -> Tuple[Dict[str, Any], Optional[str]]:
    """trainer_state_meta's CheckpointMeta fields: the listing adds its own and builds the record once."""
    try:
        state = _json(text)
    except ValueError as exc:  # UnicodeDecodeError is one
        return {}, "trainer_state.json is not JSON: %s" % error_text(exc)
    if not isinstance(state, dict):
        return {}, "trainer_state.json is not a JSON object"
    loss = None
    metrics: List[Tuple[str, Any]] = []
    history = state.get("log_history")
    if isinstance(history, list):
        for record in reversed(history):
            if not isinstance(record, dict):
                continue
            if loss is None:
                for key in ("eval_loss", "loss", "train_loss"):
                    loss = _json_number(record.get(key))
                    if loss is not None:
                        break
            if not metrics:
                metrics = [
                    (k[:MAX_NAME_TEXT], number)
                    for k, number in ((k, _json_number(v)) for k, v in record.items() if k.startswith("eval_"))
                    if number is not None
                ][:50]
            if loss is not None and metrics:
                break
    epoch = state.get("epoch")
    best_metric = state.get("best_metric")
    best = state.get("best_model_checkpoint")
    details = tuple(
        (k[:MAX_NAME_TEXT], _json_text(v)) for k, v in itertools.islice(state.items(), 200) if k != "log_history"
    ) + (("log_history", "%d records" % len(history) if isinstance(history, list) else "absent"),)
    epoch_number = _json_number(epoch)
    step = state.get("global_step")
    # int(inf) and int(nan) raise: only a finite epoch is one, and only one a run can reach.
    finite_epoch = plausible_count(epoch_number) is not None
    return dict(
        epoch=plausible_count(epoch_number) if finite_epoch else None,
        epoch_float=epoch_number if finite_epoch else None,
        step=plausible_count(step) if type(step) is int else None,
        loss=loss,
        best_loss=_json_number(best_metric),
        metrics=tuple(metrics[:50]),
        top_keys=tuple(k[:MAX_NAME_TEXT] for k in itertools.islice(state, 200)),
        details=details,
        best_checkpoint=best[:4096] if isinstance(best, str) else None,
    ), None


def _json_number(value: Any) -> Optional[float]:
    """A JSON number as a float; None for anything else, a bool, or an int too large for a float."""
    kind = type(value)
    if kind is float:
        return value
    if kind is not int:  # bool is not int by type
        return None
    return _float_or_none(value)


def dir_meta(fmt: str, name: str, files: Mapping[str, int]) -> CheckpointMeta:
    """What the names inside a HF or DCP dir say: optimizer/scheduler files, shards, step from the name."""
    return CheckpointMeta(**dir_meta_fields(fmt, name, files))


def dir_meta_fields(fmt: str, name: str, files: Mapping[str, int]) -> Dict[str, Any]:
    """dir_meta's CheckpointMeta fields (the listing merges them with what the unit's files say)."""
    named = meta_from_name(name)
    fields: Dict[str, Any] = dict(epoch=named.epoch, step=named.step, loss=named.loss)
    if fmt == FORMAT_DCP:
        shards = sorted(n for n in files if DCP_SHARD.match(n))
        fields["details"] = (
            ("shards", "%d (%s)" % (len(shards), ", ".join(shards[:4]) + (", ..." if len(shards) > 4 else ""))),
            (".metadata", "%d bytes (not unpickled)" % files.get(".metadata", 0)),
        )
        fields["top_keys"] = tuple(sorted(files))[:200]
        return fields
    fields["has_optimizer"] = any(n.startswith("optimizer") for n in files)
    fields["has_scheduler"] = any(n.startswith("scheduler") for n in files)
    fields["details"] = tuple(("file " + file_name, "%d bytes" % files[file_name]) for file_name in sorted(files)[:50])
    return fields


def model_files(files: Iterable[str]) -> List[str]:
    """The weight files of a HF checkpoint dir whose headers or directories are worth checking."""
    out = []
    for name in sorted(files):
        lower = name.lower()
        if lower.endswith(SAFETENSORS_SUFFIX):
            out.append(name)
        elif lower.endswith((".bin", ".pt", ".pth")) and name != "training_args.bin":
            out.append(name)  # zip directory only: quick integrity, no unpickling
    return out


def combine_integrity(values: Iterable[str]) -> str:
    """The worst of several integrity values (truncated and corrupt beat ok; nothing checked is unchecked)."""
    values = list(values)
    for bad in (INTEGRITY_CORRUPT, INTEGRITY_TRUNCATED):
        if bad in values:
            return bad
    if not values:
        return INTEGRITY_UNCHECKED
    if all(v == INTEGRITY_UNCHECKED for v in values):
        return INTEGRITY_UNCHECKED
    others = [v for v in values if v != INTEGRITY_UNCHECKED]
    return INTEGRITY_OK if all(v == INTEGRITY_OK for v in others) else others[0]


def _state_of(value: Any) -> Optional[Mapping[Any, Any]]:
    """The attribute dict pickle handed an object we never loaded (a dataclass's BUILD state)."""
    if not isinstance(value, Unresolved):
        return None
    state = value.state
    if isinstance(state, tuple) and len(state) == 2:  # (dict, slot state)
        state = state[0] if isinstance(state[0], Mapping) else state[1]
    return state if isinstance(state, Mapping) else None


def dcp_result(metadata: Optional[bytes], files: Mapping[str, int]) -> ReadResult:
    """A torch.distributed.checkpoint directory: `.metadata` read, and every shard it names present at its size.

    `.metadata` is a pickle of Metadata(state_dict_metadata, planner_data, storage_data), where
    storage_data maps each chunk to _StorageInfo(relative_path, offset, length). It goes through
    the restricted unpickler (those classes stay inert placeholders; their recorded fields are
    read). `files` maps the directory's file names (relative paths) to sizes. DCP writes
    `.metadata` last: shards without it are an incomplete save.
    """
    shards = sorted(n for n in files if n.endswith(".distcp"))
    details: List[Tuple[str, str]] = [
        ("shards", "%d (%s)" % (len(shards), ", ".join(shards[:4]) + (", ..." if len(shards) > 4 else "")))
    ]
    top = tuple(sorted(files))[:200]
    if metadata is None:
        return ReadResult(
            FORMAT_DCP,
            CheckpointMeta(details=tuple(details), top_keys=top),
            INTEGRITY_TRUNCATED,
            "no .metadata beside %d shards: an incomplete save (DCP writes .metadata last)" % len(shards),
        )
    loaded = restricted_loads(metadata)
    root = _state_of(loaded.value) if not loaded.error else None
    storage = root.get("storage_data") if root is not None else None
    if loaded.error or not isinstance(storage, Mapping):
        why = "could not read .metadata: %s" % (loaded.error or "not a DCP Metadata object")
        return ReadResult(
            FORMAT_DCP, CheckpointMeta(details=tuple(details), top_keys=top), INTEGRITY_UNCHECKED, why, unreadable=why
        )
    needed: Dict[str, int] = {}
    for info in storage.values():
        fields = _state_of(info)
        path = fields.get("relative_path") if fields is not None else None
        offset = fields.get("offset") if fields is not None else None
        length = fields.get("length") if fields is not None else None
        if not isinstance(path, str) or type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
            why = "could not read .metadata: a storage entry without relative_path, offset and length"
            return ReadResult(
                FORMAT_DCP,
                CheckpointMeta(details=tuple(details), top_keys=top),
                INTEGRITY_UNCHECKED,
                why,
                unreadable=why,
            )
        needed[path] = max(needed.get(path, 0), offset + length)
    tensors = root.get("state_dict_metadata")
    details.append(
        (
            ".metadata",
            "%d entries, %d chunks in %d files"
            % (len(tensors) if isinstance(tensors, Mapping) else 0, len(storage), len(needed)),
        )
    )
    meta = CheckpointMeta(
        details=tuple(details),
        top_keys=top,
        tensor_count=len(tensors) if isinstance(tensors, Mapping) else None,
        tensor_bytes=sum(needed.values()),
    )
    missing = sorted(p for p in needed if p not in files)
    if missing:
        return ReadResult(
            FORMAT_DCP,
            meta,
            INTEGRITY_CORRUPT,
            "shard %s named in .metadata is missing%s"
            % (missing[0][:MAX_NAME_TEXT], " (and %d more)" % (len(missing) - 1) if len(missing) > 1 else ""),
        )
    short = sorted(p for p in needed if files[p] < needed[p])
    if short:
        first = short[0]
        return ReadResult(
            FORMAT_DCP,
            meta,
            INTEGRITY_TRUNCATED,
            "shard %s is %d bytes, .metadata records data up to %d%s"
            % (
                first[:MAX_NAME_TEXT],
                files[first],
                needed[first],
                " (and %d more)" % (len(short) - 1) if len(short) > 1 else "",
            ),
        )
    return ReadResult(FORMAT_DCP, meta, INTEGRITY_OK, None)


def dcp_metadata_reader(size: int, files: Mapping[str, int]) -> Generator[ReadRequest, bytes, ReadResult]:
    """dcp_result over a DCP directory's `.metadata` file (of `size` bytes), read whole up to MAX_DCP_METADATA."""
    if size > MAX_DCP_METADATA:
        why = "could not read: .metadata is %d bytes, over the reader's limit" % size
        return ReadResult(FORMAT_DCP, CheckpointMeta(), INTEGRITY_UNCHECKED, why, unreadable=why)
    data = (yield (0, size)) if size else b""
    return dcp_result(data, files)


def zip_check_reader(size: int) -> Generator[ReadRequest, bytes, ReadResult]:
    """Only the zip directory (quick integrity) of a weight file inside a checkpoint dir."""
    try:
        directory = yield from zipmeta.directory_reader(size)
    except ZipProblem as problem:
        return ReadResult(FORMAT_TORCH, CheckpointMeta(), problem.integrity, problem.reason)
    return ReadResult(
        FORMAT_TORCH,
        CheckpointMeta(tensor_count=directory.tensor_count, tensor_bytes=directory.tensor_bytes),
        zipmeta.quick_integrity(directory),
    )


__all__ = [
    "ReadResult",
    "combine_integrity",
    "dcp_metadata_reader",
    "dcp_result",
    "dir_format",
    "dir_meta",
    "dir_meta_fields",
    "file_reader",
    "is_checkpoint_file_name",
    "lightning_fields",
    "meta_from_name",
    "merge_meta",
    "model_files",
    "safetensors_reader",
    "safetensors_state",
    "torch_zip_reader",
    "trainer_state_fields",
    "trainer_state_meta",
    "zip_check_reader",
]
