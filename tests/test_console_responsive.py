"""The console keeps answering keys while a node hangs (real sshd frozen with SIGSTOP, real Fleet, real app).

No durations are asserted: the test checks that key presses act and that the healthy
node's frames keep arriving while the other node is frozen, and that the frozen node
goes stale, then down, with its last frame kept. (benchmarks/keypress_latency.py
measures how long a key press takes, against a baseline with no node frozen.)
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Callable, List

import pytest
from textual.widgets import DataTable, Static

from opsconsole.config import Config, ConsoleConfig, NodeConfig, SshConfig
from opsconsole.model import STATE_DOWN, STATE_FALLBACK, STATE_STALE, STATE_UP, NodeState
from opsconsole.nodes.fleet import Fleet
from opsconsole.tui.app import OpsConsole
from opsconsole.tui.formatting import NA, STALE_ROW_STYLE
from opsconsole.tui.help import HelpScreen
from opsconsole.tui.lines_view import LinesView
from tests.sshd import ssh_client, sshd_factory  # noqa: F401
from tests.waiting import wait_for

pytestmark = pytest.mark.sshd

SIZE = (140, 40)
WAIT_LIMIT_S = 60.0  # a limit for polling, not a measured figure
FAST = SshConfig(
    connect_timeout=3.0, keepalive_interval=0.5, keepalive_count_max=2, backoff_initial=0.2, backoff_max=1.0
)


class RecordingFleet(Fleet):
    """The real fleet, also keeping every state it published (to see `stale` pass by)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.published: List[NodeState] = []

    async def start(self, on_change: Callable[[NodeState], None]) -> None:
        def record(state: NodeState) -> None:
            self.published.append(state)
            on_change(state)

        await super().start(record)


def pane_has_focus(app: OpsConsole, pane_id: str) -> bool:
    """Whether a widget of pane `pane_id` has the focus (keys typed now are the pane's)."""
    pane, focused = app.panes.get(pane_id), app.focused
    return pane is not None and focused is not None and pane in focused.ancestors


def seq_of(app: OpsConsole, name: str) -> int:
    frame = app.fleet.states()[name].frame
    return frame.seq if frame is not None else -1


async def test_keys_act_and_the_healthy_node_updates_while_a_node_is_frozen(sshd_factory):
    healthy, frozen = sshd_factory.start(), sshd_factory.start()
    config = Config(
        console=ConsoleConfig(interval=0.3),
        nodes=(
            NodeConfig(name="ok-node", host=healthy.address, port=healthy.port),
            NodeConfig(name="hung-node", host=frozen.address, port=frozen.port),
        ),
        ssh=FAST,
    )
    fleet = RecordingFleet(config)
    app = OpsConsole(config, fleet)
    async with app.run_test(size=SIZE) as pilot:
        states = app.fleet.states
        await wait_for(
            lambda: all(s.state == STATE_UP and s.frame.seq >= 2 for s in states().values()),
            "both nodes up",
            timeout=WAIT_LIMIT_S,
            pilot=pilot,
        )
        last_frame = states()["hung-node"].frame
        frozen.freeze()
        try:
            mark = len(fleet.published)
            seq_before = seq_of(app, "ok-node")

            # Keys act while the node hangs: pane switches, help, the filter.
            # Each waited for, not read after one pause: a pane is made on its first show, a screen
            # pushed or popped after the key's binding runs (the wait is a hang guard, no time asserted).
            await pilot.press("2")
            await wait_for(lambda: app.visible_pane_id == "processes", "the Processes pane", pilot=pilot)
            assert app.visible_pane_id == "processes"
            await pilot.press("4")
            await wait_for(lambda: app.visible_pane_id == "nodes", "the Nodes pane", pilot=pilot)
            assert app.visible_pane_id == "nodes"
            await wait_for(lambda: app.panes["nodes"].query("#nodes-table"), "the Nodes table", pilot=pilot)
            nodes_table = app.panes["nodes"].query_one("#nodes-table", DataTable)
            await pilot.press("question_mark")
            await wait_for(lambda: isinstance(app.screen, HelpScreen), "the help", pilot=pilot)
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            await wait_for(lambda: not isinstance(app.screen, HelpScreen), "the help closed", pilot=pilot)
            assert not isinstance(app.screen, HelpScreen)
            await pilot.press("slash", *"ok-")
            # The filter line is mounted on the first `/`, its Focus event sets has_focus and its Changed
            # messages apply the text: waited for, not one pause.
            await wait_for(
                lambda: app.filter_input.has_focus and app._pane_filters.get("nodes") == "ok-",
                "the filter",
                pilot=pilot,
            )
            assert [key.value for key in nodes_table.rows] == ["ok-node"]
            await pilot.press("escape")
            await wait_for(lambda: not app._pane_filters.get("nodes"), "the filter cleared", pilot=pilot)
            assert sorted(key.value for key in nodes_table.rows) == ["hung-node", "ok-node"]

            # The frozen node goes stale, then down, its last frame kept ...
            def hung_states():
                return [s for s in fleet.published[mark:] if s.name == "hung-node"]

            await wait_for(
                lambda: any(s.state == STATE_DOWN for s in hung_states()),
                "hung-node down",
                timeout=WAIT_LIMIT_S,
                pilot=pilot,
            )
            names = [s.state for s in hung_states()]
            assert STATE_STALE in names and names.index(STATE_STALE) < names.index(STATE_DOWN)
            hung = states()["hung-node"]
            assert hung.state == STATE_DOWN and hung.frame == last_frame
            # ... and the Nodes pane shows it down with its last readings, while keys still act.
            # Drawn by the redraw after the change (coalesced): waited for, not a fixed 0.3 s.
            await wait_for(
                lambda: nodes_table.get_cell("hung-node", "state").plain == "down", "the row down", pilot=pilot
            )
            # the last readings stay, dimmed, with their age (a node that never sent a frame shows N/A)
            assert str(nodes_table.get_cell("hung-node", "name").style) == STALE_ROW_STYLE
            assert nodes_table.get_cell("hung-node", "age").plain != NA
            await pilot.press("3")
            await wait_for(lambda: app.visible_pane_id == "host", "the Host pane", pilot=pilot)
            assert app.visible_pane_id == "host"
            await pilot.press("4")
            await wait_for(lambda: app.visible_pane_id == "nodes", "the Nodes pane again", pilot=pilot)

            # The healthy node kept streaming all along, and the pane was fed its new frames.
            seq_after = seq_of(app, "ok-node")
            assert states()["ok-node"].state == STATE_UP and seq_after > seq_before + 3
            ok_published = [s.frame.seq for s in fleet.published[mark:] if s.name == "ok-node" and s.frame]
            assert ok_published == sorted(ok_published) and len(ok_published) >= 3
            await wait_for(
                lambda: app.panes["nodes"].states["ok-node"].frame.seq >= seq_after,
                "the Nodes pane drew ok-node's newest frame",
                timeout=WAIT_LIMIT_S,
                pilot=pilot,
            )
            assert nodes_table.get_cell("ok-node", "state").plain == "up"
        finally:
            frozen.thaw()


async def test_drilling_into_a_silent_node_and_a_python_less_node_says_what_is_wrong(sshd_factory, tmp_path):
    # A port that accepts and never speaks SSH (a hung sshd), and a real node whose PATH has no python3:
    # the overview above each node's readings says its state and why, with what to try.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    bin_dir, home = tmp_path / "bin", tmp_path / "node_home"
    bin_dir.mkdir()
    home.mkdir()
    (bin_dir / "sh").symlink_to("/bin/sh")
    python_less = sshd_factory.start(SetEnv="PATH=%s HOME=%s" % (bin_dir, home))
    config = Config(
        console=ConsoleConfig(interval=0.3),
        nodes=(
            NodeConfig(name="silent-node", host="127.0.0.1", port=silent.getsockname()[1]),
            NodeConfig(name="no-python", host=python_less.address, port=python_less.port),
        ),
        ssh=dataclasses.replace(FAST, connect_timeout=1.0),
    )
    app = OpsConsole(config, Fleet(config))
    try:
        async with app.run_test(size=SIZE) as pilot:
            states = app.fleet.states
            await wait_for(
                lambda: states()["silent-node"].state == STATE_DOWN and states()["no-python"].state == STATE_FALLBACK,
                "silent-node down and no-python on the fallback",
                timeout=WAIT_LIMIT_S,
                pilot=pilot,
            )
            await pilot.press("4")
            # Made on its first show: keys typed before it has the focus wait for it (the app holds them).
            await wait_for(lambda: app.visible_pane_id == "nodes", "the Nodes pane", pilot=pilot)
            expected = {  # whole, their ends (what to try) included, wrapped at 140 columns
                "silent-node": "down, no frame yet: the port accepted but sent no SSH greeting within 1 s: sshd hung "
                "or overloaded, or no SSH server on this port (try: ssh -v)",
                "no-python": "fallback: no usable python3 on node: ",
            }
            fix = 'or python = "/path/to/python3" in its [[nodes]] entry)'

            def overview_host() -> str:
                pane = app.panes.get("overview")
                found = pane.query("#overview-host") if pane is not None else []
                return " ".join(str(found[0].render()).split()) if found else ""

            def host_summary() -> str:
                pane = app.panes.get("host")
                found = pane.query("#host-summary") if pane is not None else []
                return " ".join(str(found[0].render()).split()) if found else ""

            # Each step waited for, not read after one pause: the drill, the pane switch and the redraw
            # that fills a pane come as messages after the keys (one failed under -n 2 load).
            for row, name in enumerate(("silent-node", "no-python")):
                await pilot.press("home", *["down"] * row, "enter")
                await wait_for(
                    lambda: (
                        app.node == name and app.visible_pane_id == "overview" and expected[name] in overview_host()
                    ),
                    "the overview of " + name,
                    pilot=pilot,
                )
                assert app.node == name and app.visible_pane_id == "overview"
                host = " ".join(str(app.panes["overview"].query_one("#overview-host", LinesView).render()).split())
                assert expected[name] in host, host
                assert "never" not in host
                assert name != "no-python" or fix in host, host
                await pilot.press("3")  # the Host pane says the same, whole
                await wait_for(
                    lambda: app.visible_pane_id == "host" and expected[name] in host_summary(),
                    "the Host pane of " + name,
                    pilot=pilot,
                )
                summary = " ".join(str(app.panes["host"].query_one("#host-summary", Static).render()).split())
                assert expected[name] in summary and (name != "no-python" or fix in summary), summary
                await pilot.press("escape", "4")
                await wait_for(
                    lambda: app.node is None and app.visible_pane_id == "nodes" and pane_has_focus(app, "nodes"),
                    "back to the Nodes pane",
                    pilot=pilot,
                )
                assert app.visible_pane_id == "nodes"
    finally:
        silent.close()
