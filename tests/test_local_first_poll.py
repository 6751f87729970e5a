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


def finished_first_poll(probes):
    """A local link whose first poll (the real probe) has finished in its thread."""

    def make():
        probes.append(CountingProbe())
        return probes[-1]

    link = LocalLink(NodeConfig(name="local", host="localhost", local=True), interval=0.5, probe_factory=make)
    link.start_first_poll()
    link._first_poll.result(GUARD_S)
    return link


def test_the_fleet_publishes_a_finished_first_poll_when_it_starts_and_the_link_polls_an_interval_later():
    from opsconsole.config import DEFAULT_CONFIG
    from opsconsole.nodes.fleet import Fleet

    probes = []
    link = finished_first_poll(probes)
    fleet = Fleet(DEFAULT_CONFIG, links=[link])
    seen = []

    async def run():
        await fleet.start(lambda state: seen.append((state.state, state.frame.seq if state.frame else None)))
        at_start = list(seen)  # before any task of the fleet has run
        await asyncio.sleep(0.3)  # less than the interval: no second poll yet
        before_interval = list(seen)
        deadline = asyncio.get_running_loop().time() + GUARD_S
        while len(seen) < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        await fleet.stop()
        return at_start, before_interval

    at_start, before_interval = asyncio.run(run())
    assert at_start == [(STATE_UP, 1)]  # the first frame, published by start() itself
    assert before_interval == at_start  # the link's loop waited its interval
    assert seen[1] == (STATE_UP, 2)  # then polled as usual
    assert [t for t in probes[0].threads if not t.startswith("prime:")] == ["opsconsole-probe"] * 2


async def test_the_consoles_first_redraw_has_the_local_nodes_frame(monkeypatch):
    """The first screen is drawn with the frame the first poll took while Textual loaded, not drawn
    empty and again once the link's task has run (a full layout and render more before the data)."""
    from opsconsole.config import DEFAULT_CONFIG
    from opsconsole.nodes.fleet import Fleet
    from opsconsole.tui.app import OpsConsole

    probes = []
    fleet = Fleet(DEFAULT_CONFIG, links=[finished_first_poll(probes)])
    app = OpsConsole(DEFAULT_CONFIG, fleet)
    redraws = []
    original = OpsConsole.redraw

    def redraw(self):
        redraws.append(any(state.frame for state in self.fleet.states().values()))
        original(self)

    monkeypatch.setattr(OpsConsole, "redraw", redraw)
    async with app.run_test(size=(140, 45)) as pilot:
        await pilot.pause()
        assert redraws and redraws[0] is True, redraws
        assert app._first_frame_drawn
