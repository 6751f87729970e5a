"""An adversarial trial's findings, each at the entry point where the input came in.

Each table is a hostile input the trial broke the console or a command with, built from real parts:
a recording written by the real Recorder from the real H200 capture (tests.recording_frames) and
replayed by the real ReplayConsole, checkpoint files written as the libraries write them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import List

import pytest

from opsconsole.config import Config, ConsoleConfig
from opsconsole.model import DiskUsage, NetRate, NodeState
from opsconsole.recording.recorder import Recorder
from opsconsole.recording.replay import ReplayFleet
from opsconsole.tui.replay import ReplayConsole
from tests.recording_frames import node_state
from tests.waiting import wait_for

SIZE = (160, 50)


def screen_text(app) -> str:
    """What the terminal would receive for the current screen, line by line."""
    return "\n".join("".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips())


def control_characters(text: str) -> List[str]:
    """The C0 and C1 control characters in `text` but the newlines between screen lines (a tab is one)."""
    return sorted({hex(ord(ch)) for ch in text if ch != "\n" and (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0)})


# --- one-line node text in the Overview and Host panes ----------------------------------------------

# Host name, disk mount point and interface name as a node reports them: a tab, a newline and a carriage
# return in them reached the terminal raw (the tab moves the cursor to the next tab stop, so the rest of
# the row is drawn where Textual does not think it is) or broke the line in two.
ONE_LINE_TEXT = [
    pytest.param("host\tname", "host␉name", id="tab"),
    pytest.param("host\nname", "host␤name", id="newline"),
    pytest.param("host\r\n\tname", "host␍␤␉name", id="crlf-tab"),
]


def hostile_host_state(tick: int, text: str) -> NodeState:
    state = node_state(0, tick)
    frame = state.frame
    host = replace(
        frame.host,
        hostname=text,
        disks=(DiskUsage(path="/mnt/" + text, total=100 * 2**30, used=40 * 2**30, free=60 * 2**30),),
        net=(NetRate(interface="if-" + text, rx_bytes_per_s=1.0, tx_bytes_per_s=2.0),),
    )
    return replace(state, frame=replace(frame, host=host))


@pytest.mark.parametrize("text, shown", ONE_LINE_TEXT)
@pytest.mark.parametrize("pane", ["o", "3"])
async def test_a_hosts_name_disk_and_interface_are_drawn_on_one_line_with_their_controls_visible(
    tmp_path, text, shown, pane
):
    path = str(tmp_path / "run.opsrec")
    with Recorder(path) as recorder:
        for tick in range(5):
            recorder.observe(hostile_host_state(tick, text))
    fleet = ReplayFleet(path)
    app = ReplayConsole(Config(console=ConsoleConfig(read_only=True)), fleet, now=fleet.now)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space", pane)
        await wait_for(lambda: " rx " in screen_text(app), "the host's network line on screen", pilot=pilot)
        await pilot.pause()
        drawn = screen_text(app)
        assert app.is_running
        assert control_characters(drawn) == []
        for expected in ("(%s)" % shown, "/mnt/" + shown, "if-" + shown):
            assert expected in drawn, "%r is not drawn on one line" % expected


@pytest.mark.parametrize("text, shown", ONE_LINE_TEXT)
async def test_a_node_drilled_into_is_named_on_one_line_in_the_header(tmp_path, text, shown):
    """Node names in a recording are whatever the file says: one drilled into is named in the header."""
    path = str(tmp_path / "run.opsrec")
    with Recorder(path) as recorder:
        for tick in range(5):
            for node in range(2):
                recorder.observe(replace(node_state(node, tick), name="%s-%d" % (text, node)))
    fleet = ReplayFleet(path)
    app = ReplayConsole(Config(console=ConsoleConfig(read_only=True)), fleet, now=fleet.now)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space", "4")
        await wait_for(lambda: "%s-1" % shown in screen_text(app), "the Nodes pane's rows", pilot=pilot)
        await pilot.press("enter")
        await wait_for(lambda: "  > " in screen_text(app), "the drilled-into node in the header", pilot=pilot)
        await pilot.pause()
        drawn = screen_text(app)
        assert app.is_running
        assert control_characters(drawn) == []
        assert "  > %s-" % shown in drawn.split("\n")[0]
