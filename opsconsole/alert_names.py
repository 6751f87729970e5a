"""The words of an alert rule as a config writes them: metric names, comparisons, severities.

Apart from alerts/rules.py, which evaluates rules, so that the config reader (below alerts in the
layers) checks a rule's words without importing the evaluation; rules.py checks at import that its
tables name exactly these.
"""

GPU_METRIC_NAMES = (
    "gpu.utilization",
    "gpu.memory_percent",
    "gpu.temperature",
    "gpu.temperature_margin",
    "gpu.power_w",
    "gpu.ecc_uncorrected",
    "gpu.xid",
    "gpu.lost",
)
NODE_METRIC_NAMES = (
    "node.memory_percent",
    "node.swap_percent",
    "node.disk_free_percent",
    "node.cpu_percent",
    "node.iowait_percent",
    "node.unreachable",
)
METRICS = GPU_METRIC_NAMES + NODE_METRIC_NAMES
COMPARISONS = (">", ">=", "<", "<=", "==", "!=")
SEVERITIES = ("info", "warning", "critical")
