"""The Alerts pane: what is firing now, and the history of alert events, newest first.

`a` acknowledges the highlighted alert (again: takes it back), `z` silences it for 15 min, 1 h, 8 h,
then lifts the silence; neither is announced again (toast, bell, hook) while so. Findings from log
lines older than the console's start are listed as "earlier".
"""

from __future__ import annotations

import time
from typing import Dict, List, Mapping, Optional

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from opsconsole.alerts.engine import EVENT_FIRING, AlertEvent, AlertKey
from opsconsole.model import NodeState
from opsconsole.tui import bars
from opsconsole.tui.formatting import printable
from opsconsole.tui.live_pane import LivePane
from opsconsole.tui.table_diff import TableRow, apply_rows

# Headers in the other tables' words and case (Audit's "Time", Health's "Node / GPU").
COLUMNS = (
    ("time", "Time", 8),
    ("state", "State", 16),
    ("severity", "Severity", 8),
    ("rule", "Rule", 24),
    ("where", "Node / GPU", 18),
    ("message", "Message", None),
)
_SEVERITY_LEVEL = {"critical": bars.LEVEL_CRIT, "warning": bars.LEVEL_WARN, "info": bars.LEVEL_PLAIN}
SILENCE_STEPS_S = (15 * 60, 60 * 60, 8 * 3600)  # `z` cycles these, then lifts the silence


def duration_text(seconds: float) -> str:
    """15m, 1h, 8h, 1h30m: how long a silence lasts (or has left)."""
    minutes = max(1, int(round(seconds / 60.0)))
    hours, minutes = divmod(minutes, 60)
    return ("%dh" % hours if hours else "") + ("%dm" % minutes if minutes or not hours else "")


def next_silence(current_s: Optional[float]) -> Optional[float]:
    """The next silence length after one of `current_s` left (None: not silenced); None lifts it."""
    if current_s is None:
        return SILENCE_STEPS_S[0]
    # The step this silence was set to: the shortest that covers what is left (a minute's grace).
    current = next((i for i, step in enumerate(SILENCE_STEPS_S) if step >= current_s - 60), len(SILENCE_STEPS_S) - 1)
    return SILENCE_STEPS_S[current + 1] if current + 1 < len(SILENCE_STEPS_S) else None


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

    BINDINGS = [
        Binding("a", "acknowledge", "Acknowledge", id="alerts.acknowledge"),
        Binding("z", "silence", "Silence", id="alerts.silence"),
    ]

    DEFAULT_CSS = """
    AlertsPane { layout: vertical; height: 1fr; }
    AlertsPane > .pane-status { height: 1; padding: 0 1; color: $text-muted; }
    AlertsPane > DataTable { height: 1fr; }
    """

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self._row_keys: Dict[str, AlertKey] = {}  # table row key -> the alert it shows

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
        events = [
            e
            for e in reversed(engine.history)
            if (node is None or e.node == node) and event_matches(e, self.filter_text)
        ]
        rows: List[TableRow] = []
        self._row_keys = {}
        for index, event in enumerate(events):
            style = palette.style(_SEVERITY_LEVEL.get(event.severity, bars.LEVEL_PLAIN))
            where = event.node + ("" if event.gpu is None else " GPU %d" % event.gpu)
            state = self.state_text(event, now)
            cells = (
                # An unstamped earlier line was written before the start, at a time no log told: the
                # time it was read would pass for when it happened.
                "before start" if event.unstamped else time.strftime("%H:%M:%S", time.localtime(event.time)),
                Text(state, style=style if state == EVENT_FIRING else "dim"),
                Text(event.severity, style=style),
                event.rule,
                where,
                event.message,
            )
            row_key = "%d-%s-%s-%s-%s" % (len(engine.history) - index, event.time, event.rule, event.node, event.gpu)
            self._row_keys[row_key] = event.key
            rows.append(TableRow(row_key, cells))
        apply_rows(self.table, rows)
        counts = engine.counts()
        firing = sum(counts.values())
        parts = ["%d firing" % firing]
        parts += [
            "%s %d" % (severity, counts[severity])
            for severity in ("critical", "warning", "info")
            if counts.get(severity)
        ]
        quiet = [engine.quiet_reason(event.key, now) for event in engine.firing()]
        for reason in ("acknowledged", "silenced"):
            if quiet.count(reason):
                parts.append("%d %s" % (quiet.count(reason), reason))
        earlier = sum(1 for event in engine.history if event.earlier)
        if earlier:
            parts.append("%d from logs older than the start" % earlier)
        parts.append("%d events" % len(events))
        if services.hook_results:
            last = services.hook_results[-1]
            parts.append("hook: " + last.message)
        if self.filter_text:
            parts.append("filter: " + self.filter_text)
        self.status.update(printable(" · ".join(parts)))  # a hook's message is its output

    def state_text(self, event: AlertEvent, now: float) -> str:
        """firing, resolved, earlier; with "· ack" and/or "· silenced 42m" while the alert is quiet (both
        when it is both: taking the acknowledgement back leaves the silence, which must show)."""
        if event.earlier:
            return "earlier"
        engine = self.app.services.alerts
        text = event.state
        if engine.quiet_reason(event.key, now) == "acknowledged":
            text += " · ack"
        until = engine.silenced_until(event.key, now)
        if until is not None:
            text += " · silenced " + duration_text(until - now)
        return text

    def highlighted_alert(self) -> Optional[AlertKey]:
        table = self.table
        if table.row_count == 0:
            return None
        try:
            row_key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # a cursor past the rows after a filter
            return None
        return self._row_keys.get(row_key)

    def action_acknowledge(self) -> None:
        """Acknowledge the highlighted alert (not announced again), or take the acknowledgement back."""
        key = self.highlighted_alert()
        if key is None:  # a bell alone said nothing in most terminals
            self.app.notify("no alert selected: a acknowledges the highlighted alert", severity="warning")
            return
        acked = self.app.services.alerts.acknowledge(key)
        self.app.notify(
            "%s on %s %s"
            % (key[0], _where(key), "acknowledged: not announced again" if acked else "no longer acknowledged")
        )
        self._redraw_all()

    def action_silence(self) -> None:
        """Silence the highlighted alert for 15 min, then 1 h, 8 h, then lift the silence."""
        key = self.highlighted_alert()
        if key is None:
            self.app.notify("no alert selected: z silences the highlighted alert", severity="warning")
            return
        engine = self.app.services.alerts
        now = self.app.now()
        until = engine.silenced_until(key, now)
        length = next_silence(None if until is None else until - now)
        engine.silence(key, None if length is None else now + length)
        if length is None:
            self.app.notify("%s on %s: silence lifted" % (key[0], _where(key)))
        else:
            self.app.notify(
                "%s on %s silenced for %s (until %s)"
                % (key[0], _where(key), duration_text(length), time.strftime("%H:%M", time.localtime(now + length)))
            )
        self._redraw_all()

    def _redraw_all(self) -> None:
        """The header's alert count changes too."""
        redraw = getattr(self.app, "redraw", None)
        if callable(redraw):
            redraw()
        else:
            self.redraw()


def _where(key: AlertKey) -> str:
    return key[1] + ("" if key[2] is None else " GPU %d" % key[2])
