"""Delivering alerts to a user's own command (Slack, pager ...): JSON on stdin, bounded in time.

The hook runs as a child process with no shell; a hook that fails, hangs or cannot be
started becomes a HookResult the console shows, never an exception or a stalled console.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Optional, Sequence

DEFAULT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class HookResult:
    ok: bool
    message: str  # "exit 0", "exit 3: <stderr tail>", "timed out after 5 s (killed)", "cannot start: ..."
    duration_s: float
    returncode: Optional[int] = None


async def deliver(argv: Sequence[str], payload: dict, timeout: float = DEFAULT_TIMEOUT_S) -> HookResult:
    """Run `argv` with `payload` as one JSON document on stdin; kill it after `timeout` seconds."""
    start = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # a hook's children are killed with it, not left to the console
        )
    except OSError as exc:
        return HookResult(False, "cannot start %s: %s" % (argv[0], exc.strerror or exc), time.monotonic() - start)
    data = (json.dumps(payload) + "\n").encode()
    try:
        _, stderr = await asyncio.wait_for(proc.communicate(data), timeout)
    except asyncio.TimeoutError:
        _kill_group(proc)
        await proc.wait()
        return HookResult(False, "timed out after %g s (killed)" % timeout, time.monotonic() - start)
    except (BrokenPipeError, ConnectionResetError):
        stderr = b""
        await proc.wait()
    duration = time.monotonic() - start
    if proc.returncode == 0:
        return HookResult(True, "exit 0", duration, 0)
    tail = stderr.decode(errors="replace").strip().splitlines()[-1:] if stderr else []
    detail = ": " + tail[0][:200] if tail else ""
    return HookResult(False, "exit %s%s" % (proc.returncode, detail), duration, proc.returncode)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    import os
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
