"""History ring buffers and sparklines, fed with frames derived from the real H200 capture."""

import json
from dataclasses import replace

import pytest

from opsconsole.history import GPU_METRICS, History, Ring, sparkline
from opsconsole.model import STATE_UP, NodeFrame, NodeState, from_wire
from tests.conftest import FIXTURES


def h200_frame() -> NodeFrame:
    return from_wire(NodeFrame, json.loads((FIXTURES / "h200_frame.json").read_text()))


@pytest.mark.parametrize(
    "size, pushed, expected",
    [
        (3, [], []),
        (3, [1, 2], [1, 2]),
        (3, [1, 2, 3], [1, 2, 3]),
        (3, [1, 2, 3, 4, 5], [3, 4, 5]),
        (1, [7, 8], [8]),
        (4, [1, None, 3], [1, None, 3]),
    ],
)
def test_ring_keeps_the_newest_size_values_oldest_first(size, pushed, expected):
    ring = Ring(size)
    for t, value in enumerate(pushed):
        ring.append(float(t), value)
    assert ring.values() == expected
    assert len(ring) == len(expected)
    assert ring.latest() == (expected[-1] if expected else None)


def test_ring_points_and_since_carry_times():
    ring = Ring(3)
    for t in range(5):
        ring.append(100.0 + t, t * 10)
    assert ring.points() == [(102.0, 20), (103.0, 30), (104.0, 40)]
    assert ring.since(103.0) == [(103.0, 30), (104.0, 40)]


def test_ring_refuses_size_zero():
    with pytest.raises(ValueError):
        Ring(0)


def test_history_takes_each_frame_once_and_stays_bounded():
    frame = h200_frame()
    history = History(size=4)
    gpu = frame.gpus[0]
    for seq in range(10):
        changed = replace(frame, seq=seq, time=frame.time + seq, gpus=(replace(gpu, utilization_gpu=float(seq * 10)),))
        state = NodeState(name="gpu01", state=STATE_UP, frame=changed)
        assert history.observe(state) is True
        assert history.observe(state) is False  # the same frame again: a redraw, not a sample
    util = history.gpu("gpu01", gpu.index, "utilization")
    assert util.values() == [60.0, 70.0, 80.0, 90.0]
    temp = history.gpu("gpu01", gpu.index, "temperature")
    assert temp.values() == [gpu.temperature] * 4
    memory = history.gpu("gpu01", gpu.index, "memory_percent").latest()
    assert memory == pytest.approx(100.0 * gpu.memory_used / gpu.memory_total)
    assert history.node("gpu01", "gpu_utilization").latest() == 90.0
    assert history.node("gpu01", "power_w").latest() == pytest.approx(gpu.power_draw_w)
    assert history.nodes() == ["gpu01"]


def test_history_lost_gpu_is_left_out_of_node_means():
    frame = h200_frame()
    gpu = frame.gpus[0]
    frame = replace(
        frame, gpus=(replace(gpu, utilization_gpu=80.0), replace(gpu, index=1, lost=True, utilization_gpu=None))
    )
    history = History()
    history.observe(NodeState(name="n", state=STATE_UP, frame=frame))
    assert history.node("n", "gpu_utilization").latest() == 80.0
    assert history.gpu("n", 1, "utilization").values() == [None]


def test_history_unknown_metric_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown history metric"):
        History().gpu("n", 0, "utilisation")
    assert "utilization" in GPU_METRICS


@pytest.mark.parametrize(
    "values, width, high, expected",
    [
        ([0, 50, 100], 3, 100, "▁▅█"),
        ([0, 0, 0], 3, None, "▁▁▁"),
        ([100], 4, 100, "   █"),
        ([10, None, 10], 3, 10, "█ █"),
        ([1, 2, 3, 4, 5, 6], 2, 6, "▇█"),
        ([], 3, None, "   "),
        ([150, -5], 2, 100, "█▁"),
    ],
)
def test_sparkline(values, width, high, expected):
    assert sparkline(values, width, high=high) == expected
