"""What the console ships to a node runs on the oldest python3 that compute nodes have.

RHEL 8 and CentOS 7 (with python3) ship Python 3.6. Each test runs the real code as the console
ships it (the probe bundle on stdin, the deletion helper and the log follower as their own source
with `-c`) under pyenv's 3.6 and 3.8, and is skipped where that interpreter is absent.
"""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from opsconsole.checkpoints.remote import helper_argv
from opsconsole.health.remote import health_bundle
from opsconsole.logs.remote import follower_source
from opsconsole.model import NodeFrame, from_wire
from opsconsole.nodes.bundle import helper_bundle, probe_bundle
from tests.waiting import wait_for_sync

OLD_PYTHONS = ("3.6", "3.8")


def old_python(version: str) -> str:
    """pyenv's newest `version`.x interpreter, else python<version> on PATH; skips the test without one."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = sorted(glob.glob(os.path.join(root, "versions", version + ".*", "bin", "python")))
    path = found[-1] if found else shutil.which("python" + version)
    if not path:
        pytest.skip("no Python %s here (pyenv or PATH)" % version)
    return path


@pytest.fixture(params=OLD_PYTHONS)
def python(request) -> str:
    return old_python(request.param)


def test_the_probe_bundle_prints_a_whole_frame(python):
    result = subprocess.run(
        [python, "-I", "-", "--once", "--node-name", "old", "--disk", "/", "--top", "5"],
        input=probe_bundle(),
        capture_output=True,
        text=True,
        cwd="/tmp",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.strip()]
    frame = from_wire(NodeFrame, json.loads(line))
    assert frame.node == "old" and frame.seq == 1
    assert frame.host is not None and frame.host.cpu_count and frame.host.mem_total
    assert [disk.path for disk in frame.host.disks] == ["/"]
    assert frame.top_processes  # what a 3.6 node lost when it fell back to nvidia-smi and /proc


def test_the_probe_streams_frames_with_deltas(python):
    proc = subprocess.Popen(
        [python, "-I", "-", "--interval", "0.2", "--node-name", "old"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/tmp",
    )
    try:
        proc.stdin.write(probe_bundle())
        proc.stdin.close()
        lines = [proc.stdout.readline() for _ in range(3)]
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    records = [json.loads(line) for line in lines]
    assert all(isinstance(record, dict) for record in records), lines
    assert len(records) == 3 and records[0]["node"] == "old"


def test_the_health_mode_answers_without_torch(python):
    result = subprocess.run(
        [python, "-I", "-", "--json", "--node-name", "old"],
        input=health_bundle(),
        capture_output=True,
        text=True,
        cwd="/tmp",
        timeout=120,
    )
    assert "Traceback" not in result.stderr, result.stderr
    results = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert results, (result.returncode, result.stderr)
    assert all(isinstance(entry, dict) for entry in results)


def test_the_deletion_helper_deletes_a_pinned_unit(python, tmp_path):
    root = tmp_path / "ckpts"
    root.mkdir()
    (root / "old.pt").write_bytes(b"x" * 10)
    (root / "keep.pt").write_bytes(b"y")
    helper = subprocess.Popen(
        helper_argv(python), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/tmp"
    )

    def ask(request):
        helper.stdin.write((json.dumps(request) + "\n").encode())
        helper.stdin.flush()
        return json.loads(helper.stdout.readline().decode())

    try:
        pinned = ask({"op": "pin", "root": str(root), "units": [["old.pt"]]})
        assert "problem" not in pinned and "error" not in pinned, pinned
        [unit] = pinned["units"]
        opened = ask(
            {
                "op": "open",
                "root": str(root),
                "root_id": pinned["root_id"],
                "units": [{"members": ["old.pt"], "tree": unit["tree"]}],
            }
        )
        assert opened.get("ok") is True, opened
        deleted = ask({"op": "delete", "unit": 0})
        assert deleted["why"] is None and deleted["went"] == ["old.pt"], deleted
        helper.stdin.write(b'{"op": "close"}\n')
        helper.stdin.close()
        assert helper.wait(timeout=30) == 0, helper.stderr.read()
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()
        helper.stdout.close()
        helper.stderr.close()
    assert sorted(p.name for p in root.iterdir()) == ["keep.pt"]


def test_the_log_follower_follows_a_growing_file(python, tmp_path):
    log = tmp_path / "train.log"
    log.write_text("first\n")
    spec = {"globs": [str(tmp_path / "*.log")], "initial": True, "poll": 0.05, "rescan": 0.5}
    follower = subprocess.Popen(
        [python, "-I", "-u", "-c", follower_source(), json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/tmp",
    )
    seen = []

    def read_until(text):
        while not any(text in json.dumps(record) for record in seen):
            line = follower.stdout.readline()
            if not line:
                return False
            seen.append(json.loads(line))
        return True

    try:
        assert read_until("first"), follower.stderr.read()
        with open(log, "a") as out:
            out.write("second\n")
        deadline = time.monotonic() + 30
        assert read_until("second") and time.monotonic() < deadline
    finally:
        follower.stdin.close()  # the console going away: the follower ends on its own
        try:
            wait_for_sync(lambda: follower.poll() is not None, "the follower to end on EOF", timeout=10)
        finally:
            if follower.poll() is None:
                follower.kill()
            follower.wait()
            follower.stdout.close()
            follower.stderr.close()
    assert follower.returncode == 0


def test_the_signal_step_refuses_another_process_and_signals_the_planned_one(python, tmp_path):
    """probe/checked_signal.py as the console ships it: check then kill where there is no pidfd (3.6, 3.8)."""
    from opsconsole.probe.checked_signal import identity_of

    sleeper = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
    try:
        seen = identity_of(sleeper.pid)

        def run(**request):
            request = dict({"pid": sleeper.pid, "signal": "TERM", "name": "sleep", "user": seen["user"]}, **request)
            result = subprocess.run(
                [python, "-I", "-", json.dumps(request)],
                input=helper_bundle("checked_signal", "proc_read"),
                capture_output=True,
                text=True,
                cwd="/tmp",
                timeout=60,
            )
            return result.returncode, json.loads(result.stdout.splitlines()[-1]), result.stderr

        status, answer, err = run(start_time=seen["start_time"] - 60)  # what a plan saw of an earlier owner
        assert status == 3 and answer["signalled"] is False, (answer, err)
        assert answer["refused"].startswith("pid %d is now a different process (started " % sleeper.pid)
        assert "s after the one the plan saw): not signalled" in answer["refused"]
        status, answer, err = run(start_time=seen["start_time"], name="python3")
        assert status == 3 and "command 'sleep', not 'python3'" in answer["refused"], (answer, err)
        assert sleeper.poll() is None
        status, answer, err = run(start_time=seen["start_time"])
        assert status == 0 and answer["signalled"] is True and answer["via"] == "kill", (answer, err)
        assert sleeper.wait(10) == -signal.SIGTERM
        status, answer, err = run(start_time=seen["start_time"])
        assert status == 4 and "has exited" in answer["error"], (answer, err)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait(10)


def test_the_details_reader_reads_the_listed_process_and_not_a_later_one(python):
    from opsconsole.nodes.process_details import MOVED, details_from_answer, reader_argv, reader_bundle

    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "opsconsole-old-reader"], stdin=subprocess.DEVNULL
    )
    try:
        cmdline = "/proc/%d/cmdline" % sleeper.pid
        wait_for_sync(lambda: b"opsconsole-old-reader" in open(cmdline, "rb").read(), "the child to exec")

        def read(expected_start):
            argv = reader_argv(python, sleeper.pid, expected_start)
            result = subprocess.run(argv, input=reader_bundle(), capture_output=True, text=True, cwd="/tmp", timeout=60)
            assert result.returncode == 0, result.stderr
            return details_from_answer(sleeper.pid, result.stdout, expected_start)

        first = read(None)
        assert first.problem is None and first.args[-1] == "opsconsole-old-reader", first
        assert read(first.start_time).args == first.args
        assert read(first.start_time - 60).problem == MOVED
    finally:
        sleeper.kill()
        sleeper.wait(10)


def test_nothing_shipped_needs_python_3_7():
    """Checked without an old interpreter: no postponed annotations (3.7+), and 3.6's grammar."""
    import ast
    from pathlib import Path

    from opsconsole.nodes.bundle import bundle_modules

    shipped = [Path(path) for _, path, _ in bundle_modules()]
    assert any(path.name == "filetail.py" for path in shipped)  # the log follower travels with the probe
    for path in shipped:
        tree = ast.parse(path.read_text(), filename=str(path), feature_version=(3, 6))
        futures = [
            alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module == "__future__"
            for alias in node.names
        ]
        assert "annotations" not in futures, path
