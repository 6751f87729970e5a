"""Frames are validated where they enter: hostile lines are bad frames, never tracebacks, hangs or GBs.

Regression tests for the reported defects (a string where a number belongs, 10**400, NaN,
deep nesting, 800k GPUs, snapshot printing NaN), the line cap, the node's state after a bad
frame, and fuzzers that put arbitrary JSON-ish values into real keyframes and deltas.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import math
from dataclasses import replace
from typing import Any, List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsconsole.config import Config, ConsoleConfig, NodeConfig
from opsconsole.model import (
    BAD_FRAME,
    STATE_DOWN,
    STATE_STALE,
    STATE_UP,
    DiskUsage,
    FrameError,
    GpuSample,
    HostSample,
    NetRate,
    NodeFrame,
    NodeState,
    ProcessSample,
    _annotation_text,  # the annotations as text, on any Python
    checked,
    checked_after,
    from_wire,
)
from opsconsole.nodes.fleet import Fleet
from opsconsole.nodes.line_split import LineSplitter
from opsconsole.nodes.local import LocalLink
from opsconsole.probe.wire_delta import DeltaEncoder, StreamDecoder
from opsconsole.snapshot_format import snapshot_json, snapshot_table
from tests.test_wire_delta import real_wire

GUARD_S = 20.0  # only so a broken link fails the test instead of hanging it


def keyframe_line(wire: dict) -> str:
    return DeltaEncoder().encode_wire(copy.deepcopy(wire))


def decoder_after_keyframe(wire: dict) -> StreamDecoder:
    decoder = StreamDecoder()
    frame, why = decoder.decode_line(keyframe_line(wire))
    assert frame is not None and why is None
    return decoder


def delta_line(base: dict, delta_body: dict) -> str:
    delta = {"delta": 1, "base": base["seq"], "f": {"seq": base["seq"] + 1}}
    delta.update(delta_body)
    return json.dumps(delta)


# --- the reported defects, one by one ------------------------------------------------------------


def _with_gpu0(**fields: Any) -> str:
    wire = real_wire()
    wire["gpus"][0].update(fields)
    return json.dumps(wire)


@pytest.mark.parametrize(
    "line, reason",
    [
        (_with_gpu0(temperature="hot"), "gpus[0].temperature: expected a number or null, got str"),
        (_with_gpu0(index="0"), "gpus[0].index: expected an integer, got str"),
        (_with_gpu0(index=True), "gpus[0].index: expected an integer, got bool"),
        (_with_gpu0(memory_total=10**400), "gpus[0].memory_total: integer out of range"),
        (_with_gpu0(power_draw_w=10**400), "gpus[0].power_draw_w: integer out of range"),
        (_with_gpu0(errors=["x" * 5000]), "gpus[0].errors[0]: text longer than 4096 characters"),
        (_with_gpu0(xid_events=[79, "79"]), "gpus[0].xid_events[1]: expected an integer, got str"),
        (_with_gpu0(name={"a": 1}), "gpus[0].name: expected text or null, got object"),
        (_with_gpu0(lost=None), "gpus[0].lost: expected true or false, got null"),
        (
            _with_gpu0(temperature=12345.5).replace("12345.5", "1e999"),
            "gpus[0].temperature: not a finite number",
        ),  # read as inf
        (json.dumps(dict(real_wire(), seq=[[[]]])), "seq: expected an integer, got list"),
        (json.dumps(dict(real_wire(), host=[])), "host: expected an object or null, got list"),
        (json.dumps(dict(real_wire(), gpus=[0] * 300)), "gpus: 300 items, at most 256"),
        (json.dumps(dict(real_wire(), gpus=[5])), "gpus[0].expected an object, got int"),
    ],
    ids=lambda value: value[:40] if len(value) < 100 else "line",
)
def test_a_keyframe_with_a_wrong_value_is_a_bad_frame_with_its_reason(line, reason):
    assert reason
    decoder = decoder_after_keyframe(real_wire())
    good = decoder.last
    assert decoder.decode_line(line) == (None, BAD_FRAME + reason)
    assert decoder.last is good and decoder.bad == 1


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused_at_parse(constant):
    line = _with_gpu0(temperature=12345.5).replace("12345.5", constant)
    frame, why = StreamDecoder().decode_line(line)
    assert frame is None and why == BAD_FRAME + "not JSON (%s is not a number JSON allows)" % constant


def test_deep_nesting_is_a_bad_frame_not_a_recursion_error():
    deep = "[" * 100000 + "]" * 100000
    decoder = decoder_after_keyframe(real_wire())
    assert decoder.decode_line('{"node": "n", "time": 1, "gpus": %s}' % deep) == (None, BAD_FRAME + "nested too deeply")
    # The same in the list part after the TAB: the list is empty and the next line says why.
    lines = stream(3)
    decoder = StreamDecoder()
    decoder.decode_line(lines[0])
    frame, _ = decoder.decode_line(lines[1].split("\t")[0] + '\t{"processes": %s, "x": [1]}' % deep)
    assert frame.processes == ()
    frame, why = decoder.decode_line(lines[2])
    assert frame is None and "nested too deeply" in why


def test_eight_hundred_thousand_gpus_are_refused_by_their_count():
    decoder = decoder_after_keyframe(real_wire())
    line = '{"node": "n", "time": 1.0, "gpus": [%s]}' % ",".join(["{}"] * 800000)
    assert decoder.decode_line(line) == (None, BAD_FRAME + "gpus: 800000 items, at most 256")
    wire = real_wire()
    delta = delta_line(wire, {"gpus": [0] * 800000})
    assert decoder.decode_line(delta) == (None, BAD_FRAME + "gpus: 800000 items, at most 256")


@pytest.mark.parametrize(
    "body, reason",
    [
        (
            {"gpus": [{"@": 0, "temperature": "hot"}, 1, 2, 3, 4, 5, 6, 7]},
            "gpus[0].temperature: expected a number or null, got str",
        ),
        (
            {"gpus": [0, {"@": 1, "memory_used": 10**400}, 2, 3, 4, 5, 6, 7]},
            "gpus[1].memory_used: integer out of range",
        ),
        ({"gpus": [0, 1, {"index": "2"}, 3]}, "gpus[2].index: expected an integer, got str"),
        ({"f": {"seq": 5, "probe_ms": "fast"}}, "probe_ms: expected a number or null, got str"),
        ({"f": {"time": 12345.5}}, "time: not a finite number"),  # 1e999 in the line: read as inf
        ({"host": {"@": 0, "load_avg": [1.0, "x"]}}, "host.load_avg[1]: expected a number, got str"),
        (
            {"host": {"@": 0, "disks": [{"path": "/", "total": -1, "used": 0, "free": None}]}},
            "host.disks[0].free: expected an integer, got null",
        ),
        ({"gpus": [0, 0.5]}, "gpus: bad item float"),
    ],
)
def test_a_delta_with_a_wrong_value_is_a_bad_frame_with_its_reason(body, reason):
    wire = real_wire()
    decoder = decoder_after_keyframe(wire)
    good = decoder.last
    line = delta_line(wire, body).replace("12345.5", "1e999")
    assert decoder.decode_line(line) == (None, BAD_FRAME + reason)
    assert decoder.last is good


def test_a_delta_that_only_misses_its_base_is_dropped_not_bad():
    wire = real_wire()
    decoder = decoder_after_keyframe(wire)
    line = json.dumps({"delta": 1, "base": wire["seq"] + 7, "f": {"seq": wire["seq"] + 8}})
    frame, why = decoder.decode_line(line)
    assert frame is None and why.startswith("delta dropped") and decoder.bad == 0


def test_text_that_is_no_frame_is_not_a_bad_frame():
    decoder = decoder_after_keyframe(real_wire())
    assert decoder.decode_line("Traceback (most recent call last):\n") == (None, None)
    assert decoder.decode_line("  warning: NVML not found\n") == (None, None)
    assert decoder.bad == 0


def test_checked_refuses_a_frame_object_built_with_wrong_values():
    good = from_wire(NodeFrame, real_wire())
    assert checked(good) is good
    hostile = replace(good, gpus=(replace(good.gpus[0], temperature=float("nan")),))
    with pytest.raises(FrameError, match=r"gpus\[0\]\.temperature: not a finite number"):
        checked(hostile)
    with pytest.raises(FrameError, match="host.cpu_count: expected an integer, got str"):
        checked(replace(good, host=replace(good.host, cpu_count="2")))


# --- the line cap -------------------------------------------------------------------------------


def test_a_line_over_the_cap_is_dropped_as_it_comes_and_memory_stays_bounded():
    lines: List[str] = []
    too_long: List[int] = []
    splitter = LineSplitter(lines.append, too_long.append, limit=1000)
    splitter.feed('{"a": 1}\n{"b":')
    held = []
    for _ in range(200):  # 200 KB of one line in 1 KB pieces: never held whole
        splitter.feed("x" * 1000)
        held.append(sum(map(len, splitter._parts)))
    splitter.feed('tail}\n{"c": 3}\n{"d"')
    splitter.feed(": 4}\n")
    assert lines == ['{"a": 1}\n', '{"c": 3}\n', '{"d": 4}\n']
    assert too_long == [5 + 200 * 1000 + 6]
    assert max(held) <= 1000
    splitter.feed("w" * 999 + "\n")  # at the cap, newline included: a line
    splitter.feed("y" * 1000 + "\n")  # one over: too long
    splitter.feed("z" * 5)
    splitter.flush()
    assert lines[-2:] == ["w" * 999 + "\n", "zzzzz"] and too_long[-1] == 1001


def test_a_real_eight_gpu_node_with_two_thousand_processes_fits_the_cap_with_margin():
    from opsconsole.nodes.line_split import MAX_LINE_CHARS

    wire = real_wire()
    proc = dict(wire["processes"][0], command="/opt/conda/bin/python -m torch.distributed.run " + "x" * 470)
    wire["processes"] = [dict(proc, pid=1000 + i, gpu_index=i % 8) for i in range(2000)]
    line = keyframe_line(wire)
    assert len(line) * 2 < MAX_LINE_CHARS
    frame, why = StreamDecoder().decode_line(line)
    assert why is None and len(frame.processes) == 2000


# --- a bad frame on a node: the node says so, keeps its last good frame, the others go on --------------


class ScriptedProbe:
    """Returns the frames given, in turn, then the last one again (what a probe factory makes)."""

    def __init__(self, frames: List[Any]) -> None:
        self.frames = list(frames)

    def poll(self) -> Any:
        return self.frames.pop(0) if len(self.frames) > 1 else self.frames[0]


def _node_config(*names: str) -> Config:
    return Config(
        console=ConsoleConfig(interval=0.05), nodes=tuple(NodeConfig(name=name, local=True) for name in names)
    )


async def _run_fleet_until(fleet: Fleet, done) -> dict:
    seen = asyncio.Event()

    def on_change(state: NodeState) -> None:
        if done(fleet.states()):
            seen.set()

    await fleet.start(on_change)
    try:
        await asyncio.wait_for(seen.wait(), GUARD_S)
    finally:
        await fleet.stop()
    return fleet.states()


async def test_a_hostile_frame_from_the_local_link_leaves_its_node_bad_and_the_other_up():
    good = from_wire(NodeFrame, real_wire())
    hostile = replace(good, seq=good.seq + 1, gpus=(replace(good.gpus[0], temperature="hot"),) + good.gpus[1:])
    config = _node_config("bad", "fine")
    links = [
        LocalLink(config.nodes[0], interval=0.05, probe_factory=lambda: ScriptedProbe([good, hostile])),
        LocalLink(config.nodes[1], interval=0.05, probe_factory=lambda: ScriptedProbe([good])),
    ]
    fleet = Fleet(config, links=links, stale_after=60.0)

    def done(states) -> bool:
        return (states["bad"].reason or "").startswith(BAD_FRAME) and states["fine"].state == STATE_UP

    states = await _run_fleet_until(fleet, done)
    bad = states["bad"]
    assert bad.reason == BAD_FRAME + "gpus[0].temperature: expected a number or null, got str"
    assert bad.state == STATE_UP and bad.frame is good  # the last good frame, kept
    assert states["fine"].reason is None and states["fine"].frame is good


def _host_rows(count: int) -> tuple:
    return tuple(
        ProcessSample(pid=100 + i, name="worker", command="python train.py", cpu_percent=1.0) for i in range(count)
    )


def test_rows_held_over_from_the_last_checked_frame_pass_and_new_rows_are_checked_in_place():
    good = from_wire(NodeFrame, real_wire())
    rows = _host_rows(5)
    first = checked(replace(good, top_processes=rows))
    # The probe hands back idle rows as the same objects: kept, and a new row beside them is checked.
    fresh = replace(rows[3], cpu_percent=float("nan"))
    second = replace(good, seq=good.seq + 1, top_processes=rows[:3] + (fresh,) + rows[4:])
    with pytest.raises(FrameError) as caught:
        checked_after(second, first)
    assert str(caught.value) == "top_processes[3].cpu_percent: not a finite number"  # its place in the frame
    third = replace(good, seq=good.seq + 1, top_processes=rows[:3] + (replace(rows[3], cpu_percent=2.5),) + rows[4:])
    assert checked_after(third, first) is third
    # An equal row that is another object is checked like any other (only identity vouches for a row).
    forged = replace(
        good, top_processes=tuple(replace(r, name=r.name) for r in rows[:4]) + (replace(rows[4], pid=-(2**64)),)
    )
    with pytest.raises(FrameError, match=r"top_processes\[4\]\.pid: integer out of range"):
        checked_after(forged, first)
    # Not a frame at all: the full check's answer.
    with pytest.raises(Exception):
        checked_after(object(), first)


async def test_a_row_of_a_failed_frame_is_checked_again_when_the_next_frame_hands_it_back():
    """Only a frame that passed vouches for its rows: a bad row the probe hands back as the same object
    after its frame failed (a first frame failing too) fails again, and the last good frame stays."""
    good = from_wire(NodeFrame, real_wire())
    rows = _host_rows(3)
    bad_row = replace(rows[1], cpu_percent=float("inf"))
    first_bad = replace(good, top_processes=(rows[0], bad_row))
    passed = replace(good, seq=good.seq + 1, top_processes=rows)
    again = replace(good, seq=good.seq + 2, top_processes=rows[:1] + (bad_row,) + rows[2:])
    link = LocalLink(
        NodeConfig(name="n", local=True),
        interval=0.05,
        probe_factory=lambda: ScriptedProbe([first_bad, first_bad, passed, again]),
    )
    why = BAD_FRAME + "top_processes[1].cpu_percent: not a finite number"
    for _ in range(2):  # the first frame fails, and the same frame (the same row objects) again
        state = await link.poll_once(GUARD_S)
        assert (state.state, state.reason, state.frame) == (STATE_DOWN, why, None)
    state = await link.poll_once(GUARD_S)
    assert (state.state, state.reason, state.frame) == (STATE_UP, None, passed)
    state = await link.poll_once(GUARD_S)  # rows 0 and 2 held from the good frame, the failed row back
    assert (state.state, state.reason) == (STATE_UP, why) and state.frame is passed


async def test_a_node_whose_first_frame_is_bad_is_down_with_the_reason():
    link = LocalLink(
        NodeConfig(name="n", local=True),
        interval=0.05,
        probe_factory=lambda: ScriptedProbe([NodeFrame(node="n", time=float("inf"))]),
    )
    state = await link.poll_once(GUARD_S)
    assert state.state == STATE_DOWN and state.reason == BAD_FRAME + "time: not a finite number" and state.frame is None


async def test_a_node_sending_only_bad_frames_goes_stale_still_saying_why():
    good = from_wire(NodeFrame, real_wire())
    config = _node_config("n")
    link = LocalLink(
        config.nodes[0], interval=0.05, probe_factory=lambda: ScriptedProbe([good, replace(good, seq=-(2**64))])
    )
    fleet = Fleet(config, links=[link], stale_after=0.3)
    states = await _run_fleet_until(fleet, lambda s: s["n"].state == STATE_STALE)
    assert states["n"].reason.startswith(BAD_FRAME + "seq: integer out of range (no good frame for")
    assert states["n"].frame is good


# --- snapshot output -------------------------------------------------------------------------------


def test_snapshot_json_is_standard_and_the_table_shows_node_text_as_one_printable_line():
    frame = from_wire(NodeFrame, real_wire())
    frame = replace(
        frame, gpus=(replace(frame.gpus[0], name="H200\x1b]52;c;ZWNobw==\x07\nforged"),), errors=("boom\x1b[2J",)
    )
    state = NodeState(
        name="gpu\x1b[31m01",
        state=STATE_UP,
        frame=frame,
        received_at=1.0,
        rtt_ms=float("nan"),
        reason=BAD_FRAME + "gpus[0].name: \x1b[2J",
    )
    text = snapshot_json([state], now=2.0)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["nodes"][0]["rtt_ms"] is None
    table = snapshot_table([state], now=2.0)
    assert "\x1b" not in table and "\x07" not in table
    assert len(table.splitlines()) == 4  # header, bad-frame reason, one GPU, one error: no forged line


# --- fuzzing ----------------------------------------------------------------------------------------

_WIRE = real_wire()
_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**60, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.just("x" * 5000),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_FIELD_TYPES = {
    cls: {f.name: _annotation_text(f.type) for f in dataclasses.fields(cls)}  # "Optional[int]", ...
    for cls in (NodeFrame, HostSample, GpuSample, ProcessSample, DiskUsage, NetRate)
}
_NESTED = {
    "host": HostSample,
    "gpus": GpuSample,
    "processes": ProcessSample,
    "top_processes": ProcessSample,
    "disks": DiskUsage,
    "net": NetRate,
}


def _holds(value: Any, annotation: str) -> bool:
    if annotation.startswith("Optional["):
        return value is None or _holds(value, annotation[len("Optional[") : -1])
    if annotation.startswith("Tuple["):
        element = annotation[len("Tuple[") : -len(", ...]")]
        return type(value) is tuple and all(_holds(item, element) for item in value)
    if annotation == "int":
        return type(value) is int and abs(value) < 2**63
    if annotation == "float":
        return type(value) in (int, float) and math.isfinite(value) and abs(value) < 2**1024
    if annotation == "str":
        return type(value) is str
    if annotation == "bool":
        return type(value) is bool
    cls = {c.__name__: c for c in _FIELD_TYPES}[annotation]
    return isinstance(value, cls) and _well_typed(value)


def _well_typed(obj: Any) -> bool:
    """Every field of `obj` (a decoded frame or part) holds what its annotation says, all the way down."""
    base = next(c for c in type(obj).__mro__ if c in _FIELD_TYPES)
    return all(_holds(getattr(obj, name), annotation) for name, annotation in _FIELD_TYPES[base].items())


def _decode_all(decoder: StreamDecoder, line: str) -> None:
    """Decode `line`: a well-typed frame (lists read too) or a reason; any exception fails the test."""
    frame, why = decoder.decode_line(line)
    if frame is None:
        assert why is None or isinstance(why, str)
        return
    frame.processes, frame.top_processes, frame.host and frame.host.cpu_per_core  # the lazy parts
    assert _well_typed(frame)


_PLACES = st.sampled_from(["frame", "host", "gpu", "process", "top_process", "disk", "net"])


def _place(wire: dict, where: str, key: str, value: Any) -> None:
    paths = {
        "frame": (),
        "host": ("host",),
        "gpu": ("gpus", 3),
        "process": ("processes", 1),
        "top_process": ("top_processes", 2),
        "disk": ("host", "disks", 0),
        "net": ("host", "net", 0),
    }
    target: Any = wire
    for step in paths[where]:
        try:
            target = target[step]
        except (KeyError, IndexError, TypeError):
            return  # an earlier step replaced what held it
    if type(target) is dict:
        target[key] = value


def _field_names(where: str) -> st.SearchStrategy:
    cls = {
        "frame": NodeFrame,
        "host": HostSample,
        "gpu": GpuSample,
        "process": ProcessSample,
        "top_process": ProcessSample,
        "disk": DiskUsage,
        "net": NetRate,
    }[where]
    return st.sampled_from(sorted(_FIELD_TYPES[cls]) + ["unknown_field"])


@settings(max_examples=120)
@given(st.data())
def test_fuzz_hostile_values_in_a_real_keyframe_decode_well_typed_or_bad(data):
    wire = copy.deepcopy(_WIRE)
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(_PLACES)
        _place(wire, where, data.draw(_field_names(where)), data.draw(_JSONISH))
    try:
        line = DeltaEncoder().encode_wire(wire)
    except (ValueError, TypeError):  # what json.dumps itself refuses never reaches a node's line
        return
    _decode_all(StreamDecoder(), line)


@settings(max_examples=120)
@given(st.data())
def test_fuzz_hostile_values_in_real_deltas_decode_well_typed_or_bad(data):
    wire = copy.deepcopy(_WIRE)
    encoder, decoder = DeltaEncoder(keyframe_every=1000), StreamDecoder()
    _decode_all(decoder, encoder.encode_wire(copy.deepcopy(wire)))
    for _ in range(data.draw(st.integers(1, 3))):
        new = copy.deepcopy(wire)
        new["seq"] = new["seq"] + 1 if type(new.get("seq")) is int else 7  # an earlier step may have spoilt it
        where = data.draw(_PLACES)
        _place(new, where, data.draw(_field_names(where)), data.draw(_JSONISH))
        try:
            line = encoder.encode_wire(new)
        except (ValueError, TypeError):
            return
        _decode_all(decoder, line)
        wire = new


@settings(max_examples=80)
@given(st.data())
def test_fuzz_hostile_delta_items_and_shapes_decode_well_typed_or_bad(data):
    decoder = decoder_after_keyframe(_WIRE)
    body = data.draw(
        st.dictionaries(
            st.sampled_from(["f", "host", "gpus", "processes", "top_processes", "delta", "base", "x"]),
            _JSONISH
            | st.lists(
                st.integers(-2, 9)
                | st.fixed_dictionaries(
                    {"@": st.integers(-1, 8)},
                    optional={"temperature": _JSONISH, "index": _JSONISH, "pid": _JSONISH, "name": _JSONISH},
                ),
                max_size=10,
            ),
            max_size=4,
        )
    )
    delta = {"delta": 1, "base": _WIRE["seq"], "f": {"seq": _WIRE["seq"] + 1}}
    delta.update(body)
    _decode_all(decoder, json.dumps(delta))


@settings(max_examples=80)
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_fuzz_random_lines_are_frames_bad_frames_or_no_frames(raw):
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    decoder = decoder_after_keyframe(_WIRE)
    for line in ("{" + text, text, keyframe_line(_WIRE)[: len(text)] + text):
        _decode_all(decoder, line)


def stream(count: int) -> List[str]:
    from tests.test_wire_delta import stream_lines

    return stream_lines(count, keyframe_every=100)[0]
