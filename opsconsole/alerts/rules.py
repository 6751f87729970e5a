"""Alert rules and the metrics they read from a node's state.

A rule fires when its condition has held for `for_s` seconds and resolves only when the
value is back past the clear level (threshold minus a hysteresis band), so a reading that
hovers at the threshold does not flap.
"""

from __future__ import annotations

import operator
from typing import Callable, Dict, List, Optional, Tuple

from opsconsole import alert_names
from opsconsole.history import gpu_values
from opsconsole.model import STATE_AUTH, STATE_DOWN, STATE_HOSTKEY, GpuSample, NodeState, frozen

COMPARISONS: Dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
SEVERITIES = alert_names.SEVERITIES


def _gpu_ecc(gpu: GpuSample) -> Optional[float]:
    return None if gpu.ecc_volatile_uncorrected is None else float(gpu.ecc_volatile_uncorrected)


def _gpu_temperature_margin(gpu: GpuSample) -> Optional[float]:
    if gpu.temperature is None or gpu.temperature_slowdown is None:
        return None
    return gpu.temperature_slowdown - gpu.temperature


GPU_METRICS: Dict[str, Callable[[GpuSample], Optional[float]]] = {
    "gpu.utilization": lambda g: gpu_values(g)[0],
    "gpu.memory_percent": lambda g: gpu_values(g)[1],
    "gpu.temperature": lambda g: g.temperature,
    "gpu.temperature_margin": _gpu_temperature_margin,
    "gpu.power_w": lambda g: g.power_draw_w,
    "gpu.ecc_uncorrected": _gpu_ecc,
    "gpu.xid": lambda g: float(max(g.xid_events)) if g.xid_events else 0.0,
    "gpu.lost": lambda g: 1.0 if g.lost else 0.0,
}


def _memory_percent(state: NodeState) -> Optional[float]:
    host = state.frame.host if state.frame else None
    if host is None or not host.mem_total or host.mem_used is None:
        return None
    return 100.0 * host.mem_used / host.mem_total


def _swap_percent(state: NodeState) -> Optional[float]:
    host = state.frame.host if state.frame else None
    if host is None or not host.swap_total or host.swap_used is None:
        return None
    return 100.0 * host.swap_used / host.swap_total


def _disk_free_percent(state: NodeState) -> Optional[float]:
    host = state.frame.host if state.frame else None
    if host is None or not host.disks:
        return None
    shares = [100.0 * d.free / d.total for d in host.disks if d.total]
    return min(shares) if shares else None


def _host_field(name: str) -> Callable[[NodeState], Optional[float]]:
    def read(state: NodeState) -> Optional[float]:
        host = state.frame.host if state.frame else None
        return None if host is None else getattr(host, name)

    return read


def _unreachable(state: NodeState) -> Optional[float]:
    return 1.0 if state.state in (STATE_DOWN, STATE_AUTH, STATE_HOSTKEY) else 0.0


NODE_METRICS: Dict[str, Callable[[NodeState], Optional[float]]] = {
    "node.memory_percent": _memory_percent,
    "node.swap_percent": _swap_percent,
    "node.disk_free_percent": _disk_free_percent,
    "node.cpu_percent": _host_field("cpu_percent"),
    "node.iowait_percent": _host_field("iowait_percent"),
    "node.unreachable": _unreachable,
}
METRICS = tuple(GPU_METRICS) + tuple(NODE_METRICS)
if METRICS != alert_names.METRICS or tuple(COMPARISONS) != alert_names.COMPARISONS:
    raise ImportError("alerts.rules and alert_names disagree on the metric or comparison names")


@frozen
class AlertRule:
    """A rule as the engine runs it: a metric compared with a threshold for a while, at a severity."""

    name: str
    metric: str  # one of METRICS
    comparison: str  # one of COMPARISONS
    threshold: float
    for_s: float = 0.0  # the condition must hold this long before the alert fires
    severity: str = "warning"
    clear: Optional[float] = None  # the level the value must get back past to resolve; None: see clear_level

    def holds(self, value: float) -> bool:
        return COMPARISONS[self.comparison](value, self.threshold)

    def clear_level(self) -> float:
        """Where the alert resolves: `clear`, else 5 % of the threshold (at least 1) back from it."""
        if self.clear is not None:
            return self.clear
        band = max(1.0, abs(self.threshold) * 0.05)
        if self.comparison in (">", ">="):
            return self.threshold - band
        if self.comparison in ("<", "<="):
            return self.threshold + band
        return self.threshold

    def cleared(self, value: float) -> bool:
        """True when `value` is back on the healthy side of the clear level."""
        if self.comparison in (">", ">="):
            return value <= self.clear_level()
        if self.comparison in ("<", "<="):
            return value >= self.clear_level()
        return not self.holds(value)


def builtin_rules(
    gpu_temperature_c: float = 85.0, disk_free_percent: float = 10.0, memory_percent: float = 90.0
) -> Tuple[AlertRule, ...]:
    """The seed chapter's thresholds (temperature 85 °C, disk free 10 %, memory 90 %) and hard faults."""
    return (
        AlertRule("gpu_hot", "gpu.temperature", ">", gpu_temperature_c, for_s=30, severity="critical"),
        AlertRule("disk_full", "node.disk_free_percent", "<", disk_free_percent, for_s=60, severity="warning"),
        AlertRule("host_memory", "node.memory_percent", ">", memory_percent, for_s=60, severity="warning"),
        AlertRule("ecc_uncorrected", "gpu.ecc_uncorrected", ">", 0, severity="critical", clear=0),
        AlertRule("xid", "gpu.xid", ">", 0, severity="critical", clear=0),
        AlertRule("gpu_lost", "gpu.lost", "==", 1, severity="critical"),
        AlertRule("node_unreachable", "node.unreachable", "==", 1, for_s=30, severity="critical"),
    )


def readings(rule: AlertRule, state: NodeState) -> List[Tuple[Optional[int], Optional[float]]]:
    """(gpu index or None, value) for each subject of `rule` on this node."""
    if rule.metric in NODE_METRICS:
        return [(None, NODE_METRICS[rule.metric](state))]
    read = GPU_METRICS[rule.metric]
    frame = state.frame
    if frame is None:
        return []
    return [(gpu.index, read(gpu)) for gpu in frame.gpus]


def rules_from_config(config) -> Tuple[AlertRule, ...]:
    """The built-in rules (thresholds from [health]) unless switched off, then the [[alerts]] rules."""
    rules: List[AlertRule] = []
    if config.alerting.builtin_rules:
        h = config.health
        rules += builtin_rules(h.gpu_temperature_c, h.disk_free_percent, h.memory_percent)
    for r in config.alerts:
        rules.append(AlertRule(r.name, r.metric, r.comparison, r.threshold, r.for_s, r.severity, r.clear))
    return tuple(rules)
