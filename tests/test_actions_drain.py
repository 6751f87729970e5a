"""Drain a node with a stub `scontrol` on PATH: the exact argv, hostile reasons kept as one word, refusals."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from opsconsole.actions import drain
from opsconsole.actions.audit import AuditLog
from opsconsole.actions.registry import TARGET_NODE, ActionContext, Refused, Target, plan_action, run_plan
from opsconsole.actions.runner import ActionRunner
from opsconsole.config import ActionsConfig, Config
from opsconsole.model import STATE_UP, NodeFrame, NodeState

STUB = """#!{python}
import json, os, sys
with open(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "calls.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
"""


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "scontrol"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ.get("PATH", "")))
    return bin_dir / "calls.jsonl"


def calls(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def context(tmp_path) -> ActionContext:
    config = Config(actions=ActionsConfig(audit_log=str(tmp_path / "audit.log")))
    now = time.time()
    state = NodeState(name="gpu-a01", state=STATE_UP, frame=NodeFrame(node="gpu-a01", time=now), received_at=now)
    return ActionContext(
        config=config, get_state=lambda: state, link=None, runner=ActionRunner(AuditLog(str(tmp_path / "audit.log")))
    )


HOSTILE = "XID 79 on GPU 3; rm -rf / $(touch pwned) `id` 'q' \"dq\""


async def test_drain_runs_scontrol_with_the_reason_as_one_word(scontrol, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ctx = context(tmp_path)
    plan = await plan_action("drain_node", Target(TARGET_NODE, "gpu-a01"), ctx, {"reason": "  " + HOSTILE + " "})
    expected = ["update", "NodeName=gpu-a01", "State=DRAIN", "Reason=" + HOSTILE]
    assert list(plan.argv[1:]) == expected and plan.argv[0] == "scontrol"
    # The confirmation shows it quoted as a shell would need it: one word per argv item.
    assert "'Reason=XID 79 on GPU 3; rm -rf / $(touch pwned) `id` '\"'\"'q'\"'\"' \"dq\"'" in plan.command_line
    report = await run_plan(plan, ctx)
    assert report.ok, report.lines
    assert calls(scontrol) == [expected]
    assert not (tmp_path / "pwned").exists()
    audit = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert [r["outcome"] for r in audit] == ["attempt", "ok"]
    assert audit[0]["command"] == ["scontrol"] + expected and audit[0]["detail"] == "reason: " + HOSTILE


@pytest.mark.parametrize(
    "reason, message",
    [
        ("", "a drain needs a reason"),
        ("   ", "a drain needs a reason"),
        ("two\nlines", "one printable line"),
        ("bell\x07", "one printable line"),
        ("x" * 201, "keep it under 200"),
    ],
)
async def test_bad_reasons_are_refused_and_nothing_runs(scontrol, tmp_path, reason, message):
    with pytest.raises(Refused, match=message):
        await plan_action("drain_node", Target(TARGET_NODE, "gpu-a01"), context(tmp_path), {"reason": reason})
    assert calls(scontrol) == []


async def test_a_node_name_that_is_not_a_slurm_name_is_refused(scontrol, tmp_path):
    with pytest.raises(Refused, match="is not a Slurm node name"):
        await plan_action("drain_node", Target(TARGET_NODE, "n1 State=RESUME"), context(tmp_path), {"reason": "x"})
    assert calls(scontrol) == []


async def test_without_scontrol_on_path_drain_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "scontrol, which is not on this machine's PATH" in drain.unavailable(ActionsConfig().drain_command)
    with pytest.raises(Refused, match="not on this machine's PATH"):
        await plan_action("drain_node", Target(TARGET_NODE, "gpu-a01"), context(tmp_path), {"reason": "x"})
