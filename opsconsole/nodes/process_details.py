"""Ask a node for one process's details (probe/proc_details.py) and check what comes back.

The reader runs where the node is: in a thread for the local node, as `python3 -I - PID
START_TIME` (a small bundle on stdin) over the node's own SSH connection for a remote one;
never for a replayed node (its pids are not this machine's). The answer is hostile input:
bounded and type-checked field by field.

A PID names the listed process only while it lives. Given the start time the frame said, the
reader compares it with the node's own (on the node, before reading anything else) and a later
owner of the PID is reported as MOVED, without its command line or environment; the console
compares again what comes back.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from opsconsole.nodes.base import COMMANDS_HERE, command_channel, is_replayed
from opsconsole.nodes.bundle import helper_bundle
from opsconsole.probe import proc_details
from opsconsole.probe.proc_read import START_SLACK_S

MAX_ANSWER_CHARS = 1 << 20  # the reader prints well under this (64 KiB of arguments, a few variables)
DETAILS_TIMEOUT_S = 10.0
MOVED = "this process has exited (pid now belongs to another)"


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
    start_time: Optional[float] = None  # the same as epoch seconds on the node's clock
    errors: Tuple[Tuple[str, str], ...] = ()  # (part, why) for the parts that could not be read
    problem: Optional[str] = None


def _strings(value: Any, limit: int, chars: int) -> Tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(item[:chars] for item in value[:limit] if isinstance(item, str))


def _moved(start_time: Optional[float], expected_start: Optional[float], slack_s: float) -> bool:
    return expected_start is not None and (start_time is None or abs(start_time - expected_start) > slack_s)


def details_from_answer(
    pid: int, text: str, expected_start: Optional[float] = None, start_slack: float = START_SLACK_S
) -> ProcessDetails:
    """Check the reader's JSON line; anything malformed is a `problem`, never an exception.

    With `expected_start`, an answer for a process that started at another time is MOVED (nothing of it kept).
    """
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
    starttime = data.get("starttime")
    starttime = starttime if type(starttime) is int and starttime >= 0 else None
    raw_start = data.get("start_time")
    start_time = float(raw_start) if isinstance(raw_start, (int, float)) and not isinstance(raw_start, bool) else None
    if start_time is not None and start_time != start_time:  # NaN
        start_time = None
    if "stat" in raw_errors:
        return ProcessDetails(pid, errors=errors, problem="gone: /proc has no such process")
    if data.get("moved") is True or _moved(start_time, expected_start, start_slack):
        return ProcessDetails(pid, starttime=starttime, start_time=start_time, problem=MOVED)
    env = data.get("rank_env") if isinstance(data.get("rank_env"), dict) else {}
    rank_env = tuple(
        (name, env[name][: proc_details.VALUE_CHARS])
        for name in proc_details.RANK_VARIABLES
        if isinstance(env.get(name), str)
    )
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
        starttime=starttime,
        start_time=start_time,
        errors=errors,
    )


def reader_argv(
    python: str, pid: int, expected_start: Optional[float] = None, start_slack: float = START_SLACK_S
) -> List[str]:
    """The command that runs the reader on a node with `python` (its config's interpreter); its bundle goes on stdin."""
    argv = shlex.split(python) + ["-I", "-", str(int(pid))]
    return argv + (["%.2f" % expected_start, "%.3f" % start_slack] if expected_start is not None else [])


def reader_bundle() -> str:
    return helper_bundle("proc_details", "proc_read")


async def fetch_process_details(
    link: Any,
    pid: int,
    timeout: float = DETAILS_TIMEOUT_S,
    expected_start: Optional[float] = None,
    start_slack: float = START_SLACK_S,
) -> ProcessDetails:
    """The details of `pid` on the node of `link`, read there; a node that cannot be asked gives a `problem`.

    `expected_start`: the start time (epoch s) the frame said; a process that started more than
    `start_slack` s away from it is MOVED (a GPU row's start is an estimate: actions.signals.identity_in_frame).
    """
    if link is None:
        return ProcessDetails(pid, problem="no connection to the node")
    if is_replayed(link):
        return ProcessDetails(pid, problem="a replayed node: its pids are not this machine's, nothing read")
    channel = command_channel(link)
    if channel == COMMANDS_HERE:
        try:
            data = await asyncio.wait_for(
                asyncio.to_thread(proc_details.read_details, int(pid), "/proc", expected_start, start_slack), timeout
            )
        except asyncio.TimeoutError:
            return ProcessDetails(pid, problem="reading /proc took over %g s" % timeout)
        return details_from_answer(pid, json.dumps(data), expected_start, start_slack)
    from opsconsole.nodes.trust import ssh_link_of

    remote = ssh_link_of(link)
    if remote is None:
        return ProcessDetails(pid, problem="no command channel to the node")
    from opsconsole.nodes.ssh_connection import LinkError

    python = getattr(getattr(remote, "node", None), "python", None) or "python3"
    try:
        status, stdout, stderr = await remote.run_command(
            reader_argv(python, pid, expected_start, start_slack), timeout=timeout, input=reader_bundle()
        )
    except LinkError as err:
        return ProcessDetails(pid, problem=err.reason)
    except ValueError as exc:
        return ProcessDetails(pid, problem=str(exc))
    if status != 0 and not stdout.strip():
        last = (stderr.strip().splitlines() or ["exit status %s" % status])[-1]
        return ProcessDetails(pid, problem="the reader failed: %s" % last[:200])
    return details_from_answer(pid, stdout, expected_start, start_slack)
