"""Flight-recorder dumps read and matched (`opsconsole fr`) beside a plain pickle.loads of the same files.

Dumps are built from the real H200 dump (tests/data/flight_recorder/nccl_trace_rank_0): its entries
repeated to --entries collectives, each with a --frames-deep stack of fresh dicts (as torch writes
them), one file per rank. Timed: analyse_dir over the directory (the restricted unpickler in the
limited workers, validation, the stacks sent once, the matching). Baseline, in the same run: plain
`pickle.loads` of every file in this process (no limits, no checks, nothing matched). The figure is
the ratio of the two times, and the worker's peak memory against its RLIMIT_AS.

    .venv/bin/python benchmarks/fr_read.py [--ranks 8] [--entries 2000] [--frames 40]
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from opsconsole.hang.flight_recorder import analyse_dir, dump_workers  # noqa: E402

REAL = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "flight_recorder", "nccl_trace_rank_0"
)


def build(directory: str, ranks: int, entries: int, frames: int) -> int:
    with open(REAL, "rb") as handle:
        trace = pickle.load(handle)  # our own fixture
    base = trace["entries"]
    made = []
    for index in range(entries):
        entry = dict(base[index % len(base)], collective_seq_id=index + 1, record_id=index)
        entry["frames"] = [
            {
                "name": "fn%d" % depth,
                "filename": "/opt/venv/lib/python3.12/site-packages/pkg/m%d.py" % depth,
                "line": 100 + depth,
            }
            for depth in range(frames)
        ]
        made.append(entry)
    trace["entries"] = made
    trace["pg_config"]["0"]["ranks"] = str(list(range(ranks)))
    data = pickle.dumps(trace, protocol=2)
    for rank in range(ranks):
        with open(os.path.join(directory, "nccl_trace_rank_%d" % rank), "wb") as out:
            out.write(data)
    return len(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--frames", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        size = build(directory, args.ranks, args.entries, args.frames)
        print(
            "%d dumps of %d entries, %d-frame stacks: %.1f MB each"
            % (args.ranks, args.entries, args.frames, size / 1e6)
        )
        started = time.monotonic()
        for name in sorted(os.listdir(directory)):
            with open(os.path.join(directory, name), "rb") as handle:
                pickle.loads(handle.read())
        baseline = time.monotonic() - started
        started = time.monotonic()
        analysis = analyse_dir(directory)
        ours = time.monotonic() - started
        unreadable = [dump.unreadable for dump in analysis.dumps if dump.unreadable]
        print("pickle.loads of every file, in process: %.2f s" % baseline)
        print(
            "opsconsole fr (workers, checks, matching): %.2f s%s"
            % (ours, "  UNREADABLE: %s" % unreadable if unreadable else "")
        )
        print("ratio: %.1fx" % (ours / baseline if baseline else float("inf")))
        stats = dump_workers().stats()
        print(
            "a worker's peak resident memory: %.0f MiB (RLIMIT_AS %d MiB)"
            % (stats.get("VmHWM", 0) / 1024, dump_workers().limits.memory_bytes // (1024 * 1024))
        )


if __name__ == "__main__":
    main()
