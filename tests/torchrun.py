"""Real torchrun (2 ranks, gloo, CPU) as the tests start it: one command line, one environment.

torchrun's monitor polls its workers every 0.1 s by default and sends SIGTERM to the survivors as soon
as one rank fails; on a loaded machine that can kill a peer before it has written what it saw (the
lost connection). Tests that read the peer's consequence pass a longer `monitor_interval_s`, as a
real job's peers have time to write theirs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def torchrun_command(
    script: Path,
    *script_args: str,
    ranks: int = 2,
    log_dir: Optional[Path] = None,
    monitor_interval_s: Optional[float] = None,
    python: str = sys.executable,
) -> List[str]:
    """`python -m torch.distributed.run` on 127.0.0.1 with a fresh port; rank logs to `log_dir` if given."""
    command = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    command += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    if monitor_interval_s is not None:
        command += ["--monitor-interval", str(monitor_interval_s)]
    if log_dir is not None:
        command += ["--redirects", "3", "--log-dir", str(log_dir)]
    return command + [str(script), *script_args]


def torchrun_env(extra: Optional[Dict[str, str]] = None, pythonpath: Sequence[Path] = ()) -> Dict[str, str]:
    """The environment of a rank: this machine's, one OpenMP thread each (2 cores), the master on 127.0.0.1."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(path) for path in pythonpath)
    env.update(extra or {})
    return env


def diagnose_json(*args: str) -> dict:
    """`opsconsole diagnose --json ARGS...` as a user runs it (this checkout's opsconsole): its JSON."""
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", "--json", *args],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
