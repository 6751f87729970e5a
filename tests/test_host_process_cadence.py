"""The local node's host process list is read each poll only while something shows or records it.

On a GPU node the host's few hundred processes are the probe's costliest read after NVML (py-spy on
the H200: about a fifth of the console's CPU). The overview shows only GPU processes, which every
poll reads; the console asks for the host list each poll while the Processes or Host pane is shown
or a recording runs, else every fifth poll, and the frames between carry the last list read.
Real probe, real LocalLink, the real app."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from opsconsole.config import DEFAULT_CONFIG, NodeConfig
from opsconsole.nodes.local import LocalLink
from opsconsole.sources import fleet_with_sources
from opsconsole.tui.app import HOST_PROCESSES_EVERY_HIDDEN, OpsConsole
from tests.waiting import wait_for

GUARD_S = 30.0


def local_link() -> LocalLink:
    return LocalLink(NodeConfig(name="local", host="localhost", local=True), interval=1.0)


def test_between_reads_a_frame_carries_the_last_host_list_read():
    link = local_link()
    link.host_processes_every = 3
    link.start_first_poll()

    async def polls(count: int) -> list:
        return [(await asyncio.wait_for(link._poll(), GUARD_S)).frame for _ in range(count)]

    first, *frames = asyncio.run(polls(8))
    assert first.top_processes == ()  # the quick first frame
    read, kept1, kept2, read2, kept3, kept4, read3 = frames
    assert len(read.top_processes) > 1 and all(p.command for p in read.top_processes), read.top_processes[:5]
    assert any(p.cpu_percent is not None for p in read.top_processes)
    for kept in (kept1, kept2):
        assert kept.top_processes is read.top_processes  # the last list read, as it was
        assert kept.seq > read.seq and kept.host is not None  # the rest of the frame is new
    assert read2.top_processes is not read.top_processes and read2.top_processes
    assert kept3.top_processes is read2.top_processes and kept4.top_processes is read2.top_processes
    assert read3.top_processes is not read2.top_processes
    link.host_processes_every = 1  # a pane shows them now: every poll reads them

    async def more() -> list:
        return [(await asyncio.wait_for(link._poll(), GUARD_S)).frame for _ in range(2)]

    after, again = asyncio.run(more())
    assert after.top_processes is not read3.top_processes and again.top_processes is not after.top_processes


async def test_the_console_asks_for_the_host_list_each_poll_only_while_a_pane_shows_it_or_it_records(tmp_path):
    config = replace(DEFAULT_CONFIG, record=replace(DEFAULT_CONFIG.record, directory=str(tmp_path)))
    fleet = fleet_with_sources(config)
    link = fleet.link(fleet.names[0])
    assert isinstance(link, LocalLink)
    app = OpsConsole(config, fleet)
    async with app.run_test(size=(140, 45)) as pilot:
        await wait_for(lambda: app.visible_pane_id == "overview", "the overview", pilot=pilot)
        assert link.host_processes_every == HOST_PROCESSES_EVERY_HIDDEN
        await pilot.press("2")  # Processes
        await wait_for(lambda: link.host_processes_every == 1, "each poll for Processes", pilot=pilot)
        await pilot.press("o")
        await wait_for(lambda: link.host_processes_every == HOST_PROCESSES_EVERY_HIDDEN, "back", pilot=pilot)
        await pilot.press("3")  # Host
        await wait_for(lambda: link.host_processes_every == 1, "each poll for Host", pilot=pilot)
        await pilot.press("o")
        await wait_for(lambda: link.host_processes_every == HOST_PROCESSES_EVERY_HIDDEN, "back", pilot=pilot)
        app.action_record()  # a recording keeps what the console receives: the whole list, each poll
        assert app.services.recorder is not None and link.host_processes_every == 1
        app.action_record()
        assert app.services.recorder is None and link.host_processes_every == HOST_PROCESSES_EVERY_HIDDEN
        await pilot.press("q")
