"""The file operations scanning and cleanup need, local (os) or remote (SFTP and a helper, in remote.py).

One blocking interface for both: the scanner, the planner's inputs and the deleter are
written once. The SFTP version answers from a worker thread by handing each call to the
event loop that owns the SSH connection, so the UI loop never waits on a disk or a network.

Reading opens regular files only: a FIFO, socket or device named like a checkpoint is
lstat'ed and refused, never opened (opening a FIFO for reading blocks until a writer comes).
Deleting is never by path: `pin_units` records the root's and each unit's identity when the
plan is made, and `open_pinned` hands back probe/delete_units.py's PinnedRoot (here, in this
process; over SSH, the same code on the node), which deletes relative to the root's descriptor.
"""

from __future__ import annotations

import errno
import os
import stat as stat_module
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from opsconsole.checkpoints.zipmeta import Reader


@dataclass(frozen=True)
class FileStat:
    """lstat-like facts about one path."""

    size: int
    mtime: float
    is_dir: bool
    is_link: bool
    is_file: bool


@dataclass(frozen=True)
class DirItem:
    """One name in a directory with its lstat."""

    name: str
    stat: FileStat


class FileSystem:
    """What the checkpoint code asks of a file system; OSError for every failure."""

    node = "local"
    remote = False
    read_window = 64 * 1024  # first reads of a file (see formats.file_reader)

    def listdir(self, path: str) -> List[DirItem]:
        raise NotImplementedError

    def stat(self, path: str) -> FileStat:
        """Following symlinks."""
        raise NotImplementedError

    def lstat(self, path: str) -> FileStat:
        raise NotImplementedError

    def readlink(self, path: str) -> str:
        raise NotImplementedError

    def realpath(self, path: str) -> str:
        raise NotImplementedError

    def run_reader(self, path: str, make_reader) -> object:
        """Open `path` and answer `make_reader(size)`'s read requests; its result."""
        raise NotImplementedError

    def read_file(self, path: str, limit: int) -> bytes:
        """The first `limit` bytes of a file."""
        raise NotImplementedError

    def statvfs(self, path: str) -> Tuple[Optional[int], Optional[int]]:
        """(free bytes for an unprivileged user, file system size)."""
        raise NotImplementedError

    def pin_units(self, root: str, units: List[List[str]]) -> Dict[str, Any]:
        """delete_units.pin_units on the machine that holds `root`: its identity and each unit's records."""
        raise NotImplementedError

    def files_in_use(self, root: str) -> Dict[str, Any]:
        """delete_units.in_use_under there: files under `root` open or mapped by a process."""
        raise NotImplementedError

    def open_pinned(self, root: str, root_id: List[int], units: List[Dict[str, Any]]) -> Any:
        """A PinnedRoot there (`refused`, `check(i)`, `delete(i)`, `close()`); OSError when it cannot be reached."""
        raise NotImplementedError


def not_regular(path: str, mode: int) -> OSError:
    what = "a FIFO" if stat_module.S_ISFIFO(mode) else "a socket" if stat_module.S_ISSOCK(mode) else (
        "a device" if stat_module.S_ISCHR(mode) or stat_module.S_ISBLK(mode) else
        "a directory" if stat_module.S_ISDIR(mode) else "a symlink" if stat_module.S_ISLNK(mode) else "special")
    return OSError(errno.EINVAL, "%s, not a regular file: never opened" % what, path)


def open_regular(path: str) -> int:
    """A read descriptor of a regular file; OSError for anything else, without blocking or following a link."""
    mode = os.lstat(path).st_mode
    if not stat_module.S_ISREG(mode):
        raise not_regular(path, mode)
    # Swapped for a FIFO after the lstat: O_NONBLOCK opens it without waiting, the fstat refuses it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat_module.S_ISREG(mode):
            raise not_regular(path, mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _file_stat(st: os.stat_result) -> FileStat:
    mode = st.st_mode
    return FileStat(
        size=st.st_size,
        mtime=st.st_mtime,
        is_dir=stat_module.S_ISDIR(mode),
        is_link=stat_module.S_ISLNK(mode),
        is_file=stat_module.S_ISREG(mode),
    )


class LocalFileSystem(FileSystem):
    """The console's own machine."""

    def listdir(self, path: str) -> List[DirItem]:
        items = []
        with os.scandir(path) as it:
            for entry in it:
                try:
                    items.append(DirItem(entry.name, _file_stat(entry.stat(follow_symlinks=False))))
                except FileNotFoundError:
                    continue  # deleted between readdir and stat
        return items

    def stat(self, path: str) -> FileStat:
        return _file_stat(os.stat(path))

    def lstat(self, path: str) -> FileStat:
        return _file_stat(os.lstat(path))

    def readlink(self, path: str) -> str:
        return os.readlink(path)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def run_reader(self, path: str, make_reader) -> object:
        from opsconsole.checkpoints.zipmeta import drive_local

        fd = open_regular(path)
        try:
            return drive_local(make_reader(os.fstat(fd).st_size), fd)
        finally:
            os.close(fd)

    def read_file(self, path: str, limit: int) -> bytes:
        with os.fdopen(open_regular(path), "rb") as f:
            return f.read(limit)

    def statvfs(self, path: str) -> Tuple[Optional[int], Optional[int]]:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize

    def pin_units(self, root: str, units: List[List[str]]) -> Dict[str, Any]:
        from opsconsole.probe import delete_units

        return delete_units.pin_units(root, units)

    def files_in_use(self, root: str) -> Dict[str, Any]:
        from opsconsole.probe import delete_units

        return delete_units.in_use_under(root)

    def open_pinned(self, root: str, root_id: List[int], units: List[Dict[str, Any]]) -> Any:
        from opsconsole.probe import delete_units

        return delete_units.PinnedRoot(root, root_id, units)


LOCAL = LocalFileSystem()

__all__ = ["DirItem", "FileStat", "FileSystem", "LocalFileSystem", "LOCAL", "Reader"]
