"""The signal step's user check: a frame's user is compared as a name with names, as a uid with uids.

The probe writes a user's name, or the bare uid where the uid has no name; a user may be *called*
"1001". Each case signals a real sleeping child through the real step, with what /proc says of it
crafted in a /proc-like directory (its uid and name) and a table of users in place of passwd.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from opsconsole.probe import checked_signal
from opsconsole.probe.proc_read import CLOCK_TICKS


class TableUsers(checked_signal.PasswdUsers):
    """A passwd database of a few entries: uid -> name."""

    def __init__(self, names):
        self.names = dict(names)

    def name_of(self, uid):
        return self.names.get(uid)

    def uid_of(self, name):
        return next((uid for uid, known in self.names.items() if known == name), None)


# bob is uid 1001; the user called "1001" is uid 5000; uid 7007 has no name.
USERS = TableUsers({1001: "bob", 5000: "1001", 0: "root"})


def crafted_proc(root: Path, pid: int, uid: int) -> Path:
    """A /proc-like directory where `pid` is a `sleep` of real uid `uid`, started 500 s after a boot 1000 s ago."""
    (root / str(pid)).mkdir(parents=True)
    (root / "uptime").write_text("1000.00 3000.00\n")
    ticks = 500 * CLOCK_TICKS
    fields = ["S", "1"] + ["0"] * 17 + [str(ticks)] + ["0"] * 30
    (root / str(pid) / "stat").write_text("%d (sleep) %s\n" % (pid, " ".join(fields)))
    (root / str(pid) / "status").write_text("Name:\tsleep\nUid:\t%d\t%d\t%d\t%d\n" % (uid, uid, uid, uid))
    return root


@pytest.fixture
def sleeper():
    child = subprocess.Popen(["sleep", "60"])
    yield child
    if child.poll() is None:
        child.kill()
    child.wait()


@pytest.mark.parametrize(
    "uid, frame_user, same",
    [
        (1001, "1001", False),  # the reported defect: the user called "1001" is not uid 1001 (bob)
        (5000, "1001", True),  # the user called "1001" is uid 5000
        (1001, "bob", True),
        (1001, "5000", False),  # no name "5000": a uid, and 1001 is not it
        (7007, "7007", True),  # a uid without a name, written as its number by the probe
        (7007, "bob", False),
    ],
)
def test_a_user_is_matched_by_name_or_by_uid_never_a_name_by_a_uid(tmp_path, sleeper, uid, frame_user, same):
    proc = crafted_proc(tmp_path / "proc", sleeper.pid, uid)
    seen = checked_signal.identity_of(sleeper.pid, str(proc), USERS)
    assert seen["user"] == (USERS.name_of(uid) or str(uid))
    expected = {"start_time": seen["start_time"], "name": "sleep", "user": frame_user}
    answer = checked_signal.signal_checked(sleeper.pid, "KILL", expected, str(proc), USERS)
    if same:
        assert answer["signalled"], answer
        assert sleeper.wait(10) == -signal.SIGKILL
    else:
        assert not answer["signalled"] and "user %r, not %r" % (seen["user"], frame_user) in answer["refused"]
        assert sleeper.poll() is None


def test_this_machines_passwd_names_our_own_processes():
    """With the real passwd and /proc: our user matches by its name and by its bare uid only when no one is called that."""
    seen = checked_signal.identity_of(os.getpid())
    assert checked_signal.same_user(seen["user"], os.getuid())
    number = str(os.getuid())
    assert checked_signal.same_user(number, os.getuid()) == (checked_signal.PASSWD.uid_of(number) is None)
