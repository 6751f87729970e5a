"""The details of one process (`enter` in the Processes pane): what the frame says at once, what the node says after.

The frame gives user, state, CPU, memory, threads, start, parent, its GPUs (and, where the
probe reports them, its Slurm job and container). The node is then asked (in a worker,
nodes.process_details) for the whole command line, the rank variables of its environment,
its cgroup and working directory. Everything shown passes through sanitize: a command line
or cgroup path with escapes shows them as visible pictures.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from opsconsole.actions.signals import identity_in_frame
from opsconsole.model import NodeFrame, ProcessSample
from opsconsole.nodes.process_details import ProcessDetails, fetch_process_details
from opsconsole.probe.proc_read import START_SLACK_S
from opsconsole.sanitize import printable_line
from opsconsole.units import NA, format_bytes, format_duration, format_percent

LABEL_WIDTH = 14
# Fields the probe may carry for a GPU process's job (see probe/jobs.py), shown when set.
JOB_FIELDS = (("job_id", "Slurm job"), ("job_step", "Job step"), ("job_user", "Job user"), ("container", "Container"))


def _row(text: Text, label: str, value: str, style: str = "") -> None:
    text.append(label.ljust(LABEL_WIDTH), style="bold")
    text.append(printable_line(value) + "\n", style=style)


def listed_process(pid: int, frame: Optional[NodeFrame]) -> Optional[ProcessSample]:
    """`pid` as the frame lists it: its host row, else its (first) GPU row."""
    if frame is None:
        return None
    return next((p for p in frame.top_processes + frame.processes if p.pid == pid), None)


def listed_start(pid: int, frame: Optional[NodeFrame]) -> Optional[float]:
    """When the listed process started (epoch s on the node's clock): its start time, else estimated from its age."""
    identity = None if frame is None else identity_in_frame(frame, pid)
    return None if identity is None else identity.start_time


def listed_start_slack(pid: int, frame: Optional[NodeFrame]) -> float:
    """How far the node's reading of the start may be from listed_start: a GPU row's age was sampled
    somewhere within the poll, so it widens with the poll (the signal actions' identity_in_frame)."""
    identity = None if frame is None else identity_in_frame(frame, pid)
    return START_SLACK_S if identity is None else identity.slack_s


def frame_text(node: str, pid: int, frame: Optional[NodeFrame]) -> Text:
    """What the last frame says of `pid`: the host sample, then one line per GPU it uses."""
    text = Text()
    _row(text, "Node", node)
    _row(text, "PID", str(pid))
    procs = [] if frame is None else [p for p in frame.top_processes if p.pid == pid]
    gpu_procs = [] if frame is None else [p for p in frame.processes if p.pid == pid]
    proc: Optional[ProcessSample] = (procs or gpu_procs or [None])[0]
    if proc is None or frame is None:
        _row(text, "", "not in the last frame: it may have exited", "yellow")
        return text
    # A GPU row's host readings are joined afresh each poll; the host list may be a few polls old
    # while no pane shows it (the console's host-process cadence): the live readings come from there.
    live = next((p for p in gpu_procs if p.state is not None), proc)
    _row(text, "Name", proc.name or NA)
    _row(text, "User", proc.user or NA)
    stuck = (live.state or "")[:1] in ("D", "Z")
    _row(text, "State", live.state or NA, "bold red" if stuck else "")
    _row(text, "Parent", NA if proc.ppid is None else str(proc.ppid))
    _row(text, "CPU", format_percent(live.cpu_percent))
    _row(text, "RSS", format_bytes(live.rss_bytes))
    _row(text, "Threads", NA if live.threads is None else str(live.threads))
    elapsed = proc.elapsed_at(frame.time)
    started = listed_start(pid, frame)
    when = NA if started is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    _row(text, "Started", "%s (%s ago)" % (when, format_duration(elapsed)))
    if proc.kernel_thread:
        _row(text, "Kind", "kernel thread")
    if gpu_procs:
        for gpu in gpu_procs:
            _row(
                text,
                "GPU %s" % (NA if gpu.gpu_index is None else gpu.gpu_index),
                "%s GPU memory, SM %s%s"
                % (
                    format_bytes(gpu.gpu_memory_bytes),
                    format_percent(gpu.gpu_sm_percent),
                    ", " + gpu.gpu_uuid if gpu.gpu_uuid else "",
                ),
            )
    else:
        _row(text, "GPUs", "none (no GPU compute context)")
    for name, label in JOB_FIELDS:
        value = next((getattr(p, name, None) for p in gpu_procs + procs if getattr(p, name, None)), None)
        if value:
            _row(text, label, str(value))
    return text


def details_text(details: Optional[ProcessDetails]) -> Text:
    """What the node said: command line, rank variables, cgroup, working directory (or why not)."""
    text = Text()
    if details is None:
        text.append("asking the node for the command line, environment and cgroup ...\n", style="dim")
        return text
    if details.problem:
        _row(text, "Node says", details.problem, "yellow")
    if details.args:
        text.append("Command line\n", style="bold")
        for arg in details.args:
            text.append("  " + printable_line(arg) + "\n")
        if details.args_cut:
            text.append("  … cut (longer than the reader takes)\n", style="dim")
    if details.rank_env:
        text.append("Rank variables\n", style="bold")
        for name, value in details.rank_env:
            text.append("  %s=%s\n" % (name, printable_line(value)))
    elif details.args and not any(part == "environ" for part, _ in details.errors):
        _row(text, "Rank vars", "none set (not a torchrun / Slurm / MPI rank)")
    if details.cgroup:
        text.append("Cgroup\n", style="bold")
        for line in details.cgroup:
            text.append("  " + printable_line(line) + "\n")
    if details.cwd:
        _row(text, "Directory", details.cwd)
    for part, why in details.errors:
        if part != "stat":
            _row(text, "Not read", "%s: %s" % (part, why), "dim")
    return text


class ProcessDetailsScreen(ModalScreen[None]):
    """A modal with one process's details; esc, enter or q closes it."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="details.close"),
        Binding("enter", "close", "Close", show=False),
        Binding("q", "close", "Close", show=False),
    ]

    DEFAULT_CSS = """
    ProcessDetailsScreen { align: center middle; }
    ProcessDetailsScreen > Vertical {
        width: 120; max-width: 95%; height: auto; max-height: 90%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    ProcessDetailsScreen #details-title { text-style: bold; height: auto; margin-bottom: 1; }
    ProcessDetailsScreen VerticalScroll { height: auto; max-height: 40; }
    ProcessDetailsScreen .details-part { height: auto; }
    ProcessDetailsScreen #details-hint { color: $text-muted; height: 1; }
    """

    def __init__(
        self,
        node: str,
        pid: int,
        frame: Optional[NodeFrame],
        link: Any,
        fetch: Callable[..., Any] = fetch_process_details,
    ) -> None:
        super().__init__()
        self.node, self.pid, self.frame, self.link, self.fetch = node, pid, frame, link, fetch
        self.details: Optional[ProcessDetails] = None
        self.frame_part = Static(frame_text(node, pid, frame), classes="details-part", id="details-frame")
        self.node_part = Static(details_text(None), classes="details-part", id="details-node")

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text("Process %d on %s" % (self.pid, printable_line(self.node))), id="details-title")
            with VerticalScroll():
                yield self.frame_part
                yield self.node_part
            yield Static("esc / enter closes", id="details-hint")

    def on_mount(self) -> None:
        self.ask_node()

    @work(exclusive=True, exit_on_error=False, group="process-details")
    async def ask_node(self) -> None:
        try:
            # With the listed process's start time: a later owner of the PID is not described as this one.
            details = await self.fetch(
                self.link,
                self.pid,
                expected_start=listed_start(self.pid, self.frame),
                start_slack=listed_start_slack(self.pid, self.frame),
            )
        except Exception as exc:  # a bug in the fetch must not take the console down
            details = ProcessDetails(self.pid, problem="%s: %s" % (type(exc).__name__, exc))
        self.details = details
        if self.is_attached:
            self.node_part.update(details_text(details))

    def action_close(self) -> None:
        self.dismiss(None)
