"""Findings from telemetry, after the seed's "GPU utilisation low" table (pure functions over a frame).

A training process is a GPU compute process of the frame; its data-loader workers are the
host processes whose parent it is (ProcessSample.ppid, from the probe). The probe reads the
variables of procs.WATCHED_ENV from /proc/PID/environ of GPU processes where it may
(ProcessSample.watched_env; None when it could not).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from opsconsole.config import HealthConfig
from opsconsole.health.result import STATUS_PASS, STATUS_WARN, HealthResult, make_result
from opsconsole.model import GpuSample, NodeFrame, ProcessSample
from opsconsole.units import format_percent

# Host CPU below this (percent of all cores) counts as idle for the storage finding.
CPU_IDLE_PERCENT = 25.0
# A training process's own CPU at or above this (percent of one core) with GPUs idle: preprocessing.
MAIN_BUSY_PERCENT = 90.0

REMEDY_DATA_LOADER = (
    "data-loading bottleneck (GPUs wait for data): raise DataLoader num_workers, set pin_memory=True, "
    "raise prefetch_factor, persistent_workers=True, use faster storage"
)
REMEDY_PREPROCESS = (
    "CPU preprocessing bottleneck: optimise the preprocessing, move it to the GPU, or spread it over "
    "DataLoader workers (num_workers)"
)
REMEDY_STORAGE = (
    "storage bottleneck (GPUs and CPUs wait on I/O): check the storage (iostat -x 1, nfsstat -c, fio), "
    "stage the data on local NVMe, raise prefetch_factor"
)
REMEDY_P2P = (
    "NCCL_P2P_DISABLE=1 sends GPU-to-GPU traffic through host memory (slow all-reduce); it is meant "
    "for troubleshooting only: unset it unless P2P is known broken (check the topology: nvidia-smi topo -m)"
)
REMEDY_IB = (
    "NCCL_IB_DISABLE=1 sends inter-node traffic over TCP sockets instead of InfiniBand: unset it, "
    "check the HCAs with ibstat and NCCL_IB_HCA"
)
REMEDY_CVD = (
    "CUDA_VISIBLE_DEVICES disagrees with the GPUs the process uses (wrong rank-to-GPU mapping or "
    "CUDA_DEVICE_ORDER): check the launcher's device assignment (seed: invalid device ordinal)"
)


def _env(proc: ProcessSample) -> Dict[str, str]:
    out = {}
    for entry in proc.watched_env or ():
        name, _, value = entry.partition("=")
        out[name] = value
    return out


def training_processes(frame: NodeFrame) -> List[Tuple[ProcessSample, Tuple[GpuSample, ...]]]:
    """Each GPU compute process once, with the GPUs it uses (a process may hold several)."""
    by_index = {gpu.index: gpu for gpu in frame.gpus}
    seen: Dict[int, Tuple[ProcessSample, List[GpuSample]]] = {}
    for proc in frame.processes:
        gpu = by_index.get(proc.gpu_index) if proc.gpu_index is not None else None
        entry = seen.get(proc.pid)
        if entry is None:
            entry = seen[proc.pid] = (proc, [])
        if gpu is not None and gpu not in entry[1]:
            entry[1].append(gpu)
    return [(proc, tuple(gpus)) for proc, gpus in seen.values()]


def _idle(gpus: Sequence[GpuSample], cfg: HealthConfig) -> bool:
    readings = [gpu.utilization_gpu for gpu in gpus]
    return bool(readings) and all(u is not None and u < cfg.gpu_idle_percent for u in readings)


def _gpu_list(gpus: Sequence[GpuSample]) -> str:
    return ",".join(str(gpu.index) for gpu in gpus)


def _gpu_util(gpus: Sequence[GpuSample]) -> str:
    return ",".join("%g" % (gpu.utilization_gpu or 0.0) for gpu in gpus)


Jobs = List[Tuple[ProcessSample, Tuple[GpuSample, ...]]]


def input_pipeline(
    node: str, frame: NodeFrame, cfg: HealthConfig, now: float, jobs: Optional[Jobs] = None
) -> List[HealthResult]:
    """Per training process: GPUs idle while its workers (or itself) keep the CPU busy.

    Nothing on a frame without the host's process list (the console's first local frame, a node
    read by nvidia-smi alone): the workers cannot be seen, and 'keeps up' would be a guess."""
    if not frame.top_processes:
        return []
    out = []
    children: Dict[int, List[ProcessSample]] = {}
    for p in frame.top_processes:
        if p.ppid is not None and p.ppid != p.pid:
            children.setdefault(p.ppid, []).append(p)
    for proc, gpus in training_processes(frame) if jobs is None else jobs:
        if not gpus:
            continue
        workers = children.get(proc.pid, [])
        worker_cpu = sum(p.cpu_percent or 0.0 for p in workers)
        main_cpu = proc.cpu_percent or 0.0
        first = gpus[0].index
        evidence = (
            ("pid", str(proc.pid)),
            ("gpus", _gpu_list(gpus)),
            ("gpu_util_percent", _gpu_util(gpus)),
            ("workers", str(len(workers))),
            ("workers_cpu_percent", "%g" % round(worker_cpu, 1)),
            ("process_cpu_percent", "%g" % round(main_cpu, 1)),
        )
        idle = _idle(gpus, cfg)
        if idle and worker_cpu >= cfg.loader_busy_percent:
            out.append(
                make_result(
                    "data_loader",
                    node,
                    STATUS_WARN,
                    "pid %d: GPU %s idle while its %d data-loader workers use %s CPU"
                    % (proc.pid, _gpu_list(gpus), len(workers), format_percent(worker_cpu)),
                    first,
                    evidence,
                    REMEDY_DATA_LOADER,
                    now,
                )
            )
        elif idle and main_cpu >= MAIN_BUSY_PERCENT:
            out.append(
                make_result(
                    "data_loader",
                    node,
                    STATUS_WARN,
                    "pid %d: GPU %s idle while the process itself uses %s CPU (preprocessing)"
                    % (proc.pid, _gpu_list(gpus), format_percent(main_cpu)),
                    first,
                    evidence,
                    REMEDY_PREPROCESS,
                    now,
                )
            )
        else:
            out.append(
                make_result(
                    "data_loader",
                    node,
                    STATUS_PASS,
                    "pid %d: input pipeline keeps up" % proc.pid,
                    first,
                    evidence,
                    REMEDY_DATA_LOADER,
                    now,
                )
            )
    return out


def storage_bottleneck(
    node: str, frame: NodeFrame, cfg: HealthConfig, now: float, jobs: Optional[Jobs] = None
) -> List[HealthResult]:
    """A job's GPUs idle, the CPUs idle and iowait high: the job waits on storage."""
    host = frame.host
    jobs = [gpus for _, gpus in (training_processes(frame) if jobs is None else jobs) if gpus]
    if host is None or not jobs or host.iowait_percent is None or host.cpu_percent is None:
        return []
    used = tuple({gpu.index: gpu for gpus in jobs for gpu in gpus}.values())
    evidence = (
        ("gpus", _gpu_list(used)),
        ("gpu_util_percent", _gpu_util(used)),
        ("cpu_percent", "%g" % round(host.cpu_percent, 1)),
        ("iowait_percent", "%g" % round(host.iowait_percent, 1)),
    )
    if _idle(used, cfg) and host.cpu_percent < CPU_IDLE_PERCENT and host.iowait_percent > cfg.iowait_percent:
        return [
            make_result(
                "storage_bottleneck",
                node,
                STATUS_WARN,
                "GPU %s idle, CPU %s, iowait %s: the job waits on storage"
                % (_gpu_list(used), format_percent(host.cpu_percent), format_percent(host.iowait_percent)),
                None,
                evidence,
                REMEDY_STORAGE,
                now,
            )
        ]
    return [
        make_result("storage_bottleneck", node, STATUS_PASS, "no storage stall", None, evidence, REMEDY_STORAGE, now)
    ]


def visible_devices_agree(value: str, gpus: Sequence[GpuSample]) -> bool:
    """Whether CUDA_VISIBLE_DEVICES=value lets a process see every GPU of `gpus`.

    Entries are NVML indices or (prefixes of) UUIDs; CUDA stops at the first invalid entry,
    so "" or "-1" hides every GPU.
    """
    indices = set()
    uuids = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.isdigit():
            indices.add(int(entry))
        elif entry.startswith(("GPU-", "MIG-")):
            uuids.append(entry)
        else:
            break  # CUDA ignores this entry and everything after it
    for gpu in gpus:
        by_uuid = gpu.uuid is not None and any(gpu.uuid.startswith(u) for u in uuids)
        if not by_uuid and gpu.index not in indices:
            return False
    return True


def environment(
    node: str, frame: NodeFrame, cfg: HealthConfig, now: float, jobs: Optional[Jobs] = None
) -> List[HealthResult]:
    """Training processes whose environment disables NCCL transports or hides their own GPUs."""
    out = []
    for proc, gpus in training_processes(frame) if jobs is None else jobs:
        if proc.watched_env is None:
            continue  # not readable (another user's process): nothing to claim
        env = _env(proc)
        first = gpus[0].index if gpus else None
        shown = tuple((name, env[name]) for name in sorted(env))
        evidence = (("pid", str(proc.pid)), ("gpus", _gpu_list(gpus))) + shown
        problems: List[Tuple[str, str]] = []
        if env.get("NCCL_P2P_DISABLE", "").strip() not in ("", "0"):
            problems.append(("NCCL_P2P_DISABLE=%s: P2P disabled" % env["NCCL_P2P_DISABLE"], REMEDY_P2P))
        if env.get("NCCL_IB_DISABLE", "").strip() not in ("", "0"):
            problems.append(("NCCL_IB_DISABLE=%s: InfiniBand disabled" % env["NCCL_IB_DISABLE"], REMEDY_IB))
        cvd = env.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None and gpus and not visible_devices_agree(cvd, gpus):
            problems.append(("CUDA_VISIBLE_DEVICES=%r but it uses GPU %s" % (cvd, _gpu_list(gpus)), REMEDY_CVD))
        if problems:
            out.append(
                make_result(
                    "process_env",
                    node,
                    STATUS_WARN,
                    "pid %d: %s" % (proc.pid, "; ".join(text for text, _ in problems)),
                    first,
                    evidence,
                    " / ".join(remedy for _, remedy in problems),
                    now,
                )
            )
        else:
            out.append(
                make_result(
                    "process_env",
                    node,
                    STATUS_PASS,
                    "pid %d: environment as expected" % proc.pid,
                    first,
                    evidence,
                    REMEDY_P2P,
                    now,
                )
            )
    return out


def evaluate_telemetry(
    frame: NodeFrame, cfg: HealthConfig, now: Optional[float] = None, node: Optional[str] = None
) -> List[HealthResult]:
    """All telemetry findings over one frame."""
    name = node or frame.node
    when = frame.time if now is None else now
    if not frame.processes:
        return []  # no training process: nothing to find
    jobs = training_processes(frame)
    return (
        input_pipeline(name, frame, cfg, when, jobs)
        + storage_bottleneck(name, frame, cfg, when, jobs)
        + environment(name, frame, cfg, when, jobs)
    )
