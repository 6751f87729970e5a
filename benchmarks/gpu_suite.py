"""The level-1 GPU sanity suite's wall time, including torch import, beside `python -c "import torch"`.

Target (issue 6): at most 15 s on one H200, including torch import; on n GPUs in parallel
not much more. The suite runs the way the console starts it: the probe bundle with the
health mode as its entry point, fed on stdin to `PYTHON -` (opsconsole.health.remote).
Both figures are measured in the same run.

    python3 benchmarks/gpu_suite.py [--python python3] [--level 1] [--runs 1] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from opsconsole.config import HealthConfig  # noqa: E402
from opsconsole.health.remote import health_bundle, parse_suite_output, suite_args  # noqa: E402


def time_torch_import(python: str) -> float:
    start = time.perf_counter()
    subprocess.run([python, "-c", "import torch"], check=True)
    return time.perf_counter() - start


def time_suite(python: str, level: int, bundle: str):
    args = suite_args("bench", HealthConfig(), level=level)
    start = time.perf_counter()
    proc = subprocess.run([python, "-"] + args, input=bundle, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - start
    return elapsed, proc.returncode, parse_suite_output(proc.stdout, "bench", proc.returncode, proc.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="python3")
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    bundle = health_bundle()
    time_torch_import(args.python)  # warm the page cache, so both figures start alike
    imports, suites = [], []
    results = []
    code = None
    for _ in range(args.runs):
        imports.append(time_torch_import(args.python))
        elapsed, code, results = time_suite(args.python, args.level, bundle)
        suites.append(elapsed)
    base, full = statistics.median(imports), statistics.median(suites)
    for r in results:
        gpu = "" if r.gpu is None else " gpu%d" % r.gpu
        took = "" if r.duration_s is None else " (%.2f s)" % r.duration_s
        print("%-5s %s%s: %s%s" % (r.status, r.check, gpu, r.message, took))
    gpus = len({r.gpu for r in results if r.gpu is not None})
    print("torch import alone: %.2f s" % base)
    print(
        "level-%d suite on %d GPU(s), torch import included: %.2f s (%.1fx the import alone; target <= 15 s) exit %s"
        % (args.level, gpus, full, full / base if base else 0.0, code)
    )
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(
                {
                    "torch_import_s": base,
                    "suite_s": full,
                    "exit": code,
                    "gpus": gpus,
                    "results": [r.__dict__ for r in results],
                },
                f,
                indent=1,
                default=list,
            )
    return 0 if code == 0 and full <= 15.0 else 1


if __name__ == "__main__":
    sys.exit(main())
