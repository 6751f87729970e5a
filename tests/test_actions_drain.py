"""Drain a node with a stub `scontrol` on PATH: the exact argv, hostile reasons kept as one word, refusals,
and which Slurm node a console node is (tests/test_slurm_cluster.py drains a real one)."""

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
from opsconsole.config import ActionsConfig, Config, NodeConfig
from opsconsole.model import STATE_UP, HostSample, NodeFrame, NodeState

STUB = """#!{python}
import json, os, sys
here = os.path.dirname(os.path.abspath(sys.argv[0]))
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:] == ["-o", "show", "node"]:
    sys.stdout.write(open(os.path.join(here, "nodes.txt")).read())
"""

# `scontrol -o show node` of two nodes, in the form Slurm 22.05 prints (fields cut to those that matter).
SHOW_NODES = (
    "NodeName=gpu-a01 Arch=x86_64 CPUTot=64 NodeAddr=10.0.0.1 NodeHostName=gpu-a01 Port=6818 State=IDLE "
    "Partitions=gpu Reason=none\n"
    "NodeName=gpu-a02 Arch=x86_64 CPUTot=64 NodeAddr=10.0.0.2 NodeHostName=gpu-a02 Port=6818 State=ALLOCATED "
    "Partitions=gpu\n"
)


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "scontrol"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(0o755)
    (bin_dir / "nodes.txt").write_text(SHOW_NODES)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ.get("PATH", "")))
    return bin_dir / "calls.jsonl"


def calls(path: Path):
    """The commands that changed something (`update`), not the lookups (`show node`)."""
    every = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [argv for argv in every if "update" in argv]


def context(tmp_path, name: str = "gpu-a01", hostname: str = "gpu-a01.cluster.example", nodes=()) -> ActionContext:
    config = Config(actions=ActionsConfig(audit_log=str(tmp_path / "audit.log")), nodes=tuple(nodes))
    now = time.time()
    frame = NodeFrame(node=name, time=now, host=HostSample(hostname=hostname) if hostname else None)
    state = NodeState(name=name, state=STATE_UP, frame=frame, received_at=now)
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


async def test_a_slurm_name_that_is_not_a_plain_name_is_refused(scontrol, tmp_path):
    # Slurm's answer is input too: a NodeName that is not a plain name never reaches the command.
    (scontrol.parent / "nodes.txt").write_text("NodeName=$(id);n1 NodeHostName=h1 NodeAddr=h1\n")
    with pytest.raises(Refused, match="Slurm has no node on host h1"):
        await plan_action("drain_node", Target(TARGET_NODE, "n1"), context(tmp_path, "n1", "h1"), {"reason": "x"})
    assert calls(scontrol) == []


@pytest.mark.parametrize(
    "name, hostname, nodes, drained",
    [
        # The console's label is not Slurm's name: the host the node reports decides.
        ("local", "gpu-a02", (NodeConfig(name="local", local=True),), "gpu-a02"),
        ("trainer-7", "gpu-a01.cluster.example", (), "gpu-a01"),
        # No frame host: how the console reaches it ([[nodes]] host), by NodeAddr here.
        ("box", None, (NodeConfig(name="box", host="10.0.0.2"),), "gpu-a02"),
        ("gpu-a02", "gpu-a02", (), "gpu-a02"),
    ],
)
async def test_the_slurm_node_drained_is_the_one_on_the_nodes_host(scontrol, tmp_path, name, hostname, nodes, drained):
    ctx = context(tmp_path, name, hostname, nodes)
    plan = await plan_action("drain_node", Target(TARGET_NODE, name), ctx, {"reason": "xid 79"})
    assert plan.argv[2] == "NodeName=" + drained
    assert any("Slurm node %s" % drained in note for note in plan.notes)
    assert (await run_plan(plan, ctx)).ok
    assert calls(scontrol) == [["update", "NodeName=" + drained, "State=DRAIN", "Reason=xid 79"]]


@pytest.mark.parametrize(
    "name, hostname, message",
    [
        # Before the fix this drained whatever Slurm calls `local` / `head` (the console's labels).
        ("local", "login01", r"Slurm has no node on host login01 \(of the 2 it lists\)"),
        ("head", "head01.cluster.example", "Slurm has no node on host head01"),
        ("gpu-a01", None, "the host name of gpu-a01 is not known yet"),
    ],
)
async def test_a_node_slurm_does_not_run_on_that_host_is_refused(scontrol, tmp_path, name, hostname, message):
    with pytest.raises(Refused, match=message):
        await plan_action("drain_node", Target(TARGET_NODE, name), context(tmp_path, name, hostname), {"reason": "x"})
    assert calls(scontrol) == []


async def test_two_slurm_nodes_on_one_host_and_neither_named_so_is_refused(scontrol, tmp_path):
    (scontrol.parent / "nodes.txt").write_text(
        "NodeName=node1 NodeAddr=127.0.0.1 NodeHostName=vm State=IDLE\n"
        "NodeName=node2 NodeAddr=127.0.0.1 NodeHostName=vm State=IDLE\n"
    )
    with pytest.raises(Refused, match=r"2 Slurm nodes run on host vm \(node1, node2\): none is named local"):
        await plan_action("drain_node", Target(TARGET_NODE, "local"), context(tmp_path, "local", "vm"), {"reason": "x"})
    plan = await plan_action(
        "drain_node", Target(TARGET_NODE, "node2"), context(tmp_path, "node2", "vm"), {"reason": "x"}
    )
    assert plan.argv[2] == "NodeName=node2"
    assert calls(scontrol) == []


async def test_without_scontrol_on_path_drain_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "scontrol, which is not on this machine's PATH" in drain.unavailable(ActionsConfig().drain_command)
    with pytest.raises(Refused, match="not on this machine's PATH"):
        await plan_action("drain_node", Target(TARGET_NODE, "gpu-a01"), context(tmp_path), {"reason": "x"})
