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

A Python traceback is a finding of its own: its exception line (type and message, with the innermost
frame outside site-packages) is app_error unless a line of the same traceback, chained ones included,
matched a specific category (a CUDA, NCCL, data, checkpoint or I/O error wins over the generic one).
torchelastic's failure table (launcher.FailureTable) gives the findings on its lines the failing
child's rank and failure time; a SIGKILL (exit code -9, 137, "Killed") without the OOM killer's own line
is rank_crashed (weak: who sent it, the OOM killer, a scheduler's limit or a kill -9, is not known), and
host_oom needs that line (evidence "seen") or an allocation refused in the process. Times come from each line's own stamp
or the latest stamped line of its source (timestamps.py), parsed only when a line is a finding.

Root cause (ROOT_CAUSE_ORDER, most fundamental first): hardware and host faults explain the CUDA
errors they provoke; a CUDA error explains the NCCL errors after it on any rank (an NCCL error after a
CUDA OOM is cuda_oom; a watchdog that reports an illegal memory access is cuda_illegal_memory, since the
line matches both and the CUDA category ranks higher); storage and data failures explain checkpoint
and loader failures; NCCL network errors explain timeouts; nccl_remote (a peer died) is a symptom
whenever any local cause is present. Weak evidence (exit code -9, a launcher's report) ranks below all
direct evidence except nccl_remote: exit code -9 with nothing else is rank_crashed, killed by SIGKILL. app_error (a rank's
own exception) ranks below every specific direct category and above the weak ones and the NCCL
consequences. Ties go to the earliest in time (then the first fed): across the files of a run, the rank
that failed first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from opsconsole.diagnosis.finding import Category, Finding
from opsconsole.diagnosis.knowledge import (
    CATEGORIES,
    COLLECTIVE_MISMATCH_REMEDY,
    GLOO_PEER_LOST_CAUSE,
    GLOO_PEER_LOST_TITLE,
    GLOO_TIMEOUT_CAUSE,
    GLOO_TIMEOUT_REMEDY,
    GLOO_TIMEOUT_TITLE,
    HOST_ALLOCATION_REFUSED_CAUSE,
    HOST_ALLOCATION_REFUSED_REMEDY,
    HOST_ALLOCATION_REFUSED_TITLE,
    HOST_OOM_SEEN_CAUSE,
    INDEX_ERROR_REMEDY,
    MISSING_PATH_REMEDY,
    RANK_CRASH_REMEDIES,
    SIGKILL_CAUSE,
    SIGKILL_TITLE,
    STOPPED_CATEGORY,
    rank_crash_text,
)
from opsconsole.diagnosis.launcher import (
    OTHER_FAILURES_HEADER,
    ROOT_CAUSE_HEADER,
    FailureTable,
    LauncherFailure,
)
from opsconsole.diagnosis.signatures import (
    INF_WORD,
    NAN_WORD,
    ROLE_BARE_EXCEPTION,
    ROLE_GENERIC,
    ROLE_PEER_GONE,
    SURROGATE,
    find_needles,
    match_positions,
    positions_of,
)
from opsconsole.diagnosis.stalls import parse_step_counter
from opsconsole.diagnosis.timestamps import line_time, may_carry_time
from opsconsole.diagnosis.watchdog import WatchdogLines, WatchdogVerdict
from opsconsole.health import xid

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
    ("app_error", False),  # a rank's own exception that no specific category explains
    ("dataloader_worker", True),  # "Caught X in DataLoader worker": X itself is named further down
    ("rank_crashed", True),  # SIGKILL without the OOM killer's line: explains the peers' errors and timeouts
    ("nccl_network", False),
    ("nccl_timeout", False),
    ("nccl_remote", True),
)
_RANK_OF = {key: index for index, key in enumerate(ROOT_CAUSE_ORDER)}
# Root causes that watchdog lines refine: the rank that never reached the collective caused them.
WATCHDOG_CATEGORIES = frozenset(("nccl_timeout", "nccl_remote", "nccl_network"))

# "[rank3]:" (torch's C++ log prefix), "[default3]:" (torchrun --tee), possibly after a pid or host
# column ("[80746] [rank0]:", "gpu07: [rank3]:"); srun --label writes "3: ". A rank has at most 7
# digits: int() of a 5000-digit "rank" raised ValueError (Python's digit limit). torchrun --tee puts its
# "[default1]:" (the local rank) before torch's own "[rank1]:" (the global rank): both go, the global wins.
# An exception is handled when its source logs a stamped training step within this many lines after it.
HANDLED_WITHIN_LINES = 20_000
# A library saying it caught an out-of-memory error and carries on: fairseq's trainer ("attempting to recover from
# OOM in forward/backward pass", "OOM in all workers, skipping update", after its "OOM: Ran out of memory with
# exception: ...") and Lightning's batch size finder ("Batch size 128 failed, trying batch size 64").
_OOM_RECOVERY = re.compile(
    r"attempting to recover from OOM|OOM in all workers, skipping update|\bBatch size \d+ failed, trying batch size \d+"
)
_RANK_PREFIX = re.compile(
    r"^\s*(?:\S+\s+){0,2}?\[(?:rank|default|trainer)([0-9]{1,7})\]:\s?(?:\[rank([0-9]{1,7})\]:\s?)?"
)
_SRUN_LABEL = re.compile(r"^\s{0,4}([0-9]{1,5}): ")
# Launchers name the failed process by its local rank (torchelastic, DeepSpeed) or task id (srun).
_RANK_IN_TEXT = re.compile(
    r"\[Rank ([0-9]{1,7})\]|\brank(?: |: |=)([0-9]{1,7}) \(local_rank|\bRank ([0-9]{1,7})\] "
    r"|\blocal_rank: ([0-9]{1,7}) \(pid|--local_rank=([0-9]{1,7})\b|\btask ([0-9]{1,7}): "
)
# torch.multiprocessing.spawn's report: the traceback below it is that process's.
_SPAWN_FAILED = re.compile(r"-- Process ([0-9]{1,7}) terminated with the following error:")
# A Python traceback frame; the line after it (indented two more) quotes source code, not an error.
_FRAME = re.compile(r'File "([^"]*)", line (\d+)(?:, in (\S+))?')
_TRACEBACK_HEADER = "(most recent call last):"  # "Traceback ...", "Original Traceback ..." (DataLoader workers)
_CALL_LAST = "(most recent call last)"  # also rich's boxed header, "╭──── Traceback (most recent call last) ────╮"
# Frames that say a traceback was raised while the process group was being set up: a peer's connection lost
# there is the network's story (no peer has run a step to crash in), not a remote rank's failure.
_SETUP_FUNCTIONS = frozenset(
    (
        "init_process_group",
        "_store_based_barrier",
        "_new_process_group_helper",
        "_verify_param_shape_across_processes",
        "_sync_module_states",
        "_sync_params_and_buffers",
        "_configure_distributed_model",
        "_broadcast_model",
        "init_device_mesh",
    )
)
# Frames of HTTP clients: a connection reset there is a download's (the Hub, an object store), I/O.
_HTTP_PATHS = (
    "/urllib3/",
    "/requests/",
    "/http/client.py",
    "/ssl.py",
    "/urllib/request.py",
    "/huggingface_hub/",
    "/botocore/",
    "/aiohttp/",
    "/gcsfs/",
    "/s3fs/",
)
HINT_SETUP = "setup"
HINT_HTTP = "http"
_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")
# The line that ends a traceback: "IndexError: ...", "torch.OutOfMemoryError: ...", "AssertionError".
_EXCEPTION = re.compile(r"([A-Za-z_][\w.]{0,200}?)(?:: ?(.*)|)$")
_EXCEPTION_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt", "Warning", "Failure", "Fault", "Iteration")
# Exceptions that say the process was told to stop or that a child failed: consequences, never app_error.
_CONSEQUENCES = frozenset(
    (
        "KeyboardInterrupt",
        "SystemExit",
        "SignalException",
        "ChildFailedError",
        "BrokenPipeError",
        "ConnectionResetError",
        "GeneratorExit",
    )
)
_LIBRARY_PATHS = ("site-packages", "dist-packages", "/lib/python")
# What a script's own NaN check raises (assert, raise ValueError/RuntimeError/FloatingPointError).
_NAN_CHECK_ERRORS = frozenset(("AssertionError", "ValueError", "RuntimeError", "FloatingPointError", "Exception"))
_INDEX_ERROR = re.compile(
    r"IndexError|index .{0,40}out of (?:range|bounds)|out of bounds for dimension"
    r"|[Tt]arget -?\d+ is out of bounds"
)
_COLLECTIVE_MISMATCH = re.compile(
    r"collective mismatch|Received data size doesn't match expected size|mismatch between collectives"
)
# host_oom lines where the process itself was refused memory and raised (no OOM killer involved).
_ALLOCATION_REFUSED = re.compile(
    r"MemoryError|Unable to allocate [\d.]+ [KMGTP]i?B for an array|std::bad_alloc"
    r"|DefaultCPUAllocator: (?:can't allocate memory|not enough memory)"
)
_MISSING_PATH = re.compile(r"FileNotFoundError|No such file or directory|\[Errno 2\]")
TRACEBACK_SPAN = 500  # lines after a traceback's last frame in which its exception line may still come
MAX_TABLES = 64  # launcher failure tables kept (one per source that printed one)
_TABLE_STARTS = frozenset("RF")
_GLOG_FIRST = frozenset("IWEF")
_STAMP_FIRST = frozenset("IWEF(")  # what a time prefix other than a bare ISO date starts with
_TABLE_HEADERS = frozenset((ROOT_CAUSE_HEADER, OTHER_FAILURES_HEADER))
_LAST_ERROR = "Last error:"  # NCCL's detail follows on the next line
# What torchelastic sends the surviving children once one has failed (a rank it stopped did not fail).
_STOPPED_BY_LAUNCHER = frozenset(("SIGTERM", "SIGINT", "SIGHUP"))
_LAUNCHER_STOPS = re.compile(r"Sending process (\d{1,10}) closing signal SIG")
# gloo's own timeout texts ("[.../third_party/gloo/...unbound_buffer.cc:78] Timed out waiting 5000ms for recv").
_GLOO = re.compile(r"gloo|Timed out waiting \d+ms for (?:recv|send) operation")
CRASHED = "rank_crashed"  # the verdict's category when the launcher's table shows a rank that failed of its own
STOPPED = STOPPED_CATEGORY.id  # the launcher's lines about the children it stopped after the crash (their own row)
PEER_GONE_WINDOW = 50  # lines after a peer's connection went away in which NCCL's generic errors mean that


def precedence(category: str, weak: bool = False) -> int:
    """Position of a (category, weak) in ROOT_CAUSE_ORDER: lower is more fundamental."""
    return _RANK_OF.get((category, weak), len(ROOT_CAUSE_ORDER))


def _time_key(finding: Finding) -> float:
    return finding.time if finding.time is not None else float("inf")


@dataclass(frozen=True)
class RootCause:
    """The run's verdict: the root cause's category, the finding it started at, and the failing rank."""

    category: str
    finding: Finding
    rank: Optional[int]  # the finding's rank, else the rank the launcher's table names
    launcher: Optional[LauncherFailure] = None  # torchelastic's first observed failure, when printed
    # What every rank's NCCL watchdog lines say together: the rank that never reached the collective
    # (then `rank` is that one, not the first rank that timed out waiting for it), or that all froze.
    watchdog: Optional[WatchdogVerdict] = None
    # When only peers' reports were seen: the launcher's row of the child that failed of its own (its exit code
    # or signal is all that is known of it), which `rank` names.
    failed_child: Optional[LauncherFailure] = None
    # The ranks whose own output said a peer closed or reset its connection (victims, never the failing rank).
    peer_gone_ranks: Tuple[int, ...] = ()
    # With a crashed child: the launcher's rows of the children it stopped after it that lost no connection of their
    # own (not peers that failed, nor reports of the crash: its lines about them are their own row, rank_stopped).
    stopped: Tuple[LauncherFailure, ...] = ()


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
    best: Finding  # the strongest evidence (a direct finding before a weak one): the row's texts
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
    handled: Tuple[Finding, ...] = ()  # exceptions their rank went on training after: not findings, not a cause
    verdict: Optional["RootCause"] = None  # the failing rank and where it started (diagnose_lines fills it)
    launcher_failures: Tuple[LauncherFailure, ...] = ()  # every failed child the launcher's tables list


@dataclass
class _SourceState:
    frame_col: int = -1  # where the last line's 'File "..."' began, or -1 after any other line
    last_text: str = ""
    peer_gone_line: int = -PEER_GONE_WINDOW - 1  # the last line saying a peer closed its connection
    stamp_text: Optional[str] = None  # the latest line that may carry a time, parsed when a finding needs it
    stamp_time: Optional[float] = None  # the latest time parsed in this source
    traceback_line: int = -1  # line of the current traceback's header or last frame; -1 outside one
    traceback_matched: bool = False  # a line of this traceback (or one it is chained to) matched a category
    chained: bool = False  # "The above exception was the direct cause...": the next traceback is the same story
    frame: Optional[str] = None  # innermost frame outside site-packages of the current traceback
    traceback_prefix: int = 0  # length of a log prefix in front of the traceback's lines
    any_frame: Optional[str] = None  # innermost frame of all
    table: Optional[FailureTable] = None  # torchelastic's failure table, once this source printed one
    spawned_rank: Optional[int] = None  # the process that torch.multiprocessing.spawn says failed
    clock: Optional[_SourceState] = None  # an interleaved rank's: its file's state, which keeps the time
    nccl_setup: bool = (
        False  # NCCL INFO said a communicator is being set up (Bootstrap, Init START) and not yet complete
    )
    peer_gone_text: str = ""  # the line at peer_gone_line, for when later lines show it was the network's
    traceback_hint: str = ""  # HINT_SETUP or HINT_HTTP when a frame of the current traceback says so
    implicit_col: int = -1  # a traceback started by a frame without its header: that frame's column, else -1
    code_checks_nan: bool = False  # the source line quoted under the latest frame tests for NaN/Inf (an assert)
    # Exceptions of this source (a traceback's exception line, whatever its category; any CUDA OOM line) not yet
    # followed by its own training step or a recovery line (then they were handled)
    pending_app: Optional[List[Finding]] = None


class Diagnoser:
    """Streaming diagnosis over the lines of any number of sources, with bounded memory."""

    def __init__(self, max_findings: int = MAX_FINDINGS) -> None:
        self.max_findings = max_findings
        self._findings: List[Finding] = []
        self.dropped = 0  # findings not kept because max_findings was reached
        self._aggregates: Dict[str, _Aggregate] = {}
        self._sources: Dict[object, _SourceState] = {}  # a source's name, or (name, rank) for an interleaved rank
        self._best: Optional[Tuple[int, float, int, str]] = None
        self._best_finding: Optional[Finding] = None
        self._seen = 0
        self._year: Optional[int] = None  # of the latest full time stamp: glog's stamps name none
        self._tables: List[FailureTable] = []
        self._watchdog = WatchdogLines()
        # Ranks whose own output said a peer closed or reset its connection: victims, never the failing rank.
        self._peer_gone_ranks: set = set()
        self._stopped_pids: set = set()  # children the launcher said it sent SIGTERM to (after another failed)
        # Exceptions withdrawn from the findings: the same rank logged a step after them, or a library said it
        # recovered (each with handled_by: the line that showed it)
        self._handled: List[Finding] = []

    # --- feeding ------------------------------------------------------------------------------------

    def feed(self, line) -> Optional[Finding]:
        """Diagnose one LogLine (opsconsole.logs.records); the Finding when the line matched."""
        source = line.source
        key = getattr(source, "key", None) or str(source)
        rank = line.rank if line.rank is not None else getattr(source, "rank", None)
        return self._feed(line.text, line.number, key, rank, line.time)

    def feed_text(
        self,
        text: str,
        number: int,
        source: Union[str, object, None] = None,
        time: Optional[float] = None,
        rank: Optional[int] = None,
    ) -> Optional[Finding]:
        """Diagnose one line of plain text (number is 1-based); `source` is a name or a LogSource."""
        key = None
        if type(source) is str:  # the common case, without two failed attribute lookups a line
            key = source
        elif source is not None:
            key = getattr(source, "key", None) or str(source)
            if rank is None:
                rank = getattr(source, "rank", None)
        return self._feed(text, number, key, rank, time)

    def _feed(
        self, text: str, number: int, key: Optional[str], rank: Optional[int], time: Optional[float]
    ) -> Optional[Finding]:
        if len(text) > MAX_SCAN_CHARS:
            text = text[:MAX_SCAN_CHARS]
        body = text
        line_rank = None
        # A rank prefix ends in a digit before its "]:" ("[rank3]:"); other "]:" ("[engine.py:12:step]:") are skipped.
        colon = text.find("]:", 0, 80)
        while colon > 0 and not ("0" <= text[colon - 1] <= "9"):
            colon = text.find("]:", colon + 2, 80)
        prefix = _RANK_PREFIX.match(text) if colon > 0 else None
        if prefix is None and text[:1] in " 0123456789" and text.find(": ", 1, 12) > 0:  # "2026-..." has none there
            prefix = _SRUN_LABEL.match(text)
        if prefix:
            body = text[prefix.end() :]
            line_rank = int(prefix.group(prefix.lastindex or 1))  # torch's global "[rank1]:" after torchrun's
            # torch's own "[rankN]:" is the global rank: it wins over a rank the file's place gave (torchrun's
            # attempt_0/<local_rank>/ folders hold local ranks: on a second node local 1 is global 3).
            if rank is None or (prefix.lastindex == 2 or text[prefix.start(1) - 5 : prefix.start(1)] == "[rank"):
                rank = line_rank
        # Interleaved ranks each get their own traceback state.
        if line_rank is None:
            state = clock = self._sources.get(key or "") or self._state(key or "")
        else:
            state = self._sources.get((key, line_rank)) or self._state((key, line_rank))
            clock = state.clock
            if clock is None:
                clock = state.clock = self._state(key or "")
        previous = state.last_text
        state.last_text = body
        # One automaton pass over the line finds every signature's needle and every substring the structure below
        # is read by (signatures.scan, inlined: a call a line is worth avoiding).
        lowered = body.lower()
        try:
            hits = find_needles(lowered, overlapping=True)
        except UnicodeEncodeError:  # a lone surrogate (bytes decoded with surrogateescape): no needle holds one
            hits = find_needles(SURROGATE.sub("\ufffd", lowered), overlapping=True)
        inf = "inf" in lowered and INF_WORD.search(lowered) is not None
        nan = (
            "nan" in lowered
            and lowered.count("nan") != lowered.count("nano") + lowered.count("nan iter")
            and NAN_WORD.search(lowered) is not None
        )
        if "NCCL" in body:
            if "NCCL INFO" in body:  # whether this source's communicators are still being set up
                if "Init COMPLETE" in body:
                    state.nccl_setup = False
                elif "Bootstrap" in body or "Init START" in body or "Using network" in body:
                    state.nccl_setup = True
                elif " -> " in body and ("bootstrap.c" in body or "init.c" in body):
                    # An error code passed up through ncclCommInitRank / bootstrap ("init.cc:1079 -> 3"): the
                    # failure happened while connecting, and a peer's connection closed just before was that.
                    state.nccl_setup = True
                    if 0 <= number - state.peer_gone_line <= PEER_GONE_WINDOW:
                        self._record(
                            self._finding(
                                "nccl_network",
                                False,
                                state.peer_gone_line,
                                state.peer_gone_text,
                                key,
                                rank,
                                self._time(clock, time),
                            )
                        )
                        state.peer_gone_line = -PEER_GONE_WINDOW - 1
            if "NCCL work" in body or "watchdog at work" in body or "WorkNCCL(" in body:
                self._watchdog.feed(body, rank, number, key)  # every rank's progress, compared in verdict()
        # Times are the file's (interleaved ranks share its clock), parsed only when a line is a finding.
        first = text[:1]
        if "0" <= first <= "9" and text[4:5] == "-":  # the common cases, inlined: "2026-12-03 ..."
            clock.stamp_text = text
        elif first == "[":
            if "0" <= text[1:2] <= "9" and text[5:6] == "-":  # "[2026-12-03 ..."
                clock.stamp_text = text
            elif text[1:2] in _GLOG_FIRST and text[2:6].isdigit():  # torch's C++ "[E1203 10:10:09.123 ...]"
                clock.stamp_text = text
            elif line_rank is not None and may_carry_time(body):
                clock.stamp_text = body
        elif first in _STAMP_FIRST and may_carry_time(text):
            clock.stamp_text = text
        elif line_rank is not None and may_carry_time(body):
            clock.stamp_text = body
        if state.pending_app is not None:
            self._went_on(state, body, number)  # an exception logged and caught (logging.exception): kept training?
        table = state.table
        if (
            not hits
            and not inf
            and not nan
            and state.traceback_line < 0
            and state.frame_col < 0
            and (table is None or not table.reading)
        ):
            return None  # the healthy majority: no needle, no structure, no traceback or table being read
        # (_is_code's test inlined for the common line: no frame before it and none in it)
        if (state.frame_col >= 0 or 'File "' in body) and self._is_code(state, body, number):
            return None
        head = body[:1]
        if head == "-" and body.startswith("-- Process "):
            spawned = _SPAWN_FAILED.match(body)
            if spawned:
                state.spawned_rank = int(spawned.group(1))
        entry: Optional[LauncherFailure] = None
        if (table is not None and table.reading) or (head in _TABLE_STARTS and body.rstrip() in _TABLE_HEADERS):
            if table is None:
                table = state.table = FailureTable()
                if len(self._tables) < MAX_TABLES:
                    self._tables.append(table)
            if table.feed(body):
                entry = table.current
        exception = None
        if state.traceback_line >= 0:
            if (
                not state.traceback_hint
                and body.lstrip().startswith(("File ", "~/", "/"))
                and any(part in body for part in _HTTP_PATHS)
            ):  # IPython's frames, which the 'File "..."' reading above does not take
                state.traceback_hint = HINT_HTTP
            if number - state.traceback_line > TRACEBACK_SPAN:
                state.traceback_line = -1
            else:
                exception = _exception_of(body)
                if (
                    exception is None and state.traceback_prefix
                ):  # "ERROR 11-29 03:31:11 worker.py:574] ValueError: ..."
                    exception = _exception_of(body[state.traceback_prefix :])
                if exception is None and state.implicit_col >= 0 and body.strip():
                    # A headerless traceback (an excerpt that starts at its frames) ends at the first line that is
                    # neither more indented than its frames (a wrapped call, carets) nor its exception.
                    if len(body) - len(body.lstrip()) <= state.implicit_col:
                        state.traceback_line = state.implicit_col = -1
        if _CALL_LAST in body and (_TRACEBACK_HEADER in body or "─" in body or body.rstrip().endswith(_CALL_LAST)):
            if not state.chained:
                state.traceback_matched = False
                state.traceback_hint = ""
            state.traceback_line, state.chained, state.frame, state.any_frame = number, False, None, None
            state.implicit_col = -1
            state.code_checks_nan = False
            column = body.find("Traceback")
            # A logger's prefix in front of every line of the traceback: the exception line is after it.
            state.traceback_prefix = column if column > 0 and body[:column].rstrip().endswith("]") else 0
        elif (
            state.traceback_matched
            and state.traceback_line < 0
            and "above exception" in body
            and body.lstrip().startswith(_CHAINED)
        ):  # the chain matters only when it carries a match
            state.chained = True
        positions = positions_of(hits, inf, nan) if hits or inf or nan else ()
        matches = match_positions(body, positions) if positions else []
        in_traceback = state.traceback_line >= 0 or exception is not None
        if matches and any(role == ROLE_BARE_EXCEPTION for _, _, role in matches):
            # An exception quoted alone is the app's only when nothing else reads the line (a peer's closed
            # connection in a RuntimeError is that), and outside a traceback, whose own reading (chained matches,
            # its frame) decides at its exception line.
            if in_traceback or any(role != ROLE_BARE_EXCEPTION for _, _, role in matches):
                matches = [match for match in matches if match[2] != ROLE_BARE_EXCEPTION]
        hint = state.traceback_hint if in_traceback else ""
        if exception is not None:
            state.traceback_line = state.implicit_col = -1  # the exception line ends the traceback
        if not matches:
            if exception is None or state.traceback_matched or exception[0].rsplit(".", 1)[-1] in _CONSEQUENCES:
                return None
            if rank is None:
                rank = state.spawned_rank
            state.traceback_matched = True
            if state.code_checks_nan and exception[0].rsplit(".", 1)[-1] in _NAN_CHECK_ERRORS:
                # The script's own NaN check raised ("assert not torch.isnan(loss)"): the numbers, not the code.
                where = state.frame or state.any_frame
                text = _exception_text(exception) + (" (at %s)" % where if where else "")
                finding = self._finding("nan_inf", False, number, text, key, rank, self._time(clock, time))
            else:
                finding = self._app_error(
                    _exception_text(exception),
                    state.frame or state.any_frame,
                    number,
                    key,
                    rank,
                    self._time(clock, time),
                )
                self._note_pending(state, finding)
            self._record(finding)
            return finding
        if state.traceback_line >= 0 or exception is not None:
            state.traceback_matched = True
        if any(role == ROLE_PEER_GONE for _, _, role in matches):
            if hint == HINT_HTTP:
                # A connection reset under an HTTP client's frames: a download cut off, not a rank.
                matches = [
                    ("io_error", False, "") if role == ROLE_PEER_GONE else (category, weak, role)
                    for category, weak, role in matches
                ]
            elif (state.nccl_setup or hint == HINT_SETUP) and "gloo" not in lowered:
                # Closed while NCCL's communicator was being set up (bootstrap, proxy connect, the process group's or
                # DDP's first collectives), before any peer ran a step: peers that could not reach each other (an
                # interface, a firewall), the network's story. gloo's pair says "Connection closed by peer" only on a
                # connection it had made: the peer's process went away (a real run: rank 1 SIGKILLed while rank 0
                # was in DDP's parameter check, tests/data/torchrun_gloo_setup_peer_killed), the peer-lost story.
                matches = [
                    ("nccl_network", False, "") if role == ROLE_PEER_GONE else (category, weak, role)
                    for category, weak, role in matches
                ]
            else:
                state.peer_gone_line = number
                state.peer_gone_text = body
        elif hint != HINT_SETUP and 0 <= number - state.peer_gone_line <= PEER_GONE_WINDOW:
            # "unhandled system error" / "ncclInternalError" just after a peer vanished: that peer is the story.
            matches = [
                ("nccl_remote", True, ROLE_PEER_GONE) if role == ROLE_GENERIC else (category, weak, role)
                for category, weak, role in matches
            ]
        category, weak, _ = min(matches, key=lambda match: precedence(match[0], match[1]))
        when = self._time(clock, time)
        if entry is not None and entry.rank is not None:  # a line of the launcher's failure table: that child's
            rank = entry.rank
        if rank is None:
            found = _RANK_IN_TEXT.search(body)
            if found:
                rank = int(next(group for group in found.groups() if group is not None))
            else:
                rank = state.spawned_rank
        if entry is None and category == "nccl_remote":
            if rank is not None and any(role == ROLE_PEER_GONE for _, _, role in matches):
                if len(self._peer_gone_ranks) < MAX_SOURCES:
                    self._peer_gone_ranks.add(rank)
            elif "closing signal" in body:
                stopped = _LAUNCHER_STOPS.search(body)
                if stopped and len(self._stopped_pids) < MAX_SOURCES:
                    self._stopped_pids.add(int(stopped.group(1)))
        excerpt = body
        if previous.strip() == _LAST_ERROR:
            excerpt = _LAST_ERROR + " " + body.strip()
        if category == "app_error":  # a signature for an app's own error: with its frame and remedy
            parsed = exception or _exception_of(body)
            frame = (state.frame or state.any_frame) if exception is not None else None  # the traceback it ends
            finding = self._app_error(
                _exception_text(parsed) if parsed else body.strip(), frame, number, key, rank, when
            )
            if exception is not None:  # the end of a traceback, which a handler may have logged
                self._note_pending(state, finding)
        else:
            finding = self._finding(category, weak, number, excerpt, key, rank, when)
            if exception is not None or category == "cuda_oom":
                # The end of a traceback (a handler may have logged it: logging.exception), or an OOM, which a
                # training loop or a library (fairseq's trainer, a batch size finder) may have caught.
                self._note_pending(state, finding)
        self._record(finding)
        return finding

    def _time(self, state: _SourceState, given: Optional[float]) -> Optional[float]:
        """The time of the line being diagnosed: its source's latest stamp, else what the caller gave."""
        pending = state.stamp_text
        if pending is not None:
            state.stamp_text = None
            when, year = line_time(pending, self._year)
            if year is not None:
                self._year = year
            if when is not None:
                state.stamp_time = when
        return state.stamp_time if state.stamp_time is not None else given

    @staticmethod
    def _is_code(state: _SourceState, body: str, number: int = 0) -> bool:
        """Whether the line is a traceback frame or the source line quoted under one (frames are noted)."""
        column, state.frame_col = state.frame_col, -1
        if 'File "' in body:
            frame = _FRAME.search(body)
            if frame:
                state.frame_col = frame.start()
                state.code_checks_nan = False  # the source line under this frame, if quoted, decides
                if state.traceback_line < 0 and frame.start() <= 40:
                    # Frames without a "Traceback" header before them (an excerpt cut at the top): a traceback all
                    # the same, whose exception line comes right after its frames.
                    if not state.chained:
                        state.traceback_matched = False
                        state.traceback_hint = ""
                    state.chained, state.frame, state.any_frame = False, None, None
                    state.traceback_prefix = 0
                    state.implicit_col = frame.start()
                    state.traceback_line = number
                if state.traceback_line >= 0:
                    state.traceback_line = max(state.traceback_line, number)
                    path, line, function = frame.groups()
                    where = "%s:%s" % (path, line) + (" in %s" % function if function else "")
                    state.any_frame = where
                    if not path.startswith("<") and not any(part in path for part in _LIBRARY_PATHS):
                        state.frame = where
                    if function in _SETUP_FUNCTIONS:
                        state.traceback_hint = HINT_SETUP
                    elif not state.traceback_hint and any(part in path for part in _HTTP_PATHS):
                        state.traceback_hint = HINT_HTTP
                # A frame with more after its function name is a pasted traceback whose line breaks were lost
                # ("... in broadcast 10: work = ... 10: torch.distributed.DistBackendError: ..."): read the rest.
                return not body[frame.end() :].strip()
        if column >= 0 and body[column : column + 2] == "  " and body[column + 2 :].strip():
            # The raising line itself: "assert not torch.isnan(loss).any()" makes the error that follows a NaN's.
            state.code_checks_nan = "isnan" in body or "isinf" in body or "isfinite" in body
            return True
        return False

    def _state(self, key: object) -> _SourceState:
        state = self._sources.get(key)
        if state is None:
            if len(self._sources) >= MAX_SOURCES:
                self._sources.pop(next(iter(self._sources)))
            state = self._sources[key] = _SourceState()
        return state

    def _finding(
        self,
        category: str,
        weak: bool,
        number: int,
        body: str,
        key: Optional[str],
        rank: Optional[int],
        time: Optional[float],
    ) -> Finding:
        entry = CATEGORIES[category]
        severity, cause, remedy, evidence = entry.severity, entry.cause, entry.remedy, None
        title = entry.title
        if category == CRASHED:  # SIGKILL without the OOM killer's line: who sent it is the question
            title, cause, remedy = SIGKILL_TITLE, SIGKILL_CAUSE, RANK_CRASH_REMEDIES["SIGKILL"]
        elif category == "host_oom":  # the OOM killer's own line, or an allocation refused in the process
            evidence = "seen"
            if _ALLOCATION_REFUSED.search(body):  # not the OOM killer: the title says so too
                title, cause, remedy = (
                    HOST_ALLOCATION_REFUSED_TITLE,
                    HOST_ALLOCATION_REFUSED_CAUSE,
                    HOST_ALLOCATION_REFUSED_REMEDY,
                )
            else:
                cause = HOST_OOM_SEEN_CAUSE
        elif category == "nccl_timeout" and _GLOO.search(body):  # gloo's timeout: not NCCL's watchdog or variables
            title, cause, remedy = GLOO_TIMEOUT_TITLE, GLOO_TIMEOUT_CAUSE, GLOO_TIMEOUT_REMEDY
        elif category == "nccl_remote" and "gloo" in body:  # gloo's lost connection: the same category, gloo's words
            title, cause = GLOO_PEER_LOST_TITLE, GLOO_PEER_LOST_CAUSE
        elif category == "io_error" and _MISSING_PATH.search(body):  # the job's path before the storage
            remedy = MISSING_PATH_REMEDY + " Then: " + remedy
        elif "NVRM: Xid" in body:  # NVIDIA's catalog: what this Xid means and the action it calls for
            seen = xid.decode_line(body)
            if seen is not None:
                cause, remedy = (
                    "%s. %s" % (seen.describe(), cause),
                    "%s%s. %s"
                    % (seen.action_text[:1].upper(), seen.action_text[1:], " (%s)" % seen.note if seen.note else "")
                    + remedy,
                )
        return Finding(
            line=number,
            category=category,
            severity=severity,
            title=title,
            cause=cause,
            remedy=remedy,
            excerpt=_excerpt(body),
            source=key,
            rank=rank,
            time=time,
            weak=weak,
            evidence=evidence,
        )

    def _app_error(
        self,
        text: str,
        frame: Optional[str],
        number: int,
        key: Optional[str],
        rank: Optional[int],
        time: Optional[float],
    ) -> Finding:
        entry = CATEGORIES["app_error"]
        if _COLLECTIVE_MISMATCH.search(text):  # "reproduce on one process" cannot: it takes the ranks disagreeing
            remedy = COLLECTIVE_MISMATCH_REMEDY
        elif _INDEX_ERROR.search(text):
            remedy = INDEX_ERROR_REMEDY + " " + entry.remedy
        else:
            remedy = entry.remedy
        excerpt = text + (" (at %s)" % frame if frame else "")
        return Finding(
            line=number,
            category="app_error",
            severity=entry.severity,
            title=entry.title,
            cause=entry.cause,
            remedy=remedy,
            excerpt=_excerpt(excerpt),
            source=key,
            rank=rank,
            time=time,
            exception=_excerpt(text),
            frame=frame,
        )

    @staticmethod
    def _note_pending(state: _SourceState, finding: Finding) -> None:
        if state.pending_app is None:
            state.pending_app = []
        if len(state.pending_app) < MAX_SOURCES:
            state.pending_app.append(finding)

    def _went_on(self, state: _SourceState, body: str, number: int) -> None:
        """The source logged a training step after its exceptions, or a library said it recovered from its OOM:
        they were handled, not what ended the run. They leave the findings (and the root cause) for handled();
        the rest is counted again without them.

        Only a step stamped no earlier than the exception counts: a merged output (torchrun --tee) may put a
        child's buffered stdout (its earlier steps) after the traceback it wrote to stderr when it died."""
        if not state.pending_app or not 0 <= number - state.pending_app[-1].line <= HANDLED_WITHIN_LINES:
            state.pending_app = None  # no step soon after (or another file's numbering): left a finding
            return
        if ("OOM" in body or "Batch size" in body) and _OOM_RECOVERY.search(body):
            self._withdraw(state, [f for f in state.pending_app if f.category == "cuda_oom"], number, body)
            return
        if parse_step_counter(body) is None:
            return
        when, _ = line_time(body, self._year)
        if when is None:
            return
        pending = [finding for finding in state.pending_app if finding.time is not None and finding.time <= when]
        self._withdraw(state, pending, number, body)

    def _withdraw(self, state: _SourceState, pending: List[Finding], number: int, body: str) -> None:
        """Move `pending` (findings of `state`) to handled(), noting the line that showed it; count the rest again."""
        if not pending:
            return
        state.pending_app = [finding for finding in state.pending_app or () if finding not in pending] or None
        gone = {id(finding) for finding in pending}
        kept = [finding for finding in self._findings if id(finding) not in gone]
        if len(kept) == len(self._findings):
            return  # beyond max_findings: counted, and left so
        shown = _excerpt(body.strip())
        self._handled.extend(
            replace(finding, handled_by="line %d: %s" % (number, shown))
            for finding in pending
            if len(self._handled) < self.max_findings
        )
        dropped = self.dropped
        self._findings, self._aggregates, self._best, self._best_finding, self._seen = [], {}, None, None, 0
        for finding in kept:
            self._record(finding)
        self.dropped = dropped

    def drop_copies(self, copy: Callable[[Finding], bool]) -> int:
        """Forget the findings `copy` says repeat another source's (torchrun --tee's copy of a rank's own log):
        counts, ranks and the root cause are taken again without them. Nothing is dropped once findings went
        beyond max_findings (the counts would no longer be exact). The number dropped."""
        kept = [finding for finding in self._findings if not copy(finding)]
        removed = len(self._findings) - len(kept)
        if not removed or self.dropped:
            return 0
        self._findings, self._aggregates, self._best, self._best_finding, self._seen = [], {}, None, None, 0
        for finding in kept:
            self._record(finding)
        return removed

    def rerank(self, rank_of: Callable[[Finding], Optional[int]]) -> int:
        """Give findings (handled ones too) the rank `rank_of` returns for them (None: keep theirs): a file's
        place gave a local rank (torchrun's attempt_0/<local_rank>/) where its own lines named the global one.
        Counts, ranks and the root cause are taken again. Nothing changes once findings went beyond max_findings
        (the aggregates could no longer be rebuilt). The number given another rank."""
        if self.dropped:
            return 0

        def reranked(findings: List[Finding]) -> Tuple[List[Finding], int]:
            out, changed = [], 0
            for finding in findings:
                rank = rank_of(finding)
                if rank is not None and rank != finding.rank:
                    finding = replace(finding, rank=rank)
                    changed += 1
                out.append(finding)
            return out, changed

        kept, changed = reranked(self._findings)
        self._handled, handled = reranked(self._handled)
        if changed:
            self._findings, self._aggregates, self._best, self._best_finding, self._seen = [], {}, None, None, 0
            for finding in kept:
                self._record(finding)
        return changed + handled

    def handled_since(self, count: int) -> List[Finding]:
        """The handled exceptions after the first `count` (the console's feed withdraws their alerts)."""
        return self._handled[count:]

    def handled(self) -> List[Finding]:
        """Exceptions (an app_error, a CUDA OOM, any traceback's) after which the same rank went on logging training
        steps, or that a library said it recovered from: logged and caught. Each names the line in handled_by."""
        return list(self._handled)

    def _record(self, finding: Finding) -> None:
        self._seen += 1
        if len(self._findings) < self.max_findings:
            self._findings.append(finding)
        else:
            self.dropped += 1
        aggregate = self._aggregates.get(finding.category)
        if aggregate is None:
            aggregate = self._aggregates[finding.category] = _Aggregate(first=finding, last=finding, best=finding)
        elif (aggregate.best.weak and not finding.weak) or (
            finding.category == "nccl_remote"
            and finding.title != aggregate.best.title
            and aggregate.best.title == CATEGORIES[finding.category].title
            and aggregate.best.weak == finding.weak
        ):  # direct evidence; of a peer's loss, a line in its own words (gloo's) over the category's generic title
            aggregate.best = finding
        aggregate.count += 1
        if _time_key(finding) < _time_key(aggregate.first):
            aggregate.first = finding  # another file of the run failed earlier
        if _time_key(finding) >= _time_key(aggregate.last):
            aggregate.last = finding
        if finding.rank is not None:
            aggregate.ranks.add(finding.rank)
        if finding.source is not None and len(aggregate.sources) < MAX_SOURCES:
            aggregate.sources[finding.source] = None
        candidate = (precedence(finding.category, finding.weak), _time_key(finding), self._seen, finding.category)
        if self._best is None or candidate < self._best:
            self._best = candidate
            self._best_finding = finding

    # --- results ------------------------------------------------------------------------------------

    def findings(self) -> List[Finding]:
        """Every finding kept so far (the first max_findings), in the order fed."""
        return list(self._findings)

    def root_cause(self) -> Optional[str]:
        """The category that caused the others (see ROOT_CAUSE_ORDER), or None when nothing matched."""
        if self._best is None:
            return None
        if self._crashed_child() is not None:
            return CRASHED
        return self._best[3]

    def _crashed_child(self) -> Optional[LauncherFailure]:
        """The launcher's row of the child that failed of its own when only peers' reports were seen, else None."""
        best = self._best_finding
        if best is None or best.category != "nccl_remote" or not best.weak:
            return None
        return _crashed(self._failed_of_its_own(), self._tables_account_for_the_job())

    def launcher_failures(self) -> List[LauncherFailure]:
        """Every failed child the launcher's failure tables listed, in the order read."""
        return [failure for table in self._tables for failure in table.failures]

    def first_launcher_failure(self) -> Optional[LauncherFailure]:
        """torchelastic's "first observed failure" (the earliest when several launchers printed one)."""
        firsts = [failure for failure in self.launcher_failures() if failure.first]
        if not firsts:
            return None
        return min(firsts, key=lambda failure: failure.time if failure.time is not None else float("inf"))

    def verdict(self) -> Optional[RootCause]:
        """The root cause, the finding where it started (earliest in time; among findings without times
        the rank the launcher names first), and the failing rank; None when nothing matched."""
        if self._best is None or self._best_finding is None:
            return None
        best = self._best_finding
        launcher = self.first_launcher_failure()
        named = launcher.rank if launcher is not None else None
        candidates = [
            finding for finding in self._findings if finding.category == best.category and finding.weak == best.weak
        ]
        if best.category == "nccl_remote" and best.weak:
            # Only peers' reports: the failing rank is the child that failed of its own (a crash signal, sys.exit),
            # not the one torchelastic happened to see exit first (often a peer that lost its connection).
            failed_child = self._failed_of_its_own()
            if failed_child is not None:
                named = failed_child.rank
                candidates = [finding for finding in candidates if finding.rank == named] or candidates
        else:
            failed_child = None
        start = best
        if candidates:
            start = min(
                candidates, key=lambda finding: (_time_key(finding), named is not None and finding.rank != named)
            )
        rank = start.rank if start.rank is not None else named
        if best.category == "host_oom":
            # The OOM killer's line names the pid it killed: the launcher's table says whose rank that was. The
            # launcher's "first observed failure" may be a peer that exited on the lost connection first.
            killed = self._rank_of_killed_pid(candidates)
            if killed is not None:
                rank = killed
        if rank is None:  # another line reporting the same failure may name the rank ("srun: task 4: Out Of Memory")
            rank = next((finding.rank for finding in candidates if finding.rank is not None), None)
        watchdog = self._watchdog.verdict() if best.category in WATCHDOG_CATEGORIES else None
        if watchdog is not None and watchdog.kind == "never_reached" and watchdog.culprit_ranks:
            rank = watchdog.culprit_ranks[0]  # the first rank to time out only waited for this one
        elif watchdog is None and best.category == "nccl_timeout":
            # No watchdog lines (gloo, or NCCL without them): a rank that the launcher lists as failed but that
            # never said it timed out is the one the others waited for (stopped later, with SIGTERM).
            waited = {finding.rank for finding in candidates}
            absent = {failure.rank for failure in self.launcher_failures() if failure.rank is not None} - waited
            if len(absent) == 1 and None not in waited:
                rank = absent.pop()
        category = best.category
        if category == CRASHED and best.weak:
            # Killed by SIGKILL with no OOM-killer line: the headline names the rank (and stays weak evidence).
            start = replace(start, title=rank_crash_text(rank, -9, "SIGKILL")[0])
        crashed = _crashed(failed_child, self._tables_account_for_the_job())
        if crashed is not None:
            # What happened, first: the rank crashed / exited with code N / was killed by signal S; the peers'
            # lost connections stay listed as the consequences.
            category = CRASHED
            start = _crash_finding(start, crashed, self._stopped_ranks())
        return RootCause(
            stopped=self._only_stopped(crashed) if crashed is not None else (),
            category=category,
            finding=start,
            rank=rank,
            launcher=launcher,
            watchdog=watchdog,
            failed_child=failed_child,
            peer_gone_ranks=tuple(sorted(self._peer_gone_ranks)),
        )

    def _rank_of_killed_pid(self, findings: Sequence[Finding]) -> Optional[int]:
        """The rank of the pid an OOM-killer line among `findings` names ("Killed process PID"), by the launcher's
        failure tables; None when no line names a pid a table lists."""
        by_pid = {failure.pid: failure.rank for failure in self.launcher_failures() if failure.pid is not None}
        for finding in findings:
            killed = _OOM_KILLED_PID.search(finding.excerpt)
            if killed is not None and by_pid.get(int(killed.group(1))) is not None:
                return by_pid[int(killed.group(1))]
        return None

    def _failed_of_its_own(self) -> Optional[LauncherFailure]:
        """The rank of the launcher's failed children that no peer's lost connection explains, when just one
        rank is such: not a rank that reported a peer gone, not one the launcher stopped. A child ended by
        SIGTERM that the launcher did not say it stopped ("Sending process PID closing signal SIGTERM") was
        stopped by someone else (a preemption, scancel, kill) before its peers failed."""
        failed: Dict[int, LauncherFailure] = {}
        for failure in self.launcher_failures():
            if failure.rank is None or failure.rank in self._peer_gone_ranks or failure.exitcode in (0, None):
                continue
            stopped = failure.signal in _STOPPED_BY_LAUNCHER or failure.exitcode in (-1, -2, -15)
            if stopped and (failure.pid is None or failure.pid in self._stopped_pids):
                continue
            failed.setdefault(failure.rank, failure)
        if len(failed) > 1:
            # Without the ranks' own output (the launcher's alone), exit code 1 is what a rank that raised on its
            # lost connection returns: a crash signal or another exit code is the one that failed of its own.
            failed = {rank: failure for rank, failure in failed.items() if failure.exitcode != 1}
        return next(iter(failed.values())) if len(failed) == 1 else None

    def _tables_account_for_the_job(self) -> bool:
        """Whether the launcher's tables list every rank from 0 to the highest they name, and every child the
        launcher said it stopped: then no rank outside them (on another node) can have failed unseen."""
        failures = self.launcher_failures()
        ranks = {failure.rank for failure in failures if failure.rank is not None}
        listed = {failure.pid for failure in failures if failure.pid is not None}
        return bool(ranks) and ranks == set(range(max(ranks) + 1)) and self._stopped_pids <= listed

    def _stopped_ranks(self) -> List[int]:
        """The ranks of the launcher's failed children that it stopped itself (SIGTERM after another failed)."""
        return sorted(
            {
                failure.rank
                for failure in self.launcher_failures()
                if failure.rank is not None and failure.pid is not None and failure.pid in self._stopped_pids
            }
        )

    def _only_stopped(self, crashed: LauncherFailure) -> Tuple[LauncherFailure, ...]:
        """The launcher's rows of the children it stopped itself (after `crashed` failed) whose own output said no
        peer was lost: stopped, not peers that failed."""
        return tuple(
            failure
            for failure in self.launcher_failures()
            if failure.pid is not None
            and failure.pid in self._stopped_pids
            and failure.rank is not None
            and failure.rank != crashed.rank
            and failure.rank not in self._peer_gone_ranks
        )

    def watchdog_verdict(self) -> Optional[WatchdogVerdict]:
        """What the NCCL watchdog lines of every rank fed so far say together (None when none was seen)."""
        return self._watchdog.verdict()

    def summary(self) -> List[FindingSummary]:
        """One row per category: the root cause first, then by severity and first appearance."""
        root = self.root_cause()
        rows = []
        watchdog = self._watchdog.verdict() if "nccl_timeout" in self._aggregates else None
        crashed = self._crashed_child() if root == CRASHED else None
        # The launcher's lines about the crashed child (its "failed (exitcode: -11) local_rank: 1", its table row)
        # are the crash's own evidence: counted in its row, not among the peers' lost connections. Its lines about
        # the children it stopped after it are consequences: a row of their own, in neither.
        own: List[Finding] = []
        held: List[Finding] = []
        if crashed is not None:
            verdict = self.verdict()
            if verdict is not None:
                start = verdict.finding
                own = crash_lines(self._findings, crashed)
                held = stopped_lines(self._findings, verdict.stopped)
                rows.append(
                    FindingSummary(
                        category=CRASHED,
                        title=start.title,
                        severity=start.severity,
                        cause=start.cause,
                        remedy=start.remedy,
                        count=max(1, len(own)),
                        first=start,
                        last=max(own, key=_time_key) if own else start,
                        ranks=(crashed.rank,) if crashed.rank is not None else (),
                        sources=(start.source,) if start.source is not None else (),
                    )
                )
                if held:
                    rows.append(_row_of(STOPPED_CATEGORY, held))
        for category, aggregate in self._aggregates.items():
            entry = CATEGORIES[category]
            best = aggregate.best
            cause = best.cause
            if watchdog is not None and category == "nccl_timeout":
                cause = "%s. %s" % (watchdog.text, cause)  # the findings row names the rank that never got there
            count, first, last, ranks = aggregate.count, aggregate.first, aggregate.last, set(aggregate.ranks)
            if (own or held) and category == "nccl_remote":
                moved = {id(finding) for finding in own + held}
                rest = [f for f in self._findings if f.category == category and id(f) not in moved]
                if not rest:
                    continue
                count -= len(moved)
                first, last = _first_and_last(rest)
                ranks = {finding.rank for finding in rest if finding.rank is not None}
            rows.append(
                FindingSummary(
                    category=category,
                    title=best.title
                    if category in ("nccl_timeout", CRASHED, "host_oom", "nccl_remote")
                    else entry.title,
                    severity=best.severity,
                    cause=cause,
                    remedy=best.remedy,
                    count=count,
                    first=first,
                    last=last,
                    ranks=tuple(sorted(ranks)),
                    sources=tuple(aggregate.sources),
                )
            )
        severity_order = {"critical": 0, "error": 1, "warning": 2}
        rows.sort(
            key=lambda row: (
                row.category != root,
                severity_order.get(row.severity, 3),
                row.first.time if row.first.time is not None else float("inf"),
                row.first.line,
            )
        )
        return rows

    def reset(self) -> None:
        """Forget everything (the console's "clear findings")."""
        self.__init__(self.max_findings)


_OOM_KILLED_PID = re.compile(
    r"Killed process (\d{1,10}) "
)  # the kernel's OOM-killer line: "Killed process 1234 (python)"


def crash_lines(findings: Iterable[Finding], child: LauncherFailure) -> List[Finding]:
    """The findings that report the crashed child itself (the launcher's lines naming its rank): only peers'
    lost connections were seen when a child is rank_crashed, so its rank's nccl_remote lines are the launcher's."""
    if child.rank is None:
        return []
    return [finding for finding in findings if finding.category == "nccl_remote" and finding.rank == child.rank]


def stopped_lines(findings: Iterable[Finding], stopped: Sequence[LauncherFailure]) -> List[Finding]:
    """The launcher's lines about the children in `stopped` (RootCause.stopped: stopped after the crash, no peer lost
    in their own output): its "Sending process PID closing signal SIGTERM", their table rows. Consequences of the
    crash, not reports of it, and not peers that failed."""
    ranks = {failure.rank for failure in stopped if failure.rank is not None}
    pids = {failure.pid for failure in stopped if failure.pid is not None}
    held = []
    for finding in findings:
        if finding.category != "nccl_remote":
            continue
        if finding.rank is not None:
            if finding.rank in ranks:
                held.append(finding)
        elif pids and "closing signal" in finding.excerpt:
            told = _LAUNCHER_STOPS.search(finding.excerpt)
            if told and int(told.group(1)) in pids:
                held.append(finding)
    return held


def _first_and_last(findings: Sequence[Finding]) -> Tuple[Finding, Finding]:
    """The earliest and the latest of `findings` (at least one), as _record keeps an aggregate's first and last."""
    first = last = findings[0]
    for finding in findings[1:]:
        if _time_key(finding) < _time_key(first):
            first = finding
        if _time_key(finding) >= _time_key(last):
            last = finding
    return first, last


def _row_of(entry: Category, findings: Sequence[Finding]) -> FindingSummary:
    """One summary row of `findings` (at least one) under `entry`'s category, title, cause and remedy."""
    first, last = _first_and_last(findings)
    return FindingSummary(
        category=entry.id,
        title=entry.title,
        severity=entry.severity,
        cause=entry.cause,
        remedy=entry.remedy,
        count=len(findings),
        first=first,
        last=last,
        ranks=tuple(sorted({finding.rank for finding in findings if finding.rank is not None})),
        sources=tuple(dict.fromkeys(finding.source for finding in findings if finding.source is not None)),
    )


def attributed(findings: Iterable[Finding], verdict: Optional[RootCause]) -> List[Finding]:
    """The findings as the verdict counts them: when a rank crashed of its own (rank_crashed, from the launcher's
    table), the launcher's lines about it (crash_lines) are the crash's evidence, under its category, title, cause
    and remedy, not a peer's lost connection; its lines about the children it stopped after it (stopped_lines) are
    rank_stopped, a consequence; the others as they are. What every output lists (diagnose --json, --run, the text
    report's rows, the incident report)."""
    findings = list(findings)
    if verdict is None or verdict.category != CRASHED or verdict.failed_child is None:
        return findings
    own = {id(finding) for finding in crash_lines(findings, verdict.failed_child)}
    held = {id(finding) for finding in stopped_lines(findings, verdict.stopped)}
    if not own and not held:
        return findings
    out = []
    for finding in findings:
        if id(finding) in own:
            finding = _told_as(finding, CRASHED, verdict.finding, weak=False)
        elif id(finding) in held:
            finding = _told_as(finding, STOPPED, STOPPED_CATEGORY)
        out.append(finding)
    return out


def _told_as(finding: Finding, category: str, like: Any, **fields: Any) -> Finding:
    """`finding` under `category`, with the severity, title, cause and remedy of `like` (a finding or a catalog entry)."""
    return replace(
        finding,
        category=category,
        severity=like.severity,
        title=like.title,
        cause=like.cause,
        remedy=like.remedy,
        **fields,
    )


def _crashed(child: Optional[LauncherFailure], accounted: bool = False) -> Optional[LauncherFailure]:
    """The child when it crashed, was killed or exited with a code of its own. Exit code 1 is what a Python
    exception gives, a lost connection's too: it counts only where the launcher's tables account for the whole
    job (`accounted`), the one failed child that neither reported a lost connection nor was stopped by the
    launcher (the launcher's output alone of a run whose rank raised or timed out); else it stays the peers'
    report (a rank on another node may have failed first)."""
    if child is None or (not child.signal and child.exitcode == 1 and not accounted):
        return None
    return child


def _crash_finding(start: Finding, child: LauncherFailure, stopped: Sequence[int] = ()) -> Finding:
    """The verdict's finding for a rank that failed of its own: its line, titled with what happened."""
    title, remedy = rank_crash_text(child.rank, child.exitcode, child.signal)
    how = "signal %s" % child.signal if child.signal else "exit code %s" % child.exitcode
    where = "pid %s%s" % (child.pid, ", on %s" % child.host if child.host else "")
    after = (
        " The launcher stopped rank%s %s after it." % ("" if len(stopped) == 1 else "s", ", ".join(map(str, stopped)))
        if stopped
        else ""
    )
    if not child.signal and child.exitcode == 1:
        cause = (
            "The launcher's failure table lists rank %s ending with exit code 1 (%s), the only rank that failed "
            "of its own: no lost connection of its own was seen, and the launcher did not stop it.%s Exit code 1 "
            "is what an uncaught Python exception gives; which one (an error in the code, a collective's timeout, "
            "a lost peer) only that rank's own output says, and these files do not hold it."
            % (child.rank, where, after)
        )
    else:
        cause = (
            "The launcher's failure table lists rank %s ending with %s (%s), and that rank reported no lost "
            "connection of its own: the failure is its own; the other ranks' lost connections are consequences.%s"
            % (child.rank, how, where, after)
        )
    entry = CATEGORIES[CRASHED]
    return replace(
        start, category=CRASHED, severity=entry.severity, title=title, cause=cause, remedy=remedy, weak=False
    )


def _excerpt(text: str) -> str:
    excerpt = text.strip()
    if len(excerpt) > EXCERPT_CHARS:
        excerpt = excerpt[: EXCERPT_CHARS - 1] + "…"
    return excerpt


def _exception_text(exception: Tuple[str, str]) -> str:
    name, message = exception
    return "%s: %s" % (name, message) if message else name


def _exception_of(body: str) -> Optional[Tuple[str, str]]:
    """(type, message) when the line reads like the exception line that ends a traceback."""
    stripped = body.strip()
    if not stripped or not (stripped[0].isalpha() or stripped[0] == "_"):
        return None
    match = _EXCEPTION.match(stripped)
    if match is None:
        return None
    name, message = match.group(1), match.group(2)
    if message is None and not name.endswith(_EXCEPTION_SUFFIXES):
        return None
    if message is not None and "." not in name and not name.endswith(_EXCEPTION_SUFFIXES):
        return None
    return name, (message or "").strip()


def diagnose_lines(lines: Iterable[str], source: Optional[str] = None, max_findings: int = MAX_FINDINGS) -> Diagnosis:
    """Diagnose one input's lines (newlines stripped here); line numbers start at 1."""
    diagnoser = Diagnoser(max_findings=max_findings)
    number = 0
    for number, text in enumerate(lines, 1):
        diagnoser.feed_text(text.rstrip("\r\n"), number, source)
    return diagnosis_of(diagnoser, number)


def diagnosis_of(diagnoser: Diagnoser, lines: int) -> Diagnosis:
    """What `diagnoser` found in one input of `lines` lines: its verdict, and the findings as the verdict counts
    them (attributed)."""
    verdict = diagnoser.verdict()
    return Diagnosis(
        root_cause=diagnoser.root_cause(),
        findings=tuple(attributed(diagnoser.findings(), verdict)),
        summary=tuple(diagnoser.summary()),
        lines=lines,
        dropped=diagnoser.dropped,
        handled=tuple(diagnoser.handled()),
        verdict=verdict,
        launcher_failures=tuple(diagnoser.launcher_failures()),
    )
