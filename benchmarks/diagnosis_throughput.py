"""Lines per second of the diagnosis on healthy noise, beside one regex search per line; corpus accuracy.

The noise is every healthy log of the labelled corpus (tests/data/diagnosis/: NCCL INFO chatter,
tqdm bars, interleaved ranks, warnings, Megatron/HF/DeepSpeed progress lines) repeated to
--lines lines. Timed: Diagnoser.feed_text over all of them (what the Log pane runs on every line
of every rank). Baseline, in the same run: a plain loop doing one compiled regex search per line
(`CUDA out of memory`, the one signature a grep would use). The figure is the ratio of the two
rates, best of --repeat runs each, by wall clock and by this process's CPU time (on a shared, loaded
machine the wall clock also counts the time other processes held the core; the CPU time is the
diagnosis's own cost). Then the root-cause accuracy over the whole corpus, as
tests/test_diagnosis_corpus.py measures it.

    .venv/bin/python benchmarks/diagnosis_throughput.py [--lines 200000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from opsconsole.diagnosis.engine import Diagnoser, diagnose_lines  # noqa: E402

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "diagnosis")


def corpus():
    with open(os.path.join(CORPUS, "labels.json"), encoding="utf-8") as handle:
        labels = json.load(handle)
    for name, label in sorted(labels.items()):
        with open(os.path.join(CORPUS, name), "rb") as handle:
            yield name, label["root_cause"], handle.read().decode("utf-8", errors="replace").splitlines()


def healthy_noise(count: int):
    lines = [line for _, expected, text in corpus() if expected is None for line in text]
    return (lines * (count // len(lines) + 1))[:count]


def best_rates(run, lines, repeat: int) -> tuple:
    """(wall-clock rate, CPU-time rate) in lines/s, the best of `repeat` runs each."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        run(lines)
        cpu = min(cpu, time.process_time() - start_cpu)
        wall = min(wall, time.perf_counter() - start)
    return len(lines) / wall, len(lines) / max(cpu, 1e-9)


def run_diagnoser(lines) -> None:
    diagnoser = Diagnoser()
    feed = diagnoser.feed_text
    for number, line in enumerate(lines, 1):
        feed(line, number, "bench")
    if diagnoser.findings():
        raise SystemExit("healthy noise produced findings: %s" % diagnoser.findings()[0])


BASELINE = re.compile(r"CUDA out of memory")


def run_baseline(lines) -> None:
    search = BASELINE.search
    for line in lines:
        search(line)


def accuracy() -> tuple:
    results = [(expected, diagnose_lines(text, source=name).root_cause) for name, expected, text in corpus()]
    correct = sum(1 for expected, got in results if expected == got)
    flagged = sum(1 for expected, got in results if expected is None and got is not None)
    return correct, len(results), flagged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    lines = healthy_noise(args.lines)
    diagnosis, diagnosis_cpu = best_rates(run_diagnoser, lines, args.repeat)
    baseline, baseline_cpu = best_rates(run_baseline, lines, args.repeat)
    print("healthy noise: %d lines, mean %.0f chars" % (len(lines), sum(map(len, lines)) / len(lines)))
    print("                     %10s %10s" % ("wall clock", "CPU time"))
    print(
        "Diagnoser.feed_text: %10.0f %10.0f lines/s (%.2f / %.2f us/line)"
        % (diagnosis, diagnosis_cpu, 1e6 / diagnosis, 1e6 / diagnosis_cpu)
    )
    print(
        "one regex per line:  %10.0f %10.0f lines/s (%.2f / %.2f us/line)"
        % (baseline, baseline_cpu, 1e6 / baseline, 1e6 / baseline_cpu)
    )
    print(
        "ratio (baseline rate / diagnosis rate): %.1fx wall clock, %.1fx CPU time"
        % (baseline / diagnosis, baseline_cpu / diagnosis_cpu)
    )
    print("load average while measured: %.2f" % os.getloadavg()[0])
    correct, total, flagged = accuracy()
    print(
        "corpus root-cause accuracy: %.1f%% (%d/%d), healthy logs flagged: %d"
        % (100 * correct / total, correct, total, flagged)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
