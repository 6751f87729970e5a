"""Compact text for the console's cells: sizes, percentages, temperatures, ages, state colours.

Pure functions (no Textual): every pane formats the same way, and a missing reading
always reads "N/A".
"""

from __future__ import annotations

from typing import Optional

from rich.text import Text

from opsconsole.model import (
    STATE_AUTH,
    STATE_CONNECTING,
    STATE_DOWN,
    STATE_FALLBACK,
    STATE_HOSTKEY,
    STATE_STALE,
    STATE_UP,
)
from opsconsole.sanitize import printable

NA = "N/A"
KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB

# Rich styles for the connection states (up green, stale yellow, failures red ...).
STATE_STYLES = {
    STATE_UP: "green",
    STATE_STALE: "yellow",
    STATE_DOWN: "bold red",
    STATE_AUTH: "bold red",
    STATE_HOSTKEY: "bold red",
    STATE_FALLBACK: "cyan",
    STATE_CONNECTING: "dim",
}
# Rows of a node that is not delivering fresh frames: its last values, dimmed.
STALE_ROW_STYLE = "dim"
# Process states worth a look: D = uninterruptible sleep (hung IO), Z = zombie.
PROCESS_STATE_STYLES = {"D": "bold red", "Z": "bold magenta"}


def state_style(state: str) -> str:
    """The Rich style of a node connection state ("" for an unknown one)."""
    return STATE_STYLES.get(state, "")


def format_bytes(value: Optional[float]) -> str:
    """`512 KiB`, `300 MiB`, `21.0 GiB`, `1.2 TiB`: binary units, at most one decimal."""
    if value is None:
        return NA
    if value < MIB:
        return "%d KiB" % round(value / KIB)
    if value < GIB:
        return "%d MiB" % round(value / MIB)
    if value < TIB:
        return "%.1f GiB" % (value / GIB)
    return "%.1f TiB" % (value / TIB)


def format_gib(value: Optional[float]) -> str:
    """`21.0`: bytes as GiB with one decimal, for a column whose header names the unit."""
    return NA if value is None else "%.1f" % (value / GIB)


def format_bytes_short(value: Optional[float]) -> str:
    """`812M`, `1.5G`: a binary unit in one letter, for the dense Host summary and table."""
    if value is None:
        return NA
    for unit in ("B", "K", "M", "G", "T", "P"):
        if abs(value) < KIB or unit == "P":
            if unit == "B":
                return "%d%s" % (value, unit)
            return ("%.1f%s" if abs(value) < 10 else "%.0f%s") % (value, unit)
        value /= float(KIB)
    return NA  # not reached


def format_memory_pair(used: Optional[float], total: Optional[float]) -> str:
    """`21.0/140.4 GiB`: used over total in the unit of the total."""
    if used is None and total is None:
        return NA
    if total is None:
        return format_bytes(used) + "/" + NA
    if used is None:
        return NA + "/" + format_bytes(total)
    unit, scale, fmt = ("GiB", GIB, "%.1f") if total >= GIB else ("MiB", MIB, "%d")
    return "%s/%s %s" % (fmt % (used / scale), fmt % (total / scale), unit)


def format_percent(value: Optional[float]) -> str:
    """`100%`, `7%`; one decimal below 10 only when it is not whole (`0.5%`)."""
    if value is None:
        return NA
    if value < 10 and value != int(value):
        return "%.1f%%" % value
    return "%d%%" % round(value)


def format_temperature(value: Optional[float]) -> str:
    """`39°C`."""
    return NA if value is None else "%d°C" % round(value)


def format_watts(value: Optional[float]) -> str:
    """`109 W`, `5.6 kW` for node sums."""
    if value is None:
        return NA
    if value >= 10000:
        return "%.1f kW" % (value / 1000.0)
    return "%d W" % round(value)


def format_age(seconds: Optional[float]) -> str:
    """`3s`, `2m`, `5h`, `3d`: the largest whole unit, as ages are glanced at."""
    if seconds is None:
        return NA
    seconds = max(0.0, seconds)
    if seconds < 60:
        return "%ds" % int(seconds)
    if seconds < 3600:
        return "%dm" % int(seconds // 60)
    if seconds < 86400:
        return "%dh" % int(seconds // 3600)
    return "%dd" % int(seconds // 86400)


def format_duration(seconds: Optional[float]) -> str:
    """`45s`, `12m05s`, `3h07m`, `2d04h`: two units, for process run times."""
    if seconds is None:
        return NA
    total = int(max(0.0, seconds))
    if total < 60:
        return "%ds" % total
    if total < 3600:
        return "%dm%02ds" % (total // 60, total % 60)
    if total < 86400:
        return "%dh%02dm" % (total // 3600, (total % 3600) // 60)
    return "%dd%02dh" % (total // 86400, (total % 86400) // 3600)


def format_frame_age(seconds: Optional[float]) -> str:
    """`0.4s`, `12s`, `5m03s`: how old a frame is, tenths while it is fresh; `never` without one."""
    if seconds is None:
        return "never"
    if seconds < 10:
        return "%.1fs" % seconds
    return format_duration(seconds)


def format_ms(value: Optional[float]) -> str:
    """`12 ms`, `0.4 ms`, `1.3 s`."""
    if value is None:
        return NA
    if value >= 1000:
        return "%.1f s" % (value / 1000.0)
    if value < 10:
        return "%.1f ms" % value
    return "%d ms" % round(value)


def format_count(value: Optional[int]) -> str:
    """An integer, or N/A."""
    return NA if value is None else str(value)


def shorten(text: Optional[str], width: int) -> str:
    """`text` on one line, cut to `width` characters with an ellipsis."""
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


def printable_text(text: Text) -> Text:
    """A Rich Text whose control characters are made visible (see printable); the same one when it has none."""
    plain = text.plain
    clean = printable(plain)
    if clean == plain:
        return text
    text = text.copy()
    text.plain = clean  # same length: the spans keep their places
    return text
