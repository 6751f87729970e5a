"""What the table panes share: columns, a sort state per table, the filter, and a status line.

A `TablePane` keeps the last `show()` arguments so that a sort key or a new filter redraws
at once, without waiting for the next tick. Each table is a `SortedTable`: a DataTable plus
its columns and sort state; rows reach it through `table_diff.apply_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from opsconsole.fleet_view import NO_FILTER, FilterFields, ParsedFilter, parse_filter, sort_rows
from opsconsole.model import NodeState
from opsconsole.tui.formatting import counted, printable_text
from opsconsole.tui.pane import Pane
from opsconsole.tui.table_diff import TableDiff, TableRow, apply_rows

# Most rows one table draws per tick: the diff is linear in rows, so this bounds a tick's work.
MAX_ROWS = 2000
SORT_ARROWS = {False: "▲", True: "▼"}


# Which way a column sorts when a press of `s` or a click on its header first reaches it: one rule for
# every table pane (Processes, Nodes, Cluster GPUs), by the column's key. A column of one of these
# quantities starts largest first (the busiest, fullest, hottest, most power-hungry first: what `top` and
# nvitop show first); every other one smallest first (names, states, ages, counts, ids).
LARGEST_FIRST = frozenset(
    {
        "util",  # GPU utilisation: a GPU's (Cluster GPUs)
        "util_mean",  # a node's mean (Nodes)
        "util_max",  # a node's busiest GPU (Nodes)
        "sm",  # a process's SM share (Processes)
        "memory",  # GPU memory used: a GPU's, a node's (Cluster GPUs, Nodes)
        "mem_percent",  # the same as a share (Cluster GPUs)
        "gpu_memory",  # a process's GPU memory (Processes)
        "rss",  # a process's resident memory (Processes)
        "cpu",  # a process's CPU (Processes)
        "temp",  # a GPU's temperature, a node's hottest GPU
        "power",  # a GPU's draw, a node's sum
        "errors",  # a node's error count: the nodes with errors first
    }
)


@dataclass(frozen=True)
class Column:
    """A table column: key (also its sort key), header label, fixed width (None: fit content); whether
    sorting by it starts largest first is LARGEST_FIRST's rule, by the key."""

    key: str
    label: str
    width: Optional[int] = None
    sortable: bool = True

    @property
    def largest_first(self) -> bool:
        return self.key in LARGEST_FIRST


CELL_PADDING = 2  # DataTable draws one cell of padding on each side of a column


def drop_until_fits(
    columns: Sequence[Column], width: int, drop_order: Sequence[str], flexible: str, minimum: int, auto_width: int = 0
) -> Tuple[List[Column], int]:
    """(the columns kept, the cells left for column `flexible`): columns of `drop_order` go, first to go
    first, until `flexible` gets `minimum` of `width` cells or none is left to drop. A column without a
    width counts as `auto_width` (it sizes itself to its content); one cell more than a label for its
    sort arrow."""
    kept = list(columns)
    droppable = [key for key in drop_order if any(c.key == key for c in kept)]
    while True:
        fixed = sum(
            max(auto_width if c.width is None else c.width, len(c.label) + 1) + CELL_PADDING
            for c in kept
            if c.key != flexible
        )
        room = width - fixed - CELL_PADDING
        if room >= minimum or not droppable:
            return kept, room
        gone = droppable.pop(0)
        kept = [c for c in kept if c.key != gone]


class SortState:
    """Which column a table is sorted by (None: config order) and in which direction.

    With a `default` (column, reverse) the table is always sorted by a column: it starts
    there and `cycle` goes round the columns without a "config order" step (process lists
    have no config order worth showing).
    """

    def __init__(
        self, keys: Sequence[str], default: Optional[Tuple[str, bool]] = None, largest_first: Sequence[str] = ()
    ) -> None:
        self.keys = list(keys)
        self.largest_first = frozenset(largest_first)  # columns whose first direction is descending
        self.default = default if default is not None and default[0] in self.keys else None
        self.column: Optional[str] = self.default[0] if self.default else None
        self.reverse = self.default[1] if self.default else False

    def natural_reverse(self, key: Optional[str]) -> bool:
        """The direction a column starts in: descending (True) for a largest-first column."""
        return key in self.largest_first

    def cycle(self) -> None:
        """Next sort column: config order, then each column in turn, then config order again; each
        column in its natural direction (a cycle from CPU▼ goes to RSS▼, not RSS▲)."""
        if self.column is None:
            self.column = self.keys[0] if self.keys else None
        else:
            position = self.keys.index(self.column) if self.column in self.keys else -1
            following = self.keys[position + 1] if position + 1 < len(self.keys) else None
            self.column = following if following is not None or self.default is None else self.keys[0]
        self.reverse = self.natural_reverse(self.column)

    def toggle_reverse(self) -> None:
        self.reverse = not self.reverse

    def sort_by(self, key: str) -> None:
        """Sort by `key`; asked again for the same column, flip the direction."""
        if key not in self.keys:
            return
        if self.column == key:
            self.reverse = not self.reverse
        else:
            self.column, self.reverse = key, self.natural_reverse(key)


class SortedTable:
    """One DataTable with its columns and sort; `show()` sorts, caps and applies rows."""

    def __init__(
        self,
        table: DataTable,
        sort_keys: Mapping[str, Callable[[Any], Any]],
        default_sort: Optional[Tuple[str, bool]] = None,
        max_rows: int = MAX_ROWS,
    ) -> None:
        self.table = table
        self.sort_keys = sort_keys
        self.default_sort = default_sort
        self.max_rows = max_rows
        self.columns: List[Column] = []
        self.sort = SortState([])
        self.total = 0  # rows before the cap, for the status line
        self.last_diff = TableDiff()
        self._signatures: Dict[str, Any] = {}  # key -> what its cells were made from

    def set_columns(self, columns: Sequence[Column]) -> None:
        """Lay out the columns; only a different layout rebuilds the table (never per tick)."""
        columns = list(columns)
        if [c.key for c in columns] == [c.key for c in self.columns]:
            return
        if self.columns:
            self.table.clear(columns=True)
        self.columns = columns
        self._signatures.clear()
        for column in columns:
            # One spare cell for the sort arrow, so marking the sort never resizes a column.
            width = None if column.width is None else max(column.width, len(column.label) + 1)
            self.table.add_column(Text(column.label + " "), width=width, key=column.key)
        keys = [c.key for c in columns if c.sortable and c.key in self.sort_keys]
        old = self.sort
        self.sort = SortState(keys, self.default_sort, [c.key for c in columns if c.largest_first])
        if old.column in keys:
            self.sort.column, self.sort.reverse = old.column, old.reverse
        self.mark_sorted_column()

    def fit_columns(self, columns: Sequence[Column]) -> None:
        """Lay out `columns` where only their widths changed without rebuilding the table: the rows, the
        cursor and the scroll stay (a rebuild puts the cursor back on the first row). Other changes
        rebuild it. Every row is formatted again at the next `show()`: its cells may depend on a width."""
        columns = list(columns)
        if columns == self.columns:
            return
        if [(c.key, c.label, c.sortable) for c in columns] != [(c.key, c.label, c.sortable) for c in self.columns]:
            if self.columns:
                self.table.clear(columns=True)
                self.columns = []
            self.set_columns(columns)
            return
        for column in columns:
            drawn = self.table.columns[column.key]
            drawn.width = 0 if column.width is None else max(column.width, len(column.label) + 1)
            drawn.auto_width = column.width is None
        self.columns = columns
        self._signatures.clear()
        self.table._require_update_dimensions = True  # no public way to resize a column in place
        self.table.refresh()

    def mark_sorted_column(self) -> None:
        """Put ▲ or ▼ after the label of the sort column."""
        for column in self.columns:
            arrow = SORT_ARROWS[self.sort.reverse] if column.key == self.sort.column else " "
            self.table.columns[column.key].label = Text(column.label + arrow)
        self.table.notify_style_update()  # the header is cached by DataTable

    def sort_label(self) -> str:
        """What the status line says of the sort: the sorted column's header as drawn (`CPU▼`)."""
        if self.sort.column is None:
            return "config order" + (" reversed" if self.sort.reverse else "")
        label = next((c.label for c in self.columns if c.key == self.sort.column), self.sort.column)
        return label + SORT_ARROWS[self.sort.reverse]

    def show(
        self,
        rows: Sequence[Any],
        to_table_row: Callable[[Any], TableRow],
        signature: Callable[[Any], Any] = lambda row: row,
        presorted: bool = False,
    ) -> TableDiff:
        """Sort `rows` (unless `presorted`: a tree's order), keep the first max_rows, and apply them in place.

        `signature(row)` is everything a row's cells are made from (by default the frozen
        row itself); a row whose signature did not change is not formatted again.
        """
        value_of = self.sort_keys.get(self.sort.column) if self.sort.column else None
        ordered = list(rows) if presorted else sort_rows(rows, value_of, self.sort.reverse)
        ordered = ordered[: self.max_rows]
        self.total = len(rows)
        previous, current = self._signatures, {}
        table_rows = []
        for row in ordered:
            table_row_key = row.key
            mark = signature(row)
            current[table_row_key] = mark
            if table_row_key in previous and previous[table_row_key] == mark and table_row_key in self.table.rows:
                table_rows.append(TableRow(table_row_key, None))
            else:
                table_rows.append(to_table_row(row))
        self._signatures = current
        self.last_diff = apply_rows(self.table, table_rows)
        return self.last_diff


class TablePane(Pane):
    """A Pane of one or more sortable tables under a one-line status, with the `/` filter."""

    DEFAULT_CSS = """
    TablePane {
        height: 1fr;
        layout: vertical;
    }
    TablePane > .pane-status {
        height: 1;
        padding: 0 1;
        color: $text-muted;
    }
    TablePane > DataTable {
        height: 1fr;
    }
    """

    BINDINGS = [
        Binding("s", "cycle_sort", "Sort", id="table.sort"),
        Binding("r", "reverse_sort", "Reverse", id="table.reverse"),
    ]

    filter_fields: ClassVar[FilterFields]

    def __init__(self, *, name: Optional[str] = None, id: Optional[str] = None, classes: Optional[str] = None):
        super().__init__(name=name, id=id, classes=classes)
        self.states: Mapping[str, NodeState] = {}
        self.node: Optional[str] = None
        self.now = 0.0
        self.filter: ParsedFilter = NO_FILTER
        self.status = Static("", classes="pane-status", markup=False)
        self._tables: Dict[int, SortedTable] = {}

    # --- what subclasses provide ---------------------------------------------------------

    def make_tables(self) -> List[SortedTable]:
        """The pane's tables, in display order (called once, before compose)."""
        raise NotImplementedError

    def compose_tables(self) -> ComposeResult:
        for sorted_table in self.tables:
            yield sorted_table.table

    def draw(self) -> List[str]:
        """Fill the tables from self.states/node/now/filter; return parts for the status line."""
        raise NotImplementedError

    # --- plumbing ------------------------------------------------------------------------

    @property
    def tables(self) -> List[SortedTable]:
        if not self._tables:
            for sorted_table in self.make_tables():
                self._tables[id(sorted_table.table)] = sorted_table
        return list(self._tables.values())

    def compose(self) -> ComposeResult:
        yield self.status
        yield from self.compose_tables()

    def on_mount(self) -> None:
        self.redraw()

    def show(self, states: Mapping[str, NodeState], node: Optional[str], now: float) -> None:
        """Draw `states` (config order); `node` is the node drilled into, None = all."""
        self.states, self.node, self.now = states, node, now
        self.redraw()

    def apply_filter(self, text: str) -> None:
        """Filter rows with the fleet_view filter language; a bad term shows in the status line."""
        self.filter = parse_filter(text or "", self.filter_fields)
        self.redraw()

    def redraw(self) -> None:
        """Redraw from the last `show()` arguments (after a sort or filter change, too)."""
        if not self.is_mounted:
            return
        parts = self.draw()
        status = Text(" · ".join(part for part in parts if part))
        if self.filter.text.strip():
            status.append(" · filter: %s" % self.filter.text.strip())
        if self.filter.error:
            status.append(" · " + self.filter.error, style="bold red")
        self.status.update(printable_text(status))

    def count_part(self, sorted_table: SortedTable, noun: str) -> str:
        """`12 GPUs`, or `2000 of 8000 GPUs` when the cap cut rows."""
        shown = sorted_table.table.row_count
        if sorted_table.total > shown:
            return "%d of %d %s" % (shown, sorted_table.total, noun)
        return counted(shown, noun)

    def active_table(self) -> Optional[SortedTable]:
        """The table `s` and `r` act on: the focused one, else the first one shown."""
        focused = self.screen.focused if self.is_attached else None
        if focused is not None and id(focused) in self._tables:
            return self._tables[id(focused)]
        shown = [t for t in self.tables if t.table.display]
        return shown[0] if shown else None

    def action_cycle_sort(self) -> None:
        """Sort the active table by the next column."""
        sorted_table = self.active_table()
        if sorted_table is not None:
            sorted_table.sort.cycle()
            sorted_table.mark_sorted_column()
            self.redraw()

    def action_reverse_sort(self) -> None:
        """Flip the active table's sort direction."""
        sorted_table = self.active_table()
        if sorted_table is not None:
            sorted_table.sort.toggle_reverse()
            sorted_table.mark_sorted_column()
            self.redraw()

    @on(DataTable.HeaderSelected)
    def sort_by_clicked_header(self, event: DataTable.HeaderSelected) -> None:
        sorted_table = self._tables.get(id(event.data_table))
        if sorted_table is None:
            return
        event.stop()
        sorted_table.sort.sort_by(event.column_key.value)
        sorted_table.mark_sorted_column()
        self.redraw()
