"""Threshold rules over one NodeFrame: what every tick can afford to check (pure functions).

Each rule reads one concern (temperature, ECC, disk ...) and returns HealthResults with the
values it read as evidence and a remedy; the remedies follow the seed chapter's tables and
NVIDIA's guidance for the same signals. A field the GPU does not report (None) yields no
result rather than a guess. The whole set must stay well under 1 ms per node of 8 GPUs per
tick (benchmarks/health_rules.py), so each rule is a few comparisons and one dataclass.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

from opsconsole.config import HealthConfig
from opsconsole.health.result import STATUS_FAIL, STATUS_PASS, STATUS_WARN, HealthResult, make_result
from opsconsole.health.thresholds import temperature_limit, temperature_status
from opsconsole.model import GpuSample, HostSample, NodeFrame
from opsconsole.units import format_percent, format_temperature

GpuRule = Callable[[str, GpuSample, HealthConfig, float], Optional[HealthResult]]
HostRule = Callable[[str, HostSample, HealthConfig, float], List[HealthResult]]

GIB = 1024**3

REMEDY_TEMPERATURE = (
    "check the node's cooling (airflow, fans, inlet temperature) and the GPU's heatsink; "
    "the GPU slows its clocks near its slowdown threshold; drain the node if it stays hot"
)
REMEDY_ECC = (
    "drain the node, let jobs finish or stop them, then reset the GPU (nvidia-smi --gpu-reset -i N); "
    "if uncorrected errors come back, replace the GPU (RMA)"
)
REMEDY_REMAP_PENDING = "a row remap waits for a GPU reset: drain the node and reset the GPU when it is idle"
REMEDY_REMAP_FAILED = "row remapping failed (no spare rows): drain the node and replace the GPU (RMA)"
REMEDY_RETIRED_PAGES = "a page retirement waits for a GPU reset: drain the node and reset the GPU when idle"
REMEDY_XID = (
    "read the XID in the kernel log (dmesg | grep -i xid); 79 (fallen off the bus) and 48/95 (ECC) "
    "need the node drained and the GPU reset or replaced; the job on it must restart from a checkpoint"
)
REMEDY_THERMAL_CLOCKS = "the GPU is slowing down for heat: check cooling and airflow (see gpu_temperature)"
REMEDY_HW_CLOCKS = (
    "hardware slowdown (power brake or an external signal): check the PSUs and the board's power "
    "cabling; drain the node if it persists"
)
REMEDY_PCIE = (
    "the PCIe link trained below its maximum: reseat the GPU or riser, check BIOS PCIe settings; "
    "host-device copies (data loading, checkpoints) are slower until fixed"
)
REMEDY_LOST = (
    "the GPU is lost to NVML (often XID 79): drain the node; a GPU reset or a reboot brings it back, "
    "replace it if it recurs"
)
REMEDY_NVML = "NVML reported errors: check the driver (nvidia-smi -q), dmesg for XIDs, and the driver version"
REMEDY_DISK = "free space: remove old checkpoints (the checkpoints pane plans a cleanup), logs and caches"
REMEDY_MEMORY = (
    "host memory is nearly full: lower DataLoader num_workers or prefetch_factor, look for leaking "
    "processes; the kernel's OOM killer may stop the job"
)
REMEDY_SWAP = "the host is swapping: training slows badly; lower host memory use (workers, caches)"
REMEDY_IOWAIT = (
    "I/O bottleneck: check the storage (iostat -x 1, nfsstat -c), use faster local storage or caching, "
    "raise DataLoader num_workers and prefetch_factor"
)

THERMAL_REASONS = frozenset(("SwThermalSlowdown", "HwThermalSlowdown"))
HARDWARE_REASONS = frozenset(("HwSlowdown", "HwPowerBrakeSlowdown"))


def _num(value: float) -> str:
    """An evidence value: a tenth kept (`check --json` prints it as a number); messages use opsconsole.units."""
    return "%g" % round(value, 1)


# --- GPU rules -------------------------------------------------------------------------


def gpu_temperature(node: str, gpu: GpuSample, cfg: HealthConfig, now: float) -> Optional[HealthResult]:
    """Fail at the limit (health/thresholds.py: [health] gpu_temperature_c or the GPU's slowdown point,
    the lower); warn within [health] temperature_margin_c of the slowdown point."""
    status = temperature_status(gpu, cfg)
    if status is None:
        return None
    temp, slowdown = gpu.temperature, gpu.temperature_slowdown
    evidence = (("temperature_c", _num(temp)), ("limit_c", _num(cfg.gpu_temperature_c)))
    if slowdown is not None:
        evidence += (("slowdown_c", _num(slowdown)),)
    limit = temperature_limit(gpu, cfg)
    if status == STATUS_FAIL:
        message = "GPU %d at %s (limit %s)" % (
            gpu.index,
            format_temperature(temp, limit=limit),
            format_temperature(limit),
        )
    elif status == STATUS_WARN:
        message = "GPU %d at %s, %s from slowdown" % (
            gpu.index,
            format_temperature(temp),
            format_temperature(slowdown - temp),
        )
    else:
        message = "GPU %d at %s" % (gpu.index, format_temperature(temp))
    return make_result("gpu_temperature", node, status, message, gpu.index, evidence, REMEDY_TEMPERATURE, now)


def gpu_ecc(node: str, gpu: GpuSample, cfg: HealthConfig, now: float) -> Optional[HealthResult]:
    """Fail on volatile (since boot) uncorrected ECC errors."""
    count = gpu.ecc_volatile_uncorrected
    if count is None:
        return None
    evidence = (("ecc_volatile_uncorrected", str(count)),)
    if gpu.ecc_volatile_corrected is not None:
        evidence += (("ecc_volatile_corrected", str(gpu.ecc_volatile_corrected)),)
    if count > 0:
        return make_result(
            "gpu_ecc",
            node,
            STATUS_FAIL,
            "GPU %d: %d uncorrected ECC errors" % (gpu.index, count),
            gpu.index,
            evidence,
            REMEDY_ECC,
            now,
        )
    return make_result(
        "gpu_ecc",
        node,
        STATUS_PASS,
        "GPU %d: no uncorrected ECC errors" % gpu.index,
        gpu.index,
        evidence,
        REMEDY_ECC,
        now,
    )


def gpu_remapped_rows(node: str, gpu: GpuSample, cfg: HealthConfig, now: float) -> Optional[HealthResult]:
    """Fail when row remapping failed; warn when a remap is pending (it needs a reset)."""
    pending, failed = gpu.remapped_rows_pending, gpu.remapped_rows_failure
    if pending is None and failed is None:
        return None
    evidence = (("pending", str(pending)), ("failure", str(failed)))
    if gpu.remapped_rows_uncorrected is not None:
        evidence += (("remapped_uncorrected", str(gpu.remapped_rows_uncorrected)),)
    if failed:
        return make_result(
            "gpu_remapped_rows",
            node,
            STATUS_FAIL,
            "GPU %d: row remapping failed" % gpu.index,
            gpu.index,
            evidence,
            REMEDY_REMAP_FAILED,
            now,
        )
    if pending:
        return make_result(
            "gpu_remapped_rows",
            node,
            STATUS_WARN,
            "GPU %d: row remap pending" % gpu.index,
            gpu.index,
            evidence,
            REMEDY_REMAP_PENDING,
            now,
        )
    return make_result(
        "gpu_remapped_rows",
        node,
        STATUS_PASS,
        "GPU %d: no remap pending" % gpu.index,
        gpu.index,
        evidence,
        REMEDY_REMAP_PENDING,
        now,
    )


def gpu_retired_pages(node: str, gpu: GpuSample, cfg: HealthConfig, now: float) -> Optional[HealthResult]:
    """Warn when a page retirement is pending (older GPUs; H100/H200 remap rows instead)."""
    pending = gpu.retired_pages_pending
    if pending is None:
        return None
    status = STATUS_WARN if pending else STATUS_PASS
    message = (
        "GPU %d: page retirement pending" % gpu.index if pending else "GPU %d: no page retirement pending" % gpu.index
    )
    return make_result(
        "gpu_retired_pages", node, status, message, gpu.index, (("pending", str(pending)),), REMEDY_RETIRED_PAGES, now
    )


def gpu_xid(node: str, gpu: GpuSample, cfg: HealthConfig, now: float) -> Optional[HealthResult]:
    """Fail on critical XID events seen since the previous frame."""
    if not gpu.xid_events:
        return make_result(
            "gpu_xid", node, STATUS_PASS, "GPU %d: no critical XID" % gpu.index, gpu.index, (), REMEDY_XID, now
        )
    # Each Xid with NVIDIA's catalog meaning and the action it calls for; the remedy is the most disruptive one.
    # The catalog loads with the first Xid seen: a console whose GPUs report none never needs it.
    from opsconsole.health import xid

    seen = [xid.decode(code) for code in gpu.xid_events]
    described = "; ".join(item.describe() for item in seen)
    action = xid.worst_action(seen)
    notes = "; ".join(sorted({item.note for item in seen if item.note}))
    remedy = "%s%s%s" % (
        xid.ACTION_TEXT[action][:1].upper(),
        xid.ACTION_TEXT[action][1:],
        " (%s)" % notes if notes else "",
    )
    if action == xid.ACTION_RESET_GPU:
        remedy += "; the GPUs pane offers R (reset) once the GPU runs no process"
    elif action in (xid.ACTION_REBOOT_NODE, xid.ACTION_DRAIN):
        remedy += "; drain the node first (D on the Nodes pane)"
    return make_result(
        "gpu_xid",
        node,
        STATUS_FAIL,
        "GPU %d: %s" % (gpu.index, described),
        gpu.index,
        (("xid", ",".join(str(code) for code in gpu.xid_events)), ("action", action)),
        remedy,
        now,
    )


def gpu_clock_events(node: str, gpu: GpuSample, cfg: HealthConfig, now: float) -> Optional[HealthResult]:
    """Fail on hardware slowdown, warn on thermal slowdown; a power cap under full load is expected."""
    reasons = gpu.clock_event_reasons
    if reasons is None:
        return None
    evidence = (("reasons", ",".join(reasons) or "none"),)
    if gpu.clock_sm_mhz is not None and gpu.clock_sm_max_mhz:
        evidence += (("sm_clock_mhz", "%d/%d" % (gpu.clock_sm_mhz, gpu.clock_sm_max_mhz)),)
    hardware = [r for r in reasons if r in HARDWARE_REASONS]
    if hardware:
        return make_result(
            "gpu_clock_events",
            node,
            STATUS_FAIL,
            "GPU %d: hardware slowdown (%s)" % (gpu.index, ", ".join(hardware)),
            gpu.index,
            evidence,
            REMEDY_HW_CLOCKS,
            now,
        )
    thermal = [r for r in reasons if r in THERMAL_REASONS]
    if thermal:
        return make_result(
            "gpu_clock_events",
            node,
            STATUS_WARN,
            "GPU %d: thermal slowdown (%s)" % (gpu.index, ", ".join(thermal)),
            gpu.index,
            evidence,
            REMEDY_THERMAL_CLOCKS,
            now,
        )
    if "SwPowerCap" in reasons:
        message = "GPU %d: at its power cap (expected under full load)" % gpu.index
    else:
        message = "GPU %d: no slowdown" % gpu.index
    return make_result("gpu_clock_events", node, STATUS_PASS, message, gpu.index, evidence, REMEDY_HW_CLOCKS, now)


def gpu_pcie_link(node: str, gpu: GpuSample, cfg: HealthConfig, now: float) -> Optional[HealthResult]:
    """Warn when the link runs below its maximum width, or below its maximum generation while busy.

    An idle GPU lowers its link generation to save power, so a lower gen counts only under load;
    a narrower link is never power saving.
    """
    gen, gen_max, width, width_max = gpu.pcie_gen, gpu.pcie_gen_max, gpu.pcie_width, gpu.pcie_width_max
    if (gen is None or gen_max is None) and (width is None or width_max is None):
        return None
    evidence = (("gen", "%s/%s" % (gen, gen_max)), ("width", "x%s/x%s" % (width, width_max)))
    narrow = width is not None and width_max is not None and width < width_max
    idle = gpu.utilization_gpu is not None and gpu.utilization_gpu < cfg.gpu_idle_percent
    slow = gen is not None and gen_max is not None and gen < gen_max and not idle
    if narrow or slow:
        parts = []
        if slow:
            parts.append("gen %d of %d" % (gen, gen_max))
        if narrow:
            parts.append("x%d of x%d" % (width, width_max))
        return make_result(
            "gpu_pcie_link",
            node,
            STATUS_WARN,
            "GPU %d: PCIe link downgraded (%s)" % (gpu.index, ", ".join(parts)),
            gpu.index,
            evidence,
            REMEDY_PCIE,
            now,
        )
    return make_result(
        "gpu_pcie_link",
        node,
        STATUS_PASS,
        "GPU %d: PCIe link at full speed" % gpu.index,
        gpu.index,
        evidence,
        REMEDY_PCIE,
        now,
    )


def gpu_nvml(node: str, gpu: GpuSample, cfg: HealthConfig, now: float) -> Optional[HealthResult]:
    """Fail when the GPU is lost; warn when NVML fails on some of its fields."""
    if gpu.lost:
        return make_result(
            "gpu_lost",
            node,
            STATUS_FAIL,
            "GPU %d lost (fell off the bus or NVML lost it)" % gpu.index,
            gpu.index,
            (("lost", "True"),),
            REMEDY_LOST,
            now,
        )
    if gpu.errors:
        return make_result(
            "gpu_lost",
            node,
            STATUS_WARN,
            "GPU %d: NVML errors: %s" % (gpu.index, "; ".join(gpu.errors[:3])),
            gpu.index,
            (("errors", str(len(gpu.errors))),),
            REMEDY_NVML,
            now,
        )
    return make_result(
        "gpu_lost", node, STATUS_PASS, "GPU %d answers NVML" % gpu.index, gpu.index, (), REMEDY_LOST, now
    )


GPU_RULES: Tuple[GpuRule, ...] = (
    gpu_nvml,
    gpu_temperature,
    gpu_ecc,
    gpu_remapped_rows,
    gpu_retired_pages,
    gpu_xid,
    gpu_clock_events,
    gpu_pcie_link,
)


# --- host rules ------------------------------------------------------------------------


def disk_free(node: str, host: HostSample, cfg: HealthConfig, now: float) -> List[HealthResult]:
    """Fail a checked mount point with less free space than [health] disk_free_percent."""
    out = []
    for disk in host.disks:
        if disk.path not in cfg.disk_paths:
            continue
        free = disk.free_percent
        evidence = (("path", disk.path), ("free_percent", _num(free)), ("free_gib", _num(disk.free / GIB)))
        if free < cfg.disk_free_percent:
            out.append(
                make_result(
                    "disk_free",
                    node,
                    STATUS_FAIL,
                    "%s: %s free (minimum %s)"
                    % (
                        disk.path,
                        format_percent(free, limit=cfg.disk_free_percent),
                        format_percent(cfg.disk_free_percent),
                    ),
                    None,
                    evidence,
                    REMEDY_DISK,
                    now,
                )
            )
        else:
            out.append(
                make_result(
                    "disk_free",
                    node,
                    STATUS_PASS,
                    "%s: %s free" % (disk.path, format_percent(free)),
                    None,
                    evidence,
                    REMEDY_DISK,
                    now,
                )
            )
    return out


def memory_used(node: str, host: HostSample, cfg: HealthConfig, now: float) -> List[HealthResult]:
    """Fail when host memory use exceeds [health] memory_percent."""
    used = host.mem_percent
    if used is None:
        return []
    evidence = (("memory_percent", _num(used)), ("limit_percent", _num(cfg.memory_percent)))
    if used > cfg.memory_percent:
        return [
            make_result(
                "memory",
                node,
                STATUS_FAIL,
                "memory %s used (limit %s)"
                % (format_percent(used, limit=cfg.memory_percent), format_percent(cfg.memory_percent)),
                None,
                evidence,
                REMEDY_MEMORY,
                now,
            )
        ]
    return [
        make_result(
            "memory", node, STATUS_PASS, "memory %s used" % format_percent(used), None, evidence, REMEDY_MEMORY, now
        )
    ]


def swap_used(node: str, host: HostSample, cfg: HealthConfig, now: float) -> List[HealthResult]:
    """Warn when more swap than [health] swap_used_percent is in use."""
    if host.swap_used is None or not host.swap_total:
        return []  # no swap configured: nothing to swap to
    share = 100.0 * host.swap_used / host.swap_total
    evidence = (("swap_used_percent", _num(share)), ("swap_used_gib", _num(host.swap_used / GIB)))
    if share > cfg.swap_used_percent:
        return [
            make_result(
                "swap", node, STATUS_WARN, "swap %s in use" % format_percent(share), None, evidence, REMEDY_SWAP, now
            )
        ]
    return [
        make_result(
            "swap", node, STATUS_PASS, "swap %s in use" % format_percent(share), None, evidence, REMEDY_SWAP, now
        )
    ]


def iowait(node: str, host: HostSample, cfg: HealthConfig, now: float) -> List[HealthResult]:
    """Warn when CPU time waiting on I/O exceeds [health] iowait_percent."""
    value = host.iowait_percent
    if value is None:
        return []
    evidence = (("iowait_percent", _num(value)), ("limit_percent", _num(cfg.iowait_percent)))
    if value > cfg.iowait_percent:
        return [
            make_result(
                "iowait",
                node,
                STATUS_WARN,
                "iowait %s: I/O bottleneck" % format_percent(value),
                None,
                evidence,
                REMEDY_IOWAIT,
                now,
            )
        ]
    return [
        make_result(
            "iowait", node, STATUS_PASS, "iowait %s" % format_percent(value), None, evidence, REMEDY_IOWAIT, now
        )
    ]


HOST_RULES: Tuple[HostRule, ...] = (disk_free, memory_used, swap_used, iowait)


def nvml_source(node: str, frame: NodeFrame, now: float) -> List[HealthResult]:
    """Warn when the probe fell back from NVML to nvidia-smi or reported NVML errors for the node."""
    nvml_errors = [e for e in frame.errors if "nvml" in e.lower()]
    if frame.gpu_source == "nvidia-smi" or nvml_errors:
        detail = "; ".join(nvml_errors[:2]) or frame.gpu_note or "read through nvidia-smi"
        return [
            make_result(
                "nvml",
                node,
                STATUS_WARN,
                "NVML failing: %s" % detail,
                None,
                (("gpu_source", frame.gpu_source),),
                REMEDY_NVML,
                now,
            )
        ]
    if frame.gpu_source == "nvml":
        return [
            make_result(
                "nvml",
                node,
                STATUS_PASS,
                "NVML answers (%d GPUs)" % len(frame.gpus),
                None,
                (("gpu_source", "nvml"),),
                REMEDY_NVML,
                now,
            )
        ]
    return []  # no GPUs on this node: nothing to say


def evaluate_frame(
    frame: NodeFrame, cfg: HealthConfig, now: Optional[float] = None, node: Optional[str] = None
) -> List[HealthResult]:
    """Every threshold rule over one frame: GPU rules per GPU, host rules, the NVML source."""
    name = node or frame.node
    when = frame.time if now is None else now
    out = nvml_source(name, frame, when)
    for gpu in frame.gpus:
        for rule in GPU_RULES:
            result = rule(name, gpu, cfg, when)
            if result is not None:
                out.append(result)
    host = frame.host
    if host is not None:
        for host_rule in HOST_RULES:
            out.extend(host_rule(name, host, cfg, when))
    return out
