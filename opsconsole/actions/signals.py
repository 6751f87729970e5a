"""Process signals: only to PIDs the node reported, and only while each is still the process reported.

SIGINT first: a training script that catches it (the seed's GracefulKiller) saves a
checkpoint and exits; SIGTERM and SIGKILL follow only when the user confirms, after
`[actions] signal_escalation_s`. Whether the process went is read from the frames the
node sends after the signal, never assumed from the signal's exit status.

A PID names a process only while it lives: the kernel hands it to another one after it exits.
So the plan keeps what the frame said of the process (start time, command name, user:
ProcessIdentity) and every signal is sent by probe/checked_signal.py where the process is,
which compares that with /proc right before the signal (through a pidfd where the node has
them) and refuses a PID that now belongs to another process. On this machine it runs in the
console's process; on a remote node as `python3 -I - REQUEST` with a small bundle on stdin
over the node's SSH connection (a plain `kill` would signal whatever holds the PID by then).
`kill -s SIG -- PID` stays what the confirmation and the audit log show: what is sent, to what.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from opsconsole.actions.runner import CommandResult, no_command_channel, remote_link, run_remote
from opsconsole.model import NodeFrame, NodeState, ProcessSample
from opsconsole.probe import checked_signal
from opsconsole.probe.proc_read import START_SLACK_S

SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "KILL": signal.SIGKILL}
ESCALATION = ("INT", "TERM", "KILL")
FRAME_POLL_S = 0.1
MAX_POLL_MS = 10000.0  # a frame claiming a longer poll widens the start-time slack no further
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


@dataclass(frozen=True)
class ProcessIdentity:
    """What a frame said of the process a plan signals: checked where it runs before every signal."""

    pid: int
    start_time: float  # epoch seconds on the node's clock, as the probe reported it
    name: str = ""  # the command name (comm)
    user: Optional[str] = None
    slack_s: float = START_SLACK_S  # how far the node's reading of the start time may be from start_time

    def request(self, signal_name: str) -> Dict[str, Any]:
        """probe/checked_signal.py's request for SIG`signal_name` to this process."""
        return dict(self.expected(), pid=self.pid, signal=signal_name)

    def expected(self) -> Dict[str, Any]:
        """What checked_signal compares: start time (within the slack), command name, user."""
        return {"start_time": self.start_time, "slack": self.slack_s, "name": self.name or None, "user": self.user}

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.start_time))
        who = " of user %s" % self.user if self.user else ""
        return "PID %d must still be %r%s, started %s" % (self.pid, self.name or "?", who, started)


def identity_in_frame(frame: NodeFrame, pid: int) -> Optional[ProcessIdentity]:
    """The identity to check before signalling `pid` of `frame`; None when the frame says nothing of its start.

    A host row carries the start time the probe read. A GPU row carries the time it had run when the
    probe sampled it, some time within the poll (probe_ms) after the frame's time: the start is taken
    mid-poll and the slack widened by half the poll (and the 0.1 s the elapsed time is rounded to).
    """
    rows = [p for p in frame.top_processes + frame.processes if p.pid == pid]
    name = next((p.name for p in rows if p.name), "")
    user = next((p.user for p in rows if p.user), None)
    exact = next((p.start_time for p in rows if p.start_time is not None), None)
    if exact is not None:
        return ProcessIdentity(pid, float(exact), name, user)
    elapsed = next((p.elapsed_s for p in rows if p.elapsed_s is not None), None)
    if elapsed is None:
        return None
    half_poll = max(0.0, min(frame.probe_ms or 0.0, MAX_POLL_MS)) / 2000.0
    started = round(frame.time + half_poll - elapsed, 2)
    return ProcessIdentity(pid, started, name, user, round(START_SLACK_S + half_poll + 0.05, 3))


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
    identity = identity_in_frame(state.frame, pid)
    if identity is None:
        # A node read without the probe (nvidia-smi and /proc text) reports no start or elapsed times.
        return "%s's frame gives no start time for PID %d: it cannot be told from a later process, not signalled" % (
            state.name,
            pid,
        )
    if local:
        return local_identity_changed(identity)
    return None


def local_identity_changed(identity: ProcessIdentity) -> Optional[str]:
    """On this machine: why the PID no longer names the process the frame reported, None while it does."""
    try:
        seen = checked_signal.identity_of(identity.pid)
    except (OSError, ValueError, IndexError):
        return "PID %d has exited since the frame: not signalled" % identity.pid
    return checked_signal.why_different(identity.pid, identity.expected(), seen)


def result_of_answer(answer: Dict[str, Any], duration_s: float) -> CommandResult:
    """The CommandResult of checked_signal's answer: ok when signalled, `refused` when the PID moved on."""
    if answer.get("signalled") is True:
        return CommandResult(checked_signal.EXIT_SIGNALLED, duration_s=duration_s, answer=answer)
    refused = answer.get("refused")
    if isinstance(refused, str):
        return CommandResult(
            checked_signal.EXIT_REFUSED, error=refused[:500], duration_s=duration_s, refused=True, answer=answer
        )
    error = answer.get("error")
    return CommandResult(
        checked_signal.EXIT_NOT_SIGNALLED,
        error=str(error)[:500] if error else "the signal step gave no outcome",
        duration_s=duration_s,
        answer=answer,
    )


def answer_in(stdout: str) -> Optional[Dict[str, Any]]:
    """checked_signal's answer: the last output line that is a JSON object, None without one."""
    for line in reversed(stdout.splitlines()[-20:]):
        line = line.strip()
        if line.startswith("{"):
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if isinstance(answer, dict):
                return answer
    return None


def checked_signal_argv(python: str, identity: ProcessIdentity, signal_name: str) -> List[str]:
    """The command that runs the signal step on a node (its bundle goes on stdin)."""
    return shlex.split(python) + ["-I", "-", json.dumps(identity.request(signal_name), separators=(",", ":"))]


async def _deliver_remote(remote: Any, identity: ProcessIdentity, signal_name: str, timeout: float) -> CommandResult:
    from opsconsole.nodes.bundle import helper_bundle

    python = getattr(getattr(remote, "node", None), "python", None) or "python3"
    argv = checked_signal_argv(python, identity, signal_name)
    result = await run_remote(remote, argv, timeout, input=helper_bundle("checked_signal", "proc_read"))
    if result.error is not None:
        return result
    answer = answer_in(result.stdout)
    if answer is None or "signalled" not in answer:
        last = (result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["no output"])[-1]
        return CommandResult(
            result.exit_status,
            result.stdout,
            result.stderr,
            error="the signal step on %s did not answer (exit %s): %s" % (remote.name, result.exit_status, last[:200]),
            duration_s=result.duration_s,
        )
    return result_of_answer(answer, result.duration_s)


async def deliver_signal(
    signal_name: str, pid: int, link: Any, timeout: float, identity: Optional[ProcessIdentity] = None
) -> CommandResult:
    """Send the signal where the node is, if `pid` is still the process `identity` describes (see above)."""
    signal_argv(signal_name, pid)  # the same checks of the name and the PID
    why = no_command_channel(link)
    if why:  # the registry refuses first; this is the last guard before the signal
        return CommandResult(None, error=why)
    if identity is None or identity.pid != pid:
        return CommandResult(
            None, error="no identity of PID %d to check before the signal: not signalled" % pid, refused=True
        )
    remote = remote_link(link)
    if remote is not None:
        return await _deliver_remote(remote, identity, signal_name, timeout)
    started = time.monotonic()
    answer = checked_signal.signal_checked(pid, signal_name, identity.expected())
    return result_of_answer(answer, time.monotonic() - started)


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
