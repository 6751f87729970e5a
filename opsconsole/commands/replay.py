"""`opsconsole replay FILE`: the console on a recording, with pause, speed and seek; no actions."""

from __future__ import annotations

import argparse
import math


def register(commands, add_node_options) -> None:
    parser = commands.add_parser(
        "replay",
        help="open the console on a recording (space pauses, +/- speed, [ ] seek)",
        description="Open the console on a recording made by `opsconsole record` or the record key.",
    )
    parser.add_argument("file", metavar="FILE", help="the recording")
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help="config file (theme, keys)")
    parser.add_argument("--speed", type=float, default=1.0, help="playback speed (1 = real time)")
    parser.add_argument("--at", metavar="S", type=float, default=None,
                        help="start S seconds into the recording")
    parser.set_defaults(handler=command_replay)


def command_replay(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from opsconsole.cli import UsageError, config_from_args
    from opsconsole.recording.replay import SPEEDS, ReplayFleet
    from opsconsole.recording.store import RecordingError

    if not (0 < args.speed <= SPEEDS[-1]):  # NaN and inf fail too
        raise UsageError("--speed must be positive, at most %g, got %g" % (SPEEDS[-1], args.speed))
    if args.at is not None and not math.isfinite(args.at):
        raise UsageError("--at must be a number of seconds, got %g" % args.at)
    config = config_from_args(args)
    config = replace(config, console=replace(config.console, read_only=True))  # nothing to act on in the past
    try:
        fleet = ReplayFleet(args.file)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        from opsconsole.sanitize import printable_line

        raise UsageError("%s: %s" % (printable_line(args.file), exc.strerror or exc)) from None
    fleet.speed = args.speed
    if args.at is not None:
        fleet.start_at = fleet.reader.start + args.at
    from opsconsole.tui.app import run_console

    return run_console(config, fleet, now=fleet.now)
