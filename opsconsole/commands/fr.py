"""`opsconsole fr DIR | --collect [DIR] [--json]`: PyTorch flight-recorder dumps of every rank, matched.

Reads every dump in DIR (the files ProcessGroupNCCL writes to `<TORCH_FR_DUMP_TEMP_FILE><rank>`,
host-prefixed copies such as `gpu07_nccl_trace_rank_3`, or `_dump_nccl_trace()`'s bytes saved as
`..._rank_3.pkl`) with the restricted unpickler inside the limited worker, matches collectives by
process group and sequence id, and names the first mismatch: the ranks that never joined
collective N, or joined with another op, size or dtype, with the line they called it from.

`opsconsole fr --collect [DIR] [--node N] [--no-ask] [--wait S]` first gets the dumps: on every
configured node (in parallel, each over its own connection) the ranks are found as `stacks` finds
them, each one's environment says where its flight recorder writes, a `1` is written to its dump
FIFO (unless --no-ask), and the dump files are copied into DIR/<node>/ (a new ./opsconsole-fr-*
directory by default; its path is printed on stderr, with every rank whose dump did not come).

Text: the verdict, the culprits' stacks, then one line per dump. --json: one object {"dumps",
"skipped", "missing_ranks", "mismatch", "summary", "notes"}. The exit status says whether it ran,
as `diagnose` does: 0 when at least one dump was readable (a mismatch found or not), 2 for bad
usage or no readable dump.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, List

from opsconsole.sanitize import printable_json, printable_line


def register(commands: Any, add_node_options: Callable[[argparse.ArgumentParser], None]) -> None:
    parser = commands.add_parser(
        "fr",
        help="match PyTorch flight-recorder dumps across ranks and name the rank that never joined",
        description="Read PyTorch flight-recorder dumps (one file per rank, named ...<rank>) from DIR, match "
        "collectives across ranks by process group and sequence id, and name the first mismatch: the ranks "
        "that never joined collective N or joined with another op, size or dtype, and their lines. "
        "Exit 0 when a dump was read, 2 for bad usage or when no dump could be read.",
    )
    add_node_options(parser)
    parser.add_argument(
        "directory",
        metavar="DIR",
        nargs="?",
        help="the directory holding the dumps (with --collect: where to put them; a new one by default)",
    )
    parser.add_argument(
        "--prefix", metavar="P", help="the dumps' file name stem before the rank (found by itself when left out)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.add_argument(
        "--collect",
        action="store_true",
        help="first ask every rank of the configured nodes for a dump (through its FIFO) and copy the "
        "dumps here over each node's connection, then match them",
    )
    parser.add_argument("--node", action="append", metavar="NAME", help="with --collect: only this node (repeatable)")
    parser.add_argument("--no-ask", action="store_true", help="with --collect: copy the dumps there are, ask for none")
    parser.add_argument(
        "--wait",
        metavar="S",
        type=float,
        help="with --collect: seconds to wait for the ranks to write their dumps (10)",
    )
    parser.set_defaults(handler=command_fr)


def command_fr(args: argparse.Namespace) -> int:
    from opsconsole.commands._arguments import EXIT_BROKEN_PIPE, EXIT_OK, EXIT_USAGE, UsageError
    from opsconsole.hang.flight_recorder import analyse_dir, analysis_json

    if not args.collect and (args.node or args.no_ask or args.wait is not None):
        # Ignored, they would read as if they had chosen what was collected.
        raise UsageError("fr: --node, --no-ask and --wait go with --collect, e.g. fr --collect --node gpu07")
    if args.collect:
        args.directory = _collect(args)
    elif args.directory is None:
        raise UsageError("fr: name the directory of the dumps, or --collect them from the nodes")
    if not os.path.isdir(args.directory):
        raise UsageError("fr: %s is not a directory" % printable_line(args.directory))
    try:
        analysis = analyse_dir(args.directory, args.prefix)
    except OSError as exc:
        raise UsageError("fr: %s: %s" % (printable_line(args.directory), exc.strerror or exc)) from None
    try:
        if args.json:
            sys.stdout.write(printable_json(analysis_json(analysis)) + "\n")
        else:
            sys.stdout.write(report(analysis))
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    if not analysis.readable:
        print(
            printable_line("opsconsole: fr: no readable flight-recorder dump in %s" % args.directory), file=sys.stderr
        )
        return EXIT_USAGE
    return EXIT_OK


def _collect(args: argparse.Namespace) -> str:
    """Ask the configured nodes' ranks for dumps and copy them into the directory; its path."""
    import tempfile

    from opsconsole.commands._arguments import UsageError, config_from_args, run_without_joining_threads
    from opsconsole.commands.stacks import chosen_nodes

    config = chosen_nodes(config_from_args(args), args.node)
    if not config.nodes:
        raise UsageError("fr --collect: no nodes configured")
    if args.wait is None:
        args.wait = 10.0
    if not 0 <= args.wait <= 600:
        raise UsageError("fr --collect: --wait must be between 0 and 600 seconds")
    directory = args.directory or tempfile.mkdtemp(prefix="opsconsole-fr-", dir=".")
    os.makedirs(directory, exist_ok=True)
    results = run_without_joining_threads(_gather(config, directory, not args.no_ask, args.wait))
    for node, collected in results.items():  # type: ignore[attr-defined]
        for rank, why in collected.problems:
            who = "%s rank %d" % (node, rank) if rank >= 0 else node
            print(printable_line("opsconsole: fr: %s: %s" % (who, why)), file=sys.stderr)
    print(printable_line("opsconsole: fr: dumps in %s" % directory), file=sys.stderr)
    return directory


async def _gather(config: Any, directory: str, ask: bool, wait_s: float) -> Any:
    from opsconsole.hang.flight_recorder import collect_from_links
    from opsconsole.nodes.fleet import Fleet

    fleet = Fleet(config)
    try:
        return await collect_from_links({name: fleet.link(name) for name in fleet.names}, directory, ask, wait_s)
    finally:
        await fleet.stop()


def report(analysis: Any) -> str:
    """The verdict for people, then each dump with its rank, host and entry count, or why it was not read."""
    from opsconsole.hang.flight_recorder import rank_list, summary_text

    out: List[str] = [printable_line(line) for line in summary_text(analysis).splitlines()]
    if analysis.missing_ranks:
        missing = analysis.missing_ranks
        out.append("no dump from rank%s %s" % ("" if len(missing) == 1 else "s", rank_list(missing)))
    found = analysis.mismatch
    if found is not None:
        for item in found.culprits:
            entry = item.entry or item.last
            if entry is not None and entry.frames:
                out.append("rank %d stack (innermost first):" % item.rank)
                out.extend(printable_line("    %s" % frame.text()) for frame in entry.frames[:12])
    out.append("")
    out.append("dumps:")
    for dump in analysis.dumps:
        where = dump.path if dump.host is None else "%s (host %s)" % (dump.path, dump.host)
        if dump.unreadable is not None:
            out.append(printable_line("  rank %s  %s  unreadable: %s" % (dump.rank, where, dump.unreadable)))
        else:
            dropped = ", %d malformed left out" % dump.dropped if dump.dropped else ""
            out.append(
                printable_line(
                    "  rank %s  %s  %d entries (version %s%s)"
                    % (dump.rank, where, len(dump.entries), dump.version or "?", dropped)
                )
            )
    for note in analysis.notes:
        out.append(printable_line("  note: %s" % note))
    return "\n".join(out) + "\n"
