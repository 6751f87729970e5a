"""The Nodes pane: one line per node with its connection state and a summary of its GPUs."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import List, Optional, Sequence, Tuple

from rich.cells import cell_len
from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from opsconsole.actions.registry import TARGET_NODE, Target
from opsconsole.fleet_view import NODE_FILTER, NODE_SORT_KEYS, TREND_POINTS, NodeRow, filter_rows, node_rows
from opsconsole.history import sparkline
from opsconsole.sanitize import printable_line
from opsconsole.tui.action_flow import ActionKeys, action_bindings
from opsconsole.tui.formatting import (
    NA,
    STALE_ROW_STYLE,
    cut_to_cells,
    format_age,
    format_count,
    format_memory_pair,
    format_ms,
    format_percent,
    format_power,
    format_temperature,
    shorten,
    state_style,
)
from opsconsole.tui.table_diff import TableRow
from opsconsole.tui.table_pane import Column, SortedTable, TablePane, drop_until_fits

REASON_WIDTH = 22
JOBS_WIDTH = 14
REASON_MIN = 12  # the reason column takes all the room the others leave, at least this much
# A reason cut short says where it is whole: `enter` opens the node, whose overview shows it wrapped.
REASON_MORE = "… enter"
# What a narrow terminal gives up first (first to go first); Node, State, GPUs, Util and Memory stay.
DROP_ORDER = ("trend", "rtt", "power", "util_max", "jobs", "temp", "age", "errors")

NODE_COLUMNS = (
    Column("name", "Node"),
    Column("state", "State", 10),
    Column("reason", "Reason", REASON_WIDTH),
    Column("gpus", "GPUs", 4),
    Column("util_mean", "Util", 5),
    Column("util_max", "Max", 5),
    Column("trend", "Trend", 8, sortable=False),
    Column("memory", "Memory", 17),
    Column("temp", "Hottest", 10),
    Column("power", "Power", 7),
    Column("errors", "Errors", 6),
    Column("age", "Age", 4),
    Column("rtt", "RTT", 7),
    Column("jobs", "Jobs", JOBS_WIDTH),
)


def node_columns(width: int, name_width: int = 0, state_width: int = 0) -> Tuple[Column, ...]:
    """NODE_COLUMNS fitted to `width` cells: the Node column as wide as the longest name, the Reason column
    with all the room left (at least REASON_MIN), and columns dropped in DROP_ORDER until the rest fits."""
    sized = []
    for column in NODE_COLUMNS:
        if column.key == "name":
            column = replace(column, width=max(len(column.label) + 1, name_width))
        elif column.key == "state":
            column = replace(column, width=max(len(column.label) + 1, min(state_width, column.width or 10)))
        sized.append(column)
    sized, room = drop_until_fits(sized, width, DROP_ORDER, "reason", REASON_MIN)
    if room >= REASON_MIN:
        return tuple(replace(c, width=room) if c.key == "reason" else c for c in sized)
    return tuple(c for c in sized if c.key != "reason")  # long node names on a narrow terminal: the reason goes


def shorten_reason(reason: Optional[str], width: int) -> str:
    """`reason` on one line in `width` cells; one cut short ends in REASON_MORE (a narrow column: in "…")."""
    line = shorten(reason, width)
    if not line.endswith("…") or line == " ".join((reason or "").split()) or width < 3 * len(REASON_MORE):
        return line
    return cut_to_cells(line, width - cell_len(REASON_MORE)).rstrip() + REASON_MORE


def _hottest(row: NodeRow) -> str:
    if row.hottest_temp is None:
        return NA
    return "%s #%d" % (format_temperature(row.hottest_temp), row.hottest_gpu)


def node_table_row(row: NodeRow, columns: Sequence[Column] = NODE_COLUMNS) -> TableRow:
    """A node's cells for `columns`; a node not live keeps its last values, dimmed, with their age."""
    base = "" if row.live else STALE_ROW_STYLE
    errors_style = "bold red" if row.errors else base

    def cell(text: str, style: str = base) -> Text:
        return Text(text, style=style, end="")

    state_cell_style = state_style(row.state)
    reason_width = next((c.width for c in columns if c.key == "reason"), None) or REASON_WIDTH
    cells = {
        "name": lambda: cell(printable_line(row.name)),  # before Rich, which drops a carriage return unseen
        "state": lambda: cell(row.state, state_cell_style),
        "reason": lambda: cell(shorten_reason(row.reason, reason_width)),
        "gpus": lambda: cell(format_count(row.gpu_count)),
        "util_mean": lambda: cell(format_percent(row.util_mean)),
        "util_max": lambda: cell(format_percent(row.util_max)),
        "trend": lambda: cell(sparkline(row.util_trend, TREND_POINTS, 0.0, 100.0)),
        "memory": lambda: cell(format_memory_pair(row.mem_used, row.mem_total)),
        "temp": lambda: cell(_hottest(row)),
        "power": lambda: cell(format_power(row.power_sum)),
        "errors": lambda: cell(format_count(row.errors), errors_style),
        "age": lambda: cell(format_age(row.age)),
        "rtt": lambda: cell(format_ms(row.rtt_ms)),
        "jobs": lambda: cell(shorten(",".join(row.jobs), JOBS_WIDTH) if row.jobs else "-"),
    }
    return TableRow(row.key, tuple(cells[column.key]() for column in columns))


class NodesPane(ActionKeys, TablePane):
    """Every node: state (coloured), reason, GPU count, utilisation, memory, heat, power, age.

    Keys: `s` next sort column, `r` reverse, header click sorts; `enter` on a row posts
    `NodesPane.Drill(node)`; `T` posts `NodesPane.TrustHostKey(node)` and `c` `NodesPane.ConnectNow(node)`
    for the row's node. Filter: free text on name/state/reason, `state:down`, `node:gpu0*`,
    `util<10`, `temp>80`, `errors>0`, `age>60`, `job:812` (whose jobs run there), `user:alice`.
    """

    pane_id = "nodes"
    title = "Nodes"
    key = "4"
    filter_fields = NODE_FILTER

    # h reruns the node's health checks, D drains it in Slurm (absent in a read-only console).
    BINDINGS = [
        Binding("T", "trust_hostkey", "Trust host key", id="node.trust_hostkey"),
        # One login now (a node in auth waits for this or a changed key; one down skips its backoff).
        Binding("c", "connect_now", "Connect", id="node.connect"),
        Binding("t", "trends", "Trends", id="node.trends"),
        Binding("S", "stacks", "Stacks", id="node.stacks"),  # every rank's py-spy stack (reads only)
    ] + action_bindings(TARGET_NODE)

    class TrustHostKey(Message):
        """Posted by `T`: the app confirms, then trusts the key the node presented."""

        def __init__(self, node: str) -> None:
            self.node = node
            super().__init__()

    class ConnectNow(Message):
        """Posted by `c`: the app asks the node's link for one login attempt now."""

        def __init__(self, node: str) -> None:
            self.node = node
            super().__init__()

    class Drill(Message):
        """Posted when the user opens a node: the app shows that node's GPUs and processes."""

        def __init__(self, node: str) -> None:
            self.node = node
            super().__init__()

    def make_tables(self) -> List[SortedTable]:
        table: DataTable = DataTable(cursor_type="row", zebra_stripes=True, id="nodes-table")
        return [SortedTable(table, NODE_SORT_KEYS)]

    def on_resize(self) -> None:
        self.redraw()  # the columns follow the width

    def draw(self) -> List[str]:
        sorted_table = self.tables[0]
        rows = node_rows(self.states, self.now, self.node, self.history())
        # Cells, not characters: a wide (CJK, emoji) name takes two a character and must still show whole;
        # measured as drawn, where a control character is one visible picture (Rich counts it as none).
        columns = node_columns(
            self.size.width - 2,
            max((cell_len(printable_line(row.name)) for row in rows), default=0),
            max((len(row.state) for row in rows), default=0),
        )
        # A node going `connecting` widens State: widths change in place, so the cursor stays on its node;
        # only a column dropped or brought back by the width rebuilds the table.
        sorted_table.fit_columns(columns)
        live = sum(1 for row in rows if row.live)
        sorted_table.show(
            filter_rows(rows, self.filter, self.filter_fields),
            partial(node_table_row, columns=columns),
            # The age ticks every second; the cells change only when its text does.
            signature=lambda row: (replace(row, age=None), format_age(row.age)),
        )
        return [
            self.count_part(sorted_table, "nodes"),
            "%d live" % live,
            "sort: " + sorted_table.sort_label(),
        ]

    def history(self):
        return getattr(getattr(self.app, "services", None), "history", None)

    def action_trends(self) -> None:
        """Plots of the highlighted node's last minutes."""
        node = self.highlighted_node()
        history = self.history()
        if node is None or history is None:
            self.app.notify("no node selected: t plots the highlighted node's last minutes", severity="warning")
            return
        from opsconsole.tui.history_view import HistoryScreen  # plotext loads only when asked for

        self.app.push_screen(HistoryScreen(history, node, None))

    @on(DataTable.RowSelected, "#nodes-table")
    def drill_into_node(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key.value is not None:
            self.post_message(self.Drill(event.row_key.value))

    def highlighted_node(self) -> Optional[str]:
        """The node of the row under the cursor, None when the table is empty."""
        table = self.tables[0].table
        if table.row_count == 0:
            return None
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # a cursor past the rows after a filter: no node
            return None

    def action_stacks(self) -> None:
        """The stacks of the training ranks of the highlighted node (`a` there widens to every node)."""
        from opsconsole.tui.stacks import open_stacks

        node = self.highlighted_node()
        open_stacks(self.app, nodes=[node] if node else None)

    def check_action(self, action_name: str, parameters: Tuple[object, ...]) -> Optional[bool]:
        if action_name == "trust_hostkey" and "node.trust_hostkey" in getattr(self.app, "hidden_binding_ids", ()):
            return False  # read-only: absent from the footer and the key does nothing (the app refuses it too)
        return super().check_action(action_name, parameters)

    def action_trust_hostkey(self) -> None:
        """Ask the app to trust the host key of the highlighted node (it confirms first)."""
        node = self.highlighted_node()
        if node is None:
            self.app.notify("no node selected", severity="warning")
            return
        self.post_message(self.TrustHostKey(node))

    def action_connect_now(self) -> None:
        """Ask the app to connect the highlighted node now."""
        node = self.highlighted_node()
        if node is None:
            self.app.notify("no node selected", severity="warning")
            return
        self.post_message(self.ConnectNow(node))

    def action_target(self, action_id: str) -> Optional[Target]:
        node = self.highlighted_node()
        return None if node is None else Target(TARGET_NODE, node)
