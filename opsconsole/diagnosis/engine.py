"""The root-cause engine: streams log lines through the signatures and says which failure caused the rest.

`Diagnoser` is fed every line of every rank (`feed` for LogLine records from the followers,
`feed_text` for plain text); it keeps bounded state per source and rank (whether the last line was
a Python traceback frame, whose next line quotes source code rather than an error; the last line,
for NCCL's "Last error:" details; where a peer last closed its connection, since NCCL's generic
"unhandled system error" / "ncclInternalError" within PEER_GONE_WINDOW lines after that means the
peer went away, nccl_remote), a capped list of findings and exact per-category aggregates.
Rank prefixes in lines ("[rank3]:", "[default3]:", srun's "3: ") label the findings and keep
interleaved ranks' tracebacks apart. `diagnose_lines` runs it over one input, for `opsconsole
diagnose` and reports.

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
from opsconsole.diagnosis.signatures import ROLE_GENERIC, ROLE_PEER_GONE, match_roles

MAX_FINDINGS = 10_000  # findings kept for jump-to; the per-category counts stay exact beyond it
MAX_SOURCES = 4096  # per-source traceback state; the oldest source's state is dropped beyond it
EXCERPT_CHARS = 400
MAX_SCAN_CHARS = 64 * 1024  # a line is matched on its first 64 KiB (the followers cut display there too)

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

# "[rank3]:" (torch's C++ log prefix), "[default3]:" (torchrun --tee), possibly after a pid or host
# column ("[80746] [rank0]:", "gpu07: [rank3]:"); srun --label writes "3: ". A rank has at most 7
# digits: int() of a 5000-digit "rank" raised ValueError (Python's digit limit).
_RANK_PREFIX = re.compile(r"^\s*(?:\S+\s+){0,2}?\[(?:rank|default|trainer)([0-9]{1,7})\]:\s?")
_SRUN_LABEL = re.compile(r"^\s{0,4}([0-9]{1,5}): ")
_RANK_IN_TEXT = re.compile(r"\[Rank ([0-9]{1,7})\]|\brank(?: |: |=)([0-9]{1,7}) \(local_rank|\bRank ([0-9]{1,7})\] ")
# A Python traceback frame; the line after it (indented two more) quotes source code, not an error.
_FRAME = re.compile(r'File "[^"]*", line \d+')
_LAST_ERROR = "Last error:"  # NCCL's detail follows on the next line
PEER_GONE_WINDOW = 50  # lines after a peer's connection went away in which NCCL's generic errors mean that


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
    summary: Tuple[FindingSummary, ...] = ()  # one row per category, root cause first
    lines: int = 0  # lines read
    dropped: int = 0  # findings beyond max_findings (counted in the summary, not listed)


@dataclass
class _SourceState:
    frame_col: int = -1  # where the last line's 'File "..."' began, or -1 after any other line
    last_text: str = ""
    peer_gone_line: int = -PEER_GONE_WINDOW - 1  # the last line saying a peer closed its connection


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
        if len(text) > MAX_SCAN_CHARS:
            text = text[:MAX_SCAN_CHARS]
        body = text
        line_rank = None
        prefix = _RANK_PREFIX.match(text) if "]:" in text[:80] else None
        if prefix is None and text[:1] in " 0123456789":
            prefix = _SRUN_LABEL.match(text)
        if prefix:
            body = text[prefix.end():]
            line_rank = int(prefix.group(1))
            if rank is None:
                rank = line_rank
        # Interleaved ranks each get their own traceback state.
        state = self._state((key or "") if line_rank is None else "%s\0%d" % (key or "", line_rank))
        previous = state.last_text
        state.last_text = body
        if self._is_code(state, body):
            return None
        matches = match_roles(body)
        if not matches:
            return None
        if any(role == ROLE_PEER_GONE for _, _, role in matches):
            state.peer_gone_line = number
        elif 0 <= number - state.peer_gone_line <= PEER_GONE_WINDOW:
            # "unhandled system error" / "ncclInternalError" just after a peer vanished: that peer is the story.
            matches = [("nccl_remote", True, ROLE_PEER_GONE) if role == ROLE_GENERIC else (category, weak, role)
                       for category, weak, role in matches]
        category, weak, _ = min(matches, key=lambda match: precedence(match[0], match[1]))
        if rank is None:
            found = _RANK_IN_TEXT.search(body)
            if found:
                rank = int(next(group for group in found.groups() if group is not None))
        excerpt = body
        if previous.strip() == _LAST_ERROR:
            excerpt = _LAST_ERROR + " " + body.strip()
        finding = self._finding(category, weak, number, excerpt, key, rank, time)
        self._record(finding)
        return finding

    @staticmethod
    def _is_code(state: _SourceState, body: str) -> bool:
        """Whether the line is a traceback frame or the source line quoted under one."""
        column, state.frame_col = state.frame_col, -1
        if 'File "' in body:
            frame = _FRAME.search(body)
            if frame:
                state.frame_col = frame.start()
                return True
        return column >= 0 and body[column:column + 2] == "  " and bool(body[column + 2:].strip())

    def _state(self, key: str) -> _SourceState:
        state = self._sources.get(key)
        if state is None:
            if len(self._sources) >= MAX_SOURCES:
                self._sources.pop(next(iter(self._sources)))
            state = self._sources[key] = _SourceState()
        return state

    def _finding(self, category: str, weak: bool, number: int, body: str,
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


def diagnose_lines(lines: Iterable[str], source: Optional[str] = None,
                   max_findings: int = MAX_FINDINGS) -> Diagnosis:
    """Diagnose one input's lines (newlines stripped here); line numbers start at 1."""
    diagnoser = Diagnoser(max_findings=max_findings)
    number = 0
    for number, text in enumerate(lines, 1):
        diagnoser.feed_text(text.rstrip("\r\n"), number, source)
    return Diagnosis(root_cause=diagnoser.root_cause(), findings=tuple(diagnoser.findings()),
                     summary=tuple(diagnoser.summary()), lines=number, dropped=diagnoser.dropped)
