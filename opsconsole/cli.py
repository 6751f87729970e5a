"""The `opsconsole` command: the console, and headless subcommands that share its code path."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple, cast

from opsconsole import __version__, launch_gc
from opsconsole.commands._arguments import (  # noqa: F401 (main and the tests use them from here)
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    config_from_args,
    console_theme,
    follow_slurm,
    known_theme,
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
    # The commands that take the flag themselves: for the others, the advice is not to name one.
    TAKEN_BY: Dict[str, Tuple[str, ...]] = {"--logs": ("report",)}

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        for value in values:
            if value in self.commands:
                if value in self.TAKEN_BY.get(str(option_string), ()):
                    advice = "give %s after it (opsconsole %s %s ...)" % (option_string, value, option_string)
                else:
                    advice = "it takes no %s; %s is for the console (opsconsole %s PATH ..., no command)" % (
                        option_string,
                        option_string,
                        option_string,
                    )
                raise argparse.ArgumentError(self, "%r is a command: %s" % (value, advice))
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


# The headless subcommands under opsconsole/commands/, one module each, with the one-line help the
# console's --help lists. A module is imported (and its register() adds its arguments) only when its
# command is chosen: the console's launch and `opsconsole --help` load none of them.
# tests/test_cli_lazy.py checks this table against the package's modules and their help.
COMMAND_HELP: Dict[str, str] = {
    "agent": "run the probe on this node: JSON lines, or a Prometheus exporter with --metrics-port",
    "check": "run the health checks once (exit 0 pass/warn, 1 fail, 2 could not run)",
    "checkpoints": "list a checkpoint directory: format, epoch/step, loss, size, integrity",
    "cleanup": "delete old checkpoints by a retention plan (shown first)",
    "demo": "start a small real training run that fails, and open the console on it",
    "diagnose": "recognise failures (CUDA, NCCL, OOM, NaN, I/O, data) in log files and name the root cause",
    "fr": "match PyTorch flight-recorder dumps across ranks and name the rank that never joined",
    "record": "record every node's states to a file (replay it with `opsconsole replay`)",
    "replay": "open the console on a recording (space pauses, +/- speed, [ ] seek)",
    "report": "collect an incident report (tar.gz): states, failing checks, log findings, nvidia-smi -q",
    "stacks": "dump every training rank's Python stack with py-spy, grouped; name the odd ones out",
}


class LazyCommands(argparse._SubParsersAction):
    """argparse's subcommands, where a command of COMMAND_HELP is a placeholder (its name and help)
    until it is chosen: then its module is imported and registers the real subparser in its place,
    and parsing goes on as if it had been there all along."""

    add_node_options: Callable[[argparse.ArgumentParser], None]
    placeholders: FrozenSet[str] = frozenset()  # commands whose module is not imported yet

    def add_placeholder(self, name: str, help_text: str) -> None:
        self.add_parser(name, help=help_text)
        self.placeholders = self.placeholders | {name}

    def load(self, name: str) -> None:
        """Import command `name`'s module and let it register its subparser (once)."""
        if name not in self.placeholders:
            return
        self.placeholders = self.placeholders - {name}
        del self._name_parser_map[name]
        self._choices_actions = [action for action in self._choices_actions if action.dest != name]
        importlib.import_module("opsconsole.commands." + name).register(self, self.add_node_options)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        self.load(values[0])
        super().__call__(parser, namespace, values, option_string)


def build_parser(import_commands: bool = False) -> argparse.ArgumentParser:
    """The argument parser: console options at the top, one subparser per headless command.

    `import_commands` registers every command's arguments now (what parsing a command does for
    that one command): for tests that compare them, and tools that list every option."""
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

    commands = parser.add_subparsers(dest="command", metavar="COMMAND", action=LazyCommands)
    assert isinstance(commands, LazyCommands)
    commands.add_node_options = lambda sub: _add_node_options(sub, in_subcommand=True)
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
    for name, help_text in COMMAND_HELP.items():
        commands.add_placeholder(name, help_text)
    if import_commands:
        for name in COMMAND_HELP:
            commands.load(name)
    for action in watch_actions:
        action.commands = tuple(commands.choices)
    return parser


def command_modules() -> list:
    """Every module under opsconsole/commands/ (each with `register(commands, add_node_options)`),
    found by listing the package: what COMMAND_HELP must name. Imports them all (tests, tools)."""
    import pkgutil

    import opsconsole.commands as package

    names = sorted(info.name for info in pkgutil.iter_modules(package.__path__) if not info.name.startswith("_"))
    return [importlib.import_module("opsconsole.commands." + name) for name in names]


# --- commands ----------------------------------------------------------------


def command_console(args: argparse.Namespace) -> int:
    """Start the interactive console on the configured nodes."""
    from opsconsole.launch_trace import mark

    mark("arguments parsed")
    config = config_from_args(args)
    if config.console.keys:
        # A remap onto a key in use is a config error (exit 2) before any node is polled; it needs
        # every pane's bindings, so only a config that remaps keys imports them this early.
        from opsconsole.tui.app import all_key_specs
        from opsconsole.tui.keys import keymap_from_config

        keymap_from_config(config.console.keys, all_key_specs(), config.source)
    from opsconsole.sources import fleet_with_sources

    fleet = fleet_with_sources(config)  # the fleet reads no theme: the one picked below is the app's
    # The local node's first poll (the probe's imports, NVML's start, every process) runs in its
    # thread while Textual loads and lays out the first screen, which then waits less for data.
    for name in fleet.names:
        start_first_poll = getattr(fleet.link(name), "start_first_poll", None)
        if start_first_poll is not None:
            start_first_poll()
    mark("config read, first poll started")
    config = console_theme(config, args)  # loads Textual
    mark("textual imported")
    follow_slurm(fleet, config, slurm_follower(args))
    # Imported only here: the headless commands must not load Textual.
    from opsconsole.tui.app import run_console

    return run_console(config, fleet)


async def take_snapshot(config: Config, timeout: float, follower=None) -> List[NodeState]:
    """One poll of every node of `config` (sources limited to a Slurm job's nodes), links closed afterwards."""
    states, _sources = await take_snapshot_with_sources(config, timeout, follower)
    return states


async def take_snapshot_with_sources(
    config: Config, timeout: float, follower=None
) -> Tuple[List[NodeState], List[Any]]:
    """take_snapshot's states, and each source's status after the poll (what Prometheus said, or why not)."""
    from opsconsole.sources import fleet_with_sources

    fleet = fleet_with_sources(config)
    if follower is not None:
        fleet.follow_slurm(follower)
    try:
        states = await fleet.snapshot(timeout)
        return states, fleet.source_statuses()
    finally:
        await fleet.stop()


def command_snapshot(args: argparse.Namespace) -> int:
    """Poll every node once and print the table or the JSON document."""
    from opsconsole.snapshot_format import snapshot_json, snapshot_table

    config = config_from_args(args)
    states, sources = cast(
        Tuple[List[NodeState], List[Any]],
        run_without_joining_threads(take_snapshot_with_sources(config, args.timeout, slurm_follower(args))),
    )
    # A source's state goes with the nodes: an unreachable Prometheus reports no node at all, and
    # printed nothing (or {"nodes": []}) with exit 0, as if the cluster were empty.
    text = snapshot_json(states, sources=sources) if args.json else snapshot_table(states, sources=sources)
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
    launch_gc.pause()  # the console's launch runs without cyclic collections (launch_gc.py)
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version, or a usage error argparse already printed
            return exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_USAGE)
        # Not kept while the handler runs (the console's whole life): the parser, its subparsers and
        # their actions are ~80 kB, freed by the first frame's collection (they are cycles).
        del parser
        if args.handler is not command_console:
            launch_gc.resume()  # only the console's launch goes without
        try:
            if args.handler is not command_console and getattr(args, "theme", None):
                # `opsconsole --theme bogus snapshot` is refused as the console refuses it; the console
                # checks it after its first poll has started (Textual's import overlaps the poll).
                known_theme(args.theme)
            return args.handler(args)
        except (ConfigError, UsageError) as exc:
            print("opsconsole: %s" % exc if isinstance(exc, UsageError) else str(exc), file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
    finally:
        launch_gc.resume()  # the console resumed at its first frame; this is for every other way out


if __name__ == "__main__":
    sys.exit(main())
