"""Keyframe + delta stream: encoder and decoder together, on mutated real H200 frames and the real agent."""

from __future__ import annotations

import ast
import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from opsconsole.model import NodeFrame, from_wire, to_wire
from opsconsole.probe import wire_delta
from opsconsole.probe.agent import Probe
from opsconsole.probe.wire_delta import (
    DeltaEncoder,
    DeltaError,
    StreamDecoder,
    apply_delta,
    delta_of,
    round_wire,
    rounded_wire,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "h200_frame.json"
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def real_wire() -> dict:
    """The real H200 frame (1 GPU, 1 GPU process, 30 top processes) widened to 8 GPUs, rounded."""
    wire = json.loads(FIXTURE.read_text())
    first = wire["gpus"][0]
    wire["gpus"] = [dict(first, index=i, uuid=first["uuid"][:-2] + "%02x" % i) for i in range(8)]
    proc = wire["processes"][0]
    wire["processes"] = [
        dict(proc, pid=proc["pid"] + i, gpu_index=i, gpu_uuid=wire["gpus"][i]["uuid"]) for i in range(8)
    ]
    return round_wire(wire)


class Mutator:
    """Moves a wire frame on by one tick with random changes of every kind the stream must carry."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.spare_host = None
        self.next_pid = 90000

    def step(self, wire: dict) -> dict:
        rng = self.rng
        new = copy.deepcopy(wire)
        new["seq"] += 1
        new["time"] += 1.0 + rng.random() / 100
        new["probe_ms"] = rng.randint(100, 9000) / 100.0
        for gpu in new["gpus"]:
            if rng.random() < 0.8:
                gpu["utilization_gpu"] = float(rng.randint(0, 100))
                gpu["memory_used"] = rng.randint(0, gpu["memory_total"] or 1)
                gpu["power_draw_w"] = rng.randint(60000, 700000) / 1000.0
                gpu["energy_j"] = (gpu["energy_j"] or 0) + rng.randint(0, 700000) / 1000.0
                gpu["clock_sm_mhz"] = rng.choice((345, 1410, 1755, 1980))
            if rng.random() < 0.2:
                gpu["temperature"] = float(rng.randint(30, 80))
            if rng.random() < 0.05:
                gpu["clock_event_reasons"] = rng.choice(([], ["SwPowerCap"], ["HwSlowdown", "SwThermalSlowdown"]))
            if rng.random() < 0.03:
                gpu["lost"] = not gpu["lost"]
                gpu["errors"] = ["utilization: GPU is lost"] if gpu["lost"] else []
            if rng.random() < 0.02:
                gpu["xid_events"] = [79]
            if rng.random() < 0.02:  # same value, other type: the console must see 55 become 55.0
                gpu["temperature"] = (
                    int(gpu["temperature"]) if type(gpu["temperature"]) is float else float(gpu["temperature"])
                )
        if rng.random() < 0.05 and len(new["gpus"]) > 1:
            del new["gpus"][rng.randrange(len(new["gpus"]))]  # a GPU fell off the bus
        if rng.random() < 0.05:
            top = max(g["index"] for g in new["gpus"]) + 1 if new["gpus"] else 0
            new["gpus"].append(dict(wire["gpus"][0] if wire["gpus"] else real_wire()["gpus"][0], index=top))
        if rng.random() < 0.05:
            rng.shuffle(new["gpus"])
        self._processes(new["processes"], gpu=True)
        self._processes(new["top_processes"], gpu=False)
        host = new["host"]
        if host is not None:
            host["cpu_per_core"] = [
                rng.randint(0, 1000) / 10.0 if rng.random() < 0.6 else v for v in host["cpu_per_core"]
            ]
            host["cpu_percent"] = rng.randint(0, 1000) / 10.0
            host["mem_used"] += rng.randint(-100, 100) * 4096
            host["net"][0]["rx_bytes_per_s"] = float(rng.randint(0, 10**9))
            if rng.random() < 0.1:
                host["disks"].append(dict(host["disks"][0], path="/scratch%d" % rng.randint(0, 9)))
        if rng.random() < 0.05:
            self.spare_host, new["host"] = new["host"], self.spare_host  # host readings fail, then come back
        if rng.random() < 0.1:
            new["errors"] = [] if new["errors"] else ["host: PermissionError: /proc/stat", "procs: boom"]
        if rng.random() < 0.03:
            new["gpu_note"] = None if new["gpu_note"] else "NVML: driver not loaded"
        return new

    def _processes(self, procs: list, gpu: bool) -> None:
        rng = self.rng
        for proc in procs:
            if rng.random() < 0.7:
                proc["cpu_percent"] = rng.randint(0, 1000) / 10.0
                proc["elapsed_s"] = (proc["elapsed_s"] or 0) + 1.0
            if gpu and rng.random() < 0.3:
                proc["gpu_memory_bytes"] = rng.randint(0, 2**34)
        if procs and rng.random() < 0.2:
            del procs[rng.randrange(len(procs))]
        if rng.random() < 0.2:
            self.next_pid += 1
            template = dict(procs[0]) if procs else {"pid": 0, "name": "x", "command": "x"}
            template.update(pid=self.next_pid, name="new%d" % self.next_pid, cpu_percent=1.5)
            if gpu:
                template["gpu_index"] = rng.randint(0, 7)
            procs.insert(rng.randint(0, len(procs)), template)
        if not gpu and rng.random() < 0.5:
            procs.sort(key=lambda p: -(p["cpu_percent"] or 0))


def exact(frame) -> str:
    # repr shows types too: 55 and 55.0 compare equal but are not the same reading.
    return repr(frame)


@pytest.mark.parametrize("seed", range(12))
def test_random_sequences_decode_to_the_full_frames(seed):
    mutate = Mutator(seed)
    encoder = DeltaEncoder(keyframe_every=random.Random(seed).choice((1, 3, 7, 30, 1000)))
    decoder = StreamDecoder()
    wire = real_wire()
    for _ in range(60):
        line = encoder.encode_wire(copy.deepcopy(wire))
        frame, dropped = decoder.decode_line(line + "\n")
        assert dropped is None
        expected = from_wire(NodeFrame, json.loads(json.dumps(wire)))
        assert frame == expected
        assert exact(frame) == exact(expected)
        wire = round_wire(mutate.step(wire))
    assert decoder.dropped == 0
    assert decoder.keyframes == encoder.keyframes and decoder.deltas == encoder.deltas
    if encoder.keyframe_every > 1:
        assert encoder.deltas > encoder.keyframes


def test_deltas_are_much_shorter_than_keyframes():
    mutate = Mutator(99)
    encoder = DeltaEncoder(keyframe_every=1000)
    wire = real_wire()
    keyframe = encoder.encode_wire(wire)
    delta = encoder.encode_wire(round_wire(mutate.step(wire)))
    assert not keyframe.startswith('{"delta"') and delta.startswith('{"delta":1,')
    assert len(delta) < len(keyframe) / 2


def test_unchanged_objects_are_the_same_objects():
    wire = real_wire()
    encoder, decoder = DeltaEncoder(), StreamDecoder()
    first, _ = decoder.decode_line(encoder.encode_wire(wire))
    new = copy.deepcopy(wire)
    new["seq"] += 1
    new["gpus"][3]["utilization_gpu"] = 12.0
    new["top_processes"][5]["cpu_percent"] = 77.7
    new["top_processes"][0], new["top_processes"][1] = new["top_processes"][1], new["top_processes"][0]
    second, _ = decoder.decode_line(encoder.encode_wire(new))
    assert second == from_wire(NodeFrame, new)
    assert second.host is first.host
    assert second.processes is first.processes  # the whole tuple: nothing in it changed
    assert [a is b for a, b in zip(second.gpus, first.gpus)] == [i != 3 for i in range(8)]
    assert second.gpus[3].utilization_gpu == 12.0 and first.gpus[3].utilization_gpu != 12.0
    assert second.top_processes[0] is first.top_processes[1] and second.top_processes[1] is first.top_processes[0]
    assert second.top_processes[5] is not first.top_processes[5]
    assert all(second.top_processes[i] is first.top_processes[i] for i in range(2, 30) if i != 5)


def test_a_delta_carries_only_what_changed():
    wire = real_wire()
    new = copy.deepcopy(wire)
    new["seq"] += 1
    new["gpus"][2]["power_draw_w"] = 123.45
    delta = delta_of(wire, new)
    assert delta == {
        "delta": 1,
        "base": wire["seq"],
        "f": {"seq": wire["seq"] + 1},
        "gpus": [0, 1, {"power_draw_w": 123.45, "@": 2}, [3, 5]],
    }


def test_rounding_makes_noise_below_the_precision_unchanged():
    wire = real_wire()
    new = copy.deepcopy(wire)
    new["seq"] += 1
    new["gpus"][0]["power_draw_w"] += 0.0004  # below 0.01 W
    new["gpus"][0]["energy_j"] += 0.0001  # below 0.001 J
    new["host"]["cpu_per_core"][0] += 0.04  # below 0.1 %
    delta = delta_of(wire, round_wire(new))
    assert "gpus" not in delta and "host" not in delta
    rounded = round_wire(
        {
            "gpus": [{"power_draw_w": 690.70649, "energy_j": 1.23456, "utilization_gpu": 98.26}],
            "host": {"cpu_per_core": [26.83, 0.0], "load_avg": [0.4712]},
            "probe_ms": 1.23456,
        }
    )
    assert rounded["gpus"][0] == {"power_draw_w": 690.71, "energy_j": 1.235, "utilization_gpu": 98.3}
    assert rounded["host"] == {"cpu_per_core": [26.8, 0.0], "load_avg": [0.47]} and rounded["probe_ms"] == 1.23


def stream_lines(count: int, keyframe_every: int, seed: int = 5):
    mutate, encoder, wire = Mutator(seed), DeltaEncoder(keyframe_every), real_wire()
    lines, wires = [], []
    for _ in range(count):
        lines.append(encoder.encode_wire(copy.deepcopy(wire)))
        wires.append(json.loads(json.dumps(wire)))
        wire = round_wire(mutate.step(wire))
    return lines, wires


def test_a_missing_delta_drops_the_chain_until_the_next_keyframe():
    lines, wires = stream_lines(12, keyframe_every=5)  # keyframes at 0, 5, 10
    decoder = StreamDecoder()
    results = [decoder.decode_line(line) for i, line in enumerate(lines) if i != 2]  # line 2 lost
    kept = [i for i in range(12) if i != 2]
    for i, (frame, dropped) in zip(kept, results):
        if i in (3, 4):
            assert frame is None and "the last frame is seq %d" % wires[1]["seq"] in dropped
            assert dropped.endswith("waiting for a keyframe")
        else:
            assert dropped is None and frame == from_wire(NodeFrame, wires[i])
    assert decoder.dropped == 2


def test_an_undecodable_line_is_a_bad_frame_and_the_next_delta_is_dropped():
    lines, wires = stream_lines(8, keyframe_every=4)
    decoder = StreamDecoder()
    assert decoder.decode_line(lines[0])[0] == from_wire(NodeFrame, wires[0])
    assert decoder.decode_line(lines[1][: len(lines[1]) // 2]) == (None, "bad frame: cut short")  # cut in half
    assert decoder.decode_line(lines[1].split("\t")[0][:100])[1].startswith("bad frame: not JSON (")
    assert decoder.last == from_wire(NodeFrame, wires[0]) and decoder.bad == 2
    frame, dropped = decoder.decode_line(lines[2])
    assert frame is None and "delta on seq %d" % wires[1]["seq"] in dropped
    assert decoder.decode_line(lines[3])[0] is None
    assert decoder.decode_line(lines[4]) == (from_wire(NodeFrame, wires[4]), None)  # the keyframe
    assert decoder.decode_line(lines[5]) == (from_wire(NodeFrame, wires[5]), None)
    assert decoder.decode_line("Traceback (most recent call last):\n") == (None, None)


def test_a_delta_before_any_keyframe_is_dropped():
    lines, _ = stream_lines(3, keyframe_every=30)
    frame, dropped = StreamDecoder().decode_line(lines[1])
    assert frame is None and "delta before any keyframe" in dropped


@pytest.mark.parametrize(
    "change, message",
    [
        ({"delta": 2}, "unknown delta format 2"),
        ({"gpus": [0, 99]}, "gpus: no item 99"),
        ({"gpus": [-1]}, "gpus: no item -1"),
        ({"gpus": [{"@": 42, "utilization_gpu": 1.0}]}, "gpus: no item 42"),
        ({"gpus": "0,1"}, "gpus: expected a list"),
        ({"top_processes": [True]}, "top_processes: bad item True"),
        ({"host": 5}, "host: expected an object"),
        ({"f": [1]}, "bad top-level fields"),
        ({"f": {"gpus": []}}, "bad top-level fields"),
        ({"gpus": [{"name": "no index"}]}, "missing field 'index'"),
        ({"gpus": [[0, 99]]}, "gpus: bad run"),
        ({"gpus": [[-1, 2]]}, "gpus: bad run"),
        ({"gpus": [[0]]}, "gpus: bad run"),
        ({"gpus": [[0, 0]]}, "gpus: bad run"),
        ({"gpus": [[0, True]]}, "gpus: bad run"),
        ({"gpus": [[0, 2, 3]]}, "gpus: bad run"),
        ({"gpus": [[0, 8]] * 40}, "gpus: 320 items, at most 256"),  # runs cannot make a list past its bound
    ],
)
def test_a_bad_delta_is_rejected_with_its_reason(change, message):
    base = from_wire(NodeFrame, real_wire())
    delta = {"delta": 1, "base": base.seq, "f": {"seq": base.seq + 1}}
    delta.update(change)
    with pytest.raises(DeltaError, match=message.replace("(", r"\(")):
        apply_delta(base, delta)


def test_host_changes_to_a_missing_host_are_rejected():
    base = from_wire(NodeFrame, dict(real_wire(), host=None))
    with pytest.raises(DeltaError, match="host: changes to a host"):
        apply_delta(base, {"delta": 1, "base": base.seq, "f": {}, "host": {"@": 0, "cpu_percent": 1.0}})


def test_the_encoder_sends_a_keyframe_when_a_delta_cannot_be_made():
    wire = real_wire()
    encoder = DeltaEncoder(keyframe_every=100)
    encoder.encode_wire(wire)
    same_seq = copy.deepcopy(wire)  # a seq that does not move would hide a lost line
    assert not encoder.encode_wire(same_seq).startswith('{"delta"')
    other = copy.deepcopy(wire)
    other["seq"] += 1
    other["new_field_of_a_newer_probe"] = 1
    assert not encoder.encode_wire(other).startswith('{"delta"')
    broken = copy.deepcopy(other)
    broken["seq"] += 1
    broken["gpus"] = "not a list"
    assert not encoder.encode_wire(broken).startswith('{"delta"')
    assert encoder.keyframes == 4 and encoder.deltas == 0
    encoder.force_keyframe()
    assert not encoder.encode_wire(dict(broken, seq=broken["seq"] + 1)).startswith('{"delta"')


def test_real_probe_frames_round_trip_through_the_encoder():
    probe = Probe(node_name="delta-node", top=10, gpu_reader=None)
    probe.prime(0.05)
    encoder, decoder = DeltaEncoder(keyframe_every=4), StreamDecoder()
    try:
        for _ in range(6):
            frame = probe.poll()
            decoded, dropped = decoder.decode_line(encoder.encode(frame))
            assert dropped is None
            expected = from_wire(NodeFrame, json.loads(json.dumps(rounded_wire(frame))))
            assert decoded == expected and exact(decoded) == exact(expected)
    finally:
        probe.close()
    assert encoder.deltas == 4 and encoder.keyframes == 2


def test_agent_with_delta_streams_a_keyframe_then_deltas():
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "opsconsole.probe.agent",
            "--interval",
            "0.1",
            "--delta",
            "--keyframe-every",
            "4",
            "--top",
            "5",
            "--node-name",
            "delta-agent",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=ENV,
        text=True,
    )
    try:
        lines = [agent.stdout.readline() for _ in range(9)]
    finally:
        agent.terminate()
        agent.wait(timeout=10)
    kinds = ["delta" if line.startswith('{"delta":1,') else "key" for line in lines]
    assert kinds == ["key", "delta", "delta", "delta"] * 2 + ["key"]
    decoder = StreamDecoder()
    frames = []
    for line in lines:
        frame, dropped = decoder.decode_line(line)
        assert dropped is None and frame is not None
        frames.append(frame)
    assert [f.seq for f in frames] == list(range(1, 10))
    assert all(f.node == "delta-agent" and f.host is not None for f in frames)
    assert all(f.host.cpu_count == os.cpu_count() for f in frames)
    assert all(len(f.host.cpu_per_core) == os.cpu_count() for f in frames[1:])  # the first has no CPU baseline yet
    assert all(a.time < b.time for a, b in zip(frames, frames[1:]))
    # What the deltas built matches what the next keyframe says of the things that do not move.
    built, keyframe = frames[7], frames[8]
    assert (built.host.hostname, built.host.mem_total, built.driver_version, built.gpu_source) == (
        keyframe.host.hostname,
        keyframe.host.mem_total,
        keyframe.driver_version,
        keyframe.gpu_source,
    )
    for frame in frames:  # every decoded frame is what its own full wire form decodes to
        assert from_wire(NodeFrame, json.loads(json.dumps(to_wire(frame)))) == frame


def test_plain_agent_lines_stay_full_frames():
    agent = subprocess.run(
        [sys.executable, "-m", "opsconsole.probe.agent", "--once", "--top", "3"],
        capture_output=True,
        cwd=ROOT,
        env=ENV,
        text=True,
        timeout=30,
    )
    assert agent.returncode == 0
    assert "delta" not in json.loads(agent.stdout)


def test_wire_delta_is_python_38_and_stdlib_only():
    source = Path(wire_delta.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "dataclasses", "json", "typing", "opsconsole"}


# --- process lists after a TAB, decoded when first read -----------------------------------


def test_process_lists_and_host_cores_travel_after_a_tab_and_nothing_else_does():
    wire = real_wire()
    wire["top_processes"][0]["command"] = "python3 -c 'print(1)'\t--tabbed [x]}"  # a TAB and "]}" inside a string
    encoder = DeltaEncoder(keyframe_every=10)
    keyframe = encoder.encode_wire(copy.deepcopy(wire))
    new = copy.deepcopy(wire)
    new["seq"] += 1
    new["top_processes"][3]["cpu_percent"] = 12.5
    new["gpus"][1]["utilization_gpu"] = 3.0
    delta = encoder.encode_wire(new)
    for line, processes in ((keyframe, wire["processes"]), (delta, None)):
        main, lazy = line.split("\t")  # exactly one TAB: JSON escapes the one in the command
        assert "processes" not in json.loads(main) and "top_processes" not in json.loads(main)
        assert "cpu_per_core" not in (json.loads(main).get("host") or {})
        assert set(json.loads(lazy)) <= {"cpu_per_core", "processes", "top_processes"}
    assert json.loads(keyframe.split("\t")[1])["processes"] == wire["processes"]
    assert keyframe.split("\t")[1].startswith('{"cpu_per_core":')  # first: the decoder knows it is there
    assert json.loads(keyframe.split("\t")[1])["cpu_per_core"] == wire["host"]["cpu_per_core"]
    assert set(json.loads(keyframe.split("\t")[0])["host"]) == set(wire["host"]) - {"cpu_per_core"}
    assert json.loads(delta.split("\t")[1]) == {"top_processes": [[0, 3], {"cpu_percent": 12.5, "@": 3}, [4, 26]]}
    unchanged = copy.deepcopy(new)
    unchanged["seq"] += 1
    unchanged["gpus"][2]["utilization_gpu"] = 4.0
    assert "\t" not in encoder.encode_wire(unchanged)  # no list changed: no TAB, a plain delta
    plain = DeltaEncoder(keyframe_every=10, split=False)
    assert "\t" not in plain.encode_wire(copy.deepcopy(wire))
    decoder = StreamDecoder()
    for line, expected in ((keyframe, wire), (delta, new)):
        frame, dropped = decoder.decode_line(line + "\n")
        assert dropped is None and frame == from_wire(NodeFrame, json.loads(json.dumps(expected)))
    assert frame.top_processes[0].command.endswith("\t--tabbed [x]}")


def test_process_lists_are_decoded_only_when_read_and_then_once():
    lines, wires = stream_lines(12, keyframe_every=100)
    decoder = StreamDecoder()
    frames = [decoder.decode_line(line)[0] for line in lines]
    last = frames[-1]
    assert isinstance(last, wire_delta.LazyListsFrame)
    assert "processes" not in vars(last) and "top_processes" not in vars(last)  # nothing read yet
    assert last.gpus == from_wire(NodeFrame, wires[-1]).gpus  # the rest is decoded already
    expected = from_wire(NodeFrame, wires[-1])
    assert last.top_processes == expected.top_processes  # eleven deltas applied on the first read
    assert last.top_processes is last.top_processes
    assert last.processes == expected.processes
    assert frames[5].top_processes == from_wire(NodeFrame, wires[5]).top_processes  # earlier ones still right
    assert frames[5].top_processes is frames[6].top_processes or wires[5]["top_processes"] != wires[6]["top_processes"]


def test_a_lazy_frame_behaves_as_the_node_frame_it_stands_for():
    import dataclasses

    lines, wires = stream_lines(4, keyframe_every=100)
    decoder = StreamDecoder()
    frames = [decoder.decode_line(line)[0] for line in lines]
    lazy, plain = frames[-1], from_wire(NodeFrame, wires[-1])
    assert lazy == plain and plain == lazy and not (lazy != plain)
    assert hash(lazy) == hash(plain) and repr(lazy) == repr(plain)
    assert isinstance(lazy, NodeFrame)
    assert to_wire(decoder.decode_line(DeltaEncoder().encode_wire(copy.deepcopy(wires[-1])))[0]) == to_wire(plain)
    assert to_wire(frames[-1]) == to_wire(plain)
    moved = dataclasses.replace(frames[-1], seq=999)
    assert moved.seq == 999 and moved.processes == plain.processes and moved.top_processes == plain.top_processes
    assert dataclasses.asdict(frames[-1]) == dataclasses.asdict(plain)
    assert lazy != dataclasses.replace(plain, top_processes=plain.top_processes[1:])


def test_host_cores_are_parsed_only_when_read_and_survive_deltas_that_leave_them():
    from opsconsole.model import HostSample, NetRate

    wire = real_wire()
    encoder, decoder = DeltaEncoder(keyframe_every=100), StreamDecoder()
    first, _ = decoder.decode_line(encoder.encode_wire(copy.deepcopy(wire)))
    assert isinstance(first.host, wire_delta.LazyCoresHost) and "cpu_per_core" not in vars(first.host)
    assert first.host.cpu_percent == wire["host"]["cpu_percent"]  # the host's totals are decoded at once
    new = copy.deepcopy(wire)
    new["seq"] += 1
    new["host"]["cpu_percent"] = 55.5
    new["host"]["net"][0]["rx_bytes_per_s"] = 12345.0  # a nested list on a lazy host: still NetRates
    second, _ = decoder.decode_line(encoder.encode_wire(copy.deepcopy(new)))  # the cores did not change
    assert "cpu_per_core" not in vars(second.host) and second.host is not first.host
    assert second.host.net[0] == NetRate(**new["host"]["net"][0]) and type(second.host.net[0]) is NetRate
    assert second.host.cpu_per_core == tuple(wire["host"]["cpu_per_core"])  # the keyframe's, parsed now
    assert "cpu_per_core" in vars(first.host) or first.host.cpu_per_core == second.host.cpu_per_core
    third_wire = copy.deepcopy(new)
    third_wire["seq"] += 1
    third_wire["host"]["cpu_per_core"] = [1.5] * len(wire["host"]["cpu_per_core"])
    third, _ = decoder.decode_line(encoder.encode_wire(copy.deepcopy(third_wire)))
    assert third.host.cpu_per_core == (1.5,) * len(wire["host"]["cpu_per_core"])
    assert second.host.cpu_per_core == tuple(wire["host"]["cpu_per_core"])  # earlier frames keep theirs
    plain = from_wire(HostSample, third_wire["host"])
    assert third.host == plain and plain == third.host and hash(third.host) == hash(plain)
    assert repr(third.host) == repr(plain) and to_wire(third.host) == to_wire(plain)
    import dataclasses

    assert dataclasses.replace(second.host, cpu_percent=1.0).cpu_per_core == tuple(wire["host"]["cpu_per_core"])
    assert third.host != dataclasses.replace(plain, cpu_per_core=(0.0,))


def test_lines_with_the_cores_inside_the_host_still_decode():
    wire = real_wire()  # what a probe of before the cores moved sends: no TAB, or only lists after it
    plain = DeltaEncoder(keyframe_every=100, split=False)
    decoder = StreamDecoder()
    frame, _ = decoder.decode_line(plain.encode_wire(copy.deepcopy(wire)))
    assert type(frame.host) is not wire_delta.LazyCoresHost
    assert frame.host.cpu_per_core == tuple(wire["host"]["cpu_per_core"])
    main = json.loads(DeltaEncoder().encode_wire(copy.deepcopy(wire)).split("\t")[0])
    main["host"]["cpu_per_core"] = wire["host"]["cpu_per_core"]
    lists = json.dumps({"processes": wire["processes"], "top_processes": wire["top_processes"]})
    frame, _ = StreamDecoder().decode_line(json.dumps(main) + "\t" + lists)
    assert frame == from_wire(NodeFrame, wire) and frame.host.cpu_per_core == tuple(wire["host"]["cpu_per_core"])


def test_cores_that_are_no_list_are_empty_and_the_chain_waits_for_a_keyframe():
    lines, wires = stream_lines(4, keyframe_every=100)
    main, lazy = lines[1].split("\t")
    bad = {"cpu_per_core": {"not": "a list"}}  # first, where the encoder puts it
    bad.update((key, value) for key, value in json.loads(lazy).items() if key != "cpu_per_core")
    assert wires[1]["host"] is not None
    decoder = StreamDecoder()
    decoder.decode_line(lines[0])
    frame, dropped = decoder.decode_line(main + "\t" + json.dumps(bad))
    assert dropped is None and frame.gpus == from_wire(NodeFrame, wires[1]).gpus
    assert frame.host.cpu_per_core == ()
    frame, dropped = decoder.decode_line(lines[2])
    assert frame is None and "cpu_per_core did not apply" in dropped


def test_lists_that_do_not_apply_are_empty_and_the_chain_waits_for_a_keyframe():
    lines, wires = stream_lines(8, keyframe_every=4)  # keyframes at 0 and 4
    main, _ = lines[1].split("\t")
    bad = main + "\t" + json.dumps({"top_processes": [0, 1, 99]})  # no item 99 in the last frame
    decoder = StreamDecoder()
    decoder.decode_line(lines[0])
    frame, dropped = decoder.decode_line(bad)
    assert dropped is None and frame.gpus == from_wire(NodeFrame, wires[1]).gpus
    assert frame.top_processes == ()  # found out only now: too late to drop the frame
    frame, dropped = decoder.decode_line(lines[2])
    assert frame is None and "top_processes did not apply: top_processes: no item 99" in dropped
    assert dropped.endswith("waiting for a keyframe")
    assert decoder.decode_line(lines[3])[0] is None
    assert decoder.decode_line(lines[4]) == (from_wire(NodeFrame, wires[4]), None)  # the keyframe
    assert decoder.decode_line(lines[5]) == (from_wire(NodeFrame, wires[5]), None)


def test_a_list_part_that_is_no_json_empties_the_lists():
    lines, wires = stream_lines(3, keyframe_every=100)
    decoder = StreamDecoder()
    decoder.decode_line(lines[0])
    frame, _ = decoder.decode_line(lines[1].split("\t")[0] + '\t["not", "an object"]}')
    assert frame.gpus == from_wire(NodeFrame, wires[1]).gpus
    assert frame.processes == () and frame.top_processes == ()
    frame, dropped = decoder.decode_line(lines[2])
    assert frame is None and "processes did not apply" in dropped


@pytest.mark.parametrize("seed", range(4))
def test_random_sequences_read_now_and_then_decode_right(seed):
    rng = random.Random(seed)
    lines, wires = stream_lines(40, keyframe_every=rng.choice((3, 7, 30)), seed=seed)
    decoder = StreamDecoder()
    for line, wire in zip(lines, wires):
        frame, dropped = decoder.decode_line(line)
        assert dropped is None
        if rng.random() < 0.3:  # a pane that looks now and then: the chain in between stays unread
            assert exact(frame) == exact(from_wire(NodeFrame, wire))
    assert exact(frame) == exact(from_wire(NodeFrame, wires[-1]))


def test_unchanged_runs_and_null_fields_keep_an_idle_process_list_small():
    """All host processes in pid order: an unchanged stretch is one [i, n]; null fields are left out."""
    procs = [
        {
            "pid": 100 + i,
            "name": "idle",
            "user": "root",
            "command": "idle",
            "cpu_percent": 0.0,
            "rss_bytes": 4096,
            "state": "S",
            "threads": 1,
            "ppid": 1,
            "start_time": 1700000000.5,
            "kernel_thread": i % 2 == 0,
            "elapsed_s": None,
            "job_id": None,
        }
        for i in range(500)
    ]
    wire = dict(real_wire(), top_processes=procs)
    encoder, decoder = DeltaEncoder(keyframe_every=10), StreamDecoder()
    keyframe = encoder.encode_wire(wire_delta.round_wire(copy.deepcopy(wire)))
    host_part = json.loads(keyframe.split("\t")[1])["top_processes"]
    assert all("elapsed_s" not in p and "job_id" not in p and p["start_time"] == 1700000000.5 for p in host_part)
    first, _ = decoder.decode_line(keyframe)
    new = copy.deepcopy(wire)
    new["seq"] += 1
    new["top_processes"][250]["state"] = "D"
    delta = encoder.encode_wire(wire_delta.round_wire(new))
    assert json.loads(delta.split("\t")[1]) == {"top_processes": [[0, 250], {"state": "D", "@": 250}, [251, 249]]}
    decoded, dropped = decoder.decode_line(delta)
    assert dropped is None and len(decoded.top_processes) == 500
    assert decoded.top_processes[250].state == "D" and decoded.top_processes[250].elapsed_s is None
    assert all(a is b for i, (a, b) in enumerate(zip(first.top_processes, decoded.top_processes)) if i != 250)
    assert len(delta) < len(keyframe) / 50


def test_a_sleeping_process_is_in_every_decoded_frame_of_a_real_probe():
    """The node's whole process list crosses the wire: a process that sleeps is never left out."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    probe = Probe(node_name="delta-node", gpu_reader=None)
    probe.prime(0.05)
    encoder, decoder = DeltaEncoder(keyframe_every=5), StreamDecoder()
    sizes = []
    try:
        for _ in range(8):
            line = encoder.encode(probe.poll())
            sizes.append(len(line))
            decoded, dropped = decoder.decode_line(line)
            assert dropped is None
            listed = {p.pid: p for p in decoded.top_processes}
            assert sleeper.pid in listed and os.getpid() in listed and 1 in listed
            assert listed[sleeper.pid].state in ("R", "S") and listed[sleeper.pid].start_time is not None
    finally:
        probe.close()
        sleeper.kill()
        sleeper.wait()
    assert encoder.deltas >= 6 and max(sizes[1:5]) < sizes[0]  # deltas carry what changed, not every process
