"""The file operations scanning and cleanup need, local (os) or remote (SFTP, in remote.py).

One blocking interface for both: the scanner, the planner's inputs and the deleter are
written once. The SFTP version answers from a worker thread by handing each call to the
event loop that owns the SSH connection, so the UI loop never waits on a disk or a network.
"""

from __future__ import annotations

import os
import shutil
import stat as stat_module
from dataclasses import dataclass
from typing import List, Optional, Tuple

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

    def remove(self, path: str) -> None:
        raise NotImplementedError

    def rmtree(self, path: str) -> None:
        raise NotImplementedError


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
        from opsconsole.checkpoints.zipmeta import read_local

        return read_local(path, make_reader)

    def read_file(self, path: str, limit: int) -> bytes:
        with open(path, "rb") as f:
            return f.read(limit)

    def statvfs(self, path: str) -> Tuple[Optional[int], Optional[int]]:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize

    def remove(self, path: str) -> None:
        os.unlink(path)

    def rmtree(self, path: str) -> None:
        # shutil.rmtree refuses a symlink at the top and unlinks (never follows) links inside.
        shutil.rmtree(path)


LOCAL = LocalFileSystem()

__all__ = ["DirItem", "FileStat", "FileSystem", "LocalFileSystem", "LOCAL", "Reader"]
