"""A process that exits while the confirmation is open, and is not yet reaped, is not signalled.

The frame listed it alive when the plan was made; by the `y` it has exited and its parent has not
waited for it yet (a rank whose launcher is busy, a child of a shell that is stopped): it is a
zombie, /proc/PID still has its start time, name and user, and a pidfd signal to it succeeds while
doing nothing. The step reported "exit status 0", audited "ok", as if the process had been
stopped. It now says the process has exited and audits the signal as not sent.
"""

from __future__ import annotations

import os
import signal
import subprocess

from opsconsole.actions.registry import TARGET_PROCESS, Target, plan_action, run_plan
from opsconsole.probe.checked_signal import EXIT_NOT_SIGNALLED, identity_of, signal_checked
from tests.test_actions_signals import ProbedNode, audit_records, context
from tests.waiting import wait_for_sync


def zombie_state(pid: int) -> bool:
    with open("/proc/%d/stat" % pid, "rb") as stat:
        return stat.read().rsplit(b")", 1)[1].split()[0] == b"Z"


async def test_a_process_that_exited_unreaped_after_the_plan_is_not_reported_signalled(tmp_path):
    sleeper = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    try:
        frame_before = ProbedNode("local", [sleeper.pid]).state()  # the frame the plan and the question saw
        ctx = context(tmp_path, lambda: frame_before)
        plan = await plan_action("signal_term", Target(TARGET_PROCESS, "local", pid=sleeper.pid), ctx)
        os.kill(sleeper.pid, signal.SIGKILL)  # it exits while the question is open; not reaped (no wait yet)
        wait_for_sync(lambda: zombie_state(sleeper.pid), what="the sleeper to be a zombie")
        report = await run_plan(plan, ctx)
        assert not report.ok, report.lines
        assert "pid %d has exited (a zombie" % sleeper.pid in report.lines[0], report.lines
        records = [r for r in audit_records(tmp_path) if r["action"] == "signal_term"]
        assert [r["outcome"] for r in records] == ["attempt", "failed"]
        assert records[1]["result"]["answer"]["signalled"] is False
        assert records[1]["result"]["answer"]["seen"]["state"] == "Z"
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait(10)


def test_the_node_side_step_answers_not_signalled_for_a_zombie():
    child = subprocess.Popen(["true"])
    try:
        wait_for_sync(lambda: zombie_state(child.pid), what="the child to be a zombie")
        seen = identity_of(child.pid)
        expected = {"start_time": seen["start_time"], "name": seen["name"], "user": seen["user"]}
        answer = signal_checked(child.pid, "KILL", expected)
        assert answer["signalled"] is False and answer["via"] is None
        assert answer["error"] == (
            "pid %d has exited (a zombie: its parent, pid %d, has not reaped it): not signalled"
            % (child.pid, os.getpid())
        )
    finally:
        child.wait(10)
    assert EXIT_NOT_SIGNALLED == 4
