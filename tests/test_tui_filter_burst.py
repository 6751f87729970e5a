"""Keys typed in one burst with the filter's `enter`: the ones behind it are the pane's, not the filter line's.

`enter` closes the filter line when the input's Submitted comes back to the app, after the keys typed
behind it were already routed to the focused widget, the input: `/python<enter>/eyes` in one burst
(a paste, a laggy SSH link, a fast typist) left the filter as `python/eyes`. They now wait for the
close, then `/` opens the filter again and `eyes` goes into it (tests/test_tui_tmux.py types it too).
"""

from __future__ import annotations

from textual import events

from opsconsole.config import Config, ConsoleConfig
from opsconsole.nodes.fleet import Fleet
from opsconsole.tui.app import OpsConsole
from tests.waiting import wait_for

NAMES = {"/": "slash", "\r": "enter"}


def burst(app: OpsConsole, keys: str) -> None:
    """Every key queued at once, as a terminal delivers a paste: none is handled before the next comes."""
    for ch in keys:
        app.post_message(events.Key(NAMES.get(ch, ch), None if ch == "\r" else ch))


async def test_keys_behind_the_filters_enter_go_to_the_pane(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = Config(console=ConsoleConfig(interval=0.5))
    app = OpsConsole(config, Fleet(config))
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        burst(app, "/python\r/eyes")
        # The burst is handled through the message queue (keys held while the line closes, then sent
        # again): waited for, not a fixed 0.5 s. `eyes` is never a passing state of a wrong routing
        # ('python/eyes', 'python', 'yes').
        await wait_for(
            lambda: app.filter_input.value == "eyes" and app.filter_input.has_class("-open"),
            "the filter open on 'eyes'",
            pilot=pilot,
        )
        assert app.focused is app.filter_input
        burst(app, "\r")
        await wait_for(lambda: not app.filter_input.has_class("-open"), "the filter closed", pilot=pilot)
        assert app.focused is not app.filter_input
        assert app._pane_filters["processes"] == "eyes"
        assert app._keys_held_for is None and app._held_keys == []  # nothing left waiting
