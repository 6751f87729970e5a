"""The Processes pane: GPU compute processes above, every host process below.

The host table lists all the node's processes (kernel threads hidden until `T`), so an idle
or D-state process (a hung data-loader worker holds no GPU memory and no CPU) is always
there to find, filter and pick; D and Z rows are highlighted. `t` shows the host processes
as a tree (as htop's `t`), `enter` opens a process's details, read on its node.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from opsconsole.actions.registry import TARGET_PROCESS, Target
from opsconsole.actions.signals import reported_process
from opsconsole.fleet_view import (
    GPU_PROCESSES,
    HOST_PROCESSES,
    PROCESS_FILTER,
    PROCESS_SORT_KEYS,
    ProcessRow,
    filter_rows,
    process_rows,
    process_tree,
)
from opsconsole.nodes.base import is_replayed
from opsconsole.tui.action_flow import ActionKeys, action_bindings
from opsconsole.tui.formatting import (
    NA,
    PROCESS_STATE_STYLES,
    STALE_ROW_STYLE,
    format_bytes,
    format_duration,
    format_percent,
    shorten,
)
from opsconsole.tui.table_diff import TableRow
from opsconsole.tui.table_pane import Column, SortedTable, TablePane, drop_until_fits

USER_WIDTH = 12
# The command column takes what the others leave (no fixed width): at 300 columns a command
# line shows 200+ characters; the probe sends at most 512.
COMMAND_CHARS = 512
# A node's whole process list: rows are updated in place (table_diff), and DataTable draws
# only the lines on screen, so thousands of rows cost little once they are in.
MAX_HOST_ROWS = 10000

# `v` cycles what the pane shows.
VIEW_BOTH, VIEW_GPU, VIEW_HOST = "both", "gpu", "host"
VIEW_MODES = (VIEW_BOTH, VIEW_GPU, VIEW_HOST)

NODE_COLUMN = Column("node", "Node")
JOB_WIDTH = 12  # a Slurm job id ("812", "812_3") or a container ("docker/2403ccfe427f")
GPU_PROCESS_COLUMNS = (
    Column("pid", "PID", 7),
    Column("user", "User", USER_WIDTH),
    Column("gpu", "GPU", 3),
    Column("gpu_memory", "GPU mem", 9),
    Column("sm", "SM", 5),
    Column("cpu", "CPU", 6),
    Column("rss", "RSS", 9),
    Column("elapsed", "Elapsed", 7),  # the newest first: what just started
    Column("state", "S", 2),
    Column("job", "Job", JOB_WIDTH),
    Column("command", "Command"),
)
HOST_PROCESS_COLUMNS = tuple(c for c in GPU_PROCESS_COLUMNS if c.key not in ("gpu", "gpu_memory", "sm", "job"))
# What a narrow terminal gives up first, so the command (what runs there) keeps COMMAND_MIN cells:
# at 80 columns every other column took the row and the command was off screen.
DROP_ORDER = ("job", "elapsed", "rss", "state", "user", "cpu")
COMMAND_MIN = 20
NODE_COLUMN_GUESS = 12  # the Node column sizes itself to the names; a name's usual width
GPU_DEFAULT_SORT = ("gpu_memory", True)  # the biggest GPU users first
HOST_DEFAULT_SORT = ("cpu", True)  # the busiest first, as top and htop start


def fitted_columns(columns: Sequence[Column], width: int) -> Tuple[Column, ...]:
    """`columns` with those of DROP_ORDER left out, first to go first, until the command gets COMMAND_MIN
    cells of `width` (or nothing is left to drop)."""
    if width <= 0:  # not laid out yet
        return tuple(columns)
    return tuple(drop_until_fits(columns, width, DROP_ORDER, "command", COMMAND_MIN, NODE_COLUMN_GUESS)[0])


def row_style(row: ProcessRow) -> str:
    """D/Z rows stand out; rows of a node that is not live are dimmed."""
    state_style = PROCESS_STATE_STYLES.get((row.proc_state or "")[:1])
    if state_style:
        return state_style
    return "" if row.live else STALE_ROW_STYLE


def process_table_row(row: ProcessRow, columns: Sequence[Column], tree_prefix: str = "") -> TableRow:
    """The cells of `row` for the given column layout (the command after its tree branch, in a tree)."""
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
        "job": shorten(row.job_id or row.container, JOB_WIDTH) or "-",  # whose job (probe/jobs.py)
        "command": tree_prefix + (shorten(row.command, COMMAND_CHARS) or NA),
    }
    return TableRow(row.key, tuple(Text(values[c.key], style=style, end="") for c in columns))


def row_signature(row: ProcessRow) -> tuple:
    """What a row's cells show: its elapsed time as drawn (the number moves every frame; `2h12m` once a minute)."""
    return (
        row.cpu_percent,
        row.rss,
        row.proc_state,
        row.user,
        row.command,
        row.gpu_memory,
        row.sm_percent,
        row.live,
        row.node_state,
        format_duration(row.elapsed),
        row.job_id,
        row.container,
    )


class ProcessTable(DataTable):
    """A DataTable whose cursor runs on into the table below at its last row (and back up at its first),
    so the GPU and host tables read as one list by keyboard."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.below: Optional[DataTable] = None
        self.above: Optional[DataTable] = None

    def action_cursor_down(self) -> None:
        if self.row_count and self.cursor_row >= self.row_count - 1 and _enter(self.below, first=True):
            return
        super().action_cursor_down()

    def action_cursor_up(self) -> None:
        if self.cursor_row <= 0 and _enter(self.above, first=False):
            return
        super().action_cursor_up()


def _enter(table: Optional[DataTable], first: bool) -> bool:
    """Focus `table` on its first (or last) row; False when it is hidden or empty."""
    if table is None or not table.display or table.row_count == 0:
        return False
    table.move_cursor(row=0 if first else table.row_count - 1, animate=False)
    table.focus()
    return True


class ProcessesPane(ActionKeys, TablePane):
    """GPU compute processes and all host processes, with a node column for several nodes.

    Keys: `v` cycles both / GPU only / host only; `t` tree; `T` kernel threads; `enter`
    details; `s` next sort column and `r` reverse (on the focused table), header click
    sorts; up/down run from one table into the other. Filter: free text on command, user,
    pid and node; `user:alice`, `gpu:0`, `pid:421`, `node:gpu01`, `state:D`, `cpu>50`, `sm>90`,
    `job:812` (a GPU process's Slurm job, or `job:docker/*` its container; the Job column).
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
    ProcessesPane > #gpu-processes {
        height: auto;
        max-height: 40%;
    }
    """

    # Signals for the highlighted process (i, x, K, e): absent in a read-only console.
    BINDINGS = [
        Binding("v", "toggle_view", "GPU / host processes", id="processes.toggle"),
        Binding("t", "toggle_tree", "Tree", id="processes.tree"),
        Binding("T", "toggle_kernel_threads", "Kernel threads", id="processes.kernel"),
        Binding("enter", "details", "Details", id="processes.details"),
        Binding("S", "stacks", "Stack", id="processes.stacks"),  # the process's py-spy stack (reads only)
    ] + action_bindings(TARGET_PROCESS)

    view = VIEW_BOTH
    tree = False
    show_kernel_threads = False

    def make_tables(self) -> List[SortedTable]:
        gpu = ProcessTable(id="gpu-processes")
        host = ProcessTable(id="host-processes")
        gpu.below, host.above = host, gpu
        return [
            SortedTable(gpu, PROCESS_SORT_KEYS, default_sort=GPU_DEFAULT_SORT),
            SortedTable(host, PROCESS_SORT_KEYS, default_sort=HOST_DEFAULT_SORT, max_rows=MAX_HOST_ROWS),
        ]

    def compose_tables(self) -> ComposeResult:
        gpu, host = self.tables
        self.gpu_label = Static("GPU compute processes", classes="pane-section", markup=False)
        self.host_label = Static("Host processes", classes="pane-section", markup=False)
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
        width = self.size.width - 2
        self.gpu_table.set_columns(fitted_columns(lead + GPU_PROCESS_COLUMNS, width))
        self.host_table.set_columns(fitted_columns(lead + HOST_PROCESS_COLUMNS, width))
        show_gpu, show_host = self.view != VIEW_HOST, self.view != VIEW_GPU
        self.gpu_label.display = self.gpu_table.table.display = show_gpu
        self.host_label.display = self.host_table.table.display = show_host

    def on_resize(self) -> None:
        self.redraw()  # the columns follow the width

    def draw(self) -> List[str]:
        self._layout()
        parts: List[str] = []
        gpu_rows = filter_rows(process_rows(self.states, self.node, GPU_PROCESSES), self.filter, self.filter_fields)
        self.gpu_table.show(
            gpu_rows, lambda row: process_table_row(row, self.gpu_table.columns), signature=row_signature
        )
        host_all = process_rows(self.states, self.node, HOST_PROCESSES)
        kernel = sum(1 for row in host_all if row.kernel_thread)
        shown = host_all if self.show_kernel_threads else [row for row in host_all if not row.kernel_thread]
        host_rows = filter_rows(shown, self.filter, self.filter_fields)
        self._show_host(host_rows)
        stuck = sum(1 for row in gpu_rows if row.stuck) + sum(1 for row in host_rows if row.stuck)
        if self.gpu_table.table.display:
            parts.append(self.count_part(self.gpu_table, "GPU processes"))
        host_part = ""
        if self.host_table.table.display:
            host_part = self.count_part(self.host_table, "host processes")
            if kernel:
                host_part += " (%d kernel threads %s: T)" % (kernel, "shown" if self.show_kernel_threads else "hidden")
            parts.append(host_part)
            if self.tree:
                parts.append("tree")
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
        if host_part and kernel and len(" · ".join(parts)) > self.app.size.width - 2:
            # At 80 columns the kernel-thread note pushed the sort label off the line: "(24 hidden: T)".
            parts = [part.replace(" kernel threads ", " ", 1) if part is host_part else part for part in parts]
        self._keep_focus_selectable()
        return parts

    def _show_host(self, rows: List[ProcessRow]) -> None:
        table = self.host_table
        columns = table.columns
        if not self.tree:
            table.show(rows, lambda row: process_table_row(row, columns), signature=row_signature)
            return
        value_of = PROCESS_SORT_KEYS.get(table.sort.column) if table.sort.column else None
        placed = process_tree(rows, value_of, table.sort.reverse)
        prefixes = {row.key: prefix for row, prefix in placed}
        table.show(
            [row for row, _ in placed],
            lambda row: process_table_row(row, columns, prefixes[row.key]),
            signature=lambda row: (row_signature(row), prefixes[row.key]),
            presorted=True,
        )

    def _keep_focus_selectable(self) -> None:
        """An empty table takes no focus (so the pane's focus lands where rows are) unless no shown
        table has rows (the pane keeps its keys then), and a focused table that a filter emptied
        hands the focus to the other one."""
        shown = [t.table for t in self.tables if t.table.display]
        with_rows = [table for table in shown if table.row_count]
        for sorted_table in self.tables:
            table = sorted_table.table
            table.can_focus = table in with_rows or (not with_rows and bool(shown) and table is shown[0])
        focused = self.screen.focused if self.is_attached else None
        if focused in (self.gpu_table.table, self.host_table.table) and not focused.row_count and with_rows:
            with_rows[0].focus()

    def action_toggle_view(self) -> None:
        """Cycle: both tables, GPU processes only, host processes only."""
        self.view = VIEW_MODES[(VIEW_MODES.index(self.view) + 1) % len(VIEW_MODES)]
        focused = self.screen.focused
        self.redraw()
        shown = [t.table for t in self.tables if t.table.display and t.table.can_focus]
        if shown and (focused is None or not focused.display or not focused.can_focus):
            shown[0].focus()

    def action_toggle_tree(self) -> None:
        """Host processes as a tree by parent (siblings in the sort order), or a flat list."""
        self.tree = not self.tree
        self.redraw()

    def action_toggle_kernel_threads(self) -> None:
        """Show or hide kernel threads (hidden by default, as htop does)."""
        self.show_kernel_threads = not self.show_kernel_threads
        self.redraw()

    def action_stacks(self) -> None:
        """The py-spy stack of the highlighted process (`a` there widens to every rank of every node)."""
        from opsconsole.tui.stacks import open_stacks

        found = self.highlighted_process()
        if found is None:
            open_stacks(self.app)
            return
        open_stacks(self.app, nodes=[found[0]], pid=found[1])

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        """The status names the sort of the table with the focus: moving between tables redraws it."""
        if event.widget in (self.gpu_table.table, self.host_table.table):
            self.redraw()

    @on(DataTable.RowSelected)
    def open_details_of_selected_row(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_details()

    def action_details(self) -> None:
        """The highlighted process's details: the frame's at once, the node's (command line, rank variables, cgroup) after."""
        found = self.highlighted_process()
        if found is None:
            self.app.notify("no process selected", severity="warning")
            return
        from opsconsole.tui.process_details import ProcessDetailsScreen

        node, pid = found
        state = self.states.get(node)
        link_of = getattr(self.app, "_link_of", None)
        link = link_of(node) if link_of is not None else None
        fleet = getattr(self.app, "fleet", None)
        if link is None and is_replayed(fleet):
            link = fleet  # a replay: the reader says so and asks nothing (it said "no connection to the node")
        self.app.push_screen(ProcessDetailsScreen(node, pid, state.frame if state is not None else None, link))

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
