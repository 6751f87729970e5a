"""Listing one checkpoint directory: every format, the latest and best markers, totals and free space.

Works over any FileSystem (local os calls, or SFTP through remote.py). Each checkpoint's
read result is cached by path, size and mtime, so a rescan of an unchanged directory costs
one listdir and a stat per name. Names that are not checkpoints are counted, never read.
"""

from __future__ import annotations

import os
import posixpath
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Dict, List, Optional, Set, Tuple

from opsconsole.checkpoints import formats
from opsconsole.checkpoints.access import LOCAL, DirItem, FileSystem
from opsconsole.checkpoints.cache import CRC_CACHE, METADATA_CACHE, ResultCache
from opsconsole.checkpoints.worker import read_checkpoint_file
from opsconsole.checkpoints.records import (
    BROKEN,
    FORMAT_HF,
    FORMAT_LINK,
    INTEGRITY_TRUNCATED,
    INTEGRITY_UNCHECKED,
    CheckpointEntry,
    CheckpointMeta,
    DirListing,
)

GROWING_S = 600.0  # a truncated file modified this recently is probably still being written
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


def read_file_entry(fs: FileSystem, path: str, item: DirItem, cache: ResultCache) -> formats.ReadResult:
    """The read result of one checkpoint file, from the cache when its size and mtime are unchanged."""
    signature = (item.stat.size, item.stat.mtime)
    cached = cache.get(fs.node, path, signature)
    if cached is not None:
        return cached
    try:
        # Parsed in the limited, reused metadata worker process (worker.py), never in this one:
        # a crafted file that crashes, hangs or bloats the parse becomes this entry's
        # "unreadable: <reason>" and the scan goes on. Was: fs.run_reader(path, formats.file_reader ...).
        result = read_checkpoint_file(fs, path, item.name, fs.read_window)
    except OSError as exc:
        return formats.ReadResult(formats._named_format(item.name), formats.meta_from_name(item.name),
                                  INTEGRITY_UNCHECKED, "cannot read: %s" % (exc.strerror or exc))
    cache.put(fs.node, path, signature, result)
    return result


def read_dir_entry(fs: FileSystem, path: str, name: str, cache: ResultCache) -> Optional[Tuple[formats.ReadResult, int, float]]:
    """(result, total bytes, newest mtime) of a HF or DCP checkpoint directory; None when it is neither."""
    try:
        children = fs.listdir(path)
    except OSError:
        return None
    files = {c.name: c.stat.size for c in children if c.stat.is_file}
    fmt = formats.dir_format(c.name for c in children)
    if fmt is None:
        return None
    size = sum(c.stat.size for c in children if not c.stat.is_link)
    mtime = max([c.stat.mtime for c in children] or [0.0])
    for child in children:
        if child.stat.is_dir and not child.stat.is_link:
            try:
                size += sum(g.stat.size for g in fs.listdir(join(fs, path, child.name)) if not g.stat.is_link)
            except OSError:
                pass
    signature = tuple(sorted((c.name, c.stat.size, c.stat.mtime) for c in children))
    cached = cache.get(fs.node, path, signature)
    if cached is not None:
        return cached, size, mtime
    meta = formats.dir_meta(fmt, name, files)
    problems: List[str] = []
    integrities: List[str] = []
    if fmt == FORMAT_HF:
        try:
            text = fs.read_file(join(fs, path, "trainer_state.json"), formats.MAX_JSON_BYTES)
            state_meta, problem = formats.trainer_state_meta(text)
        except OSError as exc:
            state_meta, problem = CheckpointMeta(), "trainer_state.json: %s" % (exc.strerror or exc)
        if problem:
            problems.append(problem)
        meta = replace(
            state_meta,
            step=state_meta.step if state_meta.step is not None else meta.step,
            details=state_meta.details + meta.details,
            has_optimizer=meta.has_optimizer,
            has_scheduler=meta.has_scheduler,
        )
        weight_results = []
        for file_name in formats.model_files(files):
            file_path = join(fs, path, file_name)
            make = (lambda s: formats.safetensors_reader(s)) if file_name.lower().endswith(".safetensors") else formats.zip_check_reader
            try:
                result = fs.run_reader(file_path, make)
            except OSError as exc:
                problems.append("%s: %s" % (file_name, exc.strerror or exc))
                continue
            integrities.append(result.integrity)
            if result.problem:
                problems.append("%s: %s" % (file_name, result.problem))
            if file_name.lower().endswith(".safetensors"):
                weight_results.append(result)
        summary = formats.safetensors_state(weight_results)
        if summary is not None:
            meta = replace(meta, state_dict=summary, tensor_count=summary.keys, tensor_bytes=summary.bytes)
    integrity = formats.combine_integrity(integrities)
    result = formats.ReadResult(fmt, meta, integrity, "; ".join(problems) or None)
    cache.put(fs.node, path, signature, result)
    return result, size, mtime


def _entry(path: str, name: str, result: formats.ReadResult, size: int, mtime: float, is_dir: bool) -> CheckpointEntry:
    return CheckpointEntry(
        path=path, name=name, format=result.format, size_bytes=size, mtime=mtime, is_dir=is_dir,
        meta=result.meta, integrity=result.integrity, problem=result.problem,
    )


def _apply_crc_cache(fs: FileSystem, entry: CheckpointEntry, crc_cache: ResultCache) -> CheckpointEntry:
    found = crc_cache.get(fs.node, entry.path, (entry.size_bytes, entry.mtime))
    if found is None:
        return entry
    return replace(entry, integrity=found.integrity, problem=found.problem or entry.problem, crc_checked=True)


def scan_directory(
    root: str,
    fs: FileSystem = LOCAL,
    *,
    cache: ResultCache = METADATA_CACHE,
    crc_cache: ResultCache = CRC_CACHE,
    now: Optional[float] = None,
) -> DirListing:
    """List the checkpoints of `root` with their metadata, markers, totals and free space."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    try:
        items = fs.listdir(root)
    except OSError as exc:
        return DirListing(root=root, node=fs.node, problem="cannot list %s: %s" % (root, exc.strerror or exc), scanned_at=now)
    try:
        root_real = fs.realpath(root)
    except OSError:
        root_real = root
    names = {item.name for item in items}
    entries: Dict[str, CheckpointEntry] = {}
    latest: Set[str] = set()
    best: Set[str] = set()
    other = 0
    link_items: List[DirItem] = []
    work: List[DirItem] = []
    for item in items:
        if item.stat.is_link:
            link_items.append(item)
        elif item.stat.is_file and formats.is_checkpoint_file_name(item.name):
            work.append(item)
        elif item.stat.is_dir:
            work.append(item)
        elif item.name == "latest" and item.stat.is_file and item.stat.size < 1024:
            # DeepSpeed's `latest` file holds the tag (a directory name) of the newest checkpoint.
            try:
                tag = fs.read_file(join(fs, root, item.name), 1024).decode("utf-8", "replace").strip()
            except OSError:
                tag = ""
            if tag in names:
                latest.add(tag)
            other += 1
        else:
            other += 1

    def read(item: DirItem) -> Optional[CheckpointEntry]:
        path = join(fs, root, item.name)
        if item.stat.is_dir:
            found = read_dir_entry(fs, path, item.name, cache)
            if found is None:
                return None
            result, size, mtime = found
            return _entry(path, item.name, result, size, max(mtime, item.stat.mtime), True)
        result = _with_growth_note(read_file_entry(fs, path, item, cache), item.stat.mtime, now)
        return _entry(path, item.name, result, item.stat.size, item.stat.mtime, False)

    if fs.remote and len(work) > 1:
        with ThreadPoolExecutor(max_workers=REMOTE_WORKERS) as pool:
            results = list(pool.map(read, work))
    else:
        results = [read(item) for item in work]
    for item, entry in zip(work, results):
        if entry is None:
            other += 1
        else:
            entries[item.name] = _apply_crc_cache(fs, entry, crc_cache)

    for item in link_items:
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
            else:
                latest.add(base)  # checkpoint_latest.pt, last.ckpt, latest: any alias in the dir
            continue
        if not formats.is_checkpoint_file_name(item.name) and not _is_latest_name(item.name):
            other += 1
            continue
        inside = resolved.startswith(root_real.rstrip("/") + "/")
        reason = "symlink into a subdirectory" if inside else "symlink to %s, outside the directory" % target
        if not resolved or not _exists(fs, path):
            reason = "dangling symlink to %s" % target
        entries[item.name] = CheckpointEntry(
            path=path, name=item.name, format=FORMAT_LINK, size_bytes=0, mtime=item.stat.mtime,
            is_link=True, link_target=target, problem=reason,
        )

    for name, entry in entries.items():
        if entry.format != FORMAT_LINK and _is_best_name(name):
            best.add(name)
    hf_best = _newest_hf_best(entries.values())
    if hf_best is not None and hf_best in entries:
        best.add(hf_best)
    losses = [e.meta.loss for e in entries.values() if e.meta.loss is not None and e.meta.loss == e.meta.loss]
    lowest = {e.name for e in entries.values() if losses and e.meta.loss == min(losses)}
    if all(entries[name].integrity in BROKEN for name in best if name in entries):
        # No best file (or only a broken one) and no HF best_model_checkpoint: the lowest loss is the best.
        best.update(name for name in lowest if entries[name].integrity not in BROKEN)
    listed = []
    for name in sorted(entries, key=natural_key):
        entry = entries[name]
        listed.append(replace(entry, latest=name in latest, best=name in best, lowest_loss=name in lowest))
    try:
        free, fs_total = fs.statvfs(root)
    except OSError:
        free, fs_total = None, None
    total = sum(e.size_bytes for e in listed if not e.is_link)
    return DirListing(
        root=root, node=fs.node, entries=tuple(listed), total_bytes=total, free_bytes=free, fs_bytes=fs_total,
        scanned_at=now, scan_seconds=time.perf_counter() - started, other_files=other,
    )


def _exists(fs: FileSystem, path: str) -> bool:
    try:
        fs.stat(path)
        return True
    except OSError:
        return False


def _newest_hf_best(entries) -> Optional[str]:
    """The basename of best_model_checkpoint in the newest HF trainer_state.json."""
    hf = [e for e in entries if e.format == FORMAT_HF and e.meta.best_checkpoint]
    if not hf:
        return None
    newest = max(hf, key=lambda e: (e.meta.step or 0, e.mtime))
    return posixpath.basename(newest.meta.best_checkpoint.rstrip("/"))


def natural_key(name: str) -> Tuple:
    """checkpoint_epoch_9 before checkpoint_epoch_10 (the seed's sorted(glob) gets this wrong)."""
    import re

    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part)
