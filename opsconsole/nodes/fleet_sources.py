"""The fleet's telemetry sources (issue 8), held by the Fleet (composition): what each reports, merged
with the nodes' links.

- A source (PrometheusSource, built by opsconsole.sources from [[sources]] and given to the Fleet by
  its caller) publishes NodeStates for many nodes. A node no link knows is added to the fleet by it.
- A node seen by a link (SSH) and a source is one node: the link stays the way to act on it; its
  frames come from the source named by `telemetry` ("ssh" or "prometheus"), falling back to the other
  one when the preferred one is not live. A link that needs the user (host key, authentication) shows
  that state whatever the telemetry.

This class keeps the sources' side (their states, the link states they are merged with, which source
reports which node) and runs them; the Fleet keeps the nodes, the links and the listener, and asks it.
With no sources the fleet's only cost is one empty-dict test per published state.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from opsconsole.model import STATE_AUTH, STATE_CONNECTING, STATE_HOSTKEY, NodeState

log = logging.getLogger(__name__)

SourceLine = Tuple[str, str, Optional[str]]  # (source name, state, reason)
RESTART_MAX_S = 60.0  # a source that stops is started again after 1 s, doubling up to this


class FleetSources:
    """The sources of one fleet and the latest state each reported per node (see the module docstring)."""

    def __init__(self, sources: Sequence[Any] = ()) -> None:
        self.sources: List[Any] = list(sources)
        self._source_states: Dict[str, NodeState] = {}  # node -> latest state from a source
        self._link_states: Dict[str, NodeState] = {}  # node -> latest state from its link (when merged)
        self._node_source: Dict[str, Any] = {}  # node -> the source that reports it

    # --- what the sources report -----------------------------------------------------------------

    def reports_any(self) -> bool:
        return bool(self._source_states)

    def reports(self, name: str) -> bool:
        """Whether a source has reported node `name`."""
        return name in self._source_states

    def statuses(self) -> List[Any]:
        """Each source's SourceStatus (state, reason, last refresh)."""
        return [source.status for source in self.sources if hasattr(source, "status")]

    def status_lines(self) -> Tuple[SourceLine, ...]:
        return tuple((s.name, s.state, s.reason) for s in self.statuses())

    async def history(self, node: str, gpu: Optional[int], metric: str, seconds: float) -> List[Tuple[float, float]]:
        """(time, value) pairs of `metric` over the last `seconds` from the source reporting `node`; []
        when none does (the console's own rings hold what SSH delivered)."""
        source = self._node_source.get(node)
        if source is None or not hasattr(source, "history"):
            return []
        return list(await source.history(node, gpu, metric, seconds))

    def set_node_filter(self, nodes: Iterable[str]) -> None:
        """Only `nodes` are wanted (a followed Slurm job's): sources that can filter are told."""
        wanted = set(nodes)
        for source in self.sources:
            if hasattr(source, "set_node_filter"):
                source.set_node_filter(wanted)

    def forget(self, name: str) -> None:
        """Node `name` left the fleet."""
        self._source_states.pop(name, None)
        self._link_states.pop(name, None)
        self._node_source.pop(name, None)

    # --- merging a link's and a source's view of one node ------------------------------------------

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

    def merge_link_state(self, state: NodeState) -> NodeState:
        """A link's new state of a node a source reports too: the node's state to publish."""
        self._link_states[state.name] = state
        return self._merged(state.name)

    def take(self, source: Any, state: NodeState, link_state: Optional[NodeState]) -> NodeState:
        """`source` reported `state`: the node's state to publish. `link_state` is the node's latest state
        when a link has the node (the two are merged), None when only sources know it."""
        name = state.name
        first = name not in self._source_states
        self._source_states[name] = state
        self._node_source.setdefault(name, source)
        if link_state is None:
            return state
        if first:
            self._link_states.setdefault(name, link_state)
        return self._merged(name)

    # --- running ---------------------------------------------------------------------------------

    async def run(
        self,
        source: Any,
        publish: Callable[[Any, NodeState], None],
        renamed: Callable[[str, str], None],
    ) -> None:
        """Run `source` for good: each state to `publish(source, state)`, a node now shown under another
        name to `renamed(old, new)`; restarted with a doubling delay when it stops or crashes."""

        def publish_one(state: NodeState) -> None:
            publish(source, state)

        delay = 1.0
        while True:
            try:
                if hasattr(source, "take_renamed"):
                    await source.run(publish_one, renamed)
                else:
                    await source.run(publish_one)
                log.warning("source %s stopped unexpectedly", source.name)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("source %s crashed", source.name)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX_S)

    async def poll(self, timeout: float) -> List[Tuple[Any, NodeState]]:
        """Every source polled once, concurrently: (source, state) for each node they answered for."""
        if not self.sources:
            return []
        answers = await asyncio.gather(*(source.poll_once(timeout) for source in self.sources), return_exceptions=True)
        out: List[Tuple[Any, NodeState]] = []
        for source, answer in zip(self.sources, answers):
            if isinstance(answer, BaseException):
                log.warning("source %s: snapshot failed: %s", source.name, answer)
                continue
            out.extend((source, state) for state in answer)
        return out


__all__ = ["FleetSources", "SourceLine"]
