"""The header: which nodes, read-only or not, the clock, frame age and fleet totals."""

from __future__ import annotations

import time
from typing import Any, List, Mapping, Optional, Tuple

from rich.cells import cell_len
from rich.text import Text

from opsconsole.config import Config
from opsconsole.model import NodeState
from opsconsole.sanitize import printable_line
from opsconsole.tui import bars
from opsconsole.tui.formatting import format_frame_age, format_percent, printable_text
from opsconsole.tui.lines_view import LinesView


def console_name(states: Mapping[str, NodeState]) -> str:
    """One node: its name (and hostname when it differs); several: how many. One line: the header
    is split at its newlines, so a newline in a name would push the rest onto the second line."""
    if len(states) != 1:
        return "%d nodes" % len(states)
    state = next(iter(states.values()))
    host = state.frame.host if state.frame is not None else None
    if host is not None and host.hostname and host.hostname != state.name:
        return printable_line("%s (%s)" % (state.name, host.hostname))
    return printable_line(state.name)


def newest_age(states: Mapping[str, NodeState], now: float) -> Optional[float]:
    """Age of the newest frame over all nodes, None before the first."""
    ages = [age for age in (s.age(now) for s in states.values()) if age is not None]
    return min(ages) if ages else None


def header_text(
    config: Config,
    states: Mapping[str, NodeState],
    totals: Any,
    node: Optional[str],
    now: float,
    palette: bars.Palette,
    health_failures: int = 0,
    width: Optional[int] = None,
    recording: bool = False,
    health_errors: int = 0,
) -> Text:
    """Two lines: identity, mode, clock and age; then the fleet totals (and the health checks that fail or
    could not judge), within `width` cells where it can (None: all of it)."""
    text = Text(no_wrap=True, overflow="ellipsis", end="")
    text.append(" opsconsole ", style="bold reverse")
    text.append("  " + console_name(states), style="bold")
    if node is not None and len(states) > 1:
        text.append("  > " + printable_line(node), style="bold " + palette.accent)
    mode = "[R]" if config.console.read_only else "[RW]"
    text.append("  " + mode, style="bold " + (palette.warn if not config.console.read_only else palette.ok))
    text.append("   " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)))
    age = newest_age(states, now)
    stale = age is None or age > 3 * config.console.interval + 2.0
    text.append(
        "   newest frame " + (format_frame_age(age) + " ago" if age is not None else "none yet"),
        style=palette.warn if stale else "",
    )
    job = getattr(totals, "job", None)  # a followed Slurm job (RunTotals, opsconsole/nodes/totals.py)
    if job:
        text.append("   " + printable_line(job), style="bold " + palette.accent)
    text.append("\n")
    # The counts line as (text, style, rank): a line wider than `width` gives up rank 1, then 2, ... (the
    # GPU readings the panes show anyway); what needs someone (down, host keys, alerts, health) stays.
    parts: List[Tuple[str, str, int]] = [(" nodes %d" % totals.nodes, "", 0)]
    parts.append(("  up %d" % totals.nodes_up, palette.ok if totals.nodes_up else "", 0))
    connecting = getattr(totals, "nodes_connecting", 0)  # no frame yet: not down
    if connecting:
        parts.append(("  connecting %d" % connecting, palette.warn, 0))
    parts.append(("  down %d" % totals.nodes_down, ("bold " + palette.crit) if totals.nodes_down else "", 0))
    # Of those down, the ones no retry brings back until someone acts: named as the State column names them.
    waiting = [
        "%s %d" % (label, count)
        for label, count in (
            ("hostkey", getattr(totals, "nodes_hostkey", 0)),
            ("auth", getattr(totals, "nodes_auth", 0)),
        )
        if count
    ]
    if waiting:
        parts.append((" (%s)" % ", ".join(waiting), "bold " + palette.crit, 0))
    parts.append(("   GPUs %d" % totals.gpus, "", 3))
    jobs = getattr(totals, "jobs", 0)  # distinct jobs on the live nodes' GPUs (opsconsole/jobs_view.py)
    if jobs:
        parts.append(("  jobs %d" % jobs, "", 2))
    parts.append(("   mean util " + format_percent(totals.mean_utilization), "", 1))
    alerts = getattr(totals, "alerts", 0)
    parts.append(("   alerts %d" % alerts, ("bold " + palette.crit) if alerts else "", 0))
    if health_failures or health_errors:  # the Health pane (8) lists them
        badge = " ".join(
            "%d %s" % (count, word) for count, word in ((health_failures, "FAIL"), (health_errors, "ERROR")) if count
        )
        parts.append(("   HEALTH " + badge, "bold reverse " + (palette.crit if health_failures else palette.warn), 0))
    for name, state, reason in getattr(totals, "sources", ()):  # Prometheus sources not answering
        if state not in ("up", "connecting"):
            said = "   %s %s" % (name, state) + (": " + reason if reason else "")
            parts.append((printable_line(said), "bold " + palette.crit, 0))
    if recording:  # a recording runs: always in sight, as what needs someone is
        parts.append(("   ● REC", "bold " + palette.crit, 0))
    for rank in (1, 2, 3):
        if width is None or sum(cell_len(part) for part, _, _ in parts) <= width:
            break
        parts = [part for part in parts if part[2] != rank]
    for part, style, _ in parts:
        text.append(part, style=style)
    return text


class ConsoleHeader(LinesView):
    """Two header lines, redrawn only when their text changes."""

    DEFAULT_CSS = """
    ConsoleHeader { height: 2; background: $panel; color: $foreground; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self._shown: Optional[Text] = None

    def show(self, text: Text) -> None:
        if self._shown is not None and text == self._shown and text.style == self._shown.style:
            return
        self._shown = text
        # Node and host names, job and source reasons are data. Line by line: the clock ticking
        # each second repaints the cells that changed, not both lines.
        self.set_lines(list(printable_text(text).split("\n", allow_blank=True)))
