"""What the console's memory is made of: RSS of the interpreter, of the probe's libraries with NVML
started, of a minimal Textual app at its first screen, and of the console at its first frame.

Issue 17's RSS target is 60 MB (nvitop: one process with psutil, pynvml and curses). A Textual app
pays for Textual and Rich before it draws anything, and the console reads the GPUs in-process, so
its floor is about the minimal Textual app plus what NVML adds to an interpreter; this prints that
floor beside the console, measured in the same run (NVML parts "n/a" on a machine without it).

    python benchmarks/rss_floor.py [--settle 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Optional

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after the first screen (3)")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
