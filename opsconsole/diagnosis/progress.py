"""A run's progress as its logs show it, judged live: possible hangs and straggling ranks.

`stalls.py` holds the pure rules; this keeps what they need for the console and turns their
answers into Findings (so the findings list, the alerts and recordings take them like any other).
Pure Python: the Logs pane's feed calls `observe` with each batch of lines and `check` every few
seconds with the fleet's node states.

Which time a line counts at: its arrival, except for the last pages read when the console starts
(older lines, arriving all at once), which count at their own timestamps. A source that has not
advanced for RETIRED_AFTER (a finished run's file the glob still matches) is left out of the
comparison: it is not a straggler of this run.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from opsconsole.diagnosis.finding import Finding
from opsconsole.diagnosis.stalls import ProgressTracker, StallFinding, detect_stalls, detect_stragglers, parse_step
from opsconsole.model import NodeState

PROGRESS_CATEGORIES = ("stall", "straggler")
STARTUP_S = 3.0  # lines within this long of the first batch are the files' last pages
IDLE_UTIL = 5.0  # percent: a GPU below this is idle
STRAGGLER_STEPS = 100  # a rank this many training steps behind the others' median is a straggler
HANG_NODE = "logs"  # the alert's node for a hang of the whole run (it has no one source)


def straggler_after(stall_after: float) -> float:
    """Seconds a rank's log may lag the others' before it is a straggler: a fifth of stall_after but
    at least a minute (a rank that logs once a minute is not behind), and never more than stall_after."""
    return min(stall_after, max(60.0, stall_after / 5.0))


def fleet_activity(states: Mapping[str, NodeState]) -> Tuple[bool, bool]:
    """(training processes alive, every GPU idle) from the live nodes' last frames.

    Without GPUs in any frame neither is known: (False, False), and no hang is reported on the
    logs alone (a run that ended also stops logging)."""
    processes = False
    utils: List[float] = []
    for state in states.values():
        frame = state.frame
        if frame is None or not state.is_live:
            continue
        processes = processes or bool(frame.processes)
        utils.extend(g.utilization_gpu for g in frame.gpus if g.utilization_gpu is not None)
    if not utils:
        return False, False
    return processes, max(utils) < IDLE_UTIL


def as_finding(stall: StallFinding, now: float) -> Finding:
    return Finding(
        line=0,
        category=stall.category,
        severity=stall.severity,
        title=stall.title,
        cause=stall.cause,
        remedy=stall.remedy,
        excerpt=stall.excerpt,
        source=None if stall.source is None else str(stall.source),
        rank=stall.rank,
        time=now,
    )


class ProgressSummary:
    """A findings-list row for the hangs or the stragglers of now (the fields FindingsList reads):
    one row per category, as the diagnosis's rows are."""

    def __init__(self, findings: Sequence[Finding], since: float) -> None:
        first = findings[0]
        self.category, self.title, self.severity = first.category, first.title, first.severity
        self.cause, self.remedy = first.cause, first.remedy
        self.count = len(findings)
        self.first, self.last = first, findings[-1]
        self.first_seen, self.last_seen = since, self.last.time
        self.ranks: Tuple[int, ...] = tuple(sorted({f.rank for f in findings if f.rank is not None}))
        self.sources: Tuple[str, ...] = tuple(f.source for f in findings if f.source is not None)


class RunProgress:
    """ProgressTracker plus the hangs and stragglers found at the last check."""

    def __init__(self, stall_after: float) -> None:
        self.stall_after = stall_after
        self.lag_after = straggler_after(stall_after)
        self.retired_after = max(3600.0, 6 * stall_after)
        self.tracker = ProgressTracker()
        self.node_of: Dict[str, str] = {}
        self._started: Optional[float] = None
        self._current: Dict[Tuple[str, Optional[str]], Tuple[Finding, float]] = {}  # -> (finding, since)

    def observe(self, lines: Sequence, now: float) -> None:
        if self._started is None:
            self._started = now
        initial = 0 <= now - self._started < STARTUP_S
        # Once per source of the batch, not once per line (a log's first page is thousands of lines):
        # its latest time, and the newest line that reports a rank and a step, found from the end.
        runs: Dict[int, List[Any]] = {}  # id(source) -> [source, latest time, its lines' positions]
        for position, line in enumerate(lines):
            when = now
            if initial and line.time is not None:
                when = min(now, line.time)
            run = runs.get(id(line.source))
            if run is None:
                runs[id(line.source)] = [line.source, when, [position]]
            else:
                if when > run[1]:
                    run[1] = when
                run[2].append(position)
        for source, when, positions in runs.values():
            newest = lines[positions[-1]]
            rank = newest.rank if newest.rank is not None else getattr(source, "rank", None)
            if rank is None:  # as line by line: the last rank a line of the source named
                rank = next((lines[i].rank for i in reversed(positions) if lines[i].rank is not None), None)
            step_text = next((lines[i].text for i in reversed(positions) if parse_step(lines[i].text) is not None), "")
            key = source.key
            self.tracker.observe(key, when, step_text, rank)
            self.node_of[key] = source.node

    def check(self, states: Mapping[str, NodeState], now: float) -> Tuple[List[Tuple[Finding, str]], bool]:
        """([(finding, node)] new since the last check, whether the current set changed)."""
        advance = {key: when for key, when in self.tracker.last_advance.items() if now - when < self.retired_after}
        steps = {key: step for key, step in self.tracker.steps.items() if key in advance}
        alive, idle = fleet_activity(states)
        found = detect_stalls(advance, now, self.stall_after, processes_alive=alive, gpus_idle=idle)
        found += detect_stragglers(
            advance, now, self.lag_after, steps=steps, lag_steps=STRAGGLER_STEPS, ranks=self.tracker.ranks
        )
        current: Dict[Tuple[str, Optional[str]], Tuple[Finding, float]] = {}
        new: List[Tuple[Finding, str]] = []
        for stall in found:
            finding = as_finding(stall, now)
            key = (finding.category, finding.source)
            previous = self._current.get(key)
            current[key] = (finding, previous[1] if previous else now)
            if previous is None:
                new.append((finding, self.node_of.get(finding.source or "", HANG_NODE)))
        changed = {k: f.excerpt for k, (f, _) in current.items()} != {
            k: f.excerpt for k, (f, _) in self._current.items()
        }
        self._current = current
        return new, changed

    def summaries(self) -> List[ProgressSummary]:
        """One row per category (hang, stragglers), the earliest found first within it."""
        rows: List[ProgressSummary] = []
        for category in PROGRESS_CATEGORIES:
            kept = sorted((since, f.source or "", f) for (c, _), (f, since) in self._current.items() if c == category)
            if kept:
                rows.append(ProgressSummary([f for _, _, f in kept], kept[0][0]))
        return rows
