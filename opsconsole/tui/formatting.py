"""Compact text for the console's cells: state colours, counts, cut text.

Pure functions (no Textual). Quantities (sizes, rates, durations, percentages, temperatures,
power, clocks) are spelled by opsconsole.units alone, re-exported here for the panes, so every
pane formats them the same way and a missing reading always reads "N/A".
"""

from __future__ import annotations

from typing import Optional

from rich.cells import cell_len, get_character_cell_size
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
from opsconsole.sanitize import printable, printable_line

# Every quantity has one spelling, in opsconsole.units; re-exported for the panes.
from opsconsole.units import (  # noqa: F401
    GIB,
    KIB,
    MIB,
    NA,
    TIB,
    format_age,
    format_bytes,
    format_clock,
    format_duration,
    format_frame_age,
    format_memory_pair,
    format_metric,
    format_ms,
    format_pcie_link,
    format_percent,
    format_power,
    format_power_pair,
    format_rate,
    format_temperature,
    format_temperature_pair,
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


def format_count(value: Optional[int]) -> str:
    """An integer, or N/A."""
    return NA if value is None else str(value)


def counted(count: int, noun: str) -> str:
    """`1 node`, `3 nodes`; `1 GPU process`, `2 host processes`: `noun` is the plural."""
    if count == 1:
        noun = noun[:-2] if noun.endswith("sses") else noun[:-1]
    return "%d %s" % (count, noun)


def shorten(text: Optional[str], width: int) -> str:
    """`text` on one line, cut to `width` cells with an ellipsis (a CJK character or an emoji takes two)."""
    if not text:
        return ""
    line = " ".join(text.split())
    return line if cell_len(line) <= width else cut_to_cells(line, width - 1) + "…"


def cut_to_cells(text: str, width: int) -> str:
    """The start of `text` in at most `width` cells (a wide character that would straddle the edge goes)."""
    if cell_len(text) <= width:
        return text
    used = 0
    for index, character in enumerate(text):
        used += get_character_cell_size(character)
        if used > width:
            return text[:index]
    return text


def printable_text(text: Text, one_line: bool = False) -> Text:
    """A Rich Text whose control characters are made visible (see printable; with `one_line`, newline
    and tab too: printable_line); the same one when it has none."""
    plain = text.plain
    clean = printable_line(plain) if one_line else printable(plain)
    if clean == plain:
        return text
    text = text.copy()
    text.plain = clean  # same length: the spans keep their places
    return text
