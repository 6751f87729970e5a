"""Running an action's command, locally or over the node's SSH connection, audited before and after.

Commands are argv lists, never shell lines: locally they go to `create_subprocess_exec`;
remotely `SshLink.run_command` quotes each word with shlex. Before anything runs, the
attempt record (time, user, node, action, target, command) is appended and fsynced; if
it cannot be written, the action is not done. The result record (exit status, output
tails, duration) follows, under the same id. A crash in between leaves the attempt.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, Optional, Sequence

from opsconsole.actions.audit import (
    OUTCOME_ATTEMPT,
    OUTCOME_FAILED,
    OUTCOME_OK,
    OUTCOME_REFUSED,
    AuditLog,
    new_entry_id,
)
from opsconsole.audit_outcomes import Outcome

OUTPUT_KEPT_CHARS = 4000  # of stdout and of stderr, in the result and its audit record
KILL_WAIT_S = 2.0  # after SIGKILL of a timed-out local command's process group


@dataclass(frozen=True)
class CommandResult:
    """What running a command gave: exit status, output, or why it could not run."""

    exit_status: Optional[int]  # None when it did not run or gave none
    stdout: str = ""
    stderr: str = ""
    error: Optional[str] = None  # one line: not found, node unreachable, timed out ...
    duration_s: float = 0.0
    timed_out: bool = False
    refused: bool = False  # not done on purpose: the target is no longer the one planned (audited as refused)
    # What a node-side step answered besides its output (the signal step: what it checked and saw).
    answer: Optional[Dict[str, Any]] = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_status == 0

    def summary(self) -> str:
        """One line: `exit 0`, `exit 3: <last line of stderr>`, or the error."""
        if self.error is not None:
            return self.error
        last = _last_line(self.stderr) or _last_line(self.stdout)
        text = "exit %s" % self.exit_status
        return "%s: %s" % (text, last) if last and self.exit_status != 0 else text

    def to_record(self) -> Dict[str, Any]:
        """The audit record's `result` object."""
        return {
            "exit_status": self.exit_status,
            "error": self.error,
            "timed_out": self.timed_out,
            "refused": self.refused,
            "duration_s": round(self.duration_s, 3),
            "stdout": _tail(self.stdout),
            "stderr": _tail(self.stderr),
            **({"answer": self.answer} if self.answer is not None else {}),
        }


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def _tail(text: str) -> str:
    text = text or ""
    return text if len(text) <= OUTPUT_KEPT_CHARS else "..." + text[-OUTPUT_KEPT_CHARS:]


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


async def run_local(argv: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None) -> CommandResult:
    """Run argv on this machine (no shell), output captured; stopped with its children after `timeout`."""
    words = [str(word) for word in argv]
    if not words:
        return CommandResult(None, error="empty command")
    started = time.monotonic()
    try:
        process = await asyncio.create_subprocess_exec(
            *words,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group: a timeout stops its children too
        )
    except FileNotFoundError:
        return CommandResult(None, error="command not found: %s" % words[0])
    except PermissionError:
        return CommandResult(None, error="not executable: %s" % words[0])
    except OSError as exc:
        return CommandResult(None, error="cannot run %s: %s" % (words[0], exc.strerror or exc))
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
    except asyncio.TimeoutError:
        _kill_group(process.pid)
        try:
            await asyncio.wait_for(process.wait(), KILL_WAIT_S)
        except asyncio.TimeoutError:
            pass
        return CommandResult(
            None,
            error="timed out after %g s (stopped)" % timeout,
            duration_s=time.monotonic() - started,
            timed_out=True,
        )
    except asyncio.CancelledError:
        _kill_group(process.pid)
        raise
    return CommandResult(
        process.returncode,
        stdout.decode("utf-8", "replace"),
        stderr.decode("utf-8", "replace"),
        duration_s=time.monotonic() - started,
    )


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


async def run_remote(link: Any, argv: Sequence[str], timeout: float, input: Optional[str] = None) -> CommandResult:
    """Run argv on the node over its SSH connection (`SshLink.run_command`, words shlex-quoted), `input` on stdin."""
    from opsconsole.nodes.ssh_connection import LinkError  # an SshLink exists, so asyncssh is loaded already

    started = time.monotonic()
    try:
        status, stdout, stderr = await link.run_command([str(word) for word in argv], timeout=timeout, input=input)
    except LinkError as err:
        timed_out = "timed out" in err.reason
        return CommandResult(
            None, error="%s: %s" % (link.name, err.reason), duration_s=time.monotonic() - started, timed_out=timed_out
        )
    except ValueError as exc:
        return CommandResult(None, error=str(exc))
    return CommandResult(status, stdout, stderr, duration_s=time.monotonic() - started)


def remote_link(link: Any) -> Optional[Any]:
    """The link if commands go over SSH (an SshLink), None when the node is this machine."""
    from opsconsole.nodes.trust import ssh_link_of

    return ssh_link_of(link)


def no_command_channel(link: Any) -> Optional[str]:
    """Why no command may run for the node of `link` (a replay, a metrics view), None when one may."""
    from opsconsole.nodes.base import COMMANDS_HERE, command_channel, is_replayed

    if is_replayed(link):
        return "%s is a replay of a recording: its PIDs and files are not this machine's" % getattr(
            link, "name", "node"
        )
    channel = command_channel(link)
    if channel is None:
        return "no command channel to %s (not a live node of this console)" % getattr(link, "name", "the node")
    if channel != COMMANDS_HERE and remote_link(link) is None:
        return "%s: commands go over %s, which this console cannot reach" % (getattr(link, "name", "node"), channel)
    return None


async def run_on_node(link: Any, argv: Sequence[str], timeout: float) -> CommandResult:
    """Run argv where the node is: over SSH for an SshLink, here for the local node; nowhere else."""
    why = no_command_channel(link)
    if why:
        return CommandResult(None, error=why)
    remote = remote_link(link)
    if remote is not None:
        return await run_remote(remote, argv, timeout)
    return await run_local(argv, timeout)


@dataclass(frozen=True)
class ActionOutcome:
    """An action carried out (or not): its result, and any audit problem to show."""

    ran: bool  # False: not started, because the attempt could not be audited
    result: Optional[CommandResult]
    entry_id: str
    audit_problem: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.ran and self.result is not None and self.result.ok

    def summary(self) -> str:
        if not self.ran:
            return "not done: %s" % (self.audit_problem or "the audit log could not be written")
        assert self.result is not None
        return self.result.summary()


Executor = Callable[[], Awaitable[CommandResult]]


class ActionRunner:
    """Runs executors between an fsynced attempt record and a result record (see the module docstring)."""

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit

    async def run(
        self,
        action: str,
        node: str,
        target: str,
        command: Sequence[str],
        execute: Executor,
        detail: str = "",
    ) -> ActionOutcome:
        """Audit the attempt, run `execute`, audit the result; the attempt failing to write stops it."""
        entry_id = new_entry_id()
        command = [str(word) for word in command]
        problem = self.audit.write(
            action, node, detail or "about to run", OUTCOME_ATTEMPT, target=target, command=command, entry_id=entry_id
        )
        if problem:
            return ActionOutcome(False, None, entry_id, problem)
        try:
            result = await execute()
        except asyncio.CancelledError:
            self.audit.write(
                action,
                node,
                "interrupted: the console stopped waiting",
                OUTCOME_FAILED,
                target=target,
                command=command,
                entry_id=entry_id,
            )
            raise
        except Exception as exc:  # an executor bug is an outcome too, not a crash of the console
            result = CommandResult(None, error=_describe(exc))
        outcome: Outcome = OUTCOME_OK if result.ok else OUTCOME_REFUSED if result.refused else OUTCOME_FAILED
        problem = self.audit.write(
            action,
            node,
            result.summary(),
            outcome,
            target=target,
            command=command,
            entry_id=entry_id,
            result=result.to_record(),
        )
        return ActionOutcome(True, result, entry_id, problem)

    def note(
        self, action: str, node: str, target: str, command: Sequence[str], outcome: Outcome, detail: str
    ) -> Optional[str]:
        """Record an action that did not run (cancelled, refused); None when written, else why not."""
        return self.audit.write(
            action, node, detail, outcome, target=target, command=list(command), entry_id=new_entry_id()
        )
