"""ProcessGroupNCCL's watchdog lines across ranks: the rank that never reached the collective.

When a collective times out, every rank whose watchdog notices prints how far it got in that
process group (torch 2.2 onwards; the wording moved between releases, all seen in real logs):

    [rank4]:[E318 ...] [PG ID 2 PG GUID 9 Rank 4] Timeout at NCCL work: 610, last enqueued NCCL work: 616, last completed NCCL work: 609.
    [rank1]:[E626 ...] [PG ID 0 PG GUID 0(default_pg) Rank 1] Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, last completed NCCL work: 807.
    [rank118]:[E603 ...] [PG ID 0 PG GUID 0(default_pg) Rank 118]  failure detected by watchdog at work sequence id: 2398459 PG status: last enqueued work: 2398578, last completed work: 2398458
    [rank1]:[E626 ...] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.

A rank that is still in Python (a data loader, a checkpoint write, a different branch) has
enqueued fewer collectives of that group than the ranks waiting for it: the rank with the lowest
"last enqueued" (strictly below the others) is the one that never reached the collective. When
every rank says -1 for both, none of them got anywhere in that group: the processes froze (a
file-system stall, a deadlock before the first collective), which is not NCCL's doing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

MAX_KEPT = 100_000  # (rank, group) pairs remembered; a run of 100k ranks still fits

_GLOBAL_RANK = re.compile(r"\[rank(\d{1,7})\]:")
# "[PG 1 Rank 0]", "[PG 0 (default_pg) Rank 3]", "[PG ID 2 PG GUID 9 Rank 4]", "[PG ID 0 PG GUID 0(default_pg) Rank 1]"
_GROUP = re.compile(r"\[PG (?:ID )?(\d{1,9})(?: PG GUID \d{1,9})?\s*(?:\(([^)\]]{0,80})\))? Rank (\d{1,7})\]")
_PROGRESS = re.compile(
    r"(?:Timeout at NCCL work|detected by watchdog at work(?: sequence id)?): (-?\d{1,19}),?"
    r".{0,40}?last enqueued (?:NCCL )?work: (-?\d{1,19}), last completed (?:NCCL )?work: (-?\d{1,19})"
)
# The heartbeat monitor's line, printed by every rank (the one that never got there too) once any
# rank timed out: "Received a dump signal due to a collective timeout from rank 1 ... Last
# enqueued NCCL work: 3, last completed: 1." (also "from this local rank", "last completed NCCL work").
_DUMP_SIGNAL = re.compile(
    r"Received a dump signal due to a collective timeout.{0,300}?Last enqueued NCCL work: (-?\d{1,19}), "
    r"last completed(?: NCCL work)?: (-?\d{1,19})"
)
_WORK = re.compile(r"WorkNCCL\(SeqNum=(\d{1,19}), OpType=([A-Z_]{1,40})(?:, NumelIn=(\d{1,20}))?")
_PLAIN_RANK = re.compile(r"\[Rank (\d{1,7})\]")


@dataclass(frozen=True)
class WatchdogReport:
    """One rank's progress in one process group, as its watchdog printed it."""

    rank: Optional[int]  # the global rank ("[rank12]:" prefix, or the line's source), else the group rank
    group: str  # "0", "2"
    group_rank: Optional[int]
    timed_out: Optional[int]  # the sequence number the watchdog timed out on
    last_enqueued: int
    last_completed: int
    line: int = 0
    source: Optional[str] = None


@dataclass(frozen=True)
class WatchdogVerdict:
    """What the watchdog lines of every rank say together."""

    kind: str  # "never_reached" | "frozen" | "all_waiting"
    group: str
    seq: Optional[int]  # the collective the others timed out on
    op: Optional[str]  # "ALLREDUCE" when a WorkNCCL line named it
    culprit_ranks: Tuple[int, ...]
    culprit_enqueued: Optional[int]
    others_enqueued: Optional[int]
    reporting_ranks: Tuple[int, ...]

    @property
    def text(self) -> str:
        return verdict_text(self)


def parse_watchdog_line(
    text: str, rank: Optional[int] = None, line: int = 0, source: Optional[str] = None
) -> Optional[WatchdogReport]:
    """A WatchdogReport from one line of the progress kinds above (None for any other line).

    `rank` is the global rank the caller already knows (the source's or a "[rankN]:" prefix it
    removed); a "[rankN]:" still in the text names it too.
    """
    found = _PROGRESS.search(text)
    if found is not None:
        timed_out, enqueued, completed = int(found.group(1)), int(found.group(2)), int(found.group(3))
    else:
        found = _DUMP_SIGNAL.search(text)
        if found is None:
            return None
        timed_out, enqueued, completed = None, int(found.group(1)), int(found.group(2))
    group = _GROUP.search(text)
    prefix = _GLOBAL_RANK.search(text)
    if rank is None and prefix is not None:
        rank = int(prefix.group(1))
    group_rank = int(group.group(3)) if group else None
    if rank is None and group is not None and group.group(1) == "0":
        rank = group_rank  # in the default group the group rank is the global rank
    return WatchdogReport(
        rank=rank,
        group=group.group(1) if group else "?",
        group_rank=group_rank,
        timed_out=timed_out,
        last_enqueued=enqueued,
        last_completed=completed,
        line=line,
        source=source,
    )


class WatchdogLines:
    """Every rank's latest watchdog report per process group, fed line by line (bounded)."""

    def __init__(self) -> None:
        self._reports: Dict[Tuple[Optional[int], str], WatchdogReport] = {}
        self._ops: Dict[int, str] = {}  # sequence number -> OpType from WorkNCCL(...) lines

    def feed(
        self, text: str, rank: Optional[int] = None, line: int = 0, source: Optional[str] = None
    ) -> Optional[WatchdogReport]:
        """Take one line; the report when it was a progress line."""
        if "WorkNCCL(" in text:  # names the op of a sequence number
            work = _WORK.search(text)
            if work is not None and len(self._ops) < MAX_KEPT:
                self._ops[int(work.group(1))] = work.group(2)
        report = parse_watchdog_line(text, rank, line, source)
        if report is None:
            return None
        key = (report.rank, report.group)
        if key in self._reports or len(self._reports) < MAX_KEPT:
            self._reports[key] = report
        return report

    def reports(self) -> List[WatchdogReport]:
        return list(self._reports.values())

    def verdict(self) -> Optional[WatchdogVerdict]:
        return watchdog_verdict(self._reports.values(), self._ops)


def watchdog_verdict(
    reports: Iterable[WatchdogReport], ops: Optional[Dict[int, str]] = None
) -> Optional[WatchdogVerdict]:
    """The rank(s) that never reached the collective, or "frozen", from every rank's reports.

    Per group: all -1 means frozen; a rank whose last enqueued is below every other's never
    reached the collective the others wait in (the lowest wins when several are below). The
    group reported first by the most ranks decides; None when no rank reported.
    """
    by_group: Dict[str, List[WatchdogReport]] = {}
    for report in reports:
        if report.rank is not None:
            by_group.setdefault(report.group, []).append(report)
    verdicts: List[WatchdogVerdict] = []
    for group, items in by_group.items():
        ranks = tuple(sorted({item.rank for item in items if item.rank is not None}))
        if all(item.last_enqueued == -1 for item in items):
            verdicts.append(WatchdogVerdict("frozen", group, None, None, (), -1, -1, ranks))
            continue
        lowest = min(item.last_enqueued for item in items)
        highest = max(item.last_enqueued for item in items)
        waited = max(
            (item.timed_out for item in items if item.timed_out is not None and item.timed_out > lowest), default=None
        )
        if waited is not None:
            seq: Optional[int] = waited
        else:
            seq = max((item.timed_out for item in items if item.timed_out is not None), default=None)
        op = (ops or {}).get(seq) if seq is not None else None
        if lowest < highest:
            culprits = tuple(
                sorted(item.rank for item in items if item.last_enqueued == lowest and item.rank is not None)
            )
            verdicts.append(
                WatchdogVerdict(
                    "never_reached",
                    group,
                    lowest + 1 if waited is None else waited,
                    op,
                    culprits,
                    lowest,
                    highest,
                    ranks,
                )
            )
        else:
            verdicts.append(WatchdogVerdict("all_waiting", group, seq, op, (), lowest, highest, ranks))
    if not verdicts:
        return None
    order = {"never_reached": 0, "frozen": 1, "all_waiting": 2}
    return min(verdicts, key=lambda v: (order[v.kind], -len(v.reporting_ranks), v.group))


def rank_list(ranks: Iterable[int]) -> str:
    """ "0-4, 6, 8-15" for a set of ranks."""
    ordered = sorted(set(ranks))
    parts: List[str] = []
    index = 0
    while index < len(ordered):
        end = index
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        parts.append(str(ordered[index]) if end == index else "%d-%d" % (ordered[index], ordered[end]))
        index = end + 1
    return ", ".join(parts)


_ranks = rank_list


def verdict_text(verdict: WatchdogVerdict) -> str:
    """One sentence naming the rank, the collective and the group, or the freeze."""
    if verdict.kind == "frozen":
        return (
            "NCCL watchdog: ranks %s report no collective ever enqueued or completed in group %s (all -1): "
            "the processes froze before or outside NCCL (a file-system stall, a deadlock), not a collective"
            % (_ranks(verdict.reporting_ranks), verdict.group)
        )
    collective = "collective %s%s" % (
        verdict.seq if verdict.seq is not None else "?",
        " (%s)" % verdict.op if verdict.op else "",
    )
    if verdict.kind == "never_reached":
        word = "rank" if len(verdict.culprit_ranks) == 1 else "ranks"
        return "NCCL watchdog: %s %s never reached %s of group %s: last enqueued %s there, the other ranks %s" % (
            word,
            _ranks(verdict.culprit_ranks),
            collective,
            verdict.group,
            verdict.culprit_enqueued,
            verdict.others_enqueued,
        )
    return (
        "NCCL watchdog: every reporting rank (%s) enqueued %s of group %s and waits in it: the rank that never "
        "reached it printed no watchdog line, or the collective itself is stuck (network, GPU)"
        % (_ranks(verdict.reporting_ranks), collective, verdict.group)
    )
