"""The root-cause engine: streams log lines through the signatures and says which failure caused the rest.

`Diagnoser` is fed every line of every rank (`feed` for LogLine records from the followers,
`feed_text` for plain text); it keeps bounded state per source (whether a Python traceback's frame
lines are being read, the last line for excerpts), a capped list of findings and exact per-category
aggregates. `diagnose_lines` runs it over one input, for `opsconsole diagnose` and reports.

Root cause (ROOT_CAUSE_ORDER, most fundamental first): hardware and host faults explain the CUDA
errors they provoke; a CUDA error explains the NCCL errors after it on any rank (an NCCL error after a
CUDA OOM is cuda_oom; a watchdog that reports an illegal memory access is cuda_illegal_memory, since the
line matches both and the CUDA category ranks higher); storage and data failures explain checkpoint
and loader failures; NCCL network errors explain timeouts; nccl_remote (a peer died) is a symptom
whenever any local cause is present. Weak evidence (exit code -9, a launcher's report) ranks below all
direct evidence except nccl_remote: exit code -9 with nothing else is host_oom. Ties go to the earliest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple, Union

from opsconsole.diagnosis.finding import Finding
from opsconsole.diagnosis.knowledge import CATEGORIES
from opsconsole.diagnosis.signatures import match_line

MAX_FINDINGS = 10_000  # findings kept for jump-to; the per-category counts stay exact beyond it
MAX_SOURCES = 4096  # per-source traceback state; the oldest source's state is dropped beyond it
EXCERPT_CHARS = 400

# (category, weak) from the most fundamental cause to the most symptomatic.
ROOT_CAUSE_ORDER: Tuple[Tuple[str, bool], ...] = (
    ("gpu_hardware", False),
    ("host_oom", False),  # the kernel's OOM killer line itself
    ("cuda_oom", False),
    ("disk_full", False),
    ("cuda_driver", False),
    ("cuda_invalid_device", False),
    ("cuda_peer_access", False),
    ("cuda_illegal_memory", False),
    ("cuda_device_assert", False),
    ("cuda_illegal_memory", True),  # Xid 13/31 without the CUDA error itself
    ("io_error", False),
    ("checkpoint_corrupt", False),
    ("data_corrupt", False),
    ("nan_inf", False),
    ("dataloader_worker", False),
    ("nccl_unhandled_cuda", False),
    ("dataloader_worker", True),  # "Caught X in DataLoader worker": X itself is named further down
    ("host_oom", True),  # exit code -9 / SIGKILL: explains the peers' network errors and timeouts
    ("nccl_network", False),
    ("nccl_timeout", False),
    ("nccl_remote", True),
)
_RANK_OF = {key: index for index, key in enumerate(ROOT_CAUSE_ORDER)}

_RANK_PREFIX = re.compile(r"^\s*\[(?:rank|default)(\d+)\]:\s?")
_RANK_IN_TEXT = re.compile(r"\[Rank (\d+)\]|\brank(?: |: |=)(\d+) \(local_rank")
_TRACEBACK_START = "Traceback (most recent call last):"


def precedence(category: str, weak: bool = False) -> int:
    """Position of a (category, weak) in ROOT_CAUSE_ORDER: lower is more fundamental."""
    return _RANK_OF.get((category, weak), len(ROOT_CAUSE_ORDER))


def choose_root_cause(findings: Iterable[Finding]) -> Optional[str]:
    """The category of the most fundamental finding; among equals the earliest seen."""
    best: Optional[Tuple[int, int, str]] = None
    for order, finding in enumerate(findings):
        key = (precedence(finding.category, finding.weak), order, finding.category)
        if best is None or key < best:
            best = key
    return best[2] if best else None


@dataclass
class FindingSummary:
    """All findings of one category: how often, when, on which ranks, and the first one to jump to."""

    category: str
    title: str
    severity: str
    cause: str
    remedy: str
    count: int
    first: Finding
    last: Finding
    ranks: Tuple[int, ...] = ()
    sources: Tuple[str, ...] = ()

    @property
    def first_seen(self) -> Optional[float]:
        return self.first.time

    @property
    def last_seen(self) -> Optional[float]:
        return self.last.time

    @property
    def first_line(self) -> int:
        return self.first.line

    @property
    def last_line(self) -> int:
        return self.last.line

    @property
    def first_finding(self) -> Finding:
        return self.first


@dataclass
class _Aggregate:
    first: Finding
    last: Finding
    count: int = 0
    ranks: set = field(default_factory=set)
    sources: Dict[str, None] = field(default_factory=dict)


@dataclass(frozen=True)
class Diagnosis:
    """What diagnose_lines found in one input."""

    root_cause: Optional[str]
    findings: Tuple[Finding, ...]


@dataclass
class _SourceState:
    in_traceback: bool = False
    last_text: str = ""


class Diagnoser:
    """Streaming diagnosis over the lines of any number of sources, with bounded memory."""

    def __init__(self, max_findings: int = MAX_FINDINGS) -> None:
        self.max_findings = max_findings
        self._findings: List[Finding] = []
        self.dropped = 0  # findings not kept because max_findings was reached
        self._aggregates: Dict[str, _Aggregate] = {}
        self._sources: Dict[str, _SourceState] = {}
        self._best: Optional[Tuple[int, int, str]] = None
        self._seen = 0

    # --- feeding ------------------------------------------------------------------------------------

    def feed(self, line) -> Optional[Finding]:
        """Diagnose one LogLine (opsconsole.logs.records); the Finding when the line matched."""
        source = line.source
        key = getattr(source, "key", None) or str(source)
        rank = line.rank if line.rank is not None else getattr(source, "rank", None)
        return self._feed(line.text, line.number, key, rank, line.time)

    def feed_text(self, text: str, number: int, source: Union[str, object, None] = None,
                  time: Optional[float] = None, rank: Optional[int] = None) -> Optional[Finding]:
        """Diagnose one line of plain text (number is 1-based); `source` is a name or a LogSource."""
        key = None
        if source is not None:
            key = getattr(source, "key", None) or str(source)
            if rank is None:
                rank = getattr(source, "rank", None)
        return self._feed(text, number, key, rank, time)

    def _feed(self, text: str, number: int, key: Optional[str], rank: Optional[int],
              time: Optional[float]) -> Optional[Finding]:
        state = self._state(key or "")
        body = text
        prefix = _RANK_PREFIX.match(text)
        if prefix:
            body = text[prefix.end():]
            if rank is None:
                rank = int(prefix.group(1))
        previous = state.last_text
        state.last_text = body
        # Inside a Python traceback the frame and source lines quote code, not errors: skip them.
        if state.in_traceback:
            if body.startswith((" ", "\t")) or not body:
                return None
            state.in_traceback = False
        if _TRACEBACK_START in body:  # also DataLoader's "Original Traceback"
            state.in_traceback = True
            return None
        matches = match_line(body)
        if not matches:
            return None
        category, weak = min(matches, key=lambda match: precedence(*match))
        if rank is None:
            found = _RANK_IN_TEXT.search(body)
            if found:
                rank = int(found.group(1) or found.group(2))
        finding = self._finding(category, weak, number, body, previous, key, rank, time)
        self._record(finding)
        return finding

    def _state(self, key: str) -> _SourceState:
        state = self._sources.get(key)
        if state is None:
            if len(self._sources) >= MAX_SOURCES:
                self._sources.pop(next(iter(self._sources)))
            state = self._sources[key] = _SourceState()
        return state

    def _finding(self, category: str, weak: bool, number: int, body: str, previous: str,
                 key: Optional[str], rank: Optional[int], time: Optional[float]) -> Finding:
        entry = CATEGORIES[category]
        excerpt = body.strip()
        if len(excerpt) > EXCERPT_CHARS:
            excerpt = excerpt[: EXCERPT_CHARS - 1] + "…"
        return Finding(line=number, category=category, severity=entry.severity, title=entry.title,
                       cause=entry.cause, remedy=entry.remedy, excerpt=excerpt, source=key, rank=rank,
                       time=time, weak=weak)

    def _record(self, finding: Finding) -> None:
        self._seen += 1
        if len(self._findings) < self.max_findings:
            self._findings.append(finding)
        else:
            self.dropped += 1
        aggregate = self._aggregates.get(finding.category)
        if aggregate is None:
            aggregate = self._aggregates[finding.category] = _Aggregate(first=finding, last=finding)
        aggregate.count += 1
        aggregate.last = finding
        if finding.rank is not None:
            aggregate.ranks.add(finding.rank)
        if finding.source is not None and len(aggregate.sources) < MAX_SOURCES:
            aggregate.sources[finding.source] = None
        candidate = (precedence(finding.category, finding.weak), self._seen, finding.category)
        if self._best is None or candidate < self._best:
            self._best = candidate

    # --- results ------------------------------------------------------------------------------------

    def findings(self) -> List[Finding]:
        """Every finding kept so far (the first max_findings), in the order fed."""
        return list(self._findings)

    def root_cause(self) -> Optional[str]:
        """The category that caused the others (see ROOT_CAUSE_ORDER), or None when nothing matched."""
        return self._best[2] if self._best else None

    def summary(self) -> List[FindingSummary]:
        """One row per category: the root cause first, then by severity and first appearance."""
        root = self.root_cause()
        rows = []
        for category, aggregate in self._aggregates.items():
            entry = CATEGORIES[category]
            rows.append(FindingSummary(
                category=category, title=entry.title, severity=entry.severity, cause=entry.cause,
                remedy=entry.remedy, count=aggregate.count, first=aggregate.first, last=aggregate.last,
                ranks=tuple(sorted(aggregate.ranks)), sources=tuple(aggregate.sources)))
        severity_order = {"critical": 0, "error": 1, "warning": 2}
        rows.sort(key=lambda row: (row.category != root, severity_order.get(row.severity, 3),
                                   row.first.time if row.first.time is not None else float("inf"),
                                   row.first.line))
        return rows

    def reset(self) -> None:
        """Forget everything (the console's "clear findings")."""
        self.__init__(self.max_findings)


def diagnose_lines(lines: Iterable[str], source: Optional[str] = None) -> Diagnosis:
    """Diagnose one input's lines (newlines stripped here); line numbers start at 1."""
    diagnoser = Diagnoser()
    for number, text in enumerate(lines, 1):
        diagnoser.feed_text(text.rstrip("\r\n"), number, source)
    return Diagnosis(root_cause=diagnoser.root_cause(), findings=tuple(diagnoser.findings()))
