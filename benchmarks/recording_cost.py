"""Recording cost and replay seek time, each against a baseline measured in the same run.

Targets (issue: history, alerts, recording): recording 64 nodes of 8 GPUs at 1 s costs at
most 5 % of one core and at most 50 MB per hour; replay seeks to any point of a one-hour
recording in at most 200 ms.

The hour is simulated (states carry the times of an hour at 1 s, fed as fast as they are
made): CPU is the process time spent inside Recorder.observe(), divided by the simulated
seconds. Baselines: serialising each frame to JSON (the least any recorder must do), and
reading a full frame line back for a seek.

    .venv/bin/python benchmarks/recording_cost.py [--nodes 64] [--seconds 3600] [--seeks 40]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsconsole.model import to_wire  # noqa: E402
from opsconsole.recording.recorder import Recorder  # noqa: E402
from opsconsole.recording.replay import RecordingReader  # noqa: E402
from tests.recording_frames import node_state  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=3600)
    parser.add_argument("--seeks", type=int, default=40)
    parser.add_argument("--chunk-s", type=float, default=None, help="override the recorder's chunk length")
    parser.add_argument("--keyframe-every", type=int, default=None, help="override chunks per keyframe group")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "hour.opsrec")
        record_cpu = 0.0
        baseline_cpu = 0.0
        tuning = {}
        if args.chunk_s:
            tuning["chunk_s"] = args.chunk_s
        if args.keyframe_every:
            tuning["keyframe_every"] = args.keyframe_every
        with Recorder(path, **tuning) as recorder:
            for tick in range(args.seconds):
                for node in range(args.nodes):
                    state = node_state(node, tick)
                    c0 = time.process_time()
                    json.dumps(to_wire(state.frame), separators=(",", ":"))
                    c1 = time.process_time()
                    recorder.observe(state)
                    c2 = time.process_time()
                    baseline_cpu += c1 - c0
                    record_cpu += c2 - c1
        size = os.path.getsize(path) + sum(os.path.getsize(p) for p in (path + "-wal",) if os.path.exists(p))
        stored = recorder.stats.bytes_written
        per_hour = 3600.0 / args.seconds
        cpu_percent = 100.0 * record_cpu / args.seconds
        baseline_percent = 100.0 * baseline_cpu / args.seconds
        print("recording %d nodes x 8 GPUs, %d s simulated at 1 s:" % (args.nodes, args.seconds))
        print(
            "  recorder CPU %.2f %% of one core (target <= 5 %%); baseline json.dumps of each frame %.2f %%;"
            " ratio %.2fx the baseline" % (cpu_percent, baseline_percent, cpu_percent / baseline_percent)
        )
        print(
            "  file %.1f MB (compressed chunks %.1f MB) -> %.1f MB per hour (target <= 50 MB)"
            % (size / 1e6, stored / 1e6, size * per_hour / 1e6)
        )

        reader = RecordingReader(path)
        rng = random.Random(7)
        points = [rng.uniform(reader.start, reader.end) for _ in range(args.seeks)]
        seek_ms = []
        for t in points:
            s0 = time.perf_counter()
            reader.seek(t)
            seek_ms.append(1000 * (time.perf_counter() - s0))
        reader.close()
        # Baseline: the least a seek can cost, decoding one full frame line per node.
        line = json.dumps(to_wire(node_state(0, 0).frame))
        from opsconsole.model import NodeFrame, from_wire

        b0 = time.perf_counter()
        for _ in range(args.nodes):
            from_wire(NodeFrame, json.loads(line))
        base_ms = 1000 * (time.perf_counter() - b0)
        worst = max(seek_ms)
        print(
            "  seek to %d random points of the recording: median %.1f ms, max %.1f ms (target <= 200 ms);"
            " baseline (decode one keyframe per node) %.1f ms, ratio max/baseline %.1fx"
            % (args.seeks, statistics.median(seek_ms), worst, base_ms, worst / base_ms)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
