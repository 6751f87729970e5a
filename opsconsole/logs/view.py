"""The Log pane's view model: a bounded, time-ordered merge of every followed source; no Textual here.

The pane keeps no text of its own: it asks this model how many lines are visible and for the
entry at a position, so only the lines on screen are ever rendered. The model holds:

- `entries`: every buffered line of every source, ordered by (effective time, arrival).
  A line without a timestamp takes its predecessor's time in the same source, and a source's
  times never go backwards, so each source stays in file order inside the merge.
- `visible`: the entries that pass the view (merged or one source, a node, a level, a regex).
- follow state: following stops when the user scrolls up; new visible lines are counted.
- marks: lines that the diagnosis matched (`Finding`), per category, for the findings list.

The buffer is bounded (`max_lines`): the oldest lines go first. Lines loaded from before the
buffer (`add_older`) make the newest ones go instead; the model then says `tail_dropped`, and
the pane reloads the tail when the user follows again.
"""

from __future__ import annotations

import re
import time
import zlib
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from opsconsole.logs.records import LogLine

DEFAULT_MAX_LINES = 100_000
TRIM_SLACK = 0.05  # trim in chunks of 5 %: deleting a list prefix costs a copy of the list

# Level names as LogLine.level carries them (WARN / FATAL also seen in the wild), by severity.
LEVEL_ORDER = {"DEBUG": 10, "INFO": 20, "WARN": 30, "WARNING": 30, "ERROR": 40, "CRITICAL": 50, "FATAL": 50}
LEVEL_FILTERS: Tuple[Optional[str], ...] = (None, "WARNING", "ERROR")  # what the level key cycles through
SEVERITY_LEVELS = {"critical": "CRITICAL", "error": "ERROR", "warning": "WARNING"}  # Finding.severity
ERROR_RANK = LEVEL_ORDER["ERROR"]

COLOUR_COUNT = 12  # label colours; the pane maps an index to a style

# A Python traceback's first and last lines carry no logging level but are errors.
TRACEBACK_LINE = re.compile(r"^(Traceback \(most recent call last\):|[A-Za-z_][\w.]*(Error|Exception|Interrupt)(: |$))")
ANSI_ESCAPE = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")
NEEDS_CLEANING = re.compile(r"[\x00-\x1f\x7f]")
CONTROL_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def display_text(text: str) -> str:
    """A line as a terminal would show it, safe to draw in one row.

    Colour escapes are dropped, a carriage return keeps only what was written after it (progress
    bars redraw themselves that way), tabs become spaces, and any other control character becomes
    U+FFFD, like the invalid bytes the followers already replaced.
    """
    if not NEEDS_CLEANING.search(text):
        return text
    text = ANSI_ESCAPE.sub("", text)
    if "\r" in text:
        parts = [part for part in text.split("\r") if part]
        text = parts[-1] if parts else ""
    return CONTROL_CHARS.sub("\ufffd", text.expandtabs(8))


def line_label(line: LogLine) -> str:
    """The label shown before a line: the source's label, or `host:rankN` for a `[rankN]:` prefix."""
    source = line.source
    label = source.label or source.path.rsplit("/", 1)[-1]
    if line.rank is not None and line.rank != source.rank:
        return "%s:rank%d" % (source.host or label, line.rank)
    return label


def colour_index(label: str, count: int = COLOUR_COUNT) -> int:
    """A colour for a label that depends on the label only, never on the order sources appear in."""
    return zlib.crc32(label.encode("utf-8", "replace")) % count


def level_rank(level: Optional[str]) -> int:
    """Severity of a level name as a number (0 when there is none)."""
    return LEVEL_ORDER.get((level or "").upper(), 0)


def effective_level(line: LogLine, finding: Any, previous: Optional[str]) -> Optional[str]:
    """The level the filter and n/N go by.

    The logged level, raised to the severity of a finding on the line; a traceback line counts
    as ERROR; an indented line with no level continues its predecessor's record (a traceback
    under `ERROR - ...`), so it takes that level.
    """
    level = line.level.upper() if line.level else None
    if finding is not None:
        found = SEVERITY_LEVELS.get(str(getattr(finding, "severity", "")).lower(), "ERROR")
        if level_rank(found) > level_rank(level):
            level = found
    if level is None:
        if TRACEBACK_LINE.match(line.text):
            return "ERROR"
        if previous is not None and line.text[:1] in (" ", "\t"):
            return previous
    return level


@dataclass(frozen=True)
class SearchPattern:
    """The compiled `/` text: a regex (smart case), or the text as a literal when it is not one."""

    text: str
    regex: Optional["re.Pattern[str]"]
    error: Optional[str] = None  # shown to the user; the literal text is matched instead

    def search(self, text: str) -> bool:
        return self.regex is None or self.regex.search(text) is not None

    def spans(self, text: str, limit: int = 64) -> List[Tuple[int, int]]:
        """Where the pattern matches in `text` (empty matches skipped), at most `limit` of them."""
        if self.regex is None:
            return []
        found = []
        for match in self.regex.finditer(text):
            if match.end() > match.start():
                found.append((match.start(), match.end()))
                if len(found) >= limit:
                    break
        return found


NO_SEARCH = SearchPattern("", None)


def compile_search(text: str) -> SearchPattern:
    """Compile the `/` text: case-insensitive unless it has a capital letter (as ripgrep's --smart-case)."""
    if not text:
        return NO_SEARCH
    flags = 0 if any(ch.isupper() for ch in text) else re.IGNORECASE
    try:
        return SearchPattern(text, re.compile(text, flags))
    except re.error as exc:
        return SearchPattern(
            text, re.compile(re.escape(text), flags), "invalid regex (%s): matching it as plain text" % exc
        )


class ViewEntry:
    """One buffered line with what the view needs of it, computed once on arrival."""

    __slots__ = ("line", "source_key", "time", "seq", "level", "level_rank", "label", "text", "finding")

    def __init__(
        self,
        line: LogLine,
        time_: float,
        seq: int,
        level: Optional[str],
        finding: Any,
        source_key: Optional[str] = None,
        label: Optional[str] = None,
    ) -> None:
        self.line = line
        self.source_key = source_key or line.source.key  # LogSource.key builds a string on every call
        self.time = time_
        self.seq = seq
        self.level = level
        self.level_rank = LEVEL_ORDER.get(level, 0) if level else 0
        self.label = label if label is not None else line_label(line)
        text = line.text
        self.text = display_text(text) if NEEDS_CLEANING.search(text) else text
        self.finding = finding

    @property
    def key(self) -> Tuple[float, int]:
        return (self.time, self.seq)

    @property
    def is_error(self) -> bool:
        """What n / N stop at: ERROR or worse, or a line the diagnosis matched."""
        return self.finding is not None or self.level_rank >= ERROR_RANK


@dataclass
class AddResult:
    """What one batch did to the view, so the pane can keep the user's place."""

    added: int = 0  # entries buffered
    shown: int = 0  # of those, how many are visible
    dropped: int = 0  # entries trimmed from the buffer
    dropped_shown: int = 0  # of those, how many were visible before the first visible one kept
    counted: int = 0  # lines not buffered because the tail was dropped (counted as new)


class LogView:
    """The merged, filtered, followed view of every source's lines (see the module docstring)."""

    def __init__(self, max_lines: int = DEFAULT_MAX_LINES, now: Callable[[], float] = time.time) -> None:
        self.max_lines = max(1, max_lines)
        self.now = now
        self.entries: List[ViewEntry] = []
        self._keys: List[Tuple[float, int]] = []
        self.visible: List[ViewEntry] = []
        self._visible_keys: List[Tuple[float, int]] = []
        self._seq = 0
        self._older_seq = 0  # older lines sort before everything buffered at the same time
        self._last_time: Dict[str, float] = {}  # per source: effective time of its newest line
        self._last_level: Dict[str, Optional[str]] = {}
        self.counts: Dict[str, int] = {}  # buffered lines per source key
        self.sources: Dict[str, Any] = {}  # source key -> LogSource, in order of arrival
        self.at_start: Dict[str, bool] = {}  # nothing older left to load for this source
        self._label_width = 0
        # the view
        self.source: Optional[str] = None  # one source key, None for the merged view
        self.node: Optional[str] = None  # only this node's sources (the drill-down), None for all
        self.min_level: Optional[str] = None
        self.pattern: SearchPattern = NO_SEARCH
        # follow state
        self.following = True
        self.new_lines = 0
        self.tail_dropped = False

    # --- content ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.visible)

    def add(self, lines: Sequence[LogLine], findings: Optional[Sequence[Any]] = None) -> AddResult:
        """Buffer new lines (each source's in file order); `findings[i]` is line i's Finding or None."""
        result = AddResult()
        if self.tail_dropped:
            # A gap separates the buffer from these lines: count them; following reloads the tail.
            result.counted = sum(1 for line in lines if self._shows_source(line))
            self.new_lines += result.counted
            return result
        # The hot path of the console (every line of every rank): locals, one key per line, and the
        # per-source values (key string, label) taken once per run of lines of the same source.
        last_time, last_level, sources, counts = self._last_time, self._last_level, self.sources, self.counts
        entries, keys, visible, visible_keys = self.entries, self._keys, self.visible, self._visible_keys
        plain_view = self.source is None and self.node is None and self.min_level is None and self.pattern.regex is None
        seq = self._seq
        appended = 0
        label_width = self._label_width
        current = key = None
        label_rank: Any = None
        label = ""
        have_findings = findings is not None
        for index, line in enumerate(lines):
            finding = findings[index] if have_findings and index < len(findings) else None
            source = line.source
            if source is not current:
                current, key = source, source.key
                if key not in sources:
                    sources[key] = source
                label_rank = None
            if line.rank != label_rank or label_rank is None:
                label_rank = line.rank
                label = line_label(line)
            previous = last_time.get(key)
            when = line.time if line.time is not None else (previous if previous is not None else self.now())
            if previous is not None and when < previous:
                when = previous  # a source's times never go backwards: its lines keep file order
            last_time[key] = when
            if finding is None and line.level in LEVEL_ORDER:
                level: Optional[str] = line.level
            else:
                level = effective_level(line, finding, last_level.get(key))
            last_level[key] = level
            seq += 1
            entry = ViewEntry(line, when, seq, level, finding, key, label)
            entry_key = (when, seq)
            if plain_view and (not keys or entry_key > keys[-1]):
                # In time order and nothing filtered: the common case appends to both lists.
                entries.append(entry)
                keys.append(entry_key)
                visible.append(entry)
                visible_keys.append(entry_key)
                counts[key] = counts.get(key, 0) + 1
                if len(label) > label_width:
                    label_width = len(label)
                appended += 1
            else:
                self._label_width = max(self._label_width, label_width)
                self._insert(entry, result)
                label_width = self._label_width
        self._label_width = max(self._label_width, label_width)
        result.added += appended
        result.shown += appended
        self._seq = seq
        if not self.following:
            self.new_lines += result.shown
        self._trim_oldest(result)
        return result

    def add_older(
        self,
        source_key: str,
        lines: Sequence[LogLine],
        findings: Optional[Sequence[Any]] = None,
        complete: bool = False,
    ) -> AddResult:
        """Put lines from before a source's first buffered line (file order) in front of it.

        `complete`: the source has nothing older (LogHub.older returned fewer than asked).
        """
        result = AddResult()
        first = self.first_entry(source_key)
        if complete or not lines:
            self.at_start[source_key] = True
        if not lines:
            return result
        # Forward: a line without a time takes its predecessor's; backward: never later than its successor.
        times: List[Optional[float]] = []
        previous: Optional[float] = None
        for line in lines:
            previous = line.time if line.time is not None else previous
            times.append(previous)
        successor = first.time if first is not None else self.now()
        for index in range(len(lines) - 1, -1, -1):
            value = times[index]
            successor = successor if value is None or value > successor else value
            times[index] = successor
        level: Optional[str] = None
        self._older_seq -= len(lines)
        for index, line in enumerate(lines):
            finding = findings[index] if findings is not None and index < len(findings) else None
            self._remember_source(line)
            level = effective_level(line, finding, level)
            entry = ViewEntry(line, times[index] or 0.0, self._older_seq + index, level, finding)
            self._insert(entry, result)
        self._trim_newest(result)
        return result

    def mark(self, lines: Sequence[LogLine], findings: Sequence[Any]) -> int:
        """Give buffered lines the findings their diagnosis found after they were added; how many.

        A finding can raise its line's level, and with it the level of the indented lines of the
        same record after it (effective_level), so those are worked out again. The lines are
        the very LogLine objects given to add() (looked up from the newest entry back).
        """
        wanted = {id(line): finding for line, finding in zip(lines, findings) if finding is not None}
        marked = 0
        entries = self.entries
        position = len(entries)
        while wanted and position > 0:
            position -= 1
            finding = wanted.pop(id(entries[position].line), None)
            if finding is not None:
                entries[position].finding = finding
                self._relevel_from(position)
                marked += 1
        if marked and self.min_level is not None:
            self._rebuild()  # levels changed: the level filter may show more now
        return marked

    def _relevel_from(self, position: int) -> None:
        """Work out the level of the entry at `position` and of its source's entries after it, while they change."""
        entries = self.entries
        key = entries[position].source_key
        previous: Optional[str] = None
        for earlier in range(position - 1, -1, -1):
            if entries[earlier].source_key == key:
                previous = entries[earlier].level
                break
        last = None
        for index in range(position, len(entries)):
            entry = entries[index]
            if entry.source_key != key:
                continue
            level = effective_level(entry.line, entry.finding, previous)
            if index > position and level == entry.level:
                break  # from here on the levels are as they were
            entry.level, entry.level_rank = level, LEVEL_ORDER.get(level, 0) if level else 0
            previous = last = level
        else:  # the source's newest entry changed: the next line added continues from it
            self._last_level[key] = last

    def clear(self) -> None:
        """Forget every buffered line (the view settings stay)."""
        self.entries, self._keys, self.visible, self._visible_keys = [], [], [], []
        self._last_time.clear()
        self._last_level.clear()
        self.counts.clear()
        self.at_start.clear()
        self.tail_dropped = False

    def _remember_source(self, line: LogLine) -> None:
        key = line.source.key
        if key not in self.sources:
            self.sources[key] = line.source

    def _insert(self, entry: ViewEntry, result: AddResult) -> None:
        key = entry.key
        if not self._keys or key > self._keys[-1]:
            self.entries.append(entry)
            self._keys.append(key)
        else:
            position = bisect_right(self._keys, key)
            self.entries.insert(position, entry)
            self._keys.insert(position, key)
        self.counts[entry.source_key] = self.counts.get(entry.source_key, 0) + 1
        if len(entry.label) > self._label_width:
            self._label_width = len(entry.label)
        result.added += 1
        if self.passes(entry):
            if not self._visible_keys or key > self._visible_keys[-1]:
                self.visible.append(entry)
                self._visible_keys.append(key)
            else:
                position = bisect_right(self._visible_keys, key)
                self.visible.insert(position, entry)
                self._visible_keys.insert(position, key)
            result.shown += 1

    def _forget(self, removed: Iterable[ViewEntry]) -> None:
        for entry in removed:
            key = entry.source_key
            self.counts[key] -= 1
            self.at_start[key] = False

    def _trim_oldest(self, result: AddResult) -> None:
        if len(self.entries) <= self.max_lines * (1 + TRIM_SLACK):
            return
        drop = len(self.entries) - self.max_lines
        last_key = self._keys[drop - 1]
        self._forget(self.entries[:drop])
        del self.entries[:drop]
        del self._keys[:drop]
        shown = bisect_right(self._visible_keys, last_key)
        del self.visible[:shown]
        del self._visible_keys[:shown]
        result.dropped += drop
        result.dropped_shown += shown

    def _trim_newest(self, result: AddResult) -> None:
        if len(self.entries) <= self.max_lines:
            return
        keep = self.max_lines
        first_dropped = self._keys[keep]
        for entry in self.entries[keep:]:
            self.counts[entry.source_key] -= 1
        result.dropped += len(self.entries) - keep  # the pane's place is above the cut: nothing shifts
        del self.entries[keep:]
        del self._keys[keep:]
        cut = bisect_left(self._visible_keys, first_dropped)
        del self.visible[cut:]
        del self._visible_keys[cut:]
        self.tail_dropped = True
        self.following = False

    # --- the view --------------------------------------------------------------------

    def _shows_source(self, line: LogLine) -> bool:
        if self.source is not None and line.source.key != self.source:
            return False
        return self.node is None or line.source.node == self.node

    def passes(self, entry: ViewEntry) -> bool:
        """Whether `entry` is visible under the current source, node, level and search."""
        if not self._shows_source(entry.line):
            return False
        if self.min_level is not None and entry.level_rank < level_rank(self.min_level):
            return False
        return self.pattern.search(entry.text)

    def _rebuild(self) -> None:
        # Each test narrows the list in one comprehension: the whole buffer is re-filtered per `/` keystroke.
        shown = self.entries
        if self.source is not None:
            source = self.source
            shown = [entry for entry in shown if entry.line.source.key == source]
        if self.node is not None:
            node = self.node
            shown = [entry for entry in shown if entry.line.source.node == node]
        if self.min_level is not None:
            floor = level_rank(self.min_level)
            shown = [entry for entry in shown if entry.level_rank >= floor]
        if self.pattern.regex is not None:
            search = self.pattern.regex.search
            shown = [entry for entry in shown if search(entry.text) is not None]
        self.visible = list(shown) if shown is self.entries else shown
        self._visible_keys = [(entry.time, entry.seq) for entry in self.visible]

    def set_source(self, source_key: Optional[str]) -> None:
        """Show one source (its key), or every source merged (None)."""
        self.source = source_key
        self._rebuild()

    def set_node(self, node: Optional[str]) -> None:
        """Show only the sources of `node` (the console's drill-down), or all (None)."""
        if node != self.node:
            self.node = node
            self._rebuild()

    def set_level(self, level: Optional[str]) -> None:
        """Show only lines at `level` or worse (None: every line, with or without a level)."""
        self.min_level = level.upper() if level else None
        self._rebuild()

    def cycle_level(self) -> Optional[str]:
        """Step the level filter: all, >= WARNING, >= ERROR, all again; returns the new one."""
        position = LEVEL_FILTERS.index(self.min_level) if self.min_level in LEVEL_FILTERS else 0
        self.set_level(LEVEL_FILTERS[(position + 1) % len(LEVEL_FILTERS)])
        return self.min_level

    def set_search(self, text: str) -> Optional[str]:
        """Filter by the `/` regex; returns the problem with it (then it matches as plain text)."""
        self.pattern = compile_search(text)
        self._rebuild()
        return self.pattern.error

    def entry(self, index: int) -> ViewEntry:
        return self.visible[index]

    def index_of(self, entry: ViewEntry) -> Optional[int]:
        """Position of `entry` among the visible lines, None when it is hidden or gone."""
        position = bisect_left(self._visible_keys, entry.key)
        if position < len(self.visible) and self.visible[position] is entry:
            return position
        return None

    def nearest_index(self, entry: ViewEntry) -> int:
        """Position of `entry`, or of the first visible line after where it was."""
        return min(bisect_left(self._visible_keys, entry.key), max(0, len(self.visible) - 1))

    # --- follow --------------------------------------------------------------------------

    def stop_following(self) -> None:
        """The user scrolled up: keep the place, count what arrives."""
        if self.following:
            self.following = False
            self.new_lines = 0

    def resume_following(self) -> bool:
        """Follow again; True when the tail was dropped and must be reloaded (LogHub.last_lines)."""
        self.following = True
        self.new_lines = 0
        return self.tail_dropped

    # --- navigation ------------------------------------------------------------------

    def next_error(self, after: int) -> Optional[int]:
        """The first visible error line after position `after` (-1: from the top), None when none."""
        for index in range(max(after + 1, 0), len(self.visible)):
            if self.visible[index].is_error:
                return index
        return None

    def previous_error(self, before: int) -> Optional[int]:
        """The last visible error line before position `before`, None when none."""
        for index in range(min(before, len(self.visible)) - 1, -1, -1):
            if self.visible[index].is_error:
                return index
        return None

    def find_line(self, source_key: Optional[str], number: int) -> Optional[ViewEntry]:
        """The buffered entry of line `number` of a source (the latest such, after a rotation)."""
        for entry in reversed(self.entries):
            if entry.line.number == number and (
                source_key is None or entry.source_key == source_key or entry.line.source.path == source_key
            ):
                return entry
        return None

    def marked(self, category: str) -> List[ViewEntry]:
        """Buffered lines whose finding is of `category`, in view order."""
        return [
            entry
            for entry in self.entries
            if entry.finding is not None and getattr(entry.finding, "category", None) == category
        ]

    def first_entry(self, source_key: str) -> Optional[ViewEntry]:
        """The oldest buffered line of a source."""
        for entry in self.entries:
            if entry.source_key == source_key:
                return entry
        return None

    def sources_to_extend(self) -> List[Tuple[str, int]]:
        """(source key, offset of its first buffered line) for each shown source with older lines left."""
        wanted = []
        for key, source in self.sources.items():
            if self.at_start.get(key) or (self.source is not None and key != self.source):
                continue
            if self.node is not None and source.node != self.node:
                continue
            first = self.first_entry(key)
            if first is None:
                continue
            if first.line.offset <= 0:
                self.at_start[key] = True
                continue
            wanted.append((key, first.line.offset))
        return wanted

    def label_width(self, cap: int = 24) -> int:
        """Width of the label column: the longest label seen, at most `cap`."""
        return min(self._label_width, cap)
