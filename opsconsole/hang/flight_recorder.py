"""PyTorch's flight recorder: read every rank's dump, match collectives across ranks, name the first mismatch.

Ranks started with `TORCH_FR_BUFFER_SIZE` (older: `TORCH_NCCL_TRACE_BUFFER_SIZE`) > 0 keep their
last N collectives in a ring buffer. ProcessGroupNCCL writes it to `<TORCH_FR_DUMP_TEMP_FILE><rank>`
(older: `TORCH_NCCL_DEBUG_INFO_TEMP_FILE`, default `/tmp/nccl_trace_rank_`) on a watchdog timeout,
or when anything is written to the FIFO `<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe`; in-process,
`torch._C._distributed_c10d._dump_nccl_trace()` (gloo: `_dump_fr_trace()`) returns the same pickle.

A dump (version "2.x") is a dict: `version`, `pg_config` {pg name: {name, desc, ranks: "[0, 1]"}},
`pg_status` {pg name: {last_enqueued_collective, last_started_collective, last_completed_collective}},
`entries` [{record_id, pg_id, process_group: (name, desc), collective_seq_id, p2p_seq_id, op_id,
profiling_name ("nccl:all_reduce"), input_sizes, input_dtypes, output_sizes, output_dtypes, state
("scheduled" | "started" | "completed"), frames [{name, filename, line}], ...}]. The JSON form
(`_dump_nccl_trace_json`) has the same keys without frames, numbers in pg_status as text. The
rank is not inside a dump: it is the number that ends the file name.

Dumps are pickles written by processes we do not trust: each is read by the checkpoints' restricted
unpickler inside their limited worker process (reader "fr_dump"), and validated here into the frozen
records below; a dump that fails is "unreadable: <reason>" and the other ranks are still matched.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shlex
import stat
import sys
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from opsconsole.checkpoints.fr_dump import (  # noqa: F401  (the records are this module's API too)
    RECORD_TYPES,
    FrEntry,
    FrFrame,
    FrGroup,
    FrGroupStatus,
    RankDump,
    dump_from_bytes,
    dump_from_value,
    fr_dump_reader,
)
from opsconsole.diagnosis.watchdog import rank_list

DEFAULT_DUMP_PREFIX = "/tmp/nccl_trace_rank_"
# Newest name first: torch 2.11 warns that the TORCH_NCCL_ ones are deprecated.
BUFFER_SIZE_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
PIPE_FILE_VARS = ("TORCH_FR_DEBUG_INFO_PIPE_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
NO_RANKS_FOUND = (
    "no training ranks found (no process with RANK or LOCAL_RANK in its environment): "
    "the job runs on other nodes (--nodes, --config), or has ended"
)

MAX_DUMP_FILES = 100_000
MAX_REPLY_BYTES = 96 * 1024 * 1024  # one dump's records as the worker sends them
DUMP_CPU_S = 30  # CPU and wall seconds for one dump in the worker (a 77 MB, 20k-entry dump needs ~10 on a busy core)
FILE_RANK = re.compile(r"^(?P<before>.*?)(?P<rank>\d{1,7})(?P<suffix>\.(?:pkl|pickle|json))?$")
SEPARATORS = "._-"

DumpFile = Tuple[str, int, Optional[str]]  # (path, rank, host)
Skipped = Tuple[str, str]  # (path, why it is no dump)

# Collectives whose every rank passes tensors of one shape and dtype: a size difference is a bug.
SAME_SIZE_OPS = frozenset(
    (
        "all_reduce",
        "allreduce",
        "allreduce_coalesced",
        "all_reduce_coalesced",
        "broadcast",
        "reduce",
        "all_gather",
        "_all_gather_base",
        "all_gather_into_tensor",
        "allgather",
        "allgather_into_tensor_coalesced",
        "reduce_scatter",
        "_reduce_scatter_base",
        "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced",
        "all_reduce_barrier",
    )
)
COMPLETED = "completed"


# --- files of a dump directory -------------------------------------------------------------------


def _trim_to_separator(suffix: str, befores: Sequence[str]) -> str:
    """The shared stem, started where every name has a separator (or nothing) before it."""
    while suffix:
        if all(len(b) == len(suffix) or b[-len(suffix) - 1] in SEPARATORS for b in befores):
            return suffix
        suffix = suffix[1:]
    return suffix


def _common_suffix(texts: Sequence[str]) -> str:
    if not texts:
        return ""
    reversed_texts = [text[::-1] for text in texts]
    return os.path.commonprefix(reversed_texts)[::-1]


def dump_files(directory: str, prefix: Optional[str] = None) -> Tuple[List[DumpFile], List[Skipped]]:
    """(path, rank, host) of each dump in `directory`, and (path, why) for the files left out.

    A dump's name ends in its rank (`nccl_trace_rank_3`, `gpu07_nccl_trace_rank_3`, `...3.json`);
    what comes before the names' shared stem is the host the console or the user prefixed. With
    `prefix`, only names holding it are dumps. A subdirectory (one level: what collect_dumps
    writes, `<dir>/<host>/nccl_trace_rank_3`) names the host of the dumps in it.
    """
    dumps, skipped = _dump_files_in(directory, prefix, None)
    for name in sorted(os.listdir(directory))[:MAX_DUMP_FILES]:
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            more, more_skipped = _dump_files_in(path, prefix, name)
            dumps.extend(more)
            skipped.extend(more_skipped)
    return dumps, skipped


def _dump_files_in(
    directory: str, prefix: Optional[str], folder_host: Optional[str]
) -> Tuple[List[DumpFile], List[Skipped]]:
    names = sorted(os.listdir(directory))[:MAX_DUMP_FILES]
    found: List[Tuple[str, str, int]] = []  # (name, before, rank)
    skipped: List[Tuple[str, str]] = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            mode = os.lstat(path).st_mode
        except OSError as exc:
            skipped.append((path, exc.strerror or str(exc)))
            continue
        if stat.S_ISDIR(mode):
            continue
        match = FILE_RANK.match(name)
        if match is None or (prefix is not None and os.path.basename(prefix) not in match.group("before")):
            skipped.append((path, "no rank at the end of its name"))
            continue
        found.append((name, match.group("before"), int(match.group("rank"))))
    befores = [before for _, before, _ in found]
    if prefix is not None:
        stem = os.path.basename(prefix)
    elif len(set(befores)) <= 1:
        stem = befores[0] if befores else ""
        default_stem = os.path.basename(DEFAULT_DUMP_PREFIX)  # "gpu07_nccl_trace_rank_": torch's name, a host before it
        if stem.endswith(default_stem) and stem[: -len(default_stem)][-1:] in tuple(SEPARATORS):
            stem = default_stem
    else:
        stem = _trim_to_separator(_common_suffix(befores), befores)
    dumps: List[Tuple[str, int, Optional[str]]] = []
    for name, before, rank in found:
        at = before.rfind(stem) if stem else len(before)
        host = before[:at].strip(SEPARATORS) if at >= 0 else before.strip(SEPARATORS)
        dumps.append((os.path.join(directory, name), rank, host or folder_host))
    return dumps, skipped


def read_dump_dir(
    directory: str, prefix: Optional[str] = None, workers: Any = None
) -> Tuple[List[RankDump], List[Skipped]]:
    """Every dump of `directory` read in the limited worker: (dumps, files left out with why).

    A dump the worker cannot read (killed, over its limits) or that fails validation comes back
    with `unreadable` set; it never stops the others.
    """
    from opsconsole.checkpoints.access import LocalFileSystem
    from opsconsole.checkpoints.worker import WorkerFailure

    files, skipped = dump_files(directory, prefix)
    pool = workers or dump_workers()
    fs = LocalFileSystem()
    dumps: List[RankDump] = []
    for path, rank, host in files:
        try:
            dump = pool.read(fs, path, "fr_dump")
            if not isinstance(dump, RankDump):
                dump = RankDump(unreadable="the worker sent a %s" % type(dump).__name__)
        except WorkerFailure as failure:
            dump = RankDump(unreadable=failure.reason)
        except OSError as exc:
            dump = RankDump(unreadable=exc.strerror or str(exc))
        dumps.append(replace(dump.with_frames(), path=path, rank=rank, host=host))
    return dumps, skipped


_DUMP_WORKERS: List[Any] = []


def dump_workers() -> Any:
    """The worker pool for dumps: the checkpoints' worker and memory limit, CPU, time and reply sized for a dump.

    A 20k-entry buffer is tens of MB of pickle and replies with megabytes of entries (each distinct
    stack once), past the 10 s and 4 MiB a checkpoint's metadata needs; the memory bound (RLIMIT_AS)
    and everything else about the worker are the metadata worker's own.
    """
    if not _DUMP_WORKERS:
        import atexit

        from opsconsole.checkpoints.worker import MetadataWorkers, WorkerLimits

        limits = WorkerLimits(
            cpu_seconds=DUMP_CPU_S,
            timeout_s=float(DUMP_CPU_S),
            first_try_cpu_seconds=DUMP_CPU_S // 2,
            max_reply_bytes=MAX_REPLY_BYTES,
        )
        pool = MetadataWorkers(size=max(2, min(4, (os.cpu_count() or 2) // 2)), limits=limits)
        atexit.register(pool.close)
        _DUMP_WORKERS.append(pool)
    return _DUMP_WORKERS[0]


# --- matching across ranks -----------------------------------------------------------------------

KIND_NOT_JOINED = "not_joined"
KIND_OP = "op"
KIND_SIZE = "size"
KIND_DTYPE = "dtype"
KIND_STUCK = "stuck"  # every rank joined and agrees; some never completed it


@dataclass(frozen=True)
class RankAtCollective:
    """What one rank did at the collective in question (or the last thing it did, if it never got there)."""

    rank: int
    host: Optional[str]
    entry: Optional[FrEntry]  # its entry for this collective; None when it never joined
    last: Optional[FrEntry] = None  # when it never joined: the last collective of the group it did enqueue


@dataclass(frozen=True)
class Mismatch:
    """The first collective the ranks disagree on."""

    kind: str
    group: str
    group_desc: str
    seq: int
    op: str  # what the majority called
    sizes: Tuple[Tuple[int, ...], ...]
    dtypes: Tuple[str, ...]
    culprits: Tuple[RankAtCollective, ...]
    agreeing: Tuple[int, ...]  # ranks that called what the majority called

    @property
    def culprit_ranks(self) -> Tuple[int, ...]:
        return tuple(item.rank for item in self.culprits)


@dataclass(frozen=True)
class FrAnalysis:
    """Every rank's dump, matched."""

    dumps: Tuple[RankDump, ...]
    skipped: Tuple[Tuple[str, str], ...] = ()
    missing_ranks: Tuple[int, ...] = ()  # ranks of a group that left no dump
    mismatch: Optional[Mismatch] = None
    p2p_skipped: int = 0
    notes: Tuple[str, ...] = ()

    @property
    def readable(self) -> Tuple[RankDump, ...]:
        return tuple(dump for dump in self.dumps if dump.unreadable is None and dump.rank is not None)


def _collectives(dump: RankDump) -> Dict[str, Dict[int, FrEntry]]:
    by_group: Dict[str, Dict[int, FrEntry]] = {}
    for entry in dump.entries:
        if entry.is_p2p or entry.collective_seq_id <= 0:
            continue
        by_group.setdefault(entry.group, {})[entry.collective_seq_id] = entry
    return by_group


def _last_enqueued(dump: RankDump, group: str, seen: Mapping[int, FrEntry]) -> int:
    status = next((item for item in dump.status if item.group == group), None)
    last = max(seen) if seen else -1
    if status is not None:
        last = max(last, status.last_enqueued)
    return last


def _differs(kind_of: Dict[int, FrEntry], majority: FrEntry) -> Tuple[Optional[str], List[int]]:
    """The kind of the first difference from the majority's entry and the ranks that differ."""
    for kind, key in (
        (KIND_OP, lambda e: e.op),
        (KIND_SIZE, lambda e: e.input_sizes if majority.op in SAME_SIZE_OPS else None),
        (KIND_DTYPE, lambda e: e.input_dtypes),
    ):
        odd = [rank for rank, entry in kind_of.items() if key(entry) != key(majority)]
        if odd:
            return kind, sorted(odd)
    return None, []


def match_dumps(dumps: Sequence[RankDump], skipped: Sequence[Tuple[str, str]] = ()) -> FrAnalysis:
    """Match collectives by (process group, collective sequence id) and name the first mismatch.

    Per group the ranks expected are those its pg_config lists (else every rank whose dump
    mentions it). Sequence ids are walked upwards from the first one every rank still holds in
    its ring buffer: at the first id some rank never enqueued, that rank never joined; where all
    joined, the first op, size or dtype that differs from the majority's names the odd ranks.
    When every rank agrees on everything, the first collective not completed everywhere is reported
    as stuck (the hang is inside it, or below it in NCCL or the network).
    """
    readable = [dump for dump in dumps if dump.unreadable is None and dump.rank is not None]
    by_rank: Dict[int, RankDump] = {}
    notes: List[str] = []
    for dump in readable:
        if dump.rank in by_rank:
            notes.append(
                "two dumps for rank %d: %s kept, %s left out" % (dump.rank, by_rank[dump.rank].path, dump.path)
            )
            continue
        by_rank[dump.rank] = dump  # type: ignore[index]
    collectives = {rank: _collectives(dump) for rank, dump in by_rank.items()}
    p2p = sum(1 for dump in by_rank.values() for entry in dump.entries if entry.is_p2p)
    members: Dict[str, set] = {}
    descs: Dict[str, str] = {}
    for rank, dump in by_rank.items():
        for config in dump.groups:
            if config.ranks:
                members.setdefault(config.name, set()).update(config.ranks)
            descs.setdefault(config.name, config.desc)
        for group, entries in collectives[rank].items():
            members.setdefault(group, set()).add(rank)
            if not descs.get(group):  # gloo's pg_config names the default group "" with no desc
                descs[group] = next(iter(entries.values())).group_desc
    missing = sorted({rank for ranks in members.values() for rank in ranks} - set(by_rank))
    candidates: List[Tuple[int, int, Mismatch]] = []  # (kind order, seq, mismatch)
    for group in sorted(members, key=lambda name: (name != "0", name)):
        ranks = sorted(rank for rank in members[group] if rank in by_rank)
        if len(ranks) < 1:
            continue
        seen = {rank: collectives[rank].get(group, {}) for rank in ranks}
        last = {rank: _last_enqueued(by_rank[rank], group, seen[rank]) for rank in ranks}
        holding = [min(seen[rank]) for rank in ranks if seen[rank]]
        if not holding:
            continue
        start = max(holding)  # older ids fell out of some rank's ring buffer
        end = max(last.values())
        found = _first_mismatch(group, descs.get(group, ""), ranks, seen, last, by_rank, start, end)
        if found is not None:
            candidates.append((0 if found.kind != KIND_STUCK else 1, found.seq, found))
    mismatch = min(candidates, key=lambda item: (item[0], item[1]))[2] if candidates else None
    return FrAnalysis(
        dumps=tuple(dumps),
        skipped=tuple(skipped),
        missing_ranks=tuple(missing),
        mismatch=mismatch,
        p2p_skipped=p2p,
        notes=tuple(notes),
    )


def _first_mismatch(
    group: str,
    desc: str,
    ranks: List[int],
    seen: Dict[int, Dict[int, FrEntry]],
    last: Dict[int, int],
    by_rank: Dict[int, RankDump],
    start: int,
    end: int,
) -> Optional[Mismatch]:
    stuck: Optional[Mismatch] = None
    for seq in range(start, end + 1):
        present = {rank: seen[rank][seq] for rank in ranks if seq in seen[rank]}
        absent = [rank for rank in ranks if seq not in seen[rank] and last[rank] < seq]
        if not present:
            continue
        majority = _majority(present)
        if absent:
            culprits = tuple(
                RankAtCollective(rank, by_rank[rank].host, None, _last_entry(seen[rank])) for rank in absent
            )
            return Mismatch(
                KIND_NOT_JOINED,
                group,
                desc,
                seq,
                majority.op,
                majority.input_sizes,
                majority.input_dtypes,
                culprits,
                tuple(sorted(present)),
            )
        kind, odd = _differs(present, majority)
        if kind is not None:
            culprits = tuple(RankAtCollective(rank, by_rank[rank].host, present[rank]) for rank in odd)
            agreeing = tuple(sorted(rank for rank in present if rank not in odd))
            return Mismatch(
                kind, group, desc, seq, majority.op, majority.input_sizes, majority.input_dtypes, culprits, agreeing
            )
        if stuck is None and any(entry.state != COMPLETED for entry in present.values()):
            waiting = tuple(
                RankAtCollective(rank, by_rank[rank].host, present[rank])
                for rank in sorted(present)
                if present[rank].state != COMPLETED
            )
            stuck = Mismatch(
                KIND_STUCK,
                group,
                desc,
                seq,
                majority.op,
                majority.input_sizes,
                majority.input_dtypes,
                waiting,
                tuple(sorted(rank for rank in present if present[rank].state == COMPLETED)),
            )
    return stuck


def _majority(present: Dict[int, FrEntry]) -> FrEntry:
    """The entry most ranks agree with (op, sizes, dtypes); ties go to the lowest rank's."""
    counts = Counter(entry.signature() for entry in present.values())
    best = max(counts.values())
    for rank in sorted(present):
        if counts[present[rank].signature()] == best:
            return present[rank]
    raise AssertionError("unreachable")


def _last_entry(entries: Mapping[int, FrEntry]) -> Optional[FrEntry]:
    return entries[max(entries)] if entries else None


# --- words and JSON ------------------------------------------------------------------------------


def _user_frame(entry: Optional[FrEntry]) -> Optional[FrFrame]:
    """The innermost frame outside torch.distributed's own wrappers: the training code's line."""
    if entry is None or not entry.frames:
        return None
    for frame in entry.frames:
        if "/torch/distributed/" not in frame.file and "/torch/nn/parallel/" not in frame.file:
            return frame
    return entry.frames[0]


def _shape_text(sizes: Tuple[Tuple[int, ...], ...], dtypes: Tuple[str, ...]) -> str:
    shapes = ", ".join("[%s]" % ", ".join(str(dim) for dim in shape) for shape in sizes[:4])
    if len(sizes) > 4:
        shapes += ", ..."
    return "%s %s" % (shapes or "no tensors", "/".join(sorted(set(dtypes))) if dtypes else "")


def _where(rank: RankAtCollective) -> str:
    entry = rank.entry or rank.last
    frame = _user_frame(entry)
    host = " on %s" % rank.host if rank.host else ""
    return "%s%s" % (host, " at %s" % frame.text() if frame else "")


def summary_text(analysis: FrAnalysis) -> str:
    """One paragraph: the culprit rank(s) and the collective, or why there is none."""
    found = analysis.mismatch
    if not analysis.readable:
        return "no readable flight-recorder dump"
    if found is None:
        ranks = sorted({dump.rank for dump in analysis.readable if dump.rank is not None})
        return "%s %s: every collective they still hold agrees and completed" % (
            "rank" if len(ranks) == 1 else "ranks",
            rank_list(ranks),
        )
    group = "group %s%s" % (found.group, " (%s)" % found.group_desc if found.group_desc else "")
    collective = "collective %d (%s %s) of %s" % (
        found.seq,
        found.op,
        _shape_text(found.sizes, found.dtypes).strip(),
        group,
    )
    culprits = found.culprit_ranks
    word = "rank" if len(culprits) == 1 else "ranks"
    if found.kind == KIND_NOT_JOINED:
        waiting = "rank %s waits in it" if len(found.agreeing) == 1 else "ranks %s wait in it"
        lines = [
            "%s %s never joined %s; %s" % (word, rank_list(culprits), collective, waiting % rank_list(found.agreeing))
        ]
        for item in found.culprits:
            if item.last is not None:
                lines.append(
                    "  rank %d last enqueued collective %d (%s)%s"
                    % (item.rank, item.last.collective_seq_id, item.last.op, _where(item))
                )
            else:
                lines.append("  rank %d enqueued nothing in this group%s" % (item.rank, _where(item)))
        return "\n".join(lines)
    if found.kind == KIND_STUCK:
        return "%s: every rank joined %s with the same op, sizes and dtypes; not completed on %s %s%s" % (
            "stuck",
            collective,
            word,
            rank_list(culprits),
            "" if not found.agreeing else " (completed on %s)" % rank_list(found.agreeing),
        )
    what = {KIND_OP: "another op", KIND_SIZE: "other sizes", KIND_DTYPE: "another dtype"}[found.kind]
    lines = ["%s %s joined %s with %s" % (word, rank_list(culprits), collective, what)]
    for item in found.culprits:
        entry = item.entry
        assert entry is not None
        shape = _shape_text(entry.input_sizes, entry.input_dtypes).strip()
        lines.append("  rank %d called %s %s%s" % (item.rank, entry.op, shape, _where(item)))
    return "\n".join(lines)


def _frame_json(frame: FrFrame) -> Dict[str, Any]:
    return {"function": frame.function, "file": frame.file, "line": frame.line}


def _entry_json(entry: Optional[FrEntry]) -> Optional[Dict[str, Any]]:
    if entry is None:
        return None
    return {
        "seq": entry.collective_seq_id,
        "op": entry.op,
        "state": entry.state,
        "input_sizes": [list(shape) for shape in entry.input_sizes],
        "input_dtypes": list(entry.input_dtypes),
        "frames": [_frame_json(frame) for frame in entry.frames],
    }


def analysis_json(analysis: FrAnalysis) -> Dict[str, Any]:
    """One object: the dumps read, those left out, the mismatch (null when none) and the summary."""
    found = analysis.mismatch
    mismatch = None
    if found is not None:
        mismatch = {
            "kind": found.kind,
            "group": found.group,
            "group_desc": found.group_desc,
            "seq": found.seq,
            "op": found.op,
            "input_sizes": [list(shape) for shape in found.sizes],
            "input_dtypes": list(found.dtypes),
            "culprit_ranks": list(found.culprit_ranks),
            "agreeing_ranks": list(found.agreeing),
            "culprits": [
                {"rank": item.rank, "host": item.host, "entry": _entry_json(item.entry), "last": _entry_json(item.last)}
                for item in found.culprits
            ],
        }
    return {
        "dumps": [
            {
                "path": dump.path,
                "rank": dump.rank,
                "host": dump.host,
                "version": dump.version or None,
                "entries": len(dump.entries),
                "dropped": dump.dropped,
                "unreadable": dump.unreadable,
            }
            for dump in analysis.dumps
        ],
        "skipped": [{"path": path, "why": why} for path, why in analysis.skipped],
        "missing_ranks": list(analysis.missing_ranks),
        "mismatch": mismatch,
        "summary": summary_text(analysis),
        "notes": list(analysis.notes),
    }


def analyse_dir(directory: str, prefix: Optional[str] = None, workers: Any = None) -> FrAnalysis:
    """Read every dump of `directory` (in the limited worker) and match them."""
    dumps, skipped = read_dump_dir(directory, prefix, workers)
    return match_dumps(dumps, skipped)


# --- where a rank's dumps are, and collecting them from a node -----------------------------------


@dataclass(frozen=True)
class DumpLocations:
    """Where one rank's flight recorder writes, from its environment."""

    rank: int
    buffer_size: int
    dump_file: str  # <prefix><rank>
    pipe_file: Optional[str] = None  # <pipe prefix><rank>.pipe: a write asks for a dump (NCCL only)


def _first(environ: Mapping[str, str], names: Sequence[str]) -> Optional[str]:
    for name in names:
        value = environ.get(name)
        if value:
            return value
    return None


def dump_locations(environ: Mapping[str, str], rank: int) -> Optional[DumpLocations]:
    """Where rank `rank` (its /proc/PID/environ as a mapping) writes its dumps; None when it records nothing.

    The stacks side finds the ranks and their environment; this says whether each keeps a
    flight recorder (a buffer size > 0) and where its dump file and dump-request FIFO are.
    """
    text = _first(environ, BUFFER_SIZE_VARS)
    try:
        size = int(text) if text is not None else 0
    except ValueError:
        size = 0
    if size <= 0:
        return None
    prefix = _first(environ, DUMP_FILE_VARS) or DEFAULT_DUMP_PREFIX
    pipe = _first(environ, PIPE_FILE_VARS)
    return DumpLocations(
        rank=rank,
        buffer_size=size,
        dump_file="%s%d" % (prefix, rank),
        pipe_file="%s%d.pipe" % (pipe, rank) if pipe else None,
    )


# Runs on the node (python3 -c, stdlib only, 3.6+): asks each rank for a dump through its FIFO when
# told to, waits for the dump files to change, and prints each as one JSON line (base64), bounded.
_REMOTE_COLLECT = r"""
import base64, errno, json, os, stat, sys, time
spec = json.loads(sys.argv[1])
limit, total = int(spec["max_bytes"]), int(spec["max_total"])
def mtime(path):
    try:
        st = os.lstat(path)
        return st.st_mtime if stat.S_ISREG(st.st_mode) else None
    except OSError:
        return None
def first(env, names):
    for name in names:
        if env.get(name):
            return env[name]
    return None
if spec.get("discover"):  # the ranks of this node, found as the stacks helper finds them (RANK/LOCAL_RANK)
    found = {"__name__": "rank_stacks"}
    exec(RANK_FINDER, found)
    for described in found["find_ranks"]():
        if described.get("rank") is not None:
            spec.setdefault("pids", []).append({"pid": described["pid"], "rank": described["rank"]})
for item in spec.get("pids", []):  # where each rank writes, from its own environment
    env = {}
    try:
        with open("/proc/%d/environ" % int(item["pid"]), "rb") as handle:
            raw = handle.read(262144)
        for part in raw.split(b"\0"):
            name, _, value = part.decode("utf-8", "replace").partition("=")
            env[name] = value[:4096]
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        print(json.dumps({"rank": item["rank"], "path": "/proc/%s/environ" % item["pid"], "error": why}), flush=True)
        continue
    try:
        size = int(first(env, BUFFER_VARS) or "0")
    except ValueError:
        size = 0
    if size <= 0:
        why = "keeps no flight recorder (%s unset or 0)" % BUFFER_VARS[0]
        print(json.dumps({"rank": item["rank"], "path": "pid %s" % item["pid"], "error": why}), flush=True)
        continue
    pipe = first(env, PIPE_VARS)
    spec["ranks"].append({"rank": item["rank"], "dump_file": "%s%d" % (first(env, DUMP_VARS) or DEFAULT_PREFIX, item["rank"]),
                          "pipe_file": "%s%d.pipe" % (pipe, item["rank"]) if pipe else None})
before = {}
for item in spec["ranks"]:
    before[item["dump_file"]] = mtime(item["dump_file"])
    pipe = item.get("pipe_file")
    if not spec["trigger"] or not pipe:
        continue
    note = None
    try:
        if not stat.S_ISFIFO(os.lstat(pipe).st_mode):
            note = "not a FIFO"
        else:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"1\n")
            os.close(fd)
    except OSError as exc:
        note = exc.strerror or str(exc)
        if exc.errno == errno.ENXIO:
            note = "no reader on the pipe (the rank is gone, or its monitor thread is off)"
    print(json.dumps({"rank": item["rank"], "pipe": pipe, "asked": note is None, "note": note}), flush=True)
deadline = time.time() + float(spec["wait_s"])
if spec["trigger"]:
    while time.time() < deadline:
        if all(mtime(i["dump_file"]) not in (None, before[i["dump_file"]]) for i in spec["ranks"] if i.get("pipe_file")):
            break
        time.sleep(0.2)
    time.sleep(0.3)
sent = 0
for item in spec["ranks"]:
    path = item["dump_file"]
    out = {"rank": item["rank"], "path": path}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                out["error"] = "not a regular file"
            elif st.st_size > limit or sent + st.st_size > total:
                out["error"] = "%d bytes, over the collection limit" % st.st_size
            else:
                data = os.read(fd, st.st_size + 1)
                sent += len(data)
                out["mtime"] = st.st_mtime
                out["fresh"] = before.get(path) != st.st_mtime
                out["data"] = base64.b64encode(data).decode("ascii")
        finally:
            os.close(fd)
    except OSError as exc:
        out["error"] = exc.strerror or str(exc)
    print(json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class Collected:
    """What collect_dumps brought back from one node."""

    saved: Tuple[str, ...] = ()  # local paths written
    problems: Tuple[Tuple[int, str], ...] = ()  # (rank, why) for a dump not brought back or not asked for


def _safe_name_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", text)[:64].lstrip(".") or "node"


async def collect_dumps(
    link: Any,
    locations: Sequence[DumpLocations],
    dest_dir: str,
    host: str,
    trigger: bool = True,
    wait_s: float = 10.0,
    max_bytes: int = 64 * 1024 * 1024,
    max_total: int = 256 * 1024 * 1024,
    python: str = "python3",
    rank_pids: Sequence[Tuple[int, int]] = (),
    discover: bool = False,
) -> Collected:
    """Ask the ranks for dumps through their FIFOs (when `trigger`), then copy each dump file here.

    The ranks are `locations` (from dump_locations) and/or `rank_pids`, (pid, rank) pairs whose
    dump locations the node reads from each process's own /proc/PID/environ (what the stacks side
    finds: the ranks' pids); a rank that keeps no flight recorder is a problem saying so. With
    `discover`, the node also finds its ranks itself, as the stacks helper does (RANK or LOCAL_RANK
    in a process's environment).

    Over the node's SSH connection when `link` has `run_command`, else as a local process. Files
    land in `dest_dir/<host>/` under their own names (ending in the rank), ready for analyse_dir.
    Sizes are bounded per file and in all; a file not brought back is a (rank, why) problem.
    """
    spec = {
        "ranks": [{"rank": item.rank, "dump_file": item.dump_file, "pipe_file": item.pipe_file} for item in locations],
        "pids": [{"pid": int(pid), "rank": int(rank)} for pid, rank in rank_pids],
        "discover": bool(discover),
        "trigger": bool(trigger),
        "wait_s": float(wait_s),
        "max_bytes": int(max_bytes),
        "max_total": int(max_total),
    }
    finder = ""
    if discover:
        import inspect

        from opsconsole.probe import rank_stacks

        finder = inspect.getsource(rank_stacks)
    script = "BUFFER_VARS, DUMP_VARS, PIPE_VARS, DEFAULT_PREFIX, RANK_FINDER = %r, %r, %r, %r, %r\n%s" % (
        BUFFER_SIZE_VARS,
        DUMP_FILE_VARS,
        PIPE_FILE_VARS,
        DEFAULT_DUMP_PREFIX,
        finder,
        _REMOTE_COLLECT,
    )
    argv = [python, "-c", script, json.dumps(spec)]
    timeout = wait_s + 60.0
    if link is not None and hasattr(link, "run_command"):
        status, out, err = await link.run_command(argv, timeout=timeout)
    else:
        if python == "python3":
            argv[0] = sys.executable
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            raw_out, raw_err = await asyncio.wait_for(process.communicate(), timeout)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            return Collected(
                (),
                tuple(
                    (rank, "the collector timed out after %g s" % timeout)
                    for rank in sorted({item.rank for item in locations} | {r for _, r in rank_pids})
                ),
            )
        status, out, err = process.returncode, raw_out.decode("utf-8", "replace"), raw_err.decode("utf-8", "replace")
    saved: List[str] = []
    problems: List[Tuple[int, str]] = []
    ranks = {item.rank for item in locations} | {int(rank) for _, rank in rank_pids}
    if discover:  # whatever ranks the node found: any small rank number is one we asked for
        ranks |= {rank for rank in _ranks_answered(out)}
    limit_chars = (max_total * 4) // 3 + 1024 * (len(locations) + len(rank_pids) + len(ranks)) + 4096
    if len(out) > limit_chars:
        return Collected((), tuple((rank, "the node sent more than asked for") for rank in sorted(ranks)))
    for line in out.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if type(message) is not dict or type(message.get("rank")) is not int or message["rank"] not in ranks:
            continue
        rank = message["rank"]
        if "pipe" in message:
            if not message.get("asked"):
                problems.append((rank, "dump not asked for: %s" % str(message.get("note"))[:200]))
            continue
        if "error" in message:
            problems.append((rank, "%s: %s" % (str(message.get("path"))[:200], str(message["error"])[:200])))
            continue
        try:
            data = base64.b64decode(str(message.get("data", "")), validate=True)
        except ValueError:
            problems.append((rank, "the node sent a dump that is not base64"))
            continue
        if len(data) > max_bytes:
            problems.append((rank, "dump over %d bytes" % max_bytes))
            continue
        name = _safe_name_part(os.path.basename(str(message.get("path"))))
        if not name.endswith(str(rank)):
            name = "%s_rank%d" % (name, rank)
        folder = os.path.join(dest_dir, _safe_name_part(host))
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        saved.append(path)
    if status not in (0, None) and not saved:
        problems.append((-1, "collector exited %s: %s" % (status, (err or "").strip()[-200:])))
    elif discover and not ranks and not saved and not problems:
        # Said, or `fr --collect` would only report an empty directory with no reason.
        problems.append((-1, NO_RANKS_FOUND))
    return Collected(tuple(saved), tuple(problems))


def _ranks_answered(out: str) -> List[int]:
    ranks = []
    for line in out.splitlines()[:100_000]:
        match = re.match(r'\{"rank": (\d{1,7}),', line)
        if match:
            ranks.append(int(match.group(1)))
    return ranks


def shell_quote(argv: Sequence[str]) -> str:
    """The collector's command line as a shell would see it (for the audit log)."""
    return shlex.join([str(word) for word in argv])


async def collect_from_links(
    links: Mapping[str, Any],
    dest_dir: str,
    trigger: bool = True,
    wait_s: float = 10.0,
    rank_pids: Optional[Mapping[str, Sequence[Tuple[int, int]]]] = None,
) -> Dict[str, Collected]:
    """collect_dumps on every node at once, each over its own link; {node: what came back}.

    Ranks are `rank_pids[node]` where given (the stacks screen's), else what each node finds itself.
    A node without a command channel (a replay, a metrics-only source) is one problem, never an error.
    """
    from opsconsole.nodes.base import COMMANDS_HERE, COMMANDS_SSH, command_channel, is_replayed

    async def one(name: str, link: Any) -> Collected:
        channel = command_channel(link)
        if is_replayed(link) or channel not in (COMMANDS_HERE, COMMANDS_SSH):
            return Collected((), ((-1, "no command channel to %s: its dumps cannot be read" % name),))
        pids = list((rank_pids or {}).get(name, ()))
        python = getattr(getattr(link, "node", None), "python", None) or "python3"
        try:
            return await collect_dumps(
                link if channel == COMMANDS_SSH else None,
                [],
                dest_dir,
                host=name,
                trigger=trigger,
                wait_s=wait_s,
                rank_pids=pids,
                discover=not pids,
                python=python,
            )
        except Exception as exc:  # one node's failure (unreachable, timed out) is its problem line, not the others'
            reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
            return Collected((), ((-1, "%s: %s" % (name, str(reason).splitlines()[0][:200])),))

    names = list(links)
    results = await asyncio.gather(*(one(name, links[name]) for name in names))
    return dict(zip(names, results))
