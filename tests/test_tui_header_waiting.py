"""The header names the down nodes that wait for a person (a host key to check, a login to fix), at 80 columns too."""

from __future__ import annotations

import pytest
from tui_fakes import FROZEN_NOW, FakeFleet, cluster_states

from opsconsole.config import Config
from opsconsole.model import STATE_AUTH, STATE_HOSTKEY, NodeState
from opsconsole.tui.app import OpsConsole
from tests.waiting import wait_for


def screen_lines(app: OpsConsole):
    return ["".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips()]


def waiting_nodes():
    return cluster_states() + [
        NodeState(
            name="gpu-b01",
            state=STATE_HOSTKEY,
            reason="HOST KEY CHANGED for [127.0.0.1]:2201: it presented ssh-ed25519 SHA256:x",
            address="127.0.0.1:2201",
            fingerprint="SHA256:x",
            since=FROZEN_NOW - 5.0,
        ),
        NodeState(
            name="gpu-b02",
            state=STATE_AUTH,
            reason="authentication failed: permission denied",
            address="127.0.0.1:2202",
            since=FROZEN_NOW - 5.0,
        ),
    ]


@pytest.mark.parametrize("width", [80, 140])
async def test_hostkey_and_auth_nodes_are_named_in_the_header(width):
    app = OpsConsole(Config(), FakeFleet(waiting_nodes()), now=lambda: FROZEN_NOW)
    async with app.run_test(size=(width, 24)) as pilot:
        line = await wait_for(
            lambda: next((line for line in screen_lines(app)[:2] if " nodes 5" in line), None),
            "the header's counts",
            pilot=pilot,
        )
        # Three down: the one refusing connections, and the two waiting for someone, named as the State column does.
        assert "down 3 (hostkey 1, auth 1)" in line, line
        # The down node's last frame fails a check; the two never reached are node_reachable errors, counted too.
        assert line.rstrip().endswith("alerts 0   HEALTH 1 FAIL 2 ERROR"), line  # fits: nothing cut off at the end


def test_a_recording_stays_in_sight_at_80_columns():
    # "● REC" used to be added after the counts line was fitted to the width, so at 80 columns it was cut.
    from opsconsole.tui import bars
    from opsconsole.tui.header import header_text

    states = waiting_nodes()
    fleet = FakeFleet(states)
    by_name = {state.name: state for state in states}
    palette = bars.palette_from_variables({})
    text = header_text(
        Config(),
        by_name,
        fleet.totals(FROZEN_NOW),
        None,
        FROZEN_NOW,
        palette,
        health_failures=1,
        width=80,
        recording=True,
    )
    counts = text.plain.split("\n")[1]
    assert len(counts) <= 80, counts
    assert counts.endswith("HEALTH 1 FAIL   ● REC"), counts
    assert "down 3 (hostkey 1, auth 1)" in counts, counts
