"""A prometheus_client Collector over the probe's latest NodeFrame.

Each scrape renders the newest frame; nothing is polled on a scrape, so a slow GPU read
never slows Prometheus down and many scrapers cost one poll per interval. Names and labels
are dcgm-exporter's where it has them (see opsconsole/sources/metric_names.py).
"""

from __future__ import annotations

import threading
from typing import Dict, Iterator, List, Optional, Tuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from opsconsole.model import GpuSample, NodeFrame
from opsconsole.probe.nvml_decode import CLOCK_EVENT_REASONS
from opsconsole.sources import metric_names as names

GPU_LABELS = [
    names.LABEL_GPU,
    names.LABEL_UUID,
    names.LABEL_DEVICE,
    names.LABEL_MODEL,
    names.LABEL_HOSTNAME,
    names.LABEL_PCI_BUS_ID,
    names.LABEL_DRIVER,
]
_REASON_BITS = {name: bit for bit, name in CLOCK_EVENT_REASONS}

# One help line per dcgm-exporter metric, worded as dcgm-exporter words them.
_HELP = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_RESERVED": "Framebuffer memory reserved (in MiB).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "Total energy consumption since boot (in mJ).",
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "Total number of PCIe retries.",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
}


def _label_text(value: object) -> str:
    return "" if value is None else str(value)


def _metric_value(value: object, kind: object) -> Optional[float]:
    if value is None:
        return None
    if kind == "bool":
        return 1.0 if value else 0.0
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    return float(value) / float(kind)  # type: ignore[arg-type]


def clock_reason_mask(reasons: Tuple[str, ...]) -> int:
    """NVML's clock event bitmask of decoded reason names (unknown bits kept from "0x.." entries)."""
    mask = 0
    for reason in reasons:
        bit = _REASON_BITS.get(reason)
        if bit is not None:
            mask |= bit
        elif reason.startswith("0x"):
            try:
                mask |= int(reason, 16)
            except ValueError:
                pass
    return mask


class FrameCollector(Collector):
    """Renders the latest frame set with `update(frame)`; thread-safe (the HTTP server is a thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._frame: Optional[NodeFrame] = None
        self._last_xid: Dict[str, int] = {}  # GPU key -> last XID code seen
        self._xid_counts: Dict[str, int] = {}  # GPU key -> XID events seen since the exporter started
        self.polls = 0

    def update(self, frame: NodeFrame) -> None:
        """Make `frame` the one every following scrape renders; XIDs are remembered across frames."""
        with self._lock:
            for gpu in frame.gpus:
                if gpu.xid_events:
                    key = self._gpu_key(gpu)
                    self._last_xid[key] = int(gpu.xid_events[-1])
                    self._xid_counts[key] = self._xid_counts.get(key, 0) + len(gpu.xid_events)
            self._frame = frame
            self.polls += 1

    @staticmethod
    def _gpu_key(gpu: GpuSample) -> str:
        return gpu.uuid or "index:%d" % gpu.index

    def describe(self) -> List[Metric]:
        return []  # the set of families depends on the frame: registered unchecked

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            frame = self._frame
            last_xid = dict(self._last_xid)
            xid_counts = dict(self._xid_counts)
        if frame is None:
            return
        yield from self._gpu_families(frame, last_xid, xid_counts)
        yield from self._host_families(frame)

    # --- GPUs ----------------------------------------------------------------

    def _gpu_families(self, frame: NodeFrame, last_xid: Dict[str, int], xid_counts: Dict[str, int]) -> Iterator[Metric]:
        labels_of = {gpu.index: self._gpu_labels(frame, gpu) for gpu in frame.gpus}
        for metric, attr, kind in names.GPU_METRICS:
            family = GaugeMetricFamily(metric, _HELP.get(metric, attr.replace("_", " ") + "."), labels=GPU_LABELS)
            for gpu in frame.gpus:
                value = _metric_value(getattr(gpu, attr), kind)
                if value is not None:
                    family.add_metric(labels_of[gpu.index], value)
            if family.samples:
                yield family
        masks = GaugeMetricFamily(
            names.METRIC_CLOCK_REASONS, "Current clock throttle reasons (NVML bitmask).", labels=GPU_LABELS
        )
        events = GaugeMetricFamily(
            names.METRIC_CLOCK_EVENTS, "Current clock event reasons (NVML bitmask).", labels=GPU_LABELS
        )
        active = GaugeMetricFamily(
            names.METRIC_CLOCK_REASON_ACTIVE,
            "1 for each clock event (throttle) reason active now.",
            labels=GPU_LABELS + ["reason"],
        )
        xid = GaugeMetricFamily(names.METRIC_XID, _HELP[names.METRIC_XID], labels=GPU_LABELS)
        xid_total = CounterMetricFamily(
            names.METRIC_XID_EVENTS, "XID errors the probe saw since the exporter started.", labels=GPU_LABELS
        )
        procs = GaugeMetricFamily(names.METRIC_GPU_PROCESSES, "Compute processes on the GPU.", labels=GPU_LABELS)
        errors = GaugeMetricFamily(
            names.METRIC_GPU_ERRORS, "NVML read errors in the last poll (other than NotSupported).", labels=GPU_LABELS
        )
        mode = GaugeMetricFamily(
            names.METRIC_COMPUTE_MODE, "The GPU's compute mode (value 1).", labels=GPU_LABELS + ["mode"]
        )
        per_gpu = {}  # index -> process count
        for proc in frame.processes:
            if proc.gpu_index is not None:
                per_gpu[proc.gpu_index] = per_gpu.get(proc.gpu_index, 0) + 1
        for gpu in frame.gpus:
            labels = labels_of[gpu.index]
            if gpu.clock_event_reasons is not None:
                mask = float(clock_reason_mask(gpu.clock_event_reasons))
                masks.add_metric(labels, mask)
                events.add_metric(labels, mask)
                for reason in gpu.clock_event_reasons:
                    active.add_metric(labels + [reason], 1.0)
            key = self._gpu_key(gpu)
            xid.add_metric(labels, float(last_xid.get(key, 0)))
            xid_total.add_metric(labels, float(xid_counts.get(key, 0)))
            procs.add_metric(labels, float(per_gpu.get(gpu.index, 0)))
            errors.add_metric(labels, float(len(gpu.errors)))
            if gpu.compute_mode is not None:
                mode.add_metric(labels + [gpu.compute_mode], 1.0)
        for family in (masks, events, active, xid, xid_total, procs, errors, mode):
            if family.samples:
                yield family
        yield from self._process_families(frame, labels_of)

    def _gpu_labels(self, frame: NodeFrame, gpu: GpuSample) -> List[str]:
        return [
            str(gpu.index),
            _label_text(gpu.uuid),
            "nvidia%d" % gpu.index,
            _label_text(gpu.name),
            frame.node,
            _label_text(gpu.pci_bus_id),
            _label_text(frame.driver_version),
        ]

    def _process_families(self, frame: NodeFrame, labels_of: Dict[int, List[str]]) -> Iterator[Metric]:
        extra = ["pid", "process_name", "user"] + [label for label, _ in names.PROCESS_JOB_LABELS]
        memory = GaugeMetricFamily(
            names.METRIC_PROCESS_MEMORY, "GPU memory of a compute process (bytes).", labels=GPU_LABELS + extra
        )
        sm = GaugeMetricFamily(
            names.METRIC_PROCESS_SM, "SM utilisation of a compute process (in %).", labels=GPU_LABELS + extra
        )
        for proc in frame.processes:
            labels = labels_of.get(proc.gpu_index) if proc.gpu_index is not None else None
            if labels is None:
                continue
            row = (
                labels
                + [str(proc.pid), proc.name, _label_text(proc.user)]
                + [_label_text(getattr(proc, attr)) for _, attr in names.PROCESS_JOB_LABELS]
            )
            if proc.gpu_memory_bytes is not None:
                memory.add_metric(row, float(proc.gpu_memory_bytes))
            if proc.gpu_sm_percent is not None:
                sm.add_metric(row, float(proc.gpu_sm_percent))
        for family in (memory, sm):
            if family.samples:
                yield family

    # --- host ------------------------------------------------------------------

    def _host_families(self, frame: NodeFrame) -> Iterator[Metric]:
        node = [names.LABEL_HOSTNAME]
        host_name = [frame.node]

        families: List[Metric] = []

        def single(name: str, doc: str, value: object) -> None:
            if value is not None:
                family = GaugeMetricFamily(name, doc, labels=node)
                family.add_metric(host_name, float(value))  # type: ignore[arg-type]
                families.append(family)

        single(names.FRAME_SEQ, "Sequence number of the frame being served.", frame.seq)
        single(names.FRAME_TIME, "When the probe took the frame being served (epoch seconds).", frame.time)
        single(names.FRAME_ERRORS, "Errors the probe reported in the frame being served.", len(frame.errors))
        if frame.probe_ms is not None:
            single(names.PROBE_SECONDS, "What the probe's last poll cost (seconds).", frame.probe_ms / 1000.0)
        info = GaugeMetricFamily(
            names.NODE_INFO,
            "The probe's GPU source and driver (value 1).",
            labels=node + ["gpu_source", "driver_version", "hostname"],
        )
        host = frame.host
        info.add_metric(
            host_name
            + [frame.gpu_source, _label_text(frame.driver_version), _label_text(host.hostname if host else None)],
            1.0,
        )
        families.append(info)
        if host is not None:
            single(names.HOST_CPU_PERCENT, "Host CPU busy (in %).", host.cpu_percent)
            single(names.HOST_CPU_COUNT, "Logical CPUs.", host.cpu_count or None)
            single(names.HOST_IOWAIT, "CPU time waiting for I/O (in %).", host.iowait_percent)
            single(names.HOST_MEM_TOTAL, "Host memory (bytes).", host.mem_total)
            single(names.HOST_MEM_USED, "Host memory used (bytes).", host.mem_used)
            single(names.HOST_MEM_AVAILABLE, "Host memory available (bytes).", host.mem_available)
            single(names.HOST_SWAP_TOTAL, "Swap (bytes).", host.swap_total)
            single(names.HOST_SWAP_USED, "Swap used (bytes).", host.swap_used)
            single(names.HOST_UPTIME, "Seconds since boot.", host.uptime_s)
            if host.load_avg:
                load = GaugeMetricFamily(names.HOST_LOAD, "Load average.", labels=node + ["period"])
                for period, value in zip(("1", "5", "15"), host.load_avg):
                    load.add_metric(host_name + [period], float(value))
                families.append(load)
            if host.disks:
                fs = [
                    GaugeMetricFamily(name, doc, labels=node + ["mountpoint"])
                    for name, doc in (
                        (names.HOST_FS_SIZE, "File system size (bytes)."),
                        (names.HOST_FS_USED, "File system used (bytes)."),
                        (names.HOST_FS_FREE, "File system free for unprivileged users (bytes)."),
                    )
                ]
                for disk in host.disks:
                    for family, value in zip(fs, (disk.total, disk.used, disk.free)):
                        family.add_metric(host_name + [disk.path], float(value))
                families.extend(fs)
            if host.net:
                rx = GaugeMetricFamily(names.HOST_NET_RX, "Bytes received per second.", labels=node + ["device"])
                tx = GaugeMetricFamily(names.HOST_NET_TX, "Bytes sent per second.", labels=node + ["device"])
                for rate in host.net:
                    rx.add_metric(host_name + [rate.interface], float(rate.rx_bytes_per_s))
                    tx.add_metric(host_name + [rate.interface], float(rate.tx_bytes_per_s))
                families.extend((rx, tx))
        yield from families


__all__ = ["FrameCollector", "clock_reason_mask", "GPU_LABELS"]
