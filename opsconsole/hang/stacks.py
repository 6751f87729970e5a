"""Stacks of every rank: run probe/rank_stacks.py on each node (all at once), read, group, explain.

Each node's helper runs over the node's own link: an exec channel on its SSH connection (under the
connection's channel limit), or a subprocess of this machine for the local node. Its output is read
in chunks through a LineSplitter, so neither a line nor a node's whole answer can grow without
bound, and each answer line is checked field by field before anything of it is kept. Every node
has its own deadline; a node that is down, slow or silent becomes an error line, and the others'
stacks still come.

The report is what both the console's stacks screen and `opsconsole stacks --json` show.
"""

from __future__ import annotations

import asyncio
import codecs
import inspect
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from opsconsole.hang.grouping import (
    Group,
    Member,
    RankId,
    group_line,
    group_stacks,
    odd_ranks,
    several_jobs,
    summary,
    verdict,
)
from opsconsole.hang.pyspy import Frame, ThreadStack, main_thread, parse_dump
from opsconsole.nodes.base import COMMANDS_HERE, COMMANDS_SSH, command_channel, is_replayed
from opsconsole.nodes.line_split import LineSplitter
from opsconsole.sanitize import printable_line

DEFAULT_DUMP_TIMEOUT_S = 10.0  # per process, on the node
NODE_SLACK_S = 20.0  # a node's whole answer: connecting, starting Python, the dumps in waves of 16
MAX_ANSWER_LINE_CHARS = 8 * 1024 * 1024  # one rank's line: 2 MiB of py-spy JSON, escaped once more
MAX_NODE_ANSWER_CHARS = 64 * 1024 * 1024
MAX_RANKS_PER_NODE = 4096
MAX_NOTE_CHARS = 300
MAX_JOB_CHARS = 120
READ_CHUNK = 256 * 1024
EXIT_GRACE_S = 5.0  # a local helper whose output ended, to exit before it is killed
RANK_STATUSES = ("ok", "failed", "timeout", "gone", "no-py-spy")

PY_SPY_FIX = "pip install py-spy on the node (into the training environment, or ~/.local/bin)"
PTRACE_FIX = (
    "allow ptrace: run as root or as the ranks' user with `sysctl kernel.yama.ptrace_scope=0` "
    "(1 lets only a parent trace); in a container add the SYS_PTRACE capability "
    "(docker run --cap-add SYS_PTRACE; Kubernetes securityContext.capabilities.add: [SYS_PTRACE])"
)


@dataclass(frozen=True)
class RankStack:
    """One rank's stack: where it runs, its rank (None without RANK), its threads, the main one's frames."""

    node: str
    pid: int
    rank: Optional[int]
    frames: Tuple[Frame, ...]
    threads: Tuple[ThreadStack, ...] = ()
    local_rank: Optional[int] = None
    cmd: str = ""
    dump_s: float = 0.0  # py-spy's own time for this process, on the node
    note: Optional[str] = None  # a problem with its dump that still left a stack
    job: Optional[str] = None  # which job (probe/rank_stacks.py job_of): ranks are compared within one

    @property
    def rank_id(self) -> RankId:
        return self.rank if self.rank is not None else "%s:%d" % (self.node, self.pid)

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "pid": self.pid,
            "rank": self.rank,
            "job": self.job,
            "frames": [f.to_json() for f in self.frames],
        }


@dataclass(frozen=True)
class StackError:
    """A node or process whose stack did not come, and why (with the fix where there is one)."""

    node: str
    reason: str
    pid: Optional[int] = None
    rank: Optional[int] = None

    def to_json(self) -> dict:
        return {"node": self.node, "pid": self.pid, "rank": self.rank, "reason": self.reason}


@dataclass(frozen=True)
class StacksReport:
    """Every rank's stack, the groups (odd first), the odd ranks, and what failed."""

    ranks: Tuple[RankStack, ...]
    groups: Tuple[Group, ...]
    errors: Tuple[StackError, ...]
    wall_s: float = 0.0
    node_s: Dict[str, float] = field(default_factory=dict)  # each node's helper time (on the node)

    @property
    def odd(self) -> List[RankId]:
        return odd_ranks(self.groups)

    @property
    def summary(self) -> str:
        return summary(self.groups)

    @property
    def verdict(self) -> Optional[str]:
        return verdict(self.groups)

    def rank_stack(self, rank: RankId) -> Optional[RankStack]:
        return next((r for r in self.ranks if r.rank_id == rank), None)

    def to_json(self) -> dict:
        return {
            "ranks": [r.to_json() for r in self.ranks],
            "groups": [
                {"ranks": list(g.ranks), "job": g.job, "frames": [f.to_json() for f in g.frames], "odd": g.odd}
                for g in self.groups
            ],
            "odd": self.odd,
            "errors": [e.to_json() for e in self.errors],
        }


def build_report(
    ranks: Sequence[RankStack],
    errors: Sequence[StackError],
    wall_s: float = 0.0,
    node_s: Optional[Dict[str, float]] = None,
) -> StacksReport:
    ordered = sorted(ranks, key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.node, r.pid))
    groups = group_stacks([Member(r.rank_id, r.node, r.pid, r.frames, r.job) for r in ordered])
    return StacksReport(tuple(ordered), tuple(groups), tuple(errors), wall_s, dict(node_s or {}))


# --- reading the helper's answers ------------------------------------------------------------


def _int(value: Any, low: int, high: int) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def _text(value: Any, limit: int) -> str:
    return printable_line(value[:limit]) if isinstance(value, str) else ""


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        return 0.0
    return float(value)


def why_dump_failed(answer: Mapping[str, Any], head: Mapping[str, Any], timeout: float) -> str:
    """A failed dump's reason for people, with the fix (py-spy missing, ptrace refused, a timeout)."""
    status = answer.get("status")
    raw = answer.get("stderr")
    stderr = raw[:4000] if isinstance(raw, str) else ""
    said = printable_line(py_spy_error(stderr))
    state = answer.get("state") if answer.get("state") in ("D", "T", "t", "Z") else None
    if status == "no-py-spy":
        looked = head.get("looked_in")
        places = ", ".join(_text(p, 200) for p in looked[:8]) if isinstance(looked, list) else "PATH"
        return "py-spy not found (looked in %s): %s" % (places, PY_SPY_FIX)
    if status == "timeout":
        return (
            "py-spy gave no stack within %g s%s (a process in uninterruptible I/O, state D, cannot be "
            "attached: cat /proc/PID/stack shows where the kernel holds it)"
            % (timeout, " and the process is in state D" if state == "D" else "")
        )
    if status == "gone" or state == "Z":
        return "the process exited before its stack was read"
    if state in ("T", "t"):
        return (
            "the process is stopped (state %s: SIGSTOP, ctrl-z or a debugger holds it), so py-spy cannot "
            "suspend it: kill -CONT it, or detach the debugger (py-spy said: %s)" % (state, said or "nothing")
        )
    lowered = stderr.lower()
    if "permission denied" in lowered or "operation not permitted" in lowered or "ptrace" in lowered:
        scope = _int(head.get("ptrace_scope"), 0, 3)
        facts = ["kernel.yama.ptrace_scope = %s" % ("not set (no Yama)" if scope is None else scope)]
        if _int(head.get("uid"), 0, 2**32) is not None:
            facts.append("uid %d" % head["uid"])
        if head.get("cap_sys_ptrace") is False:
            facts.append("no CAP_SYS_PTRACE")
        return "ptrace refused (%s): %s" % (", ".join(facts), PTRACE_FIX)
    if "failed to find python version" in lowered or "python interpreter" in lowered:
        return "not a Python process py-spy can read: %s" % (said or "py-spy failed")
    return "py-spy failed (exit %s): %s" % (answer.get("exit"), said or "no message")


def py_spy_error(stderr: str) -> str:
    """py-spy's error in one line: `Error: X` and its `Caused by` chain, without the backtrace."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(lines) if line.startswith("Error")), None)
    if start is None:
        return lines[-1] if lines else ""
    parts = [lines[start][len("Error") :].lstrip(": ").strip()]
    for line in lines[start + 1 :]:
        if line.startswith("Stack backtrace"):
            break
        if line.startswith("Caused by"):
            continue
        parts.append(line.split(": ", 1)[1] if line[:1].isdigit() and ": " in line else line)
    return ": ".join(part for part in parts if part)[:MAX_NOTE_CHARS]


def rank_of(
    node: str, answer: Mapping[str, Any], head: Mapping[str, Any], timeout: float
) -> Tuple[Optional[RankStack], Optional[StackError]]:
    """One `rank` answer line, checked: a RankStack, or a StackError saying why not."""
    pid = _int(answer.get("pid"), 1, 2**31)
    if pid is None:
        return None, StackError(node, "the node's helper sent a rank without a valid pid")
    rank = _int(answer.get("rank"), 0, 10**7)
    local_rank = _int(answer.get("local_rank"), 0, 10**7)
    status = answer.get("status")
    if status not in RANK_STATUSES:
        return None, StackError(node, "the node's helper sent an unknown status", pid, rank)
    if status != "ok":
        return None, StackError(node, why_dump_failed(answer, head, timeout), pid, rank)
    threads, problem = parse_dump(answer.get("stdout"))
    if answer.get("truncated") is True:
        problem = "py-spy's output was cut on the node" + ("; " + problem if problem else "")
    main = main_thread(threads, pid)
    if main is None:
        return None, StackError(node, problem or "no Python thread in the dump", pid, rank)
    return RankStack(
        node,
        pid,
        rank,
        main.frames,
        threads,
        local_rank,
        _text(answer.get("cmd"), 512),
        _number(answer.get("seconds")),
        problem,
        _text(answer.get("job"), MAX_JOB_CHARS) or None,
    ), None


class NodeAnswer:
    """One node's answer: its lines kept as they arrive (bounded), read and checked by `finish`.

    Reading (JSON of up to MAX_ANSWER_LINE_CHARS a line, py-spy's dumps inside) is left to `finish`,
    which the caller runs in a worker thread: the event loop only moves bytes.
    """

    def __init__(self, node: str, timeout: float) -> None:
        self.node = node
        self.timeout = timeout
        self.lines: List[str] = []
        self.head: Dict[str, Any] = {}
        self.ranks: List[RankStack] = []
        self.errors: List[StackError] = []
        self.done_s: Optional[float] = None
        self.noise: List[str] = []
        self._seen: set = set()

    def on_line(self, line: str) -> None:
        if len(self.lines) <= MAX_RANKS_PER_NODE + 2:
            self.lines.append(line)

    def on_too_long(self, length: int) -> None:
        self.errors.append(
            StackError(
                self.node, "an answer line of %d characters was dropped (over %d)" % (length, MAX_ANSWER_LINE_CHARS)
            )
        )

    def _read(self, line: str) -> None:
        try:
            answer = json.loads(line) if line.lstrip().startswith("{") else None
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict):
            if line.strip() and len(self.noise) < 5:
                self.noise.append(_text(line.strip(), MAX_NOTE_CHARS))
            return
        kind = answer.get("kind")
        if kind == "node" and not self.head:
            self.head = answer
        elif kind == "rank" and self.head:
            pid = answer.get("pid")
            if isinstance(pid, int) and pid in self._seen:
                return  # a process once: a second line for it (a hostile node) is not a second rank
            self._seen.add(pid)
            stack, error = rank_of(self.node, answer, self.head, self.timeout)
            if stack is not None:
                self.ranks.append(stack)
            if error is not None:
                self.errors.append(error)
        elif kind == "done":
            self.done_s = _number(answer.get("seconds"))

    def finish(self, failure: Optional[str] = None) -> "NodeAnswer":
        """Read the lines; turn what did not come into errors (the node's failure, no answer, no ranks)."""
        lines, self.lines = self.lines, []
        for line in lines:
            self._read(line)
        if len(lines) > MAX_RANKS_PER_NODE + 2:
            self.errors.append(StackError(self.node, "more than %d processes: the rest left out" % MAX_RANKS_PER_NODE))
        if failure:
            self.errors.append(StackError(self.node, failure))
        elif not self.head:
            said = "; ".join(self.noise) or "no output"
            self.errors.append(StackError(self.node, "the stack helper did not answer: %s" % said))
        elif self.done_s is None:
            self.errors.append(StackError(self.node, "the stack helper stopped before it was done"))
        if self.head and _int(self.head.get("ranks"), 0, 10**6) == 0 and not failure:
            self.errors.append(
                StackError(
                    self.node,
                    "no training ranks found (no process with RANK or LOCAL_RANK "
                    "in its environment, no GPU compute process)",
                )
            )
        return self


# --- running the helper ----------------------------------------------------------------------


def helper_argv(python: str) -> List[str]:
    from opsconsole.probe import rank_stacks

    # -I: the node's PYTHON* variables and user site-packages cannot change what runs; -S: no site at
    # all (the helper is stdlib only, and a site with many .pth files costs tens of ms a start).
    return shlex.split(python) + ["-I", "-S", "-u", "-c", inspect.getsource(rank_stacks)]


def request_line(
    pids: Optional[Sequence[int]], native: bool, timeout: float, gpu_pids: Optional[Sequence[int]] = None
) -> str:
    return (
        json.dumps(
            {
                "pids": list(pids) if pids else None,
                "native": bool(native),
                "timeout": timeout,
                "gpu_pids": list(gpu_pids) if gpu_pids else None,
            }
        )
        + "\n"
    )


async def _pump(read: Callable[[], Any], answer: NodeAnswer, decode: Callable[[Any], str]) -> None:
    splitter = LineSplitter(answer.on_line, answer.on_too_long, MAX_ANSWER_LINE_CHARS)
    total = 0
    while True:
        chunk = await read()
        if not chunk:
            break
        text = decode(chunk)
        total += len(text)
        if total > MAX_NODE_ANSWER_CHARS:
            answer.errors.append(
                StackError(answer.node, "the node's answer went past %d characters: cut" % MAX_NODE_ANSWER_CHARS)
            )
            return
        splitter.feed(text)
    splitter.feed("\n")  # a last line without its newline


async def _run_over_ssh(link: Any, argv: List[str], request: str, answer: NodeAnswer) -> None:
    import asyncssh

    conn = await link.connection()
    async with link.channel_slot():
        # stderr merged: an unread stderr stalls stdout, and what it says explains a failure.
        process = await conn.create_process(
            shlex.join(argv), stderr=asyncssh.STDOUT, encoding="utf-8", errors="replace"
        )
        try:
            process.stdin.write(request)
            process.stdin.write_eof()
            await _pump(lambda: process.stdout.read(READ_CHUNK), answer, lambda text: text)
        finally:
            process.close()


async def _run_here(argv: List[str], request: str, answer: NodeAnswer) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    try:
        stdin, stdout = process.stdin, process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(request.encode())
        await stdin.drain()
        stdin.close()
        await _pump(lambda: stdout.read(READ_CHUNK), answer, decoder.decode)
        if stdout.at_eof():
            # Its output ended: it is exiting. Killed now, Popen.kill's poll could reap it before
            # asyncio's child watcher does, which then logs "Unknown child process ... 255".
            try:
                await asyncio.wait_for(process.wait(), EXIT_GRACE_S)
            except asyncio.TimeoutError:
                pass  # killed below
    finally:
        if process.returncode is None:
            try:
                process.kill()
            except ProcessLookupError:
                pass
        await process.wait()


def _describe(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    return printable_line(str(reason).splitlines()[0][:MAX_NOTE_CHARS]) if str(reason).strip() else type(exc).__name__


async def collect_node(
    name: str,
    link: Any,
    pids: Optional[Sequence[int]] = None,
    native: bool = False,
    timeout: float = DEFAULT_DUMP_TIMEOUT_S,
    gpu_pids: Optional[Sequence[int]] = None,
) -> NodeAnswer:
    """One node's ranks and stacks over its link; every failure ends up in the answer's errors.

    `gpu_pids`: the node's GPU compute processes as its last frame listed them, dumped when no
    process has a rank in its environment."""
    answer = NodeAnswer(name, timeout)
    channel = command_channel(link)
    if is_replayed(link) or channel not in (COMMANDS_HERE, COMMANDS_SSH):
        return answer.finish(
            "no command channel to the node (a replay or a metrics-only source): its processes cannot be read"
        )
    request = request_line(pids, native, timeout, gpu_pids)
    deadline = timeout * 3 + NODE_SLACK_S
    failure = None
    try:
        if channel == COMMANDS_HERE:
            coro = _run_here(helper_argv(shlex.quote(sys.executable)), request, answer)
        else:
            python = getattr(getattr(link, "node", None), "python", None) or "python3"
            coro = _run_over_ssh(link, helper_argv(python), request, answer)
        await asyncio.wait_for(coro, deadline)
    except asyncio.TimeoutError:
        failure = "no complete answer within %g s" % deadline
    except Exception as exc:  # a node's failure (LinkError, asyncssh, OS) is its error line, never the others'
        failure = "%s: %s" % ("unreachable" if type(exc).__name__ == "LinkError" else "failed", _describe(exc))
    # The reading (JSON, py-spy's dumps) in a thread: the event loop (the console's) only moved bytes.
    return await asyncio.to_thread(answer.finish, failure)


async def collect_stacks(
    links: Mapping[str, Any],
    pids: Optional[Mapping[str, Sequence[int]]] = None,
    native: bool = False,
    timeout: float = DEFAULT_DUMP_TIMEOUT_S,
    gpu_pids: Optional[Mapping[str, Sequence[int]]] = None,
) -> StacksReport:
    """Every node's rank stacks, all nodes at once, grouped. `pids` limits a node to those processes;
    `gpu_pids` are each node's GPU compute processes from its frame (used where no rank is found)."""
    started = time.monotonic()
    names = list(links)
    answers = await asyncio.gather(
        *(
            collect_node(name, links[name], (pids or {}).get(name), native, timeout, (gpu_pids or {}).get(name))
            for name in names
        )
    )
    ranks = [stack for answer in answers for stack in answer.ranks]
    errors = [error for answer in answers for error in answer.errors]
    node_s = {answer.node: answer.done_s for answer in answers if answer.done_s is not None}
    return build_report(ranks, errors, time.monotonic() - started, node_s)


# --- text -------------------------------------------------------------------------------------


def frame_line(frame: Frame) -> str:
    return (
        "%s (%s:%d)" % (frame.function, frame.file, frame.line)
        if frame.line
        else "%s (%s)" % (frame.function, frame.file)
    )


def report_text(report: StacksReport) -> str:
    """The headless table: the verdict, each group with its stack, then the errors."""
    lines: List[str] = []
    with_job = several_jobs(report.groups)
    if report.ranks:
        lines.append(
            "%d rank(s) on %d node(s): %d group(s)%s"
            % (
                len(report.ranks),
                len({r.node for r in report.ranks}),
                len(report.groups),
                " in %d jobs" % len({g.job for g in report.groups}) if with_job else "",
            )
        )
        if report.verdict:
            lines.append("odd: " + report.verdict)
    for group in report.groups:
        lines.append("")
        lines.append(("ODD  " if group.odd else "     ") + group_line(group, with_job))
        for frame in group.frames[:12]:
            lines.append("       " + frame_line(frame))
        if len(group.frames) > 12:
            lines.append("       ... %d more frame(s)" % (len(group.frames) - 12))
    if report.errors:
        if lines:  # a blank line between the groups and the errors, none above errors alone
            lines.append("")
        for error in report.errors:
            who = (
                error.node
                + ("" if error.pid is None else " pid %d" % error.pid)
                + ("" if error.rank is None else " (rank %d)" % error.rank)
            )
            lines.append("error %s: %s" % (who, error.reason))
    if not report.ranks and not report.errors:
        lines.append("no nodes")
    return "\n".join(printable_line(line) for line in lines) + "\n"
