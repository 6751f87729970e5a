"""Prometheus as a source: the fleet read from a Prometheus server into NodeFrames and NodeStates.

dcgm-exporter's GPU series, node-exporter's host series and our own exporter's
(`opsconsole agent --metrics-port`) are read with a handful of queries per refresh, each
covering every node (promql.py), run at once over one pooled HTTP client
(prometheus_http.py) and decoded as they arrive (prom_decode.py). A host's exporters are
joined into one node (node_identity.py). Every scrape target is a node state: a node whose
targets are all down (`up == 0`, from the first scrape on: a powered-off node) is `down`
with Prometheus's scrape error (/api/v1/targets); one whose node_exporter is down beside a
live dcgm-exporter is `degraded` ("node_exporter down: ...") and keeps what it has; an
unreachable Prometheus turns its nodes `down` with the reason; old samples are `stale`.
No Textual here.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Collection, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from opsconsole.model import (
    BAD_FRAME,
    STATE_AUTH,
    STATE_CONNECTING,
    STATE_DEGRADED,
    STATE_DOWN,
    STATE_STALE,
    STATE_UP,
    FrameError,
    NodeFrame,
    NodeState,
    checked,
)
from opsconsole.sources import metric_names as names
from opsconsole.sources import prom_decode as decode
from opsconsole.sources.node_identity import NodeIdentity, parse_node_names, strip_port
from opsconsole.sources.prometheus_http import PrometheusError, PrometheusHttp, Series
from opsconsole.sources.promql import FAST_GPU_METRICS, SLOW_GPU_METRICS, Queries
from opsconsole.units import format_frame_age

if TYPE_CHECKING:
    from opsconsole.model import NodeStateName

log = logging.getLogger(__name__)

Publish = Callable[[NodeState], None]
Forget = Callable[[str, str], None]  # (old node name, the node it is now part of)
PARALLEL_QUERIES = 8  # HTTP requests in flight at once, per source (and connections kept)
TARGET_ERROR_LIMIT = 300  # characters of a scrape error kept


@dataclass(frozen=True)
class SourceStatus:
    """How a source is doing: `state` is one of the node states (up, down, auth, connecting)."""

    name: str
    url: str
    state: NodeStateName = STATE_CONNECTING
    reason: Optional[str] = None
    since: Optional[float] = None
    refreshed_at: Optional[float] = None
    refresh_ms: Optional[float] = None
    requests: int = 0  # HTTP requests of the last refresh
    nodes: int = 0


@dataclass
class _Target:
    """One scrape target (job, instance): its up value, last scrape, the raw names it carries, what it is."""

    up: Optional[float] = None
    scraped_at: Optional[float] = None
    raws: Set[str] = field(default_factory=set)
    gap: Optional[float] = None  # smallest gap seen between two scrapes: its scrape interval
    kind: Optional[str] = None  # "dcgm-exporter", "node_exporter", "opsconsole exporter", once its series say
    error: Optional[str] = None  # Prometheus's lastError for it, while it is down


def _exporter_kind(metric: str) -> Optional[str]:
    if metric.startswith("DCGM_"):
        return "dcgm-exporter"
    if metric.startswith("node_"):
        return "node_exporter"
    if metric.startswith("opsconsole_"):
        return "opsconsole exporter"
    return None


def _target_words(key: Tuple[str, str], target: _Target) -> str:
    what = target.kind or key[0] or "target"  # a target never up said nothing: its job names it
    where = "instance=%s" % key[1]
    return "%s down (%s%s)" % (what, where, ": " + target.error if target.error else ", up == 0")


class PrometheusSource:
    """Reads every node Prometheus knows into NodeStates; publishes them like a NodeLink does.

    `config` is a SourceConfig (opsconsole/config/schema.py). `http` may be injected (tests, the
    benchmark); by default one PrometheusHttp is made from the config.
    """

    def __init__(
        self,
        config: Any,
        interval: float = 2.0,
        disk_paths: Sequence[str] = ("/",),
        http: Optional[PrometheusHttp] = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.name = config.name
        self.interval = config.interval or interval
        self.http = http or PrometheusHttp(
            config.url,
            bearer_token_file=config.bearer_token_file,
            ca_file=config.ca_file,
            timeout=config.timeout,
            connections=PARALLEL_QUERIES,
        )
        self.clock = clock
        self.queries = Queries(config, disk_paths)
        self.node_labels: Tuple[str, ...] = self.queries.node_labels
        self.gpu_label: str = config.gpu_label
        self.slow_every = max(1, int(config.slow_every))
        self.telemetry = config.telemetry
        self.disk_paths = tuple(disk_paths)
        self.status = SourceStatus(name=self.name, url=config.url, since=clock())
        self.identity = NodeIdentity(parse_node_names(getattr(config, "node_names", ()) or ()))
        self._allowed: Optional[Set[str]] = set(config.nodes) if config.nodes else None
        self._node_filter: Optional[Set[str]] = None  # set by the fleet (a Slurm job's nodes)
        self._states: Dict[str, NodeState] = {}
        self._members: Dict[str, List[str]] = {}  # node -> the raw names joined into it
        self._renamed: Dict[str, str] = {}  # node published before -> the node it is now part of
        self._origin: Dict[str, Tuple[str, str]] = {}  # raw name -> (label, raw value) it was named by
        self._raw_names: Dict[Tuple[str, str], str] = {}  # (label, raw value) -> raw name
        self._targets: Dict[Tuple[str, str], _Target] = {}
        self._slow = decode.SlowValues()
        self._last_xid: Dict[Tuple[str, int], int] = {}
        self._gpu_raws: Set[str] = set()  # raw names whose series carry GPUs (history asks them first)
        self._refreshes = 0
        self._errors_read_at = -1  # refresh count when /api/v1/targets was last read
        self._errors_for: Set[Tuple[str, str]] = set()  # the down targets it was read for
        self._pool: Any = None
        self._node_targets: Dict[str, List[Tuple[Tuple[str, str], _Target]]] = {}

    # The queries, as the benchmark and tests read them.
    @property
    def query_up(self) -> str:
        return self.queries.query_up

    @property
    def queries_fast(self) -> List[str]:
        return self.queries.queries_fast

    @property
    def query_rates(self) -> str:
        return self.queries.query_rates

    @property
    def slow_parts(self) -> List[str]:
        return self.queries.slow_parts

    # --- naming --------------------------------------------------------------------------

    def node_of(self, labels: Dict[str, str]) -> Optional[str]:
        """The raw name of a series: the first node label it carries (instance: without its port).

        Called for every series of every answer, so each (label, value) is worked out once.
        Raw names are joined into nodes by self.identity when the states are built.
        """
        for label in self.node_labels:
            value = labels.get(label)
            if value:
                key = (label, value)
                name = self._raw_names.get(key)
                if name is None:
                    name = self._raw_names[key] = strip_port(value) if label == "instance" else value
                    self._origin.setdefault(name, key)  # which label named it: history queries match on it
                return name
        return None

    def _wanted(self, node: str) -> bool:
        if self._allowed is not None and node not in self._allowed:
            return False
        return self._node_filter is None or node in self._node_filter

    def set_node_filter(self, nodes: Optional[Collection[str]]) -> None:
        """Publish only these nodes (a Slurm job's); None: every node (within the config's `nodes`)."""
        self._node_filter = None if nodes is None else set(nodes)

    def node_names(self) -> List[str]:
        """Nodes this source has published, sorted."""
        return sorted(self._states)

    def states(self) -> Dict[str, NodeState]:
        return dict(self._states)

    # --- one refresh -------------------------------------------------------------------------

    def refresh(self) -> List[NodeState]:
        """One full refresh, blocking (run it in a thread): the new state of every node of this source."""
        with _gc_paused():
            return self._refresh()

    def _refresh(self) -> List[NodeState]:
        started = time.perf_counter()
        requests_before = self.http.requests
        now = self.clock()
        exprs = [self.query_up] + self.queries_fast + [self.query_rates] + self.slow_now()
        fast_end = 1 + len(self.queries_fast)
        values = decode.FastValues()
        node_of, gpu_label = self.node_of, self.gpu_label

        def take(index: int, rows: List[Series]) -> None:
            if 0 < index < fast_end:
                decode.take_fast(rows, values, node_of, gpu_label)

        try:
            answers = self._query_all(exprs, now, take)
        except PrometheusError as exc:
            return self._source_failed(exc, now, started, requests_before)
        self._refreshes += 1
        decode.take_slow(
            [row for answer in answers[fast_end + 1 :] for row in answer],
            self._slow,
            node_of,
            gpu_label,
            self._saw_target,
        )
        decode.take_rates(answers[fast_end], values, node_of)
        self._take_up(answers[0])
        self._read_scrape_errors()
        states = self._build_states(now, values)
        self.status = replace(
            self.status,
            state=STATE_UP,
            reason=None,
            since=self.status.since if self.status.state == STATE_UP else now,
            refreshed_at=now,
            refresh_ms=round((time.perf_counter() - started) * 1000.0, 2),
            requests=self.http.requests - requests_before,
            nodes=len(self._states),
        )
        return states

    def slow_now(self) -> List[str]:
        """The slow-tier queries of this refresh: all of them first, then one per refresh in turn.

        Spreading them keeps every refresh about as quick as the others; each is re-read every
        `slow_every` refreshes (or every len(slow_parts), when that is more).
        """
        parts = self.slow_parts
        if self._refreshes == 0:
            return list(parts)
        turn = self._refreshes % max(self.slow_every, len(parts))
        return [parts[turn]] if turn < len(parts) else []

    def _query_all(self, exprs: List[str], now: float, take: Callable[[int, List[Series]], None]) -> List[List[Series]]:
        """Every query at once (a few threads); the first failure is raised.

        Each answer is handed to `take` as it arrives, so our work on it overlaps Prometheus's
        work on the others instead of waiting for the slowest.
        """
        from concurrent.futures import ThreadPoolExecutor, as_completed

        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=PARALLEL_QUERIES, thread_name_prefix="prometheus")
        futures = {self._pool.submit(self.http.query, expr, now): index for index, expr in enumerate(exprs)}
        answers: List[List[Series]] = [[] for _ in exprs]
        for future in as_completed(futures):
            index = futures[future]
            answers[index] = future.result()
            take(index, answers[index])
        return answers

    def _source_failed(self, exc: PrometheusError, now: float, started: float, requests_before: int) -> List[NodeState]:
        state: NodeStateName = STATE_AUTH if exc.status in (401, 403) else STATE_DOWN
        reason = "prometheus %s: %s" % (self.config.url, exc)
        self.status = replace(
            self.status,
            state=state,
            reason=reason,
            since=self.status.since if self.status.state == state else now,
            refresh_ms=round((time.perf_counter() - started) * 1000.0, 2),
            requests=self.http.requests - requests_before,
        )
        out = []
        for name, previous in self._states.items():
            since = previous.since if previous.state == state and previous.reason == reason else now
            new = replace(previous, state=state, reason=reason, since=since)
            self._states[name] = new
            out.append(new)
        return out

    # --- targets -------------------------------------------------------------------------------

    def _target(self, key: Tuple[str, str]) -> _Target:
        target = self._targets.get(key)
        if target is None:
            target = self._targets[key] = _Target()
        return target

    def _saw_target(self, raw: str, labels: Dict[str, str]) -> None:
        """A slow series of target (job, instance) named `raw`: the target carries it, and says what it knows of its host."""
        instance = labels.get("instance", "")
        if not instance:
            return
        target = self._target((labels.get("job", ""), instance))
        target.raws.add(raw)
        metric = labels.get("__name__", "")
        if target.kind is None:
            target.kind = _exporter_kind(metric)
        if labels.get(self.gpu_label) is not None:
            self._gpu_raws.add(raw)
        nodename = labels.get("nodename") if metric == "node_uname_info" else None
        hostname = labels.get(names.LABEL_HOSTNAME) or labels.get(names.LABEL_HOSTNAME_NEW)
        if metric == names.NODE_INFO:
            hostname = None  # our exporter's node_info `hostname` is the probe's, said by its own node label already
        self.identity.saw(raw, instance, nodename=nodename, hostname=hostname)

    def _take_up(self, up_rows: List[Series]) -> None:
        stamps: Dict[Tuple[str, str], float] = {}
        ups: Dict[Tuple[str, str], float] = {}
        for labels, value in up_rows:
            key = (labels.get("job", ""), labels.get("instance", ""))
            if not key[1]:
                continue
            if labels.get("oc_kind") == "ts":
                stamps[key] = value
                continue
            ups[key] = value
            if key not in self._targets:  # a target never up (or not yet read): it is a node too
                raw = self.node_of(labels)
                if raw is not None:
                    self._target(key).raws.add(raw)
                    self.identity.saw(raw, key[1])
        for key, target in self._targets.items():
            if key not in ups:
                target.up = None  # the target left Prometheus's config
                continue
            target.up = ups[key]
            if target.up != 0:
                target.error = None
            stamp = stamps.get(key)
            if stamp is not None and target.scraped_at is not None and stamp > target.scraped_at:
                gap = stamp - target.scraped_at
                target.gap = gap if target.gap is None else min(target.gap, gap)
            if stamp is not None:
                target.scraped_at = stamp

    def _read_scrape_errors(self) -> None:
        """Prometheus's own words for why its down targets fail (/api/v1/targets: lastError).

        Read only while some target is down: when the set of down targets changes, and then
        every slow_every refreshes (the answer lists every target: ~1 MB at 1,024 nodes).
        """
        down = {key for key, target in self._targets.items() if target.up == 0}
        if not down:
            self._errors_for = set()
            return
        if down == self._errors_for and self._refreshes - self._errors_read_at < self.slow_every:
            return
        self._errors_for, self._errors_read_at = down, self._refreshes
        try:
            listed = self.http.targets()
        except PrometheusError as exc:  # the states still say up == 0
            log.debug("prometheus %s: targets: %s", self.name, exc)
            return
        for item in listed:
            labels = item.get("labels")
            if not isinstance(labels, dict):
                continue
            target = self._targets.get((str(labels.get("job", "")), str(labels.get("instance", ""))))
            error = item.get("lastError")
            if target is not None and target.up == 0 and isinstance(error, str) and error:
                target.error = " ".join(error.split())[:TARGET_ERROR_LIMIT]

    # --- states -----------------------------------------------------------------------------------

    def _build_states(self, now: float, values: "decode.FastValues") -> List[NodeState]:
        raws = set(values.gpus) | set(values.hosts) | set(values.migs)
        for members in self._members.values():
            raws.update(members)
        targets_of_raw: Dict[str, List[Tuple[Tuple[str, str], _Target]]] = {}
        for key, target in self._targets.items():
            if target.up is None and not target.raws & raws:
                continue  # left Prometheus's config, and nothing of it is shown
            for raw in target.raws:
                raws.add(raw)
                targets_of_raw.setdefault(raw, []).append((key, target))
        groups = self.identity.groups(raws)
        for old in [name for name in self._states if name not in groups]:
            # Its raw names now belong to another node: the identity learned more (a node_exporter
            # came up and said the nodename). The fleet is told, so no ghost of the old name stays.
            del self._states[old]
            members = self._members.get(old) or [old]
            self._renamed[old] = self.identity.node(members[0])
        self._members = groups
        self._node_targets = {}
        states: List[NodeState] = []
        for node in sorted(groups):
            members = groups[node]
            pairs = sorted({key: t for raw in members for key, t in targets_of_raw.get(raw, ())}.items())
            self._node_targets[node] = pairs
            if not self._wanted(node):
                continue
            state = self._node_state(node, members, now, values, pairs)
            self._states[node] = state
            states.append(state)
        return states

    def _stale_after(self, targets: Sequence[_Target]) -> float:
        if self.config.stale_after is not None:
            return self.config.stale_after
        gaps = [t.gap for t in targets if t.gap is not None]
        scrape = max(gaps) if gaps else 15.0  # Prometheus's default scrape interval, until we see one
        return 3.0 * max(scrape, self.interval) + 2.0

    def _node_state(
        self,
        node: str,
        members: List[str],
        now: float,
        values: "decode.FastValues",
        pairs: List[Tuple[Tuple[str, str], _Target]],
    ) -> NodeState:
        previous = self._states.get(node) or NodeState(name=node, since=now)
        targets = [t for _, t in pairs]
        failed = [(key, t) for key, t in pairs if t.up == 0]
        errors = [_target_words(key, t) for key, t in failed]
        address = "%s via %s" % (node, self.config.url)

        def move(
            state: NodeStateName,
            reason: Optional[str],
            frame: Optional[NodeFrame] = None,
            received: Optional[float] = None,
        ) -> NodeState:
            since = previous.since if previous.state == state and previous.since is not None else now
            return replace(
                previous,
                state=state,
                reason=reason,
                since=since,
                address=address,
                frame=frame if frame is not None else previous.frame,
                received_at=received if received is not None else previous.received_at,
            )

        gpus: decode.GpuFields = {}
        migs: decode.MigFields = {}
        host: Dict[str, Any] = {}
        procs: decode.ProcFields = {}
        slow_host: Dict[str, Any] = {}
        seen = False
        for raw in members:
            for index, fields in values.gpus.get(raw, {}).items():
                gpus.setdefault(index, {}).update(fields)
                seen = True
            if raw in values.migs:
                migs.update(values.migs[raw])
                seen = True
            if raw in values.hosts:
                host.update(values.hosts[raw])
                seen = True
            procs.update(values.procs.get(raw, {}))
            slow_host.update(self._slow.hosts.get(raw, {}))
        if not seen:
            if targets and len(failed) == len(targets):
                return move(STATE_DOWN, "; ".join(errors))
            return move(STATE_STALE, "Prometheus has no recent samples for %s" % node)
        samples = decode.gpu_samples(gpus, migs, self._slow, members, self._last_xid, node)
        frame_time = host.get(names.FRAME_TIME)
        if frame_time is None:
            scraped_at = [t.scraped_at for t in targets if t.scraped_at is not None]
            frame_time = max(scraped_at) if scraped_at else now
        seq = host.get(names.FRAME_SEQ)
        frame = decode.build_frame(
            node,
            now,
            frame_time,
            int(seq) if seq is not None else self._refreshes,
            samples,
            decode.process_samples(procs, samples),
            host,
            slow_host,
            errors,
        )
        try:
            # The checks a node's own frame gets: an exporter's labels and values are as hostile as a node's
            # (text over the wire bounds, numbers out of range). A bad one keeps the last good frame.
            checked(frame)
        except FrameError as exc:
            return move(previous.state if previous.frame is not None else STATE_DOWN, BAD_FRAME + str(exc))
        scraped = [t.scraped_at for t in targets if t.scraped_at is not None and t.up != 0]
        stale_after = self._stale_after(targets)
        if scraped and now - max(scraped) > stale_after:
            return move(STATE_STALE, "last scrape %s ago" % format_frame_age(now - max(scraped)), frame, now)
        probe_time = host.get(names.FRAME_TIME)
        if probe_time is not None and now - probe_time > stale_after:
            return move(
                STATE_STALE,
                "exporter serves a frame %s old (its probe is not polling)" % format_frame_age(now - probe_time),
                frame,
                now,
            )
        if targets and len(failed) == len(targets):
            return move(STATE_DOWN, "; ".join(errors), frame, now)
        if failed:
            return move(STATE_DEGRADED, "; ".join(errors), frame, now)
        return move(STATE_UP, None, frame, now)

    # --- running -------------------------------------------------------------------------------

    async def poll_once(self, timeout: float) -> List[NodeState]:
        """One refresh within `timeout` seconds (the HTTP timeout is capped to it)."""
        from opsconsole.nodes.local import run_in_daemon_thread

        self.http.timeout = min(self.config.timeout, timeout)
        try:
            return await asyncio.wait_for(run_in_daemon_thread(self.refresh), timeout + 0.2)
        finally:
            self.http.timeout = self.config.timeout

    def take_renamed(self) -> Dict[str, str]:
        """Nodes published before under a name that is now part of another node: old -> new (once each)."""
        renamed, self._renamed = self._renamed, {}
        return renamed

    async def run(self, publish: Publish, forget: Optional[Forget] = None) -> None:
        """Refresh every interval and publish every node's state; never returns until cancelled.

        A refresh is armed only after the previous one finished, so refreshes never overlap.
        `forget(old, new)` is called for a node that is now shown as part of another one.
        """
        from opsconsole.nodes.local import run_in_daemon_thread

        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                states = await run_in_daemon_thread(self.refresh)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not end the source: say so and go on
                log.exception("prometheus source %s: refresh failed", self.name)
                states = self._source_failed(
                    PrometheusError("refresh failed: %s: %s" % (type(exc).__name__, exc)),
                    self.clock(),
                    time.perf_counter(),
                    self.http.requests,
                )
            for state in states:
                publish(state)
            for old, new in self.take_renamed().items():
                if forget is not None:
                    forget(old, new)
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))

    async def close(self) -> None:
        """Stop the query threads and close the kept-alive connections. Safe to call twice."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)
        close = getattr(self.http, "close", None)
        if close is not None:
            close()

    # --- history ---------------------------------------------------------------------------------

    def history_query(self, node: str, gpu: Optional[int], metric: str) -> Tuple[str, float]:
        """The PromQL for `metric` of `node` (GPU `gpu`, or the node when None) and the factor to our unit."""
        members = self._members.get(node) or [node]
        ordered = sorted(members, key=lambda raw: (raw not in self._gpu_raws, raw))
        origins = [self._origin[raw] for raw in ordered if raw in self._origin]
        return self.queries.history_query(node, origins, self.identity.node_addresses(members), gpu, metric)

    def history_blocking(self, node: str, gpu: Optional[int], metric: str, seconds: float) -> List[Tuple[float, float]]:
        """(time, value) pairs of the last `seconds`, oldest first; PrometheusError when it cannot answer."""
        expr, factor = self.history_query(node, gpu, metric)
        end = self.clock()
        step = max(self.interval, seconds / 300.0)  # at most ~300 points: a sparkline's worth
        rows = self.http.query_range(expr, end - seconds, end, step)
        if not rows:
            return []
        return [(stamp, value * factor) for stamp, value in rows[0][1]]

    async def history(self, node: str, gpu: Optional[int], metric: str, seconds: float) -> List[Tuple[float, float]]:
        """Like history_blocking, in a worker thread (for sparklines)."""
        from opsconsole.nodes.local import run_in_daemon_thread

        return await run_in_daemon_thread(lambda: self.history_blocking(node, gpu, metric, seconds))


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic GC off while a refresh runs (threads may nest it; the last one out restores it).

    A refresh parses ~10 MB of JSON at 1,024 nodes: a million dicts, lists and strings that
    hold no cycles and die when the refresh ends. With the collector on, its passes over
    them took two thirds of the parse (measured: 0.41 s a refresh, 0.27 s with it off).
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


__all__ = ["PrometheusSource", "SourceStatus", "strip_port", "FAST_GPU_METRICS", "SLOW_GPU_METRICS", "PARALLEL_QUERIES"]
