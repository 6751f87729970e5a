"""Lines of styled text that repaint only the cells that changed.

A Static repaints its whole region on every update: a header whose clock ticks each second
sent both of its lines (about 1 kB) every second, and a GPU block its four. This widget keeps
its lines, compares each new line with the one on screen and marks only the changed runs of
cells dirty (Textual's line API). Textual sends a dirty run from the left edge of the widget
that holds it, so what changes often sits near a widget's left edge (the overview puts the
history sparklines in a widget of their own).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from rich.cells import cell_len
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

CharStyle = Tuple[str, object]


def _styled_chars(text: Text) -> List[CharStyle]:
    """(character, style) for each character: what a cell shows, for comparing two lines."""
    styles: List[object] = [text.style] * len(text.plain)
    for span in text.spans:
        for index in range(max(0, span.start), min(span.end, len(styles))):
            styles[index] = (styles[index], span.style)
    return list(zip(text.plain, styles))


def changed_runs(before: Text, after: Text) -> List[Tuple[int, int]]:
    """The run of cells [start, end) in which `after` differs from `before` on screen; [] when equal."""
    if before.plain == after.plain and before.spans == after.spans and before.style == after.style:
        return []
    if before.spans == after.spans and before.style == after.style:
        old: Sequence[object] = before.plain
        new: Sequence[object] = after.plain
    else:
        old, new = _styled_chars(before), _styled_chars(after)
    # One run per line, first change to last: Textual writes each dirty run from the left edge
    # of its widget, so two runs on a line would send that line's start twice.
    first = 0
    while first < min(len(old), len(new)) and old[first] == new[first]:
        first += 1
    start = cell_len(after.plain[:first])
    last_old, last_new = len(old), len(new)
    while last_old > first and last_new > first and old[last_old - 1] == new[last_new - 1]:
        last_old -= 1
        last_new -= 1
    end_old, end_new = cell_len(before.plain[:last_old]), cell_len(after.plain[:last_new])
    if end_old != end_new:
        # The change moved what follows it (a number grew a digit, a wide character came or went):
        # the common tail now sits in other cells, so every cell to the end of the longer line changed.
        end = max(cell_len(before.plain), cell_len(after.plain))
    else:
        end = end_new
    return [(start, max(end, start + 1))]


class LinesView(Widget):
    """Lines of Rich Text, as tall as they are; `set_lines` repaints only what changed."""

    DEFAULT_CSS = """
    LinesView { height: auto; }
    """

    def __init__(self, *, id: Optional[str] = None, classes: Optional[str] = None) -> None:
        super().__init__(id=id, classes=classes)
        self._lines: List[Text] = []
        self._strips: Dict[int, Tuple[int, object, Strip]] = {}  # y -> (width, base style, strip)
        self._cuts: Dict[int, List[int]] = {}  # y -> cells where the last change begins and ends
        self.cells_repainted = 0  # for tests and benchmarks: cells marked dirty so far

    @property
    def lines(self) -> List[Text]:
        return list(self._lines)

    def set_lines(self, lines: Sequence[Text]) -> None:
        old, self._lines = self._lines, list(lines)
        if len(old) != len(self._lines):
            self._strips.clear()
            self.cells_repainted += sum(cell_len(line.plain) for line in self._lines)
            self.refresh(layout=True)  # a height change moves what is below
            return
        for y, (before, after) in enumerate(zip(old, self._lines)):
            runs = changed_runs(before, after)
            if runs:
                self._strips.pop(y, None)
                # The compositor sends whole segments: cut them where the change begins and ends.
                self._cuts[y] = sorted({cell for run in runs for cell in run})
            for start, end in runs:
                self.cells_repainted += end - start
                self.refresh(Region(start, y, end - start, 1))

    def render(self) -> Text:
        """The lines as one Text (what tests and `str()` read; drawing goes through render_line)."""
        return Text("\n").join(self._lines)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines)

    def on_resize(self) -> None:
        self._strips.clear()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        cached = self._strips.get(y)
        if cached is not None and cached[0] == width and cached[1] == base:
            return cached[2]
        if y >= len(self._lines):
            return Strip.blank(width, base)
        segments = list(self._lines[y].render(self.app.console))
        strip = Strip(segments).crop_extend(0, width, None).apply_style(base)
        cuts = [cut for cut in self._cuts.pop(y, ()) if 0 < cut < width]
        if cuts:
            strip = Strip.join(strip.divide(cuts + [width]))
        self._strips[y] = (width, base, strip)
        return strip
