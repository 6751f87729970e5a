"""What one probe tick costs per GPU: our tiered NVML GpuReader against nvidia-smi, same run.

    python benchmarks/probe_tick.py [--ticks 200] [--slow-every 5] [--smi-calls 30]
                                    [--profile] [--dump PATH] [--alternatives]

Prints the mean cost of GpuReader.read() per GPU per tick (over many ticks, so the slow
tier's every-N cost is averaged in), the mean cost of one `nvidia-smi --query-gpu=<the same
fields>` subprocess call, and their ratio (target: ours at least 3x cheaper). --profile adds
the mean cost of each NVML function the reader called; --dump writes one full reading (all
tiers) as JSON. On a machine without an NVIDIA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections import defaultdict
from typing import Any, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from opsconsole.model import to_wire  # noqa: E402
from opsconsole.probe.gpu import GpuReader, run_nvidia_smi  # noqa: E402
from opsconsole.probe.smi import (  # noqa: E402
    BASIC_GPU_FIELDS,
    QUERY_GPU_FIELDS,
    is_invalid_field_error,
    parse_query_gpu_csv_with_driver,
    query_gpu_argv,
)


class TimedModule(object):
    """Wraps a pynvml-like module: every function call's duration is added up by name."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.seconds = defaultdict(float)  # type: Dict[str, float]
        self.calls = defaultdict(int)  # type: Dict[str, int]

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not callable(value) or isinstance(value, type) or not name.startswith("nvml"):
            return value
        seconds, calls = self.seconds, self.calls

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return value(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - started
                calls[name] += 1

        return timed


def nvml_or_none() -> Any:
    """pynvml, initialised and with at least one GPU, else None (and why, printed)."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError as exc:
        print("no GPU benchmark: pynvml not importable (%s)" % exc)
        return None
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:
        print("no GPU benchmark: NVML unavailable here (%s: %s)" % (type(exc).__name__, exc))
        return None
    if count < 1:
        print("no GPU benchmark: NVML sees no GPU")
        return None
    return pynvml


def bench_reader(nvml: Any, ticks: int, slow_every: int, profile: bool) -> Dict[str, Any]:
    module = TimedModule(nvml) if profile else nvml
    reader = GpuReader(slow_every=slow_every, nvml=module)
    started = time.perf_counter()
    first = reader.read()  # init, handles, static fields, first slow tier
    first_s = time.perf_counter() - started
    gpus = max(1, len(first.gpus))
    if profile:
        module.seconds.clear()
        module.calls.clear()
    per_tick = []  # type: List[float]
    errors = set()
    for _ in range(ticks):
        started = time.perf_counter()
        reading = reader.read()
        per_tick.append(time.perf_counter() - started)
        for gpu in reading.gpus:
            errors.update(gpu.errors)
        errors.update(reading.errors)
    reader.close()
    return {
        "gpus": gpus,
        "first_ms": first_s * 1000.0,
        "mean_ms_per_gpu": statistics.mean(per_tick) * 1000.0 / gpus if per_tick else float("nan"),
        "fast_ms_per_gpu": _tier_mean(per_tick, slow_every, fast=True) * 1000.0 / gpus,
        "slow_ms_per_gpu": _tier_mean(per_tick, slow_every, fast=False) * 1000.0 / gpus,
        "errors": sorted(errors),
        "profile": _profile(module, ticks * gpus) if profile else None,
        "first_errors": list(first.errors) + [e for g in first.gpus for e in g.errors],
    }


def _tier_mean(per_tick: List[float], slow_every: int, fast: bool) -> float:
    # Tick 1 (the first read) was slow; the measured ticks are 2..N+1, slow when (t-1) % n == 0.
    chosen = [s for i, s in enumerate(per_tick, start=2) if ((i - 1) % slow_every == 0) != fast]
    return statistics.mean(chosen) if chosen else float("nan")


def _profile(module: TimedModule, gpu_ticks: int) -> List[str]:
    rows = sorted(module.seconds.items(), key=lambda item: -item[1])
    return [
        "  %-44s %6d calls  %8.1f us/call  %8.1f us/gpu-tick"
        % (name, module.calls[name], secs * 1e6 / module.calls[name], secs * 1e6 / max(1, gpu_ticks))
        for name, secs in rows
    ]


def bench_smi(calls: int, gpus: int) -> Dict[str, Any]:
    fields = QUERY_GPU_FIELDS
    try:
        run_nvidia_smi(query_gpu_argv(fields))
    except Exception as exc:
        if not is_invalid_field_error(str(exc)):
            return {"error": "%s: %s" % (type(exc).__name__, exc)}
        fields = BASIC_GPU_FIELDS
    per_call = []
    text = ""
    for _ in range(calls):
        started = time.perf_counter()
        text = run_nvidia_smi(query_gpu_argv(fields))
        per_call.append(time.perf_counter() - started)
    return {
        "fields": "full" if fields == QUERY_GPU_FIELDS else "basic (full list refused)",
        "mean_ms_per_gpu": statistics.mean(per_call) * 1000.0 / max(1, gpus),
        "mean_ms_per_call": statistics.mean(per_call) * 1000.0,
        "parsed_gpus": len(parse_query_gpu_csv_with_driver(text, fields.split(","))[0]),
    }


def bench_alternatives(nvml: Any, calls: int = 50) -> List[str]:
    """Mean cost of candidate NVML calls for the costly fields, on GPU 0 (to choose tiers)."""
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    recent_us = int((time.time() - 1.0) * 1e6)
    candidates = [
        ("nvmlDeviceGetTotalEnergyConsumption", lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle)),
        ("nvmlDeviceGetFieldValues([TOTAL_ENERGY])", lambda: nvml.nvmlDeviceGetFieldValues(handle, [83])),
        ("nvmlDeviceGetFieldValues([PCIE TX, RX])", lambda: nvml.nvmlDeviceGetFieldValues(handle, [197, 198])),
        ("nvmlDeviceGetPowerUsage", lambda: nvml.nvmlDeviceGetPowerUsage(handle)),
        ("nvmlDeviceGetProcessUtilization(0)", lambda: nvml.nvmlDeviceGetProcessUtilization(handle, 0)),
        ("nvmlDeviceGetProcessUtilization(-1 s)", lambda: nvml.nvmlDeviceGetProcessUtilization(handle, recent_us)),
        (
            "nvmlDeviceGetProcessesUtilizationInfo(-1 s)",
            lambda: nvml.nvmlDeviceGetProcessesUtilizationInfo(handle, recent_us),
        ),
    ]
    rows = []
    for name, call in candidates:
        outcome = "ok"
        started = time.perf_counter()
        for _ in range(calls):
            try:
                result = call()
            except Exception as exc:
                outcome = type(exc).__name__
                continue
            if name.startswith("nvmlDeviceGetFieldValues"):
                outcome = "returns %s" % [int(v.nvmlReturn) for v in result]
        mean_us = (time.perf_counter() - started) * 1e6 / calls
        rows.append("  %-46s %9.1f us/call  %s" % (name, mean_us, outcome))
    nvml.nvmlShutdown()
    return rows


def dump_reading(path: str) -> None:
    """One reading with every tier (slow_every=1) as JSON, for fixtures."""
    reader = GpuReader(slow_every=1)
    reader.read()  # the PCIe byte-counter rate needs a previous reading
    time.sleep(0.5)
    reading = reader.read()
    reader.close()
    with open(path, "w") as handle:
        json.dump(to_wire(reading), handle, indent=1, sort_keys=False)
        handle.write("\n")
    print("wrote %s (%d GPUs, source %s)" % (path, len(reading.gpus), reading.source))


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--slow-every", type=int, default=5)
    parser.add_argument("--smi-calls", type=int, default=30)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--dump", metavar="PATH")
    parser.add_argument("--alternatives", action="store_true", help="time candidate calls for costly fields")
    args = parser.parse_args(argv)

    nvml = nvml_or_none()
    if nvml is None:
        return 0
    if args.dump:
        dump_reading(args.dump)
    if args.alternatives:
        print("candidate NVML calls on GPU 0 (mean of 50):")
        print("\n".join(bench_alternatives(nvml)))
    if args.ticks <= 0:
        return 0
    ours = bench_reader(nvml, args.ticks, args.slow_every, args.profile)
    print("GpuReader.read(): %d GPU(s), %d ticks, slow_every=%d" % (ours["gpus"], args.ticks, args.slow_every))
    print("  first read (init + static + slow): %.2f ms" % ours["first_ms"])
    print("  mean per GPU per tick:            %.3f ms" % ours["mean_ms_per_gpu"])
    print("    fast ticks:                     %.3f ms" % ours["fast_ms_per_gpu"])
    print("    slow ticks:                     %.3f ms" % ours["slow_ms_per_gpu"])
    if ours["first_errors"]:
        print("  first-read errors: %s" % "; ".join(ours["first_errors"]))
    if ours["errors"]:
        print("  errors seen: %s" % "; ".join(ours["errors"]))
    if ours["profile"]:
        print("NVML calls after the first read (mean):")
        print("\n".join(ours["profile"]))
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi not on PATH: no baseline")
        return 0
    smi = bench_smi(args.smi_calls, ours["gpus"])
    if "error" in smi:
        print("nvidia-smi failed: %s" % smi["error"])
        return 0
    print("nvidia-smi --query-gpu (%s fields), %d calls:" % (smi["fields"], args.smi_calls))
    print(
        "  mean per call: %.2f ms; per GPU: %.3f ms; parsed %d GPU(s)"
        % (smi["mean_ms_per_call"], smi["mean_ms_per_gpu"], smi["parsed_gpus"])
    )
    ratio = smi["mean_ms_per_gpu"] / ours["mean_ms_per_gpu"] if ours["mean_ms_per_gpu"] > 0 else float("inf")
    print("ratio nvidia-smi / ours: %.1fx (target >= 3x): %s" % (ratio, "ok" if ratio >= 3 else "BELOW TARGET"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
