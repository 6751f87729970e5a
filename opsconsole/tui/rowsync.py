"""Keep a DataTable equal to a list of rows by changing only the cells that differ."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from rich.text import Text
from textual.widgets import DataTable

StyledCell = Tuple[str, str]  # (text, rich style); compared as a pair, so a recolour is a change
Row = Tuple[str, Sequence[StyledCell]]  # (row key, one cell per column)


def styled(cell: StyledCell) -> Text:
    """The Text a DataTable shows for a cell (no markup parsing: process names may hold brackets)."""
    text, style = cell
    return Text(text, style=style, no_wrap=True, overflow="ellipsis", end="")


class RowSync:
    """Owns the rows of one DataTable: adds, removes and updates by row key, never clears per tick."""

    def __init__(self, table: DataTable, column_keys: Sequence[str]) -> None:
        self.table = table
        self.column_keys = list(column_keys)
        self._rendered: Dict[str, List[StyledCell]] = {}  # what the table shows now, by row key
        self._order: List[str] = []
        self.cells_updated = 0  # for tests and benchmarks: how many update_cell calls were made
        self.rebuilds = 0

    @property
    def row_keys(self) -> List[str]:
        return list(self._order)

    def sync(self, rows: Sequence[Row]) -> None:
        """Make the table show `rows`, in order, touching only what changed."""
        wanted = [key for key, _ in rows]
        cells = {key: list(values) for key, values in rows}
        with self.table.app.batch_update():
            if wanted != self._order:
                self._change_row_set(wanted, cells)
            for key in wanted:
                old = self._rendered.get(key)
                new = cells[key]
                if old is None:
                    continue  # added just now with its values
                for column, (before, after) in enumerate(zip(old, new)):
                    if before != after:
                        self.table.update_cell(key, self.column_keys[column], styled(after), update_width=False)
                        self.cells_updated += 1
                self._rendered[key] = new

    def _change_row_set(self, wanted: List[str], cells: Dict[str, List[StyledCell]]) -> None:
        gone = [key for key in self._order if key not in cells]
        for key in gone:
            self.table.remove_row(key)
            del self._rendered[key]
        kept = [key for key in self._order if key in cells]
        added = [key for key in wanted if key not in self._rendered]
        if kept + added != wanted:
            # The order changed, not just the set: DataTable can only append, so lay it out again.
            self.table.clear()
            self._rendered.clear()
            self.rebuilds += 1
            added = wanted
        for key in added:
            self.table.add_row(*[styled(cell) for cell in cells[key]], key=key)
            self._rendered[key] = cells[key]
        self._order = list(wanted)

    def cell(self, row_key: str, column_key: str) -> Optional[StyledCell]:
        """What a cell shows now (for tests)."""
        row = self._rendered.get(row_key)
        if row is None:
            return None
        return row[self.column_keys.index(column_key)]
