"""What a path names when it is not a regular file: said in the one-line refusals of configs and recordings.

A FIFO or a device named as a config or recording would block a read or never end it; they are
refused after a stat, before anything opens them.
"""

from __future__ import annotations

import stat


def file_kind(mode: int) -> str:
    """'a directory', 'a FIFO', 'a device', 'a socket', or 'not a regular file', for an st_mode."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


__all__ = ["file_kind"]
