"""What auditing costs an action: a command run through the ActionRunner beside the same command run bare.

The runner appends and fsyncs the attempt record before the command and the result record
after; this measures the wall time of N runs of `true` both ways, interleaved in the same
run (so disk and CPU state are shared), and prints the median of each and their ratio.
Also the cost of one fsynced audit append on its own.

    .venv/bin/python benchmarks/action_overhead.py [--runs 200] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsconsole.actions.audit import AuditLog  # noqa: E402
from opsconsole.actions.runner import ActionRunner, run_local  # noqa: E402


async def measure(runs: int, folder: str) -> dict:
    audit = AuditLog(str(Path(folder) / "audit.log"))
    runner = ActionRunner(audit)
    argv = ["true"]
    bare, audited, appends = [], [], []
    for _ in range(5):  # warm-up: first exec, first open of the log
        await run_local(argv, 10)
        await runner.run("bench", "local", "none", argv, lambda: run_local(argv, 10))
    for _ in range(runs):
        started = time.perf_counter()
        await run_local(argv, 10)
        bare.append(time.perf_counter() - started)
        started = time.perf_counter()
        outcome = await runner.run("bench", "local", "none", argv, lambda: run_local(argv, 10))
        audited.append(time.perf_counter() - started)
        assert outcome.ok, outcome.summary()
        started = time.perf_counter()
        audit.write_entry("bench", "local", "append only", "ok", command=argv)
        appends.append(time.perf_counter() - started)
    return {
        "runs": runs,
        "bare_ms": statistics.median(bare) * 1000,
        "audited_ms": statistics.median(audited) * 1000,
        "append_ms": statistics.median(appends) * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--dir", default=None, help="where the audit log goes (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        result = asyncio.run(measure(args.runs, folder))
    print("runs %d, audit log in %s" % (result["runs"], args.dir or tempfile.gettempdir()))
    print("bare `true`:            median %.2f ms" % result["bare_ms"])
    print("through ActionRunner:   median %.2f ms (attempt + result, both fsynced)" % result["audited_ms"])
    print("one fsynced append:     median %.3f ms" % result["append_ms"])
    print("ratio audited / bare:   %.2fx" % (result["audited_ms"] / result["bare_ms"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
