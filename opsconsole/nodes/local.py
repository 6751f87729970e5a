"""The local node: the probe run in-process, in a worker thread, one poll at a time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Tuple

from opsconsole.config import NodeConfig
from opsconsole.launch_trace import mark
from opsconsole.model import BAD_FRAME, STATE_DOWN, STATE_UP, FrameError, NodeState, checked_after, replace_decoded
from opsconsole.nodes.base import COMMANDS_HERE, NodeLink, Publish

if TYPE_CHECKING:
    from opsconsole.model import NodeStateName

ProbeFactory = Callable[[], Any]  # returns an object with poll() -> NodeFrame


def _default_probe_factory(node_name: str, disk_paths: Sequence[str]) -> ProbeFactory:
    def make() -> Any:
        # Imported here: the probe pulls in pynvml/psutil, which `opsconsole --help` should not pay for.
        from opsconsole.probe.agent import Probe

        return Probe(node_name=node_name, disk_paths=tuple(disk_paths))

    return make


async def run_in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` in a fresh daemon thread and await its result.

    Not `asyncio.to_thread`: the default executor's threads are joined when the
    interpreter exits, so one probe hung in a driver call would keep
    `opsconsole snapshot` from exiting after its timeout. A daemon thread does not.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future = loop.create_future()

    def settle(result: Any, error: Optional[BaseException]) -> None:
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def work() -> None:
        try:
            result, error = fn(), None
        except BaseException as exc:  # handed to the awaiting task, which decides
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop closed while we ran: nobody is waiting any more

    threading.Thread(target=work, name="opsconsole-probe", daemon=True).start()
    return await future


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


class LocalLink(NodeLink):
    """Polls the machine the console runs on with the in-process probe.

    A poll runs in a worker thread so NVML never blocks the event loop.
    The next poll is armed only after the last one finished (as dolphie does), so polls
    never overlap: a probe slower than the interval just lowers the rate. A probe that
    raises turns the node `down` with the reason, and the next interval tries again.
    """

    commands_run = COMMANDS_HERE

    def __init__(
        self,
        node: NodeConfig,
        interval: float,
        disk_paths: Sequence[str] = ("/",),
        probe_factory: Optional[ProbeFactory] = None,
    ) -> None:
        self.name = node.name
        self.interval = interval
        self._make_probe = probe_factory or _default_probe_factory(node.name, disk_paths)
        self._probe: Any = None
        # Held by the worker thread for the whole poll: even when an awaiting task is
        # cancelled (its thread keeps running), a second poll waits for the first.
        self._probe_lock = threading.Lock()
        self._state = NodeState(name=node.name, address="local", since=time.time())
        self._first_poll: Optional[concurrent.futures.Future] = None  # started before the loop (start_first_poll)
        self._first_taken_at: Optional[float] = None  # when the fleet took its state (take_finished_first_poll)
        self._last_checked: Any = None  # the last frame that passed its checks (under _probe_lock)
        # Every how many polls the host's process list is read afresh; between, a frame carries the
        # last one read. The console sets it above 1 while no pane shows host processes and nothing
        # records (host processes are the probe's costliest part on a GPU node after NVML).
        self.host_processes_every = 1
        self._polls = 0

    def start_first_poll(self) -> None:
        """Take the first poll now, in a daemon thread, before any event loop runs: the console calls
        this before it imports Textual, so loading the probe, NVML's start (C calls that release the
        GIL) and the first process listing overlap the console's own start. The first `_poll` takes
        its result, checked like any other."""
        if self._first_poll is not None:
            return
        future: concurrent.futures.Future = concurrent.futures.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return  # the first _poll was cancelled before the thread ran
            # The lock is held from the poll through the baseline: a next poll (a snapshot's, or
            # the loop's under load) waits for the baseline, so its process list has CPU %.
            with self._probe_lock:
                try:
                    result = self._poll_locked(first=True)
                    mark("first poll done")
                    future.set_result(result)
                except BaseException as exc:  # handed to the first _poll, which decides
                    future.set_exception(exc)
                    return
                # Off the first screen's path (its frame is handed over already): the process
                # list's CPU baseline.
                prime = getattr(self._probe, "prime_processes", None)
                if prime is not None:
                    prime()

        self._first_poll = future
        threading.Thread(target=work, name="opsconsole-probe", daemon=True).start()

    @property
    def state(self) -> NodeState:
        """The last state this link produced."""
        return self._state

    def _poll_in_thread(self, first: bool = False) -> Tuple[Any, Optional[BaseException]]:
        """A poll and the wire's checks of its frame, both in the probe's thread: checking a few
        hundred processes costs milliseconds the console's loop would otherwise spend.

        `first`: the console's first frame, taken while Textual loads (same GIL): GPUs, host and
        GPU processes only. The host's process list (no CPU % on a first sample anyway; a user and
        command line read per process) comes with the next poll."""
        with self._probe_lock:
            return self._poll_locked(first)

    def _poll_locked(self, first: bool) -> Tuple[Any, Optional[BaseException]]:
        """_poll_in_thread's work, the probe lock held."""
        if self._probe is None:
            self._probe = self._make_probe()
        quick = hasattr(self._probe, "prime_processes")
        if first and quick:
            frame = self._probe.poll(host_processes=False)
        elif quick and self._keeps_host_processes():
            frame = self._probe.poll(host_processes=False)
            frame = replace_decoded(frame, {"top_processes": self._last_checked.top_processes})
        else:
            frame = self._probe.poll()
        if not first:
            self._polls += 1
        try:
            # The frame checks the wire gets: what the panes and snapshot read must hold its types.
            # Rows the probe handed back unchanged since the last good frame are not checked again.
            checked_after(frame, self._last_checked)
        except Exception as exc:
            return frame, exc
        self._last_checked = frame
        return frame, None

    def _keeps_host_processes(self) -> bool:
        """Whether this poll carries the last host process list instead of reading it (see
        host_processes_every): never the first regular poll, nor while every poll reads it."""
        every = self.host_processes_every
        last = self._last_checked
        return every > 1 and self._polls % every != 0 and last is not None and bool(last.top_processes)

    def take_finished_first_poll(self) -> Optional[NodeState]:
        """The first poll's state when its thread has finished already (None while it runs: the
        link's task takes it as before). The fleet takes it when it starts, before any task has run,
        so the console's first screen is drawn with the frame: otherwise it was drawn empty first
        (a full layout and render) and again once the task had run. The link's loop then polls
        next an interval after this."""
        first = self._first_poll
        if first is None or not first.done():
            return None
        self._first_poll = None
        self._first_taken_at = time.monotonic()
        try:
            frame, problem = first.result()
        except Exception as exc:  # the probe's failure is the node's state, not a crash
            return self._enter(STATE_DOWN, reason="probe failed: " + _describe(exc))
        return self._state_of(frame, problem)

    async def _poll(self) -> NodeState:
        """One probe poll turned into a NodeState (never raises, except on cancellation)."""
        first, self._first_poll = self._first_poll, None
        try:
            if first is not None:
                frame, problem = await asyncio.wrap_future(first)
            else:
                frame, problem = await run_in_daemon_thread(self._poll_in_thread)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the probe's failure is the node's state, not a crash
            return self._enter(STATE_DOWN, reason="probe failed: " + _describe(exc))
        return self._state_of(frame, problem)

    def _state_of(self, frame: Any, problem: Optional[BaseException]) -> NodeState:
        """A poll's frame and its checks' verdict as the node's state."""
        if isinstance(problem, FrameError):
            # The last good frame stays; a node never up yet is down.
            state: NodeStateName = STATE_UP if self._state.state == STATE_UP else STATE_DOWN
            return self._enter(state, reason=BAD_FRAME + str(problem))
        if problem is not None:  # not even a frame
            return self._enter(STATE_DOWN, reason="%snot a frame: %s" % (BAD_FRAME, _describe(problem)))
        now = time.time()
        return self._enter(STATE_UP, reason=None, frame=frame, received_at=now)

    def _enter(self, state: NodeStateName, reason: Optional[str], **fields: Any) -> NodeState:
        now = time.time()
        since = self._state.since if self._state.state == state else now
        self._state = replace(self._state, state=state, reason=reason, since=since, rtt_ms=None, **fields)
        return self._state

    async def run(self, publish: Publish) -> None:
        """Poll every `interval` seconds until cancelled, publishing each result."""
        loop = asyncio.get_running_loop()
        taken_at, self._first_taken_at = self._first_taken_at, None
        if taken_at is not None:  # the first poll's state was published when the fleet started
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - taken_at)))
        while True:
            started = loop.time()
            publish(await self._poll())
            # Armed after the poll finished: keep the cadence, never start two at once.
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))

    async def poll_once(self, timeout: float) -> NodeState:
        """One poll, or `down` when the probe gives no answer within `timeout` seconds."""
        try:
            return await asyncio.wait_for(self._poll(), timeout)
        except asyncio.TimeoutError:
            return self._enter(STATE_DOWN, reason="no answer within %g s" % timeout)

    async def close(self) -> None:
        """Nothing to release: the probe holds no connection (NVML stays initialised)."""
