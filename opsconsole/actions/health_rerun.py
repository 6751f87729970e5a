"""The health rerun action: the node's health checks over its latest state, one line per result.

The checks belong to opsconsole.health (written alongside): `runner.run_node_checks` when it
exists, else the rules over one frame (`rules.evaluate_frame` and `telemetry.evaluate_telemetry`).
This module only finds them and calls them with what it has, and says plainly when neither
is there.
"""

from __future__ import annotations

import inspect
import time
from typing import Any, Awaitable, Callable, Dict, List, Optional

RUNNER_MODULE = "opsconsole.health.runner"


def _runner() -> Optional[Callable[..., Any]]:
    try:
        from opsconsole.health import runner
    except ImportError:
        return None
    return getattr(runner, "run_node_checks", None)


def _frame_rules() -> Optional[Callable[[Any, Any, float], List[Any]]]:
    """The rules over one frame (opsconsole.health.rules and .telemetry), for when the runner is missing."""
    try:
        from opsconsole.health.rules import evaluate_frame
    except ImportError:
        return None
    from opsconsole.health.telemetry import evaluate_telemetry

    def rules(state: Any, config: Any, now: float) -> List[Any]:
        if state is None or state.frame is None:
            return []
        out = list(evaluate_frame(state.frame, config.health, now=now, node=state.name))
        out += evaluate_telemetry(state.frame, config.health, now=now, node=state.name)
        return out

    return rules


def unavailable() -> Optional[str]:
    """Why health checks cannot run in this build, None when they can."""
    if _runner() is None and _frame_rules() is None:
        return "health checks are not available in this build (%s.run_node_checks missing)" % RUNNER_MODULE
    return None


def equivalent_argv(node: str) -> List[str]:
    """The headless command that runs the same checks (shown in the confirmation and the audit log)."""
    return ["opsconsole", "check", "--node", node]


def _for_gpu(results: List[Any], gpu: Optional[int]) -> List[Any]:
    """The results about `gpu` and the node-wide ones (all of them when gpu is None)."""
    if gpu is None:
        return results
    return [r for r in results if getattr(r, "gpu", None) in (None, gpu)]


def checks_for(ctx: Any) -> Optional[Callable[[str, Optional[int], bool], Awaitable[List[Any]]]]:
    """An async (node, gpu, gpu_tests) -> results over ctx's latest state; None when no checks exist.

    gpu_tests adds the on-node GPU suite (the runner's); the frame-rules fallback has none.
    """
    run = _runner()
    rules = _frame_rules()
    if run is None and rules is None:
        return None

    async def checks(node: str, gpu: Optional[int], gpu_tests: bool = False) -> List[Any]:
        state = ctx.get_state()
        now = time.time()
        if run is None:
            assert rules is not None
            return _for_gpu(rules(state, ctx.config, now), gpu)
        available: Dict[str, Any] = {
            "state": state,
            "states": {node: state} if state is not None else {},
            "node": node,
            "frame": state.frame if state is not None else None,
            "config": ctx.config,
            "health": ctx.config.health,
            "now": now,
            "link": ctx.link,
            "gpu": gpu,
            "gpu_tests": gpu_tests,
        }
        params = inspect.signature(run).parameters
        kwargs = {name: available[name] for name in params if name in available}
        result = run(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return _for_gpu(list(result or ()), gpu)

    return checks
