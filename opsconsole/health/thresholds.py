"""GPU thresholds in one place, from [health]: what the health rules judge and the panes colour.

A GPU's temperature fails at `[health] gpu_temperature_c` or at the GPU's own slowdown temperature
(NVML's threshold, where it starts to throttle), whichever is lower, and warns within
`temperature_margin_c` of the slowdown point. The GPUs pane, the node overview and the health rule
`gpu_temperature` all ask here, so a colour and a health verdict never disagree.
"""

from typing import Optional

from opsconsole.config import HealthConfig
from opsconsole.health.result import STATUS_FAIL, STATUS_PASS, STATUS_WARN
from opsconsole.model import GpuSample


def temperature_limit(gpu: GpuSample, cfg: HealthConfig) -> float:
    """The configured limit, or the GPU's slowdown temperature when that is lower."""
    if gpu.temperature_slowdown is not None:
        return min(cfg.gpu_temperature_c, gpu.temperature_slowdown)
    return cfg.gpu_temperature_c


def temperature_status(gpu: GpuSample, cfg: HealthConfig) -> Optional[str]:
    """STATUS_FAIL at or above the limit, STATUS_WARN within the margin of the slowdown point, else
    STATUS_PASS; None without a reading."""
    temp, slowdown = gpu.temperature, gpu.temperature_slowdown
    if temp is None:
        return None
    if temp >= temperature_limit(gpu, cfg):
        return STATUS_FAIL
    if slowdown is not None and slowdown - temp <= cfg.temperature_margin_c:
        return STATUS_WARN
    return STATUS_PASS
