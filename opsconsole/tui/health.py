"""The Health pane: health results per node and GPU, newest change first; `r` reruns a node, `R` all nodes.

Results come from the app's HealthMonitor (opsconsole.health.monitor), which evaluates the
rules on each fleet change; a rerun adds the on-node GPU suite (opsconsole.health.runner) and
runs in a worker, so the console keeps drawing while a node's GPUs are tested.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static
from textual.widgets.data_table import ColumnKey

from opsconsole.health.monitor import HealthEntry, HealthMonitor
from opsconsole.health.result import STATUS_ERROR, STATUS_FAIL, STATUS_PASS, STATUS_SKIP, STATUS_WARN, HealthResult
from opsconsole.health.runner import run_node_checks
from opsconsole.model import NodeState
from opsconsole.tui import bars
from opsconsole.tui.formatting import printable, shorten
from opsconsole.tui.live_pane import LivePane
from opsconsole.tui.table_diff import TableRow
from opsconsole.tui.table_pane import Column, drop_until_fits
from opsconsole.units import format_ms

# Headers in the other tables' words and case (Audit's "Time", Nodes' "Node").
WHERE_WIDTH = 16
CHECK_WIDTH = 24
COLUMNS = (
    Column("since", "Since", 8, sortable=False),
    Column("status", "Status", 6, sortable=False),
    Column("where", "Node / GPU", WHERE_WIDTH, sortable=False),
    Column("check", "Check", CHECK_WIDTH, sortable=False),
    Column("message", "Message", None, sortable=False),
)
# The message is what the row is for: it takes the room the others leave. When it does not fit whole,
# Since goes first, then Node / GPU and Check narrow to these (their cells cut with an ellipsis).
DROP_ORDER = ("since",)
WHERE_MIN = 10
CHECK_MIN = 14
MESSAGE_MIN = 12
STATUS_LEVEL = {
    STATUS_FAIL: bars.LEVEL_CRIT,
    STATUS_ERROR: bars.LEVEL_WARN,
    STATUS_WARN: bars.LEVEL_WARN,
    STATUS_PASS: bars.LEVEL_OK,
}
RERUN_CONCURRENCY = 8  # GPU suites at once for `R`
NOT_ALERTED = ("node_reachable",)  # node up/down has its own alerts


def row_key(entry: HealthEntry) -> str:
    result = entry.result
    return "%s|%s|%s" % (result.node, result.check, "" if result.gpu is None else result.gpu)


def entry_matches(entry: HealthEntry, text: str) -> bool:
    """The `/` filter: every word in node, check, status or message (case-insensitive)."""
    words = text.strip().lower().split()
    if not words:
        return True
    result = entry.result
    haystack = " ".join(
        (result.node, result.check, result.status, result.message, "" if result.gpu is None else "gpu%d" % result.gpu)
    ).lower()
    return all(word in haystack for word in words)


def where_text(result: HealthResult, width: int) -> str:
    """`node GPU n` in `width` cells: a long node name is cut with an ellipsis, the GPU kept."""
    gpu = "" if result.gpu is None else " GPU %d" % result.gpu
    return shorten(result.node, max(1, width - len(gpu))) + gpu


def drawn_width(column: Column) -> int:
    """The cells a column takes: drop_until_fits keeps one beside a label for a sort arrow, so the table does too."""
    return max(column.width or 0, len(column.label) + 1)


def one_line(text: str) -> str:
    return " ".join(printable(text).split())


def health_columns(width: int, results: Sequence[HealthResult]) -> Tuple[Column, ...]:
    """COLUMNS fitted to `width` cells for these results: Node / GPU and Check as wide as their longest
    cell (at most WHERE_WIDTH, CHECK_WIDTH), the Message with all the room left. A message that does not
    fit whole first takes Since's room, then Node / GPU and Check narrow (to WHERE_MIN, CHECK_MIN)."""
    longest_where = max((cell_len(where_text(r, WHERE_WIDTH)) for r in results), default=0)
    longest_check = max((cell_len(one_line(r.check)) for r in results), default=0)
    longest_message = max((cell_len(one_line(r.message)) for r in results), default=0)
    sized = []
    for column in COLUMNS:
        if column.key == "where":
            column = replace(column, width=max(len(column.label), min(WHERE_WIDTH, longest_where)))
        elif column.key == "check":
            column = replace(column, width=max(len(column.label), min(CHECK_WIDTH, longest_check)))
        sized.append(column)
    wanted = max(MESSAGE_MIN, longest_message)
    kept, room = drop_until_fits(sized, width, DROP_ORDER, "message", wanted)
    for key, narrowest in (("where", WHERE_MIN), ("check", CHECK_MIN)):
        if room >= wanted:
            break
        drawn = drawn_width(next(c for c in kept if c.key == key))
        narrower = min(drawn, max(narrowest, drawn - (wanted - room)))
        room += drawn - narrower
        kept = [replace(c, width=narrower) if c.key == key else c for c in kept]
    return tuple(replace(c, width=max(MESSAGE_MIN, room)) if c.key == "message" else c for c in kept)


def detail_text(result: HealthResult, message_cut: bool = False) -> str:
    """The selected result's evidence, timing and remedy, for the line under the table (its message
    first when the table had to cut it)."""
    parts = [one_line(result.message)] if message_cut else []
    parts.append(", ".join("%s=%s" % pair for pair in result.evidence) or "no evidence")
    if result.duration_s is not None:
        parts.append("took %s" % format_ms(result.duration_s * 1000.0))
    if result.remedy and result.status != STATUS_PASS:
        parts.append("remedy: " + result.remedy)
    return " · ".join(parts)


class HealthPane(LivePane):
    """Health results from app.health (a HealthMonitor); reruns through opsconsole.health.runner."""

    pane_id = "health"
    title = "Health"
    key = "8"

    BINDINGS = [
        Binding("r", "rerun_node", "Rerun checks (node)", id="health.rerun"),
        Binding("R", "rerun_all", "Rerun checks (all)", id="health.rerun_all"),
    ]

    DEFAULT_CSS = """
    HealthPane { layout: vertical; height: 1fr; }
    HealthPane > .pane-status { height: 1; padding: 0 1; color: $text-muted; }
    HealthPane > DataTable { height: 1fr; }
    HealthPane > .health-detail { height: 2; padding: 0 1; color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        self.status = Static("", classes="pane-status", markup=False)
        yield self.status
        self.table = DataTable(cursor_type="row", zebra_stripes=True)
        self.columns: Tuple[Column, ...] = ()
        self.fit_columns(COLUMNS)
        yield self.table
        self.detail = Static("", classes="health-detail", markup=False)
        yield self.detail
        self._shown: List[HealthEntry] = []
        self.last_run_error: Optional[str] = None

    @property
    def monitor(self) -> Optional[HealthMonitor]:
        return getattr(self.app, "health", None)

    def on_resize(self) -> None:
        self.redraw()  # the message column follows the width

    def fit_columns(self, columns: Sequence[Column]) -> None:
        """Lay out `columns`: widths change in place (rows and cursor stay); another set of columns rebuilds."""
        columns = tuple(columns)
        if columns == self.columns:
            return
        if [c.key for c in columns] != [c.key for c in self.columns]:
            self.table.clear(columns=True)
            for column in columns:
                self.table.add_column(column.label, key=column.key, width=drawn_width(column))
        else:
            for column in columns:
                drawn = self.table.columns[ColumnKey(column.key)]
                drawn.width = drawn_width(column)
                drawn.auto_width = False
            self.table._require_update_dimensions = True  # no public way to resize a column in place
            self.table.refresh()
        self.columns = columns

    def message_width(self) -> int:
        return next((drawn_width(c) for c in self.columns if c.key == "message"), 0)

    def draw(self, states: Mapping[str, NodeState], node: Optional[str], now: float) -> None:
        monitor = self.monitor
        if monitor is None:
            self.status.update("health checks are not wired into this console")
            return
        palette = bars.palette_from_variables(self.app.theme_variables)
        entries = [e for e in monitor.entries(node) if entry_matches(e, self.filter_text)]
        # The pane is as wide as the screen; before its first layout its own size is 0. Two cells for a scrollbar.
        width = (self.size.width or self.app.size.width) - 2
        self.fit_columns(health_columns(width, [e.result for e in entries]))
        widths = {c.key: drawn_width(c) for c in self.columns}
        rows: List[TableRow] = []
        for entry in entries:
            result = entry.result
            style = palette.style(STATUS_LEVEL.get(result.status, bars.LEVEL_PLAIN))
            cells = {
                "since": time.strftime("%H:%M:%S", time.localtime(entry.since)),
                "status": Text(result.status, style=("bold " + style) if result.status == STATUS_FAIL else style),
                "where": where_text(result, widths["where"]),
                "check": shorten(printable(result.check), widths["check"]),
                "message": shorten(printable(result.message), widths["message"]),
            }
            rows.append(TableRow(row_key(entry), tuple(cells[c.key] for c in self.columns)))
        self.sync_table(self.table, rows)
        self._shown = entries
        counts = monitor.counts(node)
        parts = [
            "%d fail" % counts.get(STATUS_FAIL, 0),
            "%d error" % counts.get(STATUS_ERROR, 0),
            "%d warn" % counts.get(STATUS_WARN, 0),
            "%d pass" % counts.get(STATUS_PASS, 0),
        ]
        if counts.get(STATUS_SKIP):  # a skip row listed is counted too (the GPU suite on a node without GPUs)
            parts.append("%d skip" % counts[STATUS_SKIP])
        if monitor.running:
            parts.append("running on " + ", ".join(sorted(monitor.running)))
        if self.last_run_error:
            parts.append(self.last_run_error)
        if self.filter_text:
            parts.append("filter: " + self.filter_text)
        hint = "r: rerun node · R: rerun all (with GPU tests)"
        # The footer says it too: at 80 columns it goes, not the counts (the pane is as wide as the screen,
        # and is drawn before its first layout, when its own size is 0).
        if len(" · ".join(parts + [hint])) <= self.app.size.width - 2:
            parts.append(hint)
        self.status.update(printable(" · ".join(parts)))
        self.show_detail()

    def selected_entry(self) -> Optional[HealthEntry]:
        row = self.table.cursor_row if self.table.row_count else None
        if row is None or not 0 <= row < len(self._shown):
            return None
        return self._shown[row]

    def show_detail(self) -> None:
        entry = self.selected_entry()
        if entry is None:
            self.detail.update("")
            return
        cut = cell_len(one_line(entry.result.message)) > self.message_width()
        self.detail.update(printable(detail_text(entry.result, cut)))  # evidence is data

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_detail()

    def selected_node(self) -> Optional[str]:
        """The node of the selected row, else the node drilled into, else the only node."""
        entry = self.selected_entry()
        if entry is not None:
            return entry.result.node
        app_node = getattr(self.app, "node", None)
        if app_node is not None:
            return app_node
        states = self.app.fleet.states()
        return next(iter(states)) if len(states) == 1 else None

    # --- reruns ------------------------------------------------------------------------

    def action_rerun_node(self) -> None:
        """Rerun every check (GPU suite included) for the selected node."""
        node = self.selected_node()
        if node is None:
            self.app.notify("select a node's result first", severity="warning")
            return
        self.start_rerun([node])

    def action_rerun_all(self) -> None:
        """Rerun every check (GPU suite included) on every node."""
        self.start_rerun(list(self.app.fleet.states()))

    def start_rerun(self, nodes: Sequence[str]) -> None:
        monitor = self.monitor
        if monitor is None:
            return
        nodes = [n for n in nodes if n not in monitor.running]
        if not nodes:
            return
        for node in nodes:
            monitor.running[node] = time.time()
        self.redraw()
        self.run_worker(self.rerun(nodes), group="health", exit_on_error=False)

    async def rerun(self, nodes: Sequence[str]) -> None:
        """Run the checks of `nodes` (at most RERUN_CONCURRENCY GPU suites at once) and show them."""
        gate = asyncio.Semaphore(RERUN_CONCURRENCY)
        app: Any = self.app

        async def one(node: str) -> None:
            async with gate:
                state = app.fleet.states().get(node)
                try:
                    link = app.fleet.link(node)
                except KeyError:
                    link = None
                try:
                    live = state is not None and state.is_live  # a node that is away cannot run the suite
                    results = await run_node_checks(node, state, app.config, link=link, gpu_tests=live)
                except Exception as exc:  # a bug in a check: shown, never a crash
                    self.monitor.running.pop(node, None)
                    self.last_run_error = "rerun on %s failed: %s: %s" % (node, type(exc).__name__, exc)
                    return
                changed = self.monitor.add_run(node, results)
                services = getattr(app, "services", None)
                if services is not None:
                    services.observe_health([r for r in changed if r.check not in NOT_ALERTED])
                self.redraw()

        await asyncio.gather(*(one(node) for node in nodes))
        self.redraw()
        app_redraw = getattr(app, "redraw", None)
        if app_redraw is not None:
            app_redraw()  # the header's badge
