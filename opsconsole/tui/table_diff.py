"""Bring a DataTable to a new list of rows in place: add, remove, update changed cells, reorder.

Panes compute their rows (already filtered and sorted) every tick; rebuilding the table
would reset the cursor and scroll and redraw everything, so this applies only the difference.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from rich.text import Text
from textual.widgets import DataTable

from opsconsole.model import frozen
from opsconsole.sanitize import printable_line
from opsconsole.tui.formatting import NA, printable_text


class TableRow(NamedTuple):
    """A row to show: its stable key and one cell per column, in column order.

    `cells` None means "unchanged since the last apply": the row keeps its cells (it must
    already be in the table), which spares formatting and comparing rows that did not change.
    """

    key: str
    cells: Optional[Tuple[Any, ...]]


StyledCell = Tuple[str, str]  # (text, rich style): the cells the GPUs and Host panes build


def styled_text(cell: StyledCell) -> Text:
    """The Text a DataTable shows for a styled cell (no markup parsing: process names may hold brackets)."""
    text, style = cell
    return Text(printable_line(text), style=style, no_wrap=True, overflow="ellipsis", end="")


def styled_row(key: str, cells: Sequence[StyledCell]) -> TableRow:
    """A TableRow from (text, style) pairs."""
    return TableRow(key, tuple(styled_text(cell) for cell in cells))


@frozen
class TableDiff:
    """What one `apply_rows` changed (for tests and benchmarks)."""

    added: int = 0
    removed: int = 0
    updated_cells: int = 0
    reordered: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.updated_cells or self.reordered)


def as_cell(value: Any) -> Any:
    """A cell value safe to show: strings become plain Text so `[` in a command is not markup,
    and control characters (an ESC in a command line) are made visible, never sent to the terminal.

    A row is one line: a newline or tab is made visible too. Kept, a newline hid what followed it
    (two nodes named "gpu\n1" and "gpu\n2" both read "gpu") and a tab was widened to spaces.
    """
    if value is None:
        return Text(NA, end="")
    if isinstance(value, str):
        return Text(printable_line(value), end="")
    if isinstance(value, Text):
        return printable_text(value, one_line=True)
    return value


def same_cell(old: Any, new: Any) -> bool:
    """Whether two cells look the same; Text's own == ignores the base style, which we change."""
    if isinstance(old, Text) and isinstance(new, Text):
        return old.plain == new.plain and old.style == new.style and old.spans == new.spans
    return type(old) is type(new) and old == new


def row_keys_in_order(table: DataTable) -> List[str]:
    """The keys of the table's rows as they appear on screen."""
    return [row.key.value for row in table.ordered_rows]


def _cursor_key(table: DataTable) -> Any:
    if table.row_count == 0 or not table.is_valid_row_index(table.cursor_row):
        return None
    return table.ordered_rows[table.cursor_row].key


def _reorder(table: DataTable, order: Sequence[str], stored: Dict[str, List[Any]]) -> None:
    """Put the rows in `order` with the public `sort()`, keyed on the identity of stored cells.

    DataTable has no "move row"; its sort hands the key function only cell values, so each
    row is recognised by the ids of its stored cell objects (kept alive by the table itself).
    `stored` holds the cells just written, by key; other rows are read from the table.
    """
    rank: Dict[Tuple[int, ...], List[int]] = {}
    for position, key in enumerate(order):
        cells = stored.get(key)
        ids = tuple(id(cell) for cell in (cells if cells is not None else table.get_row(key)))
        rank.setdefault(ids, []).append(position)

    def position_of(cells: Any) -> int:
        values = cells if isinstance(cells, tuple) else (cells,)
        # Rows whose every cell is the same object look identical; take their places in turn.
        return rank[tuple(id(cell) for cell in values)].pop(0)

    table.sort(key=position_of)


# Rows whose changed cells are repainted one by one; more, and the whole table is (finding a row's
# place on screen walks the rows before it).
ROW_REPAINT_LIMIT = 16


@contextmanager
def _cells_without_repaint(table: DataTable) -> Iterator[None]:
    """DataTable.update_cell repaints the whole table, header and every row, for one cell: on a
    live pane that re-sent the header and unchanged rows to the terminal each second. Held here,
    so the caller repaints only the rows it changed (refresh_row)."""
    table.refresh = lambda *regions, **options: table  # type: ignore[method-assign]
    try:
        yield
    finally:
        del table.refresh


def apply_rows(table: DataTable, rows: Sequence[TableRow]) -> TableDiff:
    """Make `table` show `rows`, in that order, touching only what changed.

    Rows are matched by key; a changed cell is written with update_cell(update_width=False)
    so columns keep their width; the cursor stays on the row it was on. A duplicate key
    keeps its first row. Never calls `clear()`.
    """
    cursor_key = _cursor_key(table)
    wanted: Dict[str, TableRow] = {}
    for row in rows:
        wanted.setdefault(row.key, row)

    removed = 0
    for key in [row_key.value for row_key in list(table.rows)]:
        if key not in wanted:
            table.remove_row(key)
            removed += 1

    added = updated = 0
    repaint: List[str] = []  # rows with a changed cell
    column_keys = [column.key for column in table.ordered_columns]
    stored: Dict[str, List[Any]] = {}  # the cells the table now holds, for rows we touched
    for key, row in wanted.items():
        if row.cells is None:
            if key not in table.rows:
                raise ValueError("row %r marked unchanged is not in the table" % key)
            continue
        cells = [as_cell(value) for value in row.cells]
        if key not in table.rows:
            table.add_row(*cells, key=key)
            stored[key] = cells
            added += 1
            continue
        kept = table.get_row(key)
        changes = [
            (position, column_key, new)
            for position, (column_key, old, new) in enumerate(zip(column_keys, kept, cells))
            if not same_cell(old, new)
        ]
        if changes:
            with _cells_without_repaint(table):
                for position, column_key, new in changes:
                    table.update_cell(key, column_key, new, update_width=False)
                    kept[position] = new
            updated += len(changes)
            repaint.append(key)
        stored[key] = kept

    order = list(wanted)
    reordered = row_keys_in_order(table) != order
    if reordered:
        _reorder(table, order, stored)
    if repaint:
        if added or removed or reordered or len(repaint) > ROW_REPAINT_LIMIT:
            table.refresh()
        else:
            for key in repaint:
                table.refresh_row(table.get_row_index(key))

    if cursor_key is not None and cursor_key in table.rows:
        index = table.get_row_index(cursor_key)
        if index != table.cursor_row:
            table.move_cursor(row=index, animate=False)
    return TableDiff(added=added, removed=removed, updated_cells=updated, reordered=reordered)
