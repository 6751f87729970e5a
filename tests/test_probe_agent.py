"""The probe agent: Probe with injected readers, and the real agent process on pipes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple

import pytest

from opsconsole.model import FRAME_VERSION, GpuSample, NodeFrame, ProcessSample, from_wire
from opsconsole.probe.agent import Probe, delay_to_grid, frame_line, next_deadline
from opsconsole.probe.host import HostReader, parse_meminfo

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


@dataclass
class FakeReading:
    gpus: Tuple[GpuSample, ...] = ()
    processes: Tuple[ProcessSample, ...] = ()
    source: str = "nvml"
    note: str = None
    driver_version: str = "570.0"
    errors: Tuple[str, ...] = ()


class FakeGpuReader:
    """A GpuReader stand-in (DI) with the API of opsconsole.probe.gpu.GpuReader."""

    def __init__(self, reading=None, fail=None):
        self.reading, self.fail, self.reads, self.closed = reading, fail, 0, 0

    def read(self):
        self.reads += 1
        if self.fail:
            raise self.fail
        return self.reading

    def close(self):
        self.closed += 1


class BrokenHostReader(HostReader):
    def read(self):
        raise PermissionError("/proc is not mounted")


def mem_total_from_proc() -> int:
    return parse_meminfo(Path("/proc/meminfo").read_text())["MemTotal"]


def test_probe_frame_joins_gpu_processes_and_keeps_gpu_errors():
    me = os.getpid()
    reading = FakeReading(
        gpus=(GpuSample(index=0, uuid="GPU-0", utilization_gpu=97.0),),
        processes=(ProcessSample(pid=me, gpu_index=0, gpu_uuid="GPU-0", gpu_memory_bytes=1 << 30),),
        errors=("gpu0 pcie_tx_kbs: Unknown Error",),
    )
    gpu = FakeGpuReader(reading)
    probe = Probe(node_name="n1", top=5, gpu_reader=gpu)
    first = probe.poll()
    time.sleep(0.3)  # CPU percentages need some jiffies between the two reads
    second = probe.poll()
    assert (first.seq, second.seq) == (1, 2) and second.node == "n1" and second.version == FRAME_VERSION
    assert second.gpus == reading.gpus and second.gpu_source == "nvml" and second.driver_version == "570.0"
    assert "gpu0 pcie_tx_kbs: Unknown Error" in second.errors
    proc = second.processes[0]
    assert (proc.pid, proc.gpu_index, proc.gpu_memory_bytes) == (me, 0, 1 << 30)
    assert proc.state in ("R", "S") and proc.command and proc.user and proc.rss_bytes > 0
    assert 0 < len(second.top_processes) <= 5
    assert second.host.mem_total == mem_total_from_proc() and second.host.cpu_percent is not None
    assert second.probe_ms >= 0
    probe.close()
    probe.close()
    assert gpu.closed == 1


def test_failing_parts_are_errors_and_others_still_report():
    probe = Probe(node_name="n2", gpu_reader=FakeGpuReader(fail=OSError("libnvidia-ml.so.1: cannot open")), top=3)
    frame = probe.poll()
    assert any(e.startswith("gpu: OSError: libnvidia-ml.so.1") for e in frame.errors)
    assert frame.gpus == () and frame.gpu_source == "none" and "libnvidia-ml" in frame.gpu_note
    assert frame.host is not None and frame.top_processes
    probe = Probe(node_name="n3", gpu_reader=FakeGpuReader(FakeReading()), host_reader=BrokenHostReader(), top=0)
    frame = probe.poll()
    assert frame.host is None and frame.top_processes == ()
    assert frame.errors == ("host: PermissionError: /proc is not mounted",)
    assert frame.gpu_source == "nvml"


def test_default_gpu_reader_path_never_raises():
    probe = Probe(node_name="n4", top=0)
    try:
        frame = probe.poll()
    finally:
        probe.close()
    if (ROOT / "opsconsole" / "probe" / "gpu.py").exists():
        assert frame.gpu_source in ("nvml", "nvidia-smi", "none")
        if frame.gpu_source == "none":
            assert frame.gpu_note
    else:
        assert any(e.startswith("gpu: ") for e in frame.errors)
    assert frame.host is not None


@pytest.mark.parametrize(
    "deadline, now, interval, expected",
    [
        (10.0, 10.1, 1.0, 11.0),  # on time
        (10.0, 10.99, 1.0, 11.0),
        (10.0, 11.0, 1.0, 12.0),  # poll took exactly one interval: skip to the next
        (10.0, 13.5, 1.0, 14.0),  # overran by 3.5 intervals: ticks 11, 12, 13 skipped
        (0.0, 0.45, 0.2, 0.6),
    ],
)
def test_next_deadline_stays_on_grid_and_skips_overruns(deadline, now, interval, expected):
    assert next_deadline(deadline, now, interval) == pytest.approx(expected)


@pytest.mark.parametrize(
    "now, interval, expected",
    [
        (100.3, 1.0, 0.7),  # the next whole second
        (100.0, 1.0, 1.0),  # on a grid point: the next one
        (100.6, 1.0, 1.4),  # woke early or overran: never two frames within half an interval
        (100.45, 1.0, 0.55),
        (10.1, 0.25, 0.15),
        (1796290000.96, 2.0, 1.04),  # a wall-clock time of today: the grid of all nodes
    ],
)
def test_ticks_land_on_the_wall_clock_grid_at_least_half_an_interval_apart(now, interval, expected):
    delay = delay_to_grid(now, interval)
    assert delay == pytest.approx(expected, abs=1e-6)
    tick = now + delay
    assert min(tick % interval, interval - tick % interval) == pytest.approx(0.0, abs=1e-6)


def test_frame_line_round_trips():
    frame = Probe(node_name="n5", gpu_reader=FakeGpuReader(FakeReading()), top=2).poll()
    line = frame_line(frame)
    assert "\n" not in line and ", " not in line.split('"command"')[0]
    assert from_wire(NodeFrame, json.loads(line)) == frame


def start_agent(*args, python=sys.executable, **kwargs):
    return subprocess.Popen(
        [python, "-m", "opsconsole.probe.agent"] + list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,  # stdin at EOF from the start: must not stop the agent
        cwd=ROOT,
        env=ENV,
        **kwargs,
    )


def read_frames(stream, count):
    return [from_wire(NodeFrame, json.loads(stream.readline())) for _ in range(count)]


def test_agent_streams_frames_and_stops_on_sigterm():
    agent = start_agent(
        "--interval", "0.2", "--node-name", "stream-node", "--top", "4", "--disk", "/", "--disk", "/no/such"
    )
    try:
        frames = read_frames(agent.stdout, 3)
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=10)
    assert agent.returncode == 0 and err == b""
    assert [f.seq for f in frames] == [1, 2, 3]
    assert all(f.version == FRAME_VERSION and f.node == "stream-node" for f in frames)
    assert frames[0].time < frames[1].time < frames[2].time
    host = frames[2].host
    assert host.mem_total == mem_total_from_proc() and host.cpu_count == os.cpu_count()
    assert host.cpu_percent is not None and len(host.cpu_per_core) == os.cpu_count()
    assert [d.path for d in host.disks] == ["/"]
    assert any(e.startswith("host.disk /no/such") for e in frames[2].errors)
    assert 0 < len(frames[2].top_processes) <= 4
    assert all(f.probe_ms is not None and f.probe_ms >= 0 for f in frames)


def test_agent_once_prints_one_primed_frame():
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole.probe", "--once", "--top", "3"],
        capture_output=True,
        cwd=ROOT,
        env=ENV,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0 and done.stderr == b""
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1
    frame = from_wire(NodeFrame, json.loads(lines[0]))
    assert frame.seq == 1 and frame.version == FRAME_VERSION
    assert frame.host.cpu_percent is not None  # --once takes a baseline first
    assert all(p.cpu_percent is not None for p in frame.top_processes)


def test_agent_exits_quietly_when_reader_goes_away():
    agent = start_agent("--interval", "0.1")
    read_frames(agent.stdout, 1)
    agent.stdout.close()  # the console hung up: the next write gets EPIPE
    err = agent.stderr.read()
    assert agent.wait(timeout=10) == 0
    assert b"Traceback" not in err and err == b""


def test_agent_exits_quietly_on_sigint():
    agent = start_agent("--interval", "0.2")
    read_frames(agent.stdout, 1)
    agent.send_signal(signal.SIGINT)
    _, err = agent.communicate(timeout=10)
    assert agent.returncode == 0 and err == b""


def test_agent_rejects_bad_interval():
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole.probe.agent", "--interval", "0"], capture_output=True, cwd=ROOT, env=ENV
    )
    assert done.returncode == 2 and b"--interval" in done.stderr


def test_agent_as_script_on_stdin_of_a_bare_python3():
    """As the console ships it: source on stdin to `python3 -`, on an interpreter without psutil."""
    python3 = "/usr/bin/python3"
    if not os.path.exists(python3):
        pytest.skip("no system python3")
    bare = subprocess.run([python3, "-c", "import psutil"], capture_output=True).returncode != 0
    script = (
        "import sys\n"
        "sys.path.insert(0, %r)\n"
        "from opsconsole.probe.agent import main\n"
        "sys.exit(main(sys.argv[1:]))\n" % str(ROOT)
    )
    agent = subprocess.Popen(
        [python3, "-", "--interval", "0.2", "--top", "2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    agent.stdin.write(script.encode())
    agent.stdin.close()  # stdin at EOF once the script is read, as over SSH
    try:
        frames = read_frames(agent.stdout, 3)
    finally:
        agent.terminate()
        agent.stdin = None  # already closed above; communicate() would flush it
        _, err = agent.communicate(timeout=10)
    assert agent.returncode == 0 and err == b""
    assert [f.seq for f in frames] == [1, 2, 3]
    assert frames[2].host.source == ("proc" if bare else "psutil")
    assert frames[2].host.mem_total == mem_total_from_proc()
