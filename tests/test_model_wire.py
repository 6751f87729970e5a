"""The wire form: real frames round-trip, unknown keys are ignored, bad input is refused."""

import json

import pytest

from opsconsole.model import (
    STATE_DOWN,
    GpuSample,
    HostSample,
    NodeFrame,
    NodeState,
    ProcessSample,
    from_wire,
    to_wire,
)
from tests.conftest import FIXTURES


@pytest.fixture
def real_frame() -> dict:
    return json.loads((FIXTURES / "h200_frame.json").read_text())


def test_real_h200_frame_round_trips(real_frame):
    frame = from_wire(NodeFrame, real_frame)
    again = from_wire(NodeFrame, json.loads(json.dumps(to_wire(frame))))
    assert again == frame
    assert frame.gpus[0].name == "NVIDIA H200"
    assert isinstance(frame.gpus[0], GpuSample)
    assert isinstance(frame.host, HostSample)
    assert all(isinstance(p, ProcessSample) for p in frame.processes)
    assert isinstance(frame.gpus[0].clock_event_reasons, tuple)


def test_decoded_objects_behave_like_constructed_ones(real_frame):
    gpu_wire = real_frame["gpus"][0]
    decoded = from_wire(GpuSample, gpu_wire)
    built = GpuSample(**{k: tuple(v) if isinstance(v, list) else v for k, v in gpu_wire.items()})
    assert decoded == built and hash(decoded) == hash(built)
    with pytest.raises(AttributeError):
        decoded.index = 5  # still frozen


def test_unknown_keys_from_a_newer_probe_are_ignored(real_frame):
    real_frame["gpus"][0]["nvlink_bandwidth"] = 123
    real_frame["future_section"] = {"x": 1}
    frame = from_wire(NodeFrame, real_frame)
    assert not hasattr(frame.gpus[0], "nvlink_bandwidth")


def test_defaults_fill_missing_optional_fields():
    frame = from_wire(NodeFrame, {"node": "n1", "time": 1.0})
    assert frame.gpus == () and frame.host is None and frame.errors == ()


@pytest.mark.parametrize(
    "data, message",
    [
        ({"time": 1.0}, "NodeFrame: missing field 'node'"),
        ([1, 2], "NodeFrame: expected an object, got list"),
        ({"node": "n", "time": 1.0, "host": "x"}, "host: expected an object or null, got str"),
        (
            {"node": "n", "time": 1.0, "gpus": [{"index": 0, "temperature": "hot"}]},
            r"gpus\[0\]\.temperature: expected a number or null, got str",
        ),
    ],
)
def test_malformed_frames_are_refused_with_a_clear_message(data, message):
    with pytest.raises(ValueError, match=message):
        from_wire(NodeFrame, data)


def test_node_state_keeps_its_last_frame_over_the_wire(real_frame):
    state = NodeState(
        name="gpu01",
        state=STATE_DOWN,
        reason="connection refused",
        frame=from_wire(NodeFrame, real_frame),
        received_at=10.0,
    )
    assert from_wire(NodeState, to_wire(state)) == state
    assert state.age(12.5) == 2.5
