"""The findings list under the Log pane: one row per failure category the diagnosis recognised.

Rows come from `Diagnoser.summary()` (FindingSummary: category, title, severity, cause,
remedy, count, first/last seen, ranks, first finding); the root cause is marked. The
highlighted row's cause and remedy show whole below the table; `enter` asks the pane to
jump to the line (again: to the next line of that category).
"""

from __future__ import annotations

import time
from typing import Any, Collection, List, Optional, Sequence

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from opsconsole.tui.formatting import printable, printable_text

SEVERITY_STYLES = {"critical": "bold red", "error": "red", "warning": "yellow"}
SEVERITY_ORDER = {"critical": 0, "error": 1, "warning": 2}
ROOT_MARK = "★"
COLUMNS = (
    ("mark", "", 2),
    ("severity", "Severity", 8),
    ("category", "Category", 20),
    ("count", "Count", 6),
    ("first", "First seen", 10),
    ("last", "Last seen", 10),
    ("ranks", "Ranks", 14),
    ("cause", "Cause", 40),
    ("remedy", "Remedy", None),
)


BEFORE_START = "pre-start"  # First seen of a finding only in lines that were in the files, unstamped, at the start


def clock_time(when: Optional[float]) -> str:
    """Epoch seconds as local HH:MM:SS; "-" for a line that had no time."""
    if when is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(when))


def ranks_text(ranks: Sequence[Any], width: int = 14) -> str:
    """Ranks as a compact list (`0-3,7`), cut to `width` with a count of the rest."""
    numbers = sorted({int(rank) for rank in ranks if rank is not None})
    if not numbers:
        return "-"
    runs: List[str] = []
    start = previous = numbers[0]
    for number in numbers[1:] + [None]:  # type: ignore[list-item]
        if number is not None and number == previous + 1:
            previous = number
            continue
        runs.append(str(start) if start == previous else "%d-%d" % (start, previous))
        if number is not None:
            start = previous = number
    text = ",".join(runs)
    if len(text) > width:
        text = text[: width - 4].rsplit(",", 1)[0] + ",…(%d)" % len(numbers)
    return text


def one_line(text: Any, width: int) -> str:
    words = " ".join(str(text or "").split())
    return words if len(words) <= width else words[: width - 1] + "…"


def summary_category(summary: Any) -> str:
    return str(getattr(summary, "category", ""))


def root_category(root: Any) -> Optional[str]:
    """`Diagnoser.root_cause()` as a category id, whether it returns an id or a record."""
    if root is None or isinstance(root, str):
        return root
    return getattr(root, "category", None) or getattr(root, "id", None)


def sorted_summaries(summaries: Sequence[Any], root: Optional[str]) -> List[Any]:
    """Root cause first, then by severity, then by when it was first seen."""

    def order(summary: Any):
        first = getattr(summary, "first_seen", None)
        return (
            summary_category(summary) != root,
            SEVERITY_ORDER.get(getattr(summary, "severity", ""), 3),
            first if first is not None else float("inf"),
        )

    return sorted(summaries, key=order)


def summary_cells(summary: Any, root: Optional[str], earlier: Collection[str] = ()) -> List[Text]:
    """The table cells of one FindingSummary; `earlier`: categories seen only in lines from before the start."""
    severity = str(getattr(summary, "severity", ""))
    style = SEVERITY_STYLES.get(severity, "")
    category = summary_category(summary)
    first_seen = getattr(summary, "first_seen", None)
    values = {
        "mark": ROOT_MARK if category == root else "",
        "severity": severity,
        "category": category,
        "count": str(getattr(summary, "count", "")),
        "first": BEFORE_START if first_seen is None and category in earlier else clock_time(first_seen),
        "last": clock_time(getattr(summary, "last_seen", None)),
        "ranks": ranks_text(getattr(summary, "ranks", ()) or ()),
        "cause": one_line(getattr(summary, "cause", ""), 40),
        "remedy": one_line(getattr(summary, "remedy", ""), 200),
    }
    cells = []
    for key, _, _ in COLUMNS:
        cell_style = style if key in ("mark", "severity", "category") else ""
        cells.append(Text(printable(values[key]), style=cell_style, end=""))  # excerpts are log text
    return cells


def summary_detail(summary: Any, root: Optional[str], earlier: Collection[str] = ()) -> Text:
    """Title, cause, remedy and the first matching line of one summary, whole."""
    text = Text()
    category = summary_category(summary)
    title = getattr(summary, "title", "") or category
    text.append(title, style="bold " + SEVERITY_STYLES.get(str(getattr(summary, "severity", "")), ""))
    notes = [category]
    if category == root:
        notes.append("the root cause")
    if category in earlier:
        notes.append("only in lines written before the console started")
    text.append("  (%s)\n" % ", ".join(notes), style="dim")
    text.append("Cause: ", style="bold")
    text.append(" ".join(str(getattr(summary, "cause", "")).split()) + "\n")
    text.append("Remedy: ", style="bold")
    text.append(" ".join(str(getattr(summary, "remedy", "")).split()))
    first = first_finding(summary)
    if first is not None and getattr(first, "excerpt", ""):
        text.append("\nFirst: ", style="bold")
        where = getattr(first, "source", None) or ""
        text.append("%s line %s: " % (where.rsplit("/", 1)[-1], getattr(first, "line", "?")), style="dim")
        text.append(one_line(first.excerpt.splitlines()[0] if first.excerpt else "", 100))
    return text


def first_finding(summary: Any) -> Any:
    """The first Finding of a summary (the field is `first` or `first_finding`)."""
    for name in ("first", "first_finding", "finding"):
        value = getattr(summary, name, None)
        if value is not None:
            return value
    return None


class FindingsList(Vertical):
    """The findings table and the whole text of the highlighted row."""

    DEFAULT_CSS = """
    FindingsList { height: auto; max-height: 14; }
    FindingsList > #findings-title { height: 1; padding: 0 1; text-style: bold; background: $panel; }
    FindingsList > DataTable { height: auto; max-height: 8; overflow-x: hidden; }
    FindingsList > #finding-detail { height: auto; max-height: 5; padding: 0 1; }
    """

    class Jump(Message):
        """The user pressed enter on a finding: show its line (next one of the category when repeated)."""

        def __init__(self, summary: Any) -> None:
            super().__init__()
            self.summary = summary

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.summaries: List[Any] = []
        self.root: Optional[str] = None
        self.earlier: Collection[str] = ()
        self.title = Static("", id="findings-title", markup=False)
        self.table: DataTable = DataTable(id="findings-table", cursor_type="row", zebra_stripes=True)
        self.detail = Static("", id="finding-detail", markup=False)
        self._shown: List[Any] = []

    def compose(self) -> ComposeResult:
        yield self.title
        yield self.table
        yield self.detail

    def on_mount(self) -> None:
        for key, label, width in COLUMNS:
            self.table.add_column(label, key=key, width=width)

    def show(self, summaries: Sequence[Any], root: Any, earlier: Collection[str] = ()) -> None:
        """Show the current summaries (in place; the highlighted category stays highlighted). `earlier`: the
        categories seen only in lines from before the console started."""
        self.root = root_category(root)
        self.earlier = frozenset(earlier)
        self.summaries = sorted_summaries(summaries, self.root)
        signature = [
            (summary_category(s), getattr(s, "count", None), getattr(s, "last_seen", None), self.root, self.earlier)
            for s in self.summaries
        ]
        total = sum(int(getattr(s, "count", 0) or 0) for s in self.summaries)
        title = "Findings: %d categor%s, %d line%s" % (
            len(self.summaries),
            "y" if len(self.summaries) == 1 else "ies",
            total,
            "" if total == 1 else "s",
        )
        if self.root:
            title += " · root cause %s %s" % (ROOT_MARK, self.root)
        title += " · enter: go to the line (again: the next one)"
        self.title.update(Text(printable(title)))
        if signature == self._shown and self.table.row_count == len(self.summaries):
            return
        self._shown = signature
        highlighted = self.highlighted()
        highlighted_category = summary_category(highlighted) if highlighted is not None else None
        self.table.clear()
        for summary in self.summaries:
            self.table.add_row(*summary_cells(summary, self.root, self.earlier), key=summary_category(summary))
        for row, summary in enumerate(self.summaries):
            if summary_category(summary) == highlighted_category:
                self.table.move_cursor(row=row, animate=False)
                break
        self.show_detail()

    def highlight(self, category: str) -> None:
        """Highlight the row of `category` (the cursor went to one of its lines): its cause shows."""
        for row, summary in enumerate(self.summaries):
            if summary_category(summary) == category and row < self.table.row_count:
                self.table.move_cursor(row=row, animate=False)
                self.show_detail()
                return

    def highlighted(self) -> Any:
        row = self.table.cursor_row
        if self.table.row_count and 0 <= row < len(self.summaries):
            return self.summaries[row]
        return None

    def show_detail(self) -> None:
        summary = self.highlighted()
        self.detail.update(
            printable_text(summary_detail(summary, self.root, self.earlier)) if summary is not None else Text("")
        )

    @on(DataTable.RowHighlighted, "#findings-table")
    def row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        self.show_detail()

    @on(DataTable.RowSelected, "#findings-table")
    def row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        summary = self.highlighted()
        if summary is not None:
            self.post_message(self.Jump(summary))
