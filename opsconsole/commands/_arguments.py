"""What the commands do with their arguments: exit statuses, usage errors, the config with the command
line's overrides (nodes from a hostlist or a Slurm job, watched logs and checkpoints, the theme), and
running a coroutine to its end.

Shared by opsconsole.cli (the entry point) and the modules of opsconsole.commands, so that no command
imports the entry point. Not a command itself (the leading underscore keeps it out of the listing).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import replace
from typing import Callable, List, Optional, Sequence

from opsconsole.config import Config, NodeConfig

EXIT_OK = 0
EXIT_USAGE = 2  # bad arguments or a bad config: nothing was polled
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell sees from a tool killed by SIGPIPE


class UsageError(Exception):
    """A bad argument, already worded for the user (one line)."""


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


def known_theme(wanted: str) -> str:
    """The theme --theme names (a short name such as `light` works); UsageError naming the themes when none.

    Every command that takes --theme checks it here, the headless ones too (they draw no theme, but a typo
    accepted there would be refused by the console): Textual is loaded for it only when --theme is given."""
    from opsconsole.sanitize import printable_line
    from opsconsole.tui.themes import resolve_theme_name, theme_names

    names = theme_names()
    name = resolve_theme_name(wanted, names)
    if name is None:
        raise UsageError(printable_line("--theme %s: no such theme; available: %s" % (wanted, ", ".join(names))))
    return name


def console_theme(config: Config, args: argparse.Namespace) -> Config:
    """The theme a console starts with: --theme (refused when unknown), else the one last picked
    with ctrl+t, else the config's. Loads Textual: only for the commands that start the console."""
    from opsconsole.tui.themes import saved_theme

    wanted = getattr(args, "theme", None)
    name = known_theme(wanted) if wanted else saved_theme()
    if not name:
        return config
    return replace(config, console=replace(config.console, theme=name))


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
