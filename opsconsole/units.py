"""One spelling for sizes, rates and durations, used by every pane and command.

Sizes are IEC binary units with a space: `512 B`, `537 KiB`, `97 MiB`, `1.5 GiB`, `21 GiB`
(one decimal below ten of a unit, whole numbers from ten up, as htop and `ls -h` do); rates
are sizes per second, `12 MiB/s`; durations are at most two units run together, `45s`,
`12m05s`, `2h12m`, `3d04h`; ages (how long ago, glanced at) one unit, `3s`, `2m`, `5h`.

Stdlib only and Python 3.6 syntax, so anything (the probe included) may import it; a
missing value reads `N/A` unless the caller names another placeholder.
"""

import math
from typing import Optional

NA = "N/A"
KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB
PIB = 1024 * TIB
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def _number(value: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def format_bytes(value: Optional[float], missing: str = NA) -> str:
    """`512 B`, `537 KiB`, `97 MiB`, `1.5 GiB`, `21 GiB`, `1.2 TiB`; `missing` for None or NaN."""
    if value is None or not _number(value):
        return missing
    sign = "-" if value < 0 else ""
    value = abs(float(value))
    if value < KIB:
        return "%s%d B" % (sign, round(value))
    for unit in _UNITS[1:]:
        value /= KIB
        if unit != "PiB" and round(value) >= KIB:
            continue  # 1023.7 KiB reads 1.0 MiB, not 1024 KiB
        if round(value, 1) < 10:
            return "%s%.1f %s" % (sign, value, unit)
        return "%s%d %s" % (sign, round(value), unit)
    return missing  # not reached: PiB takes every larger value


def format_rate(bytes_per_s: Optional[float], missing: str = NA) -> str:
    """`12 MiB/s`, `0 B/s`: a size per second."""
    text = format_bytes(bytes_per_s, missing=missing)
    return text if text == missing else text + "/s"


def format_gib(value: Optional[float], missing: str = NA) -> str:
    """`21.0`: bytes as GiB with one decimal, for a column or bar whose label names the unit."""
    if value is None or not _number(value):
        return missing
    return "%.1f" % (value / GIB)


def format_mib(value: Optional[float], missing: str = NA) -> str:
    """`21491`: whole MiB, as nvidia-smi and gpustat count GPU memory (the caller prints ` MiB`)."""
    if value is None or not _number(value):
        return missing
    return "%d" % (value // MIB)


def format_memory_pair(used: Optional[float], total: Optional[float], missing: str = NA) -> str:
    """`21.0/140.4 GiB`, `512/800 MiB`: used over total, both in the unit of the total."""
    used_ok = used is not None and _number(used)
    total_ok = total is not None and _number(total)
    if not used_ok and not total_ok:
        return missing
    if not total_ok:
        return format_bytes(used) + "/" + missing
    if not used_ok:
        return missing + "/" + format_bytes(total)
    unit, scale, pattern = ("GiB", GIB, "%.1f") if total >= GIB else ("MiB", MIB, "%d")
    return "%s/%s %s" % (pattern % (used / scale), pattern % (total / scale), unit)


def format_duration(seconds: Optional[float], missing: str = NA) -> str:
    """`45s`, `12m05s`, `2h12m`, `3d04h`: two units, for run times, idle times and ages in detail."""
    if seconds is None or not _number(seconds):
        return missing
    total = int(max(0.0, seconds))
    if total < 60:
        return "%ds" % total
    if total < 3600:
        return "%dm%02ds" % (total // 60, total % 60)
    if total < 86400:
        return "%dh%02dm" % (total // 3600, (total % 3600) // 60)
    return "%dd%02dh" % (total // 86400, (total % 86400) // 3600)


def format_age(seconds: Optional[float], missing: str = NA) -> str:
    """`3s`, `2m`, `5h`, `3d`: the largest whole unit, for a column of ages glanced at."""
    if seconds is None or not _number(seconds):
        return missing
    seconds = max(0.0, seconds)
    if seconds < 60:
        return "%ds" % int(seconds)
    if seconds < 3600:
        return "%dm" % int(seconds // 60)
    if seconds < 86400:
        return "%dh" % int(seconds // 3600)
    return "%dd" % int(seconds // 86400)


def format_frame_age(seconds: Optional[float]) -> str:
    """`0.4s`, `12s`, `5m03s`: how old a frame is, in tenths while it is fresh; `never` without one."""
    if seconds is None or not _number(seconds):
        return "never"
    if seconds < 10:
        return "%.1fs" % max(0.0, seconds)
    return format_duration(seconds)
