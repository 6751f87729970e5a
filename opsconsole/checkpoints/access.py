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
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from opsconsole.checkpoints.zipmeta import Reader


# Immutable tuples rather than frozen dataclasses: a listing makes one of each per file, and a
# frozen dataclass costs ~4x a tuple to build (benchmarks/checkpoint_hf_units.py).
class FileStat(NamedTuple):
    """lstat-like facts about one path."""

    size: int
    mtime: float
    is_dir: bool
    is_link: bool
    is_file: bool
    # The whole lstat where the file system gives one (local): its device, inode, size, mtime
    # and ctime are the file's identity, what a kept proof of it is keyed by (proofs.py).
    raw: Optional[os.stat_result] = None

    @property
    def identity(self) -> Optional[Tuple[int, int, int, int, int]]:
        raw = self.raw
        return None if raw is None else (raw.st_dev, raw.st_ino, raw.st_size, raw.st_mtime_ns, raw.st_ctime_ns)


class DirItem(NamedTuple):
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

    def listdir_known(self, path: str, names: Sequence[str]) -> Optional[List[DirItem]]:
        """What listdir(path) gives when the directory holds exactly `names` (the caller knows it has
        not changed since they were listed): each name's lstat, or None when one is gone or this file
        system cannot tell (then listdir)."""
        return None

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

    def run_reader_identified(self, path: str, make_reader) -> Tuple[object, Optional[Tuple[int, int, int, int, int]]]:
        """run_reader's result and the identity of the file it read (None where there is none)."""
        return self.run_reader(path, make_reader), None

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
    what = (
        "a FIFO"
        if stat_module.S_ISFIFO(mode)
        else "a socket"
        if stat_module.S_ISSOCK(mode)
        else (
            "a device"
            if stat_module.S_ISCHR(mode) or stat_module.S_ISBLK(mode)
            else "a directory"
            if stat_module.S_ISDIR(mode)
            else "a symlink"
            if stat_module.S_ISLNK(mode)
            else "special"
        )
    )
    return OSError(errno.EINVAL, "%s, not a regular file: never opened" % what, path)


def open_regular(path: str) -> int:
    """A read descriptor of a regular file; OSError for anything else, without blocking or following a link."""
    return open_regular_sized(path)[0]


# O_DIRECTORY refuses anything else before opening it; O_NONBLOCK as well, so that no file system
# where that check comes late could leave a listing waiting on a FIFO put in a directory's place.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


def open_regular_sized(path: str) -> Tuple[int, int]:
    """(descriptor, size) of a regular file, as open_regular opens it."""
    fd, st = open_regular_stat(path)
    return fd, st.st_size


def open_regular_stat(path: str) -> Tuple[int, os.stat_result]:
    """(descriptor, fstat) of a regular file, as open_regular opens it."""
    mode = os.lstat(path).st_mode
    if not stat_module.S_ISREG(mode):
        raise not_regular(path, mode)
    # Swapped for a FIFO after the lstat: O_NONBLOCK opens it without waiting, the fstat refuses it.
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat_module.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode)
        os.set_blocking(fd, True)  # a FUSE or network file system may honour O_NONBLOCK on a regular file
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _file_stat(st: os.stat_result) -> FileStat:
    mode = st.st_mode
    return FileStat(
        size=st.st_size,
        mtime=st.st_mtime,
        is_dir=stat_module.S_ISDIR(mode),
        is_link=stat_module.S_ISLNK(mode),
        is_file=stat_module.S_ISREG(mode),
        raw=st,
    )


def _dir_item(name: str, st: os.stat_result, _new: Any = tuple.__new__) -> DirItem:
    """A listed name and its lstat. The named tuples are built without their Python-level __new__, the
    file type from the mode's top bits: a listing makes one per file, and building them was most of a
    rescan's time."""
    kind = st.st_mode >> 12  # S_IFMT: 0o04 directory, 0o10 regular file, 0o12 symlink
    return _new(DirItem, (name, _new(FileStat, (st.st_size, st.st_mtime, kind == 4, kind == 10, kind == 8, st))))


class LocalFileSystem(FileSystem):
    """The console's own machine."""

    def listdir(self, path: str) -> List[DirItem]:
        items: List[DirItem] = []
        append = items.append
        # Names from listdir and an lstat relative to the directory's descriptor: no DirEntry objects.
        lstat = os.lstat
        fd = os.open(path, _DIR_FLAGS)
        try:
            for name in os.listdir(fd):
                try:
                    st = lstat(name, dir_fd=fd)
                except FileNotFoundError:
                    continue  # deleted between readdir and stat
                append(_dir_item(name, st))
        finally:
            os.close(fd)
        return items

    def listdir_known(self, path: str, names: Sequence[str]) -> Optional[List[DirItem]]:
        # No directory descriptor and no readdir: a path lstat of each name costs less than both.
        items: List[DirItem] = []
        append = items.append
        lstat = os.lstat
        prefix = path if path.endswith("/") else path + "/"
        try:
            for name in names:
                append(_dir_item(name, lstat(prefix + name)))
        except OSError:
            return None  # gone (or the directory is): listed again
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

        fd, size = open_regular_sized(path)
        try:
            return drive_local(make_reader(size), fd)
        finally:
            os.close(fd)

    def run_reader_identified(self, path: str, make_reader) -> Tuple[object, Optional[Tuple[int, int, int, int, int]]]:
        from opsconsole.checkpoints.zipmeta import drive_local

        fd, st = open_regular_stat(path)
        try:
            result = drive_local(make_reader(st.st_size), fd)
        finally:
            os.close(fd)
        return result, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def read_file(self, path: str, limit: int) -> bytes:
        fd = open_regular(path)
        try:
            # os.read on the descriptor: a buffered file object costs more than a small JSON file's read.
            chunks = []
            left = limit
            while left > 0:
                chunk = os.read(fd, min(left, (1 << 20) if chunks else (1 << 16)))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        finally:
            os.close(fd)

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
