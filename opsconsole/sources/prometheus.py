"""Prometheus as a source: the fleet read from a Prometheus server into NodeFrames and NodeStates.

dcgm-exporter's GPU series, node-exporter's host series and our own exporter's
(`opsconsole agent --metrics-port`) are read through /api/v1/query with a handful of
queries per refresh, each one covering every node at once (`{__name__=~"A|B|..."}`
aggregated to the labels we need), so the number of requests does not grow with the
fleet; the node is named here from the raw node labels (cheaper than label_replace in PromQL).
Slowly changing fields (names, UUIDs, limits, ECC and remapped-row counters, file systems,
core counts) are read by the slow tier, its queries spread one per refresh so that each
is re-read every `slow_every` refreshes. Node and source trouble become the same
states the SSH path uses: an unreachable Prometheus turns its nodes `down` with the
reason, a target with `up == 0` is a scrape failure (`down`), old samples are `stale`.
No Textual here.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, Collection, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from opsconsole.model import (
    STATE_AUTH,
    STATE_CONNECTING,
    STATE_DOWN,
    STATE_STALE,
    STATE_UP,
    DiskUsage,
    GpuSample,
    HostSample,
    NetRate,
    NodeFrame,
    NodeState,
    ProcessSample,
)
from opsconsole.model import replace_decoded
from opsconsole.probe.nvml_decode import decode_clock_event_reasons
from opsconsole.sources import metric_names as names
from opsconsole.sources.prometheus_http import PrometheusError, PrometheusHttp, Series

log = logging.getLogger(__name__)

Publish = Callable[[NodeState], None]

# GPU metrics read on every refresh; the rest of names.GPU_METRICS every slow_every refreshes.
FAST_GPU_METRICS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "opsconsole_gpu_pstate",
    "opsconsole_gpu_lost",
)
FAST_GPU_EXTRA = (
    names.METRIC_CLOCK_REASONS,
    names.METRIC_CLOCK_EVENTS,
    names.METRIC_XID,
    names.METRIC_PROCESS_MEMORY,
    names.METRIC_PROCESS_SM,
)
FAST_HOST_METRICS = (
    names.HOST_CPU_PERCENT,
    names.HOST_IOWAIT,
    names.HOST_LOAD,
    names.HOST_MEM_USED,
    names.HOST_MEM_AVAILABLE,
    names.HOST_SWAP_USED,
    names.HOST_NET_RX,
    names.HOST_NET_TX,
    names.HOST_UPTIME,
    names.FRAME_SEQ,
    names.FRAME_TIME,
    names.FRAME_ERRORS,
    names.PROBE_SECONDS,
    "node_load1",
    "node_load5",
    "node_load15",
    "node_memory_MemAvailable_bytes",
    "node_memory_SwapFree_bytes",
)
# dcgm-exporter's default counters among the slow ones: listed first, so that _split deals them
# out evenly and no slow query carries most of the series.
_DCGM_DEFAULT_SLOW = (
    "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)
SLOW_GPU_METRICS = _DCGM_DEFAULT_SLOW + tuple(
    m for m, _, _ in names.GPU_METRICS if m not in FAST_GPU_METRICS and m not in _DCGM_DEFAULT_SLOW
) + (names.METRIC_COMPUTE_MODE,)
SLOW_HOST_METRICS = (
    names.HOST_CPU_COUNT,
    names.HOST_MEM_TOTAL,
    names.HOST_SWAP_TOTAL,
    names.NODE_INFO,
    "node_memory_MemTotal_bytes",
    "node_memory_SwapTotal_bytes",
    "node_boot_time_seconds",
    "node_uname_info",
)
# Labels that tell a GPU apart from its siblings, read with the slow tier.
# Names every GPU exporter has: one of them carries each GPU's labels (UUID, model...) to the slow tier.
GPU_INFO_METRICS = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")
GPU_INFO_LABELS = (names.LABEL_UUID, names.LABEL_MODEL, names.LABEL_PCI_BUS_ID, names.LABEL_DRIVER)

FAST_QUERIES = 8  # the per-refresh GPU names, split over this many queries
SLOW_GPU_QUERIES = 2
PARALLEL_QUERIES = 8  # HTTP requests in flight at once, per source

# History metric names (opsconsole/history.py's and GpuSample's) -> what to ask Prometheus.
_GPU_HISTORY = {
    "utilization": ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    "temperature": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", 1.0),
}


@dataclass(frozen=True)
class SourceStatus:
    """How a source is doing: `state` is one of the node states (up, down, auth, connecting)."""

    name: str
    url: str
    state: str = STATE_CONNECTING
    reason: Optional[str] = None
    since: Optional[float] = None
    refreshed_at: Optional[float] = None
    refresh_ms: Optional[float] = None
    requests: int = 0  # HTTP requests of the last refresh
    nodes: int = 0


@dataclass
class _Target:
    """One scrape target (job, instance): its up value, last scrape time and the nodes it carries."""

    up: Optional[float] = None
    scraped_at: Optional[float] = None
    nodes: Set[str] = None  # type: ignore[assignment]
    gap: Optional[float] = None  # smallest gap seen between two scrapes: its scrape interval

    def __post_init__(self) -> None:
        if self.nodes is None:
            self.nodes = set()


def _regex_alternatives(metric_names: Iterable[str]) -> str:
    return "|".join(re.escape(name) for name in metric_names)


def strip_port(value: str) -> str:
    """`host:9100` -> `host`, `[::1]:9100` -> `::1`; anything else as it is."""
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    host, sep, port = value.rpartition(":")
    if sep and port.isdigit() and host and ":" not in host:
        return host
    return value


def _number(value: float, attr: str) -> Any:
    if attr in names.INTEGER_FIELDS:
        return int(round(value))
    return value


class PrometheusSource:
    """Reads every node Prometheus knows into NodeStates; publishes them like a NodeLink does.

    `config` is a SourceConfig (opsconsole/config.py). `http` may be injected (tests, the
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
            config.url, bearer_token_file=config.bearer_token_file, ca_file=config.ca_file, timeout=config.timeout
        )
        self.clock = clock
        self.node_labels: Tuple[str, ...] = tuple(config.node_labels)
        self.gpu_label: str = config.gpu_label
        self.slow_every = max(1, int(config.slow_every))
        self.telemetry = config.telemetry
        self.disk_paths = tuple(disk_paths)
        self.status = SourceStatus(name=self.name, url=config.url, since=clock())
        self._allowed: Optional[Set[str]] = set(config.nodes) if config.nodes else None
        self._node_filter: Optional[Set[str]] = None  # set by the fleet (a Slurm job's nodes)
        self._states: Dict[str, NodeState] = {}
        self._origin: Dict[str, Tuple[str, str]] = {}  # node -> (label, raw value) it was named by
        self._node_names: Dict[Tuple[str, str], str] = {}  # (label, raw value) -> node
        self._targets: Dict[Tuple[str, str], _Target] = {}
        self._slow_gpu: Dict[Tuple[str, int], Dict[str, Any]] = {}
        self._slow_host: Dict[str, Dict[str, Any]] = {}
        self._last_xid: Dict[Tuple[str, int], int] = {}
        self._refreshes = 0
        self._pool: Any = None
        self._node_targets: Dict[str, List[Tuple[Tuple[str, str], _Target]]] = {}
        self._build_queries()

    # --- queries -------------------------------------------------------------------------

    def _selector(self, inner: str) -> str:
        extra = (self.config.selector or "").strip()
        return "{%s%s}" % (inner, ("," + extra) if extra else "")

    def _by_node(self, aggregation: str, labels: str, inner: str, wrap: str = "%s") -> str:
        """`aggregation by (<node labels>, labels) (wrap % selector)`: one series per node and `labels`.

        Tried and dropped: one aggregation per node label joined with `or` (answers hold one node
        label, a fifth less JSON), as its `label=""` matchers cost Prometheus more than it saved.
        """
        by = ", ".join(self.node_labels) + (", " + labels if labels else "")
        return "%s by (%s) (%s)" % (aggregation, by, wrap % self._selector(inner))

    def _build_queries(self) -> None:
        gpu = self.gpu_label
        # Answers keep a raw node label and node_of names the node here: naming it in PromQL
        # (label_replace on every series) doubled Prometheus's work per query at fleet scale.
        by_node = ", ".join(self.node_labels)
        # Several queries over disjoint name sets, run at once: Prometheus evaluates them in parallel.
        self.queries_fast = [
            self._by_node("max", "__name__, %s, pid, process_name, user" % gpu, '__name__=~"%s"' % _regex_alternatives(part))
            for part in _split(FAST_GPU_METRICS + FAST_GPU_EXTRA, FAST_QUERIES)
        ] + [self._by_node("max", "__name__, period, device", '__name__=~"%s"' % _regex_alternatives(FAST_HOST_METRICS))]
        # The slow tier: GPU names and targets from one series per GPU (any of the names every
        # GPU exporter has), the slow GPU values without those long labels (they made the old
        # all-in-one slow answer 12 MB at 1,024 nodes), host values with their targets.
        self.query_gpu_info = "group by (job, instance, %s, %s, %s) (%s)" % (
            by_node, gpu, ", ".join(GPU_INFO_LABELS), self._selector('__name__=~"%s"' % _regex_alternatives(GPU_INFO_METRICS))
        )
        self.queries_slow_gpu = [
            self._by_node("max", "__name__, %s, mode" % gpu, '__name__=~"%s"' % _regex_alternatives(part))
            for part in _split(SLOW_GPU_METRICS, SLOW_GPU_QUERIES)
        ]
        self.query_slow_host = "max by (__name__, job, instance, %s, gpu_source, driver_version, hostname, nodename) (%s)" % (
            by_node, self._selector('__name__=~"%s"' % _regex_alternatives(SLOW_HOST_METRICS))
        )
        mounts = "|".join(re.escape(path) for path in self.disk_paths) or "/"
        fs_names = names.NODE_EXPORTER_FILESYSTEM + (names.HOST_FS_SIZE, names.HOST_FS_USED, names.HOST_FS_FREE)
        self.query_fs = self._by_node(
            "max", "__name__, mountpoint", '__name__=~"%s",mountpoint=~"%s"' % (_regex_alternatives(fs_names), mounts)
        )
        window = self.config.rate_window
        # Only the idle and iowait modes: a node has 8 modes per core, and busy = cores - idle.
        cpu = '__name__="node_cpu_seconds_total",mode=~"idle|iowait"'
        rx = '__name__="node_network_receive_bytes_total",device!="lo"'
        tx = '__name__="node_network_transmit_bytes_total",device!="lo"'
        self.query_rates = " or ".join(
            'label_replace(%s, "oc_kind", "%s", "", "")' % (self._by_node("sum", split, inner, "rate(%%s[%s])" % window), kind)
            for kind, split, inner in (("cpu", "mode", cpu), ("rx", "device", rx), ("tx", "device", tx))
        )
        # How many cores: changes only with the hardware, so read with the slow tier.
        cpu_idle = '__name__="node_cpu_seconds_total",mode="idle"'
        self.query_cpus = 'label_replace(%s, "oc_kind", "cpus", "", "")' % self._by_node("count", "", cpu_idle)
        self.slow_parts = [self.query_gpu_info] + self.queries_slow_gpu + [self.query_slow_host, self.query_fs, self.query_cpus]
        up = self._selector('__name__="up"')
        self.query_up = 'label_replace(timestamp(%s), "oc_kind", "ts", "", "") or %s' % (up, up)

    # --- naming --------------------------------------------------------------------------

    def node_of(self, labels: Dict[str, str]) -> Optional[str]:
        """The node a series belongs to: the first node label it carries (instance: without its port).

        Called for every series of every answer, so each (label, value) is worked out once.
        """
        for label in self.node_labels:
            value = labels.get(label)
            if value:
                key = (label, value)
                name = self._node_names.get(key)
                if name is None:
                    name = self._node_names[key] = strip_port(value) if label == "instance" else value
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
        values = _FastValues()

        def take(index: int, rows: List[Series]) -> None:
            if 0 < index < fast_end:
                self._take_fast(rows, values)

        try:
            answers = self._query_all(exprs, now, take)
        except PrometheusError as exc:
            return self._source_failed(exc, now, started, requests_before)
        self._refreshes += 1
        self._take_slow([row for answer in answers[fast_end + 1:] for row in answer])
        states = self._build_states(now, answers[0], values, answers[fast_end])
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
        state = STATE_AUTH if exc.status in (401, 403) else STATE_DOWN
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

    def _take_slow(self, slow_rows: List[Series]) -> None:
        gpu_label = self.gpu_label
        fs_rows = []
        gpus: Dict[Tuple[str, int], Dict[str, Any]] = {}
        hosts: Dict[str, Dict[str, Any]] = {}
        seen_targets: Set[Tuple[str, str]] = set()
        for labels, value in slow_rows:
            node = self.node_of(labels)
            if node is None:
                continue
            if labels.get("oc_kind") == "cpus":
                hosts.setdefault(node, {})["_cpus"] = value
                continue
            if "mountpoint" in labels:
                fs_rows.append((labels, value))
                continue
            job = labels.get("job")
            if job is not None:  # the queries that keep job map scrape targets to nodes
                target = (job, labels.get("instance", ""))
                if target not in seen_targets and target[1]:
                    seen_targets.add(target)
                    self._targets.setdefault(target, _Target()).nodes.add(node)
            metric = labels.get("__name__", "")
            gpu = labels.get(gpu_label)
            if gpu is not None and gpu.isdigit():
                fields = gpus.setdefault((node, int(gpu)), {})
                if names.LABEL_UUID in labels:
                    fields["uuid"] = labels[names.LABEL_UUID] or None
                    fields["name"] = labels.get(names.LABEL_MODEL) or None
                    fields["pci_bus_id"] = labels.get(names.LABEL_PCI_BUS_ID) or None
                    driver = labels.get(names.LABEL_DRIVER)
                    if driver:
                        hosts.setdefault(node, {})["driver"] = driver
                if metric == names.METRIC_COMPUTE_MODE:
                    fields["compute_mode"] = labels.get("mode") or None
                    continue
                spec = names.GPU_METRIC_FIELDS.get(metric)
                if spec is not None:
                    attr, kind = spec
                    fields[attr] = (value != 0) if kind == "bool" else _number(value * float(kind), attr)  # type: ignore[arg-type]
                continue
            host = hosts.setdefault(node, {})
            if metric == names.NODE_INFO:
                host["gpu_source"] = labels.get("gpu_source") or None
                host["driver"] = labels.get("driver_version") or host.get("driver")
                host["hostname"] = labels.get("hostname") or None
            elif metric == "node_uname_info":
                host.setdefault("hostname", labels.get("nodename") or None)
            else:
                host[metric] = value
        disks: Dict[str, Dict[str, Dict[str, float]]] = {}
        for labels, value in fs_rows:
            node = self.node_of(labels)
            mount = labels.get("mountpoint")
            if node is None or not mount:
                continue
            disks.setdefault(node, {}).setdefault(mount, {})[labels.get("__name__", "")] = value
        for node, mounts in disks.items():
            hosts.setdefault(node, {})["disks"] = tuple(
                disk for disk in (_disk(mount, values) for mount, values in sorted(mounts.items())) if disk is not None
            )
        # Merged into what we knew: each refresh reads one part, and a node whose target is down is absent.
        for key, fields in gpus.items():
            self._slow_gpu.setdefault(key, {}).update(fields)
        for node, host in hosts.items():
            self._slow_host.setdefault(node, {}).update(host)

    def _take_fast(self, fast_rows: List[Series], values: "_FastValues") -> None:
        """The series of one fast answer into `values`: fields per node and GPU, host fields, processes."""
        gpu_label = self.gpu_label
        gpu_values, host_values, procs = values.gpus, values.hosts, values.procs
        convert = _CONVERTERS
        indexes = _GPU_INDEXES
        node_of = self.node_of
        for labels, value in fast_rows:
            node = node_of(labels)
            if node is None:
                continue
            metric = labels["__name__"]
            gpu = labels.get(gpu_label)
            index = indexes.get(gpu) if gpu is not None else None
            if index is None and gpu is not None and gpu.isdigit():
                index = indexes.setdefault(gpu, int(gpu))
            if index is not None:
                converter = convert.get(metric)
                if converter is not None:  # the common case: a plain GpuSample field
                    nodes_gpus = gpu_values.get(node)
                    if nodes_gpus is None:
                        nodes_gpus = gpu_values[node] = {}
                    fields = nodes_gpus.get(index)
                    if fields is None:
                        fields = nodes_gpus[index] = {}
                    fields[converter[0]] = converter[1](value)
                    continue
                if metric in (names.METRIC_PROCESS_MEMORY, names.METRIC_PROCESS_SM):
                    row = procs.setdefault(node, {}).setdefault((index, labels.get("pid", "")), {})
                    row["name"] = labels.get("process_name", "")
                    row["user"] = labels.get("user") or None
                    row[metric] = value
                    continue
                fields = gpu_values.setdefault(node, {}).setdefault(index, {})
                if metric in (names.METRIC_CLOCK_EVENTS, names.METRIC_CLOCK_REASONS):
                    mask = int(value)
                    reasons = _REASONS.get(mask)
                    if reasons is None:
                        reasons = _REASONS[mask] = decode_clock_event_reasons(mask)
                    fields["clock_event_reasons"] = reasons
                elif metric == names.METRIC_XID:
                    fields["_xid"] = int(value)
                else:
                    spec = names.GPU_METRIC_FIELDS.get(metric)
                    if spec is not None:
                        attr, kind = spec
                        fields[attr] = (value != 0) if kind == "bool" else _number(value * float(kind), attr)  # type: ignore[arg-type]
                continue
            host = host_values.setdefault(node, {})
            if metric == names.HOST_LOAD or metric in (names.HOST_NET_RX, names.HOST_NET_TX):
                key = labels.get("period") if metric == names.HOST_LOAD else labels.get("device")
                host.setdefault(metric, {})[key] = value
            else:
                host[metric] = value

    def _build_states(self, now: float, up_rows: List[Series], values: "_FastValues", rate_rows: List[Series]) -> List[NodeState]:
        gpu_values, host_values, procs = values.gpus, values.hosts, values.procs
        for labels, value in rate_rows:
            node = self.node_of(labels)
            if node is None:
                continue
            kind = labels.get("oc_kind")
            host = host_values.setdefault(node, {})
            if kind == "cpu":
                host.setdefault("_cpu_modes", {})[labels.get("mode", "")] = value
            elif kind == "cpus":
                host["_cpus"] = value
            elif kind in ("rx", "tx"):
                host.setdefault("_net_" + kind, {})[labels.get("device", "")] = value
        self._take_up(up_rows)

        states: List[NodeState] = []
        nodes = set(gpu_values) | set(host_values) | set(self._states)
        self._node_targets = {}  # node -> [(key, target)], built once per refresh
        for key, target in self._targets.items():
            for node in target.nodes:
                self._node_targets.setdefault(node, []).append((key, target))
            nodes |= target.nodes
        for node in sorted(nodes):
            if not self._wanted(node):
                continue
            state = self._node_state(node, now, gpu_values.get(node), host_values.get(node), procs.get(node))
            self._states[node] = state
            states.append(state)
        return states

    def _take_up(self, up_rows: List[Series]) -> None:
        stamps: Dict[Tuple[str, str], float] = {}
        ups: Dict[Tuple[str, str], float] = {}
        for labels, value in up_rows:
            target = (labels.get("job", ""), labels.get("instance", ""))
            if labels.get("oc_kind") == "ts":
                stamps[target] = value
            else:
                ups[target] = value
        for key, target in self._targets.items():
            if key not in ups:
                target.up = None  # the target left Prometheus's config
                continue
            target.up = ups[key]
            stamp = stamps.get(key)
            if stamp is not None and target.scraped_at is not None and stamp > target.scraped_at:
                gap = stamp - target.scraped_at
                target.gap = gap if target.gap is None else min(target.gap, gap)
            if stamp is not None:
                target.scraped_at = stamp

    def _stale_after(self, targets: Sequence[_Target]) -> float:
        if self.config.stale_after is not None:
            return self.config.stale_after
        gaps = [t.gap for t in targets if t.gap is not None]
        scrape = max(gaps) if gaps else 15.0  # Prometheus's default scrape interval, until we see one
        return 3.0 * max(scrape, self.interval) + 2.0

    def _node_state(
        self,
        node: str,
        now: float,
        gpus: Optional[Dict[int, Dict[str, Any]]],
        host: Optional[Dict[str, Any]],
        procs: Optional[Dict[Tuple[int, str], Dict[str, Any]]],
    ) -> NodeState:
        previous = self._states.get(node) or NodeState(name=node, since=now)
        pairs = self._node_targets.get(node, ())
        targets = [t for _, t in pairs]
        failed = [key for key, t in pairs if t.up == 0]
        errors = ["scrape failed: job=%s instance=%s (up == 0)" % key for key in failed]
        address = "%s via %s" % (node, self.config.url)

        def move(state: str, reason: Optional[str], frame: Optional[NodeFrame] = None, received: Optional[float] = None) -> NodeState:
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

        if gpus is None and host is None:
            if targets and len(failed) == len(targets):
                return move(STATE_DOWN, "; ".join(errors))
            return move(STATE_STALE, "Prometheus has no recent samples for %s" % node)
        frame = self._frame(node, now, gpus or {}, host or {}, procs or {}, errors)
        scraped = [t.scraped_at for t in targets if t.scraped_at is not None]
        stale_after = self._stale_after(targets)
        if scraped and now - max(scraped) > stale_after:
            return move(STATE_STALE, "last scrape %.0f s ago" % (now - max(scraped)), frame, now)
        probe_time = (host or {}).get(names.FRAME_TIME)
        if probe_time is not None and now - probe_time > stale_after:
            return move(STATE_STALE, "exporter serves a frame %.0f s old (its probe is not polling)" % (now - probe_time), frame, now)
        if targets and len(failed) == len(targets):
            return move(STATE_DOWN, "; ".join(errors), frame, now)
        return move(STATE_UP, None, frame, now)

    def _frame(
        self,
        node: str,
        now: float,
        gpus: Dict[int, Dict[str, Any]],
        host: Dict[str, Any],
        procs: Dict[Tuple[int, str], Dict[str, Any]],
        errors: List[str],
    ) -> NodeFrame:
        slow_host = self._slow_host.get(node, {})
        samples = []
        for index in sorted(gpus):
            fields = dict(self._slow_gpu.get((node, index), ()))
            fields.update(gpus[index])
            xid = fields.pop("_xid", None)
            xids: Tuple[int, ...] = ()
            if xid:
                if self._last_xid.get((node, index)) != xid:
                    xids = (xid,)
                self._last_xid[(node, index)] = xid
            if fields.get("memory_total") is None and fields.get("memory_used") is not None and fields.get("memory_free") is not None:
                fields["memory_total"] = fields["memory_used"] + fields["memory_free"] + (fields.get("memory_reserved") or 0)
            fields["index"] = index
            fields["xid_events"] = xids
            samples.append(replace_decoded(_GPU_TEMPLATE, fields))
        processes = []
        uuid_of = {s.index: s.uuid for s in samples}
        for (index, pid), row in sorted(procs.items()):
            if not pid.isdigit():
                continue
            memory = row.get(names.METRIC_PROCESS_MEMORY)
            sm = row.get(names.METRIC_PROCESS_SM)
            processes.append(
                ProcessSample(
                    pid=int(pid),
                    name=row.get("name", ""),
                    user=row.get("user"),
                    gpu_index=index,
                    gpu_uuid=uuid_of.get(index),
                    gpu_memory_bytes=None if memory is None else int(memory),
                    gpu_sm_percent=sm,
                )
            )
        frame_time = host.get(names.FRAME_TIME)
        if frame_time is None:
            scraped = [t.scraped_at for _, t in self._node_targets.get(node, ()) if t.scraped_at is not None]
            frame_time = max(scraped) if scraped else now
        seq = host.get(names.FRAME_SEQ)
        probe = host.get(names.PROBE_SECONDS)
        return NodeFrame(
            node=node,
            time=frame_time,
            seq=int(seq) if seq is not None else self._refreshes,
            host=self._host(node, now, host, slow_host),
            gpus=tuple(samples),
            processes=tuple(processes),
            gpu_source="prometheus" if samples else "none",
            gpu_note=None if samples else "no GPU series in Prometheus for this node",
            driver_version=slow_host.get("driver"),
            errors=tuple(errors),
            probe_ms=None if probe is None else round(probe * 1000.0, 2),
        )

    def _host(self, node: str, now: float, fast: Dict[str, Any], slow: Dict[str, Any]) -> Optional[HostSample]:
        if not fast and not slow:
            return None

        def pick(*keys: str) -> Optional[float]:
            for key in keys:
                value = fast.get(key, slow.get(key))
                if value is not None:
                    return value
            return None

        modes = fast.get("_cpu_modes")
        cpu_percent = pick(names.HOST_CPU_PERCENT)
        iowait = pick(names.HOST_IOWAIT)
        cpus = slow.get("_cpus", pick(names.HOST_CPU_COUNT))
        if modes and cpus:
            # Each core spends one second per second in some mode: busy = 1 - idle share.
            cpu_percent = round(min(100.0, max(0.0, 100.0 * (1.0 - modes.get("idle", 0.0) / cpus))), 2)
            iowait = round(min(100.0, max(0.0, 100.0 * modes.get("iowait", 0.0) / cpus)), 2)
        load = tuple(v for v in (pick("node_load1"), pick("node_load5"), pick("node_load15")) if v is not None)
        if not load and names.HOST_LOAD in fast:
            periods = fast[names.HOST_LOAD]
            load = tuple(periods[p] for p in ("1", "5", "15") if p in periods)
        mem_total = pick("node_memory_MemTotal_bytes", names.HOST_MEM_TOTAL)
        mem_available = pick("node_memory_MemAvailable_bytes", names.HOST_MEM_AVAILABLE)
        mem_used = pick(names.HOST_MEM_USED)
        if "node_memory_MemAvailable_bytes" in fast and mem_total is not None and mem_available is not None:
            mem_used = mem_total - mem_available
        swap_total = pick("node_memory_SwapTotal_bytes", names.HOST_SWAP_TOTAL)
        swap_used = pick(names.HOST_SWAP_USED)
        swap_free = pick("node_memory_SwapFree_bytes")
        if swap_free is not None and swap_total is not None:
            swap_used = swap_total - swap_free
        rx = fast.get("_net_rx") or fast.get(names.HOST_NET_RX) or {}
        tx = fast.get("_net_tx") or fast.get(names.HOST_NET_TX) or {}
        net = tuple(
            NetRate(interface=device, rx_bytes_per_s=rx.get(device, 0.0), tx_bytes_per_s=tx.get(device, 0.0))
            for device in sorted(set(rx) | set(tx))
        )
        boot = pick("node_boot_time_seconds")
        uptime = now - boot if boot is not None else pick(names.HOST_UPTIME)
        return HostSample(
            hostname=slow.get("hostname") or node,
            cpu_count=int(cpus) if cpus else 0,
            cpu_percent=cpu_percent,
            load_avg=load,
            iowait_percent=iowait,
            mem_total=_int(mem_total),
            mem_used=_int(mem_used),
            mem_available=_int(mem_available),
            swap_total=_int(swap_total),
            swap_used=_int(swap_used),
            disks=slow.get("disks", ()),
            net=net,
            uptime_s=uptime,
            source="prometheus",
        )

    # --- running -------------------------------------------------------------------------------

    async def poll_once(self, timeout: float) -> List[NodeState]:
        """One refresh within `timeout` seconds (the HTTP timeout is capped to it)."""
        from opsconsole.nodes.local import run_in_daemon_thread

        self.http.timeout = min(self.config.timeout, timeout)
        try:
            return await asyncio.wait_for(run_in_daemon_thread(self.refresh), timeout + 0.2)
        finally:
            self.http.timeout = self.config.timeout

    async def run(self, publish: Publish) -> None:
        """Refresh every interval and publish every node's state; never returns until cancelled.

        A refresh is armed only after the previous one finished, so refreshes never overlap.
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
                states = self._source_failed(PrometheusError("refresh failed: %s: %s" % (type(exc).__name__, exc)),
                                             self.clock(), time.perf_counter(), self.http.requests)
            for state in states:
                publish(state)
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))

    async def close(self) -> None:
        """Stop the query threads (each HTTP request is closed after use). Safe to call twice."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    # --- history ---------------------------------------------------------------------------------

    def history_query(self, node: str, gpu: Optional[int], metric: str) -> Tuple[str, float]:
        """The PromQL for `metric` of `node` (GPU `gpu`, or the node when None) and the factor to our unit.

        `metric` is a GpuSample field, a name opsconsole/history.py uses, or a raw metric name.
        """
        label, value = self._origin.get(node, (self.node_labels[0], node))
        matcher = '%s="%s"' % (label, _escape(value))
        if gpu is not None:
            gpu_matcher = matcher + ',%s="%d"' % (self.gpu_label, gpu)
            if metric in _GPU_HISTORY:
                name, factor = _GPU_HISTORY[metric]
                return "max(%s)" % self._selector('__name__="%s",%s' % (name, gpu_matcher)), factor
            if metric == "memory_percent":
                used = self._selector('__name__="DCGM_FI_DEV_FB_USED",' + gpu_matcher)
                free = self._selector('__name__="DCGM_FI_DEV_FB_FREE",' + gpu_matcher)
                return "100 * max(%s) / (max(%s) + max(%s))" % (used, used, free), 1.0
            for name, attr, kind in names.GPU_METRICS:
                if attr == metric and kind != "bool":
                    return "max(%s)" % self._selector('__name__="%s",%s' % (name, gpu_matcher)), float(kind)  # type: ignore[arg-type]
            return "max(%s)" % self._selector('__name__="%s",%s' % (metric, gpu_matcher)), 1.0
        if metric in ("gpu_utilization", "utilization"):
            return "avg(%s)" % self._selector('__name__="DCGM_FI_DEV_GPU_UTIL",' + matcher), 1.0
        if metric == "power_w":
            return "sum(%s)" % self._selector('__name__="DCGM_FI_DEV_POWER_USAGE",' + matcher), 1.0
        if metric == "gpu_memory_percent":
            used = self._selector('__name__="DCGM_FI_DEV_FB_USED",' + matcher)
            free = self._selector('__name__="DCGM_FI_DEV_FB_FREE",' + matcher)
            return "100 * sum(%s) / (sum(%s) + sum(%s))" % (used, used, free), 1.0
        host_matcher = self._host_matcher(node)
        if metric == "cpu_percent":
            idle = self._selector('__name__="node_cpu_seconds_total",mode="idle",' + host_matcher)
            every = self._selector('__name__="node_cpu_seconds_total",' + host_matcher)
            ours = self._selector('__name__="%s",%s' % (names.HOST_CPU_PERCENT, matcher))
            window = self.config.rate_window
            return "(100 * (1 - sum(rate(%s[%s])) / sum(rate(%s[%s])))) or max(%s)" % (idle, window, every, window, ours), 1.0
        if metric == "memory_percent":
            total = self._selector('__name__="node_memory_MemTotal_bytes",' + host_matcher)
            avail = self._selector('__name__="node_memory_MemAvailable_bytes",' + host_matcher)
            ours_total = self._selector('__name__="%s",%s' % (names.HOST_MEM_TOTAL, matcher))
            ours_avail = self._selector('__name__="%s",%s' % (names.HOST_MEM_AVAILABLE, matcher))
            return (
                "(100 * (1 - max(%s) / max(%s))) or (100 * (1 - max(%s) / max(%s)))" % (avail, total, ours_avail, ours_total),
                1.0,
            )
        return "max(%s)" % self._selector('__name__="%s",%s' % (metric, matcher)), 1.0

    def _host_matcher(self, node: str) -> str:
        # node-exporter series carry only `instance`: match host:port by the node's name.
        if "instance" in self.node_labels:
            return 'instance=~"%s(:[0-9]+)?"' % _escape(re.escape(node))
        label, value = self._origin.get(node, (self.node_labels[0], node))
        return '%s="%s"' % (label, _escape(value))

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


class _FastValues:
    """What one refresh's fast answers said, gathered as they arrive: node -> GPU -> fields, node -> host fields, processes."""

    __slots__ = ("gpus", "hosts", "procs")

    def __init__(self) -> None:
        self.gpus: Dict[str, Dict[int, Dict[str, Any]]] = {}
        self.hosts: Dict[str, Dict[str, Any]] = {}
        self.procs: Dict[str, Dict[Tuple[int, str], Dict[str, Any]]] = {}


_GPU_TEMPLATE = GpuSample(index=0)  # every field at its default; copies are filled without __init__


def _converter(attr: str, kind: object) -> Callable[[float], Any]:
    if kind == "bool":
        return lambda value: value != 0
    factor = float(kind)  # type: ignore[arg-type]
    if attr in names.INTEGER_FIELDS:
        return lambda value: int(round(value * factor))
    if factor == 1.0:
        return lambda value: value
    return lambda value: value * factor


# metric name -> (GpuSample field, value converter), for the per-series hot loop.
_CONVERTERS: Dict[str, Tuple[str, Callable[[float], Any]]] = {
    metric: (attr, _converter(attr, kind)) for metric, attr, kind in names.GPU_METRICS
}
_REASONS: Dict[int, Tuple[str, ...]] = {}  # clock event mask -> decoded names
_GPU_INDEXES: Dict[str, int] = {}  # "3" -> 3, shared: GPU labels repeat on every series


def _split(items: Sequence[str], parts: int) -> List[Tuple[str, ...]]:
    """`items` in `parts` interleaved groups (the heavy GPU names first in the list spread out)."""
    groups = [tuple(items[i::parts]) for i in range(parts)]
    return [group for group in groups if group]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _int(value: Optional[float]) -> Optional[int]:
    return None if value is None or math.isnan(value) else int(value)


def _disk(mount: str, values: Dict[str, float]) -> Optional[DiskUsage]:
    size = values.get("node_filesystem_size_bytes")
    if size is not None:
        free_root = values.get("node_filesystem_free_bytes", 0.0)
        avail = values.get("node_filesystem_avail_bytes", free_root)
        return DiskUsage(path=mount, total=int(size), used=int(size - free_root), free=int(avail))
    size = values.get(names.HOST_FS_SIZE)
    if size is None:
        return None
    return DiskUsage(
        path=mount,
        total=int(size),
        used=int(values.get(names.HOST_FS_USED, 0.0)),
        free=int(values.get(names.HOST_FS_FREE, 0.0)),
    )


__all__ = ["PrometheusSource", "SourceStatus", "strip_port", "FAST_GPU_METRICS", "SLOW_GPU_METRICS"]
