"""Bounded reads of /proc files: what every node-side reader shares.

A /proc file may be huge (a process's environment, its maps) or, on a broken or hostile node,
endless: none is read whole. Reads go through a raw descriptor: no buffered file object per
process, which shows when a thousand processes are read a tick.

Stdlib only, Python 3.6 syntax: shipped to nodes with the probe and with the helpers.
"""

import os
import time
from typing import List, Tuple

READ_CHUNK = 65536
STAT_LIMIT = 4096  # /proc/PID/stat: 52 numbers and a command name of at most 64 bytes
# How far two reckonings of one process's start time (epoch seconds) may differ and still name
# the same process: the probe reckons the boot time once, as `time.time() - uptime` or as
# psutil's whole-second btime, which differ by up to a second.
START_SLACK_S = 1.5

try:
    CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):
    CLOCK_TICKS = 100


def read_prefix(path: str, limit: int) -> bytes:
    """At most `limit` bytes from the start of the file at `path`; OSError as os.open raises it."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        chunks = []
        size = 0
        while size < limit:
            chunk = os.read(fd, min(READ_CHUNK, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def split_stat(data: bytes) -> Tuple[str, List[bytes]]:
    """(command name, the fields after it) of a /proc/PID/stat image; ValueError when it is not one.

    The name is between the first "(" and the last ")" (it may hold either); proc(5)'s field N
    (1-based, the pid being 1 and the name 2) is the returned list's item N - 3: the state is [0],
    the start time (field 22) [19].
    """
    start = data.index(b"(")
    end = data.rindex(b")")
    if end < start:
        raise ValueError("not a /proc/PID/stat line")
    return data[start + 1 : end].decode("utf-8", "replace"), data[end + 2 :].split()


def boot_time(proc_root: str = "/proc") -> float:
    """Epoch seconds of the boot, as the probe reckons it: now less /proc/uptime."""
    uptime = float(read_prefix(proc_root.rstrip("/") + "/uptime", 200).split()[0])
    return time.time() - uptime


def start_time_of(start_ticks: int, booted: float) -> float:
    """Epoch seconds at which a process started, from stat's field 22 (clock ticks after boot)."""
    return round(booted + start_ticks / float(CLOCK_TICKS), 2)
