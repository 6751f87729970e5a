"""CPU cost of the probe agent at a 1 s interval, beside a sleep-only python3 loop measured in the same run.

Target: the agent at most 1 % of one core on a node without GPUs. Both processes run at
once over the same window (after a warm-up that leaves out interpreter start-up and the
first poll), and each one's utime+stime from /proc/PID/stat is divided by wall time.

    .venv/bin/python benchmarks/probe_cost.py [--seconds 30] [--python /usr/bin/python3] [--top 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TARGET_PERCENT = 1.0
BASELINE_LOOP = "import time\nwhile True:\n    time.sleep(1)\n"


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process, from /proc/PID/stat (10 ms ticks)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def run_seconds(pid: int) -> float:
    """Seconds the process ran on a CPU, in ns resolution (/proc/PID/schedstat), for a ratio a tick can't give."""
    try:
        with open("/proc/%d/schedstat" % pid) as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return cpu_seconds(pid)


class FrameCounter(threading.Thread):
    """Drains the agent's stdout, keeping the number of frames and their probe_ms."""

    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.frames = 0
        self.probe_ms = []
        self.sources = set()
        self.first = threading.Event()

    def run(self) -> None:
        for line in self.stream:
            frame = json.loads(line)
            self.frames += 1
            self.probe_ms.append(frame.get("probe_ms") or 0.0)
            self.sources.add(((frame.get("host") or {}).get("source"), frame.get("gpu_source")))
            self.first.set()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--python", default=sys.executable, help="interpreter for the agent and the baseline")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--extra-procs", type=int, default=0, help="idle `sleep` processes to add (a busy node has ~1000)"
    )
    args = parser.parse_args()

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    extras = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.extra_procs)]
    agent = subprocess.Popen(
        [args.python, "-m", "opsconsole.probe.agent", "--interval", "1", "--top", str(args.top)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
        env=env,
        text=True,
    )
    baseline = subprocess.Popen([args.python, "-c", BASELINE_LOOP], stdin=subprocess.DEVNULL)
    counter = FrameCounter(agent.stdout)
    counter.start()
    try:
        if not counter.first.wait(30):
            print("agent printed no frame within 30 s", file=sys.stderr)
            return 1
        time.sleep(args.warmup)
        startup_cpu = cpu_seconds(agent.pid)
        frames_before = counter.frames
        start_agent, start_base = cpu_seconds(agent.pid), cpu_seconds(baseline.pid)
        run_agent, run_base, start = run_seconds(agent.pid), run_seconds(baseline.pid), time.perf_counter()
        time.sleep(args.seconds)
        wall = time.perf_counter() - start
        ours = (cpu_seconds(agent.pid) - start_agent) / wall * 100
        base = (cpu_seconds(baseline.pid) - start_base) / wall * 100
        ours_ns = (run_seconds(agent.pid) - run_agent) / wall * 100
        base_ns = (run_seconds(baseline.pid) - run_base) / wall * 100
        frames = counter.frames - frames_before
        processes = len([p for p in os.listdir("/proc") if p.isdigit()])
        probe_ms = counter.probe_ms[frames_before:]
    finally:
        for proc in [agent, baseline] + extras:
            proc.terminate()
            proc.wait()
    sources = ", ".join("host=%s gpu=%s" % s for s in sorted(counter.sources, key=str))
    print("agent: %s -m opsconsole.probe.agent --interval 1 --top %d  (%s)" % (args.python, args.top, sources))
    print("processes on this host       %6d" % processes)
    print("window                       %6.1f s, %d frames" % (wall, frames))
    print("agent start-up + warm-up CPU %6.3f s" % startup_cpu)
    print("probe_ms per poll (median)   %6.2f ms  (max %.2f)" % (statistics.median(probe_ms), max(probe_ms)))
    print("agent CPU (utime+stime)      %6.3f %% of one core" % ours)
    print("baseline (sleep loop) CPU    %6.3f %% of one core" % base)
    print("agent CPU (schedstat, ns)    %6.3f %% of one core" % ours_ns)
    print("baseline (schedstat, ns)     %6.4f %% of one core" % base_ns)
    print("ratio agent/baseline         %6.1f x (schedstat)" % (ours_ns / base_ns if base_ns else float("inf")))
    verdict = "OK" if ours <= TARGET_PERCENT else "OVER"
    print("target                       <= %.1f %% of one core (no GPUs): %s" % (TARGET_PERCENT, verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
