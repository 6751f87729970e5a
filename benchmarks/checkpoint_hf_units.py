"""Listing 20 Hugging Face `checkpoint-N/` units against reading their trainer_state.json files alone.

One real checkpoint is written by a tiny HF `Trainer` run (tests/checkpoint_libraries.py: GPT-2
from a config, CPU, offline), then copied 20 times as checkpoint-100 ... checkpoint-2000 with
trainer_state.json's global_step (and its log history) edited to each number, mtimes in step
order. A listing proves every member of each unit (the safetensors header and the size it
implies; optimizer.pt, scheduler.pt, rng_state.pth and training_args.bin by their zip end and
directory) and reads trainer_state.json. Timed, medians of 9 in one process:
  baseline     open + json.loads of the 20 trainer_state.json files, nothing else
  first        a directory never listed: no result in memory, no proof kept on disk
  new process  what every later `opsconsole checkpoints DIR` process does: no result in memory,
               the proofs and unit results kept on disk by an earlier listing ($XDG_CACHE_HOME;
               here a temp dir), each file's identity checked against them
  rescan       the console's refresh of an unchanged directory (results kept in memory)
  floor        every member file of every unit opened and read once, nothing parsed: what no
               first listing can go under (160 files against the baseline's 20); and the root
               listed with an lstat of each member: what no listing that trusts a kept result
               only for the same identities can go under (a unit directory whose own identity
               is unchanged holds the names it held: it is not listed again)
each on a warm page cache, and the first three again with the files' data evicted from the page
cache before every run (posix_fadvise DONTNEED on each file, the store's too: dropping all caches
needs /proc/sys/vm/drop_caches, read-only here; directories and inodes stay cached). Ratios are
printed against the baseline of the same run (target <= 2x), and the process wall times of a
fresh `python` listing vs a fresh `python` reading the JSON files (interpreter and imports in both).

Run: .venv/bin/python benchmarks/checkpoint_hf_units.py [--count 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
warnings.filterwarnings("ignore")
TARGET_RATIO = 2.0


def timed(fn, repeat: int = 9, before=None):
    """(median seconds over `repeat` runs, the last value): the median rides out a busy machine."""
    times = []
    value = None
    for _ in range(repeat):
        if before is not None:
            before()
        started = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2], value


def evict(*folders: Path) -> None:
    """Drop the files' data from the page cache (each file's own pages: no root needed)."""
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def wait_until_old(folder: Path, seconds: float) -> None:
    """Until every file's ctime is `seconds` old: proofs are kept only for files that old (proofs.RACY_S)."""
    while True:
        newest = max(p.lstat().st_ctime_ns for p in folder.rglob("*"))
        left = seconds - (time.time_ns() - newest) / 1e9
        if left <= 0:
            return
        time.sleep(left + 0.05)


def process_seconds(code: str, repeat: int = 5) -> float:
    """Median wall time of a fresh interpreter running `code` (its start and imports included)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


# The same three timings in a process that imports what `opsconsole checkpoints` imports and nothing
# else: this one holds torch, transformers and the Trainer run (hundreds of thousands of objects),
# which slows every allocation-heavy step a little, the listings more than json.loads.
LEAN_PROCESS = """
import json, shutil, sys, time
from opsconsole.checkpoints import proofs
from opsconsole.checkpoints.cache import ResultCache
from opsconsole.checkpoints.scan import scan_directory
folder, kept, empty, states = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]

def timed(fn, repeat=9, before=None):
    times = []
    for _ in range(repeat):
        if before is not None:
            before()
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return sorted(times)[repeat // 2]

def listing(store_dir):
    store = proofs.ProofStore("local", folder, store_dir)
    scan_directory(folder, cache=ResultCache(), crc_cache=ResultCache(), proofs=store)
    return store

def forget_proofs():
    shutil.rmtree(empty, ignore_errors=True)

listing(kept)
first = timed(lambda: listing(empty), before=forget_proofs)
new = timed(lambda: listing(kept))
base = timed(lambda: [json.loads(open(p, "rb").read()) for p in states])
print(json.dumps({"base": base, "first": first, "new": new, "whole": listing(kept).listing_hits}))
"""


def lean_process_seconds(folder: Path, kept: Path, empty: Path, states: list) -> dict:
    """LEAN_PROCESS's medians: the baseline, a first listing and a new process's listing, in seconds."""
    out = subprocess.run(
        [sys.executable, "-c", LEAN_PROCESS, str(folder), str(kept), str(empty)] + [str(p) for p in states],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


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

    from opsconsole.checkpoints import proofs
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
        wait_until_old(folder, proofs.RACY_S)
        kept = work / "kept"
        empty = work / "empty"

        def read_all() -> None:
            for path in folder.rglob("*"):
                if path.is_file():
                    path.read_bytes()  # page cache warm

        stores = []

        def listing(store_dir: Path):
            store = proofs.ProofStore("local", str(folder), str(store_dir))
            stores[:] = [store]
            return scan_directory(str(folder), cache=ResultCache(), crc_cache=ResultCache(), proofs=store)

        def forget_proofs() -> None:
            """A first listing finds no store: removed before each run, outside the timed span."""
            shutil.rmtree(empty, ignore_errors=True)

        def baseline():
            return [json.loads(path.read_bytes()) for path in states]

        members = sorted(p for p in folder.rglob("*") if p.is_file())

        member_paths = [str(p) for p in members]

        def stat_every_member():
            """A new process's I/O floor: the root listed with each unit's lstat, and each member's identity
            (lstat) read; the units' own names come from the kept listing while their directories' identities
            are unchanged (ProofStore.kept_names)."""
            for unit in os.listdir(folder):
                os.lstat(os.path.join(folder, unit))
            for path in member_paths:
                os.lstat(path)

        def open_every_member():
            """The first listing's I/O floor: each member of each unit opened and read once, nothing parsed."""
            for path in members:
                with open(path, "rb", buffering=0) as handle:
                    handle.read()

        read_all()
        listing(kept)  # the earlier listing whose proofs a new process finds
        warm_first_s, listed = timed(lambda: listing(empty), before=forget_proofs)
        warm_new_s, _ = timed(lambda: listing(kept))
        kept_use = (
            "whole listing"
            if stores[0].listing_hits
            else "%d unit results, %d file proofs"
            % (
                stores[0].unit_hits,
                stores[0].hits,
            )
        )
        warm_base_s, _ = timed(baseline)
        warm_floor_s, _ = timed(open_every_member)
        warm_stat_floor_s, _ = timed(stat_every_member)
        memory, memory_crc = ResultCache(), ResultCache()
        scan_directory(str(folder), cache=memory, crc_cache=memory_crc, keep_proofs=False)
        rescan_s, _ = timed(lambda: scan_directory(str(folder), cache=memory, crc_cache=memory_crc, keep_proofs=False))
        cold_first_s, _ = timed(lambda: listing(empty), before=lambda: (forget_proofs(), evict(folder)))
        cold_new_s, _ = timed(lambda: listing(kept), before=lambda: evict(folder, kept))
        cold_base_s, _ = timed(baseline, before=lambda: evict(folder))
        cold_floor_s, _ = timed(open_every_member, before=lambda: evict(folder))
        read_all()
        state_list = ", ".join(repr(str(p)) for p in states)
        process_list = process_seconds(
            "import os; os.environ['XDG_CACHE_HOME'] = %r\n"
            "from opsconsole.checkpoints.scan import scan_directory; scan_directory(%r)"
            % (str(work / "xdg"), str(folder))
        )
        process_list_kept = process_seconds(
            "import os; os.environ['XDG_CACHE_HOME'] = %r\n"
            "from opsconsole.checkpoints.scan import scan_directory; scan_directory(%r)"
            % (str(work / "xdg"), str(folder))
        )
        process_base = process_seconds("import json\nfor p in [%s]: json.loads(open(p, 'rb').read())" % state_list)
        lean = [lean_process_seconds(folder, work / "lean-kept", work / "lean-empty", states) for _ in range(3)]

        units = [e for e in listed.entries if e.name.startswith("checkpoint-")]
        steps = sorted(e.meta.step for e in units if e.meta.step is not None)
        unit_bytes = sum(p.stat().st_size for p in template.iterdir())
        print(
            "%d checkpoint-N/ units (%.0f kB each: %s), built from a real Trainer run in %.1f s"
            % (args.count, unit_bytes / 1e3, ", ".join(sorted(p.name for p in template.iterdir())), built)
        )
        print("a new process took from the proofs kept on disk: %s" % kept_use)
        print(
            "listed as units: %d, steps read: %d of %d, problems: %d, integrity: %s"
            % (
                len(units),
                len(steps),
                args.count,
                sum(1 for e in listed.entries if e.problem),
                ", ".join(sorted({e.integrity for e in units})),
            )
        )
        rows = [
            ("page cache warm", "baseline (trainer_state.json, json.loads)", warm_base_s, warm_base_s),
            ("page cache warm", "first listing (nothing kept)", warm_first_s, warm_base_s),
            ("page cache warm", "new process (proofs kept on disk)", warm_new_s, warm_base_s),
            ("page cache warm", "rescan (results kept in memory)", rescan_s, warm_base_s),
            ("page cache warm", "floor: open + read all %d member files" % len(members), warm_floor_s, warm_base_s),
            ("page cache warm", "floor: list the root, lstat all %d" % len(members), warm_stat_floor_s, warm_base_s),
            ("files evicted", "baseline (trainer_state.json, json.loads)", cold_base_s, cold_base_s),
            ("files evicted", "first listing (nothing kept)", cold_first_s, cold_base_s),
            ("files evicted", "new process (proofs kept on disk)", cold_new_s, cold_base_s),
            ("files evicted", "floor: open + read all %d member files" % len(members), cold_floor_s, cold_base_s),
        ]
        for cache_state, what, seconds, base in rows:
            ratio = seconds / base if base > 0 else float("inf")
            verdict = (
                ""
                if seconds is base or what.startswith("floor")
                else ("  <= 2x" if ratio <= TARGET_RATIO else "  over 2x")
            )
            print("%-16s %-44s %8.2f ms  %5.2fx%s" % (cache_state, what, seconds * 1e3, ratio, verdict))
        print(
            "first listing against its floor (every member opened and read once): %.2fx page cache warm,"
            " %.2fx files evicted; new process against its floor (every member's identity read): %.2fx"
            % (warm_first_s / warm_floor_s, cold_first_s / cold_floor_s, warm_new_s / warm_stat_floor_s)
        )
        print(
            "fresh processes (interpreter and imports included): listing %.0f ms, again with its proofs kept"
            " %.0f ms; json.loads of the files %.0f ms: %.2fx, %.2fx"
            % (
                process_list * 1e3,
                process_list_kept * 1e3,
                process_base * 1e3,
                process_list / process_base,
                process_list_kept / process_base,
            )
        )
        print(
            "in a lean process (only opsconsole imported, as the CLI; medians of 9, three processes): new process"
            " %s, first listing %s"
            % (
                ", ".join("%.2fx" % (run["new"] / run["base"]) for run in lean),
                ", ".join("%.2fx" % (run["first"] / run["base"]) for run in lean),
            )
            + ("" if all(run["whole"] for run in lean) else " (the kept listing was NOT used)")
        )
        met = {
            "new process": warm_new_s / warm_base_s <= TARGET_RATIO,
            "rescan": rescan_s / warm_base_s <= TARGET_RATIO,
            "first listing": warm_first_s / warm_base_s <= TARGET_RATIO,
        }
        print(
            "target <= %.0fx (page cache warm): %s"
            % (TARGET_RATIO, ", ".join("%s %s" % (k, "met" if v else "NOT met") for k, v in met.items()))
        )
        return 0 if all(met.values()) and len(units) == args.count else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
