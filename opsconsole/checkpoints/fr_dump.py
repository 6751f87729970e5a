"""PyTorch flight-recorder dumps as records: decoded (pickle or JSON) and validated, in the metadata worker.

A dump is a pickle written by a training process, so it is read as checkpoints' data.pkl is: by
the restricted unpickler (safe_unpickle) inside the limited worker (worker.py, reader "fr_dump"),
and every field is checked here before it becomes a frozen record. The matching across ranks and
the console's side live in opsconsole.hang.flight_recorder; the format is described there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any, Dict, Generator, List, Optional, Tuple

MAX_DUMP_BYTES = 128 * 1024 * 1024  # a 20k-entry buffer with 30-frame stacks is ~20 MB
MAX_ENTRIES = 200_000
MAX_TENSORS = 1024  # sizes/dtypes listed per entry
MAX_DIMS = 64
MAX_FRAMES = 256
MAX_TEXT = 300
MAX_GROUPS = 10_000
MAX_STACKS = 50_000  # distinct call stacks in one dump


# --- records -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrFrame:
    """One Python frame a collective was called from."""

    function: str
    file: str
    line: int

    def text(self) -> str:
        return "%s (%s:%d)" % (self.function, self.file, self.line)


@dataclass(frozen=True)
class FrEntry:
    """One collective (or point-to-point op) as one rank recorded it."""

    record_id: int
    group: str  # process group name ("0" is the default group)
    group_desc: str  # "default_pg"
    collective_seq_id: int
    p2p_seq_id: int
    op: str  # profiling_name without its backend: "all_reduce"
    backend: str  # "nccl", "gloo"
    is_p2p: bool
    state: str
    input_sizes: Tuple[Tuple[int, ...], ...] = ()
    input_dtypes: Tuple[str, ...] = ()
    output_sizes: Tuple[Tuple[int, ...], ...] = ()
    output_dtypes: Tuple[str, ...] = ()
    frames: Tuple[FrFrame, ...] = ()
    stack: int = -1  # in the worker's reply: the index of `frames` in RankDump.stacks (frames left empty)

    def signature(self) -> Tuple[Any, ...]:
        return (self.op, self.input_sizes, self.input_dtypes)


@dataclass(frozen=True)
class FrGroup:
    """A process group as a dump's pg_config names it."""

    name: str
    desc: str
    ranks: Tuple[int, ...] = ()  # global ranks; () when the dump did not list them


@dataclass(frozen=True)
class FrGroupStatus:
    """pg_status: how far this rank got in one group (-1: none)."""

    group: str
    last_enqueued: int = -1
    last_started: int = -1
    last_completed: int = -1


@dataclass(frozen=True)
class RankDump:
    """One file: what its rank recorded, or why it could not be read."""

    path: str = ""
    rank: Optional[int] = None
    host: Optional[str] = None
    version: str = ""
    comm_lib_version: str = ""
    groups: Tuple[FrGroup, ...] = ()
    status: Tuple[FrGroupStatus, ...] = ()
    entries: Tuple[FrEntry, ...] = ()
    dropped: int = 0  # entries left out as malformed
    unreadable: Optional[str] = None
    # Each distinct stack once (a training loop calls its collectives from a few lines): the worker's
    # reply carries entries with `stack` indexes into this; with_frames() puts the frames back.
    stacks: Tuple[Tuple[FrFrame, ...], ...] = ()

    def compact(self) -> "RankDump":
        """Entries' frames moved into `stacks`, each distinct stack once (what crosses the worker's pipe)."""
        index: Dict[int, int] = {}  # by identity: the reader gives equal stacks one shared tuple
        stacks: List[Tuple[FrFrame, ...]] = []
        entries = []
        for entry in self.entries:
            if entry.frames:
                number = index.get(id(entry.frames))
                if number is None:
                    number = index[id(entry.frames)] = len(stacks)
                    stacks.append(entry.frames)
                entry = replace(entry, frames=(), stack=number)
            entries.append(entry)
        return replace(self, entries=tuple(entries), stacks=tuple(stacks))

    def with_frames(self) -> "RankDump":
        """compact() undone: every entry with its frames again (the tuples shared, not copied)."""
        if not self.stacks:
            return self
        entries = tuple(
            replace(entry, frames=self.stacks[entry.stack], stack=-1) if 0 <= entry.stack < len(self.stacks) else entry
            for entry in self.entries
        )
        return replace(self, entries=entries, stacks=())


RECORD_TYPES: Dict[str, type] = {cls.__name__: cls for cls in (FrFrame, FrEntry, FrGroup, FrGroupStatus, RankDump)}


# --- validation of one dump (runs in the worker) -------------------------------------------------


class _Bad(Exception):
    pass


def _text(value: Any) -> str:
    if type(value) is not str:
        raise _Bad("text expected, got %s" % type(value).__name__)
    return value[:MAX_TEXT]


def _opt_text(value: Any) -> str:
    return "" if value is None else _text(value)


def _int(value: Any) -> int:
    # The JSON form writes pg_status numbers as text ("10", "-1").
    if type(value) is str and re.fullmatch(r"-?\d{1,19}", value):
        return int(value)
    if type(value) is not int or not -(2**63) <= value < 2**63:
        raise _Bad("integer expected, got %s" % type(value).__name__)
    return value


def _sizes(value: Any) -> Tuple[Tuple[int, ...], ...]:
    if type(value) not in (list, tuple) or len(value) > MAX_TENSORS:
        raise _Bad("sizes are not a short list")
    shapes = []
    for shape in value:
        if type(shape) not in (list, tuple) or len(shape) > MAX_DIMS:
            raise _Bad("a shape is not a short list")
        shapes.append(tuple(_int(dim) for dim in shape))
    return tuple(shapes)


def _dtypes(value: Any) -> Tuple[str, ...]:
    if type(value) not in (list, tuple) or len(value) > MAX_TENSORS:
        raise _Bad("dtypes are not a short list")
    return tuple(_text(item) for item in value)


def _frames(value: Any, seen: Dict[Tuple[Any, ...], Tuple[FrFrame, ...]]) -> Tuple[FrFrame, ...]:
    """The checked frames; `seen` holds the stacks of this dump so far, so equal stacks share one tuple."""
    if value is None:
        return ()
    if type(value) not in (list, tuple):
        raise _Bad("frames are not a list")
    key = []
    for frame in value[:MAX_FRAMES]:
        if type(frame) is not dict:
            raise _Bad("a frame is not a dict")
        name, filename, line = frame.get("name"), frame.get("filename"), frame.get("line", 0)
        if type(name) is not str or type(filename) is not str or type(line) is not int:  # the rare, slower checks
            name, filename, line = _opt_text(name), _opt_text(filename), _int(line)
        key.append((name[:MAX_TEXT], filename[:MAX_TEXT], line))
    stack_key = tuple(key)
    stack = seen.get(stack_key)
    if stack is None:
        if len(seen) >= MAX_STACKS:
            raise _Bad("over %d distinct stacks" % MAX_STACKS)
        stack = seen[stack_key] = tuple(FrFrame(*item) for item in key)
    return stack


def _entry(raw: Any, stacks: Dict[Tuple[Any, ...], Tuple[FrFrame, ...]]) -> FrEntry:
    if type(raw) is not dict:
        raise _Bad("an entry is not a dict")
    group: Any = raw.get("process_group")
    if type(group) in (list, tuple) and len(group) == 2:
        group_name, group_desc = _text(group[0]), _text(group[1])
    else:
        group_name, group_desc = str(_int(raw.get("pg_id", 0))), ""
    name = _text(raw.get("profiling_name"))
    backend, _, op = name.rpartition(":")
    return FrEntry(
        record_id=_int(raw.get("record_id", -1)),
        group=group_name,
        group_desc=group_desc,
        collective_seq_id=_int(raw.get("collective_seq_id", 0)),
        p2p_seq_id=_int(raw.get("p2p_seq_id", 0)),
        op=op,
        backend=backend,
        is_p2p=bool(raw.get("is_p2p", False)) if type(raw.get("is_p2p", False)) is bool else False,
        state=_opt_text(raw.get("state")),
        input_sizes=_sizes(raw.get("input_sizes", [])),
        input_dtypes=_dtypes(raw.get("input_dtypes", [])),
        output_sizes=_sizes(raw.get("output_sizes", [])),
        output_dtypes=_dtypes(raw.get("output_dtypes", [])),
        frames=_frames(raw.get("frames"), stacks),
    )


def _ranks_text(value: Any) -> Tuple[int, ...]:
    # pg_config writes ranks as the text of a list: "[0, 1, 2]".
    if type(value) in (list, tuple):
        return tuple(_int(rank) for rank in value[:1_000_000])
    if type(value) is str and len(value) < 10_000_000 and re.fullmatch(r"\[\s*(\d{1,7}\s*(,\s*\d{1,7}\s*)*)?\]", value):
        return tuple(int(rank) for rank in re.findall(r"\d+", value))
    return ()


def dump_from_value(value: Any) -> RankDump:
    """A validated RankDump from the unpickled (or JSON-decoded) object; malformed entries are counted, not kept."""
    if type(value) is not dict:
        return RankDump(unreadable="not a flight-recorder dump: a %s, not a dict" % type(value).__name__)
    entries_raw = value.get("entries")
    if type(entries_raw) is not list:
        return RankDump(unreadable="not a flight-recorder dump: no list of entries")
    if len(entries_raw) > MAX_ENTRIES:
        return RankDump(unreadable="%d entries, over the limit of %d" % (len(entries_raw), MAX_ENTRIES))
    try:
        version = _opt_text(value.get("version"))
        lib = _opt_text(value.get("comm_lib_version", value.get("nccl_version")))
    except _Bad as bad:
        return RankDump(unreadable="malformed header: %s" % bad)
    groups: List[FrGroup] = []
    config = value.get("pg_config")
    if type(config) is dict:
        for name, item in list(config.items())[:MAX_GROUPS]:
            if type(name) is str and type(item) is dict:
                try:
                    groups.append(FrGroup(_text(name), _opt_text(item.get("desc")), _ranks_text(item.get("ranks"))))
                except _Bad:
                    continue
    statuses: List[FrGroupStatus] = []
    status = value.get("pg_status")
    if type(status) is dict:
        for name, item in list(status.items())[:MAX_GROUPS]:
            if type(name) is str and type(item) is dict:
                try:
                    statuses.append(
                        FrGroupStatus(
                            _text(name),
                            _int(item.get("last_enqueued_collective", -1)),
                            _int(item.get("last_started_collective", -1)),
                            _int(item.get("last_completed_collective", -1)),
                        )
                    )
                except _Bad:
                    continue
    entries: List[FrEntry] = []
    dropped = 0
    stacks: Dict[Tuple[Any, ...], Tuple[FrFrame, ...]] = {}
    for raw in entries_raw:
        try:
            entries.append(_entry(raw, stacks))
        except _Bad:
            dropped += 1
    if entries_raw and not entries:
        return RankDump(unreadable="none of its %d entries is well formed" % len(entries_raw))
    return RankDump(
        version=version,
        comm_lib_version=lib,
        groups=tuple(groups),
        status=tuple(statuses),
        entries=tuple(entries),
        dropped=dropped,
    )


def dump_from_bytes(data: bytes) -> RankDump:
    """Decode a dump (pickle, or JSON when it starts with '{') with the restricted unpickler, then validate it."""
    from opsconsole.checkpoints.safe_unpickle import restricted_loads

    if data[:1] == b"{":
        try:
            value = json.loads(data)
        except (ValueError, RecursionError) as exc:
            return RankDump(unreadable="JSON: %s" % str(exc)[:100])
    else:
        result = restricted_loads(data)
        if result.error is not None:
            return RankDump(unreadable=result.error.replace("data.pkl", "the pickle"))
        if result.unsafe_globals:  # torch writes only dicts, lists, text and numbers: anything else is not its dump
            return RankDump(
                unreadable="names %s, which no flight-recorder dump holds (nothing of it was run)"
                % ", ".join(result.unsafe_globals[:3])
            )
        value = result.value
    try:
        return dump_from_value(value)
    except RecursionError:
        return RankDump(unreadable="nests too deeply to read")


def fr_dump_reader(size: int) -> Generator[Tuple[int, int], bytes, RankDump]:
    """The worker's reader of one dump file of `size` bytes (reader kind "fr_dump")."""
    if size > MAX_DUMP_BYTES:
        return RankDump(unreadable="%d bytes, over the %d-byte limit" % (size, MAX_DUMP_BYTES))
    if size == 0:
        return RankDump(unreadable="empty file")
    data = yield (0, size)
    return dump_from_bytes(bytes(data)).compact()
