"""The Alerts pane: what is firing now, and the history of alert events, newest first."""

from __future__ import annotations

import time
from typing import List, Mapping, Optional

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from opsconsole.alerts.engine import EVENT_FIRING, AlertEvent
from opsconsole.model import NodeState
from opsconsole.tui import bars
from opsconsole.tui.formatting import printable
from opsconsole.tui.live_pane import LivePane
from opsconsole.tui.table_diff import TableRow, apply_rows

COLUMNS = (("time", "time", 8), ("state", "state", 8), ("severity", "severity", 8), ("rule", "rule", 24),
           ("where", "node / GPU", 18), ("message", "message", None))
_SEVERITY_LEVEL = {"critical": bars.LEVEL_CRIT, "warning": bars.LEVEL_WARN, "info": bars.LEVEL_PLAIN}


def event_matches(event: AlertEvent, text: str) -> bool:
    text = text.strip().lower()
    if not text:
        return True
    haystack = " ".join((event.rule, event.node, event.severity, event.state, event.message)).lower()
    return all(word in haystack for word in text.split())


class AlertsPane(LivePane):
    """Alert history from the console's AlertEngine (app.services.alerts)."""

    pane_id = "alerts"
    title = "Alerts"
    key = "9"

    DEFAULT_CSS = """
    AlertsPane { layout: vertical; height: 1fr; }
    AlertsPane > .pane-status { height: 1; padding: 0 1; color: $text-muted; }
    AlertsPane > DataTable { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        self.status = Static("", classes="pane-status", markup=False)
        yield self.status
        self.table = DataTable(cursor_type="row", zebra_stripes=True)
        for key, label, width in COLUMNS:
            self.table.add_column(label, key=key, width=width)
        yield self.table

    def draw(self, states: Mapping[str, NodeState], node: Optional[str], now: float) -> None:
        services = getattr(self.app, "services", None)
        if services is None:
            return
        palette = bars.palette_from_variables(self.app.theme_variables)
        engine = services.alerts
        events = [e for e in reversed(engine.history) if (node is None or e.node == node)
                  and event_matches(e, self.filter_text)]
        rows: List[TableRow] = []
        for index, event in enumerate(events):
            style = palette.style(_SEVERITY_LEVEL.get(event.severity, bars.LEVEL_PLAIN))
            where = event.node + ("" if event.gpu is None else " GPU %d" % event.gpu)
            cells = (
                time.strftime("%H:%M:%S", time.localtime(event.time)),
                Text(event.state, style=style if event.state == EVENT_FIRING else "dim"),
                Text(event.severity, style=style),
                event.rule, where, event.message,
            )
            rows.append(TableRow("%d-%s-%s-%s-%s" % (len(engine.history) - index, event.time, event.rule,
                                                       event.node, event.gpu), cells))
        apply_rows(self.table, rows)
        counts = engine.counts()
        firing = sum(counts.values())
        parts = ["%d firing" % firing]
        parts += ["%s %d" % (severity, counts[severity]) for severity in ("critical", "warning", "info")
                  if counts.get(severity)]
        parts.append("%d events" % len(events))
        if services.hook_results:
            last = services.hook_results[-1]
            parts.append("hook: " + last.message)
        if self.filter_text:
            parts.append("filter: " + self.filter_text)
        self.status.update(printable(" · ".join(parts)))  # a hook's message is its output
