"""opsconsole beside nvitop on the same GPU node, in real ptys: launch, CPU, terminal bytes, RSS.

Issue 17's targets, as ratios measured in one run (140x45, 1 s interval, a bf16 matmul load on
the GPU): CPU at most 1.0x nvitop's; the first screen with data within 0.5 s; at most 2,000
bytes/s written to the terminal with one GPU; RSS at most 60 MB.

- launch: from exec to the first output that shows the GPU's model name (both tools print it
  only once they have read the GPU), median of --rounds, each tool launched alone; for
  opsconsole also the moment it reports its first frame with data drawn
  ($OPSCONSOLE_FIRST_FRAME_FILE, see benchmarks/startup.py);
- CPU: user+system time of the process and its children over --seconds after --warmup,
  both running side by side, as % of one core;
- bytes/s: what each wrote to its pty over the same window;
- RSS: resident memory of the process and its children at the end of the window.

--profile DIR writes what explains the figures: a cProfile of opsconsole's launch to its first
frame (launch.prof, and launch.txt, the top functions), and py-spy's stacks of the running
console (steady.txt, collapsed, when py-spy is on the PATH).

    python benchmarks/vs_nvitop.py [--seconds 30] [--rounds 3] [--load] [--profile DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from pty_run import ROOT, PtyProcess, compile_sources, console_argv

COLUMNS, ROWS = 140, 45
ESCAPES = re.compile(
    rb"\x1b\[[0-9;?<=>]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78MDEc]"
)
SEARCHED_BYTES = 4 * 1024 * 1024  # the first screens; the name is looked for in no more than this

GPU_LOAD = r"""
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""


class WatchedPty(PtyProcess):
    """A PtyProcess that also notes when its output first shows `needle` (escapes stripped)."""

    def __init__(self, argv, needle: bytes, env=None):
        self.needle = needle
        self.found_at: Optional[float] = None
        self._seen = bytearray()
        super().__init__(argv, columns=COLUMNS, rows=ROWS, env=env)

    def _read_all(self):
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.output_bytes += len(chunk)
            if self.found_at is None and len(self._seen) < SEARCHED_BYTES:
                self._seen += chunk
                if self.needle in ESCAPES.sub(b"", bytes(self._seen)):
                    self.found_at = time.perf_counter() - self.started
                    self._seen = bytearray()


def process_tree(pid: int) -> List[int]:
    """`pid` and its descendants, from /proc."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, ()))
    return out


def tree_cpu_seconds(pid: int) -> float:
    total = 0.0
    for member in process_tree(pid):
        try:
            with open("/proc/%d/stat" % member) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def tree_rss_bytes(pid: int) -> int:
    total = 0
    for member in process_tree(pid):
        try:
            with open("/proc/%d/status" % member) as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
    return total


def gpu_name() -> str:
    """The first GPU's model name as nvidia-smi reports it ("NVIDIA H200")."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return out.splitlines()[0].strip()


def model_of(name: str) -> str:
    """What both tools print of the name: opsconsole drops the vendor ("H200")."""
    for prefix in ("NVIDIA ", "Tesla "):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def tools(interval: str, needle: str) -> Dict[str, List[str]]:
    floor = os.path.join(ROOT, "benchmarks", "textual_floor_app.py")
    return {
        "opsconsole": console_argv("--interval", interval),
        "nvitop": [sys.executable, "-m", "nvitop", "--monitor", "auto", "--interval", interval],
        # Textual alone drawing the overview's one-GPU screen and changing the same rows (no GPU read).
        "textual-floor": [sys.executable, floor, needle, interval],
        # The same app with only its clock line changing: the least a live Textual screen costs.
        "textual-clock": [sys.executable, floor, needle, interval, "clock"],
    }


def quit_keys(tool: str) -> bytes:
    return b"q"


def launch_once(argv: List[str], needle: bytes, tool: str, timeout: float = 30.0) -> Dict[str, Optional[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        marker = os.path.join(tmp, "first-frame")
        trace = os.path.join(tmp, "launch-trace")
        proc = WatchedPty(argv, needle, env={"OPSCONSOLE_FIRST_FRAME_FILE": marker, "OPSCONSOLE_LAUNCH_TRACE": trace})
        try:
            first_frame = None
            deadline = proc.started + timeout
            while time.perf_counter() < deadline and proc.proc.poll() is None:
                if first_frame is None and os.path.exists(marker):
                    first_frame = time.perf_counter() - proc.started
                if proc.found_at is not None and (first_frame is not None or tool != "opsconsole"):
                    break
                time.sleep(0.002)
            time.sleep(0.05)  # the trace's last mark is written after the refresh that drew the frame
            return {"name_shown_s": proc.found_at, "first_frame_s": first_frame, "marks": read_marks(trace)}
        finally:
            proc.stop(quit_keys(tool))


def read_marks(path: str) -> Dict[str, float]:
    """The console's launch marks (opsconsole/launch_trace.py): name -> seconds since its start."""
    marks: Dict[str, float] = {}
    try:
        with open(path) as f:
            for line in f:
                name, _, seconds = line.rstrip("\n").rpartition(" ")
                marks.setdefault(name, float(seconds))
    except (OSError, ValueError):
        pass
    return marks


def steady(argvs: Dict[str, List[str]], needle: bytes, warmup: float, seconds: float) -> Dict[str, dict]:
    """Both tools side by side: CPU, bytes and RSS over the same window."""
    running = {tool: WatchedPty(argv, needle) for tool, argv in argvs.items()}
    try:
        time.sleep(warmup)
        start = {tool: (tree_cpu_seconds(p.proc.pid), p.output_bytes) for tool, p in running.items()}
        t0 = time.perf_counter()
        time.sleep(seconds)
        elapsed = time.perf_counter() - t0
        out = {}
        for tool, p in running.items():
            cpu0, bytes0 = start[tool]
            out[tool] = {
                "cpu_percent": (tree_cpu_seconds(p.proc.pid) - cpu0) / elapsed * 100.0,
                "bytes_per_s": (p.output_bytes - bytes0) / elapsed,
                "rss_mb": tree_rss_bytes(p.proc.pid) / 1e6,
                "alive": p.proc.poll() is None,
                "name_shown": p.found_at is not None,
            }
        return out
    finally:
        for tool, p in running.items():
            p.stop(quit_keys(tool))


def profile(directory: str, needle: bytes, seconds: float) -> List[str]:
    """cProfile of opsconsole's launch to first frame; py-spy of its steady state. Returns file names."""
    os.makedirs(directory, exist_ok=True)
    written = []
    launch = os.path.join(directory, "launch.prof")
    argv = [sys.executable, "-m", "cProfile", "-o", launch, "-m", "opsconsole", "--interval", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        marker = os.path.join(tmp, "first-frame")
        proc = WatchedPty(argv, needle, env={"OPSCONSOLE_FIRST_FRAME_FILE": marker})
        deadline = time.perf_counter() + 60
        while not os.path.exists(marker) and time.perf_counter() < deadline and proc.proc.poll() is None:
            time.sleep(0.01)
        proc.stop(b"q", timeout=20)
    if os.path.exists(launch):
        import pstats

        with open(os.path.join(directory, "launch.txt"), "w") as out:
            stats = pstats.Stats(launch, stream=out)
            stats.sort_stats("cumulative").print_stats(60)
            stats.sort_stats("tottime").print_stats(40)
        written += ["launch.prof", "launch.txt"]
    spy = shutil.which("py-spy")
    if spy:
        console = WatchedPty(console_argv("--interval", "1"), needle)
        try:
            time.sleep(5)
            steady_out = os.path.join(directory, "steady.txt")
            subprocess.run(
                [
                    spy,
                    "record",
                    "--pid",
                    str(console.proc.pid),
                    "--duration",
                    str(int(seconds)),
                    "--rate",
                    "250",
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--output",
                    steady_out,
                ],
                capture_output=True,
                timeout=seconds + 60,
            )
            if os.path.exists(steady_out):
                written.append("steady.txt")
        finally:
            console.stop()
    return written


def ratio(a: Optional[float], b: Optional[float]) -> str:
    if a is None or not b:
        return "n/a"
    return "%.2fx" % (a / b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval", default="1")
    parser.add_argument("--load", action="store_true", help="run a bf16 matmul loop on the GPU meanwhile (torch)")
    parser.add_argument("--profile", metavar="DIR", help="write opsconsole's launch and steady-state profiles here")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument(
        "--tools",
        default="opsconsole,nvitop,textual-floor,textual-clock",
        help="which to run (a VM without GPUs: opsconsole,textual-floor,textual-clock)",
    )
    parser.add_argument("--gpu-name", help="the text to wait for instead of the GPU's model (a VM without GPUs)")
    args = parser.parse_args()

    name = args.gpu_name or gpu_name()
    needle = (args.gpu_name or model_of(name)).encode()
    load = None
    if args.load:
        budget = args.rounds * 2 * 15 + args.warmup + args.seconds + 120
        load = subprocess.Popen([sys.executable, "-c", GPU_LOAD, str(budget)], cwd=ROOT)
        time.sleep(8)  # torch import and CUDA context before anything is measured
    compile_sources()
    try:
        argvs = {
            tool: argv for tool, argv in tools(args.interval, needle.decode()).items() if tool in args.tools.split(",")
        }
        for tool, argv in argvs.items():  # a launch each to warm the page cache, not counted
            launch_once(argv, needle, tool)
        launches: Dict[str, List[dict]] = {tool: [] for tool in argvs}
        for _ in range(args.rounds):
            for tool, argv in argvs.items():
                launches[tool].append(launch_once(argv, needle, tool))
        side = steady(argvs, needle, args.warmup, args.seconds)
        written = profile(args.profile, needle, 15) if args.profile else []
    finally:
        if load is not None:
            load.terminate()
            load.wait()

    def median(tool: str, key: str) -> Optional[float]:
        values = [run[key] for run in launches[tool] if run[key] is not None]
        return statistics.median(values) if values else None

    figures = {
        tool: dict(
            side[tool],
            launch_name_s=median(tool, "name_shown_s"),
            launch_first_frame_s=median(tool, "first_frame_s"),
            launches=launches[tool],
        )
        for tool in argvs
    }
    empty = {
        "launch_name_s": None,
        "launch_first_frame_s": None,
        "cpu_percent": None,
        "bytes_per_s": None,
        "rss_mb": None,
    }
    ops, nv = figures.get("opsconsole", empty), figures.get("nvitop", empty)
    floor = figures.get("textual-floor", empty)
    print(
        "GPU: %s   %dx%d pty, %s s interval, %s, window %.0f s after %.0f s"
        % (
            name,
            COLUMNS,
            ROWS,
            args.interval,
            "bf16 matmul load" if args.load else "no load",
            args.seconds,
            args.warmup,
        )
    )
    print("%-36s %11s %9s %7s %9s %8s   target" % ("", "opsconsole", "nvitop", "ratio", "Textual*", "ratio**"))
    rows = [
        (
            "launch to the GPU's name on screen, s",
            ops["launch_name_s"],
            nv["launch_name_s"],
            floor["launch_name_s"],
            "%.3f",
            "<= 0.5 s",
        ),
        ("launch to first frame with data, s", ops["launch_first_frame_s"], None, None, "%.3f", "<= 0.5 s"),
        ("CPU, % of one core", ops["cpu_percent"], nv["cpu_percent"], floor["cpu_percent"], "%.2f", "<= 1.0x nvitop"),
        ("bytes to the terminal per s", ops["bytes_per_s"], nv["bytes_per_s"], floor["bytes_per_s"], "%.0f", "<= 2000"),
        ("RSS, MB", ops["rss_mb"], nv["rss_mb"], floor["rss_mb"], "%.1f", "<= 60 MB"),
    ]

    def shown(value: Optional[float], fmt: str, missing: str) -> str:
        return fmt % value if value is not None else missing

    for label, a, b, c, fmt, target in rows:
        print(
            "%-36s %11s %9s %7s %9s %8s   %s"
            % (label, shown(a, fmt, "n/a"), shown(b, fmt, "-"), ratio(a, b), shown(c, fmt, "-"), ratio(c, b), target)
        )
    clock = figures.get("textual-clock")
    if clock is not None:
        print(
            "Textual with only a clock line changing: CPU %s %% (%s nvitop), %s bytes/s, RSS %s MB"
            % (
                shown(clock["cpu_percent"], "%.2f", "n/a"),
                ratio(clock["cpu_percent"], nv["cpu_percent"]),
                shown(clock["bytes_per_s"], "%.0f", "n/a"),
                shown(clock["rss_mb"], "%.1f", "n/a"),
            )
        )
    if "textual-floor" in argvs:
        print(
            "* Textual floor: benchmarks/textual_floor_app.py, stock Textual widgets drawing the overview's one-GPU"
            " screen and changing the same rows each interval, no GPU read (launch: to its first screen)."
            " ** the floor / nvitop: where it is over a target's ratio, Textual alone is."
        )
    for tool in argvs:
        shown = ", ".join(
            "%.3f" % run["name_shown_s"] if run["name_shown_s"] is not None else "never" for run in launches[tool]
        )
        print("%s launches (name shown): %s" % (tool, shown))
    traced = [run["marks"] for run in launches.get("opsconsole", []) if run.get("marks")]
    if traced:
        names = sorted(
            {name for marks in traced for name in marks},
            key=lambda n: statistics.median([m[n] for m in traced if n in m]),
        )
        print(
            "opsconsole's launch, median of %d (s since its process started): %s"
            % (
                len(traced),
                ", ".join("%s %.3f" % (n, statistics.median([m[n] for m in traced if n in m])) for n in names),
            )
        )
    if written:
        print("profiles in %s: %s" % (args.profile, ", ".join(written)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": name, "figures": figures}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
