"""Rows the fleet panes show, computed from node states: summaries, GPU rows, process rows.

Pure and Textual-free, so the numbers, the `/` filter language and the sort order are
tested as plain tables. The TUI panes only format and draw what these functions return.

Filter language (terms separated by spaces, all must hold):
  word          case-insensitive substring of the row's searchable texts
  field:value   the field equals value (case-insensitive), or matches it as a glob (`gpu0*`)
  field<N  field>N  field<=N  field>=N  field=N   numeric comparison; a missing reading never matches
A bad term (`util<abc`, `foo>3`) is reported in `ParsedFilter.errors` and ignored.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, TypeVar

from opsconsole.jobs_view import device_jobs, frame_jobs, job_users, marks
from opsconsole.model import (
    STATE_AUTH,
    STATE_CONNECTING,
    STATE_DEGRADED,
    STATE_DOWN,
    STATE_FALLBACK,
    STATE_HOSTKEY,
    STATE_STALE,
    STATE_UP,
    GpuSample,
    NodeFrame,
    NodeState,
    ProcessSample,
)

Row = TypeVar("Row")

GPU_PROCESSES = "gpu"
HOST_PROCESSES = "host"


# --- node summary rows ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRow:
    """One node's line in the Nodes pane: connection state and its (last) frame's summary."""

    key: str
    name: str
    state: str
    reason: Optional[str]
    live: bool  # delivering fresh frames; other rows show the last frame, dimmed
    has_frame: bool
    gpu_count: Optional[int]  # None when no frame ever arrived
    util_mean: Optional[float]
    util_max: Optional[float]
    mem_used: Optional[int]
    mem_total: Optional[int]
    hottest_temp: Optional[float]
    hottest_gpu: Optional[int]  # index of the hottest GPU
    power_sum: Optional[float]
    errors: Optional[int]
    age: Optional[float]  # seconds since the last good frame
    rtt_ms: Optional[float]
    util_trend: Tuple[Optional[float], ...] = ()  # recent mean GPU utilisation, oldest first
    jobs: Tuple[str, ...] = ()  # whose jobs run on it (opsconsole/jobs_view.py), sorted
    users: Tuple[str, ...] = ()  # users of its GPU processes and jobs, sorted

    @property
    def mem_percent(self) -> Optional[float]:
        if not self.mem_total or self.mem_used is None:
            return None
        return 100.0 * self.mem_used / self.mem_total


def _present(values: Iterable[Optional[float]]) -> List[float]:
    return [v for v in values if v is not None]


def frame_error_count(frame: NodeFrame) -> int:
    """Problems in a frame: probe errors, each GPU's NVML errors and XID events, lost GPUs."""
    count = len(frame.errors)
    for gpu in frame.gpus:
        count += len(gpu.errors) + len(gpu.xid_events) + (1 if gpu.lost else 0)
    return count


def node_row(state: NodeState, now: float, history=None) -> NodeRow:
    """The summary of one node at time `now` (ages are measured from it); `history` gives its trend."""
    frame = state.frame
    gpus: Sequence[GpuSample] = frame.gpus if frame else ()
    utils = _present(g.utilization_gpu for g in gpus)
    used = _present(g.memory_used for g in gpus)
    total = _present(g.memory_total for g in gpus)
    powers = _present(g.power_draw_w for g in gpus)
    temps = [g for g in gpus if g.temperature is not None]
    hottest = max(temps, key=lambda g: g.temperature) if temps else None
    return NodeRow(
        key=state.name,
        name=state.name,
        state=state.state,
        reason=state.reason,
        live=state.is_live,
        has_frame=frame is not None,
        gpu_count=len(gpus) if frame else None,
        util_mean=sum(utils) / len(utils) if utils else None,
        util_max=max(utils) if utils else None,
        mem_used=int(sum(used)) if used else None,
        mem_total=int(sum(total)) if total else None,
        hottest_temp=hottest.temperature if hottest else None,
        hottest_gpu=hottest.index if hottest else None,
        power_sum=sum(powers) if powers else None,
        errors=frame_error_count(frame) if frame else None,
        age=state.age(now),
        rtt_ms=state.rtt_ms if state.is_live else None,  # a down node's last RTT is no RTT now
        util_trend=_trend(history, state.name),
        jobs=frame_jobs(frame),
        users=tuple(sorted({u for p in frame.processes for u in (p.user, p.job_user) if u})) if frame else (),
    )


TREND_POINTS = 8


def _trend(history, node: str) -> Tuple[Optional[float], ...]:
    ring = history.node(node, "gpu_utilization") if history is not None else None
    return tuple(ring.values()[-TREND_POINTS:]) if ring is not None else ()


def _selected(states: Mapping[str, NodeState], node: Optional[str]) -> List[NodeState]:
    if node is None:
        return list(states.values())
    return [states[node]] if node in states else []


def node_rows(states: Mapping[str, NodeState], now: float, node: Optional[str] = None, history=None) -> List[NodeRow]:
    """One summary per node, in the order of `states` (config order); `node` keeps only that one.

    `history` (opsconsole.history.History) adds each node's utilisation trend.
    """
    return [node_row(state, now, history) for state in _selected(states, node)]


# --- cluster GPU rows -------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuRow:
    """One GPU of one node in the Cluster GPUs pane."""

    key: str  # "node/index", stable across ticks
    node: str
    index: int
    name: Optional[str]
    util: Optional[float]
    mem_used: Optional[int]
    mem_total: Optional[int]
    mem_percent: Optional[float]
    temp: Optional[float]
    power: Optional[float]
    power_limit: Optional[float]
    users: Tuple[str, ...]  # users of its compute processes, sorted, "?" when unknown
    process_count: int
    node_state: str
    live: bool
    lost: bool
    jobs: Tuple[str, ...] = ()  # whose jobs it runs (opsconsole/jobs_view.py), sorted
    job_users: Tuple[str, ...] = ()
    marked: bool = False  # runs the followed job (--slurm-job)
    mig_instance: Optional[int] = None  # a MIG instance's row: its GPU_I_ID (index is its GPU's)
    mig_profile: Optional[str] = None


def processes_on_gpu(frame: NodeFrame, gpu: GpuSample) -> List[ProcessSample]:
    """The compute processes of `frame` on `gpu` (matched by index, else by UUID)."""
    return [
        p
        for p in frame.processes
        if (p.gpu_index is not None and p.gpu_index == gpu.index)
        or (p.gpu_index is None and gpu.uuid is not None and p.gpu_uuid == gpu.uuid)
    ]


def cluster_gpu_rows(
    states: Mapping[str, NodeState], node: Optional[str] = None, job: Optional[str] = None
) -> List[GpuRow]:
    """Every GPU of every node's (last) frame, nodes in config order, GPUs by index, each MIG instance
    in a row of its own under its GPU; `job` (a followed Slurm job) marks the rows that run it."""
    rows: List[GpuRow] = []
    for state in _selected(states, node):
        frame = state.frame
        if frame is None:
            continue
        seen = set()
        for gpu in sorted(frame.gpus, key=lambda g: g.index):
            if gpu.index in seen:  # a duplicate index would break the row key
                continue
            seen.add(gpu.index)
            procs = processes_on_gpu(frame, gpu)
            rows.append(
                GpuRow(
                    key="%s/%d" % (state.name, gpu.index),
                    node=state.name,
                    index=gpu.index,
                    name=gpu.name,
                    util=gpu.utilization_gpu,
                    mem_used=gpu.memory_used,
                    mem_total=gpu.memory_total,
                    mem_percent=gpu.memory_percent,
                    temp=gpu.temperature,
                    power=gpu.power_draw_w,
                    power_limit=gpu.power_limit_w,
                    users=tuple(sorted({p.user or "?" for p in procs})),
                    process_count=len(procs),
                    node_state=state.state,
                    live=state.is_live,
                    lost=gpu.lost,
                    jobs=device_jobs(gpu, procs),
                    job_users=job_users(procs),
                    marked=marks(device_jobs(gpu, procs), job),
                )
            )
            for mig in gpu.mig_devices:
                mig_procs = [p for p in procs if p.mig_instance == mig.gpu_instance_id]
                jobs = device_jobs(mig, mig_procs)
                rows.append(
                    GpuRow(
                        key="%s/%d.mig%d" % (state.name, gpu.index, mig.gpu_instance_id),
                        node=state.name,
                        index=gpu.index,
                        name="MIG %s" % (mig.profile or "?"),
                        util=mig.utilization_gpu,
                        mem_used=mig.memory_used,
                        mem_total=mig.memory_total,
                        mem_percent=mig.memory_percent,
                        temp=None,
                        power=None,
                        power_limit=None,
                        users=tuple(sorted({p.user or "?" for p in mig_procs})),
                        process_count=len(mig_procs),
                        node_state=state.state,
                        live=state.is_live,
                        lost=gpu.lost,
                        jobs=jobs,
                        job_users=job_users(mig_procs),
                        marked=marks(jobs, job),
                        mig_instance=mig.gpu_instance_id,
                        mig_profile=mig.profile,
                    )
                )
    return rows


# --- process rows -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessRow:
    """A GPU compute process (kind "gpu") or a host process (kind "host") of one node."""

    key: str  # "node/pid@gpu" for GPU processes, "node/pid" for host ones
    kind: str
    node: str
    pid: int
    user: Optional[str]
    name: str
    command: str
    gpu_index: Optional[int]
    gpu_memory: Optional[int]
    sm_percent: Optional[float]
    cpu_percent: Optional[float]
    rss: Optional[int]
    elapsed: Optional[float]
    proc_state: Optional[str]
    node_state: str
    live: bool
    job_id: Optional[str] = None  # whose job (opsconsole/jobs_view.py): Slurm job id, its user, the container
    job_user: Optional[str] = None
    container: Optional[str] = None
    ppid: Optional[int] = None
    kernel_thread: bool = False

    @property
    def stuck(self) -> bool:
        """D (uninterruptible: hung IO) or Z (zombie): the rows worth a look."""
        return (self.proc_state or "")[:1] in ("D", "Z")


def _process_key(node: str, kind: str, proc: ProcessSample) -> str:
    if kind == GPU_PROCESSES:
        gpu = "?" if proc.gpu_index is None else str(proc.gpu_index)
        return "%s/%d@%s" % (node, proc.pid, gpu)
    return "%s/%d" % (node, proc.pid)


def process_rows(states: Mapping[str, NodeState], node: Optional[str], kind: str) -> List[ProcessRow]:
    """GPU compute processes (`kind` "gpu") or host processes ("host"), nodes in config order."""
    rows: List[ProcessRow] = []
    for state in _selected(states, node):
        frame = state.frame
        if frame is None:
            continue
        seen = set()
        for proc in frame.processes if kind == GPU_PROCESSES else frame.top_processes:
            key = _process_key(state.name, kind, proc)
            if key in seen:
                continue
            seen.add(key)
            rows.append(
                ProcessRow(
                    key=key,
                    kind=kind,
                    node=state.name,
                    pid=proc.pid,
                    user=proc.user,
                    name=proc.name,
                    command=proc.command or proc.name,
                    gpu_index=proc.gpu_index,
                    gpu_memory=proc.gpu_memory_bytes,
                    job_id=proc.job_id,
                    job_user=proc.job_user,
                    container=proc.container,
                    sm_percent=proc.gpu_sm_percent,
                    cpu_percent=proc.cpu_percent,
                    rss=proc.rss_bytes,
                    elapsed=proc.elapsed_at(frame.time),
                    proc_state=proc.state,
                    node_state=state.state,
                    live=state.is_live,
                    ppid=proc.ppid,
                    kernel_thread=bool(proc.kernel_thread),
                )
            )
    return rows


# --- sorting ----------------------------------------------------------------------------------


def sort_rows(rows: Sequence[Row], value_of: Optional[Callable[[Row], Any]], reverse: bool = False) -> List[Row]:
    """`rows` ordered by `value_of(row)`; missing (None) values go last either way; stable.

    `value_of` None keeps the given (config) order, reversed when `reverse`.
    """
    if value_of is None:
        return list(reversed(rows)) if reverse else list(rows)
    known = [(value_of(row), row) for row in rows]
    present = [pair for pair in known if pair[0] is not None]
    missing = [row for value, row in known if value is None]
    present.sort(key=lambda pair: pair[0], reverse=reverse)
    return [row for _, row in present] + missing


def _text_key(value: Optional[str]) -> Optional[str]:
    return value.lower() if value else None


TREE_BRANCH, TREE_LAST, TREE_PIPE, TREE_SPACE = "├─ ", "└─ ", "│  ", "   "


def process_tree(
    rows: Sequence[ProcessRow], value_of: Optional[Callable[[ProcessRow], Any]], reverse: bool = False
) -> List[Tuple[ProcessRow, str]]:
    """`rows` as a tree by parent pid, per node, siblings in sort order: (row, prefix) pairs, as htop's `t`.

    A row whose parent is not among `rows` (filtered out, a kernel thread hidden, another
    node's) is a root. Parent links that loop (hostile or racing data) cannot hide a row:
    whatever the walk from the roots did not reach is listed as a root too.
    """
    by_key = {(row.node, row.pid): row for row in rows}
    children: Dict[Tuple[str, int], List[ProcessRow]] = {}
    roots: List[ProcessRow] = []
    for row in rows:
        parent = (row.node, row.ppid) if row.ppid is not None and row.ppid != row.pid else None
        if parent is not None and parent in by_key:
            children.setdefault(parent, []).append(row)
        else:
            roots.append(row)
    out: List[Tuple[ProcessRow, str]] = []
    placed = set()

    def walk(level: List[ProcessRow], indent: str, top: bool) -> None:
        stack = [(sort_rows(level, value_of, reverse), indent, top)]
        while stack:  # iterative: a chain of thousands of processes must not hit the recursion limit
            siblings, indent, top = stack.pop()
            while siblings:
                row = siblings.pop(0)
                key = (row.node, row.pid)
                if key in placed:
                    continue
                placed.add(key)
                last = not siblings
                out.append((row, "" if top else indent + (TREE_LAST if last else TREE_BRANCH)))
                kids = children.get(key)
                if kids:
                    stack.append((siblings, indent, top))
                    stack.append(
                        (
                            sort_rows(kids, value_of, reverse),
                            indent if top else indent + (TREE_SPACE if last else TREE_PIPE),
                            False,
                        )
                    )
                    break

    walk(roots, "", True)
    left = [row for row in rows if (row.node, row.pid) not in placed]
    if left:
        walk(left, "", True)
    return out


# Sorting by state puts the nodes that need attention first.
STATE_SEVERITY = {
    STATE_DOWN: 0,
    STATE_AUTH: 1,
    STATE_HOSTKEY: 2,
    STATE_STALE: 3,
    STATE_CONNECTING: 4,
    STATE_FALLBACK: 5,
    STATE_DEGRADED: 5,
    STATE_UP: 6,
}


def state_sort_key(state: str) -> Tuple[int, str]:
    """Severity first (down before up), then the name for states we do not know."""
    return (STATE_SEVERITY.get(state, len(STATE_SEVERITY)), state)


# Sort values by column key, per row type; panes use the same keys for their columns.
NODE_SORT_KEYS: Dict[str, Callable[[NodeRow], Any]] = {
    "name": lambda r: r.name.lower(),
    "state": lambda r: state_sort_key(r.state),
    "reason": lambda r: _text_key(r.reason),
    "gpus": lambda r: r.gpu_count,
    "util_mean": lambda r: r.util_mean,
    "util_max": lambda r: r.util_max,
    "memory": lambda r: r.mem_percent,
    "temp": lambda r: r.hottest_temp,
    "power": lambda r: r.power_sum,
    "errors": lambda r: r.errors,
    "age": lambda r: r.age,
    "rtt": lambda r: r.rtt_ms,
    "jobs": lambda r: ",".join(r.jobs) if r.jobs else None,
}

GPU_SORT_KEYS: Dict[str, Callable[[GpuRow], Any]] = {
    "node": lambda r: (r.node.lower(), r.index),
    "index": lambda r: r.index,
    "name": lambda r: _text_key(r.name),
    "util": lambda r: r.util,
    "memory": lambda r: r.mem_used,
    "mem_percent": lambda r: r.mem_percent,
    "temp": lambda r: r.temp,
    "power": lambda r: r.power,
    "users": lambda r: ",".join(r.users).lower() if r.users else None,
    "jobs": lambda r: ",".join(r.jobs) if r.jobs else None,
    "node_state": lambda r: state_sort_key(r.node_state),
}

PROCESS_SORT_KEYS: Dict[str, Callable[[ProcessRow], Any]] = {
    "node": lambda r: r.node.lower(),
    "pid": lambda r: r.pid,
    "user": lambda r: _text_key(r.user),
    "gpu": lambda r: r.gpu_index,
    "gpu_memory": lambda r: r.gpu_memory,
    "sm": lambda r: r.sm_percent,
    "cpu": lambda r: r.cpu_percent,
    "rss": lambda r: r.rss,
    "elapsed": lambda r: r.elapsed,
    "state": lambda r: r.proc_state,
    "job": lambda r: r.job_id or r.container,
    "command": lambda r: _text_key(r.command),
}


# --- filtering --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterFields:
    """What a pane's rows offer the filter: free-text texts, `field:value` and number fields."""

    free: Callable[[Any], Iterable[Optional[str]]]
    text: Mapping[str, Callable[[Any], Iterable[Optional[str]]]]
    numbers: Mapping[str, Callable[[Any], Optional[float]]]


@dataclass(frozen=True)
class FilterTerm:
    """One term: free text (field None, op "~"), `field:value` (op ":") or a comparison."""

    field: Optional[str]
    op: str
    value: Any  # lower-cased str for text terms, float for comparisons


@dataclass(frozen=True)
class ParsedFilter:
    """The terms that parsed, and one message per term that did not (shown by the pane)."""

    text: str
    terms: Tuple[FilterTerm, ...] = ()
    errors: Tuple[str, ...] = ()

    @property
    def error(self) -> Optional[str]:
        return "; ".join(self.errors) if self.errors else None

    @property
    def active(self) -> bool:
        return bool(self.terms)


NO_FILTER = ParsedFilter("")

_COMPARISON = re.compile(r"^([A-Za-z_]+)(<=|>=|<|>|=)(.*)$")
_FIELD = re.compile(r"^([A-Za-z_]+):(.*)$")
_UNIT_SUFFIX = re.compile(r"(%|°c|°|c|w|s|ms)$")
_GLOB_CHARS = set("*?[")


def _number(text: str) -> Optional[float]:
    try:
        return float(_UNIT_SUFFIX.sub("", text.strip().lower()))
    except ValueError:
        return None


def _parse_term(token: str, fields: FilterFields) -> Tuple[Optional[FilterTerm], Optional[str]]:
    """One token as a term, or the message saying why it is not one."""
    comparison = _COMPARISON.match(token)
    if comparison:
        name, op, raw = comparison.group(1).lower(), comparison.group(2), comparison.group(3)
        if name in fields.numbers:
            if not raw:
                return None, "%s: needs a number after %s" % (token, op)
            value = _number(raw)
            if value is None:
                return None, "%s: %r is not a number" % (token, raw)
            return FilterTerm(name, op, value), None
        if op in ("<", ">", "<=", ">="):
            known = ", ".join(sorted(fields.numbers)) or "none"
            return None, "%s: no number field %r (numbers: %s)" % (token, name, known)
        # `word=...` with an unknown word is free text (command lines are full of them).
    field = _FIELD.match(token)
    if field:
        name, raw = field.group(1).lower(), field.group(2)
        if name in fields.text or name in fields.numbers:
            if not raw:
                return None, "%s needs a value" % token
            if name in fields.text:
                return FilterTerm(name, ":", raw.lower()), None
            value = _number(raw)
            if value is None:
                return None, "%s: %r is not a number" % (token, raw)
            return FilterTerm(name, "=", value), None
        # An unknown `word:` is free text too (`host:port`, `module:function`).
    return FilterTerm(None, "~", token.lower()), None


def parse_filter(text: str, fields: FilterFields) -> ParsedFilter:
    """Parse the `/` filter text against a pane's fields; never raises."""
    errors: List[str] = []
    try:
        tokens = shlex.split(text)
    except ValueError as exc:  # an unbalanced quote: split on spaces instead
        errors.append("filter: %s" % exc)
        tokens = text.split()
    terms: List[FilterTerm] = []
    for token in tokens:
        term, error = _parse_term(token, fields)
        if error:
            errors.append(error)
        elif term is not None:
            terms.append(term)
    return ParsedFilter(text=text, terms=tuple(terms), errors=tuple(errors))


def _text_matches(pattern: str, values: Iterable[Optional[str]]) -> bool:
    glob = any(ch in _GLOB_CHARS for ch in pattern)
    for value in values:
        if value is None:
            continue
        value = value.lower()
        if (glob and fnmatch.fnmatchcase(value, pattern)) or value == pattern:
            return True
    return False


def _compare(value: Optional[float], op: str, limit: float) -> bool:
    if value is None:
        return False
    if op == "<":
        return value < limit
    if op == ">":
        return value > limit
    if op == "<=":
        return value <= limit
    if op == ">=":
        return value >= limit
    return value == limit


def term_matches(row: Any, term: FilterTerm, fields: FilterFields) -> bool:
    """Whether one row satisfies one term."""
    if term.field is None:
        return any(term.value in (text or "").lower() for text in fields.free(row))
    if term.op == ":":
        return _text_matches(term.value, fields.text[term.field](row))
    return _compare(fields.numbers[term.field](row), term.op, term.value)


def filter_rows(rows: Sequence[Row], parsed: ParsedFilter, fields: FilterFields) -> List[Row]:
    """The rows that satisfy every term of `parsed` (all rows when it has none)."""
    if not parsed.terms:
        return list(rows)
    return [row for row in rows if all(term_matches(row, t, fields) for t in parsed.terms)]


def _index_text(index: Optional[int]) -> Tuple[Optional[str], ...]:
    return (None if index is None else str(index),)


NODE_FILTER = FilterFields(
    free=lambda r: (r.name, r.state, r.reason) + r.jobs,
    text={
        "name": lambda r: (r.name,),
        "node": lambda r: (r.name,),
        "state": lambda r: (r.state,),
        "job": lambda r: r.jobs,
        "user": lambda r: r.users,
    },
    numbers={
        "util": lambda r: r.util_mean,
        "maxutil": lambda r: r.util_max,
        "mem": lambda r: r.mem_percent,
        "temp": lambda r: r.hottest_temp,
        "power": lambda r: r.power_sum,
        "errors": lambda r: r.errors,
        "age": lambda r: r.age,
        "gpus": lambda r: r.gpu_count,
    },
)

GPU_FILTER = FilterFields(
    free=lambda r: (r.node, r.name, r.node_state) + r.users + r.jobs,
    text={
        "node": lambda r: (r.node,),
        "user": lambda r: r.users + r.job_users,
        "job": lambda r: r.jobs,
        "gpu": lambda r: _index_text(r.index),
        "name": lambda r: (r.name,),
        "state": lambda r: (r.node_state,),
    },
    numbers={
        "util": lambda r: r.util,
        "mem": lambda r: r.mem_percent,
        "temp": lambda r: r.temp,
        "power": lambda r: r.power,
        "procs": lambda r: r.process_count,
    },
)

PROCESS_FILTER = FilterFields(
    free=lambda r: (r.command, r.name, r.user, str(r.pid), r.node),
    text={
        "user": lambda r: (r.user, r.job_user),
        "job": lambda r: (r.job_id, r.container),
        "gpu": lambda r: _index_text(r.gpu_index),
        "pid": lambda r: (str(r.pid),),
        "node": lambda r: (r.node,),
        "state": lambda r: (r.proc_state,),
    },
    numbers={
        "cpu": lambda r: r.cpu_percent,
        "sm": lambda r: r.sm_percent,
    },
)
