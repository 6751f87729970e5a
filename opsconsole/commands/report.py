"""`opsconsole report [--out DIR]`: an incident report (tar.gz) of the configured nodes."""

from __future__ import annotations

import argparse
import os
import sys


def default_report_dir() -> str:
    return os.getcwd()


def register(commands, add_node_options) -> None:
    parser = commands.add_parser(
        "report",
        help="collect an incident report (tar.gz): states, failing checks, log findings, nvidia-smi -q",
        description="Poll every node once and write an incident report as a tar.gz.",
    )
    add_node_options(parser)
    parser.add_argument("--out", metavar="DIR", default=None, help="directory for the report (default: here)")
    parser.add_argument("--timeout", metavar="S", type=float, default=10.0, help="give up on a node after S s")
    parser.set_defaults(handler=command_report)


def command_report(args: argparse.Namespace) -> int:
    from opsconsole.cli import UsageError, config_from_args, run_without_joining_threads
    from opsconsole.report.builder import write_report
    from opsconsole.report.gather import gather

    config = config_from_args(args)
    inputs = run_without_joining_threads(gather(config, timeout=args.timeout))
    try:
        path = write_report(inputs, args.out or default_report_dir())
    except OSError as exc:
        raise UsageError("report: %s: %s" % (args.out or default_report_dir(), exc.strerror or exc)) from None
    print(path)
    if inputs.problems:
        print("%d item(s) could not be collected: see errors.txt in the report" % len(inputs.problems),
              file=sys.stderr)
    return 0
