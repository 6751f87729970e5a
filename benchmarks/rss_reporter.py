"""Run the console or the Textual floor app and, `settle` s after its first screen, write what the
process holds to a JSON file (for benchmarks/rss_floor.py --breakdown; run in a pty).

    python benchmarks/rss_reporter.py OUT SETTLE console|floor [plain|traced]
    python benchmarks/rss_reporter.py OUT 0 imports|imports-rss FLOOR.json CONSOLE.json

OUT gets: /proc/self/status's memory lines (kB), the modules loaded (in import order), the threads,
the resident kB of each mapped file (smaps), and with `traced` (tracemalloc on from the start,
one frame a trace) the Python allocations alive, summed by the file that made them. tracemalloc
doubles the process's memory and slows it: the RSS of a `traced` run is not the console's.

`imports` (no pty, nothing drawn) imports the floor app's modules of FLOOR.json, then the modules
only the console loaded (CONSOLE.json), in the console's order, and writes what each one's import
left allocated itself (tracemalloc; its own code objects, classes and tables, not the modules it
imported in turn: importtime's "self" column in bytes), and the RSS before and after; `imports-rss`
the same without tracemalloc, for the RSS alone.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
from typing import Any, Dict

OUT, SETTLE, WHICH = sys.argv[1], float(sys.argv[2]), sys.argv[3]
TRACED = sys.argv[4:5] == ["traced"] or WHICH == "imports"  # imports-rss: the same imports, untraced
HERE = os.path.dirname(os.path.abspath(__file__))

if TRACED:
    import tracemalloc

    tracemalloc.start(1)


def status() -> Dict[str, int]:
    wanted = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmData", "Threads")
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in wanted:
                found[key] = int(value.split()[0])
    return found


def resident_by_file() -> Dict[str, int]:
    """Resident kB of each mapping's file ([anon], [heap], [stack]... for the others)."""
    found: Dict[str, int] = {}
    name = "[anon]"
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and not parts[0].endswith(":"):
                name = parts[5] if len(parts) > 5 else "[anon]"
            elif parts and parts[0] == "Rss:":
                found[name] = found.get(name, 0) + int(parts[1])
    return found


def report() -> None:
    time.sleep(SETTLE)
    found: Dict[str, Any] = {
        "status": status(),
        "modules": list(sys.modules),
        "threads": [thread.name for thread in threading.enumerate() if thread is not threading.current_thread()],
        "smaps": resident_by_file(),
    }
    if TRACED:
        stats = tracemalloc.take_snapshot().statistics("filename")
        found["traced"] = [(stat.traceback[0].filename, stat.size) for stat in stats]
    with open(OUT + ".part", "w") as out:
        json.dump(found, out)
    os.replace(OUT + ".part", OUT)


def start_report() -> None:
    threading.Thread(target=report, name="rss-report", daemon=True).start()


def run_console() -> int:
    from opsconsole import launch_trace

    mark = launch_trace.mark

    def at_mark(name: str) -> None:
        mark(name)
        if name == "first frame drawn":
            start_report()

    launch_trace.mark = at_mark
    from opsconsole.cli import main

    return main(["--interval", "1"])


def run_floor() -> int:
    sys.argv = [os.path.join(HERE, "textual_floor_app.py"), "GPU", "1"]
    floor = runpy.run_path(sys.argv[0], run_name="textual_floor_app")

    class Reported(floor["Floor"]):  # type: ignore[misc,name-defined]
        def on_ready(self) -> None:  # the floor app's on_mount draws its screen; this comes after it
            self.call_after_refresh(start_report)

    Reported().run()
    return 0


def import_costs(floor_report: str, console_report: str) -> int:
    import importlib.abc

    with open(floor_report) as f:
        floor_modules = json.load(f)["modules"]
    with open(console_report) as f:
        console_modules = json.load(f)["modules"]
    own: Dict[str, int] = {}
    nested = [0]  # bytes the imports inside the current one left, per level

    class SelfCost(importlib.abc.MetaPathFinder):
        """Wraps each loader's exec_module to note what the module's own body left allocated."""

        def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is None:
                    continue
                execute = getattr(spec.loader, "exec_module", None)
                if execute is not None:

                    def exec_module(module, execute=execute, name=name):  # type: ignore[no-untyped-def]
                        before = tracemalloc.get_traced_memory()[0]
                        nested.append(0)
                        try:
                            execute(module)
                        finally:
                            inner = nested.pop()
                            total = tracemalloc.get_traced_memory()[0] - before
                            own[name] = total - inner
                            nested[-1] += total

                    try:
                        spec.loader.exec_module = exec_module  # type: ignore[union-attr]
                    except (AttributeError, TypeError):
                        pass
                return spec
            return None

    def load(names) -> None:  # type: ignore[no-untyped-def]
        for name in names:
            if name not in sys.modules and name != "__main__":
                try:
                    __import__(name)
                except Exception:
                    pass  # a module that needs its importer's state: counted where that imports it

    load(floor_modules)
    rss_floor = status()["VmRSS"]
    if TRACED:
        sys.meta_path.insert(0, SelfCost())
    extra = [name for name in console_modules if name not in set(floor_modules)]
    load(extra)
    with open(OUT, "w") as out:
        json.dump({"own": {name: own.get(name, 0) for name in extra}, "rss": [rss_floor, status()["VmRSS"]]}, out)
    return 0


if __name__ == "__main__":
    if WHICH in ("imports", "imports-rss"):
        sys.exit(import_costs(sys.argv[4], sys.argv[5]))
    sys.exit(run_console() if WHICH == "console" else run_floor())
