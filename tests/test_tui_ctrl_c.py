"""ctrl+c in the console: a plain-text toast naming the quit keys, never raw markup."""

from __future__ import annotations

from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states

from opsconsole.config import Config, ConsoleConfig
from opsconsole.tui.app import OpsConsole
from tests.waiting import wait_for


def screen_text(app: OpsConsole) -> str:
    return "\n".join("".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips())


async def drawn(pilot, app: OpsConsole, words: str) -> str:
    """The screen once `words` is on it (toasts are drawn after a refresh or two): waited for up to the
    shared bound, not 100 polls (5 s, or less than a loaded machine's refreshes took)."""
    return await wait_for(
        lambda: (lambda text: text if words in text else "")(screen_text(app)), "%r drawn" % words, pilot=pilot
    )


async def test_ctrl_c_names_the_quit_keys_without_markup_tags():
    app = OpsConsole(Config(), FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)
    async with app.run_test(size=(140, 40), notifications=True) as pilot:
        await pilot.press("ctrl+c")
        await wait_for(lambda: list(app._notifications), "the notification", pilot=pilot)
        [toast] = list(app._notifications)
        assert toast.message == "press q or ctrl+q to quit"
        text = await drawn(pilot, app, "press q or ctrl+q to quit")
        assert "[b]" not in text and "[/b]" not in text
        assert app.is_running  # ctrl+c does not quit


async def test_ctrl_c_follows_a_remapped_quit_key():
    config = Config(console=ConsoleConfig(keys=(("app.quit", "Q"),)))  # x would take Processes' SIGTERM key
    app = OpsConsole(config, FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)
    async with app.run_test(size=(140, 40), notifications=True) as pilot:
        await pilot.press("ctrl+c")
        await wait_for(lambda: list(app._notifications), "the notification", pilot=pilot)
        assert [n.message for n in app._notifications] == ["press Q or ctrl+q to quit"]
