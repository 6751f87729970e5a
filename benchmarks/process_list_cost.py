"""What sending every host process costs the probe and the wire, against the old top 30 by CPU, in one run.

Starts `--sleepers` idle processes (a node's data-loader workers and daemons), then polls
this machine with two probes in turn, one limited to 30 host processes (the old list) and
one with all of them, each streamed through the delta encoder as the SSH link streams it
(keyframe every 30 lines). Prints, per probe: processes per frame, CPU ms per poll, bytes
per line (deltas and keyframes), and the ratios all/top-30.

    .venv/bin/python benchmarks/process_list_cost.py [--ticks 60] [--sleepers 300]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsconsole.probe.agent import Probe  # noqa: E402
from opsconsole.probe.procs import MAX_HOST_PROCESSES  # noqa: E402
from opsconsole.probe.wire_delta import DeltaEncoder  # noqa: E402


def measure(top: int, ticks: int) -> dict:
    probe = Probe(node_name="bench", gpu_reader=None, top=top)
    encoder = DeltaEncoder(keyframe_every=30)
    probe.prime(0.05)
    cpu, sizes, keyframe_sizes, counts = [], [], [], []
    try:
        for _ in range(ticks):
            started = time.process_time()
            frame = probe.poll()
            line = encoder.encode(frame)
            cpu.append((time.process_time() - started) * 1000.0)
            (sizes if line.startswith('{"delta"') else keyframe_sizes).append(len(line))
            counts.append(len(frame.top_processes))
            time.sleep(0.05)  # a little time passes between polls, as on a node
    finally:
        probe.close()
    return {
        "processes": statistics.median(counts),
        "cpu_ms": statistics.median(cpu),
        "delta_bytes": statistics.median(sizes) if sizes else 0,
        "keyframe_bytes": statistics.median(keyframe_sizes),
        "bytes_per_line": (sum(sizes) + sum(keyframe_sizes)) / float(ticks),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ticks", type=int, default=60)
    parser.add_argument("--sleepers", type=int, default=300)
    args = parser.parse_args()
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(args.sleepers)]
    try:
        top30 = measure(30, args.ticks)
        every = measure(MAX_HOST_PROCESSES, args.ticks)
    finally:
        for proc in sleepers:
            proc.kill()
        for proc in sleepers:
            proc.wait()
    for name, result in (("top 30", top30), ("all", every)):
        print(
            "%-7s %5d processes  %6.1f ms CPU/poll  delta %7.0f B  keyframe %8.0f B  mean %8.0f B/line"
            % (
                name,
                result["processes"],
                result["cpu_ms"],
                result["delta_bytes"],
                result["keyframe_bytes"],
                result["bytes_per_line"],
            )
        )
    print(
        "ratio all/top-30: processes %.1fx, CPU per poll %.2fx, bytes per line %.2fx (delta %.2fx, keyframe %.1fx)"
        % (
            every["processes"] / top30["processes"],
            every["cpu_ms"] / top30["cpu_ms"],
            every["bytes_per_line"] / top30["bytes_per_line"],
            every["delta_bytes"] / max(1.0, top30["delta_bytes"]),
            every["keyframe_bytes"] / top30["keyframe_bytes"],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
