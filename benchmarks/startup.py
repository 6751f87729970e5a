"""From launch to the first drawn frame with data, beside `python -c "import textual.app"`.

Target (issue 2): at most 1.0 s. The console writes the moment it has painted its first
frame with data to $OPSCONSOLE_FIRST_FRAME_FILE (set only by this benchmark), then the
benchmark quits it. Both are measured in the same run, median of --runs.

    .venv/bin/python benchmarks/startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from pty_run import PtyProcess, compile_sources, console_argv


def time_import_textual() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import textual.app"], check=True)
    return time.perf_counter() - start


def time_first_frame(timeout: float = 20.0) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        marker = os.path.join(tmp, "first-frame")
        console = PtyProcess(console_argv("--interval", "1"), env={"OPSCONSOLE_FIRST_FRAME_FILE": marker})
        try:
            deadline = time.perf_counter() + timeout
            while not os.path.exists(marker):
                if time.perf_counter() > deadline or console.proc.poll() is not None:
                    raise RuntimeError("the console drew no frame with data")
                time.sleep(0.005)
            return time.perf_counter() - console.started
        finally:
            console.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    compile_sources()
    imports = [time_import_textual() for _ in range(args.runs)]
    frames = [time_first_frame() for _ in range(args.runs)]
    imp, frame = statistics.median(imports), statistics.median(frames)
    print(f"python -c 'import textual.app'   median {imp:.3f} s  (runs: {', '.join(f'{t:.3f}' for t in imports)})")
    print(f"launch to first frame with data  median {frame:.3f} s  (runs: {', '.join(f'{t:.3f}' for t in frames)})")
    print(f"ratio first-frame / import       {frame / imp:.2f} x   (target: first frame <= 1.0 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
