"""`cleanup --json`: the units a stopped cleanup did not reach are named bounded, with how many more.

A real `opsconsole cleanup --yes --json` process over real torch.save files, stopped before its first
deletion by an audit log it cannot write (its folder is a file): every planned unit remains.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from opsconsole.checkpoints.cleanup import SHOWN_MEMBERS

REPO = Path(__file__).resolve().parents[1]
UNITS = 3 * SHOWN_MEMBERS


def test_a_stopped_cleanups_remaining_units_are_bounded_with_a_count(tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    old = time.time() - 7 * 86400
    for step in range(UNITS):
        path = root / ("model_step_%d.pt" % step)
        torch.save({"step": step, "w": torch.zeros(2)}, str(path))
        os.utime(path, (old + step, old + step))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    config = tmp_path / "config.toml"
    config.write_text('[actions]\naudit_log = "%s"\n' % (blocker / "audit.log"))
    env = dict(os.environ, OPSCONSOLE_CONFIG=str(config), PYTHONPATH=str(REPO))
    argv = ["cleanup", str(root), "--keep", "1", "--min-age", "0", "--yes", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "opsconsole", *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 1, proc.stderr
    document = json.loads(proc.stdout)
    planned = [item["path"] for item in document["plan"]["plan"] if item["action"] == "delete"]
    assert len(planned) > SHOWN_MEMBERS  # enough units for the bound to matter
    result = document["result"]
    assert "audit log" in result["stopped"] and result["results"] == []
    # The first SHOWN_MEMBERS of the units not reached, in the plan's order, and a count of the rest
    # (before: all of them, however many).
    assert result["remaining"] == planned[:SHOWN_MEMBERS]
    assert result["remaining_more"] == len(planned) - SHOWN_MEMBERS
    assert len(list(root.iterdir())) == UNITS  # nothing deleted
