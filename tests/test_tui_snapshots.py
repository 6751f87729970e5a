"""SVG snapshots of every pane and the help screen, on frozen captured data and a frozen clock.

Regenerate after a deliberate change with:
    .venv/bin/python -m pytest tests/test_tui_snapshots.py --snapshot-update
and read the SVGs (tests/__snapshots__/) before committing them.
"""

from __future__ import annotations

from tui_fakes import FROZEN_NOW, FakeFleet, cluster_states, single_node_states  # noqa: E402

from opsconsole.config import Config, ConsoleConfig  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402
from tests.snapshot_clock import utc_clock  # noqa: F401 (autouse fixture: the clock prints UTC)
from tests.waiting import wait_for  # noqa: E402

SIZE = (140, 40)


def console(states=None, **console_options) -> OpsConsole:
    config = Config(console=ConsoleConfig(**console_options)) if console_options else Config()
    return OpsConsole(config, FakeFleet(states or cluster_states()), now=lambda: FROZEN_NOW)


def test_gpus_pane_cluster(snap_compare):
    assert snap_compare(console(), terminal_size=SIZE)


def test_gpus_pane_single_node(snap_compare):
    # One node opens on its overview (tests/test_tui_overview.py); 1 shows its GPUs.
    assert snap_compare(console(single_node_states()), terminal_size=SIZE, press=["1"])


def test_processes_pane(snap_compare):
    assert snap_compare(console(single_node_states()), terminal_size=SIZE, press=["2"])


def test_processes_pane_tree(snap_compare):
    """`t`: the captured node's host processes under their parents."""
    assert snap_compare(console(single_node_states()), terminal_size=SIZE, press=["2", "t"])


def test_host_pane(snap_compare):
    assert snap_compare(console(single_node_states()), terminal_size=SIZE, press=["3"])


def test_nodes_pane(snap_compare):
    assert snap_compare(console(), terminal_size=SIZE, press=["4"])


def test_cluster_gpus_pane(snap_compare):
    assert snap_compare(console(), terminal_size=SIZE, press=["5"])


def test_help_screen(snap_compare):
    assert snap_compare(console(), terminal_size=SIZE, press=["question_mark"])


def test_drill_down_into_a_node(snap_compare):
    async def run_before(pilot) -> None:
        # The Nodes pane is made on first show: a "down" pressed before its rows are in was lost under
        # load, and the snapshot drilled into gpu-a02.
        await pilot.press("4")
        await wait_for(lambda: pilot.app.panes["nodes"].tables[0].table.row_count == 3, "the 3 nodes", pilot=pilot)
        await pilot.press("down", "down", "enter")
        await wait_for(lambda: pilot.app.node == "gpu-a03", "the drill into gpu-a03", pilot=pilot)

    assert snap_compare(console(), terminal_size=SIZE, run_before=run_before)


def test_light_theme(snap_compare):
    assert snap_compare(console(theme="opsconsole-light"), terminal_size=SIZE)


def test_high_contrast_theme(snap_compare):
    assert snap_compare(console(theme="opsconsole-high-contrast"), terminal_size=SIZE)


def test_terminal_too_small(snap_compare):
    assert snap_compare(console(), terminal_size=(70, 15))


def test_filter_line_open(snap_compare):
    app = console()
    # The input's cursor blinks off 0.5 s after the last key: under load the screenshot came later
    # than that and had no cursor. It stays drawn, as the snapshot shows it.
    app.filter_input.cursor_blink = False
    assert snap_compare(app, terminal_size=SIZE, press=["slash", "a", "0", "2"])
