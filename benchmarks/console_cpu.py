"""Console CPU while watching the local node at a 1 s interval, beside the probe's own cost.

Target (issue 2): the console at most 2 % of one core over 60 s, not counting the probe.
The console polls the local node in-process, so its CPU includes one probe per tick; the
baseline, measured in the same run, is the probe alone (`opsconsole.probe.agent` at 1 s).

    .venv/bin/python benchmarks/console_cpu.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from pty_run import ROOT, PtyProcess, console_argv, cpu_seconds


def measure_console(seconds: float, warmup: float) -> float:
    console = PtyProcess(console_argv("--interval", "1"))
    try:
        time.sleep(warmup)
        start_cpu, start = cpu_seconds(console.proc.pid), time.perf_counter()
        time.sleep(seconds)
        return (cpu_seconds(console.proc.pid) - start_cpu) / (time.perf_counter() - start) * 100
    finally:
        console.stop()


def measure_probe(seconds: float, warmup: float) -> float:
    probe = subprocess.Popen(
        [sys.executable, "-m", "opsconsole.probe.agent", "--interval", "1"],
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        time.sleep(warmup)
        start_cpu, start = cpu_seconds(probe.pid), time.perf_counter()
        time.sleep(seconds)
        return (cpu_seconds(probe.pid) - start_cpu) / (time.perf_counter() - start) * 100
    finally:
        probe.terminate()
        probe.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    args = parser.parse_args()
    console = measure_console(args.seconds, args.warmup)
    probe = measure_probe(args.seconds, args.warmup)
    own = max(0.0, console - probe)
    print(f"console process CPU        {console:6.2f} % of one core (over {args.seconds:.0f} s, 1 s interval)")
    print(f"probe alone (baseline)     {probe:6.2f} % of one core")
    print(f"console beside the probe   {own:6.2f} % of one core   (target <= 2 %)")
    print(f"ratio console/probe        {console / probe if probe else float('inf'):6.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
