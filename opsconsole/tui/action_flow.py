"""Registered actions in the console: pane keys, reason prompt, confirmation, run in a worker, result.

The flow of one key press: the pane names the target (the highlighted process, GPU or node);
the registry plans it (pre-checks, exact argv: a refusal is shown and audited); the
confirmation shows the command and the node (Cancel focused; a typed word for the most
dangerous); the runner audits the attempt, runs it, audits the result; the result screen
shows exit status, output and what the next frames said. Nothing here blocks the UI: the
flow runs as an async worker and awaits its screens.
"""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Iterable, List, Optional, Tuple

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from opsconsole.actions import drain
from opsconsole.actions.audit import OUTCOME_CANCELLED, OUTCOME_REFUSED, AuditLog, audit_path
from opsconsole.actions.gpu_reset import CHECK_FAIL, CHECK_PASS, CHECK_WARN
from opsconsole.actions.registry import (
    ACTIONS_BY_ID,
    CONFIRM_NONE,
    CONFIRM_TYPED,
    DANGER_CRITICAL,
    DANGER_DESTRUCTIVE,
    ActionContext,
    ActionReport,
    Plan,
    Refused,
    Target,
    action,
    actions_for,
    allowed,
    plan_action,
    run_plan,
)
from opsconsole.actions.runner import ActionRunner
from opsconsole.actions.signals import ProcessVerdict
from opsconsole.config import DEFAULT_CONFIG
from opsconsole.nodes.base import is_replayed
from opsconsole.tui.formatting import printable, printable_text

CHECK_STYLES = {CHECK_PASS: "green", CHECK_WARN: "yellow", CHECK_FAIL: "bold red"}


def action_bindings(target_kind: str) -> List[Binding]:
    """The pane bindings of the registered actions on `target_kind` (ids from the registry)."""
    return [Binding(a.key, "run_registered(%r)" % a.id, a.label, id=a.binding_id) for a in actions_for(target_kind)]


def _rows(rows: Iterable[Tuple[str, str]]) -> Text:
    text = Text()
    for label, value in rows:
        text.append("%-10s" % label, style="bold")
        text.append(value + "\n")
    return text


def plan_text(plan: Plan) -> Text:
    """The confirmation body: node, target, where, the exact command, pre-checks, notes, what to press."""
    text = _rows(
        [
            ("Node", plan.target.node),
            ("Target", plan.target.describe()),
            ("Runs", plan.where),
        ]
    )
    text.append("%-10s" % "Command", style="bold")
    text.append(plan.command_line + "\n", style="bold reverse")
    if plan.param("reason"):
        text.append("%-10s" % "Reason", style="bold")
        text.append(plan.param("reason") + "\n")
    if plan.checks:
        text.append("\nPre-checks:\n", style="bold")
        for check in plan.checks:
            text.append("  %-5s" % check.status, style=CHECK_STYLES.get(check.status, ""))
            text.append("%-18s %s\n" % (check.name, check.message))
    if plan.notes:
        text.append("\n")
        for note in plan.notes:
            text.append("· " + note + "\n", style="italic")
    text.append("\nEvery run is written to the audit log first.\n", style="dim")
    if plan.word is None:
        text.append("y runs it · n / esc cancels (Cancel has the focus)", style="italic")
    return text


def report_text(report: ActionReport) -> Text:
    text = Text()
    for line in report.lines:
        if line.startswith(("failed", "NOT RUN", "audit log", "health fail")):
            style = "bold red"
        elif line.startswith(("health warn", "health error")):
            style = "yellow"
        else:
            style = ""
        text.append(line + "\n", style=style)
    if report.output:
        text.append("\nOutput:\n", style="bold")
        text.append(report.output.rstrip("\n") + "\n")
    return text


class ReasonScreen(ModalScreen[Optional[str]]):
    """Asks for a one-line reason (a drain's); enter submits a valid one, esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="reason.cancel")]

    DEFAULT_CSS = """
    ReasonScreen { align: center middle; }
    ReasonScreen > Vertical {
        width: 90; max-width: 95%; height: auto; border: thick $warning; background: $surface; padding: 0 1;
    }
    ReasonScreen #reason-title { text-style: bold; margin-bottom: 1; }
    ReasonScreen #reason-error { color: $error; height: auto; }
    """

    def __init__(self, title: str, prompt: str) -> None:
        super().__init__()
        self.title_text = printable(title)  # names the node
        self.prompt = prompt

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.title_text), id="reason-title")
            yield Static(Text(self.prompt))
            yield Input(placeholder="reason (one line)", id="reason-input")
            yield Static("", id="reason-error")

    def on_mount(self) -> None:
        self.query_one("#reason-input", Input).focus()

    @on(Input.Submitted, "#reason-input")
    def submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            reason = drain.check_reason(event.value)
        except ValueError as exc:
            self.query_one("#reason-error", Static).update(Text(str(exc)))
            return
        self.dismiss(reason)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ResultScreen(ModalScreen[None]):
    """An action's outcome: status lines, output, what the frames said; esc, enter or q closes."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="result.close"),
        Binding("enter", "close", "Close", show=False),
        Binding("q", "close", "Close", show=False),
    ]

    DEFAULT_CSS = """
    ResultScreen { align: center middle; }
    ResultScreen > Vertical {
        width: 120; max-width: 95%; height: auto; max-height: 90%;
        border: thick $success; background: $surface; padding: 0 1;
    }
    ResultScreen.-failed > Vertical { border: thick $error; }
    ResultScreen #result-title { text-style: bold; margin-bottom: 1; }
    ResultScreen VerticalScroll { height: auto; max-height: 30; }
    ResultScreen #result-hint { color: $text-muted; margin-top: 1; }
    """

    def __init__(self, title: str, body: Text, ok: bool) -> None:
        super().__init__(classes="" if ok else "-failed")
        # An action's output and an audit record are data: control characters made visible.
        self.title_text = printable(title)
        self.body = printable_text(body)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.title_text), id="result-title")
            with VerticalScroll():
                yield Static(self.body, id="result-body")
            yield Static("esc / enter closes", id="result-hint")

    def action_close(self) -> None:
        self.dismiss(None)


TYPING_POLL_S = 0.1


async def wait_until_not_typing(app: Any) -> None:
    """Return once no text input has the focus (at once when none has)."""
    while isinstance(getattr(app, "focused", None), Input):
        await asyncio.sleep(TYPING_POLL_S)


class ActionFlow:
    """Runs registered actions for one console app (see the module docstring)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._runner: Optional[ActionRunner] = None
        self.running: Dict[Tuple[str, Target], bool] = {}  # what is in flight, so a double press runs once
        self.last_report: Optional[ActionReport] = None  # for tests and the palette

    @property
    def config(self):
        return getattr(self.app, "config", DEFAULT_CONFIG)

    def runner(self) -> ActionRunner:
        if self._runner is None:
            self._runner = ActionRunner(AuditLog(audit_path(self.config.actions)))
        return self._runner

    def context(self, node: str) -> ActionContext:
        fleet = self.app.fleet
        link_of = getattr(self.app, "_link_of", None)
        return ActionContext(
            config=self.config,
            get_state=lambda: fleet.states().get(node),
            link=link_of(node) if link_of is not None else None,
            runner=self.runner(),
            confirm_next=self._ask_next_signal,
            progress=lambda line: self.app.notify(line, timeout=6),
            replayed=is_replayed(fleet),
            filesystems=getattr(getattr(self.app, "services", None), "filesystems", None),
        )

    def start(self, action_id: str, target: Target) -> None:
        """Begin the flow for `action_id` on `target` in a worker (returns at once)."""
        key = (action_id, target)
        if key in self.running:
            self.app.notify(
                "%s on %s is already running" % (action(action_id).label, target.describe()), severity="warning"
            )
            return
        self.running[key] = True
        self.app.run_worker(self._flow(action_id, target, key), group="actions", exit_on_error=False)

    async def _flow(self, action_id: str, target: Target, key: Tuple[str, Target]) -> None:
        try:
            await self._flow_steps(action_id, target)
        except Exception as exc:  # a bug in one action must not take the console down
            self.app.notify("%s failed: %s: %s" % (action_id, type(exc).__name__, exc), severity="error", timeout=15)
        finally:
            self.running.pop(key, None)
            self._refresh_audit_pane()

    async def _flow_steps(self, action_id: str, target: Target) -> None:
        act = ACTIONS_BY_ID[action_id]
        ctx = self.context(target.node)
        if not allowed(act, self.config):  # the keys are absent; this guards the palette and scripts
            self._refused(ctx, act.id, target, "read-only console [R]: %s is off" % act.label)
            return
        params: Dict[str, str] = {}
        if act.needs_reason:
            reason = await self.app.push_screen_wait(
                ReasonScreen("%s: %s" % (act.label, target.node), "Why? (recorded by Slurm and in the audit log)")
            )
            if reason is None:
                ctx.runner.note(act.id, target.node, target.describe(), (), OUTCOME_CANCELLED, "no reason given")
                self.app.notify("%s of %s cancelled" % (act.label, target.node))
                return
            params["reason"] = reason
        try:
            plan = await plan_action(act.id, target, ctx, params)
        except Refused as refusal:
            self._refused(ctx, act.id, target, str(refusal))
            return
        if not await self._confirmed(plan):
            ctx.runner.note(act.id, target.node, target.describe(), plan.argv, OUTCOME_CANCELLED, "not confirmed")
            self.app.notify("%s on %s cancelled" % (act.label, target.describe()))
            return
        self.app.notify("%s: %s %s" % (act.label, plan.command_line, plan.where), timeout=4)
        try:
            report = await run_plan(plan, ctx)
        except Refused as refusal:
            self._refused(ctx, act.id, target, str(refusal))
            return
        self.last_report = report
        self._show_report(report)
        self._tell_panes(target)

    async def _confirmed(self, plan: Plan) -> bool:
        act = plan.action
        if act.confirm == CONFIRM_NONE:
            return True
        typed = act.confirm == CONFIRM_TYPED
        if not typed and not self.config.actions.confirm:
            return True  # [actions] confirm = false skips yes/no; never a typed word
        from opsconsole.tui.confirm import ConfirmScreen

        screen = ConfirmScreen(
            "%s: %s on %s?" % (act.label, plan.target.describe(), plan.target.node),
            plan_text(plan),
            word=plan.word if typed else None,
            confirm_label=act.label,
            danger=act.danger in (DANGER_DESTRUCTIVE, DANGER_CRITICAL),
        )
        return await self._ask(screen)

    async def _ask(self, screen: Any) -> bool:
        """Push a confirmation once nobody is typing into a text input, and wait for its answer.

        A question that appears under the user's fingers (an escalation's timer firing while the
        filter is open) would take the next typed `y` as its answer: it waits until the input is
        closed. The screen itself ignores keys that arrive just after it appears (ConfirmScreen).
        """
        await wait_until_not_typing(self.app)
        return bool(await self.app.push_screen_wait(screen))

    async def _ask_next_signal(self, signal_name: str, verdict: ProcessVerdict) -> bool:
        from opsconsole.tui.confirm import ConfirmScreen

        body = Text(verdict.text + "\n\n")
        body.append("Send SIG%s now?" % signal_name, style="bold")
        body.append("\ny sends it · n / esc stops here (the process keeps running)", style="italic")
        screen = ConfirmScreen(
            "Still running: send SIG%s?" % signal_name,
            body,
            confirm_label="Send SIG" + signal_name,
            danger=signal_name == "KILL",
        )
        return await self._ask(screen)

    def _refused(self, ctx: ActionContext, action_id: str, target: Target, reason: str) -> None:
        problem = ctx.runner.note(action_id, target.node, target.describe(), (), OUTCOME_REFUSED, reason)
        self.app.notify(reason, severity="warning", timeout=10)
        if problem:
            self.app.notify(problem, severity="error", timeout=10)

    def _show_report(self, report: ActionReport) -> None:
        if len(report.lines) <= 2 and not report.output:
            self.app.notify(" · ".join(report.lines), severity="information" if report.ok else "error", timeout=10)
            return
        self.app.push_screen(ResultScreen(report.title, report_text(report), report.ok))

    def _tell_panes(self, target: Target) -> None:
        """Panes that show what an action changed (a cleaned directory) read it again."""
        for pane in getattr(self.app, "panes", {}).values():
            after = getattr(pane, "after_action", None)
            if after is not None:
                after(target)

    def _refresh_audit_pane(self) -> None:
        panes = getattr(self.app, "panes", {})
        pane = panes.get("audit")
        if pane is not None and hasattr(pane, "reload"):
            pane.reload()


class ActionKeys:
    """Mixin for panes with registered action keys: hides the ones a read-only console does not offer."""

    def action_target(self, action_id: str) -> Optional[Target]:
        """The target under the cursor for this action, None when nothing is selected."""
        raise NotImplementedError

    def check_action(self, action_name: str, parameters: Tuple[object, ...]) -> Optional[bool]:
        if action_name == "run_registered" and parameters:
            registered = ACTIONS_BY_ID.get(str(parameters[0]))
            config = getattr(self.app, "config", DEFAULT_CONFIG)  # type: ignore[attr-defined]
            if registered is not None and not allowed(registered, config):
                return False  # absent: not in the footer, and the key does nothing
        return super().check_action(action_name, parameters)  # type: ignore[misc]

    def action_run_registered(self, action_id: str) -> None:
        """Start registered action `action_id` on the highlighted row."""
        target = self.action_target(action_id)
        app = self.app  # type: ignore[attr-defined]
        if target is None:
            app.notify("nothing selected for %s" % action(action_id).label, severity="warning")
            return
        flow = getattr(app, "action_flow", None)
        if flow is None:
            app.notify("actions are not available in this console", severity="warning")
            return
        flow.start(action_id, target)
