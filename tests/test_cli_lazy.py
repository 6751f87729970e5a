"""Subcommands imported only when chosen (issue 17's launch): the same help and errors as when every
command's module was imported up front, and the console's path imports none of them."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from opsconsole.cli import COMMAND_HELP, build_parser, command_modules, main

ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_GUARD_S = 120  # only so a hang fails the test instead of blocking the run


def eager_subparsers():
    parser = build_parser(import_commands=True)
    return parser, parser._subparsers._group_actions[0]


def run_main(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


def test_the_table_names_every_command_module_with_its_own_help():
    modules = [module.__name__.rsplit(".", 1)[1] for module in command_modules()]
    assert list(COMMAND_HELP) == modules  # a new module is one more line in COMMAND_HELP
    _, commands = eager_subparsers()
    registered = {action.dest: action.help for action in commands._choices_actions}
    for name, help_text in COMMAND_HELP.items():
        assert registered[name] == help_text, name


def test_top_level_help_is_the_same_lazily():
    assert build_parser().format_help() == build_parser(import_commands=True).format_help()


@pytest.mark.parametrize("name", sorted(COMMAND_HELP))
def test_a_lazily_imported_command_gives_the_same_help(name):
    _, commands = eager_subparsers()
    status, out, _ = run_main([name, "--help"])
    assert status == 0
    assert out == commands.choices[name].format_help()
    assert "usage: opsconsole %s" % name in out


@pytest.mark.parametrize("name", sorted(COMMAND_HELP))
def test_a_lazily_imported_command_gives_the_same_usage_error(name):
    status, _, err = run_main([name, "--no-such-option"])
    assert status == 2
    eager, _ = eager_subparsers()
    expected = io.StringIO()
    with contextlib.redirect_stderr(expected), pytest.raises(SystemExit):
        eager.parse_args([name, "--no-such-option"])
    assert err == expected.getvalue()
    assert "error: " in err and "usage: opsconsole" in err


def test_an_unknown_command_lists_every_command():
    status, _, err = run_main(["no-such-command"])
    assert status == 2
    for name in ["snapshot", *COMMAND_HELP]:
        assert repr(name) in err


def test_a_chosen_command_gets_its_handler_and_arguments():
    args = build_parser().parse_args(["--config", "x.toml", "check", "--json", "--node", "a"])
    assert args.handler.__module__ == "opsconsole.commands.check"
    assert (args.config, args.json, args.node) == ("x.toml", True, ["a"])


def test_the_console_and_help_import_no_command_module():
    code = (
        "import sys\n"
        "from opsconsole.cli import build_parser\n"
        "parser = build_parser()\n"
        "parser.parse_args(['--interval', '1', '--logs', 'a.log'])\n"
        "parser.format_help()\n"
        "print(sorted(m for m in sys.modules if m.startswith('opsconsole.commands.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=SUBPROCESS_GUARD_S, check=True
    ).stdout
    assert out.strip() == "['opsconsole.commands._arguments']"


def test_a_command_name_after_logs_is_still_refused():
    status, _, err = run_main(["--logs", "a.log", "report"])
    assert status == 2
    assert "'report' is a command" in err
