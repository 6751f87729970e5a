"""Actions act only on live, chosen targets: never on a replayed node, never without a command channel.

The critical case: the demo plays a recorded H200 node beside the local one. Its processes carry
the recorded machine's PIDs; a local process may have the same PID. The registry refuses every
action on a replayed node (not only the keys), and the last guard before os.kill refuses too.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from opsconsole.actions.audit import AuditLog
from opsconsole.actions.registry import (
    ACTIONS,
    TARGET_CHECKPOINT_DIR,
    TARGET_GPU,
    TARGET_NODE,
    TARGET_PROCESS,
    ActionContext,
    Plan,
    Refused,
    Target,
    action,
    plan_action,
    run_plan,
)
from opsconsole.actions.runner import ActionRunner, run_on_node
from opsconsole.actions.signals import deliver_signal
from opsconsole.config import ActionsConfig, Config, ConsoleConfig, NodeConfig
from opsconsole.model import STATE_UP, ProcessSample
from opsconsole.nodes.local import LocalLink
from opsconsole.recording.replay_link import ReplayLink

SHIPPED = Path(__file__).resolve().parents[1] / "examples" / "h200-training.opsrec"


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


def config(tmp_path: Path, read_only: bool = False) -> Config:
    return Config(
        console=ConsoleConfig(interval=0.5, read_only=read_only),
        nodes=(NodeConfig(name="local", local=True),),
        actions=ActionsConfig(audit_log=str(tmp_path / "audit.log")),
    )


def audit_records(tmp_path: Path):
    path = tmp_path / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def replayed_state_holding(link: ReplayLink, pid: int):
    """The replayed node's state, its first GPU process given `pid`: a recorded PID that is live here too."""
    state = await link.poll_once(5.0)
    assert state.frame is not None and state.frame.processes, "the shipped recording has GPU processes"
    first = replace(state.frame.processes[0], pid=pid, name="python", state="S")
    host_proc = ProcessSample(pid=pid, name="python", state="S", command="python train.py")
    frame = replace(
        state.frame,
        processes=(first,) + state.frame.processes[1:],
        top_processes=(host_proc,) + tuple(state.frame.top_processes),
    )
    return replace(state, state=STATE_UP, frame=frame, received_at=time.time())


def targets(node: str, pid: int):
    return {
        TARGET_PROCESS: Target(TARGET_PROCESS, node, pid=pid, name="python"),
        TARGET_GPU: Target(TARGET_GPU, node, gpu=0),
        TARGET_NODE: Target(TARGET_NODE, node),
        TARGET_CHECKPOINT_DIR: Target(TARGET_CHECKPOINT_DIR, node, path="/tmp"),
    }


async def test_every_action_on_a_replayed_node_is_refused_and_its_pid_is_never_signalled(tmp_path, sleeper):
    link = ReplayLink("h200-replay", str(SHIPPED))
    try:
        state = await replayed_state_holding(link, sleeper.pid)
        ctx = ActionContext(
            config=config(tmp_path),
            get_state=lambda: state,
            link=link,
            runner=ActionRunner(AuditLog(str(tmp_path / "audit.log"))),
        )
        assert not ctx.local
        by_kind = targets("h200-replay", sleeper.pid)
        for act in ACTIONS:
            with pytest.raises(Refused, match="replay"):
                await plan_action(act.id, by_kind[act.target_kind], ctx, {"reason": "test"})
        # A plan made elsewhere (a script, a stale screen) is refused again when run.
        forged = Plan(
            action("signal_term"),
            by_kind[TARGET_PROCESS],
            ("kill", "-s", "TERM", "--", str(sleeper.pid)),
            "on this machine",
        )
        with pytest.raises(Refused, match="replay"):
            await run_plan(forged, ctx)
        # The last guard before os.kill and before a local command.
        result = await deliver_signal("KILL", sleeper.pid, link, 5.0)
        assert not result.ok and "replay" in (result.error or "")
        ran = await run_on_node(link, ["touch", str(tmp_path / "ran")], 5.0)
        assert not ran.ok and not (tmp_path / "ran").exists()
        await asyncio.sleep(0.2)
        assert sleeper.poll() is None
        assert audit_records(tmp_path) == []  # nothing was attempted (the console audits the refusals it shows)
    finally:
        await link.close()


async def test_a_replay_console_refuses_even_a_safe_action(tmp_path):
    state_ctx = ActionContext(
        config=config(tmp_path),
        get_state=lambda: None,
        link=None,
        runner=ActionRunner(AuditLog(str(tmp_path / "audit.log"))),
        replayed=True,
    )
    with pytest.raises(Refused, match="replay"):
        await plan_action("health_rerun", Target(TARGET_NODE, "gpu-a01"), state_ctx)


async def test_a_node_without_a_command_channel_is_not_this_machine(tmp_path, sleeper):
    """A node seen only through Prometheus (no link): its PIDs are not ours; a Slurm drain still works."""
    link = ReplayLink("h200-replay", str(SHIPPED))
    try:
        state = replace(await replayed_state_holding(link, sleeper.pid), name="gpu-a01")
    finally:
        await link.close()
    ctx = ActionContext(
        config=config(tmp_path),
        get_state=lambda: state,
        link=None,
        runner=ActionRunner(AuditLog(str(tmp_path / "audit.log"))),
    )
    assert not ctx.local
    by_kind = targets("gpu-a01", sleeper.pid)
    for act in ACTIONS:
        if act.target_kind == TARGET_NODE:
            continue
        with pytest.raises(Refused, match="no command channel"):
            await plan_action(act.id, by_kind[act.target_kind], ctx)
    assert (await deliver_signal("KILL", sleeper.pid, None, 5.0)).error
    assert sleeper.poll() is None


async def test_the_local_node_is_still_this_machine(tmp_path, sleeper):
    from opsconsole.probe.procs import ProcessTable

    table = ProcessTable(use_psutil=False)
    from opsconsole.model import NodeFrame, NodeState

    def state():
        now = time.time()
        procs = tuple(table.join([ProcessSample(pid=sleeper.pid)]))
        return NodeState(
            name="local", state=STATE_UP, frame=NodeFrame(node="local", time=now, top_processes=procs), received_at=now
        )

    link = LocalLink(NodeConfig(name="local", local=True), 0.5)
    ctx = ActionContext(
        config=config(tmp_path), get_state=state, link=link, runner=ActionRunner(AuditLog(str(tmp_path / "audit.log")))
    )
    plan = await plan_action("signal_term", Target(TARGET_PROCESS, "local", pid=sleeper.pid), ctx)
    assert plan.where.startswith("on this machine")
    report = await run_plan(plan, ctx)
    assert report.ok and sleeper.wait(10) is not None
    assert [r["outcome"] for r in audit_records(tmp_path)] == ["attempt", "ok"]
