"""The fleet supervisor: one link per configured node, their states, and one-shot snapshots.

Beside the links (issue 8): the telemetry sources its caller gives it (FleetSources: what they report,
merged with the links), nodes joining and leaving (add_node, remove_node), and Slurm following
(follow_slurm: the nodes of a job, which join and leave with it; the header shows the job).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from opsconsole.config import Config, NodeConfig
from opsconsole.model import BAD_FRAME, STATE_DOWN, STATE_STALE, STATE_UP, NodeState
from opsconsole.nodes.base import NodeLink
from opsconsole.nodes.fleet_sources import FleetSources
from opsconsole.nodes.totals import FleetTotals, RunTotals, totals_of
from opsconsole.units import format_frame_age

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


class Fleet:
    """Runs one link per node, keeps each node's latest NodeState, and survives link crashes.

    Every node is present from the start (state `connecting`), in config order. A link
    whose `run` raises (or returns) is reported `down` with the error and restarted after
    a delay that doubles up to `ssh.backoff_max`. A node that stays `up` without a new
    frame for `stale_after` seconds is marked `stale` (its last frame is kept).

    `sources`: telemetry sources built by the caller (opsconsole.sources.build_sources for the
    config's [[sources]]; opsconsole.sources.fleet_with_sources does both); none by default.
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
        self._sources = FleetSources(sources or ())
        self._supervised: Dict[str, asyncio.Task] = {}  # link tasks of nodes added after the start
        self._slurm: Any = None
        self._slurm_run: Any = None
        self._slurm_nodes: Optional[Set[str]] = None
        self._link_factory: Optional[Callable[[str], Any]] = None

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

    @property
    def sources(self) -> List[Any]:
        """The telemetry sources this fleet was given."""
        return self._sources.sources

    def totals(self, now: float) -> FleetTotals:
        """Node and GPU counts over the current states; a live node gone quiet counts as down; with the
        followed Slurm job and the sources' states when there are (RunTotals)."""
        totals = totals_of(self._states.values(), now, self.stale_after)
        if self._slurm_run is None and not self._sources.sources:
            return totals
        job = None
        if self._slurm_run is not None:
            label_at = getattr(self._slurm_run, "label_at", None)
            label = label_at(now) if label_at is not None else self._slurm_run.label
            job = label + ("  [slurm: %s]" % self._slurm_run.error if self._slurm_run.error else "")
        fields = {f: getattr(totals, f) for f in totals.__dataclass_fields__}
        return RunTotals(job=job, sources=self._sources.status_lines(), **fields)

    def source_statuses(self) -> List[Any]:
        """Each source's SourceStatus (state, reason, last refresh)."""
        return self._sources.statuses()

    async def history(self, node: str, gpu: Optional[int], metric: str, seconds: float) -> List[Tuple[float, float]]:
        """(time, value) pairs of `metric` over the last `seconds`, from the source reporting `node`.

        [] when no source reports it (the console's own rings hold what SSH delivered).
        """
        return await self._sources.history(node, gpu, metric, seconds)

    def _is_quiet(self, state: NodeState, now: float) -> bool:
        age = state.age(now)
        return age is not None and age > self.stale_after

    # --- running ---------------------------------------------------------

    def _publish(self, state: NodeState) -> None:
        if state.name not in self._states:
            return  # a link publishing under a name it was not given: ignore, don't grow the table
        if self._sources.reports_any() and self._sources.reports(state.name):
            state = self._sources.merge_link_state(state)  # a node a source reports too: one node
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
            # A first poll that has finished already (the local node's, started while Textual
            # loaded) is published now: the first screen is drawn with it.
            take = getattr(link, "take_finished_first_poll", None)
            state = take() if take is not None else None
            if state is not None:
                self._publish(state)
        for link in self._links.values():
            self._tasks.append(asyncio.create_task(self._supervise(link), name="link:" + link.name))
        self._tasks.append(asyncio.create_task(self._watch_staleness(), name="fleet:staleness"))
        for source in self._sources.sources:
            run = self._sources.run(source, self._publish_source, self._forget_source_node)
            self._tasks.append(asyncio.create_task(run, name="source:" + source.name))
        if self._slurm is not None:
            self._tasks.append(asyncio.create_task(self._slurm.follow(self.apply_slurm_run), name="slurm"))

    def _publish_source(self, source: Any, state: NodeState) -> None:
        name = state.name
        if self._slurm_nodes is not None and name not in self._slurm_nodes:
            return  # not (or no longer) a node of the followed job
        state = self._sources.take(source, state, self._states[name] if name in self._links else None)
        self._states[name] = state
        if self._on_change is not None:
            try:
                self._on_change(state)
            except Exception:  # a broken listener must not take the source down with it
                log.exception("on_change failed for %s", name)

    def _forget_source_node(self, old: str, new: str) -> None:
        """A source now shows node `old` as part of `new` (the same host): drop `old` unless a link has it."""
        if old in self._links or not self._sources.reports(old):
            return
        self._tasks.append(asyncio.ensure_future(self.remove_node(old, reason="now shown as %s (the same host)" % new)))

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
                    reason = "no frame for %s" % format_frame_age(state.age(now))
                    if state.reason is not None and state.reason.startswith(BAD_FRAME):  # frames come, but bad ones
                        reason = "%s (no good frame for %s)" % (state.reason, format_frame_age(state.age(now)))
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

    async def _snapshot_sources(self, timeout: float) -> None:
        for source, state in await self._sources.poll(timeout):
            self._publish_source(source, state)

    def _with_source_nodes(self, results: List[NodeState]) -> List[NodeState]:
        """Snapshot results: merged states for the links' nodes, then the nodes only sources know."""
        if not self._sources.reports_any():
            return results
        out = [self._states.get(state.name, state) for state in results]
        known = set(self._links)
        out.extend(state for name, state in self._states.items() if name not in known)
        return out

    # --- nodes joining and leaving ---------------------------------------------------------

    def add_node(self, name: str, link: Optional[NodeLink] = None) -> bool:
        """Add node `name` (with `link`, or source-fed when None); False when it is already there."""
        if name in self._states and (link is None or name in self._links):
            return False
        if link is not None:
            self._links[name] = link
        self._states.setdefault(name, NodeState(name=name, since=time.time()))
        if link is not None and self._on_change is not None:
            task = asyncio.create_task(self._supervise(link), name="link:" + name)
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
        self._sources.forget(name)
        if self._on_change is not None:
            self._on_change(replace(last, state=STATE_DOWN, reason=reason, since=time.time()))
        return True

    # --- Slurm -----------------------------------------------------------------------------

    def follow_slurm(self, follower: Any, link_factory: Optional[Callable[[str], Any]] = None) -> None:
        """Follow a SlurmFollower (opsconsole/nodes/slurm.py) from start(); `link_factory(name)` links joiners."""
        self._slurm = follower
        self._link_factory = link_factory
        if follower.current is not None:
            self._slurm_run = follower.current
            self._set_slurm_nodes(follower.current.nodes)

    def _set_slurm_nodes(self, nodes: Iterable[str]) -> None:
        self._slurm_nodes = set(nodes)
        self._sources.set_node_filter(self._slurm_nodes)

    def apply_slurm_run(self, run: Any) -> None:
        """Take a new SlurmRun: add the nodes that joined, remove those that left (not on a failed query)."""
        self._slurm_run = run
        if run.error is not None:
            return  # keep the nodes we have: Slurm not answering says nothing about the job
        wanted = set(run.nodes)
        self._set_slurm_nodes(wanted)
        for name in run.nodes:
            if name not in self._states:
                link = self._link_factory(name) if self._link_factory is not None else None
                self.add_node(name, link)
        for name in [n for n in self._states if n not in wanted]:
            task = asyncio.ensure_future(self.remove_node(name, reason="left the Slurm job"))
            self._tasks.append(task)

    @property
    def slurm_run(self) -> Any:
        """The latest SlurmRun (None when no job is followed)."""
        return self._slurm_run


def _discard_result(task: asyncio.Task) -> None:
    # Retrieve the outcome of a task we gave up on, so asyncio does not log it as never retrieved.
    if not task.cancelled():
        task.exception()


__all__ = ["Fleet", "FleetTotals", "RunTotals", "build_link", "tune_gc"]
