"""The console started as a user starts it, in a real pty (140x40), by a Python snippet that watches
its launch: the snippet writes what it found to a file, the test waits for the file, then quits the
console with `q` (killed if it does not end)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_GUARD_S = 120  # only so a hang fails the test instead of blocking the run


def drain(fd: int) -> None:
    """Read what the console draws, so that it never blocks on a full pty."""
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return


def run_until(tmp_path: Path, code: str, args: list, done: Callable[[], bool]) -> None:
    """Run `python -c code *args` in a pty with no config file and state under tmp_path until done()."""
    env = dict(os.environ, TERM="xterm-256color", XDG_STATE_HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path))
    env.pop("OPSCONSOLE_CONFIG", None)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 140, 0, 0))
    console = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        cwd=ROOT,
        env=env,
        start_new_session=True,
    )
    os.close(follower)
    threading.Thread(target=drain, args=(leader,), daemon=True).start()
    try:
        deadline = time.monotonic() + SUBPROCESS_GUARD_S
        while not done():
            assert console.poll() is None and time.monotonic() < deadline, "the console drew no first frame"
            time.sleep(0.05)
    finally:
        os.write(leader, b"q")
        try:
            console.wait(timeout=SUBPROCESS_GUARD_S)
        finally:
            if console.poll() is None:
                console.kill()
                console.wait()
            os.close(leader)
