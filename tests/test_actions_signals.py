"""Process signals: real `sleep` processes signalled locally and over a real sshd, refusals, escalation.

Frames come from the probe's own /proc reader (ProcessTable) or, end to end, from the probe
streamed over SSH; whether a process went is read from those frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from typing import List, Sequence

import pytest

from opsconsole.actions.audit import AuditLog
from opsconsole.actions.registry import (
    TARGET_PROCESS,
    ActionContext,
    Refused,
    Target,
    plan_action,
    run_plan,
)
from opsconsole.actions.runner import ActionRunner
from opsconsole.actions.signals import deliver_signal, refuse_signal, signal_argv, watch_process
from opsconsole.config import ActionsConfig, Config, ConsoleConfig, NodeConfig, SshConfig
from opsconsole.model import STATE_DOWN, STATE_UP, NodeFrame, NodeState, ProcessSample
from opsconsole.nodes.local import LocalLink
from opsconsole.nodes.ssh import SshLink
from opsconsole.probe.procs import ProcessTable
from tests.pid_reuse import after_the_slack, start_on_pid
from tests.sshd import StateLog, ssh_client, sshd_factory  # noqa: F401
from tests.waiting import wait_for_sync

# The node is this machine, as the console's embedded default is: its PIDs are ours to signal.
THIS_MACHINE = LocalLink(NodeConfig(name="local", local=True), 1.0)

FAST = SshConfig(
    connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2, backoff_initial=0.05, backoff_max=0.5
)


class ProbedNode:
    """A node whose every frame lists the given PIDs as the probe reads them from /proc right now."""

    def __init__(self, name: str, pids: Sequence[int]) -> None:
        self.name = name
        self.pids = list(pids)
        self.table = ProcessTable(use_psutil=False)
        self.frames = 0

    def state(self) -> NodeState:
        seen = [p for p in self.table.join([ProcessSample(pid=pid) for pid in self.pids]) if p.state is not None]
        self.frames += 1
        now = time.time()
        frame = NodeFrame(node=self.name, time=now, seq=self.frames, top_processes=tuple(seen))
        return NodeState(name=self.name, state=STATE_UP, frame=frame, received_at=now, since=now)


@contextlib.contextmanager
def started(argv: List[str], wait_ready: bool = False):
    """A child process; with wait_ready, returned once it printed "ready" (its signal handlers are set)."""
    # SIGINT at its default in the child: a test run started in the background of a non-interactive
    # shell ignores SIGINT, and an ignored signal stays ignored across exec (a `sleep` would not die).
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if wait_ready else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        if wait_ready:
            assert proc.stdout.readline().strip() == b"ready"
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def context(tmp_path, get_state, link=THIS_MACHINE, escalation_s=0.6, interval=0.3) -> ActionContext:
    config = Config(
        console=ConsoleConfig(interval=interval),
        actions=ActionsConfig(audit_log=str(tmp_path / "audit.log"), signal_escalation_s=escalation_s),
    )
    return ActionContext(
        config=config, get_state=get_state, link=link, runner=ActionRunner(AuditLog(str(tmp_path / "audit.log")))
    )


def audit_records(tmp_path):
    return [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]


def audit_outcomes(tmp_path):
    return [(r["action"], r["outcome"], r.get("command")) for r in audit_records(tmp_path)]


def test_signal_argv_is_kill_with_a_name_and_double_dash():
    assert signal_argv("INT", 421) == ["kill", "-s", "INT", "--", "421"]
    for bad in (0, 1, -5, True, "421"):
        with pytest.raises(ValueError):
            signal_argv("TERM", bad)
    with pytest.raises(ValueError):
        signal_argv("HUP", 421)


async def test_sigterm_to_a_real_local_sleep_and_the_next_frame_shows_it_gone(tmp_path):
    with started(["sleep", "30"]) as sleeper:
        node = ProbedNode("local", [sleeper.pid])
        ctx = context(tmp_path, node.state)
        plan = await plan_action("signal_term", Target(TARGET_PROCESS, "local", pid=sleeper.pid), ctx)
        assert plan.argv == ("kill", "-s", "TERM", "--", str(sleeper.pid))
        assert plan.target.name == "sleep" and "this machine" in plan.where
        report = await run_plan(plan, ctx)
        assert sleeper.wait(10) == -signal.SIGTERM
        assert report.ok, report.lines
        assert "gone" in report.lines[-1] or "zombie" in report.lines[-1]
    assert [o[:2] for o in audit_outcomes(tmp_path)] == [("signal_term", "attempt"), ("signal_term", "ok")]


async def test_a_pid_the_node_did_not_report_is_refused_and_not_signalled(tmp_path):
    with started(["sleep", "30"]) as reported, started(["sleep", "30"]) as other:
        node = ProbedNode("local", [reported.pid])
        ctx = context(tmp_path, node.state)
        with pytest.raises(Refused, match="not a live process in local's latest frame"):
            await plan_action("signal_kill", Target(TARGET_PROCESS, "local", pid=other.pid), ctx)
        assert other.poll() is None and reported.poll() is None
        # A node that is not live: its last frame's PIDs are not trusted.
        down = replace(node.state(), state=STATE_DOWN)
        assert "is down" in refuse_signal(down, reported.pid, local=True)
        assert "no frame" in refuse_signal(NodeState(name="n"), reported.pid, local=True)
        assert "this console" in refuse_signal(ProbedNode("local", [os.getpid()]).state(), os.getpid(), local=True)
        # PID reuse: the frame says python3, /proc says sleep now.
        state = node.state()
        renamed = replace(
            state, frame=replace(state.frame, top_processes=(replace(state.frame.top_processes[0], name="python3"),))
        )
        assert "is now a different process (command 'sleep', not 'python3')" in refuse_signal(
            renamed, reported.pid, local=True
        )
        assert refuse_signal(renamed, reported.pid, local=False) is None  # remote: checked on the node, when sent
        # A frame without start times (a node read by nvidia-smi and /proc text): no PID can be checked.
        no_start = replace(
            state,
            frame=replace(
                state.frame, top_processes=(replace(state.frame.top_processes[0], start_time=None, elapsed_s=None),)
            ),
        )
        assert "gives no start time for PID %d" % reported.pid in refuse_signal(no_start, reported.pid, local=False)


@pytest.mark.sshd
async def test_sigint_over_real_ssh_reaches_a_real_sleep(sshd_factory, tmp_path):
    server = sshd_factory.start()
    link = SshLink(NodeConfig(name="n1", host=server.address, port=server.port), FAST, 0.3)
    try:
        with started(["sleep", "30"]) as sleeper:
            node = ProbedNode("n1", [sleeper.pid])  # the sshd runs here, so /proc here is the node's
            ctx = context(tmp_path, node.state, link=link)
            plan = await plan_action("signal_int", Target(TARGET_PROCESS, "n1", pid=sleeper.pid), ctx)
            assert "over SSH" in plan.where and plan.argv[:3] == ("kill", "-s", "INT")
            report = await run_plan(plan, ctx)
            assert report.ok, report.lines  # first: when the kill did not run over SSH, say why
            assert sleeper.wait(10) == -signal.SIGINT
            # A PID that is gone: the node's signal step says so, and that is the result shown.
            result = await deliver_signal("TERM", sleeper.pid, link, 10, plan.payload)
            assert result.exit_status not in (0, None) and not result.ok
            assert "pid %d has exited" % sleeper.pid in result.error
            # A plan made elsewhere, without what the frame said of the process: nothing is sent.
            unchecked = await deliver_signal("TERM", sleeper.pid, link, 10)
            assert unchecked.refused and "no identity of PID" in unchecked.error
    finally:
        await link.close()
    assert [o[:2] for o in audit_outcomes(tmp_path)] == [("signal_int", "attempt"), ("signal_int", "ok")]
    # The node's answer is in the audit record: it checked the process it was planned for, then signalled it.
    answer = audit_records(tmp_path)[-1]["result"]["answer"]
    assert answer["signalled"] is True and answer["via"] in ("pidfd", "kill")
    assert answer["seen"]["name"] == "sleep" and answer["seen"]["start_time"] == pytest.approx(
        plan.payload.start_time, abs=1.5
    )


# A training loop in the spirit of the seed's GracefulKiller: SIGINT sets a flag, the loop saves and exits.
GRACEFUL = """
import signal, sys, time
stop = []
signal.signal(signal.SIGINT, lambda *a: stop.append(1))
print("ready", flush=True)
while not stop:
    time.sleep(0.02)
open(sys.argv[1], "w").write("checkpoint saved")
"""


async def test_escalation_stops_at_sigint_when_the_script_saves_and_exits(tmp_path):
    saved = tmp_path / "ckpt"
    with started([sys.executable, "-c", GRACEFUL, str(saved)], wait_ready=True) as trainer:
        node = ProbedNode("local", [trainer.pid])
        ctx = context(tmp_path, node.state)
        asked = []

        async def confirm_next(signal_name, verdict):
            asked.append(signal_name)
            return True

        ctx.confirm_next = confirm_next
        plan = await plan_action("escalate", Target(TARGET_PROCESS, "local", pid=trainer.pid), ctx)
        report = await run_plan(plan, ctx)
        assert trainer.wait(10) == 0
    assert saved.read_text() == "checkpoint saved"
    assert report.ok and asked == []
    assert report.lines[0].startswith("SIGINT: exit status 0")


STUBBORN = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    sum(range(20000))  # some CPU, so the probe's top list over SSH has it
    time.sleep(0.005)
"""


@pytest.mark.sshd
async def test_escalation_over_real_ssh_with_streamed_frames_ends_in_sigkill(sshd_factory, tmp_path):
    server = sshd_factory.start()
    link = SshLink(NodeConfig(name="n1", host=server.address, port=server.port), FAST, 0.3)
    log = StateLog()
    task = asyncio.ensure_future(link.run(log))
    try:
        with started([sys.executable, "-c", STUBBORN], wait_ready=True) as stubborn:
            await log.wait_for(
                lambda s: s.state == STATE_UP and any(p.pid == stubborn.pid for p in s.frame.top_processes), 30
            )
            ctx = context(tmp_path, lambda: log.states[-1] if log.states else None, link=link)
            asked = []

            async def confirm_next(signal_name, verdict):
                asked.append((signal_name, verdict.gone, "still running" in verdict.text))
                return True

            ctx.confirm_next = confirm_next
            plan = await plan_action("escalate", Target(TARGET_PROCESS, "n1", pid=stubborn.pid), ctx)
            report = await run_plan(plan, ctx)
            assert stubborn.wait(10) == -signal.SIGKILL
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await link.close()
    assert asked == [("TERM", False, True), ("KILL", False, True)]
    assert report.ok, report.lines
    sent = [cmd[2] for action, outcome, cmd in audit_outcomes(tmp_path) if outcome == "attempt"]
    assert sent == ["INT", "TERM", "KILL"]


async def test_escalation_declined_stops_and_is_audited_as_cancelled(tmp_path):
    with started([sys.executable, "-c", STUBBORN], wait_ready=True) as stubborn:
        node = ProbedNode("local", [stubborn.pid])
        ctx = context(tmp_path, node.state, escalation_s=0.3)

        async def decline(signal_name, verdict):
            return False

        ctx.confirm_next = decline
        plan = await plan_action("escalate", Target(TARGET_PROCESS, "local", pid=stubborn.pid), ctx)
        report = await run_plan(plan, ctx)
        assert stubborn.poll() is None  # SIGINT ignored, nothing more sent
    assert not report.ok and any("stopped before SIGTERM" in line for line in report.lines)
    outcomes = [(o[1], o[2][2]) for o in audit_outcomes(tmp_path)]
    assert outcomes == [("attempt", "INT"), ("ok", "INT"), ("cancelled", "TERM")]


async def test_watch_reports_unknown_when_no_new_frame_arrives():
    old = ProbedNode("n", [os.getpid()]).state()
    verdict = await watch_process(lambda: old, os.getpid(), after=time.time() + 60, timeout=0.2)
    assert not verdict.gone and not verdict.frame_seen and "state unknown" in verdict.text


def refused_record(tmp_path, action_id: str):
    records = [r for r in audit_records(tmp_path) if r["action"] == action_id]
    assert [r["outcome"] for r in records] == ["attempt", "refused"], records
    assert records[0]["id"] == records[1]["id"]
    return records[1]


async def test_a_pid_reused_by_another_process_after_the_plan_is_refused_and_audited(tmp_path):
    """The planned `sleep` exits; another `sleep` of the same user gets its PID: only the start time differs."""
    with started(["sleep", "30"]) as planned:
        node = ProbedNode("local", [planned.pid])
        ctx = context(tmp_path, node.state)
        plan = await plan_action("signal_kill", Target(TARGET_PROCESS, "local", pid=planned.pid), ctx)
        assert any("checked here right before each signal" in note for note in plan.notes)
    after_the_slack(plan.payload.start_time)
    successor = start_on_pid(plan.target.pid, ["sleep", "30"])
    try:
        report = await run_plan(plan, ctx)
        assert successor.poll() is None  # not signalled
    finally:
        successor.kill()
        successor.wait(10)
    assert not report.ok
    assert "REFUSED: pid %d is now a different process (started" % successor.pid in report.lines[0], report.lines
    record = refused_record(tmp_path, "signal_kill")
    assert "is now a different process" in record["detail"] and record["result"]["refused"] is True


@pytest.mark.sshd
async def test_over_real_ssh_a_reused_pid_is_refused_on_the_node_and_the_right_one_is_signalled(sshd_factory, tmp_path):
    server = sshd_factory.start()
    link = SshLink(NodeConfig(name="n1", host=server.address, port=server.port), FAST, 0.3)
    try:
        with started(["sleep", "30"]) as planned:
            node = ProbedNode("n1", [planned.pid])  # the sshd runs here, so /proc here is the node's
            ctx = context(tmp_path, node.state, link=link)
            plan = await plan_action("escalate", Target(TARGET_PROCESS, "n1", pid=planned.pid), ctx)
            assert any("checked on the node right before each signal" in note for note in plan.notes)
        after_the_slack(plan.payload.start_time)
        successor = start_on_pid(plan.target.pid, ["sleep", "30"])
        try:
            report = await run_plan(plan, ctx)
            assert successor.poll() is None  # the node refused: the successor lives
            # Planned afresh from a frame that lists the successor: the right process, and only it, goes.
            with started(["sleep", "30"]) as bystander:
                node.pids = [successor.pid, bystander.pid]
                fresh = await plan_action("signal_term", Target(TARGET_PROCESS, "n1", pid=successor.pid), ctx)
                done = await run_plan(fresh, ctx)
                assert successor.wait(10) == -signal.SIGTERM
                assert bystander.poll() is None
        finally:
            if successor.poll() is None:
                successor.kill()
            successor.wait(10)
    finally:
        await link.close()
    assert not report.ok and "REFUSED" in report.lines[0] and "is now a different process" in report.lines[0]
    refused = refused_record(tmp_path, "escalate")
    seen = refused["result"]["answer"]["seen"]
    assert seen["start_time"] > plan.payload.start_time + 1.5  # the node read the successor's start time
    assert done.ok, done.lines
    assert [r["outcome"] for r in audit_records(tmp_path) if r["action"] == "signal_term"] == ["attempt", "ok"]


def test_a_gpu_process_is_identified_by_its_host_row_else_its_elapsed_time_within_the_poll():
    """A host row's start time is exact; a GPU row has run elapsed_s when the probe sampled it, some time
    in the poll (probe_ms) after the frame's time: the start is taken mid-poll, the slack widened to match."""
    from opsconsole.actions.signals import identity_in_frame

    gpu = ProcessSample(pid=4242, name="python", user="alice", elapsed_s=100.0, gpu_index=0)
    frame = NodeFrame(node="n", time=1_000_000.0, seq=1, processes=(gpu,), probe_ms=400.0)
    only_gpu = identity_in_frame(frame, 4242)
    assert only_gpu.start_time == 999_900.2 and only_gpu.slack_s == pytest.approx(1.5 + 0.2 + 0.05)
    assert only_gpu.request("KILL") == {
        "pid": 4242,
        "signal": "KILL",
        "start_time": 999_900.2,
        "slack": only_gpu.slack_s,
        "name": "python",
        "user": "alice",
    }
    host = ProcessSample(pid=4242, name="python", start_time=999_899.87)
    both = identity_in_frame(replace(frame, top_processes=(host,)), 4242)
    assert (both.start_time, both.slack_s, both.user) == (999_899.87, 1.5, "alice")
    assert identity_in_frame(replace(frame, processes=(replace(gpu, elapsed_s=None),)), 4242) is None
    assert identity_in_frame(frame, 999) is None


def test_the_signal_step_refuses_what_it_cannot_check_and_bad_requests(capsys):
    """probe/checked_signal.py in this process: odd requests are answered, never a traceback; a start
    time or slack that is not a number matches nothing."""
    from opsconsole.probe import checked_signal

    with started(["sleep", "30"]) as sleeper:
        wait_for_sync(lambda: open("/proc/%d/stat" % sleeper.pid).read().split("(")[1].startswith("sleep)"))
        seen = checked_signal.identity_of(sleeper.pid)
        for odd in ({"start_time": float("nan")}, {"start_time": seen["start_time"], "slack": float("nan")}):
            answer = checked_signal.signal_checked(sleeper.pid, "KILL", dict({"name": "sleep"}, **odd))
            assert answer["refused"] and not answer["signalled"], answer
        wide = {"start_time": seen["start_time"] - 60, "slack": 1e9, "name": "sleep"}  # capped at MAX_SLACK_S
        assert checked_signal.signal_checked(sleeper.pid, "KILL", wide)["refused"]
        assert checked_signal.signal_checked(1, "KILL", {"start_time": 0})["refused"] == "pid 1 cannot be signalled"
        assert checked_signal.signal_checked(sleeper.pid, "HUP", {})["error"] == "unknown signal 'HUP'"
        for bad in ([], ["not json"], ['{"pid": true, "signal": "KILL"}'], ['{"pid": 5}'], ["[1]"]):
            assert checked_signal.main(bad) == checked_signal.EXIT_BAD_REQUEST
            assert json.loads(capsys.readouterr().out)["error"].startswith("bad request")
        assert sleeper.poll() is None


def test_the_signal_step_matches_the_command_name_exactly_not_by_any_prefix(tmp_path):
    """The frame's name is /proc's comm (or a longer name the kernel cut to 15 bytes): a process whose
    comm is a prefix of it ('sleep' for a frame's 'sleeper'), longer than it ('sleep' for 'sl') or empty
    is another command, refused; a 15-byte comm matches the full name it was cut from."""
    from opsconsole.probe import checked_signal

    def comm_of(pid: int) -> str:
        return open("/proc/%d/stat" % pid).read().split("(", 1)[1].rsplit(")", 1)[0]

    with started(["sleep", "30"]) as sleeper:
        wait_for_sync(lambda: comm_of(sleeper.pid) == "sleep", "the child to be sleep")
        seen = checked_signal.identity_of(sleeper.pid)
        for frame_name in ("sleeper", "sl", "s"):
            expected = {"start_time": seen["start_time"], "name": frame_name, "user": seen["user"]}
            answer = checked_signal.signal_checked(sleeper.pid, "KILL", expected)
            assert answer["refused"] and not answer["signalled"], (frame_name, answer)
        assert sleeper.poll() is None
    # A process that set its comm to nothing (prctl PR_SET_NAME "") is not every command.
    blank = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'', 0, 0, 0); print('ready', flush=True); time.sleep(60)"
    with started([sys.executable, "-c", blank], wait_ready=True) as nameless:
        assert comm_of(nameless.pid) == ""
        seen = checked_signal.identity_of(nameless.pid)
        answer = checked_signal.signal_checked(
            nameless.pid, "KILL", {"start_time": seen["start_time"], "name": "python3"}
        )
        assert answer["refused"] and not answer["signalled"], answer
        assert nameless.poll() is None
    # The kernel keeps 15 bytes of a longer executable's name; the frame may hold the whole one.
    long_name = tmp_path / "sleep_for_a_long_while"
    long_name.symlink_to(subprocess.check_output(["sh", "-c", "command -v sleep"]).decode().strip())
    with started([str(long_name), "30"]) as long_sleeper:
        wait_for_sync(lambda: comm_of(long_sleeper.pid) == "sleep_for_a_lon", "the child's cut comm")
        seen = checked_signal.identity_of(long_sleeper.pid)
        expected = {"start_time": seen["start_time"], "name": "sleep_for_a_long_while", "user": str(seen["uid"])}
        answer = checked_signal.signal_checked(long_sleeper.pid, "KILL", expected)
        assert answer["signalled"], answer
        assert long_sleeper.wait(10) == -signal.SIGKILL


def test_the_signal_step_answers_a_request_of_wrong_types_without_a_traceback(capsys):
    """A request whose name, user, start time or slack is of another type is a bad request (exit 2, one JSON
    line), never a traceback: the console reads a missing answer as not signalled, but says why."""
    from opsconsole.probe import checked_signal

    with started(["sleep", "30"]) as sleeper:
        for odd in ({"start_time": "soon"}, {"name": 7}, {"user": ["root"]}, {"slack": "wide"}, {"start_time": True}):
            request = dict({"pid": sleeper.pid, "signal": "KILL", "start_time": time.time(), "name": "sleep"}, **odd)
            assert checked_signal.main([json.dumps(request)]) == checked_signal.EXIT_BAD_REQUEST, odd
            assert json.loads(capsys.readouterr().out)["error"].startswith("bad request"), odd
        assert sleeper.poll() is None


@pytest.mark.sshd
@pytest.mark.parametrize(
    "answer",
    [
        "",  # nothing at all
        "signalled\n",  # not JSON
        '{"signalled": "yes", "pid": PID}\n',  # truthy, not true
        '{"signalled": 1, "pid": PID}\n',
        '{"pid": PID, "refused": null, "error": null}\n',  # no outcome
        '{"signalled": true, "pid": PID\n',  # cut short
        "[true]\n",
    ],
)
async def test_a_missing_or_garbled_answer_from_the_node_is_never_a_signal_sent(sshd_factory, tmp_path, answer):
    """A node whose signal step answers nothing usable (here its configured python is a script that
    prints the answer under test and exits 0): the result is not ok, whatever the exit status."""
    from opsconsole.actions.signals import ProcessIdentity

    with started(["sleep", "30"]) as sleeper:
        step = tmp_path / "step.sh"
        step.write_text("cat >/dev/null\nprintf '%s' '" + answer.replace("PID", str(sleeper.pid)) + "'\nexit 0\n")
        server = sshd_factory.start()
        link = SshLink(
            NodeConfig(name="n1", host=server.address, port=server.port, python="/bin/sh %s" % step), FAST, 0.3
        )
        try:
            identity = ProcessIdentity(sleeper.pid, time.time(), "sleep")
            result = await deliver_signal("KILL", sleeper.pid, link, 10, identity)
        finally:
            await link.close()
        assert not result.ok and ("did not answer" in result.error or "gave no outcome" in result.error), result
        assert sleeper.poll() is None
