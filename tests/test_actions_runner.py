"""The action runner: the attempt record is on disk before the command runs, and survives a crash mid-action."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from opsconsole.actions.audit import AuditLog, read_recent_records
from opsconsole.actions.runner import ActionRunner, CommandResult, run_local
from tests.sshd import ssh_client, sshd_factory  # noqa: F401

WAIT_LIMIT_S = 20.0


def records(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!%s\n%s" % (sys.executable, textwrap.dedent(body)))
    path.chmod(0o755)
    return path


# A stub command that proves the attempt was on disk first: it reads the audit log itself and
# exits 3 unless the last record is the attempt for exactly this command line.
CHECKS_AUDIT = """
import json, os, sys
path = os.environ["AUDIT_PATH"]
try:
    last = json.loads(open(path).read().splitlines()[-1])
except (OSError, IndexError, ValueError) as exc:
    print("no audit record: %s" % exc, file=sys.stderr)
    sys.exit(3)
if last.get("outcome") != "attempt" or last.get("command") != sys.argv:
    print("last record is not my attempt: %r" % (last,), file=sys.stderr)
    sys.exit(3)
print("attempt %s seen before running" % last["id"])
"""


async def test_attempt_is_on_disk_before_the_command_runs(tmp_path, monkeypatch):
    audit = tmp_path / "audit.log"
    stub = write_script(tmp_path / "check-audit", CHECKS_AUDIT)
    monkeypatch.setenv("AUDIT_PATH", str(audit))
    runner = ActionRunner(AuditLog(str(audit)))
    argv = [str(stub), "--gpu-reset", "-i", "0"]
    outcome = await runner.run("gpu_reset", "n1", "gpu 0", argv, lambda: run_local(argv, 10))
    assert outcome.ok, outcome.result
    assert "seen before running" in outcome.result.stdout
    attempt, result = records(audit)
    assert attempt["outcome"] == "attempt" and result["outcome"] == "ok"
    assert attempt["id"] == result["id"] and attempt["id"]
    assert attempt["command"] == argv and attempt["target"] == "gpu 0" and attempt["node"] == "n1"
    assert result["result"]["exit_status"] == 0 and "seen before running" in result["result"]["stdout"]
    for field in ("time", "user", "host", "action", "node", "target", "command", "outcome"):
        assert field in attempt


async def test_the_same_stub_fails_when_nothing_was_audited(tmp_path, monkeypatch):
    """The proof above has teeth: run without the runner, the stub finds no attempt and fails."""
    audit = tmp_path / "audit.log"
    stub = write_script(tmp_path / "check-audit", CHECKS_AUDIT)
    monkeypatch.setenv("AUDIT_PATH", str(audit))
    result = await run_local([str(stub)], 10)
    assert result.exit_status == 3 and "no audit record" in result.stderr


async def test_an_unwritable_audit_log_means_the_command_does_not_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    marker = tmp_path / "ran"
    runner = ActionRunner(AuditLog(str(blocker / "audit.log")))
    argv = ["touch", str(marker)]
    outcome = await runner.run("signal_term", "n1", "pid 5", argv, lambda: run_local(argv, 10))
    assert not outcome.ran and not outcome.ok
    assert "Not a directory" in outcome.summary()
    assert not marker.exists()


async def test_failures_timeouts_and_missing_programs_are_results(tmp_path):
    audit = tmp_path / "audit.log"
    runner = ActionRunner(AuditLog(str(audit)))
    failing = ["sh", "-c", "echo out; echo 'bad thing' >&2; exit 4"]
    outcome = await runner.run("drain_node", "n1", "node n1", failing, lambda: run_local(failing, 10))
    assert outcome.ran and not outcome.ok
    assert outcome.result.exit_status == 4 and outcome.summary() == "exit 4: bad thing"
    missing = await run_local(["/nonexistent/nvidia-smi", "-r"], 10)
    assert missing.error == "command not found: /nonexistent/nvidia-smi"
    # A command that outlives its timeout is stopped with its children (its own process group).
    child_pid = tmp_path / "child.pid"
    slow = ["sh", "-c", "sleep 30 & echo $! > %s; wait" % child_pid]
    timed = await run_local(slow, 0.5)
    assert timed.timed_out and "timed out after 0.5 s" in timed.error
    pid = int(child_pid.read_text())
    for _ in range(100):
        if not _alive(pid):
            break
        time.sleep(0.05)
    assert not _alive(pid)
    outcomes = [r["outcome"] for r in records(audit)]
    assert outcomes == ["attempt", "failed"]


async def test_an_executor_that_raises_is_a_failed_result_not_a_crash(tmp_path):
    audit = tmp_path / "audit.log"
    runner = ActionRunner(AuditLog(str(audit)))

    async def broken() -> CommandResult:
        raise RuntimeError("bug in an executor")

    outcome = await runner.run("health_rerun", "n1", "node n1", ["opsconsole", "check"], broken)
    assert outcome.ran and not outcome.ok and "RuntimeError: bug in an executor" in outcome.summary()
    assert [r["outcome"] for r in records(audit)] == ["attempt", "failed"]


def _alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


# The runner in its own process, running a stub that writes its PID and then sleeps; the test
# kills the runner with SIGKILL mid-action, as a crash or an OOM kill would.
CRASHING_RUNNER = """
import asyncio, sys
from opsconsole.actions.audit import AuditLog
from opsconsole.actions.runner import ActionRunner, run_local
audit, stub = sys.argv[1], sys.argv[2]
argv = [stub, "--gpu-reset", "-i", "1"]
runner = ActionRunner(AuditLog(audit))
asyncio.run(runner.run("gpu_reset", "n1", "gpu 1", argv, lambda: run_local(argv, 60)))
"""

SLEEPING_STUB = """
import os, sys, time
open(os.environ["STUB_PID_FILE"], "w").write(str(os.getpid()))
time.sleep(60)
"""


def test_a_crash_mid_action_leaves_the_attempt_record(tmp_path):
    audit = tmp_path / "audit.log"
    stub = write_script(tmp_path / "slow-reset", SLEEPING_STUB)
    pid_file = tmp_path / "stub.pid"
    env = dict(os.environ, STUB_PID_FILE=str(pid_file), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    runner = subprocess.Popen([sys.executable, "-c", CRASHING_RUNNER, str(audit), str(stub)], env=env)
    stub_pid = None
    try:
        deadline = time.monotonic() + WAIT_LIMIT_S
        while not pid_file.exists() or not pid_file.read_text():
            assert runner.poll() is None, "the runner exited early"
            assert time.monotonic() < deadline, "the stub never started"
            time.sleep(0.05)
        stub_pid = int(pid_file.read_text())
        runner.send_signal(signal.SIGKILL)
        runner.wait(10)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(10)
        if stub_pid is not None:  # the stub lives in its own session: stop it too
            try:
                os.kill(stub_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    found = records(audit)
    assert [r["outcome"] for r in found] == ["attempt"]
    assert found[0]["command"] == [str(stub), "--gpu-reset", "-i", "1"] and found[0]["action"] == "gpu_reset"
    # The Audit pane's reader shows it, newest first, like any other record.
    shown, problem = read_recent_records(str(audit))
    assert problem is None and shown[0]["id"] == found[0]["id"]


def test_recent_records_are_newest_first_and_bad_lines_show(tmp_path):
    audit = tmp_path / "audit.log"
    log = AuditLog(str(audit))
    for i in range(5):
        assert (
            log.write("signal_int", "n%d" % i, "d", "ok", target="pid %d" % i, command=["kill"], entry_id=str(i))
            is None
        )
    with open(audit, "a") as f:
        f.write("not json at all\n")
    shown, problem = read_recent_records(str(audit), limit=3)
    assert problem is None
    assert [r.get("node") for r in shown] == [None, "n4", "n3"]
    assert shown[0]["outcome"] == "unreadable" and "not json" in shown[0]["detail"]
    assert read_recent_records(str(tmp_path / "missing.log")) == ([], None)


@pytest.mark.parametrize("tail", [False, True])
def test_reading_the_tail_of_a_big_log_skips_the_cut_line(tmp_path, monkeypatch, tail):
    import opsconsole.actions.audit as audit_module

    if tail:
        monkeypatch.setattr(audit_module, "READ_TAIL_BYTES", 1000)
    audit = tmp_path / "audit.log"
    log = AuditLog(str(audit))
    for i in range(40):
        log.write("signal_int", "node%02d" % i, "x" * 50, "ok")
    shown, _ = read_recent_records(str(audit))
    assert shown[0]["node"] == "node39"
    assert all(r["outcome"] == "ok" for r in shown)  # no torn first line
    assert (len(shown) < 40) == tail


@pytest.mark.sshd
async def test_remote_commands_capture_output_status_and_time_out(sshd_factory):
    from opsconsole.actions.runner import run_on_node
    from opsconsole.config import NodeConfig, SshConfig
    from opsconsole.nodes.ssh import SshLink

    server = sshd_factory.start()
    fast = SshConfig(connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2)
    link = SshLink(NodeConfig(name="n1", host=server.address, port=server.port), fast, 0.3)
    try:
        result = await run_on_node(link, ["sh", "-c", "echo out; echo 'err line' >&2; exit 3"], 10)
        assert (result.exit_status, result.stdout, result.stderr) == (3, "out\n", "err line\n")
        assert result.summary() == "exit 3: err line"
        # Each argv word arrives as one word: no shell on the node splits or expands it.
        echoed = await run_on_node(link, ["printf", "%s|", "a b", "$(id)", "; true"], 10)
        assert echoed.stdout == "a b|$(id)|; true|"
        slow = await run_on_node(link, ["sleep", "5"], 0.5)
        assert slow.timed_out and slow.exit_status is None and "n1: command timed out after 0.5 s" == slow.error
    finally:
        await link.close()
