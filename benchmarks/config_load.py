"""The config's cost at launch: import and first load, beside reading the same file with tomllib alone.

Each figure is the median of --runs fresh interpreters that have imported textual.app first (as the
console has by then, so typing, re and dataclasses are loaded). Also measured in the same run, with
`python -X importtime`: the import of the validation libraries the config could use (msgspec, which
it uses, and pydantic's TypeAdapter, where installed), the reason for the choice (docs/code-health.md).

    .venv/bin/python benchmarks/config_load.py [--runs 15] [--config config.example.toml]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TIMED = r"""
import sys, time, textual.app
path = sys.argv[1]
t0 = time.perf_counter()
if sys.argv[2] == "tomllib":
    import tomllib
    with open(path, "rb") as f:
        tomllib.load(f)
    t1 = t2 = time.perf_counter()
else:
    from opsconsole.config import load_config
    t1 = time.perf_counter()
    load_config(path, {"HOME": "/home/u"})
    t2 = time.perf_counter()
print(t1 - t0, t2 - t0)
"""


def timed(path: str, what: str, runs: int) -> List[List[float]]:
    out = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-c", TIMED, path, what], cwd=ROOT, capture_output=True, text=True, check=True
        )
        out.append([float(x) * 1000 for x in done.stdout.split()])
    return out


def import_cost_ms(statement: str, runs: int) -> Optional[float]:
    """Median of the top-level imports' cumulative time that `statement` adds after textual.app."""
    base = "import textual.app"
    costs = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", base + "; " + statement],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return None  # not installed
        seen_base, total = False, 0
        for line in done.stderr.splitlines():
            parts = line[len("import time:") :].split("|")
            if len(parts) != 3 or "cumulative" in parts[1]:
                continue
            name = parts[2]
            if name.strip() == "textual.app" and not name.startswith("  "):
                seen_base = True
            elif seen_base and not name.startswith("  "):
                total += int(parts[1])
        costs.append(total / 1000)
    return statistics.median(costs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--config", default=os.path.join(ROOT, "config.example.toml"))
    args = parser.parse_args()
    baseline = statistics.median(r[1] for r in timed(args.config, "tomllib", args.runs))
    config = timed(args.config, "opsconsole", args.runs)
    imported = statistics.median(r[0] for r in config)
    loaded = statistics.median(r[1] for r in config)
    print(f"config file: {args.config}")
    print(f"import tomllib + read the file      median {baseline:6.1f} ms  (baseline)")
    print(f"import opsconsole.config            median {imported:6.1f} ms")
    print(f"  + load_config (read and validate) median {loaded:6.1f} ms  ({loaded / baseline:.1f} x the baseline)")
    libraries: Dict[str, str] = {"msgspec": "import msgspec", "pydantic": "from pydantic import TypeAdapter"}
    for name, statement in libraries.items():
        cost = import_cost_ms(statement, args.runs)
        shown = "not installed" if cost is None else f"{cost:6.1f} ms"
        print(f"import cost after textual.app: {name:9s} {shown}  ({statement})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
