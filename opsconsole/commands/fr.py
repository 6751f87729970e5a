"""`opsconsole fr DIR [--prefix P] [--json]`: PyTorch flight-recorder dumps of every rank, matched.

Reads every dump in DIR (the files ProcessGroupNCCL writes to `<TORCH_FR_DUMP_TEMP_FILE><rank>`,
host-prefixed copies such as `gpu07_nccl_trace_rank_3`, or `_dump_nccl_trace()`'s bytes saved as
`..._rank_3.pkl`) with the restricted unpickler inside the limited worker, matches collectives by
process group and sequence id, and names the first mismatch: the ranks that never joined
collective N, or joined with another op, size or dtype, with the line they called it from.

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
    parser.add_argument("directory", metavar="DIR", help="the directory holding the dumps")
    parser.add_argument("--prefix", metavar="P", help="the dumps' file name stem before the rank (found by itself when left out)")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    parser.set_defaults(handler=command_fr)


def command_fr(args: argparse.Namespace) -> int:
    from opsconsole.commands._arguments import EXIT_BROKEN_PIPE, EXIT_OK, EXIT_USAGE, UsageError
    from opsconsole.hang.flight_recorder import analyse_dir, analysis_json

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
        print(printable_line("opsconsole: fr: no readable flight-recorder dump in %s" % args.directory), file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def report(analysis: Any) -> str:
    """The verdict for people, then each dump with its rank, host and entry count, or why it was not read."""
    from opsconsole.hang.flight_recorder import rank_list, summary_text

    out: List[str] = [printable_line(line) for line in summary_text(analysis).splitlines()]
    if analysis.missing_ranks:
        out.append("no dump from rank%s %s" % ("" if len(analysis.missing_ranks) == 1 else "s", rank_list(analysis.missing_ranks)))
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
            out.append(printable_line("  rank %s  %s  %d entries (version %s%s)" % (dump.rank, where, len(dump.entries),
                                                                                 dump.version or "?", dropped)))
    for note in analysis.notes:
        out.append(printable_line("  note: %s" % note))
    return "\n".join(out) + "\n"
