"""Compact text for the console's cells: percentages, temperatures, watts, state colours.

Pure functions (no Textual): every pane formats the same way, and a missing reading
always reads "N/A".
"""

from __future__ import annotations

from typing import Optional

from rich.text import Text

from opsconsole.model import (
    STATE_AUTH,
    STATE_CONNECTING,
    STATE_DEGRADED,
    STATE_DOWN,
    STATE_FALLBACK,
    STATE_HOSTKEY,
    STATE_STALE,
    STATE_UP,
)
from opsconsole.sanitize import printable

# Sizes, rates and durations have one spelling, in opsconsole.units; re-exported for the panes.
from opsconsole.units import (  # noqa: F401
    GIB,
    KIB,
    MIB,
    NA,
    TIB,
    format_age,
    format_bytes,
    format_duration,
    format_frame_age,
    format_gib,
    format_memory_pair,
    format_rate,
)

# Rich styles for the connection states (up green, stale yellow, failures red ...).
STATE_STYLES = {
    STATE_UP: "green",
    STATE_STALE: "yellow",
    STATE_DOWN: "bold red",
    STATE_AUTH: "bold red",
    STATE_HOSTKEY: "bold red",
    STATE_FALLBACK: "cyan",
    STATE_DEGRADED: "yellow",
    STATE_CONNECTING: "dim",
}
# Rows of a node that is not delivering fresh frames: its last values, dimmed.
STALE_ROW_STYLE = "dim"
# Process states worth a look: D = uninterruptible sleep (hung IO), Z = zombie.
PROCESS_STATE_STYLES = {"D": "bold red", "Z": "bold magenta"}


def state_style(state: str) -> str:
    """The Rich style of a node connection state ("" for an unknown one)."""
    return STATE_STYLES.get(state, "")


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
