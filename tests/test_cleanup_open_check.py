"""The open-file check before a cleanup: what it could not look at, named, and nothing else counted.

A process whose /proc/PID/fd and maps the check cannot read could hold a checkpoint that is then
deleted: the note names it and says so. Made here with a real child that is not dumpable
(prctl PR_SET_DUMPABLE 0: its /proc entries need CAP_SYS_PTRACE), read by a scanner without
that capability (this test's own user, or nobody when the test runs as root). Processes that
ended during the scan and kernel threads cannot hold files and are not counted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from opsconsole.probe import delete_units

REPO = Path(__file__).resolve().parents[1]
NOBODY = 65534

# A child that holds its argv[1] open, then makes itself not dumpable, says so and waits.
HOLD_UNDUMPABLE = """import ctypes, sys
held = open(sys.argv[1], 'rb')
assert ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE, 0
print('ready', flush=True)
sys.stdin.readline()
"""


def as_scanner():
    """(argv prefix, python) that runs a scan without CAP_SYS_PTRACE: nobody when we are root."""
    if os.geteuid() != 0:
        return [], sys.executable
    if not (shutil.which("setpriv") and os.path.exists("/usr/bin/python3")):
        pytest.skip("needs setpriv and /usr/bin/python3 to scan as another user than root")
    return ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups"], "/usr/bin/python3"


@pytest.fixture
def shared_dir():
    """A checkpoint directory the scanner's user owns, under a parent both may enter (not pytest's 0700 tmp)."""
    folder = tempfile.mkdtemp(prefix="opsconsole-open-check-")
    os.chmod(folder, 0o755)
    root = Path(folder) / "ckpts"
    root.mkdir()
    (root / "checkpoint_epoch_1.pt").write_bytes(b"x" * 4096)
    if os.geteuid() == 0:
        for path in (root, root / "checkpoint_epoch_1.pt"):
            os.chown(path, NOBODY, NOBODY)
    try:
        yield root
    finally:
        shutil.rmtree(folder)


def test_a_process_the_check_cannot_read_is_named_and_its_risk_said(shared_dir):
    prefix, python = as_scanner()
    held = shared_dir / "checkpoint_epoch_1.pt"
    child = subprocess.Popen(
        prefix + [python, "-c", HOLD_UNDUMPABLE, str(held)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout.readline().strip() == b"ready"
        code = (
            "import json, sys; sys.path.insert(0, %r)\n"
            "from opsconsole.probe.delete_units import in_use_under\n"
            "print(json.dumps(in_use_under(%r)))" % (str(REPO), str(shared_dir))
        )
        done = subprocess.run(prefix + [python, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
    finally:
        child.stdin.close()
        child.wait(30)
    assert str(held) not in answer["paths"]  # the hold is invisible: that is the risk
    note = answer["note"]
    assert note.startswith("open-file check could not read %d process" % answer["denied"])
    # The directory owner's process first (it may be the job writing there), by pid and name.
    assert "(pid %d python" % child.pid in note
    assert "would not be seen, and could be deleted" in note


def test_a_process_that_ended_during_the_scan_is_not_counted():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)  # listed by /proc before, reaped now: its pid is gone when it is read
    found = delete_units.InUse()
    delete_units.scan_pids(found, [str(child.pid)], "/nonexistent")
    assert (found.processes, found.denied, found.note()) == (0, 0, None)


def kernel_thread_pids():
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path("/proc/%s/stat" % entry).read_bytes()
            except OSError:
                continue
            if int(stat[stat.rindex(b")") + 2 :].split()[6]) & delete_units.PF_KTHREAD:
                pids.append(entry)
    return pids


def test_kernel_threads_are_not_looked_at_or_counted():
    kernel = kernel_thread_pids()
    if not kernel:
        pytest.skip("no kernel threads visible here (a container without the host's /proc)")
    found = delete_units.InUse()
    delete_units.scan_pids(found, kernel, "/nonexistent")
    assert (found.processes, found.denied) == (0, 0)


def test_a_readable_process_is_counted_and_not_named(tmp_path):
    held = tmp_path / "weights.bin"
    held.write_bytes(b"w")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; f = open(sys.argv[1]); print('ready', flush=True); sys.stdin.readline()",
            str(held),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout.readline().strip() == b"ready"
        found = delete_units.InUse()
        delete_units.scan_pids(found, [str(child.pid)], str(tmp_path))
    finally:
        child.stdin.close()
        child.wait(30)
    assert found.processes == 1 and found.denied == 0 and found.note() is None
    assert str(held) in found.paths


# A child whose main thread exits alone (the exit syscall, not exit_group) while another thread holds
# its argv[1] open and mapped: /proc/PID/stat then says Z and /proc/PID/fd and maps are empty, yet the
# file is open in /proc/PID/task/TID/ of the live thread. (The dead main thread held the GIL: the
# other blocks on it, which keeps it alive and holding.)
HOLD_AFTER_MAIN_EXITS = """import ctypes, mmap, platform, sys, threading, time
held = open(sys.argv[1], 'rb')
mapped = mmap.mmap(held.fileno(), 0, access=mmap.ACCESS_READ)
threading.Thread(target=lambda: time.sleep(3600)).start()
print('ready', flush=True)
ctypes.CDLL(None).syscall({'x86_64': 60, 'aarch64': 93}[platform.machine()], 0)  # SYS_exit
"""


def _state_of(pid: int) -> str:
    return Path("/proc/%d/stat" % pid).read_bytes().rpartition(b")")[2].split()[0].decode()


def test_a_process_whose_main_thread_exited_still_holds_its_files(tmp_path):
    """Its leader is a zombie, not the process: a checkpoint its threads hold must be seen (before, a
    'zombie' was passed over and the file was not in use to the cleanup, which deleted it)."""
    import platform

    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("the exit syscall's number is known here for x86_64 and aarch64 only")
    held = tmp_path / "checkpoint_epoch_1.pt"
    held.write_bytes(b"w" * 4096)
    child = subprocess.Popen([sys.executable, "-c", HOLD_AFTER_MAIN_EXITS, str(held)], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        for _ in range(1000):  # the leader exits after it said 'ready': wait for that, up to 10 s
            if _state_of(child.pid) == "Z":
                break
            time.sleep(0.01)
        assert _state_of(child.pid) == "Z" and os.listdir("/proc/%d/fd" % child.pid) == []
        found = delete_units.InUse()
        delete_units.scan_pids(found, [str(child.pid)], str(tmp_path))
        assert found.processes == 1 and found.denied == 0
        assert str(held) in found.paths
        in_use = delete_units.in_use_under(str(tmp_path))
        assert in_use["paths"] == [str(held)]
    finally:
        child.kill()
        child.wait(30)


def test_a_proc_that_hides_other_users_processes_is_said(shared_dir):
    """/proc mounted hidepid=2 (hardened clusters do so) hides other users' processes from the check
    altogether: none of them is even unreadable, and the note said nothing. Here a mount namespace
    of the scanner's own (unshare -m, private) mounts a proc of its own so, and the scanner runs as
    nobody beside a root child that holds the checkpoint open."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare to mount a proc with hidepid in a mount namespace of its own")
    prefix, python = as_scanner()
    held = shared_dir / "checkpoint_epoch_1.pt"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; f = open(sys.argv[1], 'rb'); print('ready', flush=True); sys.stdin.readline()",
            str(held),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout.readline().strip() == b"ready"
        code = (
            "import json, os, sys; sys.path.insert(0, %r)\n"
            "from opsconsole.probe.delete_units import in_use_under\n"
            "assert not os.path.exists('/proc/%d')\n"  # hidden from nobody indeed
            "print(json.dumps(in_use_under(%r)))" % (str(REPO), child.pid, str(shared_dir))
        )
        mount = 'mount -t proc -o hidepid=2 proc /proc && exec "$@"'
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh"] + prefix + [python, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
    finally:
        child.stdin.close()
        child.wait(30)
    assert answer["paths"] == []  # the hold is invisible: that is the risk
    assert "cannot see other users' processes (/proc is mounted hidepid=" in (answer["note"] or "")
    assert "could be deleted" in answer["note"]
