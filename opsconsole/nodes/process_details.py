"""Ask a node for one process's details (probe/proc_details.py) and check what comes back.

The reader runs where the node is: in a thread for the local node, as `python3 -I -c SOURCE
PID` over the node's own SSH connection for a remote one; never for a replayed node (its
pids are not this machine's). The answer is hostile input: bounded and type-checked field
by field; the start time it reports lets a caller tell a reused pid.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shlex
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from opsconsole.nodes.base import COMMANDS_HERE, command_channel, is_replayed
from opsconsole.probe import proc_details

MAX_ANSWER_CHARS = 1 << 20  # the reader prints well under this (64 KiB of arguments, a few variables)
DETAILS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ProcessDetails:
    """What the node said of one process; `problem` is why there is nothing (or less) to show."""

    pid: int
    args: Tuple[str, ...] = ()
    args_cut: bool = False
    rank_env: Tuple[Tuple[str, str], ...] = ()  # (name, value) in proc_details.RANK_VARIABLES order
    cgroup: Tuple[str, ...] = ()
    cwd: Optional[str] = None
    state: Optional[str] = None
    starttime: Optional[int] = None  # clock ticks after boot, as /proc/PID/stat says
    errors: Tuple[Tuple[str, str], ...] = ()  # (part, why) for the parts that could not be read
    problem: Optional[str] = None


def _strings(value: Any, limit: int, chars: int) -> Tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(item[:chars] for item in value[:limit] if isinstance(item, str))


def details_from_answer(pid: int, text: str) -> ProcessDetails:
    """Check the reader's JSON line; anything malformed is a `problem`, never an exception."""
    if len(text) > MAX_ANSWER_CHARS:
        return ProcessDetails(pid, problem="answer of %d characters, over the %d limit" % (len(text), MAX_ANSWER_CHARS))
    try:
        data = json.loads(text.strip().splitlines()[-1] if text.strip() else "")
    except (ValueError, IndexError, RecursionError):
        return ProcessDetails(pid, problem="the node's answer is not JSON")
    if not isinstance(data, dict):
        return ProcessDetails(pid, problem="the node's answer is not an object")
    raw_errors = data.get("errors") if isinstance(data.get("errors"), dict) else {}
    errors = tuple((str(part)[:40], str(why)[:200]) for part, why in list(raw_errors.items())[:10])
    if data.get("pid") != pid:
        return ProcessDetails(pid, errors=errors, problem="the node answered for another pid")
    env = data.get("rank_env") if isinstance(data.get("rank_env"), dict) else {}
    rank_env = tuple(
        (name, env[name][: proc_details.VALUE_CHARS])
        for name in proc_details.RANK_VARIABLES
        if isinstance(env.get(name), str)
    )
    starttime = data.get("starttime")
    state = data.get("state")
    cwd = data.get("cwd")
    return ProcessDetails(
        pid=pid,
        args=_strings(data.get("args"), proc_details.MAX_ARGS, proc_details.ARG_CHARS),
        args_cut=data.get("args_cut") is True,
        rank_env=rank_env,
        cgroup=_strings(data.get("cgroup"), proc_details.MAX_CGROUP_LINES, proc_details.CGROUP_LINE_CHARS),
        cwd=cwd[: proc_details.ARG_CHARS] if isinstance(cwd, str) else None,
        state=state[:2] if isinstance(state, str) else None,
        starttime=starttime if type(starttime) is int and starttime >= 0 else None,
        errors=errors,
        problem="gone: /proc has no such process" if "stat" in raw_errors else None,
    )


def reader_argv(python: str, pid: int) -> list:
    """The command that runs the reader on a node with `python` (its config's interpreter)."""
    return shlex.split(python) + ["-I", "-c", inspect.getsource(proc_details), str(int(pid))]


async def fetch_process_details(link: Any, pid: int, timeout: float = DETAILS_TIMEOUT_S) -> ProcessDetails:
    """The details of `pid` on the node of `link`, read there; a node that cannot be asked gives a `problem`."""
    if link is None:
        return ProcessDetails(pid, problem="no connection to the node")
    if is_replayed(link):
        return ProcessDetails(pid, problem="a replayed node: its pids are not this machine's, nothing read")
    channel = command_channel(link)
    if channel == COMMANDS_HERE:
        try:
            data = await asyncio.wait_for(asyncio.to_thread(proc_details.read_details, int(pid)), timeout)
        except asyncio.TimeoutError:
            return ProcessDetails(pid, problem="reading /proc took over %g s" % timeout)
        return details_from_answer(pid, json.dumps(data))
    from opsconsole.nodes.trust import ssh_link_of

    remote = ssh_link_of(link)
    if remote is None:
        return ProcessDetails(pid, problem="no command channel to the node")
    from opsconsole.nodes.ssh import LinkError

    python = getattr(getattr(remote, "node", None), "python", None) or "python3"
    try:
        status, stdout, stderr = await remote.run_command(reader_argv(python, pid), timeout=timeout)
    except LinkError as err:
        return ProcessDetails(pid, problem=err.reason)
    except ValueError as exc:
        return ProcessDetails(pid, problem=str(exc))
    if status != 0 and not stdout.strip():
        last = (stderr.strip().splitlines() or ["exit status %s" % status])[-1]
        return ProcessDetails(pid, problem="the reader failed: %s" % last[:200])
    return details_from_answer(pid, stdout)
