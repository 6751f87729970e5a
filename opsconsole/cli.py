"""The `opsconsole` command: the console, and headless subcommands that share its code path."""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence

from opsconsole import __version__
from opsconsole.commands._arguments import (  # noqa: F401 (main and the tests use them from here)
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    config_from_args,
    console_theme,
    follow_slurm,
    nodes_from_hostlist,
    nodes_from_slurm_job,
    nodes_from_slurm_user,
    run_without_joining_threads,
    slurm_follower,
    watched_from_args,
)
from opsconsole.config import Config, ConfigError
from opsconsole.model import NodeState

# --- argument parsing ------------------------------------------------------


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a number of seconds, got %r" % text) from None
    if not value > 0:
        raise argparse.ArgumentTypeError("expected a positive number of seconds, got %r" % text)
    return value


def _interval(text: str) -> float:
    from opsconsole.config import MAX_INTERVAL_S, MIN_INTERVAL_S

    value = _positive_float(text)
    if not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:  # 1e-300 would spin the poll loop; inf overflows timers
        raise argparse.ArgumentTypeError("expected %g to %g seconds, got %r" % (MIN_INTERVAL_S, MAX_INTERVAL_S, text))
    return value


def _add_node_options(parser: argparse.ArgumentParser, in_subcommand: bool) -> None:
    # In a subcommand the defaults are suppressed, so `opsconsole --config X snapshot`
    # keeps the X given before the subcommand (argparse would overwrite it with None).
    default = argparse.SUPPRESS if in_subcommand else None
    parser.add_argument("--config", metavar="FILE", default=default, help="config file (TOML)")
    nodes = parser.add_mutually_exclusive_group()
    nodes.add_argument(
        "--nodes",
        metavar="HOSTLIST",
        default=default,
        help="watch these SSH nodes instead of the configured ones, e.g. 'gpu[01-04]'",
    )
    nodes.add_argument(
        "--slurm-job", metavar="JOBID", default=default, help="watch the nodes of this Slurm job (via scontrol)"
    )
    nodes.add_argument(
        "--slurm-user", metavar="USER", default=default, help="watch the nodes of all of USER's running Slurm jobs"
    )


class PathsAction(argparse.Action):
    """Several paths after one flag (an unquoted glob the shell expanded), never a command's name:
    `opsconsole --logs a.log report` would follow a file named report and start the console."""

    commands: Sequence[str] = ()

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        for value in values:
            if value in self.commands:
                raise argparse.ArgumentError(
                    self,
                    "%r is a command: give %s after it (opsconsole %s %s ...)"
                    % (value, option_string, value, option_string),
                )
        setattr(namespace, self.dest, (getattr(namespace, self.dest, None) or []) + list(values))


def add_watch_options(parser: argparse.ArgumentParser) -> List[argparse.Action]:
    """--logs and --checkpoints: what [logs] paths and [[checkpoints]] say, without a config file."""
    return [
        parser.add_argument(
            "--logs",
            metavar="GLOB",
            nargs="+",
            action=PathsAction,
            help="follow these log files (globs, quoted or not; on every node), beside [logs] paths",
        ),
        parser.add_argument(
            "--checkpoints",
            metavar="DIR",
            nargs="+",
            action=PathsAction,
            help="list these checkpoint directories of this machine, beside [[checkpoints]]",
        ),
    ]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: console options at the top, one subparser per headless command."""
    parser = argparse.ArgumentParser(
        prog="opsconsole",
        description="A terminal operations console for GPU training clusters.",
    )
    parser.add_argument("--version", action="version", version="opsconsole " + __version__)
    _add_node_options(parser, in_subcommand=False)
    parser.add_argument("--interval", metavar="S", type=_interval, help="seconds between polls")
    parser.add_argument("--read-only", action="store_true", default=None, help="offer no actions that change anything")
    parser.add_argument("--theme", metavar="NAME", help="colour theme")
    watch_actions = add_watch_options(parser)
    parser.set_defaults(handler=command_console)

    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    snapshot = commands.add_parser(
        "snapshot",
        help="poll every node once and print a table (or JSON)",
        description="Poll every configured node once and print what was seen.",
    )
    _add_node_options(snapshot, in_subcommand=True)
    snapshot.add_argument("--json", action="store_true", help="print the states as JSON")
    snapshot.add_argument(
        "--timeout", metavar="S", type=_positive_float, default=10.0, help="give up on a node after S seconds (10)"
    )
    snapshot.set_defaults(handler=command_snapshot)
    for module in command_modules():
        module.register(commands, lambda sub: _add_node_options(sub, in_subcommand=True))
    for action in watch_actions:
        action.commands = tuple(commands.choices)
    return parser


def command_modules() -> list:
    """The headless subcommands under opsconsole/commands/, each with `register(commands, add_node_options)`.

    Found by listing the package, so a new command is one new module. Each module keeps its
    heavy imports inside its handler: parsing `opsconsole --help` must stay fast.
    """
    import importlib
    import pkgutil

    import opsconsole.commands as package

    names = sorted(info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_"))
    return [importlib.import_module("opsconsole.commands." + name) for name in names]


# --- commands ----------------------------------------------------------------


def command_console(args: argparse.Namespace) -> int:
    """Start the interactive console on the configured nodes."""
    config = console_theme(config_from_args(args), args)
    from opsconsole.sources import fleet_with_sources

    fleet = fleet_with_sources(config)
    follow_slurm(fleet, config, slurm_follower(args))
    # Imported only here: the headless commands must not load Textual.
    from opsconsole.tui.app import run_console

    return run_console(config, fleet)


async def take_snapshot(config: Config, timeout: float, follower=None) -> List[NodeState]:
    """One poll of every node of `config` (sources limited to a Slurm job's nodes), links closed afterwards."""
    from opsconsole.sources import fleet_with_sources

    fleet = fleet_with_sources(config)
    if follower is not None:
        fleet.follow_slurm(follower)
    try:
        return await fleet.snapshot(timeout)
    finally:
        await fleet.stop()


def command_snapshot(args: argparse.Namespace) -> int:
    """Poll every node once and print the table or the JSON document."""
    from opsconsole.snapshot_format import snapshot_json, snapshot_table

    config = config_from_args(args)
    states = run_without_joining_threads(take_snapshot(config, args.timeout, slurm_follower(args)))
    text = snapshot_json(states) if args.json else snapshot_table(states)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (`| head`) left early: say nothing, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    return EXIT_OK


# --- entry point -------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run `opsconsole` with `argv` (default: sys.argv[1:]); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
    try:
        return args.handler(args)
    except (ConfigError, UsageError) as exc:
        print("opsconsole: %s" % exc if isinstance(exc, UsageError) else str(exc), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
