"""Marks along the console's launch, for benchmarks/vs_nvitop.py: with OPSCONSOLE_LAUNCH_TRACE=FILE
set, each mark appends "name seconds" to FILE, the seconds since the process started (the kernel's
start time, so the interpreter's own start and imports before the first mark are counted too)."""

import os
import time

_PATH = os.environ.get("OPSCONSOLE_LAUNCH_TRACE")


def _since_start() -> float:
    with open("/proc/self/stat", "rb") as stat:
        started_ticks = int(stat.read().rsplit(b")", 1)[1].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")


def mark(name: str) -> None:
    """Note that the launch reached `name` (nothing unless OPSCONSOLE_LAUNCH_TRACE is set)."""
    if not _PATH:
        return
    try:
        with open(_PATH, "a") as out:
            out.write("%s %.4f\n" % (name, _since_start()))
    except (OSError, ValueError, IndexError):
        pass  # a trace for a benchmark: never the console's failure
