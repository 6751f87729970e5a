"""Listing one checkpoint directory: every format, the latest and best markers, totals and free space.

Works over any FileSystem (local os calls, or SFTP through remote.py). Each checkpoint's
read result is cached by path, size and mtime, so a rescan of an unchanged directory costs
one listdir and a stat per name. Names that are not checkpoints are counted, never read.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import operator
import os
import posixpath
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple, cast

import orjson

from opsconsole.checkpoints import formats, hf_runs, layouts, zipmeta
from opsconsole.checkpoints import proofs as proofs_module
from opsconsole.checkpoints.access import LOCAL, DirItem, FileStat, FileSystem
from opsconsole.checkpoints.cache import CRC_CACHE, METADATA_CACHE, ResultCache
from opsconsole.checkpoints.proofs import RACY_S, Proof, ProofStore, unit_key
from opsconsole.checkpoints.records import (
    BROKEN,
    CURRENT_TAG,
    FORMAT_ACCELERATE,
    FORMAT_DCP,
    FORMAT_DEEPSPEED,
    FORMAT_HF,
    FORMAT_LEGACY,
    FORMAT_LIGHTNING,
    FORMAT_LINK,
    FORMAT_SAFETENSORS,
    FORMAT_TORCH,
    FORMAT_UNKNOWN,
    INTEGRITY_CORRUPT,
    INTEGRITY_TRUNCATED,
    INTEGRITY_UNCHECKED,
    LAYOUT_CHECKPOINT_MANAGER,
    LAYOUT_FILE,
    LAYOUT_LIGHTNING,
    LAYOUT_LINK,
    CheckpointEntry,
    CheckpointMeta,
    DirListing,
    ModelCheckpointState,
    StateDictSummary,
)
from opsconsole.checkpoints.worker import read_checkpoint_file, read_dcp_metadata
from opsconsole.units import format_metric

GROWING_S = 600.0  # a truncated file modified this recently is probably still being written
# What is read of files changed this recently is not kept in memory either (proofs.RACY_S, git's
# racy-clean rule): a second change within the same timestamp tick (1 s on some file systems,
# SFTP's mtime) would leave every stat as it was, and the first read's verdict would stand.
SETTLE_S = RACY_S
LATEST_WORDS = ("latest", "last")
BEST_WORDS = ("best",)
REMOTE_WORKERS = 8  # files read at once over SFTP (latency-bound; one channel carries them all)


def join(fs: FileSystem, root: str, name: str) -> str:
    return posixpath.join(root, name) if fs.remote else os.path.join(root, name)


def _is_latest_name(name: str) -> bool:
    stem = formats.strip_suffix(name).lower()
    return any(word in stem for word in LATEST_WORDS)


def is_best_name(name: str) -> bool:
    """checkpoint_best.pt, best.ckpt, model_best.pth: a copy kept as the best."""
    return _is_best_name(name)


def _is_best_name(name: str) -> bool:
    stem = formats.strip_suffix(name).lower()
    return any(word in stem for word in BEST_WORDS)


def _with_growth_note(result: formats.ReadResult, mtime: float, now: float) -> formats.ReadResult:
    if result.integrity == INTEGRITY_TRUNCATED and 0 <= now - mtime < GROWING_S:
        note = "modified %d s ago: probably still being written" % max(0, now - mtime)
        return replace(result, problem="%s (%s)" % (result.problem, note) if result.problem else note)
    return result


# The stat fields a judged file is known by (judged_identity; a kept listing's units: _kept_listing).
_JUDGED = operator.attrgetter("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")


def judged_identity(rel: str, st: FileStat) -> Tuple[str, int, int, int, int, int]:
    """(rel, st_dev, st_ino, size, mtime_ns, ctime_ns) of a file as the listing saw it (CheckpointEntry.judged).

    The ctime catches a file rewritten in place with its size kept and its mtime set back (no
    call can set a ctime). Over SFTP there is no device, inode or ctime (-1) and the mtime is
    what the server gives (whole seconds in SFTP v3): cleanup compares such a file at that precision.
    """
    raw = st.raw
    if raw is not None:
        return (rel,) + _JUDGED(raw)
    return (rel, -1, -1, st.size, int(round(st.mtime * 1e9)), -1)


def exact_times(files: Sequence[Tuple[str, FileStat]]) -> Tuple[Optional[Tuple[int, int]], ...]:
    """Each file's (mtime, ctime) in nanoseconds, for a signature that holds its stat.

    An os.stat_result compares as its first ten fields only, with the times in whole seconds: a
    file rewritten in place and its mtime set back within the second of its last change would
    compare equal. (None where the file system gives no lstat: SFTP's size and mtime are all.)
    """
    return tuple([None if st.raw is None else (st.raw.st_mtime_ns, st.raw.st_ctime_ns) for _, st in files])


def settled(files: Iterable[Tuple[str, FileStat]], started: float) -> bool:
    """Whether each file's last change (its ctime, else its mtime) is SETTLE_S older than `started`
    (epoch s, taken before the files were read): only then is what was read kept for a rescan."""
    limit_ns = (started - SETTLE_S) * 1e9
    for _, st in files:
        raw = st.raw
        if (raw.st_ctime_ns if raw is not None else st.mtime * 1e9) > limit_ns:
            return False
    return True


def read_file_entry(fs: FileSystem, path: str, item: DirItem, cache: ResultCache) -> formats.ReadResult:
    """The read result of one checkpoint file, from the cache when it is the same file, unchanged.

    Keyed by its identity where the file system gives one (device, inode, size, mtime, ctime: a
    file rewritten to the same size and mtime is read again), else by size and mtime.
    """
    signature = item.stat.identity or (item.stat.size, item.stat.mtime)
    cached = cache.get(fs.node, path, signature)
    if cached is not None:
        return cached
    started = time.time()
    try:
        # Parsed in the limited, reused metadata worker process (worker.py), never in this one:
        # a crafted file that crashes, hangs or bloats the parse becomes this entry's
        # "unreadable: <reason>" and the scan goes on. Was: fs.run_reader(path, formats.file_reader ...).
        result = read_checkpoint_file(fs, path, item.name, fs.read_window)
    except OSError as exc:
        return formats.ReadResult(
            formats._named_format(item.name),
            formats.meta_from_name(item.name),
            INTEGRITY_UNCHECKED,
            "cannot read: %s" % (exc.strerror or exc),
        )
    if settled([(item.name, item.stat)], started):
        cache.put(fs.node, path, signature, result)
    return result


MAX_UNIT_FILES = 10_000  # files listed in one checkpoint directory (members and size)
MAX_UNIT_DEPTH = 4  # Megatron: iter_N/mp_rank_00/model_optim_rng.pt; FSDP: pytorch_model_fsdp_0/__0_0.distcp
# Every weight and state file of a unit is checked (its zip end and directory, or its header): one
# left unchecked could be the member cut short, and the unit would count as a good one. The walk's
# bound (MAX_UNIT_FILES) is the bound here too; kept proofs make later listings a stat per file.
MAX_CHECKED_FILES = MAX_UNIT_FILES


def _walk_unit(
    fs: FileSystem, path: str, first: Optional[List[DirItem]] = None
) -> Tuple[List[Tuple[str, FileStat]], bool]:
    """(relative path, stat) of the regular files below `path` (never through a link), bounded; True when cut short."""
    if first is not None and len(first) <= MAX_UNIT_FILES and not any(child.stat.is_dir for child in first):
        # One flat directory (a checkpoint-N/, a save_state): its files as they are, a DirItem
        # being (name, stat) already. A rescan walks every unit; this is most of them.
        return [child for child in sorted(first) if child.stat.is_file], False
    out: List[Tuple[str, FileStat]] = []
    stack: List[Tuple[str, str, int, Optional[List[DirItem]]]] = [(path, "", 0, first)]
    while stack:
        folder, prefix, depth, children = stack.pop()
        if children is None:
            try:
                children = fs.listdir(folder)
            except OSError:
                continue
        for child in sorted(children):  # by name: a DirItem is (name, stat) and names in one directory differ
            rel = prefix + child.name
            if child.stat.is_file:
                out.append((rel, child.stat))
                if len(out) >= MAX_UNIT_FILES:
                    return out, True
            elif child.stat.is_dir and not child.stat.is_link and depth + 1 < MAX_UNIT_DEPTH:
                stack.append((join(fs, folder, child.name), rel + "/", depth + 1, None))
    return out, False


def _check_files(
    fs: FileSystem,
    path: str,
    files: Sequence[Tuple[str, Optional[FileStat]]],
    problems: List[str],
    proofs: Optional[ProofStore] = None,
) -> Tuple[List[str], List[StateDictSummary], bool]:
    """Integrity of a unit's weight and state files: safetensors headers, torch zip ends and directories.

    Each file's proof comes from `proofs` when kept there for this very file (same device,
    inode, size, mtime and ctime: proofs.py) by this code, else from reading it, and is kept for the next
    listing when the file was not changed between the listing's stat and the read. The last
    value is True when a file could not be read (an OSError: maybe passing, so nothing is kept).
    """
    integrities: List[str] = []
    summaries: List[StateDictSummary] = []
    read_failed = False
    # A kept proof is for the code that proved it too, as a unit's result and a kept listing are: a
    # fix to a check reaches the files proved before it (the code's digest is part of the proof's kind).
    code = _code_digest()
    for rel, st in list(files)[:MAX_CHECKED_FILES]:
        is_safetensors = rel.lower().endswith(".safetensors")
        kind = ("safetensors@" if is_safetensors else "zip@") + code
        full = join(fs, path, rel)
        identity = st.identity if st is not None else None
        proof = proofs.lookup(full, kind, identity) if proofs is not None else None
        if proof is None:
            started = time.time()
            try:
                if is_safetensors:
                    read, read_identity = fs.run_reader_identified(full, formats.safetensors_proof_reader)
                    proof = Proof(*cast("Tuple[str, Optional[str], Optional[StateDictSummary]]", read))
                else:
                    read, read_identity = fs.run_reader_identified(full, zipmeta.directory_check_reader)
                    integrity, problem = cast("Tuple[str, Optional[str]]", read)
                    proof = Proof(integrity, problem)
            except OSError as exc:
                problems.append("%s: %s" % (rel, exc.strerror or exc))
                read_failed = True
                continue
            if proofs is not None and read_identity is not None and read_identity == identity:
                proofs.store(full, kind, read_identity, proof, started)
        integrities.append(proof.integrity)
        if proof.problem:
            problems.append("%s: %s" % (rel, proof.problem))
        if proof.summary is not None:
            summaries.append(proof.summary)
    return integrities, summaries, read_failed


def _is_checked_member(rel: str) -> bool:
    """Whether the listing proves this member sound: every weight and state file of a unit.

    The safetensors header and the size it implies; a torch file's zip end, directory and the
    extent of its members (optimizer.pt, scheduler.pt, rng_state.pth, training_args.bin too:
    a resume reads them, so a unit with one cut short is no good one). A kept proof makes a
    later listing cost a stat per file (proofs.py).
    """
    lower = rel.lower()
    return lower.endswith((".safetensors", ".bin", ".pt", ".pth"))


def read_unit_dir(
    fs: FileSystem,
    path: str,
    name: str,
    kind: layouts.DirKind,
    children: List[DirItem],
    cache: ResultCache,
    proofs: Optional[ProofStore] = None,
    failures: Optional[List[str]] = None,
) -> Tuple[formats.ReadResult, int, float, Tuple[str, ...], Tuple[Tuple[Any, ...], ...]]:
    """(result, total bytes, newest mtime, member files, judged files) of one checkpoint directory.

    The judged files are judged_identity of every file the result was made from, relative to
    `path`; () when the walk was cut short (files unseen: the unit is never deleted).

    The record is built once from what each file says (one dict of fields, one CheckpointMeta):
    a listing of many HF units was dominated by copies of the records (dataclasses.replace),
    not by reading their files (benchmarks/checkpoint_hf_units.py).
    """
    walked, cut = _walk_unit(fs, path, children)
    files: Dict[str, int] = {rel: st.size for rel, st in walked}
    size = sum(files.values())
    mtime = max([st.mtime for _, st in walked], default=0.0)
    if not walked:
        # No file to date it (an empty save begun, only a FIFO): the directory's own time, not the
        # epoch, which made it 20,000 days old and past every min_age.
        try:
            mtime = fs.lstat(path).mtime
        except OSError:
            pass
    members = tuple(files)
    judged = () if cut else tuple(judged_identity(rel, st) for rel, st in walked)
    # Each file's name and stat: size, mtime and, where the file system gives them, its identity
    # (device, inode, ctime), so a file rewritten to the same size and mtime is a change too.
    signature = (kind, cut, tuple(walked), exact_times(walked))
    cached = cache.get(fs.node, path, signature)
    if cached is not None:
        return cached, size, mtime, members, judged
    # What an earlier listing (maybe another process) read of exactly these files (proofs.py).
    key = unit_key(kind, cut, walked, _code_digest()) if proofs is not None else None
    if key is not None and proofs is not None:
        kept = proofs.lookup_unit(path, key)
        if kept is not None and kept[0] == kind.format:
            result = formats.ReadResult(kept[0], kept[3], kept[1], kept[2])
            cache.put(fs.node, path, signature, result)
            return result, size, mtime, members, judged
    started = time.time()
    problems: List[str] = []
    integrities: List[str] = []
    unreadable: Optional[str] = None
    read_any_failed = False
    top = {rel: files[rel] for rel in files if "/" not in rel}
    fmt = kind.format
    fields = formats.dir_meta_fields(fmt if fmt in (FORMAT_DCP, FORMAT_HF) else FORMAT_HF, name, top)
    if cut:
        problems.append("over %d files: members listed in part" % MAX_UNIT_FILES)
    if ".metadata" in files or fmt == FORMAT_DCP:
        dcp = None
        if ".metadata" not in files:
            dcp = formats.dcp_result(None, files)  # shards without it: an incomplete save
        else:
            try:
                # A pickle: parsed in the limited metadata worker, as data.pkl is (worker.py).
                dcp = read_dcp_metadata(fs, join(fs, path, ".metadata"), dict(files))
            except OSError as exc:
                unreadable = "could not read .metadata: %s" % (exc.strerror or exc)
        if dcp is not None:
            integrities.append(dcp.integrity)
            if dcp.problem:
                problems.append(dcp.problem)
            unreadable = dcp.unreadable
            fields.update(
                details=dcp.meta.details,
                top_keys=dcp.meta.top_keys,
                tensor_count=dcp.meta.tensor_count,
                tensor_bytes=dcp.meta.tensor_bytes,
            )
    if fmt == FORMAT_HF:
        if "trainer_state.json" in files:
            try:
                text = fs.read_file(join(fs, path, "trainer_state.json"), formats.MAX_JSON_BYTES)
                state, problem = formats.trainer_state_fields(text)
            except OSError as exc:
                state, problem = {}, "trainer_state.json: %s" % (exc.strerror or exc)
            if problem:
                problems.append(problem)
                unreadable = "could not read: %s" % problem
            # What trainer_state.json records, with the step from the name when it records none.
            state["step"] = state["step"] if state.get("step") is not None else fields.get("step")
            state["details"] = state.get("details", ()) + fields["details"]
            state["has_optimizer"] = fields["has_optimizer"]
            state["has_scheduler"] = fields["has_scheduler"]
            fields = state
        else:
            integrities.append(INTEGRITY_TRUNCATED)
            problems.append("no trainer_state.json: an incomplete save (the Trainer writes it last)")
        if not any(layouts.hf_resumable_weights(rel) for rel in files):
            other_weights = sorted(rel for rel in files if layouts.hf_other_weights(rel))
            if other_weights:
                # Maybe a Trainer subclass's own weights: names alone prove no damage, so it is kept
                # and, unjudged, takes no keep place either.
                unreadable = unreadable or (
                    "could not judge: no weights the Trainer resumes from, but %s: weights under another name?"
                    % ", ".join(other_weights[:3])
                )
            else:
                # The Trainer writes the weights first; resume_from_checkpoint refuses a checkpoint-N/
                # without them ("Can't find a valid checkpoint"): a copy that lost them, not a save.
                integrities.append(INTEGRITY_CORRUPT)
                problems.append(
                    "no model weights (model.safetensors, pytorch_model.bin, an index, adapter or FSDP state)"
                )
    if fmt != FORMAT_DCP:
        checked, summaries, read_failed = _check_files(
            fs, path, [(rel, st) for rel, st in walked if _is_checked_member(rel)], problems, proofs
        )
        if read_failed:
            key = None  # a file that could not be read this time: nothing kept of the unit
            read_any_failed = True
            if failures is not None:
                failures.append(name)
        integrities.extend(checked)
        summary = formats.summaries_total(summaries)
        if summary is not None:
            fields.update(state_dict=summary, tensor_count=summary.keys, tensor_bytes=summary.bytes)
    if fmt == FORMAT_DEEPSPEED and not any(
        layouts.DEEPSPEED_FILE.search(rel.rsplit("/", 1)[-1]) and "model_states" in rel for rel in files
    ):
        integrities.append(INTEGRITY_TRUNCATED)
        problems.append("no *_model_states.pt: an incomplete save")
    if fmt == FORMAT_ACCELERATE and not any(layouts.ACCELERATE_RNG_STATES.match(rel) for rel in top):
        # save_state writes random_states_<rank>.pkl last, always: without it the save stopped part
        # way (load_state of such a directory fails on its missing optimizer or scheduler).
        integrities.append(INTEGRITY_TRUNCATED)
        problems.append("no random_states_N.pkl: an incomplete save (accelerate's save_state writes it last)")
    integrity = formats.combine_integrity(integrities)
    if cut and integrity not in BROKEN:
        # Files past the walk's bound were never seen, let alone checked: such a unit vouches for
        # nothing, so it never takes a keep place (and, not all judged, it is never deleted).
        integrity = INTEGRITY_UNCHECKED
        unreadable = unreadable or "over %d files: not all of them checked" % MAX_UNIT_FILES
    result = formats.ReadResult(
        fmt, CheckpointMeta(**fields), integrity, "; ".join(problems) or None, unreadable=unreadable
    )
    if settled(walked, started) and not read_any_failed:  # (a failed read may pass: read again next time)
        cache.put(fs.node, path, signature, result)
    if key is not None and proofs is not None:
        proofs.store_unit(path, key, result, started)
    return result, size, mtime, members, judged


def _entry(
    path: str, name: str, result: formats.ReadResult, size: int, mtime: float, is_dir: bool, **unit
) -> CheckpointEntry:
    return CheckpointEntry(
        path=path,
        name=name,
        format=result.format,
        size_bytes=size,
        mtime=mtime,
        is_dir=is_dir,
        meta=result.meta,
        integrity=result.integrity,
        problem=result.problem,
        unreadable=result.unreadable,
        **unit,
    )


def _apply_crc_cache(fs: FileSystem, entry: CheckpointEntry, crc_cache: ResultCache) -> CheckpointEntry:
    found = crc_cache.get(fs.node, entry.path, (entry.size_bytes, entry.mtime))
    if found is None:
        return entry
    if entry.integrity in BROKEN and found.integrity not in BROKEN:
        # Read broken now: the check kept for this size and mtime (which can be set back) is of another content.
        return entry
    return replace(entry, integrity=found.integrity, problem=found.problem or entry.problem, crc_checked=True)


def _read_small(
    fs: FileSystem, root: str, item: DirItem, limit: int = 1024, failures: Optional[List[str]] = None
) -> bytes:
    if not item.stat.is_file or item.stat.size > limit:
        return b""
    try:
        return fs.read_file(join(fs, root, item.name), limit)
    except OSError:
        if failures is not None:
            failures.append(item.name)  # maybe passing: the listing made without it is not kept on disk
        return b""


def _index_shards(fs: FileSystem, root: str, item: DirItem, failures: Optional[List[str]] = None) -> List[str]:
    """The shard names a *.safetensors.index.json maps its tensors to (bounded JSON)."""
    if item.stat.size > formats.MAX_JSON_BYTES:
        return []
    try:
        index = formats._json(fs.read_file(join(fs, root, item.name), formats.MAX_JSON_BYTES))
    except OSError:
        if failures is not None:
            failures.append(item.name)
        return []
    except ValueError:
        return []
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        return []
    return sorted({v for v in weight_map.values() if isinstance(v, str) and "/" not in v and v not in ("", ".", "..")})[
        :100_000
    ]


class _Unit:
    """A unit found while scanning, before it is read (how to read it, and its name and layout)."""

    def __init__(
        self,
        name: str,
        path: str,
        rel: str,
        *,
        kind: Optional[layouts.DirKind] = None,
        children: Optional[List[DirItem]] = None,
        group: Optional[layouts.FileGroup] = None,
        item: Optional[DirItem] = None,
        nested: Optional[str] = None,
    ) -> None:
        self.name, self.path, self.rel = name, path, rel
        self.kind, self.children, self.group, self.item, self.nested = kind, children, group, item, nested


def _read_unit(
    fs: FileSystem,
    root: str,
    unit: _Unit,
    cache: ResultCache,
    now: float,
    proofs: Optional[ProofStore],
    failures: Optional[List[str]] = None,
) -> CheckpointEntry:
    if unit.kind is not None:
        result, size, mtime, members, judged = read_unit_dir(
            fs,
            unit.path,
            posixpath.basename(unit.path.rstrip("/")) or unit.name,
            unit.kind,
            unit.children or [],
            cache,
            proofs,
            failures,
        )
        # A directory is one member: it goes whole, with whatever it holds.
        return _entry(
            unit.path,
            unit.name,
            result,
            size,
            mtime,
            True,
            layout=unit.kind.layout,
            unit=_files_text(unit.kind.unit, members),
            members=(unit.rel,),
            judged=tuple((unit.rel + "/" + file[0],) + file[1:] for file in judged),
        )
    group = unit.group
    assert group is not None
    if group.layout == LAYOUT_FILE and unit.item is not None:
        result = _with_growth_note(read_file_entry(fs, unit.path, unit.item, cache), unit.item.stat.mtime, now)
        return _entry(
            unit.path,
            unit.name,
            result,
            unit.item.stat.size,
            unit.item.stat.mtime,
            False,
            layout=LAYOUT_FILE,
            unit="file",
            members=group.members,
            judged=(judged_identity(unit.item.name, unit.item.stat),),
            unmanaged=result.unmanaged,
        )
    # A final model or a sharded model: several files at the top, one unit.
    problems: List[str] = []
    integrities, summaries, read_failed = _check_files(fs, root, [(name, None) for name in group.weights], problems)
    if read_failed and failures is not None:
        failures.append(unit.name)
    if group.missing:
        integrities.append(INTEGRITY_CORRUPT)
        problems.insert(
            0,
            "shard %s named in the index is missing%s"
            % (group.missing[0], " (and %d more)" % (len(group.missing) - 1) if len(group.missing) > 1 else ""),
        )
    stats = {}
    for name in group.members:
        try:
            stats[name] = fs.lstat(join(fs, root, name))
        except OSError:
            if failures is not None:
                failures.append(name)
            continue
    summary = formats.summaries_total(summaries)
    meta = CheckpointMeta(
        details=tuple(("file " + n, "%d bytes" % st.size) for n, st in sorted(stats.items())[:50]),
        state_dict=summary,
        tensor_count=summary.keys if summary else None,
        tensor_bytes=summary.bytes if summary else None,
        has_optimizer=False,
        has_scheduler=False,
    )
    fmt = FORMAT_SAFETENSORS if any(w.endswith(".safetensors") for w in group.weights) else FORMAT_TORCH
    result = formats.ReadResult(fmt, meta, formats.combine_integrity(integrities), "; ".join(problems) or None)
    return _entry(
        unit.path,
        unit.name,
        result,
        sum(st.size for st in stats.values()),
        max([st.mtime for st in stats.values()] or [0.0]),
        False,
        layout=group.layout,
        unit=group.unit,
        members=group.members,
        unmanaged=group.unmanaged,
    )


def _find_units(
    fs: FileSystem,
    root: str,
    items: List[DirItem],
    failures: Optional[List[str]] = None,
    unlisted: Optional[List[Tuple[str, DirItem, str]]] = None,
    proofs: Optional[ProofStore] = None,
) -> Tuple[List[_Unit], int, List[Tuple[str, List[DirItem]]]]:
    """The units among `root`'s entries (links aside), how many names are no checkpoint, and every
    directory listed to tell them (path relative to root, its items): what the listing depends on.

    With `proofs`, a directory whose identity is the one the kept listing recorded is not read
    again: its names are the recorded ones (ProofStore.kept_names), each lstat made afresh.

    A directory named as a checkpoint (checkpoint-N/, checkpoints/checkpoint_N/ ...) that cannot be
    listed goes to `unlisted` (name relative to root, item, why): it may be the best or the newest,
    and the listing says so rather than leave it out."""
    units: List[_Unit] = []
    listed: List[Tuple[str, List[DirItem]]] = []
    other = 0
    files = [item for item in items if item.stat.is_file and not item.stat.is_link]
    by_name = {item.name: item for item in files}
    index_maps = {
        item.name: _index_shards(fs, root, item, failures) for item in files if item.name.endswith(".index.json")
    }
    groups, others = layouts.group_top_files([item.name for item in files], index_maps)
    other += len(others)
    for group in groups:
        if group.layout == LAYOUT_FILE:
            units.append(_Unit(group.name, join(fs, root, group.name), "", group=group, item=by_name[group.name]))
        else:
            units.append(_Unit(group.name, join(fs, root, group.name), "", group=group))
    prefix = root if not root or root.endswith("/") else root + "/"  # join(fs, root, name) of a name from a listing
    for item in items:
        if not item.stat.is_dir or item.stat.is_link:
            if not item.stat.is_file and not item.stat.is_link:
                other += 1  # a FIFO, socket or device: never opened
            continue
        path = prefix + item.name
        try:
            children = _listdir(fs, path, item.name, item, proofs)
        except OSError as exc:
            if failures is not None:
                failures.append(item.name)
            if unlisted is not None and (layouts.dir_series(item.name) or item.name in layouts.NESTED_SERIES_DIRS):
                unlisted.append((item.name, item, exc.strerror or str(exc)))
            else:
                other += 1
            continue
        listed.append((item.name, children))
        kind = layouts.dir_kind(item.name, map(_NAME, children))
        if kind is not None:
            units.append(_Unit(item.name, path, item.name, kind=kind, children=children))
            continue
        found = False
        if item.name in layouts.NESTED_SERIES_DIRS:
            # accelerate's automatic naming (checkpoints/checkpoint_N/), torchtitan's checkpoint/step-N/
            for child in children:
                if not child.stat.is_dir or child.stat.is_link:
                    continue
                child_path = join(fs, path, child.name)
                try:
                    grandchildren = _listdir(fs, child_path, item.name + "/" + child.name, child, proofs)
                except OSError as exc:
                    if failures is not None:
                        failures.append(item.name + "/" + child.name)
                    if unlisted is not None and layouts.dir_series(child.name):
                        found = True
                        unlisted.append((item.name + "/" + child.name, child, exc.strerror or str(exc)))
                    continue
                listed.append((item.name + "/" + child.name, grandchildren))
                child_kind = layouts.dir_kind(child.name, map(_NAME, grandchildren))
                if child_kind is not None:
                    found = True
                    units.append(
                        _Unit(
                            item.name + "/" + child.name,
                            child_path,
                            item.name + "/" + child.name,
                            kind=child_kind,
                            children=grandchildren,
                            nested=path,
                        )
                    )
        if not found:
            other += 1
    return units, other, listed


def _listdir(fs: FileSystem, path: str, rel: str, item: DirItem, proofs: Optional[ProofStore]) -> List[DirItem]:
    """fs.listdir(path), or the kept listing's names for directory `rel` when its identity is
    unchanged (item: its lstat from the listing of its parent), each name's lstat made now."""
    raw = item.stat.raw
    if proofs is not None and raw is not None:
        names = proofs.kept_names(rel, (raw.st_dev, raw.st_ino, raw.st_mtime_ns, raw.st_ctime_ns))
        if names is not None:
            known = fs.listdir_known(path, names)
            if known is not None:
                return known
    return fs.listdir(path)


def _dir_records(items: List[DirItem], listed_dirs: List[Tuple[str, List[DirItem]]]) -> Optional[Dict[str, list]]:
    """What ProofStore.kept_names answers from: each listed directory's identity and names; None
    where the file system gives no identity."""
    stat_of = {item.name: item.stat.raw for item in items}
    for rel, children in listed_dirs:
        for child in children:
            if child.stat.is_dir:
                stat_of[rel + "/" + child.name] = child.stat.raw
    records = {}
    for rel, children in listed_dirs:
        raw = stat_of.get(rel)
        if raw is None:
            return None
        records[rel] = [raw.st_dev, raw.st_ino, raw.st_mtime_ns, raw.st_ctime_ns, list(map(_NAME, children))]
    return records


def scan_directory(
    root: str,
    fs: FileSystem = LOCAL,
    *,
    cache: ResultCache = METADATA_CACHE,
    crc_cache: ResultCache = CRC_CACHE,
    now: Optional[float] = None,
    proofs: Optional[ProofStore] = None,
    keep_proofs: bool = True,
) -> DirListing:
    """List the checkpoint units of `root` with their metadata, markers, series, totals and free space.

    `root` may itself be one checkpoint (a checkpoint-N/, a save_state directory, a DCP
    directory): it is then listed as that one unit, never as its files. What each unit's
    files were proved to be is kept on disk for the next listing (proofs.py; local files
    only): `proofs` names the store, `keep_proofs=False` keeps none.
    """
    if proofs is None and keep_proofs and not fs.remote:
        proofs = ProofStore.for_listing(fs.node, root)
    try:
        return _scan_directory(root, fs, cache, crc_cache, now, proofs)
    finally:
        if proofs is not None:
            proofs.flush()


def _scan_directory(
    root: str,
    fs: FileSystem,
    cache: ResultCache,
    crc_cache: ResultCache,
    now: Optional[float],
    proofs: Optional[ProofStore],
) -> DirListing:
    started = time.perf_counter()
    listed_at = time.time()
    now = listed_at if now is None else now
    try:
        items = fs.listdir(root)
    except OSError as exc:
        return DirListing(
            root=root, node=fs.node, problem="cannot list %s: %s" % (root, exc.strerror or exc), scanned_at=now
        )
    root_name = (posixpath.basename(root.rstrip("/")) if fs.remote else os.path.basename(root.rstrip(os.sep))) or root
    own_kind = layouts.dir_kind(root_name, map(_NAME, items))
    if own_kind is not None:
        result, size, mtime, members, _ = read_unit_dir(fs, root, root_name, own_kind, items, cache, proofs)
        entry = _entry(
            root,
            root_name,
            result,
            size,
            mtime,
            True,
            layout=own_kind.layout,
            unit=_files_text(own_kind.unit, members),
            members=(".",),
            unmanaged=ROOT_IS_UNIT,
        )
        return _listing(fs, root, (_apply_crc_cache(fs, entry, crc_cache),), 0, now, started)

    failures: List[str] = []  # reads that failed (maybe passing): such a listing is not kept on disk
    unlisted: List[Tuple[str, DirItem, str]] = []
    units, other, listed_dirs = _find_units(fs, root, items, failures, unlisted, proofs)
    # A rescan of a directory where nothing changed: every name and stat the listing depends on is
    # the same as last time (the root's, each directory's it listed), so its entries are too. Kept
    # beside the results in `cache` (a fresh cache, a fresh listing); not for a root holding
    # symlinks (what they point to is outside these stats) or units with subdirectories (their
    # files are listed only when read).
    memo_path = "\0listing\0" + root
    memo_able = _memo_able(items, units)
    # Where the file system gives identities (local), one digest of every name and identity stands
    # for them all, here and in the listing kept on disk; else (SFTP) the names and stats themselves.
    kept_key = _listing_key(root, items, listed_dirs) if memo_able else None
    memo_signature: Optional[Tuple] = None
    if kept_key is not None:
        if kept_key.newest_ctime_ns <= (listed_at - SETTLE_S) * 1e9:
            memo_signature = (kept_key.digest, id(crc_cache), crc_cache.version)
    elif memo_able:
        memo_signature = _unchanged_signature(items, listed_dirs, crc_cache, listed_at)
    if memo_signature is not None:
        remembered = cache.get(fs.node, memo_path, memo_signature)
        if remembered is not None:
            return _listing(fs, root, remembered[0], remembered[1], now, started, remembered[2])
    # What a new process asks next: the listing an earlier one kept on disk of exactly these files
    # (every name and identity the listing depends on, proofs.py), when no CRC result of this
    # process would change an entry.
    if proofs is not None and len(crc_cache) == 0 and kept_key is not None:
        kept = _kept_listing(root, units, other, proofs, kept_key)
        if kept is not None:
            warnings = hf_runs.resume_warnings(kept)
            if memo_signature is not None:
                # The warnings with the entries: a refresh of an unchanged directory works nothing out again.
                cache.put(fs.node, memo_path, memo_signature, (kept, other, warnings))
            return _listing(fs, root, kept, other, now, started, warnings)

    def read(unit: _Unit) -> CheckpointEntry:
        return _apply_crc_cache(fs, _read_unit(fs, root, unit, cache, now, proofs, failures), crc_cache)

    if fs.remote and len(units) > 1:
        with ThreadPoolExecutor(max_workers=REMOTE_WORKERS) as pool:
            read_entries = list(pool.map(read, units))
    else:
        read_entries = [read(unit) for unit in units]
    entries: Dict[str, CheckpointEntry] = {unit.name: entry for unit, entry in zip(units, read_entries)}
    nested = {unit.name: unit.nested for unit in units if unit.nested}
    protections: Dict[str, List[str]] = {name: [] for name in entries}
    latest: Set[str] = set()
    best: Set[str] = set()

    def protect(name: str, why: str) -> None:
        if name in protections and why not in protections[name]:
            protections[name].append(why)

    # The current tag, as DeepSpeed's `latest` and Megatron's latest_checkpointed_iteration.txt name it.
    for item in items:
        if item.name == layouts.DEEPSPEED_LATEST and item.stat.is_file:
            tag = layouts.deepspeed_latest_tag(_read_small(fs, root, item, failures=failures))
            if tag in entries:
                latest.add(tag)
                protect(tag, "%s (DeepSpeed's `latest` names it)" % CURRENT_TAG)
        elif item.name == layouts.MEGATRON_LATEST and item.stat.is_file:
            tag = layouts.megatron_latest_dir(_read_small(fs, root, item, failures=failures))
            if tag in entries:
                latest.add(tag)
                protect(tag, "%s (Megatron's latest_checkpointed_iteration.txt names it)" % CURRENT_TAG)

    links = [item for item in items if item.stat.is_link]
    root_real = root
    if links:  # (what the root resolves to matters only to the links in it: a call, and lstats, saved)
        try:
            root_real = fs.realpath(root)
        except OSError:
            pass
    for item in links:
        path = join(fs, root, item.name)
        try:
            target = fs.readlink(path)
        except OSError:
            target = "?"
        try:
            resolved = fs.realpath(path)
        except OSError:
            resolved = ""
        parent, base = (posixpath.split(resolved) if fs.remote else os.path.split(resolved)) if resolved else ("", "")
        if parent == root_real and base in entries:
            if _is_best_name(item.name):
                best.add(base)
                protect(base, "best (%s links to it)" % item.name)
            else:
                latest.add(base)  # checkpoint_latest.pt, last.ckpt, latest: any alias in the dir
                protect(base, "latest (%s links to it)" % item.name)
            continue
        if not formats.is_checkpoint_file_name(item.name) and not _is_latest_name(item.name):
            other += 1
            continue
        inside = resolved.startswith(root_real.rstrip("/") + "/")
        reason = "symlink into a subdirectory" if inside else "symlink to %s, outside the directory" % target
        if not resolved or not _exists(fs, path):
            reason = "dangling symlink to %s" % target
        entries[item.name] = CheckpointEntry(
            path=path,
            name=item.name,
            format=FORMAT_LINK,
            size_bytes=0,
            mtime=item.stat.mtime,
            is_link=True,
            link_target=target,
            problem=reason,
            layout=LAYOUT_LINK,
            unit="link",
            unmanaged="symlink: never deleted, never followed",
        )
        protections[item.name] = []

    for name, item, why in unlisted:
        entries[name] = CheckpointEntry(
            path=join(fs, root, name),
            name=name,
            format=FORMAT_UNKNOWN,
            size_bytes=0,
            mtime=item.stat.mtime,
            is_dir=True,
            layout=layouts.named_dir_layout(name.rsplit("/", 1)[-1]),
            unit="directory (not listed)",
            unmanaged="a directory that cannot be listed: never deleted",
            unreadable="could not read: cannot list the directory (%s)" % why,
        )
        protections[name] = []

    # What the libraries recorded: Lightning's callback state, HF's best_model_checkpoint.
    lightning_truths = _lightning_truths(entries.values())
    lightning_read = bool(lightning_truths)
    top_k: Set[str] = set()
    for source, states in lightning_truths:
        for state in states:
            what = "ModelCheckpoint(monitor=%s, mode=%s)" % (state.monitor or "none", state.mode or "min")
            base = layouts.basename_of_recorded(state.best_model_path)
            if base in entries:
                best.add(base)
                score = "" if state.best_model_score is None else ", score " + format_metric(state.best_model_score)
                protect(base, "best (%s%s, as %s records)" % (what, score, source))
            for path, _ in state.best_k_models:
                base = layouts.basename_of_recorded(path)
                if base in entries:
                    top_k.add(base)
                    protect(base, "top-k of %s" % what)
            base = layouts.basename_of_recorded(state.last_model_path)
            if base in entries:
                latest.add(base)
                protect(base, "latest (last_model_path of %s)" % what)
    for name, entry in entries.items():
        if entry.format == FORMAT_LIGHTNING and layouts.LIGHTNING_LAST.match(name):
            latest.add(name)
            protect(name, "latest (Lightning's last.ckpt)")
    hf_bests = hf_runs.recorded_bests(entries)
    for claim in hf_bests:
        if claim.best:
            best.add(claim.name)
        protect(claim.name, claim.why)  # a recorded best is kept, called best or not (hf_runs.py)

    for name, entry in entries.items():
        if entry.format != FORMAT_LINK and not entry.is_dir and entry.layout == LAYOUT_FILE and _is_best_name(name):
            best.add(name)
            protect(name, "best (a copy named so)")
    losses = [e.meta.loss for e in entries.values() if e.meta.loss is not None and e.meta.loss == e.meta.loss]
    lowest = {e.name for e in entries.values() if losses and e.meta.loss == min(losses)}
    recorded_best = lightning_read or bool(hf_bests)
    if not recorded_best and not any(
        stands_as_best(entries[name]) and name in lowest for name in best if name in entries
    ):
        # No library recorded a best and no best copy is proved sound and of the lowest loss (a copy of a
        # higher or unknown loss holds other weights: a resumed run's new 'best', another run's): the
        # lowest loss a loop saved is kept as best.
        for name in lowest:
            if entries[name].integrity not in BROKEN and not entries[name].is_dir:
                best.add(name)
                protect(name, "best (lowest loss)")

    placed = {
        name: _series_of(entry, lightning_read, name in top_k, nested.get(name)) for name, entry in entries.items()
    }
    # A directory series whose library records no current one (HF Trainer, accelerate, torchtitan):
    # its newest sound unit is what a resume loads (get_last_checkpoint, load_state(), the max step).
    dir_series: Dict[str, List[str]] = {}
    for name, (_, series, _) in placed.items():
        if series is not None and entries[name].is_dir:
            dir_series.setdefault(series, []).append(name)
    for series, names in dir_series.items():
        sound = [n for n in names if entries[n].integrity not in BROKEN]
        if sound and not any(n in latest for n in names):
            newest = max(sound, key=lambda n: (_trailing_number(n), entries[n].mtime))
            latest.add(newest)
            protect(newest, "latest (the newest %s: what a resume loads)" % series)
            last = hf_runs.written_last(entries[n] for n in sound)
            if last is not None and last.name != newest:
                # Another run wrote into the directory after the one that reached the highest N:
                # its newest save is the checkpoint-N whose trainer_state.json was written last.
                latest.add(last.name)
                protect(
                    last.name,
                    "latest (its trainer_state.json, step %s, was written after %s's: the newest save of "
                    "the run that wrote last, unless a copy changed the times)" % (last.meta.step, newest),
                )

    listed = []
    for name in sorted(entries, key=natural_key):
        entry = entries[name]
        layout, series, unmanaged = placed[name]
        # Every entry was built by this scan and is seen by no one yet: finished in place rather
        # than copied (dataclasses.replace of each record was a fifth of a rescan).
        _finish(
            entry,
            latest=name in latest,
            best=name in best,
            lowest_loss=name in lowest,
            layout=layout,
            series=series,
            unmanaged=unmanaged,
            protections=tuple(protections.get(name, ())),
        )
        listed.append(entry)
    timeless = not any(e.integrity == INTEGRITY_TRUNCATED and not e.is_dir for e in listed)
    warnings = hf_runs.resume_warnings(listed)
    if memo_signature is not None and timeless:
        # (A truncated file's entry says how long ago it was written: not kept, it changes with the time.)
        cache.put(fs.node, memo_path, memo_signature, (tuple(listed), other, warnings))
    if kept_key is not None and proofs is not None and timeless and not failures and len(crc_cache) == 0:
        proofs.store_listing(
            kept_key.digest, kept_key.newest_ctime_ns, other, listed, listed_at, _dir_records(items, listed_dirs)
        )
    return _listing(fs, root, tuple(listed), other, now, started, warnings)


def _memo_able(items: List[DirItem], units: List["_Unit"]) -> bool:
    """Whether a listing is all in its directories' stats: no symlink at the top (what it points to is
    outside them), no unit with subdirectories (their files are listed only when read)."""
    if any(map(_IS_LINK, map(_STAT, items))):
        return False
    unit_items = itertools.chain.from_iterable(unit.children for unit in units if unit.children is not None)
    return not any(map(_IS_DIR, map(_STAT, unit_items)))


def stands_as_best(entry: CheckpointEntry) -> bool:
    """Whether a best copy (checkpoint_best.pt) may stand in for the lowest-loss unit: proved whole and
    read. One never opened (a legacy pickle), unreadable or broken does not: the unit is kept as best."""
    return entry.integrity not in BROKEN and entry.integrity != INTEGRITY_UNCHECKED and not entry.unreadable


def _unchanged_signature(
    items: List[DirItem],
    listed_dirs: List[Tuple[str, List[DirItem]]],
    crc_cache: ResultCache,
    listed_at: float,
) -> Optional[Tuple]:
    """What a whole listing that _memo_able passed depends on, to compare with the last one; None
    when it cannot be told so (a file changed within SETTLE_S of the listing).

    Every directory the listing listed counts (the units' and those that are none, which the
    listing found no unit in this time): all that was read to make it."""
    parts: List[Any] = []
    for rel, children in listed_dirs:
        if not settled(children, listed_at):
            return None
        parts.append((rel, tuple(children), exact_times(children)))
    if not settled(items, listed_at):
        return None
    return (tuple(items), exact_times(items), tuple(parts), id(crc_cache), crc_cache.version)


_MODE = operator.attrgetter("st_mode")
_CTIME = operator.attrgetter("st_ctime_ns")
_SIZE_MTIME = operator.attrgetter("st_size", "st_mtime_ns")
_NAME = operator.itemgetter(0)
_STAT = operator.itemgetter(1)
_RAW = operator.itemgetter(5)
_STAT_LIST = operator.itemgetter(1)  # of (rel, items)
_IS_FILE = operator.itemgetter(4)
_IS_DIR = operator.itemgetter(2)
_IS_LINK = operator.itemgetter(3)


@functools.lru_cache(maxsize=1)
def _code_stamp() -> str:
    """The checkpoint code as installed (each module's name, size and mtime): a listing kept by other
    code (an upgrade that lists differently) is not this code's. Read once per process."""
    folder = os.path.dirname(os.path.abspath(__file__))
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
        return repr([(n,) + _SIZE_MTIME(os.stat(os.path.join(folder, n))) for n in names])
    except OSError:
        return ""


def _code_digest() -> str:
    """_code_stamp in 16 hex digits: kept with every unit result, so it must be short."""
    return _stamp_digest(_code_stamp())


@functools.lru_cache(maxsize=4)
def _stamp_digest(stamp: str) -> str:
    return hashlib.blake2b(stamp.encode(), digest_size=8).hexdigest()


class _ListingKey(NamedTuple):
    """What a listing that _memo_able passed is known by, and what a kept one needs of it (_listing_key)."""

    digest: str
    newest_ctime_ns: int
    # Every item's judged identity (judged_identity, its path relative to the root), the root's
    # first, then each listed directory's, each directory's by name; whether each is a file; and
    # where each listed directory's begin and end among them (by its path relative to the root).
    identities: List[Tuple[Any, ...]]
    is_file: List[bool]
    spans: Dict[str, Tuple[int, int]]

    def judged(self, rel: str) -> Tuple[Tuple[Any, ...], ...]:
        """The files of listed directory `rel`, as read_unit_dir judges a unit's (sorted by name)."""
        start, end = self.spans[rel]
        files = self.identities[start:end]
        kinds = self.is_file[start:end]
        return tuple(files if all(kinds) else itertools.compress(files, kinds))


def _listing_key(
    root: str, items: List[DirItem], listed_dirs: List[Tuple[str, List[DirItem]]]
) -> Optional[_ListingKey]:
    """The digest of every name and identity (mode, device, inode, size, mtime, ctime) of every
    directory the listing listed, the newest ctime (ns) among them, and every item's judged identity
    (read_unit_dir's judged files are those of a unit's directory); None where a file system gives
    no identity (SFTP).

    The digest is of the judged identities themselves (by name in each directory) and the modes: a
    new process computes it before anything else and, when the kept listing is its own, takes each
    unit's judged files from the same tuples. One pass over all the directories' items at once (each
    directory's path and length mark where its items begin): per-directory passes cost more."""
    folders = [("", items)] + listed_dirs
    ordered = [sorted(children, key=_NAME) for children in map(_STAT_LIST, folders)]  # names in one directory differ
    counts = list(map(len, ordered))
    everything = list(itertools.chain.from_iterable(ordered))
    stats = list(map(_STAT, everything))
    raws = list(map(_RAW, stats))
    if not all(raws):
        return None
    rels = list(map(_NAME, folders))
    prefixes = itertools.chain.from_iterable(map(itertools.repeat, [rel + "/" if rel else "" for rel in rels], counts))
    identities = list(map(operator.add, zip(map(operator.add, prefixes, map(_NAME, everything))), map(_JUDGED, raws)))
    try:
        data = orjson.dumps(
            [proofs_module.FORMAT, _code_stamp(), root, rels, counts, identities, list(map(_MODE, raws))]
        )
    except TypeError:  # a name that is no valid UTF-8 (surrogate escapes): nothing kept
        return None
    bounds = list(itertools.accumulate(counts, initial=0))
    # SHA-256 (hardware-assisted where the CPU has SHA extensions): 12 us for 20 HF units' 16.6 kB,
    # blake2b 22 us; 160 bits of it kept, as many as before.
    return _ListingKey(
        hashlib.sha256(data).hexdigest()[:40],
        max(map(_CTIME, raws), default=0),
        identities,
        list(map(_IS_FILE, stats)),
        dict(zip(rels, zip(bounds, bounds[1:]))),
    )


def _kept_listing(
    root: str, units: List["_Unit"], other: int, proofs: ProofStore, key: Optional[_ListingKey]
) -> Optional[Tuple[CheckpointEntry, ...]]:
    """The entries kept for exactly this listing (proofs.entries_from_columns checks each value),
    each unit's path and judged files taken from the listing just made; None when any is off."""
    if key is None:
        return None

    def place(names: List[str], is_dirs: List[bool]) -> Optional[List[Tuple[str, Tuple[Tuple[Any, ...], ...]]]]:
        # Exactly this listing's units, each once, a directory as a directory.
        if len(names) != len(units):
            return None
        unit_of = {unit.name: unit for unit in units}
        placed = []
        for name, is_dir in zip(names, is_dirs):
            unit = unit_of.pop(name, None)
            if unit is None or is_dir != (unit.kind is not None):
                return None  # a unit the record names twice, or one this listing did not find
            if unit.kind is not None:
                # read_unit_dir's judged files: every file of the directory, or none when its walk
                # was cut short (_walk_unit: over MAX_UNIT_FILES items, as many files or more).
                judged = key.judged(unit.rel)
                if len(unit.children or ()) > MAX_UNIT_FILES and len(judged) >= MAX_UNIT_FILES:
                    judged = ()
            elif unit.group is not None and unit.group.layout == LAYOUT_FILE and unit.item is not None:
                judged = (judged_identity(unit.item.name, unit.item.stat),)
            else:
                judged = ()
            placed.append((unit.path, judged))
        return placed

    entries = proofs.lookup_listing(key.digest, other, place)
    return None if entries is None else tuple(entries)


def _finish(entry: CheckpointEntry, **fields) -> None:
    """Set the markers of an entry this scan built and has not handed out (a frozen dataclass)."""
    for key, value in fields.items():
        object.__setattr__(entry, key, value)


def _files_text(unit: str, members: Sequence[str]) -> str:
    return "%s (%d file%s)" % (unit, len(members), "" if len(members) == 1 else "s")


MAX_TRAILING_DIGITS = 255  # a name's longest part on most file systems: int() of it stays cheap


def _trailing_number(name: str) -> int:
    """The number a name ends with (checkpoint-N, step_N), compared as an int of any length as HF's
    get_last_checkpoint does; -1 when there is none. rstrip of the ASCII digits only: int() would
    also take other scripts' digits."""
    digits = len(name) - len(name.rstrip("0123456789"))
    return int(name[-digits:]) if 0 < digits <= MAX_TRAILING_DIGITS else -1


ROOT_IS_UNIT = (
    "the directory given is itself one checkpoint: cleanup never deletes the directory it is pointed at "
    "(point it at the parent to manage the series)"
)


def _series_of(
    entry: CheckpointEntry, lightning_read: bool, in_top_k: bool, nested_in: Optional[str]
) -> Tuple[str, Optional[str], Optional[str]]:
    """(layout, series, why unmanaged) of one listed unit: only members of a recognised series are managed."""
    if entry.is_link or entry.format == FORMAT_LINK:
        return entry.layout, None, entry.unmanaged or "symlink: never deleted, never followed"
    if entry.unmanaged:
        return entry.layout, None, entry.unmanaged
    base = entry.name.rsplit("/", 1)[-1]
    if entry.is_dir:
        series = layouts.dir_series(base)
        if series is None:
            return (
                entry.layout,
                None,
                "a %s directory without a number in its name: not part of a series" % entry.layout,
            )
        if nested_in is not None:
            return (
                entry.layout,
                series,
                "inside %s/: clean up that directory to manage this series" % entry.name.split("/")[0],
            )
        return entry.layout, series, None
    if entry.format == FORMAT_LEGACY:
        return entry.layout, None, "legacy pickle: listed, never opened, never deleted"
    if entry.format == FORMAT_UNKNOWN:
        return entry.layout, None, "format not recognised"
    layout, series = layouts.file_series(entry.name)
    if entry.format == FORMAT_LIGHTNING or layout == LAYOUT_LIGHTNING:
        if layouts.LIGHTNING_LAST.match(entry.name):
            return LAYOUT_LIGHTNING, None, "Lightning's last.ckpt: kept as latest"
        if not lightning_read:
            return (
                LAYOUT_LIGHTNING,
                None,
                "no ModelCheckpoint state could be read in this directory: its best and top-k are unknown",
            )
        if layouts.lightning_name(entry.name) or in_top_k:
            return LAYOUT_LIGHTNING, "ModelCheckpoint .ckpt", None
        return LAYOUT_LIGHTNING, None, "neither named by ModelCheckpoint nor in its top-k"
    if series is None:
        if layout == LAYOUT_CHECKPOINT_MANAGER:
            return layout, None, "CheckpointManager's copy: not part of the epoch series"
        return layout, None, "no epoch or step in its name: not part of a series"
    return layout, series, None


def _lightning_truths(entries: Iterable[CheckpointEntry]) -> List[Tuple[str, Tuple[ModelCheckpointState, ...]]]:
    """(name, states) of the newest Lightning checkpoint whose ModelCheckpoint state was read (the
    directory's truth), and of the one written last when that is another: a run started again into
    the same dirpath (its files beside the first run's, last-v1.ckpt) has its own best and top-k."""
    read = [e for e in entries if e.meta.callbacks and not e.is_link and e.integrity not in BROKEN]
    if not read:
        return []
    newest = max(read, key=lambda e: (e.meta.step if e.meta.step is not None else -1, e.mtime, natural_key(e.name)))
    written_last = max(
        read, key=lambda e: (e.mtime, e.meta.step if e.meta.step is not None else -1, natural_key(e.name))
    )
    truths = [(newest.name, newest.meta.callbacks)]
    if written_last.meta.callbacks != newest.meta.callbacks:
        truths.append((written_last.name, written_last.meta.callbacks))
    return truths


def _listing(
    fs: FileSystem,
    root: str,
    listed: Tuple[CheckpointEntry, ...],
    other: int,
    now: float,
    started: float,
    warnings: Optional[Tuple[str, ...]] = None,
) -> DirListing:
    """The DirListing of `listed`; `warnings` as a remembered listing kept them (else worked out here)."""
    try:
        free, fs_total = fs.statvfs(root)
    except OSError:
        free, fs_total = None, None
    total = sum(e.size_bytes for e in listed if not e.is_link)
    return DirListing(
        root=root,
        node=fs.node,
        entries=listed,
        total_bytes=total,
        free_bytes=free,
        fs_bytes=fs_total,
        scanned_at=now,
        scan_seconds=time.perf_counter() - started,
        other_files=other,
        warnings=hf_runs.resume_warnings(listed) if warnings is None else warnings,
    )


def _exists(fs: FileSystem, path: str) -> bool:
    try:
        fs.stat(path)
        return True
    except OSError:
        return False


@functools.lru_cache(maxsize=8192)  # the same names sort again at every rescan
def natural_key(name: str) -> Tuple:
    """checkpoint_epoch_9 before checkpoint_epoch_10 (the seed's sorted(glob) gets this wrong)."""
    import re

    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part)
