"""--logs and --checkpoints: the Logs and Checkpoints panes of a console started without a TOML file."""

from __future__ import annotations

import pytest
from cli_errors import assert_one_line_exit_2

from opsconsole.cli import build_parser, config_from_args, main
from opsconsole.config import DEFAULT_CONFIG, CheckpointDirConfig, Config, LogsConfig
from tests.checkpoint_writers import write_seed_layout
from tests.test_tui_tmux import Tmux, console_command, tmux  # noqa: F401 (the fixture)


def parse(argv):
    return build_parser().parse_args(argv)


def test_flags_add_to_what_the_config_says(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run1").mkdir()
    (tmp_path / "run2").mkdir()
    configured = Config(logs=LogsConfig(paths=("/var/log/a.log",)), checkpoints=(CheckpointDirConfig(path="/ckpt"),))
    args = parse(
        [
            "--logs",
            "/var/log/a.log",
            "logs/*.log",
            "b.log",
            "--checkpoints",
            "run1",
            str(tmp_path / "run2"),
            "--logs",
            "~/c.log",
        ]
    )
    config = config_from_args(args, load=lambda path: configured)
    assert config.logs.paths == ("/var/log/a.log", "logs/*.log", "b.log", str(tmp_path.home() / "c.log"))
    assert [d.path for d in config.checkpoints] == ["/ckpt", str(tmp_path / "run1"), str(tmp_path / "run2")]
    assert all(d.node is None and d.keep == CheckpointDirConfig.keep for d in config.checkpoints)
    # Without the flags nothing changes.
    assert config_from_args(parse([]), load=lambda path: DEFAULT_CONFIG) == DEFAULT_CONFIG


def test_report_takes_logs_after_its_name_and_a_command_is_never_read_as_a_path(capsys):
    args = parse(["report", "--logs", "a.log", "b*.log"])
    assert args.command == "report" and args.logs == ["a.log", "b*.log"]
    assert parse(["report"]).logs is None
    # Before the command, a greedy --logs would eat its name and start the console instead.
    assert main(["--logs", "a.log", "report"]) == 2
    err = capsys.readouterr().err
    assert "'report' is a command: give --logs after it (opsconsole report --logs ...)" in err


def test_the_advice_names_a_command_only_where_it_takes_the_flag(capsys):
    """`opsconsole --logs x snapshot` was told to give `snapshot --logs`, which snapshot refuses."""
    import argparse

    from opsconsole.cli import COMMAND_HELP, PathsAction

    parser = build_parser(import_commands=True)
    (commands,) = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    for command in COMMAND_HELP:
        for flag in ("--logs", "--checkpoints"):
            takes = flag in commands.choices[command]._option_string_actions
            assert takes == (command in PathsAction.TAKEN_BY.get(flag, ())), (command, flag)
    assert main(["--logs", "a.log", "snapshot"]) == 2
    err = capsys.readouterr().err
    assert "'snapshot' is a command: it takes no --logs; --logs is for the console (opsconsole --logs PATH" in err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--checkpoints", "/nonexistent-dir"], ("--checkpoints /nonexistent-dir: no such directory",)),
        (["--checkpoints", "FILE"], ("not a directory",)),
        (["--logs", " "], ("--logs: an empty glob",)),
    ],
)
def test_bad_flags_are_one_line_exit_2(tmp_path, capsys, argv, words):
    (tmp_path / "FILE").write_text("x")
    argv = [str(tmp_path / a) if a == "FILE" else a for a in argv]
    assert_one_line_exit_2(main(argv), capsys.readouterr().err, *words)


@pytest.mark.tmux
def test_logs_and_checkpoints_panes_work_from_the_flags_alone(tmux, tmp_path):  # noqa: F811
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text("step 41 loss 2.31\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    (logs / "rank1.log").write_text("step 41 loss 2.30\n")
    write_seed_layout(tmp_path / "ckpts")
    home = tmp_path / "home"
    home.mkdir()
    # No --config and no config file in the (temp) home: the flags are all the console has.
    tmux.start(console_command(home, "--logs", str(logs / "*.log"), "--checkpoints", str(tmp_path / "ckpts")))
    tmux.wait_for("newest frame")
    tmux.keys("6")
    screen = tmux.wait_for("CUDA out of memory", "rank0.log")
    assert "step 41 loss 2.30" in screen or "rank1.log" in screen
    tmux.keys("7")
    screen = tmux.wait_for("6 units · 5 managed", "checkpoint_best.pt", "latest")
    assert str(tmp_path / "ckpts") in screen and screen.count("checkpoint_epoch_") == 5
    tmux.keys("q")
    assert tmux.wait_gone()
