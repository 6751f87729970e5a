"""Running the health checks of one node or all: rules and telemetry on the latest frame, the GPU suite on demand.

`evaluate_state` is cheap (pure, every fleet change); `run_node_checks` and `run_all_checks`
add the on-node GPU suite when asked (seconds, over the node's SSH connection). Used by
`opsconsole check`, the Health pane and the actions' "rerun health checks".
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from opsconsole.config import Config, HealthConfig
from opsconsole.health.result import STATUS_ERROR, STATUS_FAIL, STATUS_PASS, STATUS_WARN, HealthResult
from opsconsole.health.rules import evaluate_frame
from opsconsole.health.telemetry import evaluate_telemetry
from opsconsole.model import STATE_CONNECTING, STATE_STALE, NodeState

EXIT_OK, EXIT_FAIL, EXIT_ERROR = 0, 1, 2
REMEDY_NODE = "check the node's SSH access and the probe (the Nodes pane shows the reason)"


def health_config(config: Any) -> HealthConfig:
    """[health] from a Config, or the HealthConfig itself (default when None)."""
    if isinstance(config, HealthConfig):
        return config
    if isinstance(config, Config):
        return config.health
    return HealthConfig()


def node_python(config: Any, node: str) -> str:
    """The node's interpreter from [[nodes]] python (python3 when unknown)."""
    for entry in getattr(config, "nodes", ()) or ():
        if entry.name == node:
            return entry.python
    return "python3"


def node_state_result(state: NodeState, now: float) -> HealthResult:
    """Whether the node delivers frames: pass when live, warn when stale, fail when away, error before any."""
    evidence = (("state", state.state),) + ((("reason", state.reason),) if state.reason else ())
    if state.is_live:
        return HealthResult(
            "node_reachable", state.name, STATUS_PASS, "node %s" % state.state, None, evidence, REMEDY_NODE, now
        )
    if state.state == STATE_STALE:
        age = state.age(now)
        return HealthResult(
            "node_reachable",
            state.name,
            STATUS_WARN,
            "no fresh frame for %s s" % ("%.0f" % age if age is not None else "?"),
            None,
            evidence,
            REMEDY_NODE,
            now,
        )
    if state.state == STATE_CONNECTING or state.frame is None:
        return HealthResult(
            "node_reachable",
            state.name,
            STATUS_ERROR,
            "no frame from the node yet (%s)" % (state.reason or state.state),
            None,
            evidence,
            REMEDY_NODE,
            now,
        )
    return HealthResult(
        "node_reachable",
        state.name,
        STATUS_FAIL,
        "node %s: %s" % (state.state, state.reason or "no reason given"),
        None,
        evidence,
        REMEDY_NODE,
        now,
    )


def evaluate_state(state: NodeState, config: Any = None, now: Optional[float] = None) -> List[HealthResult]:
    """Rules and telemetry findings over the node's latest frame, after its reachability.

    A node that is away keeps its last frame; its rules are then judged on that frame (the
    reachability result says how old it is).
    """
    when = time.time() if now is None else now
    cfg = health_config(config)
    out = [node_state_result(state, when)]
    frame = state.frame
    if frame is not None:
        out.extend(evaluate_frame(frame, cfg, when, node=state.name))
        if state.is_live:  # telemetry of a frame that is not fresh says nothing about now
            out.extend(evaluate_telemetry(frame, cfg, when, node=state.name))
    return out


async def run_node_checks(
    node: str,
    state: Optional[NodeState] = None,
    config: Any = None,
    link: Any = None,
    gpu: Optional[int] = None,
    gpu_tests: bool = False,
    force: bool = False,
    now: Optional[float] = None,
    level: int = 1,
) -> List[HealthResult]:
    """Every check of one node: rules and telemetry on `state`, then the GPU suite when `gpu_tests`.

    `gpu` limits the GPU suite to that GPU (the rules still cover the node). Never raises
    for the node's faults: they come back as results.
    """
    when = time.time() if now is None else now
    results = evaluate_state(state if state is not None else NodeState(node), config, when)
    if gpu_tests:
        # Imported on demand: the console evaluates the rules on every frame, and the suite's
        # module brings the probe bundle's builder (nodes.bundle) that only the suite needs.
        from opsconsole.health.remote import run_gpu_suite

        results.extend(
            await run_gpu_suite(
                node,
                health_config(config),
                link=link,
                python=node_python(config, node),
                gpus=[gpu] if gpu is not None else None,
                force=force,
                level=level,
            )
        )
    return results


# A local probe's first poll has no CPU rates (iowait is a rate between two polls): poll again after this.
LOCAL_SETTLE_S = 0.5


async def snapshot_for_checks(fleet: Any, timeout: float) -> List[NodeState]:
    """One poll of every node for the checks, as `check` and `report` both judge them: a fleet with a
    local node polls again after LOCAL_SETTLE_S, so its rate rules (iowait) have their rates."""
    from opsconsole.nodes.local import LocalLink

    states = await fleet.snapshot(timeout)
    if any(isinstance(fleet.link(state.name), LocalLink) for state in states if state.name in fleet.names):
        await asyncio.sleep(LOCAL_SETTLE_S)
        states = await fleet.snapshot(timeout)
    return list(states)


async def run_all_checks(
    states: Iterable[NodeState],
    config: Any = None,
    links: Optional[Mapping[str, Any]] = None,
    gpu_tests: bool = False,
    force: bool = False,
    limit: int = 8,
    level: int = 1,
) -> Dict[str, List[HealthResult]]:
    """run_node_checks for every node, at most `limit` GPU suites at once; results in the states' order."""
    gate = asyncio.Semaphore(max(1, limit))
    ordered = list(states)

    async def one(state: NodeState) -> List[HealthResult]:
        async with gate:
            link = links.get(state.name) if links is not None else None
            return await run_node_checks(
                state.name, state, config, link=link, gpu_tests=gpu_tests and state.is_live, force=force, level=level
            )

    done = await asyncio.gather(*(one(state) for state in ordered))
    return {state.name: results for state, results in zip(ordered, done)}


def exit_status(results: Sequence[HealthResult]) -> int:
    """`opsconsole check`'s exit: 1 when any check fails, 2 when one could not run (or none ran), else 0."""
    statuses = {r.status for r in results}
    if STATUS_FAIL in statuses:
        return EXIT_FAIL
    if STATUS_ERROR in statuses or not results:
        return EXIT_ERROR
    return EXIT_OK


# A reading written as a plain number ("28.9", "90", "-3", "%g"'s "1.2e+06"); "x16/x16" and "/" stay text.
_PLAIN_NUMBER = re.compile(r"^-?(0|[1-9][0-9]{0,17})(\.[0-9]{1,17})?([eE][+-]?[0-9]{1,3})?$")


def evidence_value(text: str) -> Any:
    """An evidence value as JSON wants it: a number when the reading is a plain number, else the text."""
    if not isinstance(text, str) or not _PLAIN_NUMBER.match(text):
        return text
    if text.isdigit() or (text[:1] == "-" and text[1:].isdigit()):
        return int(text)
    value = float(text)
    return value if math.isfinite(value) else text  # "1e400" is not a JSON number


def result_to_json(result: HealthResult) -> Dict[str, Any]:
    """The JSON form of a result, as `opsconsole check --json` prints it."""
    return {
        "check": result.check,
        "node": result.node,
        "gpu": result.gpu,
        "status": result.status,
        "message": result.message,
        "evidence": {name: evidence_value(value) for name, value in result.evidence},
        "remedy": result.remedy,
        "time": result.time,
        "duration_s": result.duration_s,
    }
