"""The words of an alert rule as a config writes them: metric names, comparisons, severities.

Apart from alerts/rules.py, which evaluates rules, so that the config reader (below alerts in the
layers) checks a rule's words without importing the evaluation; rules.py checks at import that its
tables name exactly these.
"""

from typing import Literal, Tuple, get_args

# Declared once as types (the config schema's enums); the tuples are what code iterates.
GpuMetricName = Literal[
    "gpu.utilization",
    "gpu.memory_percent",
    "gpu.temperature",
    "gpu.temperature_margin",
    "gpu.power_w",
    "gpu.ecc_uncorrected",
    "gpu.xid",
    "gpu.lost",
]
NodeMetricName = Literal[
    "node.memory_percent",
    "node.swap_percent",
    "node.disk_free_percent",
    "node.cpu_percent",
    "node.iowait_percent",
    "node.unreachable",
]
MetricName = Literal[GpuMetricName, NodeMetricName]
Comparison = Literal[">", ">=", "<", "<=", "==", "!="]
Severity = Literal["info", "warning", "critical"]

GPU_METRIC_NAMES: Tuple[str, ...] = get_args(GpuMetricName)
NODE_METRIC_NAMES: Tuple[str, ...] = get_args(NodeMetricName)
METRICS = GPU_METRIC_NAMES + NODE_METRIC_NAMES
COMPARISONS: Tuple[str, ...] = get_args(Comparison)
SEVERITIES: Tuple[str, ...] = get_args(Severity)
