"""The header before the first frame: a node still connecting is counted as connecting, not down."""

from __future__ import annotations

from tui_fakes import FROZEN_NOW, FakeFleet, down_state, idle_gpu, up_state

from opsconsole.config import Config
from opsconsole.model import NodeState
from opsconsole.tui.app import OpsConsole
from tests.waiting import wait_for


def header_lines(app: OpsConsole):
    return str(app.header.render()).splitlines()


async def test_a_node_without_a_first_frame_is_connecting_then_up_then_down():
    fleet = FakeFleet([NodeState(name="gpu01", address="127.0.0.1:22")])  # as the fleet starts: connecting
    app = OpsConsole(Config(), fleet, now=lambda: FROZEN_NOW)
    async with app.run_test(size=(140, 30)) as pilot:
        await pilot.pause()
        totals = header_lines(app)[1]
        assert "up 0  connecting 1  down 0" in totals, totals
        fleet.publish(up_state("gpu01", [idle_gpu(0)]))
        await wait_for(lambda: "up 1" in header_lines(app)[1], "the header to count the frame", pilot=pilot)
        totals = header_lines(app)[1]
        assert "up 1  down 0" in totals and "connecting" not in totals, totals
        # Gone after a frame: down, not connecting (its reconnection is a down node's).
        fleet.publish(down_state("gpu01", [idle_gpu(0)]))
        await wait_for(lambda: "down 1" in header_lines(app)[1], "the header to count the node down", pilot=pilot)
        totals = header_lines(app)[1]
        assert "up 0  down 1" in totals and "connecting" not in totals, totals
