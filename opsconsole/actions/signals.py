"""Process signals: only to PIDs the node reported, delivered locally or by `kill` over SSH, verified by frames.

SIGINT first: a training script that catches it (the seed's GracefulKiller) saves a
checkpoint and exits; SIGTERM and SIGKILL follow only when the user confirms, after
`[actions] signal_escalation_s`. Whether the process went is read from the frames the
node sends after the signal, never assumed from `kill`'s exit status.

Over SSH the signal is a `kill -s SIG -- PID` command: `process.send_signal()` does
nothing for a root login (sshd: "session signalling requires privilege separation").
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, List, Optional, Tuple

from opsconsole.actions.runner import CommandResult, no_command_channel, remote_link, run_remote
from opsconsole.model import NodeFrame, NodeState, ProcessSample

SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "KILL": signal.SIGKILL}
ESCALATION = ("INT", "TERM", "KILL")
FRAME_POLL_S = 0.1
GONE_STATES = ("Z", "X")  # exited (a zombie waits for its parent) or dead


def signal_argv(signal_name: str, pid: int) -> List[str]:
    """`kill -s INT -- 421`: the command shown in the confirmation and run over SSH."""
    if signal_name not in SIGNALS:
        raise ValueError("unknown signal %r; use one of %s" % (signal_name, ", ".join(SIGNALS)))
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        raise ValueError("not a PID that can be signalled: %r" % (pid,))
    return ["kill", "-s", signal_name, "--", str(pid)]


def reported_process(frame: Optional[NodeFrame], pid: int) -> Optional[ProcessSample]:
    """The process `pid` as `frame` reported it (GPU compute or top host process), None if it did not."""
    if frame is None:
        return None
    for proc in frame.processes + frame.top_processes:
        if proc.pid == pid:
            return proc
    return None


def refuse_signal(state: Optional[NodeState], pid: Any, local: bool) -> Optional[str]:
    """Why `pid` on this node must not be signalled, None when it may (see the module docstring)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1:
        return "not a PID that can be signalled: %r" % (pid,)
    if state is None or state.frame is None:
        return "no frame from %s yet: it has reported no processes to signal" % (state.name if state else "the node")
    if not state.is_live:
        # The last frame may be minutes old: its PIDs may belong to other processes by now.
        return "%s is %s: its last frame is not current, PID %d not signalled" % (state.name, state.state, pid)
    proc = reported_process(state.frame, pid)
    if proc is None or (proc.state or "")[:1] in GONE_STATES:
        return "PID %d is not a live process in %s's latest frame: not signalled" % (pid, state.name)
    if local and pid == os.getpid():
        return "PID %d is this console" % pid
    if local:
        moved = _local_identity_changed(proc)
        if moved:
            return moved
    return None


def _local_identity_changed(proc: ProcessSample) -> Optional[str]:
    """On this machine: refuse when the PID now runs another program than the frame said (PID reuse)."""
    if not proc.name:
        return None
    try:
        with open("/proc/%d/stat" % proc.pid, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None  # gone already: kill will say so, and the next frame shows it
    except OSError:
        return None
    comm = data[data.find(b"(") + 1 : data.rfind(b")")].decode("utf-8", "replace")
    # /proc comm is cut at 15 characters; the probe reports the same field.
    if comm and not proc.name.startswith(comm[:15]) and not comm.startswith(proc.name[:15]):
        return "PID %d is now %r, not %r as reported: not signalled" % (proc.pid, comm, proc.name)
    return None


async def deliver_signal(signal_name: str, pid: int, link: Any, timeout: float) -> CommandResult:
    """Send the signal: os.kill here, `kill -s SIG -- PID` over the node's SSH connection there."""
    argv = signal_argv(signal_name, pid)
    why = no_command_channel(link)
    if why:  # the registry refuses first; this is the last guard before os.kill
        return CommandResult(None, error=why)
    remote = remote_link(link)
    if remote is not None:
        return await run_remote(remote, argv, timeout)
    started = time.monotonic()
    try:
        os.kill(pid, SIGNALS[signal_name])
    except ProcessLookupError:
        return CommandResult(1, error="no such process: %d" % pid)
    except PermissionError:
        return CommandResult(1, error="not permitted to signal PID %d" % pid)
    return CommandResult(0, duration_s=time.monotonic() - started)


@dataclass(frozen=True)
class ProcessVerdict:
    """What the frames after a signal said about the process."""

    gone: bool
    text: str  # "gone from the frame of 18:40:12", "still running (state S) ..."
    frame_seen: bool  # False: no frame arrived after the signal at all


def verdict_of(frame: NodeFrame, pid: int) -> ProcessVerdict:
    proc = reported_process(frame, pid)
    stamp = time.strftime("%H:%M:%S", time.localtime(frame.time))
    if proc is None:
        return ProcessVerdict(True, "PID %d gone from the frame of %s" % (pid, stamp), True)
    state = (proc.state or "")[:1]
    if not state or state in GONE_STATES:
        shown = {"Z": "exited (zombie, its parent has not reaped it)", "X": "dead"}.get(state, "not seen any more")
        return ProcessVerdict(True, "PID %d %s in the frame of %s" % (pid, shown, stamp), True)
    return ProcessVerdict(False, "PID %d still running (state %s) in the frame of %s" % (pid, state, stamp), True)


StateGetter = Callable[[], Optional[NodeState]]


async def watch_process(get_state: StateGetter, pid: int, after: float, timeout: float) -> ProcessVerdict:
    """Read frames received after `after` (epoch s) until the process is gone or `timeout` passes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, timeout)
    last: Optional[ProcessVerdict] = None
    while True:
        state = get_state()
        if (
            state is not None
            and state.frame is not None
            and state.received_at is not None
            and state.received_at > after
        ):
            last = verdict_of(state.frame, pid)
            if last.gone:
                return last
        if loop.time() >= deadline:
            break
        await asyncio.sleep(FRAME_POLL_S)
    if last is None:
        return ProcessVerdict(False, "no frame arrived within %g s of the signal: state unknown" % timeout, False)
    return last


@dataclass(frozen=True)
class EscalationStep:
    signal: str
    result: CommandResult
    verdict: Optional[ProcessVerdict]  # None when the signal could not be sent


Send = Callable[[str], Awaitable[Tuple[CommandResult, float]]]  # signal -> (result, epoch s when sent)
Watch = Callable[[float, float], Awaitable[ProcessVerdict]]  # (sent at, timeout) -> verdict
ConfirmNext = Callable[[str, ProcessVerdict], Awaitable[bool]]  # (next signal, verdict) -> go on?


async def escalate(
    send: Send, watch: Watch, confirm_next: ConfirmNext, wait_s: float, last_wait_s: float
) -> List[EscalationStep]:
    """SIGINT; still there after `wait_s` and the user agrees: SIGTERM; again: SIGKILL. Stops when it is gone."""
    steps: List[EscalationStep] = []
    for position, name in enumerate(ESCALATION):
        result, sent_at = await send(name)
        if not result.ok:
            steps.append(EscalationStep(name, result, None))
            break
        last = position == len(ESCALATION) - 1
        verdict = await watch(sent_at, last_wait_s if last else wait_s)
        steps.append(EscalationStep(name, result, verdict))
        if verdict.gone or last:
            break
        if not await confirm_next(ESCALATION[position + 1], verdict):
            break
    return steps
