"""A pane drawn by hand from its last `show()`, so a filter or theme change redraws at once."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from textual.css.query import NoMatches
from textual.widgets import DataTable

from opsconsole.model import NodeState
from opsconsole.tui.pane import Pane
from opsconsole.tui.table_diff import TableRow, apply_rows


class LivePane(Pane):
    """Keeps the last `show()` arguments and the `/` filter text; subclasses implement `draw()`."""

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.filter_text = ""
        self.cells_updated = 0  # for tests and benchmarks: cells rewritten in place so far
        self._last: Optional[tuple] = None
        self._can_draw = False  # draw() needs the composed widgets and the app's theme

    def on_mount(self) -> None:
        self._can_draw = True
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.redraw())

    def draw(self, states: Mapping[str, NodeState], node: Optional[str], now: float) -> None:
        """Bring the pane's widgets to these states."""
        raise NotImplementedError

    def on_unmount(self) -> None:
        self._can_draw = False

    def show(self, states: Mapping[str, NodeState], node: Optional[str], now: float) -> None:
        self._last = (states, node, now)
        if not self._can_draw:
            return
        try:
            self.draw(states, node, now)
        except NoMatches:
            # The app is closing: its screen's widgets are removed (children first) while the
            # redraw timer still ticks. Nothing is left to draw on.
            if self.is_attached and not (self._pruning or self._closing):
                raise

    def apply_filter(self, text: str) -> None:
        self.filter_text = text
        self.redraw()

    def redraw(self) -> None:
        """Draw the last `show()` again (after a filter, theme or size change)."""
        if self._last is not None:
            self.show(*self._last)

    def sync_table(self, table: DataTable, rows: Sequence[TableRow]) -> None:
        """Apply `rows` to `table` in place, in one batch, counting the cells rewritten."""
        with self.app.batch_update():
            self.cells_updated += apply_rows(table, rows).updated_cells
