"""Which files under a directory some process holds open: psutil locally, `/proc/*/fd` over SSH.

A checkpoint a training job is writing or reading must not be deleted. Without root only
one's own processes can be seen: the result says so, and the plan shows it as a warning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Tuple

# One command, no loop per fd: `ls -l` prints "... fd -> /target" for every open descriptor.
REMOTE_FD_SCRIPT = 'id -u; ls -l /proc/[0-9]*/fd/ 2>/dev/null; exit 0'


@dataclass(frozen=True)
class OpenFiles:
    """Open paths under the directory, and a note when some processes could not be looked at."""

    paths: FrozenSet[str]
    note: Optional[str] = None


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/")


def open_files_local(root: str) -> OpenFiles:
    """Open regular files below `root` (by realpath) of every process psutil may look at."""
    import psutil

    real_root = os.path.realpath(root)
    found = set()
    denied = 0
    for proc in psutil.process_iter(["pid"]):
        try:
            for item in proc.open_files():
                if _under(item.path, real_root) or _under(item.path, root):
                    found.add(item.path)
        except psutil.AccessDenied:
            denied += 1
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    # Paths come back under the real root; the plan compares against the listed (root-joined) paths.
    mapped = set(found)
    if real_root != root.rstrip("/"):
        mapped |= {root.rstrip("/") + p[len(real_root):] for p in found if _under(p, real_root)}
    note = None
    if denied:
        note = "open-file check could not look at %d processes" % denied
        if os.geteuid() != 0:
            note += " of other users (run as root to see them)"
    return OpenFiles(frozenset(mapped), note)


def parse_fd_listing(text: str, root: str) -> Tuple[FrozenSet[str], Optional[int]]:
    """(open paths under `root`, uid) from REMOTE_FD_SCRIPT's output."""
    lines = text.splitlines()
    uid = None
    if lines and lines[0].strip().isdigit():
        uid = int(lines[0].strip())
        lines = lines[1:]
    found = set()
    for line in lines:
        if " -> " not in line:
            continue
        target = line.split(" -> ", 1)[1]
        if target.endswith(" (deleted)"):
            continue
        if _under(target, root):
            found.add(target)
    return frozenset(found), uid


def remote_note(uid: Optional[int]) -> Optional[str]:
    if uid is None:
        return "open-file check gave no output: it may be incomplete"
    if uid != 0:
        return "open-file check saw only the processes of uid %d (not root on the node)" % uid
    return None


def merged_note(notes: List[Optional[str]]) -> Optional[str]:
    shown = [n for n in notes if n]
    return "; ".join(shown) if shown else None
