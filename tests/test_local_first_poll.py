"""The local node's first poll taken before the console's loop runs (LocalLink.start_first_poll,
issue 17's launch): its frame is the first state, checked like any other, and a failing probe is
the node's state as usual."""

from __future__ import annotations

import asyncio
import threading

from opsconsole.config import NodeConfig
from opsconsole.model import STATE_DOWN, STATE_UP
from opsconsole.nodes.local import LocalLink

GUARD_S = 30.0  # only so a broken link fails the test instead of hanging it


class CountingProbe:
    """The real probe, counting its polls and the threads they ran in."""

    def __init__(self):
        from opsconsole.probe.agent import Probe

        self.inner = Probe(node_name="local", disk_paths=("/",))
        self.threads = []

    def poll(self):
        self.threads.append(threading.current_thread().name)
        return self.inner.poll()


class BrokenProbe:
    def poll(self):
        raise RuntimeError("NVML went away")


def test_the_first_poll_started_before_the_loop_is_the_first_state():
    probes = []

    def make():
        probes.append(CountingProbe())
        return probes[-1]

    link = LocalLink(NodeConfig(name="local", host="localhost", local=True), interval=1.0, probe_factory=make)
    link.start_first_poll()
    link.start_first_poll()  # a second call starts nothing more

    async def two_polls():
        first = await asyncio.wait_for(link._poll(), GUARD_S)
        second = await asyncio.wait_for(link._poll(), GUARD_S)
        return first, second

    first, second = asyncio.run(two_polls())
    assert len(probes) == 1
    assert probes[0].threads == ["opsconsole-probe", "opsconsole-probe"]  # never the loop's thread
    assert first.state == STATE_UP and first.frame is not None and first.frame.seq == 1
    assert second.frame is not None and second.frame.seq == 2
    assert first.frame.host is not None and first.frame.top_processes


def test_a_first_poll_that_fails_makes_the_node_down_with_the_reason():
    link = LocalLink(
        NodeConfig(name="local", host="localhost", local=True), interval=1.0, probe_factory=lambda: BrokenProbe()
    )
    link.start_first_poll()
    state = asyncio.run(asyncio.wait_for(link._poll(), GUARD_S))
    assert state.state == STATE_DOWN
    assert state.reason == "probe failed: RuntimeError: NVML went away"
