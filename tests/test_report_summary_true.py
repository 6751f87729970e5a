"""`opsconsole report`'s summary counts the checks `check` runs, and lists only the members it holds.

Real `opsconsole report` and `opsconsole check --json` processes on the local node: the report said
"All 3 checks passed" where `check` ran 4 (a single poll of the local probe has no CPU rates, so its
iowait rule never ran), and its Contents named logs/ and nvidia-smi/ when nothing was collected there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest


def run(*argv: str, state: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opsconsole", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, XDG_STATE_HOME=str(state)),
    )


def report_members(path: str) -> dict:
    with tarfile.open(path) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}


@pytest.mark.parametrize("with_log", [False, True], ids=["no-logs", "one-log"])
def test_the_summary_counts_checks_as_check_does_and_lists_what_the_report_holds(tmp_path, with_log):
    config = tmp_path / "c.toml"
    if with_log:
        (tmp_path / "train.log").write_text("2026-12-02 12:00:00,000 - INFO - Epoch 1 step 10/40 loss 0.5\n")
        config.write_text('[logs]\npaths = ["%s/train.log"]\n' % tmp_path)
    else:
        config.write_text("[console]\ninterval = 1.0\n")
    checked = run("check", "--config", str(config), "--json", state=tmp_path / "state")
    assert checked.returncode in (0, 1), checked.stderr
    check_names = sorted(r["check"] for r in json.loads(checked.stdout)["results"])

    done = run("report", "--config", str(config), "--out", str(tmp_path), state=tmp_path / "state")
    assert done.returncode == 0, done.stderr
    members = report_members(done.stdout.strip())
    health = json.loads(members["health.json"])["results"]
    assert sorted(r["check"] for r in health) == check_names  # the same checks (before: no iowait)
    summary = members["summary.md"]
    failing = [r for r in health if r["status"] in ("fail", "error", "warn")]
    if not failing:
        assert "All %d checks passed." % len(check_names) in summary

    contents = summary.split("## Contents", 1)[1]
    held = set(members)
    # Each directory the Contents names holds a member, and each one that holds a member is named.
    for folder in ("logs/", "nvidia-smi/"):
        assert (folder in contents) == any(name.startswith(folder) for name in held), (folder, contents, held)
    assert any(name.startswith("logs/") for name in held) == with_log
    if with_log:
        assert re.search(r"logs/ \(the last \d+ lines of 1 log\)", contents)
