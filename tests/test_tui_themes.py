"""Themes as a user meets them: ctrl+t lists ours, the pick is kept, a user theme folder, --theme checked."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from cli_errors import assert_one_line_exit_2
from textual.command import CommandPalette
from textual.theme import BUILTIN_THEMES
from textual.widgets import OptionList
from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states

from opsconsole.cli import COMMAND_HELP, console_theme, main
from opsconsole.config import Config, ConsoleConfig
from opsconsole.tui.app import OpsConsole
from opsconsole.tui.themes import saved_theme, saved_theme_path, theme_names
from tests.waiting import wait_for

SHIPPED = ["opsconsole-dark", "opsconsole-high-contrast", "opsconsole-light"]
MINE = 'name = "midnight-mine"\ndark = true\nprimary = "#56B4E9"\nbackground = "#101018"\n'


@pytest.fixture
def homes(tmp_path, monkeypatch):
    """A config home (user themes) and a state home (the kept pick) of this test's own."""
    config_home, state_home = tmp_path / "config", tmp_path / "state"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))
    monkeypatch.setenv("XDG_STATE_HOME", str(state_home))
    monkeypatch.setenv("HOME", str(tmp_path))
    themes = config_home / "opsconsole" / "themes"
    themes.mkdir(parents=True)
    return themes


def console(config=None) -> OpsConsole:
    return OpsConsole(config or Config(), FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)


def palette_names(app: OpsConsole):
    options = app.screen.query_one(OptionList)
    return sorted(str(options.get_option_at_index(i).prompt).split("\n")[0] for i in range(options.option_count))


def top_hit(app: OpsConsole):
    """The palette's highlighted hit (its first line), None while there is none."""
    if not CommandPalette.is_open(app):
        return None
    options = app.screen.query(OptionList)
    if not options or options.first().highlighted is None:
        return None
    option = options.first().get_option_at_index(options.first().highlighted)
    return str(option.prompt).split("\n")[0]


async def test_ctrl_t_lists_our_themes_only_and_the_pick_is_kept_for_the_next_start(homes):
    app = console()
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        assert sorted(app.available_themes) == SHIPPED and not set(BUILTIN_THEMES) & set(app.available_themes)
        await pilot.press("ctrl+t")
        await wait_for(lambda: top_hit(app) and palette_names(app) == SHIPPED, "the palette's whole list", pilot=pilot)
        assert CommandPalette.is_open(app)
        assert palette_names(app) == SHIPPED  # Textual's 24 themes listed here before
        await pilot.press(*"light")
        # The palette searches as it is typed: enter once the typed name is the highlighted hit.
        await wait_for(lambda: top_hit(app) == "opsconsole-light", "the light theme on top", pilot=pilot)
        await pilot.press("enter")
        await wait_for(lambda: app.theme == "opsconsole-light", "the picked theme", pilot=pilot)
    assert saved_theme_path().read_text() == "opsconsole-light\n"
    # The next start: no --theme, so the kept pick beats the config's theme.
    config = console_theme(Config(), SimpleNamespace(theme=None))
    assert config.console.theme == "opsconsole-light"
    again = console(config)
    async with again.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        assert again.theme == "opsconsole-light"
    # --theme still wins over the kept pick, and takes the short name.
    assert console_theme(Config(), SimpleNamespace(theme="high-contrast")).console.theme == "opsconsole-high-contrast"


async def test_a_user_theme_folder_adds_themes_and_a_bad_file_is_reported_and_skipped(homes):
    (homes / "midnight.toml").write_text(MINE)
    (homes / "broken.toml").write_text('name = "broken"\nprimary = "not-a-colour"\n')
    (homes / "huge.toml").write_text('name = "huge"\nprimary = "#000000"\n#' + "x" * 70_000 + "\n")
    os.mkfifo(homes / "fifo.toml")  # would block a start that opened it for reading
    assert theme_names() == SHIPPED + ["midnight-mine"]
    app = console(Config(console=ConsoleConfig(theme="midnight-mine")))
    async with app.run_test(size=(140, 40), notifications=True) as pilot:
        # The problems are toasts, Notify messages posted at mount (App.notify): waited for.
        await wait_for(
            lambda: len([n for n in app._notifications if "theme skipped" in n.message]) >= 3, "the toasts", pilot=pilot
        )
        assert app.theme == "midnight-mine"
        assert app.theme_variables["background"].upper() == "#101018"
        assert sorted(app.available_themes) == sorted(SHIPPED + ["midnight-mine"])
        problems = [n.message for n in app._notifications if "theme skipped" in n.message]
        assert len(problems) == 3, problems
        text = " ".join(problems)
        assert "broken.toml" in text and "huge.toml: larger than" in text and "fifo.toml: a FIFO" in text


def test_theme_flag_naming_no_theme_is_one_line_and_exit_2(homes, capsys):
    (homes / "midnight.toml").write_text(MINE)
    code = main(["--theme", "bogus"])
    err = capsys.readouterr().err
    assert_one_line_exit_2(
        code, err, "--theme bogus: no such theme", "opsconsole-dark", "opsconsole-light", "midnight-mine"
    )
    # The replay's console too (a recording is opened only after the theme is known).
    code = main(["--theme", "bogus", "replay", "/nonexistent.opsrec"])
    assert_one_line_exit_2(code, capsys.readouterr().err, "--theme bogus: no such theme")
    # The demo checks it before it starts training.
    code = main(["--theme", "bogus", "demo", "--no-replay", "--dir", str(homes.parent / "demo")])
    assert_one_line_exit_2(code, capsys.readouterr().err, "--theme bogus: no such theme")
    assert not (homes.parent / "demo" / "train.out").exists()  # no training was started
    code = main(["--theme", "[red]x\x1b[2J", "replay", "/nonexistent.opsrec"])
    err = capsys.readouterr().err
    assert_one_line_exit_2(code, err, "no such theme")
    assert "\x1b" not in err


def test_a_kept_pick_that_is_not_a_name_is_ignored(homes):
    path = saved_theme_path()
    path.parent.mkdir(parents=True)
    for junk in ("", "two words", "x" * 500, "[b]y[/b]", "\x1b[2J"):
        path.write_text(junk)
        assert saved_theme() is None
        assert console_theme(Config(), SimpleNamespace(theme=None)).console.theme == Config().console.theme
    path.unlink()
    os.mkfifo(path)
    assert saved_theme() is None  # a FIFO is not read (it would block the start)


# What each command needs besides --theme to get past argparse (paths that do not exist: nothing is read).
REQUIRED_ARGS = {
    "checkpoints": ["/nonexistent-dir"],
    "cleanup": ["/nonexistent-dir"],
    "record": ["--out", "/nonexistent-dir/x.opsrec"],
    "replay": ["/nonexistent.opsrec"],
}


def test_every_command_refuses_a_theme_flag_naming_no_theme_as_the_console_does(homes, capsys, tmp_path):
    """`opsconsole --theme bogus snapshot` polled and printed (exit 0): every command, run as a real
    process, now says the console's one line and exits 2 before doing anything."""
    (homes / "midnight.toml").write_text(MINE)
    assert main(["--theme", "bogus"]) == 2
    console_says = capsys.readouterr().err
    assert_one_line_exit_2(2, console_says, "--theme bogus: no such theme", "opsconsole-dark", "midnight-mine")
    commands = ["snapshot"] + sorted(COMMAND_HELP)
    assert {"agent", "check", "diagnose", "report", "stacks"} <= set(commands)
    running = {
        name: subprocess.Popen(
            [sys.executable, "-m", "opsconsole", "--theme", "bogus", name] + REQUIRED_ARGS.get(name, []),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=str(tmp_path),
            env=dict(os.environ, PYTHONPATH=os.getcwd()),
            text=True,
        )
        for name in commands
    }
    answers = {}
    try:
        for name, process in running.items():
            try:
                out, err = process.communicate(timeout=120)  # a safety bound: an accepted theme runs on (agent)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
            answers[name] = (process.returncode, out, err)
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    for name, (code, out, err) in answers.items():
        assert (name, code, err, out) == (name, 2, console_says, ""), name
