"""The Processes pane's update with a node's whole process list, beside the same pane with a top 30, in one run.

Polls this machine (after starting `--sleepers` idle processes) a dozen times with the real
probe, then feeds the frames to a mounted ProcessesPane, once as they are and once cut to the
30 busiest host processes (what frames carried before), and prints the CPU per update (the
pane's diff and Textual drawing the visible rows, headless) and the ratio.

    .venv/bin/python benchmarks/processes_pane.py [--sleepers 800] [--frames 12]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from textual.app import App, ComposeResult  # noqa: E402

from opsconsole.model import STATE_UP, NodeState  # noqa: E402
from opsconsole.probe.agent import Probe  # noqa: E402
from opsconsole.tui.processes import ProcessesPane  # noqa: E402


class PaneApp(App):
    def __init__(self, pane: ProcessesPane) -> None:
        super().__init__()
        self.pane = pane

    def compose(self) -> ComposeResult:
        yield self.pane


async def cpu_per_update(frames) -> float:
    pane = ProcessesPane()
    times = []
    async with PaneApp(pane).run_test(size=(200, 50)) as pilot:
        for frame in frames:
            states = {"local": NodeState(name="local", state=STATE_UP, frame=frame, received_at=frame.time)}
            started = time.process_time()
            pane.show(states, None, frame.time)
            await pilot.pause()
            times.append(time.process_time() - started)
    return statistics.median(times[1:]) * 1000.0  # the first fills the table


def top30(frame):
    busiest = sorted(frame.top_processes, key=lambda p: -(p.cpu_percent or 0.0))[:30]
    return dataclasses.replace(frame, top_processes=tuple(busiest))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleepers", type=int, default=800)
    parser.add_argument("--frames", type=int, default=12)
    args = parser.parse_args()
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(args.sleepers)]
    try:
        probe = Probe(node_name="local", gpu_reader=None)
        probe.prime(0.05)
        frames = []
        for _ in range(args.frames):
            frames.append(probe.poll())
            time.sleep(0.2)
        probe.close()
    finally:
        for proc in sleepers:
            proc.kill()
        for proc in sleepers:
            proc.wait()
    every = asyncio.run(cpu_per_update(frames))
    few = asyncio.run(cpu_per_update([top30(f) for f in frames]))
    count = len(frames[-1].top_processes)
    print("%d host processes: %.1f ms CPU an update; top 30: %.1f ms; ratio %.2fx" % (count, every, few, every / few))
    return 0


if __name__ == "__main__":
    sys.exit(main())
