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

    def poll(self, **options):
        self.threads.append(threading.current_thread().name)
        return self.inner.poll(**options)

    def prime_processes(self):
        self.threads.append("prime:" + threading.current_thread().name)
        self.inner.prime_processes()


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
    # never the loop's thread; the process list's baseline taken after the first frame, before the second
    assert probes[0].threads == ["opsconsole-probe", "prime:opsconsole-probe", "opsconsole-probe"]
    assert first.state == STATE_UP and first.frame is not None and first.frame.seq == 1
    assert second.frame is not None and second.frame.seq == 2
    # The first frame: host and GPUs, not the host's process list (no CPU % yet, a user and command
    # line read per process); the next one has the list, with CPU % from the baseline taken between.
    assert first.frame.host is not None and first.frame.top_processes == ()
    assert second.frame.top_processes
    assert any(p.cpu_percent is not None for p in second.frame.top_processes)
    assert all(p.command for p in second.frame.top_processes), second.frame.top_processes[
        :5
    ]  # users and command lines read


def test_a_probe_without_a_quick_first_poll_gives_its_whole_frame_first():
    class PlainProbe:
        def __init__(self):
            from opsconsole.probe.agent import Probe

            self.inner = Probe(node_name="local", disk_paths=("/",))

        def poll(self):
            return self.inner.poll()

    link = LocalLink(
        NodeConfig(name="local", host="localhost", local=True), interval=1.0, probe_factory=lambda: PlainProbe()
    )
    link.start_first_poll()
    state = asyncio.run(asyncio.wait_for(link._poll(), GUARD_S))
    assert state.state == STATE_UP and state.frame is not None and state.frame.top_processes


def test_a_first_poll_that_fails_makes_the_node_down_with_the_reason():
    link = LocalLink(
        NodeConfig(name="local", host="localhost", local=True), interval=1.0, probe_factory=lambda: BrokenProbe()
    )
    link.start_first_poll()
    state = asyncio.run(asyncio.wait_for(link._poll(), GUARD_S))
    assert state.state == STATE_DOWN
    assert state.reason == "probe failed: RuntimeError: NVML went away"
