"""`opsconsole stacks [--node N] [--pid P] [--native] [--json]`: every rank's Python stack, grouped.

Runs py-spy on each training rank of each node (all nodes at once, over each node's own link), groups
the ranks by identical stack and names the odd ones out. Exit 0 when at least one stack came, 1 when
none did (the errors say why: py-spy missing, ptrace refused, the node down). Function and file
names come from the nodes: the table prints them through sanitize.printable_line, --json through
sanitize.printable_json.
"""

from __future__ import annotations

import argparse
import sys

from opsconsole.sanitize import printable_json, printable_line

EXIT_STACKS = 0
EXIT_NO_STACKS = 1


def register(commands, add_node_options) -> None:
    parser = commands.add_parser(
        "stacks",
        help="dump every training rank's Python stack with py-spy, grouped; name the odd ones out",
        description="Find the training ranks on every node (RANK/LOCAL_RANK in their environment, else the GPU "
        "compute processes), dump each one's Python stack with py-spy, group ranks by identical stack and "
        "name the odd ones out. Exit 0 when at least one stack came, 1 when none did.",
    )
    add_node_options(parser)
    parser.add_argument("--node", action="append", metavar="NAME", help="only this node (repeatable)")
    parser.add_argument(
        "--pid",
        action="append",
        type=_pid,
        metavar="PID",
        help="only this process (repeatable; with several nodes, give --node)",
    )
    parser.add_argument("--native", action="store_true", help="include native (C/C++) frames (py-spy --native)")
    parser.add_argument(
        "--json", action="store_true", help='print {"ranks": [...], "groups": [...], "odd": [...], "errors": [...]}'
    )
    parser.add_argument(
        "--timeout", metavar="S", type=float, default=10.0, help="give up on one process's dump after S seconds (10)"
    )
    parser.set_defaults(handler=command_stacks)


def _pid(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a process id, got %r" % text) from None
    if not 0 < value < 2**31:
        raise argparse.ArgumentTypeError("expected a positive process id, got %r" % text)
    return value


def chosen_nodes(config, names):
    """The config's nodes, or only `names` (UsageError naming an unknown one)."""
    from dataclasses import replace

    from opsconsole.commands._arguments import UsageError

    if not names:
        return config
    known = [node.name for node in config.nodes]
    for name in names:
        if name not in known:
            raise UsageError(
                printable_line("stacks: no node is named %s; nodes: %s" % (name, ", ".join(known) or "none"))
            )
    return replace(config, nodes=tuple(node for node in config.nodes if node.name in names))


async def gather_stacks(config, pids, native: bool, timeout: float):
    """The report over the config's nodes; the links are closed afterwards."""
    from opsconsole.hang.stacks import collect_stacks
    from opsconsole.nodes.fleet import Fleet

    fleet = Fleet(config)
    try:
        links = {name: fleet.link(name) for name in fleet.names}
        by_node = {name: list(pids) for name in links} if pids else None
        return await collect_stacks(links, by_node, native, timeout)
    finally:
        await fleet.stop()


def command_stacks(args: argparse.Namespace) -> int:
    from opsconsole.commands._arguments import UsageError, config_from_args, run_without_joining_threads
    from opsconsole.hang.stacks import StacksReport, report_text

    config = chosen_nodes(config_from_args(args), args.node)
    if not config.nodes:
        raise UsageError("stacks: no nodes configured")
    if args.pid and len(config.nodes) > 1:
        raise UsageError("stacks: --pid names a process of one node: give --node too")
    if not 0 < args.timeout <= 300:
        raise UsageError("stacks: --timeout must be between 0 and 300 seconds")
    report: StacksReport = run_without_joining_threads(gather_stacks(config, args.pid, args.native, args.timeout))  # type: ignore[assignment]
    text = printable_json(report.to_json(), indent=2) + "\n" if args.json else report_text(report)
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return EXIT_STACKS if report.ranks else EXIT_NO_STACKS
