"""Hangs and stragglers from how the logs advance: pure functions over last-advance times and steps.

A run whose every log has stopped advancing for `stall_after` while its processes live and its GPUs
idle is a possible hang (the troubleshooting chapter's deadlock section: a collective or barrier that
only some ranks reached). A rank whose log lags the others, by the time it last advanced or by the
training step its lines report, is a straggler. `ProgressTracker` keeps what these need, bounded.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Dict, Hashable, List, Mapping, Optional

from opsconsole.diagnosis.finding import Severity
from opsconsole.diagnosis.knowledge import STALL_CATEGORY, STRAGGLER_CATEGORY
from opsconsole.units import format_duration

DEFAULT_STALL_AFTER = 600.0  # seconds; the config's [logs] stall_after when set


@dataclass(frozen=True)
class StallFinding:
    """A possible hang of the run (source None) or one straggling source, Finding-like for the UI."""

    category: str  # "stall" or "straggler"
    title: str
    severity: Severity
    cause: str
    remedy: str
    excerpt: str  # one line saying what was measured
    source: Optional[Hashable] = None
    idle_s: Optional[float] = None  # seconds since the log last advanced
    lag_s: Optional[float] = None  # straggler: seconds behind the others' median
    lag_steps: Optional[int] = None  # straggler: steps behind the others' median
    line: int = 0
    rank: Optional[int] = None
    time: Optional[float] = None


def stall_after_from(config) -> float:
    """The configured [logs] stall_after, or the default while the section has no such key."""
    logs = getattr(config, "logs", None)
    value = getattr(logs, "stall_after", DEFAULT_STALL_AFTER) if logs is not None else DEFAULT_STALL_AFTER
    try:
        return float(value)
    except (TypeError, ValueError):
        return DEFAULT_STALL_AFTER


def detect_stalls(
    progress: Mapping[Hashable, float],
    now: float,
    stall_after: float = DEFAULT_STALL_AFTER,
    processes_alive: bool = True,
    gpus_idle: bool = True,
) -> List[StallFinding]:
    """A possible hang when no source advanced for stall_after while processes live and GPUs idle."""
    if not progress or not processes_alive or not gpus_idle or stall_after <= 0:
        return []
    newest = max(progress.values())
    idle = now - newest
    if idle < stall_after:
        return []
    entry = STALL_CATEGORY
    excerpt = "no log of %d source(s) advanced for %s (stall_after %s); processes alive, GPUs idle" % (
        len(progress),
        format_duration(idle),
        format_duration(stall_after),
    )
    return [
        StallFinding(
            category=entry.id,
            title=entry.title,
            severity=entry.severity,
            cause=entry.cause,
            remedy=entry.remedy,
            excerpt=excerpt,
            idle_s=idle,
            time=newest,
        )
    ]


def detect_stragglers(
    progress: Mapping[Hashable, float],
    now: float,
    lag_after: float,
    steps: Optional[Mapping[Hashable, int]] = None,
    lag_steps: int = 0,
    ranks: Optional[Mapping[Hashable, int]] = None,
) -> List[StallFinding]:
    """Sources whose log lags the others' median by lag_after seconds, or by lag_steps steps.

    Needs at least two sources to compare; a source counts against the median of the others, so one
    straggler among two still shows. When every source is idle it is a stall, not a straggler.
    """
    found: Dict[Hashable, StallFinding] = {}
    if len(progress) >= 2 and lag_after > 0:
        for key, last in progress.items():
            others = [value for other, value in progress.items() if other != key]
            median = statistics.median(others)
            lag = median - last
            if lag >= lag_after and now - median < lag_after:  # the others are still advancing
                found[key] = _straggler(
                    key,
                    "log last advanced %s behind the other ranks (idle %s)"
                    % (format_duration(lag), format_duration(now - last)),
                    ranks,
                    idle_s=now - last,
                    lag_s=lag,
                )
    if steps and len(steps) >= 2 and lag_steps > 0:
        for key, step in steps.items():
            others = [value for other, value in steps.items() if other != key]
            median = statistics.median(others)
            behind = int(median - step)
            if behind >= lag_steps:
                previous = found.get(key)
                text = "at step %d, %d steps behind the other ranks (median %d)" % (step, behind, int(median))
                if previous is not None:
                    text = previous.excerpt + "; " + text
                found[key] = _straggler(
                    key,
                    text,
                    ranks,
                    idle_s=previous.idle_s if previous else None,
                    lag_s=previous.lag_s if previous else None,
                    lag_steps=behind,
                )
    return list(found.values())


def _straggler(key: Hashable, excerpt: str, ranks: Optional[Mapping[Hashable, int]], **measures) -> StallFinding:
    entry = STRAGGLER_CATEGORY
    return StallFinding(
        category=entry.id,
        title=entry.title,
        severity=entry.severity,
        cause=entry.cause,
        remedy=entry.remedy,
        excerpt=excerpt,
        source=key,
        rank=(ranks or {}).get(key),
        **measures,
    )


# "step 1200", "Step: 1200", "global_step=1200", "iteration 1200/5000", "iter [1200/5000]", "it 1200".
_STEP = re.compile(r"\b(?:global[_ ]step|step|iteration|iter)\b\s*[:=#]?\s*\[?\s*(\d+)(?:\s*/\s*\d+)?", re.IGNORECASE)
_TQDM = re.compile(r"\|\s*(\d+)/(\d+) \[")


def parse_step_counter(text: str) -> Optional[int]:
    """The step a line's own counter reports ("step 12", "iteration 7/100"), or None; a tqdm bar is not one
    (a crashing process's bar is redrawn after its traceback, so it does not show the process went on)."""
    match = _STEP.search(text)
    return int(match.group(1)) if match else None


def parse_step(text: str) -> Optional[int]:
    """The training step a line reports (step/iteration counters, a tqdm bar), or None."""
    match = _STEP.search(text)
    if match:
        return int(match.group(1))
    match = _TQDM.search(text)
    if match:
        return int(match.group(1))
    return None


class ProgressTracker:
    """When each source last advanced and the last step it reported, for detect_stalls/stragglers."""

    def __init__(self, max_sources: int = 4096) -> None:
        self.max_sources = max_sources
        self.last_advance: Dict[Hashable, float] = {}
        self.steps: Dict[Hashable, int] = {}
        self.ranks: Dict[Hashable, int] = {}

    def observe(self, key: Hashable, when: float, text: str = "", rank: Optional[int] = None) -> None:
        """Note a new line of `key` at `when` (arrival time: a log's own timestamps can be late)."""
        if key not in self.last_advance and len(self.last_advance) >= self.max_sources:
            oldest = min(self.last_advance, key=self.last_advance.get)
            for table in (self.last_advance, self.steps, self.ranks):
                table.pop(oldest, None)
        self.last_advance[key] = max(when, self.last_advance.get(key, when))
        if rank is not None:
            self.ranks[key] = rank
        if text:
            step = parse_step(text)
            if step is not None:
                self.steps[key] = step

    def observe_line(self, line, when: float) -> None:
        """Note a LogLine (opsconsole.logs.records) that arrived at `when`."""
        rank = line.rank if line.rank is not None else getattr(line.source, "rank", None)
        self.observe(line.source.key, when, line.text, rank)

    def check(
        self,
        now: float,
        stall_after: float = DEFAULT_STALL_AFTER,
        processes_alive: bool = True,
        gpus_idle: bool = True,
        lag_steps: int = 0,
    ) -> List[StallFinding]:
        """The stall (if any) and the stragglers now; stragglers lag by half of stall_after."""
        stalls = detect_stalls(self.last_advance, now, stall_after, processes_alive, gpus_idle)
        if stalls:
            return stalls
        return detect_stragglers(self.last_advance, now, stall_after / 2, self.steps, lag_steps, self.ranks)
