"""The metadata worker imports from the parent's path, not the environment's.

The worker runs `python -E -s` (no PYTHON* variable, no user site in the interpreter that parses
hostile files). An install whose dependencies are found only through PYTHONPATH (`pip install
--target DIR`) used to find none of them there: every checkpoint and flight-recorder dump read
"worker exited with status 1". The worker now gets the parent's sys.path on its command line.

Here such an install is built for real: a virtual environment with nothing installed, a
--target style directory holding the dependencies (links to this venv's site-packages
entries) and a source tree holding opsconsole, both on PYTHONPATH only. The console's commands run from it read a
checkpoint and an FR dump through the worker, which still runs with -E and -s.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FR_DUMP = ROOT / "tests" / "data" / "flight_recorder" / "nccl_trace_rank_0"


@pytest.fixture(scope="module")
def target_install(tmp_path_factory):
    """(python without the dependencies, environment with PYTHONPATH naming the --target style directory)."""
    base = tmp_path_factory.mktemp("target_install")
    bare = base / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = bare / "bin" / "python"
    # The dependencies where `pip install --target deps ...` puts them; opsconsole in a tree of its own.
    target = base / "deps"
    target.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in sorted(site.iterdir()):
        if entry.suffix == ".pth" or entry.name.startswith(("opsconsole", "_opsconsole", "__editable__")):
            continue  # .pth files are not read from PYTHONPATH; opsconsole comes from the tree below
        (target / entry.name).symlink_to(entry)
    source = base / "src"
    source.mkdir()
    (source / "opsconsole").symlink_to(ROOT / "opsconsole")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PYTHONPATH"] = os.pathsep.join([str(source), str(target)])
    # The premise: that interpreter has no orjson of its own, and finds it only through PYTHONPATH.
    alone = subprocess.run([str(python), "-c", "import orjson"], capture_output=True, cwd=base, timeout=60)
    assert alone.returncode != 0 and b"orjson" in alone.stderr
    found = subprocess.run(
        [str(python), "-c", "import orjson, opsconsole; print(opsconsole.__file__)"],
        capture_output=True,
        text=True,
        cwd=base,
        env=env,
        timeout=60,
    )
    assert found.returncode == 0 and found.stdout.startswith(str(source)), found.stderr
    return python, env, base


def test_a_checkpoint_reads_through_the_worker_when_dependencies_come_from_pythonpath(target_install, tmp_path):
    torch = pytest.importorskip("torch")
    python, env, cwd = target_install
    folder = tmp_path / "ckpts"
    folder.mkdir()
    torch.save({"epoch": 3, "step": 30, "model": {"w": torch.zeros(4)}}, folder / "step_30.pt")
    old = time.time() - 7200
    os.utime(folder / "step_30.pt", (old, old))
    done = subprocess.run(
        [str(python), "-m", "opsconsole", "checkpoints", str(folder), "--json"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "worker exited" not in done.stdout
    (entry,) = json.loads(done.stdout)["checkpoints"]
    assert entry["epoch"] == 3 and entry["step"] == 30 and entry["integrity"] == "ok" and entry["unreadable"] is None


WORKER_FLAGS = r"""
from opsconsole.checkpoints.worker import WorkerProcess
slot = WorkerProcess()
assert slot.stats()["pid"] == slot.pid  # it answers: started and serving (its cmdline is set by then)
with open("/proc/%d/cmdline" % slot.pid, "rb") as handle:
    argv = handle.read().split(b"\0")
slot.close()
print(" ".join(a.decode() for a in argv[1:3]))
"""


def test_the_worker_still_ignores_the_environment(target_install):
    python, env, cwd = target_install
    done = subprocess.run(
        [str(python), "-c", WORKER_FLAGS], capture_output=True, text=True, cwd=cwd, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["-E", "-s"], (done.stdout, done.stderr)


def test_opsconsole_fr_reads_dumps_through_the_worker_when_dependencies_come_from_pythonpath(target_install, tmp_path):
    python, env, cwd = target_install
    traces = []
    for rank in range(2):
        trace = pickle.loads(FR_DUMP.read_bytes())  # our own fixture, a real NCCL dump
        trace["pg_config"]["0"]["ranks"] = str([0, 1])
        traces.append(trace)
    entry = next(e for e in traces[1]["entries"] if e["collective_seq_id"] == 5)
    entry["profiling_name"] = "nccl:all_gather"
    for rank, trace in enumerate(traces):
        (tmp_path / ("nccl_trace_rank_%d" % rank)).write_bytes(pickle.dumps(trace, protocol=2))
    done = subprocess.run(
        [str(python), "-m", "opsconsole", "fr", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(
        "rank 1 joined collective 5 (all_reduce [1] Float) of group 0 (default_pg) with another op"
    )
    assert "unreadable" not in done.stdout
