"""The probe's CPU per tick on a GPU node, and each NVML function's share of it.

The console's steady-state CPU beside nvitop (benchmarks/vs_nvitop.py) is Textual's screen plus
the probe's thread; this says what the probe costs: CPU time (thread time, so the driver's work in
its ioctls counts, a sleep does not) of Probe.poll() over --ticks ticks at the console's cadence
(the host's process list every fifth poll, as while no pane shows it), then of polls without and
with the process list, and per NVML function the CPU and wall time per tick and calls per tick.
Run it with a training load on the GPU (the per-process calls cost more with processes on it).

    python benchmarks/probe_cpu.py [--ticks 60]

On a machine without an NVIDIA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from typing import Any, Dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from opsconsole.probe.agent import Probe  # noqa: E402
from opsconsole.probe.gpu import GpuReader  # noqa: E402

HOST_PROCESSES_EVERY = 5  # the console's cadence while no pane shows host processes


class ThreadTimedNvml(object):
    """pynvml, each nvml* call's thread (CPU) time and wall time added up by name."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.cpu: Dict[str, float] = defaultdict(float)
        self.wall: Dict[str, float] = defaultdict(float)
        self.calls: Dict[str, int] = defaultdict(int)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not callable(value) or isinstance(value, type) or not name.startswith("nvml"):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                self.cpu[name] += time.thread_time() - cpu
                self.wall[name] += time.perf_counter() - wall
                self.calls[name] += 1

        return timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=60)
    args = parser.parse_args()
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:  # no pynvml, no driver, no GPU
        print("no GPU here (%s): nothing to measure" % exc)
        return 0
    nvml = ThreadTimedNvml(pynvml)
    probe = Probe(node_name="bench", disk_paths=(), gpu_reader=GpuReader(nvml=nvml))
    probe.poll(host_processes=False)
    probe.poll()  # the CPU baseline of every process
    print("processes on this machine: %d" % sum(1 for entry in os.listdir("/proc") if entry.isdigit()))
    started = time.thread_time()
    for tick in range(args.ticks):
        probe.poll(host_processes=tick % HOST_PROCESSES_EVERY == 0)
        time.sleep(0.02)
    print(
        "Probe.poll, the host's processes every %dth tick: CPU %.2f ms a tick"
        % (HOST_PROCESSES_EVERY, (time.thread_time() - started) / args.ticks * 1e3)
    )
    polls = 20
    for label, host_processes in (("without the host's processes", False), ("with them", True)):
        started = time.thread_time()
        for _ in range(polls):
            probe.poll(host_processes=host_processes)
        print("  %s: CPU %.2f ms a poll" % (label, (time.thread_time() - started) / polls * 1e3))
    ticks = args.ticks + 2 * polls + 2
    print("NVML per tick (CPU ms / wall ms, calls a tick):")
    for name in sorted(nvml.cpu, key=lambda n: -nvml.cpu[n]):
        print(
            "  %-45s %.3f / %.3f  %.2f"
            % (name, nvml.cpu[name] / ticks * 1e3, nvml.wall[name] / ticks * 1e3, nvml.calls[name] / ticks)
        )
    print("NVML's CPU a tick: %.2f ms" % (sum(nvml.cpu.values()) / ticks * 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
