"""The Processes pane: GPU compute processes, and the host's top processes by CPU below them.

The host table matters because a hung data-loader worker (state D) holds no GPU memory and
never shows among the GPU processes; it shows here, highlighted.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from opsconsole.fleet_view import (
    GPU_PROCESSES,
    HOST_PROCESSES,
    PROCESS_FILTER,
    PROCESS_SORT_KEYS,
    ProcessRow,
    filter_rows,
    process_rows,
)
from opsconsole.tui.formatting import (
    NA,
    PROCESS_STATE_STYLES,
    STALE_ROW_STYLE,
    format_bytes,
    format_duration,
    format_percent,
    shorten,
)
from opsconsole.actions.registry import TARGET_PROCESS, Target
from opsconsole.actions.signals import reported_process
from opsconsole.tui.action_flow import ActionKeys, action_bindings
from opsconsole.tui.table_diff import TableRow
from opsconsole.tui.table_pane import Column, SortedTable, TablePane

USER_WIDTH = 12
COMMAND_WIDTH = 160

# `t` cycles what the pane shows.
VIEW_BOTH, VIEW_GPU, VIEW_HOST = "both", "gpu", "host"
VIEW_MODES = (VIEW_BOTH, VIEW_GPU, VIEW_HOST)

NODE_COLUMN = Column("node", "Node")
GPU_PROCESS_COLUMNS = (
    Column("pid", "PID", 7),
    Column("user", "User", USER_WIDTH),
    Column("gpu", "GPU", 3),
    Column("gpu_memory", "GPU mem", 9),
    Column("sm", "SM", 5),
    Column("cpu", "CPU", 6),
    Column("rss", "RSS", 9),
    Column("elapsed", "Elapsed", 7),
    Column("state", "S", 2),
    Column("command", "Command"),
)
HOST_PROCESS_COLUMNS = tuple(c for c in GPU_PROCESS_COLUMNS if c.key not in ("gpu", "gpu_memory", "sm"))


def row_style(row: ProcessRow) -> str:
    """D/Z rows stand out; rows of a node that is not live are dimmed."""
    state_style = PROCESS_STATE_STYLES.get((row.proc_state or "")[:1])
    if state_style:
        return state_style
    return "" if row.live else STALE_ROW_STYLE


def process_table_row(row: ProcessRow, columns: Sequence[Column]) -> TableRow:
    """The cells of `row` for the given column layout."""
    style = row_style(row)
    values = {
        "node": row.node,
        "pid": str(row.pid),
        "user": shorten(row.user, USER_WIDTH) or NA,
        "gpu": NA if row.gpu_index is None else str(row.gpu_index),
        "gpu_memory": format_bytes(row.gpu_memory),
        "sm": format_percent(row.sm_percent),
        "cpu": format_percent(row.cpu_percent),
        "rss": format_bytes(row.rss),
        "elapsed": format_duration(row.elapsed),
        "state": row.proc_state or NA,
        "command": shorten(row.command, COMMAND_WIDTH) or NA,
    }
    return TableRow(row.key, tuple(Text(values[c.key], style=style, end="") for c in columns))


class ProcessesPane(ActionKeys, TablePane):
    """GPU compute processes and the host's top processes, with a node column for several nodes.

    Keys: `t` cycles both / GPU only / host only; `s` next sort column and `r` reverse (on the
    focused table), header click sorts. Filter: free text on command, user, pid and node;
    `user:alice`, `gpu:0`, `pid:421`, `node:gpu01`, `state:D`, `cpu>50`, `sm>90`.
    """

    pane_id = "processes"
    title = "Processes"
    key = "2"
    filter_fields = PROCESS_FILTER

    DEFAULT_CSS = """
    ProcessesPane > .pane-section {
        height: 1;
        padding: 0 1;
        text-style: bold;
    }
    """

    # Signals for the highlighted process (i, x, K, e): absent in a read-only console.
    BINDINGS = [
        Binding("t", "toggle_view", "GPU / host processes", id="processes.toggle"),
        Binding("S", "stacks", "Stack", id="processes.stacks"),  # the process's py-spy stack (reads only)
    ] + action_bindings(TARGET_PROCESS)

    view = VIEW_BOTH

    def make_tables(self) -> List[SortedTable]:
        gpu: DataTable = DataTable(cursor_type="row", zebra_stripes=True, id="gpu-processes")
        host: DataTable = DataTable(cursor_type="row", zebra_stripes=True, id="host-processes")
        return [SortedTable(gpu, PROCESS_SORT_KEYS), SortedTable(host, PROCESS_SORT_KEYS)]

    def compose_tables(self) -> ComposeResult:
        gpu, host = self.tables
        self.gpu_label = Static("GPU compute processes", classes="pane-section", markup=False)
        self.host_label = Static("Host processes, by CPU", classes="pane-section", markup=False)
        yield self.gpu_label
        yield gpu.table
        yield self.host_label
        yield host.table

    @property
    def gpu_table(self) -> SortedTable:
        return self.tables[0]

    @property
    def host_table(self) -> SortedTable:
        return self.tables[1]

    def _layout(self) -> None:
        """Node column only when several nodes are shown; show the tables `view` asks for."""
        with_node = self.node is None and len(self.states) > 1
        lead = (NODE_COLUMN,) if with_node else ()
        self.gpu_table.set_columns(lead + GPU_PROCESS_COLUMNS)
        self.host_table.set_columns(lead + HOST_PROCESS_COLUMNS)
        show_gpu, show_host = self.view != VIEW_HOST, self.view != VIEW_GPU
        self.gpu_label.display = self.gpu_table.table.display = show_gpu
        self.host_label.display = self.host_table.table.display = show_host

    def draw(self) -> List[str]:
        self._layout()
        parts: List[str] = []
        stuck = 0
        for sorted_table, kind, noun in (
            (self.gpu_table, GPU_PROCESSES, "GPU processes"),
            (self.host_table, HOST_PROCESSES, "host processes"),
        ):
            rows = filter_rows(process_rows(self.states, self.node, kind), self.filter, self.filter_fields)
            columns = sorted_table.columns
            sorted_table.show(rows, lambda row: process_table_row(row, columns))
            stuck += sum(1 for row in rows if row.stuck)
            if sorted_table.table.display:
                parts.append(self.count_part(sorted_table, noun))
        if stuck:
            parts.append("%d in D/Z state" % stuck)
        active = self.active_table()
        if active is not None:
            parts.append("sort: " + active.sort_label())
        stale = [s.name for s in self.states.values() if not s.is_live and s.frame is not None]
        if self.node is not None:
            stale = [name for name in stale if name == self.node]
        if stale:
            parts.append("last frame of " + ", ".join(stale))
        return parts

    def action_toggle_view(self) -> None:
        """Cycle: both tables, GPU processes only, host processes only."""
        self.view = VIEW_MODES[(VIEW_MODES.index(self.view) + 1) % len(VIEW_MODES)]
        focused = self.screen.focused
        self.redraw()
        shown = [t.table for t in self.tables if t.table.display]
        if shown and (focused is None or not focused.display):
            shown[0].focus()

    def action_stacks(self) -> None:
        """The py-spy stack of the highlighted process (`a` there widens to every rank of every node)."""
        from opsconsole.tui.stacks import open_stacks

        found = self.highlighted_process()
        if found is None:
            open_stacks(self.app)
            return
        open_stacks(self.app, nodes=[found[0]], pid=found[1])

    def highlighted_process(self) -> Optional[Tuple[str, int]]:
        """(node, pid) of the row under the cursor of the active table, None when there is none."""
        active = self.active_table()
        if active is None or active.table.row_count == 0:
            return None
        table = active.table
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # a cursor past the rows after a filter: nothing selected
            return None
        if not key:
            return None
        node, _, rest = key.partition("@")[0].rpartition("/")  # "node/pid@gpu" or "node/pid"
        try:
            return node, int(rest)
        except ValueError:
            return None

    def action_target(self, action_id: str) -> Optional[Target]:
        found = self.highlighted_process()
        if found is None:
            return None
        node, pid = found
        state = self.states.get(node)
        proc = reported_process(state.frame if state is not None else None, pid)
        return Target(TARGET_PROCESS, node, pid=pid, name=proc.name if proc is not None else "")
