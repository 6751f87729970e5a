"""`opsconsole report [--out DIR|FILE.tar.gz]`: an incident report (tar.gz, 0600) of the configured nodes."""

from __future__ import annotations

import argparse
import sys


def register(commands, add_node_options) -> None:
    parser = commands.add_parser(
        "report",
        help="collect an incident report (tar.gz): states, failing checks, log findings, nvidia-smi -q",
        description="Poll every node once and write an incident report as a tar.gz (0600, secrets redacted).",
    )
    add_node_options(parser)
    parser.add_argument(
        "--out",
        metavar="DIR|FILE.tar.gz",
        default=None,
        help="an existing directory for the report, or a new FILE.tar.gz in an existing directory (never made, never "
        "overwritten); default: $XDG_STATE_HOME/opsconsole/reports (0700)",
    )
    parser.add_argument("--timeout", metavar="S", type=float, default=10.0, help="give up on a node after S s")
    parser.add_argument(
        "--logs",
        metavar="GLOB",
        nargs="+",
        action="extend",
        default=argparse.SUPPRESS,
        help="also take the last lines of these log files (globs), beside [logs] paths",
    )
    parser.set_defaults(handler=command_report)


def command_report(args: argparse.Namespace) -> int:
    from opsconsole.commands._arguments import UsageError, config_from_args, run_without_joining_threads
    from opsconsole.report.builder import ReportDestinationError, default_report_dir, report_destination, write_report
    from opsconsole.report.gather import gather

    config = config_from_args(args)
    try:
        report_destination(args.out)  # a bad --out fails now, not after the nodes were polled
    except ReportDestinationError as exc:
        raise UsageError("report: %s" % exc) from None
    except OSError as exc:
        raise UsageError("report: %s: %s" % (exc.filename or default_report_dir(), exc.strerror or exc)) from None
    inputs = run_without_joining_threads(gather(config, timeout=args.timeout))
    try:
        path = write_report(inputs, args.out)
    except ReportDestinationError as exc:
        raise UsageError("report: %s" % exc) from None
    except OSError as exc:
        where = exc.filename or args.out or default_report_dir()
        raise UsageError("report: %s: %s" % (where, exc.strerror or exc)) from None
    print(path)
    if inputs.problems:
        print("%d item(s) could not be collected: see errors.txt in the report" % len(inputs.problems), file=sys.stderr)
    return 0
