"""The flight-recorder screen: every rank's PyTorch flight-recorder dump, collected and matched.

`T` on the Logs pane opens it for every node (the hang finding's next step after `S`): each node,
over its own connection, finds its ranks, asks each one for a dump through its FIFO, and the dumps
come back into a new folder here (opsconsole.hang.flight_recorder.collect_from_links), where they
are read by the restricted unpickler in the limited workers and matched. The verdict names the
first collective the ranks disagree on and the ranks at fault, with the line they were at.

Asking makes the ranks write a file, so each use is audited first (attempt, then result) like an
action; a read-only console asks nothing and copies only the dumps already there (those written on
a watchdog timeout). `g` asks again, `esc` goes back. Names and paths from the dumps are drawn as
plain Text.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from opsconsole.actions.runner import CommandResult
from opsconsole.hang.flight_recorder import FrAnalysis, analyse_dir, collect_from_links, summary_text
from opsconsole.tui.formatting import printable

AUDIT_ACTION = "flight_recorder"
CULPRIT_STYLE = "bold red"


def open_flight_recorder(
    app: Any, nodes: Optional[Sequence[str]] = None, rank_pids: Optional[Dict[str, List[Tuple[int, int]]]] = None
) -> None:
    """Open the screen for `nodes` (None: every node); `rank_pids` {node: [(pid, rank)]} when the ranks are known."""
    app.push_screen(FlightRecorderScreen(tuple(nodes) if nodes else None, rank_pids))


class FlightRecorderScreen(Screen[None]):
    """The dumps of every rank, the first mismatch named."""

    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("g", "collect", "Ask again"),
    ]

    DEFAULT_CSS = """
    FlightRecorderScreen #fr-title { height: 1; padding: 0 1; text-style: bold; }
    FlightRecorderScreen #fr-verdict { height: auto; max-height: 14; padding: 0 1; }
    FlightRecorderScreen DataTable { height: 1fr; }
    """

    def __init__(
        self, nodes: Optional[Tuple[str, ...]] = None, rank_pids: Optional[Dict[str, List[Tuple[int, int]]]] = None
    ) -> None:
        super().__init__()
        self.nodes = nodes
        self.rank_pids = rank_pids
        self.analysis: Optional[FrAnalysis] = None
        self.directory: Optional[str] = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(
                "Flight recorder: %s" % (", ".join(self.nodes) if self.nodes else "every node"),
                id="fr-title",
                markup=False,
            )
            yield Static("", id="fr-verdict")
            table: DataTable = DataTable(id="fr-dumps", cursor_type="row")
            for key, label, width in (
                ("rank", "Rank", 6),
                ("host", "Host", 16),
                ("entries", "Entries", 8),
                ("dump", "Dump", None),
            ):
                table.add_column(label, key=key, width=width)
            yield table
        yield Footer()

    def on_mount(self) -> None:
        self.action_collect()

    def action_collect(self) -> None:
        self.query_one("#fr-verdict", Static).update(
            Text("collecting: asking every rank for its dump ...", style="italic")
        )
        self.run_worker(self._collect(), exclusive=True, group="flight-recorder")

    async def _collect(self) -> None:
        app: Any = self.app
        names = list(self.nodes) if self.nodes else list(app.fleet.states())
        link_of = getattr(app, "_link_of", lambda name: None)
        links = {name: link_of(name) for name in names}
        ask = not app.config.console.read_only  # a read-only console only copies what is there
        directory = tempfile.mkdtemp(prefix="opsconsole-fr-")
        problems: List[str] = []
        found: Dict[str, FrAnalysis] = {}

        async def execute() -> CommandResult:
            results = await collect_from_links(links, directory, trigger=ask, rank_pids=self.rank_pids)
            for node, collected in results.items():
                problems.extend(
                    "%s%s: %s" % (node, " rank %d" % rank if rank >= 0 else "", why) for rank, why in collected.problems
                )
            # The reading waits on worker processes: a thread, so the console's loop never does.
            analysis = await asyncio.to_thread(analyse_dir, directory)
            found["analysis"] = analysis
            return CommandResult(
                0 if analysis.readable else 1, stdout=summary_text(analysis), stderr="\n".join(problems)
            )

        from opsconsole.tui.stacks import _runner

        argv = ["opsconsole", "fr", "--collect", directory] + (["--no-ask"] if not ask else [])
        for name in self.nodes or ():
            argv += ["--node", name]
        node = names[0] if len(names) == 1 else "%d nodes" % len(names)
        outcome = await _runner(app).run(AUDIT_ACTION, node, "flight recorder of every rank", argv, execute)
        if not outcome.ran:
            self.query_one("#fr-verdict", Static).update(
                Text("not run: %s" % (outcome.audit_problem or "the audit log could not be written"), style="bold red")
            )
            return
        self.directory = directory
        self.analysis = found.get("analysis")
        self._show(problems)

    def _show(self, problems: Sequence[str]) -> None:
        analysis = self.analysis
        verdict = Text()
        if analysis is None:
            verdict.append("no answer", style="bold red")
        else:
            lines = summary_text(analysis).splitlines()
            verdict.append(printable(lines[0]), style=CULPRIT_STYLE if analysis.mismatch is not None else "")
            for line in lines[1:]:
                verdict.append("\n" + printable(line))
            if analysis.missing_ranks:
                verdict.append("\nno dump from rank(s) %s" % ", ".join(str(rank) for rank in analysis.missing_ranks))
        for problem in list(problems)[:8]:
            verdict.append("\n" + printable(problem), style="yellow")
        if self.directory:
            verdict.append("\ndumps in %s" % printable(self.directory), style="dim")
        self.query_one("#fr-verdict", Static).update(verdict)
        table = self.query_one("#fr-dumps", DataTable)
        table.clear()
        culprits = set(analysis.mismatch.culprit_ranks) if analysis is not None and analysis.mismatch else set()
        for index, dump in enumerate(analysis.dumps if analysis is not None else ()):
            style = CULPRIT_STYLE if dump.rank in culprits else ""
            entries = dump.unreadable and "unreadable: %s" % dump.unreadable or str(len(dump.entries))
            table.add_row(
                Text(str(dump.rank), style=style),
                Text(printable(dump.host or "-")),
                Text(printable(entries[:60])),
                Text(printable(dump.path)),
                key=str(index),
            )
