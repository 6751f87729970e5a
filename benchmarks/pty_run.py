"""Run a program on a real pseudo-terminal and measure its CPU time (shared by the console benchmarks)."""

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

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class PtyProcess:
    """A child process whose stdin/stdout is a pty of the given size, output drained in a thread."""

    def __init__(self, argv, columns=140, rows=45, env=None):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        full_env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(columns), LINES=str(rows))
        full_env.update(env or {})
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=full_env, cwd=ROOT, start_new_session=True
        )
        os.close(slave)
        self._master = master
        self.output_bytes = 0
        self._drain = threading.Thread(target=self._read_all, daemon=True)
        self._drain.start()

    def _read_all(self):
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.output_bytes += len(chunk)

    def send(self, data: bytes) -> None:
        os.write(self._master, data)

    def stop(self, quit_key: bytes = b"q", timeout: float = 5.0) -> int:
        try:
            self.send(quit_key)
            return self.proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            return self.proc.wait()
        finally:
            os.close(self._master)


def compile_sources() -> None:
    """Byte-compile opsconsole's modules, as an install does (the GPU node's runs compile every module
    first): with PYTHONDONTWRITEBYTECODE set (this VM sets it), a module edited since its last .pyc
    would otherwise be compiled again at every launch, ~10 ms for tui/app.py alone, which the
    Textual floor app (an installed package, compiled) never pays."""
    import compileall

    if (ROOT / "opsconsole").is_dir():
        compileall.compile_dir(str(ROOT / "opsconsole"), quiet=2)  # a read-only tree: launched as it is


def console_argv(*args: str):
    return [sys.executable, "-m", "opsconsole", *args]
