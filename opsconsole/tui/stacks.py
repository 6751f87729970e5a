"""The stacks screen: every rank's Python stack (py-spy), grouped, the odd ones out first.

`S` on the Nodes (the highlighted node), Processes (the highlighted process) and Logs (every node)
panes opens it, as the hang finding says. The dump runs in a worker: the nodes' answers arrive as
bytes on the app's loop and are read in a thread (opsconsole.hang.stacks), so the console never
waits. It reads only, so a read-only console offers it too; each opening is written to the audit
log first (attempt, then result), as every action is. `enter` on a rank opens its whole stack (every
thread); `a` widens to every node, `g` dumps again, `esc` goes back.

Function and file names come from the nodes: they were made printable where they entered
(hang/pyspy.py) and are drawn as plain Text, never as markup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Static

from opsconsole.actions.audit import AuditLog, audit_path
from opsconsole.actions.runner import ActionRunner, CommandResult
from opsconsole.audit_outcomes import OUTCOME_REFUSED
from opsconsole.hang.grouping import job_name, several_jobs, where
from opsconsole.hang.stacks import DEFAULT_DUMP_TIMEOUT_S, RankStack, StacksReport, collect_stacks, frame_line
from opsconsole.nodes.base import is_replayed
from opsconsole.tui.formatting import printable

AUDIT_ACTION = "stacks"
ODD_STYLE = "bold red"


@dataclass(frozen=True)
class StacksScope:
    """Which ranks: every node (nodes None), some nodes, or one process (pid) of one node."""

    nodes: Optional[Tuple[str, ...]] = None
    pid: Optional[int] = None
    native: bool = False

    def describe(self) -> str:
        if self.pid is not None and self.nodes:
            return "pid %d on %s" % (self.pid, self.nodes[0])
        if self.nodes:
            return "node %s" % ", ".join(self.nodes)
        return "every node"

    def argv(self) -> List[str]:
        """The headless command that shows the same (what the audit log records)."""
        argv = ["opsconsole", "stacks"]
        for node in self.nodes or ():
            argv += ["--node", node]
        if self.pid is not None:
            argv += ["--pid", str(self.pid)]
        if self.native:
            argv.append("--native")
        return argv


def open_stacks(app: Any, nodes: Optional[Sequence[str]] = None, pid: Optional[int] = None) -> None:
    """Open the stacks screen for `nodes` (None: every node), or for one process of one node."""
    app.push_screen(StacksScreen(StacksScope(tuple(nodes) if nodes else None, pid)))


def _runner(app: Any) -> ActionRunner:
    flow = getattr(app, "action_flow", None)
    if flow is not None:
        return flow.runner()
    return ActionRunner(AuditLog(audit_path(app.config.actions)))


def gpu_processes(states: Dict[str, Any], names: Sequence[str]) -> Dict[str, List[int]]:
    """Each node's GPU compute processes as its latest frame lists them (the ranks when none has RANK)."""
    found: Dict[str, List[int]] = {}
    for name in names:
        frame = getattr(states.get(name), "frame", None)
        pids = [p.pid for p in getattr(frame, "processes", ()) or () if getattr(p, "gpu_index", None) is not None]
        if pids:
            found[name] = sorted(set(pids))
    return found


def replay_refusal(app: Any) -> Optional[str]:
    """Why stacks are not collected in this console: a replay's nodes are a recording's (its PIDs name
    no process here), so nothing is run (the refusal is audited, as every action's)."""
    if is_replayed(getattr(app, "fleet", None)):
        return "not run: the nodes are replayed from a recording; stacks are read from live processes only"
    return None


async def collect_audited(app: Any, scope: StacksScope) -> Tuple[Optional[StacksReport], Optional[str]]:
    """The report for `scope`, audited first; (None, why) when the audit record could not be written,
    or when the console replays a recording (refused and audited so, before anything is attempted)."""
    names = list(scope.nodes) if scope.nodes else list(app.fleet.states())
    refusal = replay_refusal(app)
    if refusal is not None:
        node = names[0] if len(names) == 1 else "%d nodes" % len(names)
        _runner(app).note(AUDIT_ACTION, node, scope.describe(), scope.argv(), OUTCOME_REFUSED, refusal)
        return None, refusal
    link_of = getattr(app, "_link_of", lambda name: None)
    links = {name: link_of(name) for name in names}
    pids = {names[0]: [scope.pid]} if scope.pid is not None and names else None
    gpu_pids = gpu_processes(app.fleet.states(), names)
    found: Dict[str, StacksReport] = {}

    async def execute() -> CommandResult:
        report = await collect_stacks(links, pids, scope.native, DEFAULT_DUMP_TIMEOUT_S, gpu_pids)
        found["report"] = report
        errors = "\n".join("%s: %s" % (e.node, e.reason) for e in report.errors)
        return CommandResult(
            0 if report.ranks else 1, stdout=report.verdict or report.summary, stderr=errors, duration_s=report.wall_s
        )

    node = names[0] if len(names) == 1 else "%d nodes" % len(names)
    outcome = await _runner(app).run(AUDIT_ACTION, node, scope.describe(), scope.argv(), execute)
    if not outcome.ran:
        return None, "not run: %s" % (outcome.audit_problem or "the audit log could not be written")
    return found.get("report"), None


class StacksScreen(Screen[None]):
    """Groups of identical stacks (odd ranks first), one row per rank; enter opens a rank's stack."""

    BINDINGS = [
        Binding("escape", "close", "Back", id="stacks.close"),
        Binding("q", "close", "Back", show=False),
        Binding("a", "every_node", "Every node", id="stacks.every_node"),
        Binding("g", "again", "Dump again", id="stacks.again"),
        Binding("n", "toggle_native", "Native frames", id="stacks.native"),
    ]

    DEFAULT_CSS = """
    StacksScreen { layout: vertical; }
    StacksScreen #stacks-title { text-style: bold; height: auto; padding: 0 1; }
    StacksScreen #stacks-verdict { height: auto; max-height: 8; padding: 0 1; }
    StacksScreen #stacks-table { height: 1fr; }
    StacksScreen #stacks-errors { height: auto; max-height: 10; padding: 0 1; color: $warning; }
    """

    def __init__(self, scope: StacksScope) -> None:
        super().__init__()
        self.scope = scope
        self.report: Optional[StacksReport] = None
        self.problem: Optional[str] = None
        self._row_ranks: Dict[str, RankStack] = {}

    def compose(self) -> ComposeResult:
        yield Static("", id="stacks-title")
        yield Static("", id="stacks-verdict")
        yield DataTable(cursor_type="row", zebra_stripes=True, id="stacks-table")
        yield Static("", id="stacks-errors")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#stacks-table", DataTable)
        table.add_column("", key="mark", width=4)
        table.add_column("Group", key="group", width=6)
        table.add_column("Rank", key="rank", width=8)
        table.add_column("Node", key="node", width=16)
        table.add_column("PID", key="pid", width=8)
        table.add_column("Where", key="where")
        table.focus()
        self.collect()

    # --- collecting -------------------------------------------------------------------------

    def collect(self) -> None:
        self.report, self.problem = None, None
        self.query_one("#stacks-title", Static).update(
            Text("Stacks of every rank: %s" % printable(self.scope.describe()))
        )
        self.query_one("#stacks-verdict", Static).update(Text("collecting: py-spy on each rank ...", style="italic"))
        self.run_worker(self._collect(), group="stacks", exclusive=True, exit_on_error=False)

    async def _collect(self) -> None:
        try:
            report, problem = await collect_audited(self.app, self.scope)
        except Exception as exc:  # a bug must show here, not take the console down
            report, problem = None, "failed: %s: %s" % (type(exc).__name__, exc)
        if self.is_attached:
            self.show(report, problem)

    def show(self, report: Optional[StacksReport], problem: Optional[str] = None) -> None:
        self.report, self.problem = report, problem
        verdict = self.query_one("#stacks-verdict", Static)
        errors = self.query_one("#stacks-errors", Static)
        table = self.query_one("#stacks-table", DataTable)
        table.clear()
        self._row_ranks = {}
        if report is None:
            verdict.update(Text(printable(problem or "no report"), style="bold red"))
            errors.update("")
            return
        verdict.update(verdict_text(report))
        by_process = {(r.node, r.pid): r for r in report.ranks}
        with_job = several_jobs(report.groups)
        for index, group in enumerate(report.groups, 1):
            place = where(group.frames)
            if with_job:  # rank numbers repeat across jobs: each row says whose rank it is
                place = "[%s] %s" % (job_name(group.job), place)
            for member in group.members:
                stack = by_process.get((member.node, member.pid))
                if stack is None:
                    continue
                key = "%s/%d" % (member.node, member.pid)
                self._row_ranks[key] = stack
                style = ODD_STYLE if group.odd else ""
                table.add_row(
                    Text("ODD" if group.odd else "", style=style),
                    Text(str(index)),
                    Text("-" if stack.rank is None else str(stack.rank), style=style),
                    Text(printable(stack.node)),
                    Text(str(stack.pid)),
                    Text(printable(place), style=style),
                    key=key,
                )
        errors.update(errors_text(report))

    # --- keys -------------------------------------------------------------------------------

    @on(DataTable.RowSelected, "#stacks-table")
    def open_rank(self, event: DataTable.RowSelected) -> None:
        event.stop()
        stack = self._row_ranks.get(str(event.row_key.value))
        if stack is not None:
            self.app.push_screen(RankStackScreen(stack))

    def action_close(self) -> None:
        self.dismiss(None)

    def action_every_node(self) -> None:
        self.scope = StacksScope(None, None, self.scope.native)
        self.collect()

    def action_again(self) -> None:
        self.collect()

    def action_toggle_native(self) -> None:
        self.scope = StacksScope(self.scope.nodes, self.scope.pid, not self.scope.native)
        self.notify("native frames %s" % ("on" if self.scope.native else "off"))
        self.collect()


def verdict_text(report: StacksReport) -> Text:
    text = Text()
    if not report.ranks:
        text.append("no stack came", style="bold red")
        if report.errors:  # why, here at the top: the error lines under the table may be off screen
            first = report.errors[0]
            more = len(report.errors) - 1
            text.append(
                ": %s: %s%s"
                % (printable(first.node), printable(first.reason), " (and %d more below)" % more if more else ""),
                style="red",
            )
        return text
    nodes = len({r.node for r in report.ranks})
    jobs = len({g.job for g in report.groups})
    text.append(
        "%d rank(s) on %d node(s), %d group(s)%s  "
        % (len(report.ranks), nodes, len(report.groups), " in %d jobs" % jobs if jobs > 1 else ""),
        style="dim",
    )
    if report.verdict and report.odd:
        text.append("\nodd: ", style=ODD_STYLE)
        text.append(printable(report.verdict), style=ODD_STYLE)
    elif report.verdict:
        text.append("\n" + printable(report.verdict))
    else:
        text.append("\nall in one stack: " + printable(report.summary))
    return text


def errors_text(report: StacksReport) -> Text:
    text = Text()
    for error in report.errors[:20]:
        who = error.node + ("" if error.pid is None else " pid %d" % error.pid)
        text.append("%s: %s\n" % (printable(who), printable(error.reason)))
    if len(report.errors) > 20:
        text.append("... %d more\n" % (len(report.errors) - 20))
    return text


def stack_text(stack: RankStack) -> Text:
    """A rank's whole dump: every thread, innermost frame first, as py-spy prints it."""
    text = Text()
    if stack.cmd:
        text.append("command: %s\n" % printable(stack.cmd), style="dim")
    if stack.note:
        text.append("note: %s\n" % printable(stack.note), style="yellow")
    threads = stack.threads or ()
    for thread in threads:
        main = thread.frames == stack.frames
        text.append(
            "\nThread %s%s%s\n"
            % (
                printable(thread.name or "?"),
                "" if thread.os_thread_id is None else " (%d)" % thread.os_thread_id,
                "  ← main" if main else "",
            ),
            style="bold",
        )
        for frame in thread.frames:
            text.append("    " + printable(frame_line(frame)) + "\n")
        if thread.frames_cut:
            text.append("    ... %d outer frame(s) left out\n" % thread.frames_cut, style="dim")
    if not threads:
        for frame in stack.frames:
            text.append("    " + printable(frame_line(frame)) + "\n")
    return text


class RankStackScreen(ModalScreen[None]):
    """One rank's whole stack: every thread py-spy saw; esc, enter or q closes."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="rank_stack.close"),
        Binding("enter", "close", "Close", show=False),
        Binding("q", "close", "Close", show=False),
    ]

    DEFAULT_CSS = """
    RankStackScreen { align: center middle; }
    RankStackScreen > Vertical {
        width: 140; max-width: 95%; height: auto; max-height: 90%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    RankStackScreen #rank-stack-title { text-style: bold; margin-bottom: 1; }
    RankStackScreen VerticalScroll { height: auto; max-height: 40; }
    """

    def __init__(self, stack: RankStack) -> None:
        super().__init__()
        self.stack = stack

    def compose(self) -> ComposeResult:
        rank = "rank %d" % self.stack.rank if self.stack.rank is not None else "no rank"
        with Vertical():
            yield Static(
                Text("%s on %s, pid %d" % (rank, printable(self.stack.node), self.stack.pid)), id="rank-stack-title"
            )
            with VerticalScroll():
                yield Static(stack_text(self.stack), id="rank-stack-body")

    def action_close(self) -> None:
        self.dismiss(None)
