"""The fleet supervisor with fake links: hangs, crashes, order, staleness and totals."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import List, Optional

import pytest

from opsconsole.config import DEFAULT_CONFIG, Config, ConsoleConfig, NodeConfig, SshConfig
from opsconsole.model import (
    STATE_CONNECTING,
    STATE_DOWN,
    STATE_STALE,
    STATE_UP,
    GpuSample,
    NodeFrame,
    NodeState,
)
from opsconsole.nodes.base import NodeLink
from opsconsole.nodes.fleet import Fleet
from opsconsole.nodes.local import LocalLink
from tests.waiting import wait_for

GUARD_S = 20.0  # only so a broken fleet fails the test instead of hanging it


def make_frame(name: str, utilizations: List[Optional[float]], seq: int = 1) -> NodeFrame:
    gpus = tuple(GpuSample(index=i, name="NVIDIA H200", utilization_gpu=u) for i, u in enumerate(utilizations))
    return NodeFrame(node=name, time=time.time(), seq=seq, gpus=gpus, gpu_source="nvml")


class FakeLink(NodeLink):
    """A link whose behaviour is chosen per test: answer, hang, raise, or answer late."""

    def __init__(self, name, behaviour="answer", utilizations=(50.0,), delay=0.0):
        self.name = name
        self.behaviour = behaviour
        self.utilizations = list(utilizations)
        self.delay = delay
        self.runs = 0
        self.closed = 0
        self.seq = 0
        self.release = asyncio.Event()

    def _up(self) -> NodeState:
        self.seq += 1
        return NodeState(
            name=self.name,
            state=STATE_UP,
            frame=make_frame(self.name, self.utilizations, self.seq),
            received_at=time.time(),
            since=time.time(),
        )

    async def poll_once(self, timeout):
        if self.behaviour == "hang":
            await self.release.wait()
        if self.behaviour == "stubborn":  # ignores cancellation for a while, as a buggy link might
            while not self.release.is_set():
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    continue
        if self.behaviour == "raise":
            raise RuntimeError("probe exploded")
        await asyncio.sleep(self.delay)
        return self._up()

    async def run(self, publish):
        self.runs += 1
        if self.behaviour == "crash":
            publish(self._up())
            raise RuntimeError("boom on run %d" % self.runs)
        if self.behaviour == "once":
            publish(self._up())
            await self.release.wait()
        while True:
            publish(self._up())
            await asyncio.sleep(0.01)

    async def close(self):
        self.closed += 1


def fast_config(names, interval=0.05) -> Config:
    return Config(
        console=ConsoleConfig(interval=interval),
        nodes=tuple(NodeConfig(name=n, host=n) for n in names),
        ssh=SshConfig(backoff_initial=0.01, backoff_max=0.05),
    )


SNAPSHOT_CASES = [
    # (behaviours, expected state per node, reason fragment per node)
    (["answer", "answer"], [STATE_UP, STATE_UP], [None, None]),
    (["answer", "hang", "answer"], [STATE_UP, STATE_DOWN, STATE_UP], [None, "no answer within", None]),
    (["raise", "answer"], [STATE_DOWN, STATE_UP], ["RuntimeError: probe exploded", None]),
    (["stubborn", "answer"], [STATE_DOWN, STATE_UP], ["no answer within", None]),
]


@pytest.mark.parametrize("behaviours,expected,reasons", SNAPSHOT_CASES)
async def test_snapshot_reports_every_node_even_when_some_hang_or_raise(behaviours, expected, reasons):
    names = ["n%d" % i for i in range(len(behaviours))]
    links = [FakeLink(n, b) for n, b in zip(names, behaviours)]
    fleet = Fleet(fast_config(names), links=links)
    results = await asyncio.wait_for(fleet.snapshot(timeout=0.3), GUARD_S)
    assert [s.name for s in results] == names
    assert [s.state for s in results] == expected
    for state, fragment in zip(results, reasons):
        if fragment is None:
            assert state.reason is None and state.frame is not None
        else:
            assert fragment in state.reason
    assert fleet.states() == {s.name: s for s in results}
    for link in links:
        link.release.set()
    await fleet.stop()


async def test_snapshot_keeps_config_order_when_answers_arrive_in_reverse():
    names = ["a", "b", "c", "d"]
    links = [FakeLink(n, delay=0.02 * (len(names) - i)) for i, n in enumerate(names)]
    fleet = Fleet(fast_config(names), links=links)
    results = await fleet.snapshot(timeout=5)
    assert [s.name for s in results] == names
    assert list(fleet.states()) == names
    await fleet.stop()


async def test_every_node_is_present_and_connecting_before_start():
    names = ["z", "a", "m"]
    fleet = Fleet(fast_config(names), links=[FakeLink(n) for n in names])
    states = fleet.states()
    assert list(states) == names
    assert {s.state for s in states.values()} == {STATE_CONNECTING}


async def test_a_crashing_link_is_reported_down_and_restarted_while_others_keep_running():
    names = ["good", "bad"]
    good, bad = FakeLink("good"), FakeLink("bad", "crash")
    fleet = Fleet(fast_config(names), links=[good, bad])
    seen: List[NodeState] = []
    await fleet.start(seen.append)
    await wait_for(lambda: bad.runs >= 3, "the crashed link restarted twice")
    downs = [s for s in seen if s.name == "bad" and s.state == STATE_DOWN]
    assert downs and "link crashed: RuntimeError: boom on run" in downs[0].reason
    assert downs[0].frame is not None  # the last good frame survives the crash
    assert bad.closed >= 2
    await wait_for(lambda: good.seq > 5, "the good link kept publishing")
    assert fleet.states()["good"].state == STATE_UP
    await fleet.stop()
    runs = bad.runs
    await asyncio.sleep(0.1)
    assert bad.runs == runs  # stopped means no more restarts


async def test_a_listener_that_raises_does_not_stop_the_link():
    link = FakeLink("n0")
    fleet = Fleet(fast_config(["n0"]), links=[link])
    calls = []

    def broken_listener(state):
        calls.append(state)
        raise ValueError("listener bug")

    await fleet.start(broken_listener)
    await wait_for(lambda: len(calls) > 3, "the link kept publishing")
    assert link.runs == 1
    await fleet.stop()


async def test_a_node_that_goes_quiet_turns_stale_keeping_its_frame():
    link = FakeLink("quiet", "once")
    fleet = Fleet(fast_config(["quiet"]), links=[link], stale_after=0.2)
    await fleet.start(lambda s: None)
    await wait_for(lambda: fleet.states()["quiet"].state == STATE_STALE, "the node turned stale")
    state = fleet.states()["quiet"]
    assert state.frame is not None and "no frame for" in state.reason
    link.release.set()
    await fleet.stop()


async def test_totals_count_live_nodes_gpus_and_mean_utilization():
    utilizations = {"a": [100.0, 50.0, None], "b": [10.0], "c": [90.0]}
    links = [FakeLink(n, utilizations=u) for n, u in utilizations.items()] + [FakeLink("d", "raise")]
    fleet = Fleet(fast_config(list(utilizations) + ["d"]), links=links)
    await fleet.snapshot(timeout=5)
    now = time.time()
    totals = fleet.totals(now)
    reported = [u for us in utilizations.values() for u in us if u is not None]
    assert totals.nodes == 4
    assert totals.nodes_up == 3 and totals.nodes_down == 1 and totals.nodes_connecting == 0
    assert totals.gpus == sum(len(us) for us in utilizations.values())
    assert totals.mean_utilization == pytest.approx(sum(reported) / len(reported))
    assert totals.alerts == 0
    # A live node whose last frame is older than stale_after no longer counts as up.
    later = fleet.totals(now + fleet.stale_after + 1)
    assert later.nodes_up == 0 and later.gpus == 0 and later.mean_utilization is None


async def test_totals_of_a_fleet_that_never_polled():
    fleet = Fleet(fast_config(["a", "b"]), links=[FakeLink("a"), FakeLink("b")])
    totals = fleet.totals(time.time())
    # Not polled yet: connecting, not down (the header said "down 2" before the first frame).
    assert (totals.nodes, totals.nodes_up, totals.nodes_connecting, totals.nodes_down, totals.gpus) == (2, 0, 2, 0, 0)
    assert totals.mean_utilization is None


def test_default_config_builds_a_local_link():
    fleet = Fleet(DEFAULT_CONFIG)
    assert isinstance(fleet.link("local"), LocalLink)
    with pytest.raises(KeyError):
        fleet.link("nope")


def test_ssh_nodes_get_ssh_links_sharing_one_login_limiter():
    ssh = pytest.importorskip("opsconsole.nodes.ssh")
    config = replace(fast_config(["a", "b"]), nodes=(NodeConfig("a", host="a"), NodeConfig("b", host="b")))
    fleet = Fleet(config)
    links = [fleet.link("a"), fleet.link("b")]
    assert all(isinstance(link, ssh.SshLink) for link in links)
    assert all(link._limiter is not None for link in links)
    limiters = {id(link._limiter) for link in links}
    assert len(limiters) == 1


def test_two_nodes_with_one_name_are_refused():
    with pytest.raises(ValueError, match="two nodes are named"):
        Fleet(fast_config(["x"]), links=[FakeLink("x"), FakeLink("x")])


async def test_retry_reaches_links_that_can_retry_and_says_so_for_others():
    class RetryingLink(FakeLink):
        retried = 0

        def retry(self):
            self.retried += 1

    retrying, plain = RetryingLink("r"), FakeLink("p")
    fleet = Fleet(fast_config(["r", "p"]), links=[retrying, plain])
    assert await fleet.retry("r") is True and retrying.retried == 1
    assert await fleet.retry("p") is False


async def test_a_started_fleet_of_the_default_config_streams_the_local_node():
    config = replace(DEFAULT_CONFIG, console=ConsoleConfig(interval=0.05))
    fleet = Fleet(config)
    seen: List[NodeState] = []
    await fleet.start(seen.append)
    await wait_for(lambda: len([s for s in seen if s.state == STATE_UP]) >= 3, "three local frames")
    await fleet.stop()
    assert fleet.states()["local"].frame.host.cpu_count > 0
    totals = fleet.totals(fleet.states()["local"].received_at)
    assert totals.nodes == 1 and totals.nodes_up == 1


def test_tune_gc_raises_the_young_threshold_with_the_fleet_and_never_lowers_it():
    import gc

    from opsconsole.nodes.fleet import GC_GEN0_MAX, tune_gc

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert tune_gc(4) == 700  # a small console keeps CPython's default
        assert tune_gc(256) == gc.get_threshold()[0] > 700
        assert gc.get_threshold()[1:] == (10, 10)
        assert tune_gc(8) == gc.get_threshold()[0] > 700  # not lowered
        gc.set_threshold(700, 10, 10)
        assert tune_gc(10**6) == GC_GEN0_MAX
    finally:
        gc.set_threshold(*saved)
