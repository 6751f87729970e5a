"""LocalLink polling this machine with the real probe: frames, sequence, no overlapping polls."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import List

import pytest

from opsconsole.config import NodeConfig
from opsconsole.model import STATE_DOWN, STATE_UP, NodeFrame, NodeState
from opsconsole.nodes.local import LocalLink

GUARD_S = 30.0  # only so a broken link fails the test instead of hanging it


def real_probe():
    from opsconsole.probe.agent import Probe

    return Probe(node_name="local", disk_paths=("/",))


class SlowProbe:
    """The real probe, slowed down past the interval, counting how many polls run at once."""

    def __init__(self, delay: float):
        self.inner = real_probe()
        self.delay = delay
        self.running = 0
        self.most_at_once = 0
        self.polls = 0
        self._lock = threading.Lock()

    def poll(self) -> NodeFrame:
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            time.sleep(self.delay)
            return self.inner.poll()
        finally:
            with self._lock:
                self.running -= 1
                self.polls += 1


class FlakyProbe:
    """Raises on the polls listed in `fail_on` (1-based), otherwise polls for real."""

    def __init__(self, fail_on):
        self.inner = real_probe()
        self.fail_on = set(fail_on)
        self.calls = 0

    def poll(self) -> NodeFrame:
        self.calls += 1
        if self.calls in self.fail_on:
            raise OSError("NVML: driver/library version mismatch")
        return self.inner.poll()


async def collect(link: LocalLink, count: int) -> List[NodeState]:
    seen: List[NodeState] = []
    done = asyncio.Event()

    def publish(state: NodeState) -> None:
        seen.append(state)
        if len(seen) >= count:
            done.set()

    task = asyncio.create_task(link.run(publish))
    try:
        await asyncio.wait_for(done.wait(), GUARD_S)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return seen


async def test_run_publishes_real_frames_of_this_machine_with_increasing_seq():
    link = LocalLink(NodeConfig(name="local", local=True), interval=0.05)
    states = await collect(link, 4)
    assert all(s.state == STATE_UP and s.reason is None and s.rtt_ms is None for s in states)
    frames = [s.frame for s in states]
    assert frames[0].host is not None and frames[0].host.hostname == socket.gethostname()
    assert frames[0].host.cpu_count > 0 and frames[0].host.mem_total > 0
    seqs = [f.seq for f in frames]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    received = [s.received_at for s in states]
    assert received == sorted(received)
    # `since` marks entering `up`, not each frame.
    assert len({s.since for s in states}) == 1


async def test_a_probe_slower_than_the_interval_never_runs_twice_at_once():
    probe = SlowProbe(delay=0.15)
    link = LocalLink(NodeConfig(name="local", local=True), interval=0.01, probe_factory=lambda: probe)
    # poll_once calls from elsewhere (a snapshot) while the loop runs must queue, not overlap.
    run_states = asyncio.create_task(collect(link, 4))
    extra = [asyncio.create_task(link.poll_once(timeout=GUARD_S)) for _ in range(3)]
    states = await run_states
    await asyncio.gather(*extra)
    assert probe.most_at_once == 1
    assert probe.polls >= 7
    assert all(s.state == STATE_UP for s in states)


async def test_a_probe_that_raises_is_down_with_the_reason_then_recovers():
    probe = FlakyProbe(fail_on={2})
    link = LocalLink(NodeConfig(name="local", local=True), interval=0.02, probe_factory=lambda: probe)
    states = await collect(link, 3)
    assert [s.state for s in states] == [STATE_UP, STATE_DOWN, STATE_UP]
    down = states[1]
    assert down.reason == "probe failed: OSError: NVML: driver/library version mismatch"
    assert down.frame is states[0].frame  # the last good frame is kept while down
    assert states[2].frame.seq > states[0].frame.seq


async def test_a_probe_that_cannot_start_is_retried_next_interval():
    attempts = []

    def factory():
        attempts.append(1)
        if len(attempts) == 1:
            raise ImportError("No module named 'pynvml'")
        return real_probe()

    link = LocalLink(NodeConfig(name="local", local=True), interval=0.02, probe_factory=factory)
    states = await collect(link, 2)
    assert states[0].state == STATE_DOWN and "ImportError" in states[0].reason
    assert states[1].state == STATE_UP and states[1].frame is not None


async def test_poll_once_gives_up_on_a_hung_probe_and_reports_down():
    release = threading.Event()

    class HungProbe:
        def poll(self):
            release.wait(GUARD_S)
            raise RuntimeError("released")

    link = LocalLink(NodeConfig(name="local", local=True), interval=1.0, probe_factory=HungProbe)
    try:
        state = await asyncio.wait_for(link.poll_once(timeout=0.2), GUARD_S)
    finally:
        release.set()
    assert state.state == STATE_DOWN
    assert state.reason == "no answer within 0.2 s"


async def test_poll_once_returns_one_real_frame():
    link = LocalLink(NodeConfig(name="here", local=True), interval=1.0)
    state = await link.poll_once(timeout=GUARD_S)
    assert state.name == "here" and state.state == STATE_UP
    assert state.frame.node == "here" and state.frame.host.hostname == socket.gethostname()
    assert state.received_at is not None and state.age(state.received_at) == pytest.approx(0.0)
    await link.close()
    await link.close()  # safe twice
