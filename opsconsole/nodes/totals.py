"""The header's fleet numbers, computed from node states alone (live fleet and replay alike)."""

from __future__ import annotations

from typing import Iterable, Optional, Tuple

from opsconsole.jobs_view import count_jobs
from opsconsole.model import STATE_AUTH, STATE_CONNECTING, STATE_HOSTKEY, frozen


@frozen
class FleetTotals:
    """Numbers for the header line: how many nodes and GPUs, how many are up."""

    nodes: int
    nodes_up: int
    nodes_down: int  # every node not delivering fresh frames (stale, down, auth, reconnecting ...)
    gpus: int  # GPUs of the nodes that are up
    mean_utilization: Optional[float]  # percent over those GPUs; None when none report it
    alerts: int = 0
    nodes_connecting: int = 0  # nodes still making their first connection (no frame yet): not down
    jobs: int = 0  # distinct jobs running on the GPUs of the nodes that are up
    # Of nodes_down, those waiting for a person (a host key to check, a login to fix): the header names them.
    nodes_hostkey: int = 0
    nodes_auth: int = 0


@frozen
class RunTotals(FleetTotals):
    """FleetTotals plus what the header shows of the run: the Slurm job and the sources' states."""

    job: Optional[str] = None
    sources: Tuple[Tuple[str, str, Optional[str]], ...] = ()  # (source name, state, reason)


def totals_of(states: Iterable, now: float, stale_after: float) -> FleetTotals:
    """Node and GPU counts over `states`; a live node gone quiet for `stale_after` s counts as down."""
    states = list(states)
    up = []
    connecting = hostkey = auth = 0
    for state in states:
        age = state.age(now)
        if state.is_live and not (age is not None and age > stale_after):
            up.append(state)
        elif state.state == STATE_CONNECTING and state.frame is None:
            connecting += 1
        elif state.state == STATE_HOSTKEY:
            hostkey += 1
        elif state.state == STATE_AUTH:
            auth += 1
    utilizations = [g.utilization_gpu for s in up if s.frame for g in s.frame.gpus if g.utilization_gpu is not None]
    return FleetTotals(
        nodes=len(states),
        nodes_up=len(up),
        nodes_down=len(states) - len(up) - connecting,
        gpus=sum(len(s.frame.gpus) for s in up if s.frame),
        mean_utilization=sum(utilizations) / len(utilizations) if utilizations else None,
        nodes_connecting=connecting,
        jobs=count_jobs(up),
        nodes_hostkey=hostkey,
        nodes_auth=auth,
    )
