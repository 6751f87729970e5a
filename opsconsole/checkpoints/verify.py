"""The full CRC check of one checkpoint, on demand, with progress; results cached by size and mtime."""

from __future__ import annotations

from typing import Callable, Optional

from opsconsole.checkpoints import zipmeta
from opsconsole.checkpoints.access import LOCAL, FileSystem
from opsconsole.checkpoints.cache import CRC_CACHE, ResultCache
from opsconsole.checkpoints.records import (
    FORMAT_LIGHTNING,
    FORMAT_TORCH,
    INTEGRITY_UNCHECKED,
    CheckpointEntry,
)
from opsconsole.checkpoints.zipmeta import CrcResult, Progress


def can_verify(entry: CheckpointEntry) -> Optional[str]:
    """None when a CRC check applies to this entry, else why not (one line)."""
    if entry.is_link or entry.is_dir:
        return "%s is a %s: a CRC check reads one zip file" % (entry.name, "symlink" if entry.is_link else "directory")
    if entry.format not in (FORMAT_TORCH, FORMAT_LIGHTNING):
        return "%s is %s: only torch zip files record CRCs" % (entry.name, entry.format)
    return None


def verify_checkpoint(
    entry: CheckpointEntry,
    fs: FileSystem = LOCAL,
    progress: Optional[Progress] = None,
    cancelled: Callable[[], bool] = lambda: False,
    cache: ResultCache = CRC_CACHE,
) -> CrcResult:
    """Read the whole file and check every member's CRC-32; the result is cached for this size and mtime."""
    why_not = can_verify(entry)
    if why_not:
        return CrcResult(INTEGRITY_UNCHECKED, why_not, 0, 0)
    try:
        st = fs.stat(entry.path)
        result = fs.run_reader(entry.path, lambda size: zipmeta.full_check_reader(size, progress, cancelled))
    except OSError as exc:
        return CrcResult(INTEGRITY_UNCHECKED, "cannot read: %s" % (exc.strerror or exc), 0, 0)
    if result.integrity != INTEGRITY_UNCHECKED:
        cache.put(fs.node, entry.path, (st.size, st.mtime), result)
    return result
