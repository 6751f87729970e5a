"""Decoding the Prometheus source's answers: series into per-node GPU, MIG, host and process fields,
and those fields into NodeFrames.

Everything here is keyed by *raw name* (the node label a series carried, see node_identity.py);
the source joins raw names into nodes before building frames. The per-series loop of the fast
answers is the source's hot path at 1,024 nodes (~100k series a refresh): plain dict work,
one conversion per metric looked up once. No I/O here.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from opsconsole.model import (
    DiskUsage,
    GpuSample,
    HostSample,
    MigDevice,
    NetRate,
    NodeFrame,
    ProcessSample,
    replace_decoded,
)
from opsconsole.probe.nvml_decode import decode_clock_event_reasons
from opsconsole.sources import metric_names as names
from opsconsole.sources.prometheus_http import Series

NodeOf = Callable[[Dict[str, str]], Optional[str]]
GpuFields = Dict[int, Dict[str, Any]]  # GPU index -> GpuSample fields (and "_xid")
MigFields = Dict[Tuple[int, int], Dict[str, Any]]  # (GPU index, GPU_I_ID) -> MigDevice fields
ProcFields = Dict[Tuple[int, str], Dict[str, Any]]  # (GPU index, pid label) -> process fields


class FastValues:
    """What one refresh's fast answers said, gathered as they arrive, by raw name."""

    __slots__ = ("gpus", "hosts", "procs", "migs")

    def __init__(self) -> None:
        self.gpus: Dict[str, GpuFields] = {}
        self.hosts: Dict[str, Dict[str, Any]] = {}
        self.procs: Dict[str, ProcFields] = {}
        self.migs: Dict[str, MigFields] = {}


class SlowValues:
    """What the slow tier said, kept between refreshes (each refresh reads one slow query), by raw name."""

    def __init__(self) -> None:
        self.gpus: Dict[Tuple[str, int], Dict[str, Any]] = {}
        self.migs: Dict[Tuple[str, int, int], Dict[str, Any]] = {}
        self.hosts: Dict[str, Dict[str, Any]] = {}


_GPU_TEMPLATE = GpuSample(index=0)  # every field at its default; copies are filled without __init__
_MIG_TEMPLATE = MigDevice(gpu_instance_id=0)


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
_INDEXES: Dict[str, int] = {}  # "3" -> 3, shared: GPU labels repeat on every series


def _index(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    index = _INDEXES.get(text)
    if index is None and text.isdigit() and len(text) <= 6:
        index = _INDEXES.setdefault(text, int(text))
    return index


def _number(value: float, attr: str) -> Any:
    if attr in names.INTEGER_FIELDS:
        return int(round(value))
    return value


def take_fast(rows: List[Series], values: FastValues, node_of: NodeOf, gpu_label: str) -> None:
    """The series of one fast answer into `values`: fields per node and GPU (or MIG instance), host fields, processes."""
    gpu_values, host_values, procs, migs = values.gpus, values.hosts, values.procs, values.migs
    convert = _CONVERTERS
    mig_fields = names.MIG_INSTANCE_FIELDS
    for labels, value in rows:
        node = node_of(labels)
        if node is None:
            continue
        metric = labels["__name__"]
        gpu = labels.get(gpu_label)
        index = _index(gpu) if gpu is not None else None
        if index is not None:
            instance = labels.get(names.LABEL_GPU_I_ID)
            converter = convert.get(metric)
            if instance:  # a MIG instance's series: its memory is its own, the rest is its GPU's
                gi = _index(instance)
                if gi is not None and (
                    metric == names.METRIC_GR_ENGINE_ACTIVE or (converter is not None and converter[0] in mig_fields)
                ):
                    fields = migs.setdefault(node, {}).setdefault((index, gi), {})
                    fields["profile"] = labels.get(names.LABEL_GPU_I_PROFILE) or None
                    if metric == names.METRIC_GR_ENGINE_ACTIVE:
                        fields["utilization_gpu"] = round(min(1.0, max(0.0, value)) * 100.0, 1)
                    else:
                        fields[converter[0]] = converter[1](value)  # type: ignore[index]
                    continue
            if converter is not None:  # the common case: a plain GpuSample field
                nodes_gpus = gpu_values.get(node)
                if nodes_gpus is None:
                    nodes_gpus = gpu_values[node] = {}
                gpu_fields = nodes_gpus.get(index)
                if gpu_fields is None:
                    gpu_fields = nodes_gpus[index] = {}
                gpu_fields[converter[0]] = converter[1](value)
                continue
            if metric in (names.METRIC_PROCESS_MEMORY, names.METRIC_PROCESS_SM):
                row = procs.setdefault(node, {}).setdefault((index, labels.get("pid", "")), {})
                row["name"] = labels.get("process_name", "")
                row["user"] = labels.get("user") or None
                for label, attr in names.PROCESS_JOB_LABELS:
                    row[attr] = _text(labels, label)
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
            elif metric == names.METRIC_GR_ENGINE_ACTIVE:
                fields["_engine_active"] = value
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


def take_rates(rows: List[Series], values: FastValues, node_of: NodeOf) -> None:
    """The rate() answer (CPU modes, network rx/tx per device) into the host fields."""
    host_values = values.hosts
    for labels, value in rows:
        node = node_of(labels)
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


def _text(labels: Dict[str, str], name: str) -> Optional[str]:
    value = labels.get(name)
    return value[:256] if value else None


def take_slow(
    rows: List[Series],
    slow: SlowValues,
    node_of: NodeOf,
    gpu_label: str,
    saw_target: Callable[[str, Dict[str, str]], None],
) -> None:
    """The slow answers into `slow` (merged into what earlier refreshes said); `saw_target(raw, labels)`
    is called for each series that names its scrape target (job and instance)."""
    fs_rows = []
    gpus: Dict[Tuple[str, int], Dict[str, Any]] = {}
    migs: Dict[Tuple[str, int, int], Dict[str, Any]] = {}
    hosts: Dict[str, Dict[str, Any]] = {}
    gpu_jobs: Dict[Tuple[str, int, int], Dict[str, set]] = {}  # hpc_job repeats a series per job
    for labels, value in rows:
        node = node_of(labels)
        if node is None:
            continue
        if labels.get("oc_kind") == "cpus":
            hosts.setdefault(node, {})["_cpus"] = value
            continue
        if "mountpoint" in labels:
            fs_rows.append((labels, value))
            continue
        if "job" in labels:
            saw_target(node, labels)
        metric = labels.get("__name__", "")
        index = _index(labels.get(gpu_label))
        if index is not None:
            fields = gpus.setdefault((node, index), {})
            if names.LABEL_UUID in labels:
                fields["uuid"] = labels[names.LABEL_UUID] or None
                fields["name"] = labels.get(names.LABEL_MODEL) or None
                fields["pci_bus_id"] = labels.get(names.LABEL_PCI_BUS_ID) or None
                driver = labels.get(names.LABEL_DRIVER)
                if driver:
                    hosts.setdefault(node, {})["driver"] = driver
                gi = _index(labels.get(names.LABEL_GPU_I_ID) or None)
                job_key = (node, index, -1 if gi is None else gi)
                if gi is not None:
                    migs.setdefault(job_key, {})["profile"] = _text(labels, names.LABEL_GPU_I_PROFILE)
                seen = gpu_jobs.setdefault(job_key, {})
                for label in names.JOB_LABELS:
                    text = _text(labels, label)
                    if text:
                        seen.setdefault(label, set()).add(text)
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
    for (node, index, gi), seen in gpu_jobs.items():
        fields = gpus.setdefault((node, index), {}) if gi < 0 else migs.setdefault((node, index, gi), {})
        fields["job_id"] = ",".join(sorted(seen[names.LABEL_HPC_JOB])) if names.LABEL_HPC_JOB in seen else None
        for label, attr in (
            (names.LABEL_POD, "pod"),
            (names.LABEL_NAMESPACE, "namespace"),
            (names.LABEL_CONTAINER, "container"),
        ):
            fields[attr] = ",".join(sorted(seen[label])) if label in seen else None
    disks: Dict[str, Dict[str, Dict[str, float]]] = {}
    for labels, value in fs_rows:
        node = node_of(labels)
        mount = labels.get("mountpoint")
        if node is None or not mount:
            continue
        disks.setdefault(node, {}).setdefault(mount, {})[labels.get("__name__", "")] = value
    for node, mounts in disks.items():
        hosts.setdefault(node, {})["disks"] = tuple(
            disk for disk in (_disk(mount, values) for mount, values in sorted(mounts.items())) if disk is not None
        )
    # Merged into what we knew: each refresh reads one part, and a node whose target is down is absent.
    for key, gpu_fields in gpus.items():
        slow.gpus.setdefault(key, {}).update(gpu_fields)
    for mig_key, mig_fields in migs.items():
        slow.migs.setdefault(mig_key, {}).update(mig_fields)
    for node, host in hosts.items():
        slow.hosts.setdefault(node, {}).update(host)


def mig_devices(instances: MigFields, slow: SlowValues, raws: Iterable[str], index: int) -> Tuple[MigDevice, ...]:
    """The MIG instances of GPU `index` (fast fields over the slow ones: profile, whose job), by GPU_I_ID."""
    out = []
    for (gpu, gi), fields in sorted(instances.items()):
        if gpu != index:
            continue
        values: Dict[str, Any] = {}
        for raw in raws:
            values.update(slow.migs.get((raw, gpu, gi), ()))
        values.update(fields)
        values.pop("memory_reserved", None)
        used, free = values.get("memory_used"), values.get("memory_free")
        if used is not None and free is not None:
            values["memory_total"] = used + free + (fields.get("memory_reserved") or 0)
        values["gpu_instance_id"] = gi
        out.append(replace_decoded(_MIG_TEMPLATE, values))
    return tuple(out)


def gpu_samples(
    gpus: GpuFields, migs: MigFields, slow: SlowValues, raws: List[str], last_xid: Dict[Tuple[str, int], int], node: str
) -> List[GpuSample]:
    """GpuSamples of one node from its fast fields (`gpus`, `migs`) and the slow ones of its raw names."""
    samples = []
    for index in sorted(gpus):
        fields: Dict[str, Any] = {}
        for raw in raws:
            fields.update(slow.gpus.get((raw, index), ()))
        fields.update(gpus[index])
        xid = fields.pop("_xid", None)
        engine = fields.pop("_engine_active", None)
        xids: Tuple[int, ...] = ()
        if xid:
            if last_xid.get((node, index)) != xid:
                xids = (xid,)
            last_xid[(node, index)] = xid
        instances = mig_devices(migs, slow, raws, index) if migs else ()
        if instances:
            # dcgm-exporter repeats the GPU's own fields on every instance: memory is the instances' sum.
            fields["mig_mode"] = True
            fields["mig_devices"] = instances
            for attr in ("memory_used", "memory_free", "memory_total"):
                parts = [getattr(m, attr) for m in instances]
                fields[attr] = sum(parts) if all(p is not None for p in parts) else None
            if fields.get("utilization_gpu") is None:
                utils = [m.utilization_gpu for m in instances if m.utilization_gpu is not None]
                fields["utilization_gpu"] = round(sum(utils) / len(utils), 1) if utils else None
        elif fields.get("utilization_gpu") is None and engine is not None:
            fields["utilization_gpu"] = round(min(1.0, max(0.0, engine)) * 100.0, 1)
        if (
            fields.get("memory_total") is None
            and fields.get("memory_used") is not None
            and fields.get("memory_free") is not None
        ):
            fields["memory_total"] = (
                fields["memory_used"] + fields["memory_free"] + (fields.get("memory_reserved") or 0)
            )
        fields["index"] = index
        fields["xid_events"] = xids
        samples.append(replace_decoded(_GPU_TEMPLATE, fields))
    return samples


def process_samples(procs: ProcFields, samples: List[GpuSample]) -> List[ProcessSample]:
    """The GPU processes our exporter reports (pid, name, user, memory, SM %)."""
    processes = []
    uuid_of = {s.index: s.uuid for s in samples}
    for (index, pid), row in sorted(procs.items()):
        if not pid.isdigit() or len(pid) > 10:
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
                job_id=row.get("job_id"),
                job_step=row.get("job_step"),
                job_user=row.get("job_user"),
                container=row.get("container"),
            )
        )
    return processes


def build_frame(
    node: str,
    now: float,
    frame_time: float,
    seq: int,
    samples: List[GpuSample],
    processes: List[ProcessSample],
    host: Dict[str, Any],
    slow_host: Dict[str, Any],
    errors: List[str],
) -> NodeFrame:
    """One node's NodeFrame from its decoded parts."""
    probe = host.get(names.PROBE_SECONDS)
    return NodeFrame(
        node=node,
        time=frame_time,
        seq=seq,
        host=build_host(node, now, host, slow_host),
        gpus=tuple(samples),
        processes=tuple(processes),
        gpu_source="prometheus" if samples else "none",
        gpu_note=None if samples else "no GPU series in Prometheus for this node",
        driver_version=slow_host.get("driver"),
        errors=tuple(errors),
        probe_ms=None if probe is None else round(probe * 1000.0, 2),
    )


def build_host(node: str, now: float, fast: Dict[str, Any], slow: Dict[str, Any]) -> Optional[HostSample]:
    """The HostSample of node-exporter's (or our exporter's) host fields; None when there are none."""
    if not fast and not {k: v for k, v in slow.items() if k not in ("driver", "gpu_source")}:
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
