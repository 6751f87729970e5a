"""The fleet supervisor: one link per configured node, their states, and one-shot snapshots."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence

from opsconsole.config import Config, NodeConfig
from opsconsole.model import BAD_FRAME, STATE_DOWN, STATE_STALE, STATE_UP, NodeState
from opsconsole.nodes.base import NodeLink
from opsconsole.nodes.fleet_sources import FleetSources  # sources, add/remove nodes, Slurm (issue 8)
from opsconsole.nodes.totals import FleetTotals, totals_of  # noqa: F401  (FleetTotals: imported from here too)

log = logging.getLogger(__name__)

# Extra time the fleet grants a link past the snapshot timeout, so a link's own
# timeout (with its better reason, e.g. "connection refused") wins over ours.
SNAPSHOT_MARGIN_S = 0.25
# How long a cancelled link gets to unwind before the snapshot gives up on it.
CANCEL_GRACE_S = 0.5
# A link that ran at least this long before crashing starts again at the initial delay.
HEALTHY_RUN_S = 60.0
# Young-generation GC threshold per watched node (see tune_gc): about what one node's frames
# leave alive for a few seconds. Never below CPython's default, never above GC_GEN0_MAX.
GC_GEN0_PER_NODE = 40
GC_GEN0_MAX = 50000


def tune_gc(nodes: int) -> int:
    """Raise the young-generation GC threshold for a console watching `nodes` nodes; returns it.

    Every frame is a few dozen objects (a GpuSample per GPU, the host, the frame) that live
    about one interval, until the node's next frame replaces it, and the lazy lists' chains
    grow a few objects per frame until the next keyframe. At CPython's default (700) the
    young generation fills in under a second at 256 nodes, so nearly every frame's objects
    are still alive at a collection, get traversed and promoted for nothing: measured, a
    collection of ~5500 young objects every 0.8 s, 8 % of the console's CPU. A threshold in
    proportion to the nodes lets most of them die first. Cyclic garbage is still collected,
    a little later. Only raises (a threshold set higher by someone else is kept).
    """
    threshold = gc.get_threshold()
    wanted = min(GC_GEN0_MAX, GC_GEN0_PER_NODE * max(0, int(nodes)))
    if wanted > threshold[0]:
        gc.set_threshold(wanted, *threshold[1:])
        return wanted
    return threshold[0]


def build_link(node: NodeConfig, config: Config, login_limiter: Optional[asyncio.Semaphore]) -> NodeLink:
    """The link that reaches `node`: the in-process probe for the local node, SSH otherwise."""
    interval = config.console.interval
    disk_paths = config.health.disk_paths
    if node.local:
        from opsconsole.nodes.local import LocalLink

        return LocalLink(node, interval=interval, disk_paths=disk_paths)
    # Imported here so a local-only console never loads asyncssh.
    from opsconsole.nodes.ssh import SshLink

    return SshLink(node, config.ssh, interval, login_limiter=login_limiter, disk_paths=disk_paths)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


class Fleet(FleetSources):
    """Runs one link per node, keeps each node's latest NodeState, and survives link crashes.

    Every node is present from the start (state `connecting`), in config order. A link
    whose `run` raises (or returns) is reported `down` with the error and restarted after
    a delay that doubles up to `ssh.backoff_max`. A node that stays `up` without a new
    frame for `stale_after` seconds is marked `stale` (its last frame is kept).
    """

    def __init__(
        self,
        config: Config,
        links: Optional[Sequence[NodeLink]] = None,
        stale_after: Optional[float] = None,
        sources: Optional[Sequence[Any]] = None,
    ) -> None:
        self.config = config
        if links is None:
            # One semaphore for the whole fleet: sshd's MaxStartups drops logins beyond ~10 in flight.
            limiter = asyncio.Semaphore(config.ssh.max_logins)
            links = [build_link(node, config, limiter) for node in config.nodes]
        self._links: Dict[str, NodeLink] = {}
        for link in links:
            if link.name in self._links:
                raise ValueError("two nodes are named %r" % link.name)
            self._links[link.name] = link
        interval = config.console.interval
        self.stale_after = stale_after if stale_after is not None else 3 * interval + 2.0
        now = time.time()
        self._states: Dict[str, NodeState] = {name: NodeState(name=name, since=now) for name in self._links}
        self._tasks: List[asyncio.Task] = []
        self._on_change: Optional[Callable[[NodeState], None]] = None
        self._init_sources(config, sources)  # Prometheus sources and Slurm following (issue 8)

    # --- reading ---------------------------------------------------------

    def states(self) -> Dict[str, NodeState]:
        """The latest state of every node, by name, in config order (a copy)."""
        return dict(self._states)

    def link(self, name: str) -> NodeLink:
        """The link of node `name` (KeyError when there is none)."""
        return self._links[name]

    @property
    def names(self) -> List[str]:
        return list(self._links)

    def totals(self, now: float) -> FleetTotals:
        """Node and GPU counts over the current states; a live node gone quiet counts as down."""
        return self._with_run(totals_of(self._states.values(), now, self.stale_after))

    def _is_quiet(self, state: NodeState, now: float) -> bool:
        age = state.age(now)
        return age is not None and age > self.stale_after

    # --- running ---------------------------------------------------------

    def _publish(self, state: NodeState) -> None:
        if state.name not in self._states:
            return  # a link publishing under a name it was not given: ignore, don't grow the table
        if self._source_states and state.name in self._source_states:
            state = self._merge_link_state(state)  # a node a source reports too: one node
        self._states[state.name] = state
        if self._on_change is not None:
            try:
                self._on_change(state)
            except Exception:  # a broken listener must not take a link down with it
                log.exception("on_change failed for %s", state.name)

    async def start(self, on_change: Callable[[NodeState], None]) -> None:
        """Start one supervised task per link; `on_change` gets every published state, in the loop."""
        if self._tasks:
            raise RuntimeError("fleet already started")
        self._on_change = on_change
        tune_gc(len(self._links))
        for link in self._links.values():
            self._tasks.append(asyncio.create_task(self._supervise(link), name="link:" + link.name))
        self._tasks.append(asyncio.create_task(self._watch_staleness(), name="fleet:staleness"))
        self._start_sources()

    async def _supervise(self, link: NodeLink) -> None:
        backoff = self.config.ssh
        delay = backoff.backoff_initial
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await link.run(self._publish)
                reason = "link stopped unexpectedly"
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("link %s crashed", link.name, exc_info=True)
                reason = "link crashed: " + _describe(exc)
            if loop.time() - started >= HEALTHY_RUN_S:
                delay = backoff.backoff_initial
            self._publish(self._down(link.name, "%s (restarting in %g s)" % (reason, delay)))
            try:
                await link.close()
            except Exception:
                log.warning("closing crashed link %s failed", link.name, exc_info=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, backoff.backoff_max)

    async def _watch_staleness(self) -> None:
        # A link that stops delivering without noticing (a hung probe) still shows its age.
        period = max(0.5, min(self.stale_after / 2, self.config.console.interval))
        while True:
            await asyncio.sleep(period)
            now = time.time()
            quiet_before = now - self.stale_after  # _is_quiet, without a call per node per period
            for state in list(self._states.values()):
                if state.state == STATE_UP and state.received_at is not None and state.received_at < quiet_before:
                    reason = "no frame for %.0f s" % state.age(now)
                    if state.reason is not None and state.reason.startswith(BAD_FRAME):  # frames come, but bad ones
                        reason = "%s (no good frame for %.0f s)" % (state.reason, state.age(now))
                    self._publish(replace(state, state=STATE_STALE, reason=reason, since=now))

    def _down(self, name: str, reason: str) -> NodeState:
        previous = self._states[name]
        since = previous.since if previous.state == STATE_DOWN else time.time()
        return replace(previous, state=STATE_DOWN, reason=reason, since=since)

    async def stop(self) -> None:
        """Cancel every link task and close every link. Safe to call more than once."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(self._close(link) for link in self._links.values()))
        self._on_change = None

    async def _close(self, link: NodeLink) -> None:
        try:
            await asyncio.wait_for(link.close(), CANCEL_GRACE_S * 4)
        except Exception:
            log.warning("closing link %s failed", link.name, exc_info=True)

    async def retry(self, name: str) -> bool:
        """Ask node `name`'s link to try again now (auth/hostkey nodes wait for this); False if it can't."""
        retry = getattr(self._links[name], "retry", None)
        if retry is None:
            return False
        outcome = retry()
        if asyncio.iscoroutine(outcome) or isinstance(outcome, asyncio.Future):
            await outcome
        return True

    # --- one-shot --------------------------------------------------------

    async def snapshot(self, timeout: float) -> List[NodeState]:
        """Poll every node once, concurrently; returns within `timeout` plus a small margin.

        A node with no answer in time is reported `down` ("no answer within N s"), a
        link that raises is reported `down` with its error. Results are in config order.
        """
        tasks = {
            name: asyncio.create_task(link.poll_once(timeout), name="poll:" + name)
            for name, link in self._links.items()
        }
        from_sources = asyncio.create_task(self._snapshot_sources(timeout), name="poll:sources")
        if tasks:
            await asyncio.wait(tasks.values(), timeout=timeout + SNAPSHOT_MARGIN_S)
        late = [task for task in tasks.values() if not task.done()]
        for task in late:
            task.cancel()
        if late:
            # A link that swallows cancellation must not hold the snapshot past its deadline.
            await asyncio.wait(late, timeout=CANCEL_GRACE_S)
        results = []
        for name, task in tasks.items():
            if task.done() and not task.cancelled() and task.exception() is None:
                state = task.result()
            elif task.done() and not task.cancelled():
                state = self._down(name, "poll failed: " + _describe(task.exception()))
            else:
                task.add_done_callback(_discard_result)
                state = self._down(name, "no answer within %g s" % timeout)
            self._publish(state)
            results.append(state)
        await from_sources
        return self._with_source_nodes(results)


def _discard_result(task: asyncio.Task) -> None:
    # Retrieve the outcome of a task we gave up on, so asyncio does not log it as never retrieved.
    if not task.cancelled():
        task.exception()


__all__ = ["Fleet", "FleetTotals", "build_link", "tune_gc"]
