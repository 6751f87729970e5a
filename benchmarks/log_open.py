"""Opening a 1 GB log and showing its last 200 lines, against `tail -n 200` as a subprocess in the same run.

Writes a training log of --size-mb (default 1024) into a temp dir made here: the seed's
'%(asctime)s - %(levelname)s - %(message)s' lines of varied length (steps, evals, checkpoint
saves, warnings, UTF-8 text), NCCL INFO chatter and multi-line tracebacks. Then times, each as
the median of --runs, cold-ish (the file's pages dropped from the page cache with
posix_fadvise(DONTNEED) before every run, for tail and for us alike) and warm:

  tail        subprocess.run(["tail", "-n", "200", FILE]) with its output captured
  open        what the Log pane draws when the console starts: LogHub.start on a config whose [logs]
              paths name the file (the follower finds it, reads its last page backwards from the
              end, makes LogLines and hands them to the loop), then the console's LogFeed hands the
              page to LogView.add (the pane's model; the pane draws its first lines at once) and
              its last 200 entries; after that LogFeed diagnoses the page and marks its findings
              (timed too: "diagnosed")
  last_lines  LogHub.last_lines(source, 200), what the pane calls to show the tail again after
              scrolling back (filetail.read_lines_before, index.py)

and checks that both give exactly tail's 200 lines. Printed: each median, its ratio to tail's,
the parts of `open` (the hub, the model), and when the page was diagnosed and marked.

    .venv/bin/python benchmarks/log_open.py [--size-mb 1024] [--runs 7] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsconsole.config import Config, LogsConfig  # noqa: E402
from opsconsole.logs.hub import LogHub  # noqa: E402
from opsconsole.logs.view import LogView  # noqa: E402

LINES_SHOWN = 200

TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/scratch/run42/train.py", line 412, in <module>',
    "    main()",
    '  File "/scratch/run42/train.py", line 388, in main',
    "    loss = train_epoch(model, optimizer, dataloader)",
    '  File "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py", line 631, in __next__',
    "    data = self._next_data()",
    "RuntimeError: DataLoader worker (pid 48213) is killed by signal: Bus error. It is possible that "
    "dataloader's workers are out of shared memory. Please try to raise your shared memory limit.",
]


def message_pool(rnd: random.Random, size: int = 8192) -> List[str]:
    """Finished lines without their timestamp: '- LEVEL - message', NCCL chatter, traceback lines."""
    pool = []
    for n in range(size):
        kind = rnd.random()
        step = rnd.randint(1, 5_000_000)
        if kind < 0.60:
            text = "INFO - Epoch %d Step %d/5000000 loss=%.4f lr=%.3e grad_norm=%.3f tokens/s=%d" % (
                step // 100000,
                step,
                3.0 / (1 + step / 1e6),
                3e-4,
                rnd.random() * 2,
                rnd.randint(100000, 500000),
            )
        elif kind < 0.75:
            text = (
                "INFO - step %d: throughput %d tokens/s, mem allocated %.2f GiB, reserved %.2f GiB, data wait "
                "%.1f ms, fwd %.1f ms, bwd %.1f ms"
                % (
                    step,
                    rnd.randint(100000, 500000),
                    rnd.random() * 80,
                    rnd.random() * 90,
                    rnd.random() * 20,
                    rnd.random() * 90,
                    rnd.random() * 180,
                )
            )
        elif kind < 0.80:
            text = "INFO - eval step %d: val_loss=%.4f ppl=%.2f acc=%.4f" % (
                step,
                rnd.random() * 3,
                rnd.random() * 30,
                rnd.random(),
            )
        elif kind < 0.82:
            text = "INFO - Checkpoint saved: /scratch/run42/ckpt/checkpoint_epoch_%d.pt (%.1f GiB) 训练进度 %.1f%%" % (
                step // 100000,
                rnd.random() * 20,
                rnd.random() * 100,
            )
        elif kind < 0.84:
            text = "WARNING - GPU %d temperature %d°C above 85°C; throttling possible" % (
                rnd.randint(0, 7),
                rnd.randint(86, 92),
            )
        elif kind < 0.85:
            text = "INFO - config: " + " ".join(
                "%s=%s" % ("key%d" % k, "v" * rnd.randint(1, 40)) for k in range(rnd.randint(20, 120))
            )  # a long line
        elif kind < 0.95:
            text = "\x00gpu-a%02d:%d:%d [%d] NCCL INFO Channel %02d/32 : %d[%d] -> %d[%d] via P2P/IPC/read" % (
                rnd.randint(1, 16),
                rnd.randint(1000, 9000),
                rnd.randint(1000, 9000),
                n % 8,
                n % 32,
                n % 16,
                n % 8,
                (n + 1) % 16,
                (n + 1) % 8,
            )
        else:
            text = "\x01"  # a traceback
        pool.append(text)
    return pool


def write_log(path: str, size: int, seed: int = 1) -> int:
    """Write about `size` bytes of training log; returns the number of lines."""
    rnd = random.Random(seed)
    pool = message_pool(rnd)
    second = int(time.time()) - size // 4000  # about 4 kB of log a second, ending now
    lines = 0
    written = 0
    with open(path, "wb") as out:
        while written < size:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
            block = []
            for millis in range(0, 1000, 25):
                text = pool[rnd.randrange(len(pool))]
                if text == "\x01":
                    block.extend(TRACEBACK)
                elif text[0] == "\x00":
                    block.append(text[1:])
                else:
                    block.append("%s,%03d - %s" % (stamp, millis, text))
            data = ("\n".join(block) + "\n").encode()
            out.write(data)
            written += len(data)
            lines += len(block)
            second += 1
    return lines


def drop_cache(path: str) -> None:
    """Evict the file's pages from the page cache (cold-ish: the next read goes to the disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_tail(path: str) -> Tuple[float, List[str]]:
    began = time.perf_counter()
    done = subprocess.run(["tail", "-n", str(LINES_SHOWN), path], capture_output=True, check=True)
    took = time.perf_counter() - began
    return took, done.stdout.decode("utf-8", "replace").split("\n")[:-1]


async def run_open(path: str) -> Tuple[Tuple[float, float, float], List[str], list, LogHub]:
    """From LogHub(...) to the pane's model holding the last page, through the console's LogFeed
    (which hands the lines over, then diagnoses them and marks what it found); returns the started hub too."""
    from opsconsole.diagnosis.engine import Diagnoser
    from opsconsole.diagnosis.progress import RunProgress
    from opsconsole.diagnosis.stalls import DEFAULT_STALL_AFTER
    from opsconsole.logs.feed import LogFeed

    got: list = []
    view = LogView()
    shown_at: List[float] = []
    arrived_at: List[float] = []
    diagnosed_at: List[float] = []

    def deliver(lines, findings) -> None:  # what the pane's add_lines does with the first lines: flush them
        got.extend(lines)
        view.add(lines, findings)
        shown_at.append(time.perf_counter())

    began = time.perf_counter()
    hub = LogHub(Config(logs=LogsConfig(paths=(path,))))
    feed = LogFeed(hub, Diagnoser(), deliver, view.mark, progress=RunProgress(DEFAULT_STALL_AFTER))
    take = feed.on_lines_in_loop

    def timed(lines) -> None:
        arrived_at.append(time.perf_counter())
        take(lines)
        diagnosed_at.append(time.perf_counter())

    feed.on_lines_in_loop = timed  # type: ignore[method-assign]
    await feed.start()
    while not diagnosed_at:  # start() returns once the first page went to on_lines; this is a safety net
        await asyncio.sleep(0.001)
    shown = [entry.line.text for entry in view.entries[-LINES_SHOWN:]]
    return (shown_at[0] - began, arrived_at[0] - began, diagnosed_at[0] - began), shown, got, hub


async def run_last_lines(hub: LogHub) -> Tuple[float, List[str]]:
    key = hub.sources()[0].key
    began = time.perf_counter()
    lines = await hub.last_lines(key, LINES_SHOWN)
    took = time.perf_counter() - began
    return took, [line.text for line in lines]


async def measure(path: str, runs: int, cold: bool) -> dict:
    times: dict = {"tail": [], "open": [], "open_hub": [], "open_diagnosed": [], "last_lines": []}
    page_lines: List[int] = []
    prepare: Callable[[], None] = (lambda: drop_cache(path)) if cold else (lambda: None)
    for run in range(runs):
        # Alternate who goes first, so neither always finds the other's reads in the cache.
        order = ("tail", "ours") if run % 2 == 0 else ("ours", "tail")
        for who in order:
            prepare()
            if who == "tail":
                took, expected = run_tail(path)
                times["tail"].append(took)
                continue
            (took, took_hub, took_diagnosed), shown, page, hub = await run_open(path)
            times["open"].append(took)
            times["open_hub"].append(took_hub)
            times["open_diagnosed"].append(took_diagnosed)
            page_lines.append(len(page))
            try:
                # The pane asks for the last lines after the user scrolled back: the index is built by then.
                for index in hub._indexes.values():
                    await asyncio.to_thread(index.wait, 60.0)
                prepare()
                took_last, last = await run_last_lines(hub)
                times["last_lines"].append(took_last)
            finally:
                await hub.stop()
        if shown != expected or last != expected:
            raise SystemExit(
                "MISMATCH: the console's last %d lines differ from tail's (open %s, last_lines %s)"
                % (LINES_SHOWN, shown == expected, last == expected)
            )
    return {name: statistics.median(values) for name, values in times.items()} | {
        "page_lines": statistics.median(page_lines)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (and print where it is)")
    args = parser.parse_args()
    folder = tempfile.mkdtemp(prefix="opsconsole-logopen-")
    path = os.path.join(folder, "train_gpu-a01_rank0_20261202_230800.log")
    try:
        began = time.perf_counter()
        lines = write_log(path, args.size_mb << 20)
        print(
            "wrote %s: %.2f GB, %d lines, in %.1f s"
            % (path, os.path.getsize(path) / 1e9, lines, time.perf_counter() - began)
        )
        results = {}
        for label, cold in (("cold-ish (page cache dropped before each run)", True), ("warm", False)):
            result = asyncio.run(measure(path, args.runs, cold))
            results[label] = result
            print("%s, median of %d:" % (label, args.runs))
            print("  tail -n %d (subprocess)   %7.2f ms" % (LINES_SHOWN, result["tail"] * 1e3))
            print(
                "  open: LogHub.start -> LogFeed -> LogView, last %d of the first page (%d lines)   %7.2f ms   ratio %.2f"
                % (LINES_SHOWN, result["page_lines"], result["open"] * 1e3, result["open"] / result["tail"])
            )
            print(
                "    of which LogHub (start to the LogLines on the loop) %.2f ms (ratio %.2f), LogView.add %.2f ms"
                % (
                    result["open_hub"] * 1e3,
                    result["open_hub"] / result["tail"],
                    (result["open"] - result["open_hub"]) * 1e3,
                )
            )
            print(
                "    then diagnosed and its findings marked: %.2f ms from the start (ratio %.2f)"
                % (result["open_diagnosed"] * 1e3, result["open_diagnosed"] / result["tail"])
            )
            print(
                "  LogHub.last_lines(%d)      %7.2f ms   ratio %.2f"
                % (LINES_SHOWN, result["last_lines"] * 1e3, result["last_lines"] / result["tail"])
            )
        print("the 200 lines are identical to tail's in every run (open and last_lines)")
        worst = max(max(r["open"], r["last_lines"]) / r["tail"] for r in results.values())
        print(
            "target (no slower than tail -n 200): %s (worst ratio %.2f)" % ("met" if worst <= 1.0 else "MISSED", worst)
        )
    finally:
        if args.keep:
            print("kept", folder)
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
