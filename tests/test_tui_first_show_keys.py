"""Keys typed in one burst with the key that shows a pane for the first time (the pane is imported
and mounted then) reach that pane once it is mounted, in their order, instead of being lost."""

from __future__ import annotations

from textual import events
from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states  # noqa: E402

from opsconsole.config import Config  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402
from opsconsole.tui.processes import VIEW_BOTH, VIEW_GPU, VIEW_HOST  # noqa: E402
from tests.waiting import wait_for  # noqa: E402

SIZE = (140, 40)


def make_app() -> OpsConsole:
    return OpsConsole(Config(), FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)


def burst(app: OpsConsole, *keys: str) -> None:
    """The keys as the terminal delivers a fast typist's or a paste's: queued before any is handled."""
    for key in keys:
        app.post_message(events.Key(key, key))


async def test_a_pane_key_typed_right_after_the_first_show_reaches_the_pane():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            lambda: app.visible_pane_id == "overview" and "processes" not in app.panes, "overview", pilot=pilot
        )
        burst(app, "2", "v", "v")  # Processes, then its view twice: GPU processes, then host processes
        await wait_for(lambda: app.visible_pane_id == "processes", "the Processes pane", pilot=pilot)
        pane = app.panes["processes"]
        await wait_for(lambda: pane.view == VIEW_HOST, "both v presses taken by the pane", pilot=pilot)
        assert not app._held_keys
        # Shown again (mounted already): keys go straight to it, as before.
        burst(app, "3", "2", "v")
        await wait_for(lambda: pane.view == VIEW_BOTH and app.visible_pane_id == "processes", "v after 2", pilot=pilot)


async def test_pane_switches_typed_during_a_first_show_are_kept_in_order():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: app.visible_pane_id == "overview", "overview", pilot=pilot)
        burst(app, "2", "3", "2", "v")  # through Host (mounted too) back to Processes, then v
        await wait_for(lambda: "host" in app.panes and "processes" in app.panes, "both panes mounted", pilot=pilot)
        await wait_for(lambda: app.visible_pane_id == "processes", "back on Processes", pilot=pilot)
        await wait_for(lambda: app.panes["processes"].view == VIEW_GPU, "v taken by Processes", pilot=pilot)
