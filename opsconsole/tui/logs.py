"""The Logs pane: every rank's log merged in time order, followed live, searched, diagnosed.

Three parts:
- `start_log_feed` (called by the app when `[logs]` has paths): a `LogFeed` (opsconsole/logs/feed.py)
  runs the LogHub with the fleet's links and feeds each line to the Diagnoser; lines and findings
  go to the pane.
- `LogLines`: a virtual line view over `opsconsole.logs.view.LogView`: only the rows on screen
  are rendered (a ScrollView with render_line, as Textual's Log and toolong do), so the buffer
  may hold 100k lines.
- `LogsPane`: the header line, the problems of sources, the lines, and the findings list.

Keys: `/` filter (regex, smart case), `l` level filter, `n` / `N` next / previous error,
`f` or `end` follow, `v` merged view or one source (`[` / `]` step through the sources),
`F` findings list / lines, `enter` on a finding goes to its line (again: the next one).
Scrolling to the top loads older lines (LogHub.older).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from rich.style import Style
from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.cache import LRUCache
from textual.containers import Vertical
from textual.geometry import Size
from textual.message import Message
from textual.screen import ModalScreen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from opsconsole.diagnosis.progress import PROGRESS_CATEGORIES, RunProgress
from opsconsole.diagnosis.stalls import stall_after_from
from opsconsole.logs.feed import LogFeed, fleet_links
from opsconsole.logs.records import TRUNCATED_MARKER, LogLine
from opsconsole.logs.view import COLOUR_COUNT, LogView, ViewEntry, colour_index
from opsconsole.model import STATE_AUTH, STATE_DOWN, STATE_HOSTKEY, NodeState
from opsconsole.nodes.base import is_replayed
from opsconsole.tui.findings import FindingsList, first_finding, summary_category
from opsconsole.tui.formatting import printable, printable_text
from opsconsole.tui.pane import Pane

log = logging.getLogger(__name__)

FLUSH_DELAY_S = 0.1  # lines arriving within this window are drawn once
OLDER_BATCH = 500  # lines asked of LogHub.older per source when the top is reached
TAIL_LINES = 1000  # lines asked of LogHub.last_lines per source when following resumes after a gap
MAX_PROBLEM_ROWS = 3
MAX_REMEMBERED_FINDINGS = 10_000
FILTER_AT_ONCE_LINES = 20_000  # above this many buffered lines, `/` filters once the typing pauses
FILTER_DEBOUNCE_S = 0.15
DOWN_STATES = {STATE_DOWN: "node down", STATE_AUTH: "node refuses login", STATE_HOSTKEY: "host key not trusted"}

# Label colours: mid-tone, readable on the dark and the light themes; red is kept for errors.
LABEL_COLOURS = (
    "#3b8eea",
    "#c761c7",
    "#23a86b",
    "#c79a1a",
    "#2aa1b3",
    "#e07b39",
    "#8a7cf0",
    "#5fa83a",
    "#d65c8a",
    "#3fa3a3",
    "#b0863a",
    "#7b8fd6",
)
assert len(LABEL_COLOURS) == COLOUR_COUNT
MARK_STYLES = {"critical": "bold red", "error": "red", "warning": "yellow"}


# --- the feed: LogHub + Diagnoser (opsconsole/logs/feed.py) into the pane ----------------------


def deliver_to(app: Any, pane: "LogsPane", lines: Sequence[LogLine], findings: List[Any]) -> None:
    """Lines go to the pane (their findings, when known yet)."""
    pane.add_lines(lines, findings)


def deliver_findings_to(app: Any, pane: "LogsPane", lines: Sequence[LogLine], findings: List[Any]) -> None:
    """Findings of lines the pane has: marked there, and to the console's alerts (and the recording, when on)."""
    pane.add_findings(lines, findings)
    services = getattr(app, "services", None)
    if services is None:
        return
    feed = getattr(pane, "feed", None)
    before_start = getattr(feed, "before_start", None)
    for line, finding in zip(lines, findings):
        if finding is not None:
            earlier = bool(before_start(line)) if before_start is not None else False
            services.observe_finding(finding, line.source.node, earlier=earlier)


def deliver_handled_to(app: Any, handled: List[Any]) -> None:
    """Findings later shown handled (their rank went on training): their alerts are withdrawn."""
    services = getattr(app, "services", None)
    if services is None:
        return
    for finding in handled:
        node = (finding.source or "").partition(":")[0]  # LogSource.key: "node:path"
        services.withdraw_finding(finding, node)


async def start_log_feed(app: Any) -> Optional[LogFeed]:
    """Start following `app.config.logs.paths` into the Logs pane (None when there are none, or it cannot start)."""
    if not (app.config.logs.paths or app.config.logs.node_paths):
        return None
    pane = app.panes.get(LogsPane.pane_id)
    if not isinstance(pane, LogsPane):
        return None
    try:
        # Imported here: a console without [logs] never loads the followers or the knowledge base.
        from opsconsole.diagnosis.engine import Diagnoser, precedence
        from opsconsole.logs.hub import LogHub

        feed = LogFeed(
            LogHub(app.config, fleet_links(app.fleet)),
            Diagnoser(),
            partial(deliver_to, app, pane),
            partial(deliver_findings_to, app, pane),
            progress=RunProgress(stall_after_from(app.config)),
            precedence=precedence,
            deliver_handled=partial(deliver_handled_to, app),
        )
        pane.feed = feed
        await feed.start()
    except Exception as exc:  # logs that cannot be followed must not keep the console from starting
        log.exception("log hub failed to start")
        pane.feed = None
        pane.start_problem = "could not start following the logs: %s" % exc
        pane.redraw_status()
        app.notify("logs: " + pane.start_problem, severity="error", timeout=10)
        return None
    return feed


class StatusLine(Widget):
    """A one-row line of text that redraws without a layout pass (Static.update relayouts the screen)."""

    DEFAULT_CSS = "StatusLine { height: 1; }"

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.text = Text()

    def set(self, text: Text) -> None:
        text = printable_text(text)  # file names, the typed filter, problems: data
        if text != self.text:
            self.text = text
            self.refresh()

    def render(self) -> Text:
        return self.text


# --- the line view -----------------------------------------------------------------------------


class LogLines(ScrollView, can_focus=True):
    """The visible rows of a LogView; scrolling up stops following, the bottom resumes it."""

    COMPONENT_CLASSES = {
        "loglines--cursor",
        "loglines--match",
        "loglines--error",
        "loglines--warning",
        "loglines--dim",
    }
    DEFAULT_CSS = """
    LogLines { height: 1fr; background: $surface; overflow: auto auto; }
    LogLines:focus { background-tint: $foreground 3%; }
    LogLines > .loglines--cursor { background: $accent 35%; }
    LogLines > .loglines--match { background: $warning 45%; text-style: bold; }
    LogLines > .loglines--error { color: $error; }
    LogLines > .loglines--warning { color: $warning; }
    LogLines > .loglines--dim { color: $text-muted; }
    """

    class Moved(Message):
        """The user scrolled: follow state changed, or the top was reached (load older lines)."""

        def __init__(self, at_top: bool, at_bottom: bool, home: bool = False) -> None:
            super().__init__()
            self.at_top = at_top
            self.at_bottom = at_bottom
            self.home = home  # `home`: after older lines load, go to the very top, not keep the place

    def __init__(self, view: LogView, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.view = view
        self.cursor: Optional[ViewEntry] = None  # the line n/N/enter went to
        self._cache: LRUCache[Tuple[int, bool, int, str], Strip] = LRUCache(1024)
        self._styles: Dict[str, Style] = {}
        self._width = 0
        self._moving = False  # our own scrolls (following, keeping the place) are not the user's

    # --- drawing ---------------------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._cache.clear()
        self._styles.clear()

    def base_style(self) -> Style:
        # Textual works these out from the CSS on every call: once per theme or style change is enough.
        style = self._styles.get("")
        if style is None:
            style = self._styles[""] = self.rich_style
        return style

    def style_of(self, component: str) -> Style:
        style = self._styles.get(component)
        if style is None:
            style = self._styles[component] = self.get_component_rich_style(component, partial=True)
        return style

    def forget_rendering(self) -> None:
        """Drop rendered rows (after a filter, a theme change, or a new cursor)."""
        self._cache.clear()
        self.refresh()

    def note_widths(self, texts: Iterable[str]) -> None:
        """Widen the scrollable width for new lines (a tab or a wide character may add a little)."""
        widest = max((len(text) for text in texts), default=0)
        gutter = 2 + self.view.label_width() + 1
        if widest + gutter > self._width:
            self._width = widest + gutter

    def sync_size(self) -> None:
        # A smaller size clamps scroll_y: that is not the user scrolling.
        self._moving = True
        try:
            self.virtual_size = Size(self._width, len(self.view))
        finally:
            self._moving = False

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        base = self.base_style()
        if index >= len(self.view):
            return Strip.blank(width, base)
        entry = self.view.entry(index)
        # Everything a row's look depends on is in its key, so new lines never cost re-rendering old ones.
        key = (entry.seq, entry is self.cursor, self.view.label_width(), self.view.pattern.text)
        strip = self._cache.get(key)
        if strip is None:
            strip = self._render_entry(entry, base)
            self._cache[key] = strip
        return strip.crop_extend(scroll_x, scroll_x + width, base)

    def _render_entry(self, entry: ViewEntry, base: Style) -> Strip:
        text = Text(no_wrap=True, end="")
        finding = entry.finding
        if finding is not None:
            text.append("● ", style=MARK_STYLES.get(str(getattr(finding, "severity", "")), "red"))
        else:
            text.append("  ")
        label_width = self.view.label_width()
        label = entry.label[:label_width].ljust(label_width)
        text.append(label, style=Style(color=LABEL_COLOURS[colour_index(entry.label)], bold=True))
        text.append(" ")
        start = len(text)
        rank = entry.level_rank
        line_style = ""
        if rank >= 40:
            line_style = self.style_of("loglines--error")
        elif rank >= 30:
            line_style = self.style_of("loglines--warning")
        text.append(entry.text, style=line_style)
        if entry.line.truncated:
            text.stylize(self.style_of("loglines--dim"), len(text) - len(TRUNCATED_MARKER))
        match_style = self.style_of("loglines--match")
        for begin, end in self.view.pattern.spans(entry.text):
            text.stylize(match_style, start + begin, start + end)
        text.stylize_before(base)
        if entry is self.cursor:
            text.stylize(self.style_of("loglines--cursor"))
        segments = list(text.render(self.app.console))
        strip = Strip(segments)
        if entry is self.cursor:
            strip = strip.extend_cell_length(
                max(self._width, self.size.width), base + self.style_of("loglines--cursor")
            )
        return strip

    # --- scrolling ---------------------------------------------------------------------------

    def top_entry(self) -> Optional[ViewEntry]:
        index = int(self.scroll_y)
        return self.view.entry(index) if 0 <= index < len(self.view) else None

    def move_to(self, y: float) -> None:
        """Scroll without it counting as the user's scroll."""
        self._moving = True
        try:
            self.scroll_to(y=y, animate=False, force=True)
        finally:
            self._moving = False

    def follow_end(self) -> None:
        """Show the last line; again after the next layout, which may add a scrollbar."""
        self.move_to(self.max_scroll_y)
        self.call_after_refresh(self._follow_end_after_layout)

    def _follow_end_after_layout(self) -> None:
        if self.view.following:
            self.move_to(self.max_scroll_y)

    def on_resize(self, event: events.Resize) -> None:
        if self.view.following:
            self.move_to(self.max_scroll_y)

    def show_index(self, index: int) -> None:
        """Put line `index` in view, a third of the way down when it has to move."""
        height = max(1, self.scrollable_content_region.height)
        top = int(self.scroll_y)
        if not top <= index < top + height:
            self.move_to(max(0, index - height // 3))

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self._moving:
            return
        self.post_message(self.Moved(at_top=new_value <= 0, at_bottom=new_value >= self.max_scroll_y))

    def _report_top(self, home: bool = False) -> None:
        # Already at the top, scrolling up changes nothing: still the user asked for older lines.
        if self.scroll_y <= 0 or home:
            self.post_message(self.Moved(at_top=True, at_bottom=self.max_scroll_y <= 0, home=home))

    def action_scroll_up(self) -> None:
        super().action_scroll_up()
        self._report_top()

    def action_page_up(self) -> None:
        super().action_page_up()
        self._report_top()

    def action_scroll_home(self) -> None:
        self.move_to(0)
        self._report_top(home=True)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self._report_top()

    def action_scroll_end(self) -> None:
        super().action_scroll_end()
        self.post_message(self.Moved(at_top=False, at_bottom=True))

    class Clicked(Message):
        """A line was clicked: the pane puts the cursor on it."""

        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def on_click(self, event: events.Click) -> None:
        index = int(self.scroll_y) + event.y
        if 0 <= index < len(self.view):
            self.post_message(self.Clicked(index))


# --- choosing a source -------------------------------------------------------------------------


class SourceScreen(ModalScreen[Optional[str]]):
    """Pick the merged view or one source; dismisses with the source key ("" for merged), None: cancel."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="logs.source.cancel")]
    DEFAULT_CSS = """
    SourceScreen { align: center middle; }
    SourceScreen > Vertical {
        width: 100; max-width: 95%; height: auto; max-height: 80%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    SourceScreen #source-title { text-style: bold; height: 1; }
    SourceScreen OptionList { height: auto; max-height: 30; }
    """

    def __init__(self, choices: Sequence[Tuple[str, Text]], current: Optional[str]) -> None:
        super().__init__()
        self.choices = list(choices)
        self.current = current or ""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Show which log? (enter picks, esc cancels)", id="source-title", markup=False)
            yield OptionList(*[Option(prompt, id=key or "-merged-") for key, prompt in self.choices], id="source-list")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        for index, (key, _) in enumerate(self.choices):
            if key == self.current:
                options.highlighted = index
        options.focus()

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        option_id = event.option.id or ""
        self.dismiss("" if option_id == "-merged-" else option_id)

    def action_cancel(self) -> None:
        self.dismiss(None)


# --- the pane ------------------------------------------------------------------------------------


class LogsPane(Pane):
    """The merged live log of every configured source, with the diagnosis's findings below it."""

    pane_id = "logs"
    title = "Logs"
    key = "6"

    DEFAULT_CSS = """
    LogsPane { height: 1fr; layout: vertical; }
    LogsPane > #logs-status { height: 1; padding: 0 1; background: $panel; }
    LogsPane > #logs-problems { height: auto; max-height: 4; padding: 0 1; color: $error; display: none; }
    LogsPane > #logs-problems.-shown { display: block; }
    LogsPane > FindingsList { display: none; }
    LogsPane > FindingsList.-shown { display: block; }
    """

    BINDINGS = [
        Binding("l", "cycle_level", "Level filter", id="logs.level"),
        Binding("n", "next_error", "Next error", id="logs.next_error"),
        Binding("N", "previous_error", "Previous error", id="logs.previous_error"),
        Binding("f", "follow", "Follow", id="logs.follow"),
        Binding("v", "choose_source", "Source view", id="logs.source"),
        Binding("]", "step_source(1)", "Next source", id="logs.next_source", show=False),
        Binding("[", "step_source(-1)", "Previous source", id="logs.previous_source", show=False),
        Binding("F", "toggle_findings", "Findings", id="logs.findings"),
        Binding("S", "stacks", "Stacks", id="logs.stacks"),  # a hang's culprit: every rank's py-spy stack
        # ... and PyTorch's flight recorder of every rank: the collective they disagree on
        Binding("T", "flight_recorder", "Flight recorder", id="logs.flight_recorder", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.view = LogView()
        self.feed: Optional[LogFeed] = None  # set by start_log_feed
        self.status = StatusLine(id="logs-status")
        self.problems_box = Static("", id="logs-problems", markup=False)
        self.lines = LogLines(self.view, id="log-lines")
        self.findings = FindingsList(id="findings")
        self.filter_problem: Optional[str] = None
        self.start_problem: Optional[str] = None
        self.states: Mapping[str, NodeState] = {}
        self._pending: List[Tuple[Sequence[LogLine], List[Any]]] = []
        self._flushed_any = False  # the first lines are drawn as they come (add_lines)
        self._findings_version = -1
        self._problems_text = ""
        self._filter_timer: Any = None
        self._filter_text = ""
        self._loading_older = False
        self._reloading_tail = False
        self._finding_at: Dict[Tuple[str, int], Any] = {}  # (source key, offset) -> Finding
        self._reload_floors: Dict[str, int] = {}  # source key -> offset of the last line the tail reload read
        self._jumps: Dict[str, int] = {}  # category -> how many times enter went to one of its lines

    def compose(self) -> ComposeResult:
        yield self.status
        yield self.problems_box
        yield self.lines
        yield self.findings

    def on_mount(self) -> None:
        self.redraw_status()
        self.set_interval(FLUSH_DELAY_S, self.flush)

    # --- feeding ----------------------------------------------------------------------------

    def add_lines(self, lines: Sequence[LogLine], findings: List[Any]) -> None:
        """New lines from the feed: buffered now, drawn by the next flush (within FLUSH_DELAY_S);
        the first lines of all are drawn at once (a log's last page when the console starts).

        Starts no timer: LogHub may call from outside Textual's context, where timers cannot start.
        """
        if not lines:
            return
        self._pending.append((lines, findings))
        if not self._flushed_any and self.is_mounted:
            self._flushed_any = True
            self.flush()

    def add_findings(self, lines: Sequence[LogLine], findings: List[Any]) -> None:
        """The diagnosis of lines given to add_lines before it: their marks, levels and the findings list."""
        for index, (pending, _) in enumerate(self._pending):
            if pending is lines:  # not drawn yet: they go in with their findings
                self._pending[index] = (lines, findings)
                return
        self.remember_findings(lines, findings)
        top = self.lines.top_entry()
        if self.view.mark(lines, findings):
            self.after_change(top)
        self.redraw_findings()

    def flush(self) -> None:
        """Put pending lines into the view, keeping the user's place (or the bottom when following)."""
        if self._reloading_tail:
            return  # the tail is being read again: lines wait, then only those after it go in
        pending, self._pending = self._pending, []
        if not pending:
            return
        top = self.lines.top_entry()
        floors, self._reload_floors = self._reload_floors, {}
        for lines, findings in pending:
            if floors:
                kept = [
                    (line, finding)
                    for line, finding in zip(lines, findings or [None] * len(lines))
                    if line.offset > floors.get(line.source.key, -1)
                ]
                lines, findings = [line for line, _ in kept], [finding for _, finding in kept]
            self.remember_findings(lines, findings)
            self.view.add(lines, findings)
            self.lines.note_widths(line.text for line in lines)
        self.after_change(top)
        self.redraw_findings()

    def remember_findings(self, lines: Sequence[LogLine], findings: Sequence[Any]) -> None:
        """Keep which lines matched, so lines read again (older, or the tail) are marked again."""
        for line, finding in zip(lines, findings):
            if finding is not None:
                self._finding_at[(line.source.key, line.offset)] = finding
        while len(self._finding_at) > MAX_REMEMBERED_FINDINGS:
            del self._finding_at[next(iter(self._finding_at))]

    def findings_of(self, lines: Sequence[LogLine]) -> List[Any]:
        return [self._finding_at.get((line.source.key, line.offset)) for line in lines]

    def after_change(self, top: Optional[ViewEntry]) -> None:
        """Redraw after the view changed: follow the end, or keep `top` as the top row."""
        self.lines.sync_size()
        if self.view.following:
            self.lines.follow_end()
        elif top is not None:
            self.lines.move_to(self.view.nearest_index(top))
        self.lines.refresh()
        self.redraw_status()

    def show(self, states: Mapping[str, NodeState], node: Optional[str], now: float) -> None:
        """Node states only matter here for sources of nodes that are down; `node` limits the merge."""
        self.states = states
        if node != self.view.node:
            top = self.lines.top_entry()
            self.view.set_node(node)
            self.after_change(top)
        self.redraw_problems()
        self.redraw_findings()
        self.redraw_status()

    def apply_filter(self, text: str) -> None:
        """The `/` line: a regex over the line text (smart case); a bad one matches as plain text.

        With a big buffer the filter waits for a pause in the typing: each pass reads every line.
        """
        self._filter_text = text
        if self._filter_timer is not None:
            self._filter_timer.stop()
            self._filter_timer = None
        if len(self.view.entries) > FILTER_AT_ONCE_LINES and self.is_mounted:
            self._filter_timer = self.set_timer(FILTER_DEBOUNCE_S, self._apply_filter_now)
        else:
            self._apply_filter_now()

    def _apply_filter_now(self) -> None:
        self._filter_timer = None
        top = self.lines.top_entry()
        self.filter_problem = self.view.set_search(self._filter_text)
        self.after_change(top)

    # --- the header, problems and findings ----------------------------------------------------------

    def source_count(self) -> int:
        keys = set(self.view.sources)
        if self.feed is not None:
            keys.update(getattr(source, "key", str(source)) for source in self.feed.sources())
        return len(keys)

    def redraw_status(self) -> None:
        if not self.is_mounted:
            return
        view = self.view
        text = Text()
        if self.feed is None:
            configured = bool(getattr(getattr(self.app, "config", None), "logs", None) and self.app.config.logs.paths)
            if self.start_problem:
                text.append("Logs: " + self.start_problem, style="bold red")
            elif is_replayed(getattr(self.app, "fleet", None)):
                text.append(
                    "Logs: a replay follows no log file (this machine's files are not the recording's; "
                    "the recorded findings are in Alerts)"
                )
            else:
                text.append(
                    "Logs: "
                    + (
                        "starting…"
                        if configured
                        else 'no [logs] paths in the config (paths = ["/scratch/run/logs/*.log"])'
                    )
                )
            self.status.set(text)
            return
        count = self.source_count()
        text.append("%d source%s" % (count, "" if count == 1 else "s"), style="bold")
        if view.source is None:
            text.append(" · merged")
        else:
            source = view.sources.get(view.source)
            text.append(" · only %s" % (getattr(source, "label", "") or view.source))
        if view.node is not None:
            text.append(" · node %s" % view.node)
        if view.following:
            text.append(" · following", style="green")
        else:
            text.append(" · paused", style="bold yellow")
            if view.new_lines:
                text.append(
                    " · %d new line%s" % (view.new_lines, "" if view.new_lines == 1 else "s"), style="bold yellow"
                )
            text.append(" (f: follow)")
        text.append(" · %d of %d lines" % (len(view), len(view.entries)))
        if view.min_level:
            text.append(" · level ≥ %s" % view.min_level)
        if view.pattern.text:
            text.append(" · /%s/" % view.pattern.text)
        if self.filter_problem:
            text.append(" · " + self.filter_problem, style="bold red")
        if self.feed.diagnosis_problem:
            text.append(" · " + self.feed.diagnosis_problem, style="bold red")
        if self._loading_older:
            text.append(" · loading older lines…")
        cursor = self.lines.cursor
        if cursor is not None:
            # Where the cursor line is, so the user can open the file at it.
            text.append(
                " · at %s line %d" % (cursor.line.source.path.rsplit("/", 1)[-1], cursor.line.number), style="dim"
            )
        self.status.set(text)

    def problem_rows(self) -> List[str]:
        """One row per source (or node) that cannot be read, as the user should read it."""
        rows: List[str] = []
        if self.feed is not None:
            for where, problem in sorted(self.feed.problems().items()):
                rows.append("%s: %s" % (where, problem))
        nodes = {getattr(source, "node", None) for source in self.view.sources.values()}
        if self.feed is not None:
            nodes.update(getattr(source, "node", None) for source in self.feed.sources())
        for name in sorted(n for n in nodes if n):
            state = self.states.get(name)
            if state is not None and state.state in DOWN_STATES:
                reason = (": " + state.reason) if state.reason else ""
                row = "%s: %s%s (its logs are not followed now)" % (name, DOWN_STATES[state.state], reason)
                if not any(r.startswith(name + ":") and DOWN_STATES[state.state] in r for r in rows):
                    rows.append(row)
        return rows

    def redraw_problems(self) -> None:
        rows = self.problem_rows()
        if len(rows) > MAX_PROBLEM_ROWS:
            rows = rows[: MAX_PROBLEM_ROWS - 1] + [
                "… and %d more (v lists every source)" % (len(rows) - MAX_PROBLEM_ROWS + 1)
            ]
        text = "\n".join("⚠ " + row for row in rows)
        if text != self._problems_text:  # Static.update relayouts the screen: only on a change
            self._problems_text = text
            self.problems_box.update(Text(printable(text)))
            self.problems_box.set_class(bool(rows), "-shown")

    def redraw_findings(self) -> None:
        if self.feed is None or self.feed.findings_version == self._findings_version:
            return
        self._findings_version = self.feed.findings_version
        try:
            summaries, root = self.feed.summary()
        except Exception as exc:
            self.feed.diagnosis_problem = "findings unavailable: %s" % exc
            return
        self.findings.set_class(bool(summaries), "-shown")
        self.findings.show(summaries, root, earlier=self.feed.earlier_categories())

    # --- scrolling: follow and older lines ------------------------------------------------------------

    @on(LogLines.Moved)
    def lines_moved(self, message: LogLines.Moved) -> None:
        message.stop()
        if message.at_bottom:
            if not self.view.following or self.view.tail_dropped:
                self.resume_following()
        else:
            self.view.stop_following()
        if message.at_top:
            self.load_older(to_top=message.home)
        self.redraw_status()

    @on(LogLines.Clicked)
    def line_clicked(self, message: LogLines.Clicked) -> None:
        message.stop()
        if message.index < len(self.view):
            self.go_to(message.index)

    def resume_following(self) -> None:
        if self.view.resume_following():
            self.reload_tail()
        self.lines.follow_end()
        self.redraw_status()

    def load_older(self, to_top: bool = False) -> None:
        """At the top: ask LogHub.older for the lines before each shown source's first buffered line.

        `to_top` (the `home` key): show the first line once they are in; else keep the user's place.
        """
        if self.feed is None or self._loading_older:
            return
        wanted = self.view.sources_to_extend()
        if not wanted:
            return
        self._loading_older = True
        self.run_worker(self._load_older(wanted, to_top), group="logs-older", exclusive=True, exit_on_error=False)

    async def _load_older(self, wanted: List[Tuple[str, int]], to_top: bool = False) -> None:
        assert self.feed is not None
        try:
            for source_key, offset in wanted:
                try:
                    lines = await self.feed.older(source_key, offset, OLDER_BATCH)
                except Exception as exc:
                    self.app.notify("logs: older lines of %s: %s" % (source_key, exc), severity="warning")
                    self.view.at_start[source_key] = True
                    continue
                lines = [line for line in lines if line.offset < offset]
                top = self.lines.top_entry()
                self.view.add_older(source_key, lines, self.findings_of(lines), complete=len(lines) < OLDER_BATCH)
                self.lines.note_widths(line.text for line in lines)
                self.after_change(None if to_top else top)
                if to_top:
                    self.lines.move_to(0)
        finally:
            self._loading_older = False
            self.redraw_status()

    def reload_tail(self) -> None:
        """After older lines pushed the newest out: reload each source's last lines and follow."""
        if self.feed is None or self._reloading_tail:
            return
        self._reloading_tail = True
        self.run_worker(self._reload_tail(), group="logs-tail", exclusive=True, exit_on_error=False)

    async def _reload_tail(self) -> None:
        assert self.feed is not None
        try:
            batches = []
            for source_key in list(self.view.sources):
                try:
                    batches.append(await self.feed.last_lines(source_key, TAIL_LINES))
                except Exception as exc:
                    self.app.notify("logs: last lines of %s: %s" % (source_key, exc), severity="warning")
            self.view.clear()
            for batch in batches:
                self.view.add(batch, self.findings_of(batch))  # diagnosed when they first arrived
                if batch:
                    self._reload_floors[batch[-1].source.key] = batch[-1].offset
            self.view.resume_following()
            self.lines.note_widths(entry.text for entry in self.view.entries)
            self.after_change(None)
        finally:
            self._reloading_tail = False
            self.flush()  # what arrived meanwhile, less what the reload already read

    # --- keys ------------------------------------------------------------------------------------

    def cursor_index(self) -> Optional[int]:
        cursor = self.lines.cursor
        if cursor is not None:
            return self.view.index_of(cursor)
        return None

    def go_to(self, index: int) -> None:
        """Put the cursor on visible line `index` and show it; looking back stops following."""
        entry = self.lines.cursor = self.view.entry(index)
        if index < len(self.view) - 1:
            self.view.stop_following()
        self.lines.show_index(index)
        self.lines.forget_rendering()
        if entry.finding is not None:
            self.findings.highlight(getattr(entry.finding, "category", ""))
        self.redraw_status()

    def action_next_error(self) -> None:
        """Go to the next ERROR / CRITICAL line or line with a finding."""
        cursor = self.cursor_index()
        # No cursor yet: from the top row shown, as less searches from the screen.
        found = self.view.next_error(cursor if cursor is not None else int(self.lines.scroll_y) - 1)
        if found is None:
            self.app.notify("no error below", timeout=2)
        else:
            self.go_to(found)

    def action_previous_error(self) -> None:
        """Go to the previous ERROR / CRITICAL line or line with a finding."""
        cursor = self.cursor_index()
        # No cursor yet: from below the last row shown, so the latest error on screen comes first.
        bottom = int(self.lines.scroll_y) + self.lines.scrollable_content_region.height
        found = self.view.previous_error(cursor if cursor is not None else bottom)
        if found is None:
            self.app.notify("no error above", timeout=2)
        else:
            self.go_to(found)

    def action_cycle_level(self) -> None:
        """Level filter: every line, WARNING and worse, ERROR and worse."""
        top = self.lines.top_entry()
        self.view.cycle_level()
        self.after_change(top)

    def action_follow(self) -> None:
        """Follow the end of the logs again."""
        self.lines.cursor = None
        self.resume_following()
        self.lines.forget_rendering()

    def action_toggle_findings(self) -> None:
        """Move between the lines and the findings list."""
        if self.findings.table.has_focus or not self.findings.has_class("-shown"):
            self.lines.focus()
            if not self.findings.has_class("-shown"):
                self.app.notify("no findings: nothing recognised as a failure", timeout=3)
        else:
            self.findings.table.focus()

    def source_choices(self) -> List[Tuple[str, Text]]:
        choices: List[Tuple[str, Text]] = [
            ("", Text("All sources, merged in time order (%d lines)" % len(self.view.entries)))
        ]
        problems = self.feed.problems() if self.feed is not None else {}
        sources: Dict[str, Any] = dict(self.view.sources)
        if self.feed is not None:
            for source in self.feed.sources():
                sources.setdefault(source.key, source)
        for key, source in sources.items():
            prompt = Text()
            label = getattr(source, "label", "") or key
            prompt.append(label, style=Style(color=LABEL_COLOURS[colour_index(label)], bold=True))
            prompt.append("  %s:%s  (%d lines)" % (source.node, source.path, self.view.counts.get(key, 0)))
            problem = problems.get(key) or problems.get(source.path)
            if problem:
                prompt.append("  ⚠ " + problem, style="bold red")
            choices.append((key, printable_text(prompt)))
        return choices

    def action_choose_source(self) -> None:
        """Choose the merged view or one source."""
        self.app.push_screen(SourceScreen(self.source_choices(), self.view.source), callback=self._source_chosen)

    def _source_chosen(self, key: Optional[str]) -> None:
        if key is None:
            return
        self.set_source(key or None)
        self.lines.focus()

    def action_step_source(self, step: int) -> None:
        """Show the next (or previous) source alone; past the last one, the merged view again."""
        keys: List[Optional[str]] = [None] + [key for key, _ in self.source_choices()[1:]]
        position = keys.index(self.view.source) if self.view.source in keys else 0
        self.set_source(keys[(position + step) % len(keys)])

    def set_source(self, key: Optional[str]) -> None:
        top = self.lines.cursor or self.lines.top_entry()
        self.view.set_source(key)
        if top is not None and not self.view.following:
            self.lines.move_to(self.view.nearest_index(top))
        self.after_change(None if self.view.following else top)

    def show_progress_finding(self, finding: Any) -> None:
        """A straggler: its source alone, at its end; a hang: what was measured (it has no line).

        Both offer S, the stacks of every rank, where the odd rank and its line show."""
        source = getattr(finding, "source", None)
        if source and source in self.view.sources:
            self.set_source(source)
            self.resume_following()
            self.lines.focus()
        self.app.notify(
            getattr(finding, "excerpt", "") + "\nS: stacks of every rank (which one is stuck, where)"
            "\nT: their flight-recorder dumps (the collective they disagree on)",
            title=getattr(finding, "title", ""),
            timeout=8,
        )

    def action_stacks(self) -> None:
        """Every rank's stack on every node: a hang's odd rank and the line it waits in."""
        from opsconsole.tui.stacks import open_stacks

        open_stacks(self.app)

    def action_flight_recorder(self) -> None:
        """Every rank's flight-recorder dump on every node, matched: the first collective they disagree on."""
        from opsconsole.tui.flight_recorder import open_flight_recorder

        open_flight_recorder(self.app)

    @on(FindingsList.Jump)
    def jump_to_finding(self, message: FindingsList.Jump) -> None:
        """enter on a finding: its first line; enter again: the next line of that category."""
        message.stop()
        category = summary_category(message.summary)
        if category in PROGRESS_CATEGORIES:
            self.show_progress_finding(first_finding(message.summary))
            return
        marked = self.view.marked(category)
        target: Optional[ViewEntry] = None
        if marked:
            turn = self._jumps.get(category, 0)
            target = marked[turn % len(marked)]
            self._jumps[category] = turn + 1
        else:
            first = first_finding(message.summary)
            if first is not None:
                target = self.view.find_line(getattr(first, "source", None), int(getattr(first, "line", 0)))
        if target is None:
            self.app.notify(
                "the line of %s is no longer in the buffer (scroll to the top to load older lines)" % category,
                severity="warning",
            )
            return
        if self.view.index_of(target) is None:
            # Hidden by the view: show every source and level; a `/` filter stays (esc clears it).
            if self.view.source is not None and self.view.source != target.source_key:
                self.view.set_source(None)
            if self.view.min_level is not None:
                self.view.set_level(None)
            self.after_change(None)
        index = self.view.index_of(target)
        if index is None:
            self.app.notify(
                "the line is hidden by the filter /%s/ (esc clears it)" % self.view.pattern.text, severity="warning"
            )
            return
        self.go_to(index)
        self.lines.focus()
