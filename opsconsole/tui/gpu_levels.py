"""How serious a GPU reading is: temperature, memory and throttle levels and the GPU's status word.

Shared by the GPUs pane and the node overview; kept apart from the GPUs pane so the overview (the
first screen of a one-node console) loads without the pane's action keys.
"""

from __future__ import annotations

from typing import Optional, Sequence

from opsconsole.config import HealthConfig
from opsconsole.health.result import STATUS_FAIL, STATUS_PASS, STATUS_WARN
from opsconsole.health.thresholds import temperature_status
from opsconsole.model import GpuSample, NodeState
from opsconsole.tui import bars
from opsconsole.tui.bars import LEVEL_CRIT, LEVEL_DIM, LEVEL_OK, LEVEL_PLAIN, LEVEL_WARN
from opsconsole.tui.formatting import NA, format_frame_age
from opsconsole.tui.table_diff import StyledCell

MEMORY_WARN_MARGIN = 10.0
_LEVEL_OF_STATUS = {STATUS_FAIL: LEVEL_CRIT, STATUS_WARN: LEVEL_WARN, STATUS_PASS: LEVEL_OK}

# NVML clock-event reason names (opsconsole.probe.nvml_decode) that cost speed.
_CRITICAL_REASONS = frozenset(("HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"))
_WARNING_REASONS = frozenset(("SwPowerCap",))
_SHORT_REASONS = {"GpuIdle": "idle", "ApplicationsClocksSetting": "app-clocks"}


def temperature_level(gpu: GpuSample, health: HealthConfig) -> str:
    """Critical at the limit (the configured one or the GPU's own slowdown point), warning within
    [health] temperature_margin_c of slowdown: health/thresholds.py, as the health rule judges it."""
    status = temperature_status(gpu, health)
    return LEVEL_PLAIN if status is None else _LEVEL_OF_STATUS[status]


def memory_level(gpu: GpuSample, health: HealthConfig) -> str:
    crit = health.memory_percent
    return bars.level_for(gpu.memory_percent, crit - MEMORY_WARN_MARGIN, crit)


def throttle_text(reasons: Optional[Sequence[str]]) -> StyledCell:
    """Active clock-event reasons; the level says whether they cost speed."""
    if reasons is None:
        return NA, LEVEL_PLAIN
    if not reasons:
        return "-", LEVEL_PLAIN
    text = ",".join(_SHORT_REASONS.get(reason, reason) for reason in reasons)
    if any(reason in _CRITICAL_REASONS for reason in reasons):
        return text, LEVEL_CRIT
    if any(reason in _WARNING_REASONS for reason in reasons):
        return text, LEVEL_WARN
    return text, LEVEL_PLAIN


def gpu_status(gpu: GpuSample, state: NodeState, now: float) -> StyledCell:
    """What is wrong with the GPU (or its node), most serious first."""
    if gpu.lost:
        return "LOST", LEVEL_CRIT
    if not state.is_live:
        return "%s %s" % (state.state, format_frame_age(state.age(now))), LEVEL_DIM
    if gpu.xid_events:
        from opsconsole.health import xid  # loaded with the first Xid seen (health/rules.py)

        return xid.short_status(gpu.xid_events), LEVEL_CRIT  # the codes and the catalog's action: "X79 reboot"
    if gpu.errors:
        return "err %d" % len(gpu.errors), LEVEL_WARN
    return "ok", LEVEL_OK
