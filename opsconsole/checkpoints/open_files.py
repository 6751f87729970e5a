"""Which files under a directory some process holds open or has mapped, on the machine that holds them.

A checkpoint a training job is writing or reading must not be deleted, and reading includes
`torch.load(mmap=True)`, which maps the file and may close its descriptor: both /proc/PID/fd
and /proc/PID/maps of every process count. The reading is probe/delete_units.py's, in this
process for a local directory and on the node (shipped over its SSH connection) for a remote
one; the deleter checks the same again, by device and inode, just before each unit goes.
Without root only one's own processes can be seen: the result says so, and the plan shows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, FrozenSet, Mapping, Optional


@dataclass(frozen=True)
class OpenFiles:
    """Open or mapped paths under the directory (as the directory is named), and a note when incomplete."""

    paths: FrozenSet[str]
    note: Optional[str] = None


def open_files_from(answer: Mapping[str, Any]) -> OpenFiles:
    """OpenFiles from delete_units.in_use_under's answer (validated: it may come from a node)."""
    paths = answer.get("paths") if isinstance(answer, Mapping) else None
    if not isinstance(paths, list):
        return OpenFiles(frozenset(), "open-file check gave no usable answer: it may be incomplete")
    note = answer.get("note")
    return OpenFiles(
        frozenset(p for p in paths if isinstance(p, str)), note if isinstance(note, str) and note else None
    )


def open_files_local(root: str) -> OpenFiles:
    """Files below `root` open or mapped by any process of this machine we may look at."""
    from opsconsole.probe.delete_units import in_use_under

    return open_files_from(in_use_under(root))
