"""Where the console's launch goes, beside the Textual floor (and an earlier tree), in one run.

Each round launches, one after the other in 140x45 ptys: this tree's console, the Textual floor
app (benchmarks/textual_floor_app.py: stock widgets drawing the overview's screen, no GPU read) and,
with --before DIR, the console of an earlier tree (its opsconsole/ first on the path). Printed per
tool: the median and minimum of the launch to the GPU's name on screen over the rounds, and the
console's launch marks (opsconsole/launch_trace.py: arguments parsed, first poll done, textual
imported, app mounted, first frame drawn), each as seconds since its process started; then the
ratio of the medians against the floor of the same run (machines differ from lease to lease by
up to 2x: only the ratios compare between runs). With --imports, one launch each under
`python -X importtime`, and the modules the console imports that the floor does not, by self time.

    python benchmarks/launch_breakdown.py [--rounds 9] [--before DIR] [--imports] [--gpu-name TEXT]

On a machine without a GPU, --gpu-name names the text to wait for (the host name, say).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from typing import Dict, List

from pty_run import compile_sources
from vs_nvitop import WatchedPty, gpu_name, launch_once, model_of, tools

# Textual writes the screen to stderr, where -X importtime writes too: the launched program's
# stderr becomes a file and Textual gets a copy of the terminal's descriptor.
IMPORTTIME_WRAPPER = """
import os, runpy, sys
terminal = os.dup(2)
os.dup2(os.open(os.environ["IMPORTTIME_FILE"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
sys.stderr = sys.__stderr__ = open(terminal, "w", buffering=1)
target, sys.argv = sys.argv[1], sys.argv[1:]
if target == "-m":
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(target, run_name="__main__")
"""
BEFORE_RUNNER = """
import runpy, sys
sys.path.insert(0, sys.argv.pop(1))
sys.argv = ["opsconsole"] + sys.argv[1:]
runpy.run_module("opsconsole", run_name="__main__", alter_sys=True)
"""


def self_times(path: str) -> Dict[str, int]:
    """Module -> its own import time (us), from -X importtime's lines."""
    times: Dict[str, int] = {}
    with open(path) as lines:
        for line in lines:
            match = re.match(r"import time:\s+(-?\d+) \|\s+(\d+) \|\s*(\S+)", line)
            if match:
                times[match.group(3)] = int(match.group(1))
    return times


def import_breakdown(argvs: Dict[str, List[str]], needle: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        found = {}
        for tool in ("opsconsole", "textual-floor"):
            path = os.path.join(tmp, tool)
            argv = argvs[tool]
            wrapped = [argv[0], "-X", "importtime", "-c", IMPORTTIME_WRAPPER] + argv[1:]
            proc = WatchedPty(wrapped, needle, env={"IMPORTTIME_FILE": path})
            time.sleep(3)
            proc.stop(b"q")
            found[tool] = self_times(path)
    ours, floor = found["opsconsole"], found["textual-floor"]
    extra = {name: us for name, us in ours.items() if name not in floor}
    print(
        "imports, self time: opsconsole %.1f ms, the floor %.1f ms; %d modules only the console imports, %.1f ms"
        % (sum(ours.values()) / 1e3, sum(floor.values()) / 1e3, len(extra), sum(extra.values()) / 1e3)
    )
    for name, us in sorted(extra.items(), key=lambda item: -item[1])[:25]:
        print("  %7.2f ms  %s" % (us / 1e3, name))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--before", metavar="DIR", help="an earlier tree (its opsconsole/) launched in the same rounds")
    parser.add_argument("--imports", action="store_true", help="add the import-time breakdown")
    parser.add_argument("--gpu-name", help="the text to wait for instead of the GPU's model (a VM without GPUs)")
    args = parser.parse_args()
    name = args.gpu_name or model_of(gpu_name())
    needle = name.encode()
    every = tools("1", name)
    argvs = {"opsconsole": every["opsconsole"], "textual-floor": every["textual-floor"]}
    if args.before:
        argvs["before"] = [sys.executable, "-c", BEFORE_RUNNER, os.path.abspath(args.before), "--interval", "1"]
    compile_sources()
    for tool, argv in argvs.items():
        launch_once(argv, needle, tool)  # the page cache warm, not counted
    shown: Dict[str, List[float]] = {tool: [] for tool in argvs}
    marks: Dict[str, Dict[str, List[float]]] = {tool: {} for tool in argvs}
    for _ in range(args.rounds):
        for tool, argv in argvs.items():
            result = launch_once(argv, needle, tool)
            if result["name_shown_s"] is not None:
                shown[tool].append(result["name_shown_s"])
            for mark, seconds in (result["marks"] or {}).items():
                marks[tool].setdefault(mark, []).append(seconds)
    floor = statistics.median(shown["textual-floor"]) if shown["textual-floor"] else None
    print("GPU %s; %d rounds; launch to the GPU's name on screen, s:" % (name, args.rounds))
    for tool, times in shown.items():
        if not times:
            print("  %-14s never showed it" % tool)
            continue
        median = statistics.median(times)
        print(
            "  %-14s median %.3f  min %.3f  (%.2fx the floor)  %s"
            % (tool, median, min(times), median / floor if floor else float("nan"), " ".join("%.3f" % t for t in times))
        )
        for mark, seconds in marks[tool].items():
            print("      %-34s median %.3f" % (mark, statistics.median(seconds)))
    if args.imports:
        import_breakdown(argvs, needle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
