"""The console's log feed: runs the LogHub and the log diagnosis, and hands lines and findings on.

No widgets here: the Logs pane (opsconsole/tui/logs.py) builds a LogFeed with its two delivery
callbacks, a Diagnoser and a RunProgress (both from opsconsole.diagnosis, given rather than imported:
diagnosis reads what logs/ defines), and draws what they deliver.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from opsconsole.logs.records import LogLine
from opsconsole.model import NodeState, replace_decoded

log = logging.getLogger(__name__)

# A line stamped this much before the console started is from before it (clocks of nodes and the
# console differ by a little; a line written during the start must not count as old).
BEFORE_START_SLACK_S = 5.0
# A finding from before the start still competes for the root cause with those written since when it is stamped
# this close before them: torch.distributed's default process-group timeout (30 min) is how long peers can wait in
# a collective for a rank that failed before the console started. An older or unstamped one (a previous run's
# failure still in the file) does not outrank what is failing now.
EARLIER_CAUSE_WINDOW_S = 1800.0

Deliver = Callable[[Sequence[LogLine], List[Any]], None]


class LineDiagnoser(Protocol):
    """What the feed uses of opsconsole.diagnosis.engine.Diagnoser."""

    def feed(self, line: LogLine) -> Any: ...

    def summary(self) -> Sequence[Any]: ...

    def root_cause(self) -> Any: ...


Precedence = Callable[[str, bool], int]  # opsconsole.diagnosis.engine.precedence: lower is more fundamental


class ProgressWatch(Protocol):
    """What the feed uses of opsconsole.diagnosis.progress.RunProgress (hangs and stragglers)."""

    def observe(self, lines: Sequence[LogLine], now: float) -> None: ...

    def check(self, states: Mapping[str, NodeState], now: float) -> Tuple[List[Tuple[Any, str]], bool]: ...

    def summaries(self) -> Sequence[Any]: ...


def fleet_links(fleet: Any) -> Dict[str, Any]:
    """The fleet's links by node name (a replay has none, a fake may have none: local files only)."""
    links = {}
    for name in list(fleet.names):
        try:
            links[name] = fleet.link(name)
        except KeyError:
            continue
    return links


class LogFeed:
    """Runs the LogHub and the Diagnoser for the console: lines go to `deliver` as they come, then the
    findings the diagnosis found in them to `deliver_findings`."""

    def __init__(
        self,
        hub: Any,
        diagnoser: LineDiagnoser,
        deliver: Deliver,
        deliver_findings: Deliver,
        progress: ProgressWatch,
        precedence: Optional[Precedence] = None,
        deliver_handled: Optional[Callable[[List[Any]], None]] = None,
    ) -> None:
        self.hub = hub
        self.diagnoser = diagnoser
        self.deliver = deliver
        self.deliver_findings = deliver_findings
        self.findings_version = 0  # bumped when a line matched: the findings list redraws
        self.diagnosis_problem: Optional[str] = None
        self.now = time.time
        self._last_time: Dict[str, float] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.progress = progress
        self.started_at: Optional[float] = None  # when following began
        self._reading_backlog = False  # while the hub delivers the files' last pages at start
        self.precedence = precedence
        # Per category: the latest time of its findings from before the start (None: none stamped), and the
        # earliest of those written since; the root cause the pane shows is taken from these (summary()).
        self._earlier: Dict[str, Optional[float]] = {}
        self._live: Dict[str, float] = {}
        # Findings the diagnosis later showed handled (the rank went on training after the exception) go to
        # deliver_handled, which withdraws their alerts; how many were handed on so far.
        self.deliver_handled = deliver_handled
        self._handled_seen = 0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.started_at = self.now()
        self._reading_backlog = True  # local files' last pages arrive before hub.start returns
        try:
            await self.hub.start(self.on_lines)
        finally:
            self._reading_backlog = False

    def before_start(self, line: LogLine) -> bool:
        """Whether `line` was written before the console started: it was in a file's last page read at
        the start, or its timestamp (its own, or the record above it) is older than the start. Its
        findings are listed as earlier, not fired as new alerts."""
        if self._reading_backlog or line.earlier:
            return True
        started = self.started_at
        return started is not None and line.time is not None and line.time < started - BEFORE_START_SLACK_S

    async def stop(self) -> None:
        """Stop the followers; a failure is logged, so the console still closes the fleet after it."""
        try:
            await self.hub.stop()
        except Exception:
            log.exception("log hub failed to stop")

    def on_lines(self, lines: Sequence[LogLine]) -> None:
        """LogHub's callback: diagnose each line, then hand lines and findings on (in the app's loop)."""
        if self._loop is not None and threading.current_thread() is not threading.main_thread():
            self._loop.call_soon_threadsafe(self.on_lines_in_loop, list(lines))
        else:
            self.on_lines_in_loop(lines)

    def on_lines_in_loop(self, lines: Sequence[LogLine]) -> None:
        self.progress.observe(lines, self.now())
        lines = self.with_times(lines)
        # The lines first, then their diagnosis: a log's first page is on screen without waiting for it.
        self.deliver(lines, [None] * len(lines))
        findings = self.diagnose(lines)
        if any(finding is not None for finding in findings):
            self._note_when(lines, findings)
            self.deliver_findings(lines, findings)
        self._hand_on_handled()

    def _hand_on_handled(self) -> None:
        """Findings shown handled since the last batch (a step after an exception): the list and alerts drop them."""
        since = getattr(self.diagnoser, "handled_since", None)
        if since is None:
            return
        handled = since(self._handled_seen)
        if not handled:
            return
        self._handled_seen += len(handled)
        self.findings_version += 1  # the findings list redraws without them
        if self.deliver_handled is not None:
            self.deliver_handled(list(handled))

    def check_progress(self, states: Mapping[str, NodeState]) -> List[Tuple[Any, str]]:
        """Hangs and stragglers as of now (RunProgress): the (finding, node) that are new."""
        new, changed = self.progress.check(states, self.now())
        if changed:
            self.findings_version += 1
        return new

    def with_times(self, lines: Sequence[LogLine]) -> List[LogLine]:
        """Give a line without a timestamp its predecessor's time in its source (a traceback's lines
        take the time of the record above them), or its arrival time; findings then say when. A line read
        from the files' last pages at the start with no stamped line above it keeps no time: it was written
        at some time before the start, not when the console started; so does a line of a remote node's first read
        of a file (LogLine.earlier: its last page, which arrives once the node's follower runs)."""
        timed: List[LogLine] = []
        source: Any = None
        key = ""
        for line in lines:
            if line.source is not source:  # LogSource.key builds its string on every call
                source, key = line.source, line.source.key
            when = line.time
            if when is None:
                when = self._last_time.get(key)
                if when is None and (self._reading_backlog or line.earlier):
                    # Already in the file at the start, with no stamped line above it: when it was written is
                    # not known (it is not the console's start time); its findings are "before start".
                    timed.append(line)
                    continue
                if when is None:
                    when = self.now()
                line = replace_decoded(line, {"time": when})  # replace() without __init__
            self._last_time[key] = when
            timed.append(line)
        return timed

    def diagnose(self, lines: Sequence[LogLine]) -> List[Any]:
        findings: List[Any] = []
        for line in lines:
            try:
                finding = self.diagnoser.feed(line)
            except Exception as exc:  # one bad line must not stop the rest being shown
                if self.diagnosis_problem is None:
                    log.exception("diagnosis failed on a line")
                    self.diagnosis_problem = "diagnosis failed on a line: %s" % exc
                finding = None
            if finding is not None:
                self.findings_version += 1
            findings.append(finding)
        return findings

    def problems(self) -> Dict[str, str]:
        try:
            return dict(self.hub.problems())
        except Exception as exc:
            return {"logs": "problems unavailable: %s" % exc}

    def sources(self) -> List[Any]:
        try:
            return list(self.hub.sources())
        except Exception:
            return []

    def summary(self) -> Tuple[List[Any], Any]:
        """The diagnosis's rows, then the hangs and stragglers the logs' progress shows now; and the root cause:
        the diagnosis's, unless it was only seen before the start and something fails now (see live_root)."""
        rows = list(self.diagnoser.summary())
        return rows + list(self.progress.summaries()), self.live_root(rows, self.diagnoser.root_cause())

    def _note_when(self, lines: Sequence[LogLine], findings: Sequence[Any]) -> None:
        for line, finding in zip(lines, findings):
            if finding is None:
                continue
            category = finding.category
            when = getattr(finding, "time", None)
            if self.before_start(line):
                known = self._earlier.get(category)
                self._earlier[category] = when if known is None else (known if when is None else max(known, when))
            else:
                when = when if when is not None else self.now()
                self._live[category] = min(self._live.get(category, when), when)

    def earlier_categories(self) -> List[str]:
        """Categories seen only in lines written before the console started (a previous failure in the files)."""
        return [category for category in self._earlier if category not in self._live]

    def live_root(self, rows: Sequence[Any], root: Any) -> Any:
        """The root cause to show: the diagnosis's, unless its category was seen only before the start, is not
        stamped within EARLIER_CAUSE_WINDOW_S before what fails now, and something fails now; then the most
        fundamental of the categories that could have caused what is failing now (`precedence`), earliest first."""
        category = root if isinstance(root, str) else getattr(root, "category", None)
        if category is None or not self._live or not self._stale(category):
            return root
        candidates = [row for row in rows if not self._stale(str(getattr(row, "category", "")))]
        if not candidates:
            return root

        def rank(row: Any) -> Tuple[int, float]:
            first = getattr(row, "first", None)
            weak = bool(getattr(first, "weak", False))
            order = self.precedence(row.category, weak) if self.precedence is not None else 0
            seen = getattr(row, "first_seen", None)
            return order, seen if seen is not None else float("inf")

        return min(candidates, key=rank).category

    def _stale(self, category: str) -> bool:
        """Seen only before the start, and not stamped close enough before what fails now to have caused it."""
        if category not in self._earlier or category in self._live:
            return False
        when = self._earlier[category]
        return when is None or when < min(self._live.values()) - EARLIER_CAUSE_WINDOW_S

    async def older(self, source_key: str, before_offset: int, count: int) -> List[LogLine]:
        return list(await self.hub.older(source_key, before_offset, count))

    async def last_lines(self, source_key: str, count: int) -> List[LogLine]:
        return list(await self.hub.last_lines(source_key, count))


__all__ = ["BEFORE_START_SLACK_S", "EARLIER_CAUSE_WINDOW_S", "LineDiagnoser", "LogFeed", "ProgressWatch", "fleet_links"]
