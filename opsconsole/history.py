"""Recent past of every GPU and node: fixed-size ring buffers fed from the fleet's states.

One buffer per (node, GPU, metric) and per (node, metric); a frame is taken once (by its
seq), so redraws and repeated states do not add samples. Memory is bounded by the
configured size whatever the run length. No Textual here: the panes draw `sparkline()`.
"""

from __future__ import annotations

import math
from array import array
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from opsconsole.model import GpuSample, NodeFrame, NodeState

DEFAULT_SIZE = 300  # samples kept per series: five minutes at 1 s

GPU_METRICS = ("utilization", "memory_percent", "temperature", "power_w")
NODE_METRICS = ("gpu_utilization", "gpu_memory_percent", "cpu_percent", "memory_percent", "power_w")

_BLOCKS = "▁▂▃▄▅▆▇█"
_NO_DATA = " "


class Ring:
    """A fixed-size buffer of floats (NaN = no reading) with the time of each sample."""

    __slots__ = ("size", "_values", "_times", "_next", "_count")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a ring holds at least one sample, got size %d" % size)
        self.size = size
        self._values = array("d", [math.nan]) * size
        self._times = array("d", [0.0]) * size
        self._next = 0
        self._count = 0

    def append(self, time: float, value: Optional[float]) -> None:
        self._values[self._next] = math.nan if value is None else float(value)
        self._times[self._next] = time
        self._next = (self._next + 1) % self.size
        if self._count < self.size:
            self._count += 1

    def __len__(self) -> int:
        return self._count

    def _order(self) -> range:
        start = (self._next - self._count) % self.size
        return range(start, start + self._count)

    def values(self) -> List[Optional[float]]:
        """Oldest first; None where the sample had no reading."""
        out: List[Optional[float]] = []
        for i in self._order():
            v = self._values[i % self.size]
            out.append(None if math.isnan(v) else v)
        return out

    def points(self) -> List[Tuple[float, Optional[float]]]:
        """(time, value) pairs, oldest first."""
        return [(self._times[i % self.size], v) for i, v in zip(self._order(), self.values())]

    def latest(self) -> Optional[float]:
        if not self._count:
            return None
        v = self._values[(self._next - 1) % self.size]
        return None if math.isnan(v) else v

    def since(self, time: float) -> List[Tuple[float, Optional[float]]]:
        """The samples taken at or after `time`."""
        return [(t, v) for t, v in self.points() if t >= time]


def gpu_values(gpu: GpuSample) -> Tuple[Optional[float], ...]:
    """The GPU_METRICS of one sample, None where the GPU did not report it."""
    memory = None
    if gpu.memory_used is not None and gpu.memory_total:
        memory = 100.0 * gpu.memory_used / gpu.memory_total
    return (gpu.utilization_gpu, memory, gpu.temperature, gpu.power_draw_w)


def _mean(values: Iterable[Optional[float]]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def node_values(frame: NodeFrame) -> Tuple[Optional[float], ...]:
    """The NODE_METRICS of one frame: GPU means, host CPU and memory, total GPU power."""
    per_gpu = [gpu_values(g) for g in frame.gpus if not g.lost]
    power = [v[3] for v in per_gpu if v[3] is not None]
    host = frame.host
    memory = None
    if host is not None and host.mem_total and host.mem_used is not None:
        memory = 100.0 * host.mem_used / host.mem_total
    return (
        _mean(v[0] for v in per_gpu),
        _mean(v[1] for v in per_gpu),
        None if host is None else host.cpu_percent,
        memory,
        sum(power) if power else None,
    )


class History:
    """Ring buffers for every GPU and node the fleet reports."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self.size = size
        self._gpu: Dict[Tuple[str, int, str], Ring] = {}
        self._node: Dict[Tuple[str, str], Ring] = {}
        self._last_seq: Dict[str, Tuple[float, int]] = {}

    def observe(self, state: NodeState) -> bool:
        """Take the state's frame if it is new; True when samples were added."""
        frame = state.frame
        if frame is None:
            return False
        stamp = (frame.time, frame.seq)
        if self._last_seq.get(state.name) == stamp:
            return False
        self._last_seq[state.name] = stamp
        self.add_frame(state.name, frame)
        return True

    def add_frame(self, node: str, frame: NodeFrame) -> None:
        t = frame.time
        for gpu in frame.gpus:
            for metric, value in zip(GPU_METRICS, gpu_values(gpu)):
                self._ring(self._gpu, (node, gpu.index, metric)).append(t, value)
        for metric, value in zip(NODE_METRICS, node_values(frame)):
            self._ring(self._node, (node, metric)).append(t, value)

    def _ring(self, table: dict, key: tuple) -> Ring:
        ring = table.get(key)
        if ring is None:
            ring = table[key] = Ring(self.size)
        return ring

    def gpu(self, node: str, index: int, metric: str) -> Optional[Ring]:
        _check_metric(metric, GPU_METRICS)
        return self._gpu.get((node, index, metric))

    def node(self, node: str, metric: str) -> Optional[Ring]:
        _check_metric(metric, NODE_METRICS)
        return self._node.get((node, metric))

    def nodes(self) -> List[str]:
        return sorted({key[0] for key in self._node})


def _check_metric(metric: str, known: Sequence[str]) -> None:
    if metric not in known:
        raise KeyError("unknown history metric %r (known: %s)" % (metric, ", ".join(known)))


def sparkline(values: Sequence[Optional[float]], width: int, low: float = 0.0, high: Optional[float] = None) -> str:
    """The last `width` values as block characters; a gap where a value is missing.

    `high` None scales to the largest value shown (at least `low` + 1, so a flat
    zero line stays at the bottom rather than jumping to the top).
    """
    if width <= 0:
        return ""
    shown = list(values[-width:])
    known = [v for v in shown if v is not None]
    top = high if high is not None else max(known + [low + 1.0])
    span = top - low if top > low else 1.0
    chars = []
    for v in shown:
        if v is None:
            chars.append(_NO_DATA)
            continue
        level = (min(max(v, low), top) - low) / span
        chars.append(_BLOCKS[min(len(_BLOCKS) - 1, int(level * (len(_BLOCKS) - 1) + 0.5))])
    return _NO_DATA * (width - len(chars)) + "".join(chars)
