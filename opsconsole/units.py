"""One spelling for every quantity the console shows, used by every pane and command.

Sizes are IEC binary units with a space: `512 B`, `537 KiB`, `97 MiB`, `1.5 GiB`, `21 GiB`
(one decimal below ten of a unit, whole numbers from ten up, as htop and `ls -h` do); rates
are sizes per second, `12 MiB/s`; durations are at most two units run together, `45s`,
`12m05s`, `2h12m`, `3d04h`; ages (how long ago, glanced at) one unit, `3s`, `2m`, `5h`.
A reading and its ceiling share one unit after both: memory `21.0/140.4 GiB`, power
`633/700 W`, temperature `62/89°C`. Percentages are whole, `7%`,
`101%` (a tenth only below ten, `0.5%`); temperatures `62°C`; power `633 W`; clocks
`1980 MHz`; latencies `12 ms`; losses and metrics four significant digits, trailing zeros kept,
`0.009900` beside `0.01000`. Whole numbers are rounded, never truncated, so a pane that
shows a reading and one that shows it beside its limit say the same number.

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


def _whole(value: float) -> int:
    """`value` rounded half up: 581.5 W reads 582 W in every pane (round() would say 582, %d 581)."""
    return int(math.floor(value + 0.5))


def _apart(value: float, limit: Optional[float]) -> Optional[str]:
    """`value` with the decimals that tell it from `limit` when its whole number would read as the limit
    (9.96 against 10: `9.96`, not `10` and `10`); None when the whole number does."""
    if limit is None or not _number(limit) or value == limit or _whole(value) != _whole(limit):
        return None
    for digits in (1, 2, 3):
        text = "%.*f" % (digits, value)
        if float(text) != limit:
            return text
    return "%.3f" % value


def format_percent(value: Optional[float], missing: str = NA, limit: Optional[float] = None) -> str:
    """`100%`, `7%`, `101%` (a process on more than one core); a tenth below 10 only when not whole (`0.5%`),
    or the decimals that tell it from the `limit` it is compared with (`9.96% free (minimum 10%)`)."""
    if value is None or not _number(value):
        return missing
    near = _apart(value, limit)
    if near is not None:
        return near + "%"
    if abs(value) < 10 and value != int(value) and round(value, 1) != _whole(value):
        return "%.1f%%" % value
    return "%d%%" % _whole(value)


def format_temperature(celsius: Optional[float], missing: str = NA, limit: Optional[float] = None) -> str:
    """`62°C`; `85.4°C` when the whole degree would read as the `limit` it is compared with."""
    if celsius is None or not _number(celsius):
        return missing
    near = _apart(celsius, limit)
    return ("%s°C" % near) if near is not None else "%d°C" % _whole(celsius)


def format_power(watts: Optional[float], missing: str = NA, limit: Optional[float] = None) -> str:
    """`633 W`; `12.3 kW` from 10 kW (a node's or a cluster's sum); `700.4 W` beside a `limit` of 700."""
    if watts is None or not _number(watts):
        return missing
    near = _apart(watts, limit)
    if near is not None:
        return near + " W"
    if abs(watts) >= 10000:
        return "%.1f kW" % (watts / 1000.0)
    return "%d W" % _whole(watts)


def format_clock(mhz: Optional[float], missing: str = NA) -> str:
    """`1980 MHz`."""
    if mhz is None or not _number(mhz):
        return missing
    return "%d MHz" % _whole(mhz)


def _pair(value: Optional[float], ceiling: Optional[float], unit: str, missing: str, single) -> str:
    """`value/ceiling UNIT` (one unit after both); the value alone, spelled by `single`, without a ceiling."""
    if ceiling is None or not _number(ceiling):
        return single(value, missing=missing)
    shown = missing if value is None or not _number(value) else "%d" % _whole(value)
    return "%s/%d%s" % (shown, _whole(ceiling), unit)


def format_power_pair(watts: Optional[float], limit: Optional[float], missing: str = NA) -> str:
    """`633/700 W`: the draw over its limit; `633 W` without a limit."""
    return _pair(watts, limit, " W", missing, format_power)


def format_temperature_pair(celsius: Optional[float], slowdown: Optional[float], missing: str = NA) -> str:
    """`62/89°C`: the temperature over the one where the GPU slows down; `62°C` without it."""
    return _pair(celsius, slowdown, "°C", missing, format_temperature)


def format_pcie_link(generation: Optional[int], lanes: Optional[int], missing: str = NA) -> str:
    """`gen5 x16`: a PCIe link's generation and width, as `lspci` and nvidia-smi name them."""
    if generation is None or not _number(generation):
        return missing
    return "gen%d x%s" % (generation, missing if lanes is None or not _number(lanes) else "%d" % lanes)


def format_ms(milliseconds: Optional[float], missing: str = NA) -> str:
    """`12 ms`, `0.4 ms`, `1.3 s`: a latency (a round trip, a probe's cost)."""
    if milliseconds is None or not _number(milliseconds):
        return missing
    if milliseconds >= 1000:
        return "%.1f s" % (milliseconds / 1000.0)
    if milliseconds < 10:
        return "%.1f ms" % milliseconds
    return "%d ms" % _whole(milliseconds)


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


METRIC_DIGITS = 4  # significant digits of a loss or metric: enough to tell two checkpoints apart


def format_metric(value: Optional[float], missing: str = NA) -> str:
    """A loss or metric: `0.009900`, `0.01000`, `2.346`, `1234`, `1.235e+04`, `3.000e-05`; a whole-number
    metric as it is (`100`); `nan`, `inf`. Four significant digits and the zeros among them kept, so values
    side by side read alike (`%.4g` printed `0.0099` beside `0.01`, and the details `%.6g` another)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return missing
    if isinstance(value, int):
        return "%d" % value
    if not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    text = "%#.*g" % (METRIC_DIGITS, value)
    return text[:-1] if text.endswith(".") else text  # `1234.`: the point alone says nothing
