"""Sparklines of the recent past in the GPU and node rows, and the history plots on `t` (Pilot)."""

from __future__ import annotations

from dataclasses import replace

from tui_fakes import FROZEN_NOW, FakeFleet, cluster_states, single_node_states  # noqa: E402

from opsconsole.config import parse_config  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402
from opsconsole.tui.history_view import HistoryScreen, plot_points  # noqa: E402
from tests.waiting import pane_shown, wait_for  # noqa: E402

SIZE = (140, 40)
NODES_SIZE = (160, 40)


def with_utilisation(state, seq: int, percent: float):
    """The state with a newer frame in which GPU 1 runs at `percent`."""
    gpus = tuple(replace(g, utilization_gpu=percent) if g.index == 1 else g for g in state.frame.gpus)
    frame = replace(state.frame, seq=seq, time=state.frame.time + seq, gpus=gpus)
    return replace(state, frame=frame)


def util_text(app, row_key: str) -> str:
    table = app.panes["gpus"].query_one("#gpus-table")
    return str(table.get_row(row_key)[3])


async def test_gpu_rows_draw_the_recent_utilisation_and_t_plots_it():
    (state,) = single_node_states()
    fleet = FakeFleet([state])
    app = OpsConsole(parse_config("", "test.toml"), fleet, now=lambda: FROZEN_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("1")  # one node opens on its overview; this is the GPUs pane's row
        await wait_for(lambda: pane_shown(app, "gpus"), "the GPUs pane", pilot=pilot)  # made on its first show
        assert "█" in util_text(app, "local/1") and "100%" in util_text(app, "local/1")  # no past yet: a bar
        for seq, percent in enumerate((0, 25, 50, 75, 100, 12), start=2):
            fleet.publish(with_utilisation(state, seq, percent))
        ring = app.services.history.gpu("local", 1, "utilization")
        await wait_for(lambda: util_text(app, "local/1") == "▁▃▅▆█▂  12%", "the trend of six samples", pilot=pilot)
        assert ring.values()[-6:] == [0, 25, 50, 75, 100, 12]  # six samples (eight block heights), then the value now
        await pilot.press("down", "t")  # the cursor on GPU 1
        await wait_for(lambda: isinstance(app.screen, HistoryScreen), "the plot", pilot=pilot)
        screen = app.screen
        assert isinstance(screen, HistoryScreen) and (screen.node, screen.gpu) == ("local", 1)
        assert screen.ring("utilization") is ring
        # Seconds ago on the console's clock (FROZEN_NOW here, a recording's time in a replay), not the wall clock's.
        seconds_ago, _ = plot_points(ring, screen.clock())
        assert seconds_ago and all(abs(x) < 60 for x in seconds_ago), seconds_ago  # the wall clock: -1e5 and more
        await pilot.press("escape")
        await wait_for(lambda: not isinstance(app.screen, HistoryScreen), "the plot closed", pilot=pilot)
        assert not isinstance(app.screen, HistoryScreen)


async def test_node_rows_draw_the_mean_utilisation_trend_and_t_plots_the_node():
    states = cluster_states()
    fleet = FakeFleet(states)
    app = OpsConsole(parse_config("", "test.toml"), fleet, now=lambda: FROZEN_NOW)
    # The Nodes table fits the width and gives up its Trend column first (at 140 columns it is gone): 160 keeps it.
    async with app.run_test(size=NODES_SIZE) as pilot:
        await pilot.pause()
        first = states[0]
        for seq in range(2, 6):
            gpus = tuple(replace(g, utilization_gpu=100.0 if seq % 2 else 0.0) for g in first.frame.gpus)
            fleet.publish(replace(first, frame=replace(first.frame, seq=seq, time=first.frame.time + seq, gpus=gpus)))
        await pilot.press("4")
        nodes = app.panes["nodes"].tables[0]

        def trend() -> str:
            columns = [c.key for c in nodes.columns]
            if "trend" not in columns or "gpu-a01" not in nodes.table.rows:
                return ""
            return str(nodes.table.get_row("gpu-a01")[columns.index("trend")]).strip()

        # The first frame (half busy), then 0/100 alternating.
        await wait_for(lambda: trend() == "▅▁█▁█", "gpu-a01's trend of five samples", pilot=pilot)
        await pilot.press("t")
        await wait_for(lambda: isinstance(app.screen, HistoryScreen), "the plot", pilot=pilot)
        assert isinstance(app.screen, HistoryScreen) and (app.screen.node, app.screen.gpu) == ("gpu-a01", None)


async def test_t_with_no_row_highlighted_says_so():
    """`t` on a GPUs or Nodes table that the filter emptied: a toast says what it plots (a bell was silent)."""
    app = OpsConsole(parse_config("", "test.toml"), FakeFleet(cluster_states()), now=lambda: FROZEN_NOW)
    async with app.run_test(size=NODES_SIZE) as pilot:
        for pane_key, words in (("1", "no GPU selected"), ("4", "no node selected")):
            await pilot.press(pane_key, "slash", *"nosuchthing", "enter", "t")
            await wait_for(lambda: any(words in str(n.message) for n in app._notifications), repr(words), pilot=pilot)
            await pilot.press("escape")
