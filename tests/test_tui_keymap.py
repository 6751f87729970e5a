"""[console.keys] refused when it cannot do what it says: an app key remapped onto a pane's key (the pane's
binding wins in that pane), and an id no binding has (the remap would do nothing). Both exit 2 with one line,
as the other collisions do; the console command refuses them before any node is polled, the app itself too."""

from __future__ import annotations

import pytest
from cli_errors import assert_one_line_exit_2
from test_cli import clean_home, run_cli  # noqa: F401 (clean_home is a fixture)
from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states

from opsconsole.config import Config, ConfigError, ConsoleConfig
from opsconsole.tui.app import OpsConsole
from opsconsole.tui.processes import ProcessesPane
from tests.waiting import wait_for

SIZE = (140, 40)


def make_app(*keys) -> OpsConsole:
    return OpsConsole(
        Config(console=ConsoleConfig(keys=tuple(keys))), FakeFleet(single_node_states()), now=lambda: FROZEN_NOW
    )


def console_refuses(tmp_path, env, remap: str):
    """`opsconsole --config FILE` on a config with this [console.keys] line, as a real process."""
    path = tmp_path / "keys.toml"
    path.write_text('[[nodes]]\nname = "box"\nlocal = true\n[console.keys]\n%s\n' % remap)
    done = run_cli(["--config", str(path)], env)
    assert done.stdout == "", done.stdout[-500:]
    return done, path


@pytest.mark.parametrize(
    "remap, words",
    [
        # In Processes, x stayed SIGTERM: quit was not where the config put it.
        ('"app.quit" = "x"', ['"app.quit" = "x"', "takes the key x of process.signal_term (Processes: SIGTERM)"]),
        # A pane's number key onto another pane's key: in Nodes, h reran the health checks.
        ('"pane.host" = "h"', ['"pane.host" = "h"', "takes the key h of node.health_rerun"]),
    ],
)
def test_an_app_key_remapped_onto_a_panes_key_is_refused(tmp_path, clean_home, remap, words):  # noqa: F811
    _, env = clean_home
    done, path = console_refuses(tmp_path, env, remap)
    assert_one_line_exit_2(done.returncode, done.stderr, str(path), *words)


def test_an_unknown_binding_id_is_a_config_error_naming_the_closest_ids(tmp_path, clean_home):  # noqa: F811
    _, env = clean_home
    done, path = console_refuses(tmp_path, env, '"app.quitt" = "ctrl+q"')
    assert_one_line_exit_2(done.returncode, done.stderr, str(path), 'no binding "app.quitt"', "the closest: app.quit")
    done, _ = console_refuses(tmp_path, env, '"process.signal_trm" = "k"')
    assert_one_line_exit_2(done.returncode, done.stderr, "process.signal_term, process.signal_int")
    done, _ = console_refuses(tmp_path, env, '"zzz" = "k"')  # nothing alike: the ids are under ?
    assert_one_line_exit_2(done.returncode, done.stderr, 'no binding "zzz" (? lists every id)')


def test_the_app_itself_refuses_both():
    # replay and demo build the app without the console command's early check
    with pytest.raises(ConfigError, match='"app.quit" = "x" takes the key x of process.signal_term'):
        make_app(("app.quit", "x"))
    with pytest.raises(ConfigError, match='no binding "pane.hots"; the closest: pane.host'):
        make_app(("pane.hots", "H"))


async def test_a_swap_of_an_app_key_and_a_panes_key_works_in_that_pane():
    app = make_app(("app.quit", "x"), ("process.signal_term", "q"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await wait_for(lambda: app.visible_pane_id == "processes", "the Processes pane", pilot=pilot)
        assert isinstance(app.panes["processes"], ProcessesPane)
        rows = {row[0]: row[1] for row in app.help_rows()}
        assert (rows["app.quit"], rows["process.signal_term"]) == ("x", "q")
        await pilot.press("x")  # quits here too: no pane binding of x is left to win
        await wait_for(lambda: not app.is_running, "the console to quit", pilot=pilot)


def test_the_replay_keys_may_be_remapped_in_the_live_consoles_config():
    """One config serves the console and its replays: the replay's ids are known ids, not typos."""
    app = make_app(("replay.pause", "p"), ("pane.host", "H"))
    assert app.keymap == {"replay.pause": "p", "pane.host": "H"}
