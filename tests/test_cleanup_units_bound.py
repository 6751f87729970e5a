"""`cleanup`: a directory of many units makes a bounded document, with counts of what was left out.

Real `opsconsole cleanup` processes over real torch.save files: --json names SHOWN_UNITS units of the
plan and of the results, in the plan's order (a failure kept among the results), and counts the rest
(they were one entry per unit, however many); the text output of a stopped cleanup names the first
SHOWN_MEMBERS units it did not reach and says how many more (it printed a line for every one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from opsconsole.checkpoints.cleanup import SHOWN_MEMBERS
from opsconsole.checkpoints.retention import SHOWN_UNITS

REPO = Path(__file__).resolve().parents[1]


def saved_series(root: Path, units: int) -> list:
    """`units` real torch.save files model_step_N.pt, a week old, step N a second newer than N-1; their
    paths newest first (the plan's order)."""
    root.mkdir()
    old = time.time() - 7 * 86400
    for step in range(units):
        path = root / ("model_step_%d.pt" % step)
        torch.save({"step": step, "w": torch.zeros(2)}, str(path))
        os.utime(path, (old + step, old + step))
    return [str(root / ("model_step_%d.pt" % step)) for step in reversed(range(units))]


def cleanup(tmp_path: Path, audit_log: Path, *argv: str) -> subprocess.CompletedProcess:
    config = tmp_path / "config.toml"
    config.write_text('[actions]\naudit_log = "%s"\n' % audit_log)
    env = dict(os.environ, OPSCONSOLE_CONFIG=str(config), PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-m", "opsconsole", "cleanup", *argv], capture_output=True, text=True, env=env, timeout=300
    )


def test_the_plan_and_results_of_many_units_are_bounded_with_counts(tmp_path):
    units = SHOWN_UNITS + 5
    root = tmp_path / "run"
    newest_first = saved_series(root, units)
    audit_log = tmp_path / "audit.log"
    args = (str(root), "--keep", "1", "--min-age", "0", "--json")

    planned = cleanup(tmp_path, audit_log, *args, "--dry-run")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)["plan"]
    # The first SHOWN_UNITS units in the plan's order (newest first), the rest counted (before: every unit).
    assert [item["path"] for item in plan["plan"]] == newest_first[:SHOWN_UNITS]
    assert [item["action"] for item in plan["plan"]] == ["keep"] + ["delete"] * (SHOWN_UNITS - 1)
    assert plan["plan_more"] == units - SHOWN_UNITS
    assert (plan["units"], plan["units_to_delete"]) == (units, units - 1)

    # The oldest unit, the plan's last deletion, cannot go (immutable): a failure past the first SHOWN_UNITS.
    stuck = Path(newest_first[-1])
    if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not possible here (needs root and a file system that has the flag)")
    try:
        done = cleanup(tmp_path, audit_log, *args, "--yes")
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], capture_output=True)  # else pytest cannot remove it
    assert done.returncode == 1, done.stderr  # a deletion failed
    document = json.loads(done.stdout)
    assert len(document["plan"]["plan"]) == SHOWN_UNITS and document["plan"]["plan_more"] == units - SHOWN_UNITS
    result = document["result"]
    # SHOWN_UNITS results in the plan's order, the failure among them though it came last, the rest
    # counted; the counts are of them all (before: every result).
    shown = [r["path"] for r in result["results"]]
    assert shown == newest_first[1:SHOWN_UNITS] + [str(stuck)]
    assert all(r["deleted"] for r in result["results"][:-1])
    assert not result["results"][-1]["deleted"] and result["results"][-1]["error"]
    assert result["results_more"] == units - 1 - SHOWN_UNITS
    assert (result["units_deleted"], result["units_failed"]) == (units - 2, 1)
    assert sorted(p.name for p in root.iterdir()) == sorted([Path(newest_first[0]).name, stuck.name])
    # Every unit is in the audit log (where what --json leaves out is named).
    records = [json.loads(line) for line in audit_log.read_text().splitlines()]
    deleted = [r["detail"] for r in records if r["action"] == "checkpoint.delete" and r["outcome"] == "ok"]
    assert len(deleted) == units - 2 and all(d.endswith(" (opsconsole cleanup): deleted") for d in deleted)


def test_a_stopped_cleanups_text_names_the_first_units_not_attempted_and_how_many_more(tmp_path):
    units = 3 * SHOWN_MEMBERS
    root = tmp_path / "run"
    newest_first = saved_series(root, units)
    blocker = tmp_path / "file"
    blocker.write_text("x")  # the audit log's folder is a file: the cleanup stops before its first deletion
    done = cleanup(tmp_path, blocker / "audit.log", str(root), "--keep", "1", "--min-age", "0", "--yes")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    not_attempted = [line for line in lines if "not attempted" in line]
    # Before: a line for each of the 23 units.
    assert not_attempted[:-2] == ["not attempted %s" % path for path in newest_first[1 : SHOWN_MEMBERS + 1]]
    assert not_attempted[-2] == "and %d more not attempted" % (units - 1 - SHOWN_MEMBERS)
    assert "STOPPED, %d not attempted" % (units - 1) in not_attempted[-1]  # the summary counts them all
    assert len(list(root.iterdir())) == units  # nothing deleted
