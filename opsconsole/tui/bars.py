"""Text bars for utilisation and memory, and the threshold levels that colour them."""

from __future__ import annotations

from typing import Mapping, Optional, Tuple

from opsconsole.model import frozen
from opsconsole.tui.formatting import format_percent

LEVEL_OK = "ok"
LEVEL_WARN = "warn"
LEVEL_CRIT = "crit"
LEVEL_DIM = "dim"  # a reading from a node that is no longer live
LEVEL_PLAIN = ""

_EIGHTHS = " ▏▎▍▌▋▊▉"
_FULL = "█"
_EMPTY = "·"


def level_for(value: Optional[float], warn: float, crit: float) -> str:
    """`crit` at or above crit, `warn` at or above warn, else `ok`; plain when unknown."""
    if value is None:
        return LEVEL_PLAIN
    if value >= crit:
        return LEVEL_CRIT
    if value >= warn:
        return LEVEL_WARN
    return LEVEL_OK


def bar(percent: Optional[float], width: int) -> str:
    """A `width`-cell bar for 0..100 percent, in eighths of a cell; dots for the empty part."""
    if percent is None:
        return _EMPTY * width
    fraction = min(max(percent, 0.0), 100.0) / 100.0
    eighths = int(round(fraction * width * 8))
    full, part = divmod(eighths, 8)
    text = _FULL * full
    if part and full < width:
        text += _EIGHTHS[part]
    return text + _EMPTY * (width - len(text))


def percent_bar(percent: Optional[float], width: int) -> str:
    """A bar followed by the percent, right-aligned in four cells ("N/A" when unknown)."""
    label = format_percent(percent)
    return "%s %4s" % (bar(percent, width), label)


_SPARKS = " ▁▂▃▄▅▆▇█"


def spark(percent: Optional[float]) -> str:
    """One cell for a percent: a block whose height follows it (for many cores on one line)."""
    if percent is None:
        return "?"
    index = int(round(min(max(percent, 0.0), 100.0) / 100.0 * (len(_SPARKS) - 1)))
    return _SPARKS[index] if index else "▁"


@frozen
class Palette:
    """Rich styles for each level, taken from the active theme."""

    ok: str = "#009E73"
    warn: str = "#F0E442"
    crit: str = "#D55E00"
    accent: str = "#56B4E9"

    def style(self, level: str) -> str:
        if level == LEVEL_OK:
            return self.ok
        if level == LEVEL_WARN:
            return self.warn
        if level == LEVEL_CRIT:
            return "bold " + self.crit
        if level == LEVEL_DIM:
            return "dim"
        return ""


def palette_from_variables(variables: Mapping[str, str]) -> Palette:
    """A palette from a theme's CSS variables (`App.theme_variables`)."""
    default = Palette()
    return Palette(
        ok=variables.get("success", default.ok),
        warn=variables.get("warning", default.warn),
        crit=variables.get("error", default.crit),
        accent=variables.get("primary", default.accent),
    )


Cell = Tuple[str, str]  # (plain text, level) before styling
