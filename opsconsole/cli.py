"""The `opsconsole` command: the console, and headless subcommands that share its code path."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import replace
from typing import Callable, List, Optional, Sequence

from opsconsole import __version__
from opsconsole.config import Config, ConfigError, NodeConfig
from opsconsole.model import NodeState

EXIT_OK = 0
EXIT_USAGE = 2  # bad arguments or a bad config: nothing was polled
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell sees from a tool killed by SIGPIPE


class UsageError(Exception):
    """A bad argument, already worded for the user (one line)."""


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
                raise argparse.ArgumentError(self, "%r is a command: give %s after it (opsconsole %s %s ...)"
                                             % (value, option_string, value, option_string))
        setattr(namespace, self.dest, (getattr(namespace, self.dest, None) or []) + list(values))


def add_watch_options(parser: argparse.ArgumentParser) -> List[argparse.Action]:
    """--logs and --checkpoints: what [logs] paths and [[checkpoints]] say, without a config file."""
    return [
        parser.add_argument("--logs", metavar="GLOB", nargs="+", action=PathsAction,
                            help="follow these log files (globs, quoted or not; on every node), beside [logs] paths"),
        parser.add_argument("--checkpoints", metavar="DIR", nargs="+", action=PathsAction,
                            help="list these checkpoint directories of this machine, beside [[checkpoints]]"),
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


# --- config from arguments -------------------------------------------------


def nodes_from_hostlist(pattern: str) -> List[NodeConfig]:
    """SSH nodes named by a Slurm-style hostlist (`gpu[01-04],login1`), shared defaults for the rest."""
    from opsconsole.hostlist import expand_hostlist

    try:
        names = expand_hostlist(pattern)
    except ValueError as exc:
        raise UsageError("--nodes %s: %s" % (pattern, exc)) from None
    if not names:
        raise UsageError("--nodes %r names no nodes" % pattern)
    return _ssh_nodes(names)


def nodes_from_slurm_job(job_id: str) -> List[NodeConfig]:
    """SSH nodes of a Slurm job, asked of scontrol."""
    from opsconsole.nodes.slurm import SlurmUnavailable, job_nodes

    try:
        return _ssh_nodes(job_nodes(job_id))
    except SlurmUnavailable as exc:
        raise UsageError("--slurm-job %s: %s" % (job_id, exc)) from None


def nodes_from_slurm_user(user: str) -> List[NodeConfig]:
    """SSH nodes of every running Slurm job of `user`, asked of squeue."""
    from opsconsole.nodes.slurm import SlurmUnavailable, query_user_jobs

    try:
        jobs = query_user_jobs(user)
    except SlurmUnavailable as exc:
        raise UsageError("--slurm-user %s: %s" % (user, exc)) from None
    names = [node for job in jobs for node in job.nodes]
    if not names:
        raise UsageError("--slurm-user %s: no running jobs with nodes" % user)
    return _ssh_nodes(names)


def slurm_follower(args: argparse.Namespace):
    """A SlurmFollower for --slurm-job/--slurm-user (first query done), None without them."""
    job, user = getattr(args, "slurm_job", None), getattr(args, "slurm_user", None)
    if not job and not user:
        return None
    from opsconsole.nodes.slurm import SlurmFollower

    follower = SlurmFollower(job_id=job or None, user=None if job else user)
    follower.poll()
    return follower


def follow_slurm(fleet, config: Config, follower) -> None:
    """Make `fleet` follow the job's nodes: joiners get an SSH link, leavers are removed."""
    if follower is None:
        return
    import asyncio

    from opsconsole.nodes.fleet import build_link

    limiter = []

    def link_for(name: str):
        if not limiter:  # made on first use, inside the running loop
            limiter.append(asyncio.Semaphore(config.ssh.max_logins))
        return build_link(NodeConfig(name=name, host=name), config, limiter[0])

    fleet.follow_slurm(follower, link_factory=link_for)


def _ssh_nodes(names: Sequence[str]) -> List[NodeConfig]:
    unique = list(dict.fromkeys(names))  # a hostlist may name a host twice; one link per node
    return [NodeConfig(name=name, host=name) for name in unique]


def config_from_args(args: argparse.Namespace, load: Optional[Callable[..., Config]] = None) -> Config:
    """The config file (or default) with the command line's overrides applied."""
    if load is None:
        from opsconsole.config import load_config as load
    config = load(getattr(args, "config", None))
    if getattr(args, "nodes", None):
        config = replace(config, nodes=tuple(nodes_from_hostlist(args.nodes)))
    elif getattr(args, "slurm_job", None):
        config = replace(config, nodes=tuple(nodes_from_slurm_job(args.slurm_job)))
    elif getattr(args, "slurm_user", None):
        config = replace(config, nodes=tuple(nodes_from_slurm_user(args.slurm_user)))
    console = config.console
    if getattr(args, "interval", None) is not None:
        console = replace(console, interval=args.interval)
    if getattr(args, "read_only", None):
        console = replace(console, read_only=True)
    if getattr(args, "theme", None):
        console = replace(console, theme=args.theme)
    config = replace(config, console=console)
    return watched_from_args(config, args)


def watched_from_args(config: Config, args: argparse.Namespace) -> Config:
    """Add --logs globs to [logs] paths and --checkpoints directories to [[checkpoints]]."""
    from opsconsole.config import CheckpointDirConfig
    from opsconsole.sanitize import printable_line

    globs = [glob for glob in getattr(args, "logs", None) or () if glob not in config.logs.paths]
    for glob in globs:
        if not glob.strip():
            raise UsageError("--logs: an empty glob names no file")
    if globs:
        paths = config.logs.paths + tuple(dict.fromkeys(os.path.expanduser(glob) for glob in globs))
        config = replace(config, logs=replace(config.logs, paths=paths))
    dirs = []
    for directory in getattr(args, "checkpoints", None) or ():
        path = os.path.abspath(os.path.expanduser(directory))
        if not os.path.isdir(path):  # a typo is said now, not as an empty pane
            why = "no such directory" if not os.path.exists(path) else "not a directory"
            raise UsageError(printable_line("--checkpoints %s: %s" % (directory, why)))
        if all(entry.path != path or entry.node is not None for entry in config.checkpoints + tuple(dirs)):
            dirs.append(CheckpointDirConfig(path=path))
    if dirs:
        config = replace(config, checkpoints=config.checkpoints + tuple(dirs))
    return config


# --- commands ----------------------------------------------------------------


def console_theme(config: Config, args: argparse.Namespace) -> Config:
    """The theme a console starts with: --theme (refused when unknown), else the one last picked
    with ctrl+t, else the config's. Loads Textual: only for the commands that start the console."""
    from opsconsole.sanitize import printable_line
    from opsconsole.tui.themes import resolve_theme_name, saved_theme, theme_names

    wanted = getattr(args, "theme", None)
    if wanted:
        names = theme_names()
        name = resolve_theme_name(wanted, names)
        if name is None:
            raise UsageError(printable_line("--theme %s: no such theme; available: %s" % (wanted, ", ".join(names))))
    else:
        name = saved_theme()
    if not name:
        return config
    return replace(config, console=replace(config.console, theme=name))


def command_console(args: argparse.Namespace) -> int:
    """Start the interactive console on the configured nodes."""
    config = console_theme(config_from_args(args), args)
    from opsconsole.nodes.fleet import Fleet

    fleet = Fleet(config)
    follow_slurm(fleet, config, slurm_follower(args))
    # Imported only here: the headless commands must not load Textual.
    from opsconsole.tui.app import run_console

    return run_console(config, fleet)


async def take_snapshot(config: Config, timeout: float, follower=None) -> List[NodeState]:
    """One poll of every node of `config` (sources limited to a Slurm job's nodes), links closed afterwards."""
    from opsconsole.nodes.fleet import Fleet

    fleet = Fleet(config)
    if follower is not None:
        fleet.follow_slurm(follower)
    try:
        return await fleet.snapshot(timeout)
    finally:
        await fleet.stop()


def run_without_joining_threads(coro) -> object:
    """Like asyncio.run, but does not wait for worker threads a timed-out poll left behind."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=1.0))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


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
