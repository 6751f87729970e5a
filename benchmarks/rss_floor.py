"""What the console's memory is made of: RSS of the interpreter, of the probe's libraries with NVML
started, of a minimal Textual app at its first screen, and of the console at its first frame.

Issue 17's RSS target is 60 MB (nvitop: one process with psutil, pynvml and curses). A Textual app
pays for Textual and Rich before it draws anything, and the console reads the GPUs in-process, so
its floor is about the minimal Textual app plus what NVML adds to an interpreter; this prints that
floor beside the console, measured in the same run (NVML parts "n/a" on a machine without it).

    python benchmarks/rss_floor.py [--settle 3] [--breakdown] [--rounds 3]

--breakdown adds what the console holds above the floor app that draws the same screen
(benchmarks/textual_floor_app.py), both run in ptys by benchmarks/rss_reporter.py: RSS (median of
--rounds, interleaved), the modules only the console loads and what each import left allocated
(tracemalloc, the module's own part), the Python allocations alive at the steady state by file
(one tracemalloc run of each), and the shared libraries resident.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

from pty_run import PtyProcess, console_argv

MB = 1e6

BARE = "pass"
# What nvitop's process holds besides its drawing: psutil, pynvml, NVML started with a handle open.
NVML = """
import psutil, pynvml
pynvml.nvmlInit()
pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
"""
MINIMAL_TEXTUAL = """
import os, sys
from textual.app import App
from textual.widgets import Footer, Static, TabbedContent, TabPane

class Minimal(App):
    def compose(self):
        with TabbedContent():
            with TabPane("GPU"):
                yield Static("GPU 0")
        yield Footer()

    def on_mount(self):
        self.call_after_refresh(lambda: open(sys.argv[1], "w").close())

Minimal().run()
"""


def rss_of(pid: int) -> int:
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def script_rss(code: str) -> Optional[int]:
    """RSS at the end of a plain `python -c code` (the script prints its own), None when it fails."""
    probe = code + "\nprint([l for l in open('/proc/self/status') if l.startswith('VmRSS:')][0].split()[1])"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return None
    return int(done.stdout.split()[-1]) * 1024


def pty_rss(argv, env_marker: Optional[str], settle: float, timeout: float = 30.0) -> Optional[int]:
    """RSS of a full-screen program in a pty, `settle` s after it says its first screen is drawn
    (it creates the marker file: passed as $env_marker, or as its last argument)."""
    with tempfile.TemporaryDirectory() as tmp:
        marker = os.path.join(tmp, "drawn")
        env = {env_marker: marker} if env_marker else {}
        proc = PtyProcess(argv + ([] if env_marker else [marker]), env=env)
        try:
            deadline = time.perf_counter() + timeout
            while not os.path.exists(marker):
                if time.perf_counter() > deadline or proc.proc.poll() is not None:
                    return None
                time.sleep(0.01)
            time.sleep(settle)
            return rss_of(proc.proc.pid)
        finally:
            proc.stop()


REPORTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rss_reporter.py")
KB = 1000.0  # /proc's kB are KiB: shown as MB (1e6 bytes) below, as the lines above


def reported(which: str, settle: float, traced: bool = False, timeout: float = 300.0) -> Optional[dict]:
    """rss_reporter.py's report of the console or the floor app, run in a pty; None when it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        argv = [sys.executable, REPORTER, out, str(settle), which] + (["traced"] if traced else [])
        proc = PtyProcess(argv)
        try:
            deadline = time.perf_counter() + timeout
            while not os.path.exists(out):
                if time.perf_counter() > deadline or proc.proc.poll() is not None:
                    return None
                time.sleep(0.05)
            with open(out) as f:
                return json.load(f)
        finally:
            proc.stop()


def module_group(name: str) -> str:
    """opsconsole.tui.app -> opsconsole.tui; msgspec._core -> msgspec; ctypes.util -> ctypes."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "opsconsole" and len(parts) > 1 else parts[0]


def short_path(path: str) -> str:
    for marker in ("/site-packages/", "/lib/python3."):
        if marker in path:
            tail = path.split(marker, 1)[1]
            return tail if marker == "/site-packages/" else "stdlib/" + tail.split("/", 1)[-1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/"
    return path[len(root) :] if path.startswith(root) else path


def file_group(path: str) -> str:
    """A traced allocation's file as the breakdown sums it."""
    if "importlib._bootstrap_external" in path:
        return "code objects of every module (unmarshalled .pyc)"
    shown = short_path(path)
    if shown.startswith("textual/"):
        return "textual (widgets, styles, render caches)"
    if shown.startswith("rich/"):
        return "rich (segments, styles)"
    if shown == "pynvml.py":
        return "pynvml.py (its tables and classes; in NVML's share of the GPU node's floor)"
    if shown.startswith("opsconsole/"):
        return shown
    if shown.startswith("stdlib/") or shown.startswith("<"):
        return "stdlib and interpreter"
    return shown.split("/", 1)[0]


def diff(console: Dict[str, float], floor: Dict[str, float]) -> List[Tuple[str, float]]:
    keys = set(console) | set(floor)
    return sorted(((key, console.get(key, 0) - floor.get(key, 0)) for key in keys), key=lambda kv: -abs(kv[1]))


def breakdown(settle: float, rounds: int) -> int:
    """What the console holds above the floor app, printed as tables (MB = 1e6 bytes)."""
    plain: Dict[str, List[dict]] = {"console": [], "floor": []}
    for _ in range(rounds):
        for which in ("console", "floor"):
            report = reported(which, settle)
            if report is None:
                print("%s: no report (it did not draw its first screen)" % which)
                return 1
            plain[which].append(report)
    rss = {which: [r["status"]["VmRSS"] for r in reports] for which, reports in plain.items()}
    ratios = [c / f for c, f in zip(rss["console"], rss["floor"])]
    print()
    print(
        "console vs the floor app drawing the same screen (%d rounds, interleaved, %g s after the first screen)"
        % (rounds, settle)
    )
    print("| | console | floor app | console - floor |")
    print("| --- | --- | --- | --- |")
    for key in ("VmRSS", "RssAnon", "RssFile"):
        c = statistics.median(r["status"][key] for r in plain["console"])
        f = statistics.median(r["status"][key] for r in plain["floor"])
        print("| %s, MB (median) | %.2f | %.2f | %+.2f |" % (key, c * 1024 / 1e6, f * 1024 / 1e6, (c - f) * 1024 / 1e6))
    print("| console / floor app, same round (median) | %.4f | | |" % statistics.median(ratios))
    print("| modules loaded | %d | %d | %+d |" % (
        len(plain["console"][0]["modules"]), len(plain["floor"][0]["modules"]),
        len(plain["console"][0]["modules"]) - len(plain["floor"][0]["modules"])))  # fmt: skip
    print(
        "| threads | %s | %s | |" % (", ".join(plain["console"][0]["threads"]), ", ".join(plain["floor"][0]["threads"]))
    )

    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for which in ("floor", "console"):
            paths.append(os.path.join(tmp, which + ".json"))
            with open(paths[-1], "w") as out:
                json.dump(plain[which][0], out)
        costs_path = os.path.join(tmp, "imports.json")
        subprocess.run([sys.executable, REPORTER, costs_path, "0", "imports", *paths], check=True, timeout=300)
        with open(costs_path) as f:
            costs = json.load(f)
        subprocess.run([sys.executable, REPORTER, costs_path, "0", "imports-rss", *paths], check=True, timeout=300)
        with open(costs_path) as f:
            import_rss = json.load(f)["rss"]
    groups: Dict[str, List[Tuple[str, int]]] = {}
    for name, size in costs["own"].items():
        groups.setdefault(module_group(name), []).append((name, size))
    total = sum(costs["own"].values())
    print()
    print("modules only the console loads: what each import left allocated (tracemalloc, its own part; no pty)")
    print("| group | modules | MB | largest |")
    print("| --- | --- | --- | --- |")
    for group, members in sorted(groups.items(), key=lambda kv: -sum(s for _, s in kv[1])):
        size = sum(s for _, s in members)
        if size < 20_000:
            continue
        largest = ", ".join("%s %.0f kB" % (n, s / KB) for n, s in sorted(members, key=lambda m: -m[1])[:3])
        print("| %s | %d | %.2f | %s |" % (group, len(members), size / 1e6, largest))
    print("| all %d | | %.2f | their RSS, imported after the floor app's (untraced): %+.2f MB |" % (
        len(costs["own"]), total / 1e6, (import_rss[1] - import_rss[0]) * 1024 / 1e6))  # fmt: skip

    traced = {which: reported(which, settle, traced=True) for which in ("console", "floor")}
    if traced["console"] and traced["floor"]:
        sums = {}
        for which, report in traced.items():
            grouped: Dict[str, float] = {}
            for path, size in report["traced"]:  # type: ignore[index]
                grouped[file_group(path)] = grouped.get(file_group(path), 0) + size
            sums[which] = grouped
        total_diff = sum(sums["console"].values()) - sum(sums["floor"].values())
        print()
        print(
            "Python allocations alive %g s after the first screen, console - floor app (tracemalloc, by file)" % settle
        )
        print("| allocated in | console - floor app, MB |")
        print("| --- | --- |")
        for key, value in diff(sums["console"], sums["floor"])[:18]:
            print("| %s | %+.3f |" % (key, value / 1e6))
        print("| all | %+.2f |" % (total_diff / 1e6))

    files = [
        {k: v for k, v in r["smaps"].items() if k.startswith("/")} for r in (plain["console"][0], plain["floor"][0])
    ]
    print()
    print("mapped files resident, console - floor app (smaps, first round)")
    print("| file | kB |")
    print("| --- | --- |")
    for key, value in diff(*files):
        if abs(value) >= 40:
            print("| %s | %+d |" % (short_path(key), value))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after the first screen (3)")
    parser.add_argument("--breakdown", action="store_true", help="what the console holds above the floor app")
    parser.add_argument("--rounds", type=int, default=3, help="--breakdown's interleaved runs of each (3)")
    args = parser.parse_args()
    bare = script_rss(BARE)
    nvml = script_rss(NVML)
    textual = pty_rss([sys.executable, "-c", MINIMAL_TEXTUAL], None, args.settle)
    console = pty_rss(console_argv("--interval", "1"), "OPSCONSOLE_FIRST_FRAME_FILE", args.settle)

    def mb(value: Optional[int]) -> str:
        return "%.1f MB" % (value / MB) if value is not None else "n/a"

    print("python, nothing imported            %s" % mb(bare))
    print("python + psutil + pynvml, NVML up   %s" % mb(nvml))
    print("minimal Textual app, first screen   %s" % mb(textual))
    print("opsconsole, %g s after first frame   %s" % (args.settle, mb(console)))
    if None not in (bare, nvml, textual):
        floor = textual + (nvml - bare)  # type: ignore[operator]
        print("floor: minimal Textual app + NVML's share  %s   (target 60 MB)" % mb(floor))
        if console is not None:
            print("opsconsole above that floor               %s" % mb(console - floor))
    if args.breakdown:
        return breakdown(args.settle, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
