"""PromQL of the Prometheus source: which series each refresh asks for, and history queries.

A handful of queries per refresh, each covering every node at once (`{__name__=~"A|B|..."}`
aggregated to the labels we need), so the number of requests does not grow with the fleet.
Answers keep the raw node labels: the source names and joins nodes itself (node_identity.py),
which costs less than label_replace in PromQL. Slowly changing fields (names, UUIDs, limits,
ECC and remapped-row counters, file systems, core counts, the labels that tie a host's
exporters together and say whose job a GPU runs) are the slow tier, spread one query per
refresh. No I/O here.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from opsconsole.sources import metric_names as names

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
    names.METRIC_GR_ENGINE_ACTIVE,
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
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)
SLOW_GPU_METRICS = (
    _DCGM_DEFAULT_SLOW
    + tuple(m for m, _, _ in names.GPU_METRICS if m not in FAST_GPU_METRICS and m not in _DCGM_DEFAULT_SLOW)
    + (names.METRIC_COMPUTE_MODE,)
)
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
GPU_INFO_LABELS = (
    names.LABEL_UUID,
    names.LABEL_MODEL,
    names.LABEL_PCI_BUS_ID,
    names.LABEL_DRIVER,
    names.LABEL_HOSTNAME,
    names.LABEL_HOSTNAME_NEW,
    names.LABEL_GPU_I_ID,
    names.LABEL_GPU_I_PROFILE,
) + names.JOB_LABELS
# What tells a GPU's series apart in the fast answers: the process labels, and its MIG instance.
FAST_GPU_LABELS = "pid, process_name, user, %s, %s, %s" % (
    names.LABEL_GPU_I_ID,
    names.LABEL_GPU_I_PROFILE,
    ", ".join(label for label, _ in names.PROCESS_JOB_LABELS),
)

FAST_QUERIES = 8  # the per-refresh GPU names, split over this many queries
SLOW_GPU_QUERIES = 2

# History metric names (opsconsole/history.py's and GpuSample's) -> what to ask Prometheus.
_GPU_HISTORY = {
    "utilization": ("DCGM_FI_DEV_GPU_UTIL", 1.0),
    "temperature": ("DCGM_FI_DEV_GPU_TEMP", 1.0),
    "power_w": ("DCGM_FI_DEV_POWER_USAGE", 1.0),
}


def _regex_alternatives(metric_names: Iterable[str]) -> str:
    return "|".join(re.escape(name) for name in metric_names)


def _split(items: Sequence[str], parts: int) -> List[Tuple[str, ...]]:
    """`items` in `parts` interleaved groups (the heavy GPU names first in the list spread out)."""
    groups = [tuple(items[i::parts]) for i in range(parts)]
    return [group for group in groups if group]


def escape(value: str) -> str:
    """A label value inside a PromQL double-quoted string."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


class Queries:
    """Every query of a source's refresh, built once from its SourceConfig (`config`)."""

    def __init__(self, config: Any, disk_paths: Sequence[str]) -> None:
        self.config = config
        self.node_labels: Tuple[str, ...] = tuple(config.node_labels)
        self.gpu_label: str = config.gpu_label
        self.disk_paths = tuple(disk_paths)
        self._build_queries()

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
        # Several queries over disjoint name sets, run at once: Prometheus evaluates them in parallel.
        self.queries_fast = [
            self._by_node(
                "max", "__name__, %s, %s" % (gpu, FAST_GPU_LABELS), '__name__=~"%s"' % _regex_alternatives(part)
            )
            for part in _split(FAST_GPU_METRICS + FAST_GPU_EXTRA, FAST_QUERIES)
        ] + [
            self._by_node("max", "__name__, period, device", '__name__=~"%s"' % _regex_alternatives(FAST_HOST_METRICS))
        ]
        # The slow tier: GPU names and targets from one series per GPU (any of the names every
        # GPU exporter has), the slow GPU values without those long labels (they made the old
        # all-in-one slow answer 12 MB at 1,024 nodes), host values with their targets.
        info_labels = ["job", "instance"] + list(self.node_labels) + [gpu] + list(GPU_INFO_LABELS)
        self.query_gpu_info = "group by (%s) (%s)" % (
            ", ".join(sorted(set(info_labels), key=info_labels.index)),
            self._selector('__name__=~"%s"' % _regex_alternatives(GPU_INFO_METRICS)),
        )
        self.queries_slow_gpu = [
            self._by_node("max", "__name__, %s, mode" % gpu, '__name__=~"%s"' % _regex_alternatives(part))
            for part in _split(SLOW_GPU_METRICS, SLOW_GPU_QUERIES)
        ]
        host_labels = (
            ["__name__", "job", "instance"]
            + list(self.node_labels)
            + ["gpu_source", "driver_version", "hostname", "nodename"]
        )
        self.query_slow_host = "max by (%s) (%s)" % (
            ", ".join(sorted(set(host_labels), key=host_labels.index)),
            self._selector('__name__=~"%s"' % _regex_alternatives(SLOW_HOST_METRICS)),
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
            'label_replace(%s, "oc_kind", "%s", "", "")'
            % (self._by_node("sum", split, inner, "rate(%%s[%s])" % window), kind)
            for kind, split, inner in (("cpu", "mode", cpu), ("rx", "device", rx), ("tx", "device", tx))
        )
        # How many cores: changes only with the hardware, so read with the slow tier.
        cpu_idle = '__name__="node_cpu_seconds_total",mode="idle"'
        self.query_cpus = 'label_replace(%s, "oc_kind", "cpus", "", "")' % self._by_node("count", "", cpu_idle)
        self.slow_parts = (
            [self.query_gpu_info] + self.queries_slow_gpu + [self.query_slow_host, self.query_fs, self.query_cpus]
        )
        up = self._selector('__name__="up"')
        self.query_up = 'label_replace(timestamp(%s), "oc_kind", "ts", "", "") or %s' % (up, up)

    # --- history -------------------------------------------------------------------------------

    def history_query(
        self, node: str, origins: Sequence[Tuple[str, str]], hosts: Sequence[str], gpu: Optional[int], metric: str
    ) -> Tuple[str, float]:
        """The PromQL for `metric` of `node` (GPU `gpu`, or the node when None) and the factor to our unit.

        `metric` is a GpuSample field, a name opsconsole/history.py uses, or a raw metric name.
        `origins` are the (label, raw value) pairs the node's series were named by, the one with
        GPUs first; `hosts` the host parts of its targets' instances (node-exporter's series).
        """
        label, value = origins[0] if origins else (self.node_labels[0], node)
        matcher = '%s="%s"' % (label, escape(value))
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
        host_matcher = self._host_matcher(node, origins, hosts)
        if metric == "cpu_percent":
            idle = self._selector('__name__="node_cpu_seconds_total",mode="idle",' + host_matcher)
            every = self._selector('__name__="node_cpu_seconds_total",' + host_matcher)
            ours = self._selector('__name__="%s",%s' % (names.HOST_CPU_PERCENT, matcher))
            window = self.config.rate_window
            return "(100 * (1 - sum(rate(%s[%s])) / sum(rate(%s[%s])))) or max(%s)" % (
                idle,
                window,
                every,
                window,
                ours,
            ), 1.0
        if metric == "memory_percent":
            total = self._selector('__name__="node_memory_MemTotal_bytes",' + host_matcher)
            avail = self._selector('__name__="node_memory_MemAvailable_bytes",' + host_matcher)
            ours_total = self._selector('__name__="%s",%s' % (names.HOST_MEM_TOTAL, matcher))
            ours_avail = self._selector('__name__="%s",%s' % (names.HOST_MEM_AVAILABLE, matcher))
            return (
                "(100 * (1 - max(%s) / max(%s))) or (100 * (1 - max(%s) / max(%s)))"
                % (avail, total, ours_avail, ours_total),
                1.0,
            )
        return "max(%s)" % self._selector('__name__="%s",%s' % (metric, matcher)), 1.0

    def _host_matcher(self, node: str, origins: Sequence[Tuple[str, str]], hosts: Sequence[str]) -> str:
        # node-exporter series carry only `instance`: match host:port by the host parts of the node's targets.
        if "instance" in self.node_labels:
            alternatives = "|".join(re.escape(host) for host in (sorted(hosts) or [node]))
            return 'instance=~"(%s)(:[0-9]+)?"' % escape(alternatives)
        label, value = origins[0] if origins else (self.node_labels[0], node)
        return '%s="%s"' % (label, escape(value))
