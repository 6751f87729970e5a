"""The one registry of actions: id, key, label, danger, confirmation kind, target kind, command, runner.

The console's keys, help, palette and read-only mode all come from ACTIONS. An action is
planned first (`plan_action`: pre-checks and the exact argv, shown with the node in the
confirmation; a refusal is a `Refused` with one line), then carried out (`run_plan`)
through the ActionRunner, which audits the attempt before the command and the result after.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from opsconsole.actions import drain as drain_mod
from opsconsole.actions import gpu_reset, signals
from opsconsole.actions.plan import (  # noqa: F401 (the registry's vocabulary: imported from here too)
    CONFIRM_NONE,
    CONFIRM_TYPED,
    CONFIRM_YES_NO,
    DANGER_CRITICAL,
    DANGER_DESTRUCTIVE,
    DANGER_DISRUPTIVE,
    DANGER_LEVELS,
    DANGER_SAFE,
    TARGET_CHECKPOINT_DIR,
    TARGET_GPU,
    TARGET_NODE,
    TARGET_PROCESS,
    Action,
    ActionContext,
    ActionReport,
    Plan,
    PlanFn,
    Refused,
    RunFn,
    Target,
)
from opsconsole.actions.runner import ActionOutcome, CommandResult, no_command_channel, run_on_node
from opsconsole.config import Config
from opsconsole.model import NodeState
from opsconsole.nodes.base import is_replayed
from opsconsole.units import format_bytes, format_temperature


def allowed(action: Action, config: Config) -> bool:
    """Whether the console offers `action` at all: a read-only console offers only safe ones."""
    return not (config.console.read_only and action.hidden_when_read_only)


# --- shared pieces ---------------------------------------------------------------------------


def _where(ctx: ActionContext, node: str) -> str:
    return "on this machine (%s)" % node if ctx.local else "on %s over SSH" % node


def _state(ctx: ActionContext, node: str) -> NodeState:
    state = ctx.get_state()
    if state is None:
        raise Refused("no node named %s" % node)
    return state


def _output(result: Optional[CommandResult]) -> str:
    if result is None:
        return ""
    parts = []
    if result.stdout.strip():
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr.strip():
        parts.append("stderr:\n" + result.stderr.rstrip("\n"))
    return "\n".join(parts)


def _status_line(outcome: ActionOutcome) -> str:
    if not outcome.ran:
        return "NOT RUN: " + (outcome.audit_problem or "the audit log could not be written")
    assert outcome.result is not None
    result = outcome.result
    if result.refused:
        return "REFUSED: " + (result.error or "not done")
    if result.error:
        return "failed: " + result.error
    return "exit status %s (%.2f s)" % (result.exit_status, result.duration_s)


def _audit_lines(outcomes: Sequence[ActionOutcome]) -> List[str]:
    return ["audit log: %s" % o.audit_problem for o in outcomes if o.ran and o.audit_problem]


# --- process signals -------------------------------------------------------------------------


async def plan_signal(action: Action, target: Target, ctx: ActionContext, params: Mapping[str, str]) -> Plan:
    state = _state(ctx, target.node)
    refusal = signals.refuse_signal(state, target.pid, ctx.local)
    if refusal:
        raise Refused(refusal)
    frame = state.frame
    assert target.pid is not None and frame is not None  # refuse_signal refused both
    proc = signals.reported_process(frame, target.pid)
    # What every signal of this plan is checked against, where the process runs.
    identity = signals.identity_in_frame(frame, target.pid)
    if identity is None:  # refuse_signal refused it already
        raise Refused("PID %d: the frame says nothing to tell it from a later process" % target.pid)
    name = target.name or (proc.name if proc else "")
    signal_name = SIGNAL_OF[action.id]
    notes = []
    if proc is not None:
        notes.append("process: %s%s" % (proc.command or proc.name, "  (user %s)" % proc.user if proc.user else ""))
    if action.id == "escalate":
        notes.append(
            "SIGINT now; if it is still running after %g s, you are asked before SIGTERM, then SIGKILL"
            % ctx.config.actions.signal_escalation_s
        )
    elif signal_name == "INT":
        notes.append("SIGINT lets a training script that catches it save a checkpoint before it exits")
    elif signal_name == "KILL":
        notes.append("SIGKILL cannot be caught: unsaved work is lost")
    notes.append(
        "checked %s right before each signal: %s; otherwise nothing is sent"
        % ("here" if ctx.local else "on the node", identity.describe())
    )
    return Plan(
        action,
        Target(TARGET_PROCESS, target.node, pid=target.pid, name=name),
        tuple(signals.signal_argv(signal_name, target.pid)),
        _where(ctx, target.node),
        notes=tuple(notes),
        payload=identity,
    )


async def _send_one(plan: Plan, ctx: ActionContext, signal_name: str, action_id: str) -> Tuple[ActionOutcome, float]:
    pid = plan.target.pid
    assert pid is not None
    argv = signals.signal_argv(signal_name, pid)
    sent_at = time.time()

    # A plan made elsewhere holds no identity: deliver_signal refuses it (audited as refused).
    identity = plan.payload if isinstance(plan.payload, signals.ProcessIdentity) else None

    async def execute() -> CommandResult:
        return await signals.deliver_signal(signal_name, pid, ctx.link, ctx.config.actions.command_timeout_s, identity)

    outcome = await ctx.runner.run(action_id, plan.target.node, plan.target.describe(), argv, execute)
    return outcome, sent_at


async def run_signal(plan: Plan, ctx: ActionContext) -> ActionReport:
    signal_name = SIGNAL_OF[plan.action.id]
    assert plan.target.pid is not None  # planning refuses a process target without one
    outcome, sent_at = await _send_one(plan, ctx, signal_name, plan.action.id)
    lines = ["%s to PID %d %s: %s" % ("SIG" + signal_name, plan.target.pid, plan.where, _status_line(outcome))]
    ok = outcome.ok
    if outcome.ok:
        verdict = await signals.watch_process(ctx.get_state, plan.target.pid, sent_at, ctx.frame_wait_s)
        lines.append(verdict.text)
    lines += _audit_lines([outcome])
    return ActionReport(
        ok,
        "SIG%s PID %d on %s" % (signal_name, plan.target.pid, plan.target.node),
        tuple(lines),
        (outcome,),
        _output(outcome.result),
    )


async def run_escalation(plan: Plan, ctx: ActionContext) -> ActionReport:
    outcomes: List[ActionOutcome] = []
    pid = plan.target.pid
    assert pid is not None

    async def send(signal_name: str) -> Tuple[CommandResult, float]:
        outcome, sent_at = await _send_one(plan, ctx, signal_name, "escalate")
        outcomes.append(outcome)
        return outcome.result or CommandResult(None, error=outcome.summary()), sent_at

    async def watch(sent_at: float, timeout: float) -> signals.ProcessVerdict:
        if ctx.progress is not None:
            ctx.progress(
                "SIG%s sent to PID %d on %s; watching its frames for up to %g s"
                % (signals.ESCALATION[len(outcomes) - 1], pid, plan.target.node, timeout)
            )
        return await signals.watch_process(ctx.get_state, pid, sent_at, timeout)

    async def confirm_next(signal_name: str, verdict: signals.ProcessVerdict) -> bool:
        ask = ctx.confirm_next
        yes = bool(ask is not None and await ask(signal_name, verdict))
        if not yes:
            ctx.runner.note(
                "escalate",
                plan.target.node,
                plan.target.describe(),
                signals.signal_argv(signal_name, pid),
                "cancelled",
                "SIG%s not sent: %s" % (signal_name, verdict.text),
            )
        return yes

    wait_s = ctx.config.actions.signal_escalation_s
    steps = await signals.escalate(send, watch, confirm_next, wait_s, ctx.frame_wait_s)
    lines = []
    for step, outcome in zip(steps, outcomes):
        lines.append("SIG%s: %s" % (step.signal, _status_line(outcome)))
        if step.verdict is not None:
            lines.append("  " + step.verdict.text)
    gone = bool(steps and steps[-1].verdict is not None and steps[-1].verdict.gone)
    if steps and not gone and steps[-1].signal != "KILL" and steps[-1].result.ok:
        lines.append(
            "stopped before SIG%s: PID %d may still run"
            % (signals.ESCALATION[signals.ESCALATION.index(steps[-1].signal) + 1], pid)
        )
    lines += _audit_lines(outcomes)
    output = "\n".join(_output(o.result) for o in outcomes if _output(o.result))
    return ActionReport(
        gone, "Escalation for PID %d on %s" % (pid, plan.target.node), tuple(lines), tuple(outcomes), output
    )


SIGNAL_OF = {"signal_int": "INT", "signal_term": "TERM", "signal_kill": "KILL", "escalate": "INT"}


# --- GPU reset -------------------------------------------------------------------------------


async def plan_gpu_reset(action: Action, target: Target, ctx: ActionContext, params: Mapping[str, str]) -> Plan:
    state = _state(ctx, target.node)
    if target.gpu is None:
        raise Refused("no GPU selected")
    report = await gpu_reset.run_prechecks(state, target.gpu, ctx.link)
    if report.refused:
        raise Refused("GPU %d on %s not reset: %s" % (target.gpu, target.node, report.refusal()))
    gpu = gpu_reset.gpu_of(state, target.gpu)
    assert gpu is not None
    try:
        argv = gpu_reset.reset_argv(ctx.config.actions.gpu_reset_command, target.node, gpu, report.use_sudo)
    except ValueError as exc:
        raise Refused("GPU %d on %s not reset: %s" % (target.gpu, target.node, exc)) from None
    notes = ("every process using the GPU loses it; afterwards the GPU is read again and its health checks rerun",)
    return Plan(
        action,
        target,
        tuple(argv),
        _where(ctx, target.node),
        checks=report.checks,
        notes=notes,
        word="%s/%d" % (target.node, target.gpu),
    )


async def run_gpu_reset(plan: Plan, ctx: ActionContext) -> ActionReport:
    index = plan.target.gpu
    assert index is not None

    async def execute() -> CommandResult:
        return await run_on_node(ctx.link, plan.argv, ctx.config.actions.command_timeout_s)

    started = time.time()
    outcome = await ctx.runner.run("gpu_reset", plan.target.node, plan.target.describe(), plan.argv, execute)
    lines = ["%s %s: %s" % (plan.command_line, plan.where, _status_line(outcome))]
    if outcome.ran:
        gpu_line = await reread_gpu(ctx, index, started)
        lines.append(gpu_line)
        lines += await health_lines(ctx, plan.target.node, index, ctx.config.actions.gpu_tests_after_reset)
    lines += _audit_lines([outcome])
    return ActionReport(
        outcome.ok,
        "GPU reset: GPU %d on %s" % (index, plan.target.node),
        tuple(lines),
        (outcome,),
        _output(outcome.result),
    )


async def reread_gpu(ctx: ActionContext, index: int, after: float) -> str:
    """The GPU as the first frame received after `after` shows it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.frame_wait_s
    while loop.time() < deadline:
        state = ctx.get_state()
        if state is not None and state.frame is not None and (state.received_at or 0) > after:
            gpu = gpu_reset.gpu_of(state, index)
            if gpu is None:
                return "GPU %d is missing from the next frame" % index
            if gpu.lost:
                return "GPU %d is LOST in the next frame: the reset did not bring it back (reboot)" % index
            bits = ["GPU %d read again:" % index]
            if gpu.temperature is not None:
                bits.append(format_temperature(gpu.temperature))
            if gpu.memory_used is not None:
                bits.append("%s used" % format_bytes(gpu.memory_used))
            if gpu.ecc_volatile_uncorrected is not None:
                bits.append("volatile uncorrected ECC %d" % gpu.ecc_volatile_uncorrected)
            bits.append("errors: %s" % ("; ".join(gpu.errors) if gpu.errors else "none"))
            return " ".join(bits)
        await asyncio.sleep(signals.FRAME_POLL_S)
    return "no frame within %g s after the reset: GPU %d not read again" % (ctx.frame_wait_s, index)


async def health_lines(ctx: ActionContext, node: str, gpu: Optional[int], gpu_tests: bool = False) -> List[str]:
    """The node's (GPU's) health check results after an action, one line each; `gpu_tests` adds the GPU suite."""
    checks = ctx.health_checks or default_health_checks(ctx)
    if checks is None:
        return ["health checks: not available in this build"]
    try:
        results = await checks(node, gpu, gpu_tests)
    except Exception as exc:  # the checks are another module's: their failure is a line, not a crash
        return ["health checks could not run: %s: %s" % (type(exc).__name__, exc)]
    if not results:
        return ["health checks: none apply"]
    return [
        "health %s: %s%s %s"
        % (
            getattr(r, "status", "?"),
            getattr(r, "check", "?"),
            "" if getattr(r, "gpu", None) is None else " gpu %s" % r.gpu,
            getattr(r, "message", ""),
        )
        for r in results
    ]


def default_health_checks(ctx: ActionContext) -> Optional[Callable[[str, Optional[int], bool], Awaitable[List[Any]]]]:
    """opsconsole.health.runner.run_node_checks over the node's latest state, when that module exists."""
    from opsconsole.actions import health_rerun

    return health_rerun.checks_for(ctx)


# --- health rerun ----------------------------------------------------------------------------


async def plan_health_rerun(action: Action, target: Target, ctx: ActionContext, params: Mapping[str, str]) -> Plan:
    _state(ctx, target.node)
    from opsconsole.actions import health_rerun

    why = health_rerun.unavailable()
    if why:
        raise Refused(why)
    return Plan(
        action,
        target,
        tuple(health_rerun.equivalent_argv(target.node)),
        "in the console (the rules over %s's latest frame)" % target.node,
        notes=("read-only: nothing on the node changes",),
    )


async def run_health_rerun(plan: Plan, ctx: ActionContext) -> ActionReport:

    lines: List[str] = []

    async def execute() -> CommandResult:
        found = await health_lines(ctx, plan.target.node, None)
        lines.extend(found)
        failed = any(line.startswith(("health fail", "health error", "health checks could not")) for line in found)
        return CommandResult(1 if failed else 0, stdout="\n".join(found))

    outcome = await ctx.runner.run("health_rerun", plan.target.node, plan.target.describe(), plan.argv, execute)
    shown = lines if outcome.ran else [_status_line(outcome)]
    return ActionReport(
        outcome.ok, "Health checks of %s" % plan.target.node, tuple(shown + _audit_lines([outcome])), (outcome,)
    )


# --- drain -----------------------------------------------------------------------------------


async def plan_drain(action: Action, target: Target, ctx: ActionContext, params: Mapping[str, str]) -> Plan:
    why = drain_mod.unavailable(ctx.config.actions.drain_command)
    if why:
        raise Refused(why)
    reason = params.get("reason", "")
    try:
        drain_mod.check_reason(reason)
    except ValueError as exc:
        raise Refused("%s not drained: %s" % (target.node, exc)) from None
    slurm_name, host = await drain_mod.slurm_node(target.node, ctx.get_state(), ctx.config)
    try:
        argv = drain_mod.drain_argv(ctx.config.actions.drain_command, slurm_name, reason)
    except ValueError as exc:
        raise Refused("%s not drained: %s" % (target.node, exc)) from None
    return Plan(
        action,
        target,
        tuple(argv),
        "on this machine (Slurm controller command)",
        notes=(
            "Slurm node %s: Slurm's node on host %s, where %s runs" % (slurm_name, host, target.node),
            "Slurm stops scheduling new jobs on %s; running jobs go on" % slurm_name,
        ),
        params=(("reason", reason.strip()),),
    )


async def run_drain(plan: Plan, ctx: ActionContext) -> ActionReport:
    async def execute() -> CommandResult:
        from opsconsole.actions.runner import run_local

        return await run_local(plan.argv, ctx.config.actions.command_timeout_s)

    outcome = await ctx.runner.run(
        "drain_node",
        plan.target.node,
        plan.target.describe(),
        plan.argv,
        execute,
        detail="reason: %s" % plan.param("reason"),
    )
    lines = ["%s: %s" % (plan.command_line, _status_line(outcome))] + _audit_lines([outcome])
    return ActionReport(outcome.ok, "Drain %s" % plan.target.node, tuple(lines), (outcome,), _output(outcome.result))


# --- checkpoint cleanup ----------------------------------------------------------------------


async def plan_cleanup(action: Action, target: Target, ctx: ActionContext, params: Mapping[str, str]) -> Plan:
    from opsconsole.actions import cleanup

    plan: Plan = await cleanup.plan_cleanup(action, target, ctx, params)
    return plan


async def run_cleanup(plan: Plan, ctx: ActionContext) -> ActionReport:
    from opsconsole.actions import cleanup

    report: ActionReport = await cleanup.run_cleanup(plan, ctx)
    return report


def _cleanup_available(config: Config) -> Optional[str]:
    from opsconsole.actions import cleanup

    return cleanup.unavailable()


def _drain_available(config: Config) -> Optional[str]:
    return drain_mod.unavailable(config.actions.drain_command)


# --- the registry ----------------------------------------------------------------------------

ACTIONS: Tuple[Action, ...] = (
    Action(
        "signal_int",
        "i",
        "SIGINT",
        DANGER_DISRUPTIVE,
        CONFIRM_YES_NO,
        TARGET_PROCESS,
        "SIGINT the process (a training script can save a checkpoint)",
        plan_signal,
        run_signal,
    ),
    Action(
        "signal_term",
        "x",
        "SIGTERM",
        DANGER_DISRUPTIVE,
        CONFIRM_YES_NO,
        TARGET_PROCESS,
        "SIGTERM the process",
        plan_signal,
        run_signal,
    ),
    Action(
        "signal_kill",
        "K",
        "SIGKILL",
        DANGER_DESTRUCTIVE,
        CONFIRM_YES_NO,
        TARGET_PROCESS,
        "SIGKILL the process (cannot be caught)",
        plan_signal,
        run_signal,
    ),
    Action(
        "escalate",
        "e",
        "Stop: INT, TERM, KILL",
        DANGER_DESTRUCTIVE,
        CONFIRM_YES_NO,
        TARGET_PROCESS,
        "SIGINT, then SIGTERM and SIGKILL after a timeout, each confirmed",
        plan_signal,
        run_escalation,
    ),
    Action(
        "gpu_reset",
        "R",
        "Reset GPU",
        DANGER_CRITICAL,
        CONFIRM_TYPED,
        TARGET_GPU,
        "Reset the GPU (pre-checks, typed confirmation)",
        plan_gpu_reset,
        run_gpu_reset,
        binding="gpu.reset",
    ),
    Action(
        "health_rerun",
        "h",
        "Rerun health",
        DANGER_SAFE,
        CONFIRM_NONE,
        TARGET_NODE,
        "Rerun the node's health checks",
        plan_health_rerun,
        run_health_rerun,
    ),
    Action(
        "drain_node",
        "D",
        "Drain node",
        DANGER_DISRUPTIVE,
        CONFIRM_YES_NO,
        TARGET_NODE,
        "Drain the node in Slurm, with a reason",
        plan_drain,
        run_drain,
        needs_reason=True,
        available=_drain_available,
        binding="node.drain",
    ),
    # The Checkpoints pane's `c` (checkpoints.cleanup) is this action's key.
    Action(
        "checkpoint_cleanup",  # checkpoints.cleanup.ACTION_CLEANUP: its refusals' records name it too
        "c",
        "Clean up",
        DANGER_DESTRUCTIVE,
        CONFIRM_TYPED,
        TARGET_CHECKPOINT_DIR,
        "Delete the checkpoints the retention plan drops",
        plan_cleanup,
        run_cleanup,
        available=_cleanup_available,
        binding="checkpoints.cleanup",
    ),
)

ACTIONS_BY_ID: Dict[str, Action] = {action.id: action for action in ACTIONS}


def action(action_id: str) -> Action:
    """The registered action `action_id` (KeyError when there is none)."""
    return ACTIONS_BY_ID[action_id]


def actions_for(target_kind: str) -> Tuple[Action, ...]:
    return tuple(a for a in ACTIONS if a.target_kind == target_kind)


def hidden_binding_ids(config: Config) -> FrozenSet[str]:
    """Binding ids of the actions this console does not offer (read-only mode)."""
    return frozenset(a.binding_id for a in ACTIONS if not allowed(a, config))


# Actions that reach into the node itself (its processes, GPUs, files) need its command channel;
# the node actions (a Slurm drain from the login node, the health rules over its frames) do not.
_NEEDS_COMMAND_CHANNEL = (TARGET_PROCESS, TARGET_GPU, TARGET_CHECKPOINT_DIR)


def refusal_for_target(act: Action, target: Target, ctx: ActionContext) -> Optional[str]:
    """Why `act` must not act on `target` at all (a replayed node, no command channel), None when it may."""
    if ctx.replayed or is_replayed(ctx.link):
        return "%s is replayed from a recording: no action acts on it (%s refused)" % (target.node, act.label)
    if act.target_kind in _NEEDS_COMMAND_CHANNEL:
        why = no_command_channel(ctx.link)
        if why:
            return "%s refused: %s" % (act.label, why)
    return None


async def plan_action(
    action_id: str, target: Target, ctx: ActionContext, params: Optional[Mapping[str, str]] = None
) -> Plan:
    """Pre-checks and the exact command; raises Refused (read-only, a replayed node, unavailable, a failed check)."""
    act = action(action_id)
    if act.target_kind != target.kind:
        raise Refused("%s acts on a %s, not a %s" % (act.label, act.target_kind, target.kind))
    if not allowed(act, ctx.config):
        raise Refused("read-only console [R]: %s is off" % act.label)
    why = refusal_for_target(act, target, ctx) or act.available(ctx.config)
    if why:
        raise Refused(why)
    return await act.plan(act, target, ctx, dict(params or {}))


async def run_plan(plan: Plan, ctx: ActionContext) -> ActionReport:
    """Carry out a confirmed plan (audited by the runner); read-only and the target are checked again."""
    if not allowed(plan.action, ctx.config):
        raise Refused("read-only console [R]: %s is off" % plan.action.label)
    why = refusal_for_target(plan.action, plan.target, ctx)
    if why:
        raise Refused(why)
    return await plan.action.run(plan, ctx)
