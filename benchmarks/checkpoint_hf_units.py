"""Listing 20 Hugging Face `checkpoint-N/` units against reading their trainer_state.json files alone.

One real checkpoint is written by a tiny HF `Trainer` run (tests/checkpoint_libraries.py: GPT-2
from a config, CPU, offline), then copied 20 times as checkpoint-100 ... checkpoint-2000 with
trainer_state.json's global_step (and its log history) edited to each number, mtimes in step
order. Timed, medians of 5 on a warm page cache, with empty result caches each time:
  listing   scan_directory of the 20 units (what `opsconsole checkpoints DIR` does)
  baseline  open + json.loads of the 20 trainer_state.json files, nothing else
and the ratio listing / baseline is printed (target <= 2x: a unit costs about what reading the
metadata the library wrote costs), and beside it the rescan with the caches kept (the console's
refresh of an unchanged directory).

Run: .venv/bin/python benchmarks/checkpoint_hf_units.py [--count 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
warnings.filterwarnings("ignore")
TARGET_RATIO = 2.0


def timed(fn, repeat: int = 5):
    """(median seconds over `repeat` runs, the last value): the median rides out a busy machine."""
    times = []
    value = None
    for _ in range(repeat):
        started = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2], value


def write_units(template: Path, folder: Path, count: int) -> list:
    """count copies of one real checkpoint-N/ with their trainer_state.json steps edited; oldest first."""
    state = json.loads((template / "trainer_state.json").read_text())
    now = time.time()
    paths = []
    for index in range(count):
        step = 100 * (index + 1)
        unit = folder / ("checkpoint-%d" % step)
        shutil.copytree(template, unit)
        edited = dict(state, global_step=step)
        for record in edited.get("log_history", []):
            record["step"] = min(record.get("step", step), step)
        if edited.get("best_model_checkpoint"):
            edited["best_model_checkpoint"] = str(folder / "checkpoint-100")
        (unit / "trainer_state.json").write_text(json.dumps(edited, indent=2))
        when = now - 3600 + index * 60
        for path in list(unit.iterdir()) + [unit]:
            os.utime(path, (when, when))
        paths.append(unit / "trainer_state.json")
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20)
    args = parser.parse_args()

    from opsconsole.checkpoints.cache import ResultCache
    from opsconsole.checkpoints.scan import scan_directory
    from tests.checkpoint_libraries import build_hf

    work = Path(tempfile.mkdtemp(prefix="ckpt-hf-units-"))
    try:
        started = time.perf_counter()
        run = build_hf(work / "build")
        built = time.perf_counter() - started
        template = run.output_dir / run.checkpoints[-1]
        folder = work / "run"
        folder.mkdir()
        states = write_units(template, folder, args.count)
        for path in folder.rglob("*"):
            if path.is_file():
                path.read_bytes()  # page cache warm

        def listing():
            return scan_directory(str(folder), cache=ResultCache(), crc_cache=ResultCache())

        def baseline():
            return [json.loads(path.read_bytes()) for path in states]

        listed_s, listed = timed(listing)
        baseline_s, _ = timed(baseline)
        # The console rescans on every refresh with its caches kept: what a refresh of an unchanged
        # directory costs (each file's size and mtime checked, nothing re-read).
        warm_cache, warm_crc = ResultCache(), ResultCache()
        scan_directory(str(folder), cache=warm_cache, crc_cache=warm_crc)
        warm_s, _ = timed(lambda: scan_directory(str(folder), cache=warm_cache, crc_cache=warm_crc))
        units = [e for e in listed.entries if e.name.startswith("checkpoint-")]
        steps = sorted(e.meta.step for e in units if e.meta.step is not None)
        unit_bytes = sum(p.stat().st_size for p in template.iterdir())
        ratio = listed_s / baseline_s if baseline_s > 0 else float("inf")
        print(
            "%d checkpoint-N/ units (%.0f kB each: %s), built from a real Trainer run in %.1f s"
            % (args.count, unit_bytes / 1e3, ", ".join(sorted(p.name for p in template.iterdir())), built)
        )
        print(
            "listed as units: %d, steps read: %d of %d, problems: %d"
            % (len(units), len(steps), args.count, sum(1 for e in listed.entries if e.problem))
        )
        print("listing (scan_directory, empty result cache): %8.2f ms" % (listed_s * 1e3))
        print("baseline (20 trainer_state.json, json.loads):  %8.2f ms" % (baseline_s * 1e3))
        print(
            "rescan with the caches kept (a console refresh): %8.2f ms, %.1fx the baseline"
            % (warm_s * 1e3, warm_s / baseline_s if baseline_s > 0 else float("inf"))
        )
        ok = ratio <= TARGET_RATIO and len(units) == args.count
        print("ratio listing / baseline: %.1fx (target <= %.0fx)  %s" % (ratio, TARGET_RATIO, "PASS" if ok else "FAIL"))
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
