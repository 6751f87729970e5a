"""Realistic changing 8-GPU frames, derived from the real H200 capture, for recording tests and benchmarks."""

import json
import math
from dataclasses import replace
from typing import List

from opsconsole.model import STATE_STALE, STATE_UP, NodeFrame, NodeState, from_wire
from tests.conftest import FIXTURES

_CAPTURED = from_wire(NodeFrame, json.loads((FIXTURES / "h200_frame.json").read_text()))
# The capture predates the kernel-thread flag; flagged as the probe flags them now (a kernel thread
# is what has no command line there), so a replay gives back exactly what was recorded.
_BASE = replace(
    _CAPTURED,
    top_processes=tuple(
        replace(row, kernel_thread=row.command == "[%s]" % row.name) for row in _CAPTURED.top_processes
    ),
)


def node_state(node: int, tick: int, t0: float = 1_800_000_000.0, gpus: int = 8) -> NodeState:
    """Node `node` at second `tick`: load that varies per GPU, as a training run's does."""
    base_gpu = _BASE.gpus[0]
    items = []
    for i in range(gpus):
        phase = (tick + node * 7 + i * 3) / 9.0
        util = round(50 + 45 * math.sin(phase))
        items.append(
            replace(
                base_gpu,
                index=i,
                uuid="GPU-%04d-%d" % (node, i),
                utilization_gpu=float(util),
                temperature=float(40 + util // 4),
                power_draw_w=round(120 + util * 5.7 + (tick % 3) * 0.25, 3),
                memory_used=base_gpu.memory_used + (tick % 5) * 2**20,
                clock_sm_mhz=1980 if util > 20 else 345,
                energy_j=(base_gpu.energy_j or 0) + tick * 500.0 + i,
            )
        )
    host = replace(_BASE.host, hostname="gpu%03d" % node, cpu_percent=round(10 + (tick % 7) * 1.5, 2))
    frame = replace(_BASE, node="gpu%03d" % node, time=t0 + tick, seq=tick + 1, gpus=tuple(items), host=host)
    state = STATE_STALE if (node == 3 and 40 <= tick < 45) else STATE_UP
    return NodeState(
        name="gpu%03d" % node,
        state=state,
        frame=frame,
        received_at=t0 + tick + 0.05 + node * 1e-4,
        rtt_ms=1.5 + node * 0.01,
        since=t0,
        address="gpu%03d:22" % node,
    )


def fleet_ticks(nodes: int, ticks: int, gpus: int = 8) -> List[List[NodeState]]:
    return [[node_state(n, tick, gpus=gpus) for n in range(nodes)] for tick in range(ticks)]
