"""A PID handed to another process, as the kernel does once its first owner exits: arranged for tests.

The kernel's next PID is set through /proc/sys/kernel/ns_last_pid (root, in the PID namespace's
owner); where that cannot be written the test is skipped. Other processes on the machine may take
the PID first: tried again with a fresh child each time.
"""

from __future__ import annotations

import subprocess
import time
from typing import List

import pytest

from opsconsole.probe.proc_read import START_SLACK_S


def start_on_pid(pid: int, argv: List[str], tries: int = 200, **popen) -> subprocess.Popen:
    """A new process running `argv` with PID `pid` (whose owner has exited and been reaped)."""
    options = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    options.update(popen)
    for _ in range(tries):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError as exc:
            pytest.skip("cannot choose the next PID here (%s): PID reuse not arranged" % exc.strerror)
        proc = subprocess.Popen(argv, **options)
        if proc.pid == pid:
            return proc
        proc.kill()  # another process took the PID first: try again
        proc.wait(10)
    pytest.skip("PID %d was taken by other processes %d times" % (pid, tries))


def after_the_slack(started_at: float) -> None:
    """Return once a process started now starts later than `started_at` by more than START_SLACK_S:
    two starts closer than that are taken for one process (see probe/proc_read.py)."""
    while time.time() < started_at + START_SLACK_S + 0.3:
        time.sleep(0.05)
