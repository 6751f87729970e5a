"""What the fleet gains from issue 8: sources beside links, one node per name, and Slurm following.

Kept apart from fleet.py (Fleet inherits FleetSources) so the fleet's
hot path stays small: with no sources and no Slurm job, the only cost is one empty-dict
test per published state.

- A source (PrometheusSource) publishes NodeStates for many nodes. A node no link knows
  is added to the fleet (after the configured nodes, in the order first seen).
- A node seen by a link (SSH) and a source is one node: the link stays the way to act on
  it; its frames come from the source named by `telemetry` ("ssh" or "prometheus"),
  falling back to the other one when the preferred one is not live. A link that needs the
  user (host key, authentication) shows that state whatever the telemetry.
- follow_slurm(): the nodes of a Slurm job (or of a user's running jobs) are followed:
  nodes that join get a link (`link_factory`), nodes that leave are removed, sources only
  publish the job's nodes, and the header shows the job (totals.job).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from opsconsole.model import STATE_AUTH, STATE_CONNECTING, STATE_DOWN, STATE_HOSTKEY, NodeState
from opsconsole.nodes.totals import FleetTotals

log = logging.getLogger(__name__)

SourceLine = Tuple[str, str, Optional[str]]  # (source name, state, reason)


@dataclass(frozen=True)
class RunTotals(FleetTotals):
    """FleetTotals plus what the header shows of the run: the Slurm job and the sources' states."""

    job: Optional[str] = None
    sources: Tuple[SourceLine, ...] = ()


class FleetSources:
    """Mixin for Fleet: sources, node add/remove, and Slurm following (see the module docstring)."""

    # Provided by Fleet.
    config: Any
    _links: Dict[str, Any]
    _states: Dict[str, NodeState]
    _tasks: List[asyncio.Task]
    _on_change: Optional[Callable[[NodeState], None]]

    def _init_sources(self, config: Any, sources: Optional[Sequence[Any]]) -> None:
        if sources is None:
            from opsconsole.sources import build_sources

            sources = build_sources(config)
        self.sources: List[Any] = list(sources)
        self._source_states: Dict[str, NodeState] = {}  # node -> latest state from a source
        self._link_states: Dict[str, NodeState] = {}  # node -> latest state from its link (when merged)
        self._node_source: Dict[str, Any] = {}  # node -> the source that reports it
        self._slurm: Any = None
        self._slurm_run: Any = None
        self._slurm_nodes: Optional[Set[str]] = None
        self._link_factory: Optional[Callable[[str], Any]] = None
        self._supervised: Dict[str, asyncio.Task] = {}

    # --- merging a link's and a source's view of one node ---------------------------------

    def _prefers_source(self, name: str) -> bool:
        source = self._node_source.get(name)
        return source is not None and getattr(source, "telemetry", "ssh") == "prometheus"

    def _merged(self, name: str) -> NodeState:
        link = self._link_states.get(name)
        source = self._source_states.get(name)
        if link is None or source is None:
            return link or source  # type: ignore[return-value]
        primary, other = (source, link) if self._prefers_source(name) else (link, source)
        chosen = primary if primary.is_live or not other.is_live else other
        if chosen.frame is None and other.frame is not None:
            chosen = replace(chosen, frame=other.frame, received_at=other.received_at)
        if link.state in (STATE_HOSTKEY, STATE_AUTH):
            # The user must act on the link (trust a key, fix a login): show that, with the freshest frame.
            return replace(link, frame=chosen.frame, received_at=chosen.received_at)
        merged = replace(
            chosen, address=link.address or chosen.address, rtt_ms=link.rtt_ms, fingerprint=link.fingerprint
        )
        if chosen is source and not link.is_live and link.state != STATE_CONNECTING:
            merged = replace(
                merged,
                reason="telemetry from %s; ssh %s: %s"
                % (getattr(self._node_source.get(name), "name", "source"), link.state, link.reason or "-"),
            )
        return merged

    def _merge_link_state(self, state: NodeState) -> NodeState:
        self._link_states[state.name] = state
        return self._merged(state.name)

    def _publish_source(self, source: Any, state: NodeState) -> None:
        name = state.name
        if self._slurm_nodes is not None and name not in self._slurm_nodes:
            return  # not (or no longer) a node of the followed job
        first = name not in self._source_states
        self._source_states[name] = state
        self._node_source.setdefault(name, source)
        if name in self._links:
            if first:
                self._link_states.setdefault(name, self._states[name])
            state = self._merged(name)
        self._states[name] = state
        if self._on_change is not None:
            try:
                self._on_change(state)
            except Exception:  # a broken listener must not take the source down with it
                log.exception("on_change failed for %s", name)

    # --- running sources -------------------------------------------------------------------------

    def _start_sources(self) -> None:
        for source in self.sources:
            self._tasks.append(asyncio.create_task(self._run_source(source), name="source:" + source.name))
        if self._slurm is not None:
            self._tasks.append(asyncio.create_task(self._slurm.follow(self.apply_slurm_run), name="slurm"))

    def _forget_source_node(self, old: str, new: str) -> None:
        """A source now shows node `old` as part of `new` (the same host): drop `old` unless a link has it."""
        if old in self._links or old not in self._source_states:
            return
        self._tasks.append(asyncio.ensure_future(self.remove_node(old, reason="now shown as %s (the same host)" % new)))

    async def _run_source(self, source: Any) -> None:
        publish = lambda state: self._publish_source(source, state)  # noqa: E731
        delay = 1.0
        while True:
            try:
                if hasattr(source, "take_renamed"):
                    await source.run(publish, self._forget_source_node)
                else:
                    await source.run(publish)
                log.warning("source %s stopped unexpectedly", source.name)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("source %s crashed", source.name)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)

    async def _snapshot_sources(self, timeout: float) -> None:
        if not self.sources:
            return
        answers = await asyncio.gather(*(source.poll_once(timeout) for source in self.sources), return_exceptions=True)
        for source, answer in zip(self.sources, answers):
            if isinstance(answer, BaseException):
                log.warning("source %s: snapshot failed: %s", source.name, answer)
                continue
            for state in answer:
                self._publish_source(source, state)

    def _with_source_nodes(self, results: List[NodeState]) -> List[NodeState]:
        """Snapshot results: merged states for the links' nodes, then the nodes only sources know."""
        if not self._source_states:
            return results
        out = [self._states.get(state.name, state) for state in results]
        known = set(self._links)
        out.extend(state for name, state in self._states.items() if name not in known)
        return out

    def source_statuses(self) -> List[Any]:
        """Each source's SourceStatus (state, reason, last refresh)."""
        return [source.status for source in self.sources if hasattr(source, "status")]

    def _with_run(self, totals: FleetTotals) -> FleetTotals:
        if self._slurm_run is None and not self.sources:
            return totals
        lines = tuple((s.name, s.state, s.reason) for s in self.source_statuses())
        job = None
        if self._slurm_run is not None:
            job = self._slurm_run.label + ("  [slurm: %s]" % self._slurm_run.error if self._slurm_run.error else "")
        fields = {f: getattr(totals, f) for f in totals.__dataclass_fields__}
        return RunTotals(job=job, sources=lines, **fields)

    # --- history for sparklines ------------------------------------------------------------------

    async def history(self, node: str, gpu: Optional[int], metric: str, seconds: float) -> List[Tuple[float, float]]:
        """(time, value) pairs of `metric` over the last `seconds`, from the source reporting `node`.

        [] when no source reports it (the console's own rings hold what SSH delivered).
        """
        source = self._node_source.get(node)
        if source is None or not hasattr(source, "history"):
            return []
        return await source.history(node, gpu, metric, seconds)

    # --- nodes joining and leaving ------------------------------------------------------------------

    def add_node(self, name: str, link: Any = None) -> bool:
        """Add node `name` (with `link`, or source-fed when None); False when it is already there."""
        if name in self._states and (link is None or name in self._links):
            return False
        if link is not None:
            self._links[name] = link
        self._states.setdefault(name, NodeState(name=name, since=time.time()))
        if link is not None and self._on_change is not None:
            supervise = getattr(self, "_supervise")
            task = asyncio.create_task(supervise(link), name="link:" + name)
            self._tasks.append(task)
            self._supervised[name] = task
        if self._on_change is not None:
            self._on_change(self._states[name])
        return True

    async def remove_node(self, name: str, reason: str = "removed") -> bool:
        """Drop node `name`: stop its link, forget its states. False when there is no such node."""
        if name not in self._states:
            return False
        link = self._links.pop(name, None)
        task = self._supervised.pop(name, None)
        if task is None:
            task = next((t for t in self._tasks if t.get_name() == "link:" + name and not t.done()), None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if task in self._tasks:
                self._tasks.remove(task)
        if link is not None:
            try:
                await asyncio.wait_for(link.close(), 2.0)
            except Exception:
                log.warning("closing link %s failed", name, exc_info=True)
        last = self._states.pop(name)
        self._source_states.pop(name, None)
        self._link_states.pop(name, None)
        self._node_source.pop(name, None)
        if self._on_change is not None:
            self._on_change(replace(last, state=STATE_DOWN, reason=reason, since=time.time()))
        return True

    # --- Slurm ----------------------------------------------------------------------------------------

    def follow_slurm(self, follower: Any, link_factory: Optional[Callable[[str], Any]] = None) -> None:
        """Follow a SlurmFollower (opsconsole/nodes/slurm.py) from start(); `link_factory(name)` links joiners."""
        self._slurm = follower
        self._link_factory = link_factory
        if follower.current is not None:
            self._slurm_run = follower.current
            self._set_slurm_nodes(follower.current.nodes)

    def _set_slurm_nodes(self, nodes: Iterable[str]) -> None:
        self._slurm_nodes = set(nodes)
        for source in self.sources:
            if hasattr(source, "set_node_filter"):
                source.set_node_filter(self._slurm_nodes)

    def apply_slurm_run(self, run: Any) -> None:
        """Take a new SlurmRun: add the nodes that joined, remove those that left (not on a failed query)."""
        self._slurm_run = run
        if run.error is not None:
            return  # keep the nodes we have: Slurm not answering says nothing about the job
        wanted = list(run.nodes)
        self._set_slurm_nodes(wanted)
        for name in wanted:
            if name not in self._states:
                link = self._link_factory(name) if self._link_factory is not None else None
                self.add_node(name, link)
        for name in [n for n in self._states if n not in self._slurm_nodes]:  # type: ignore[operator]
            task = asyncio.ensure_future(self.remove_node(name, reason="left the Slurm job"))
            self._tasks.append(task)

    @property
    def slurm_run(self) -> Any:
        """The latest SlurmRun (None when no job is followed)."""
        return self._slurm_run


__all__ = ["FleetSources", "RunTotals"]
