"""`opsconsole replay FILE`: the console on a recording, with pause, speed and seek; no actions."""

from __future__ import annotations

import argparse


def register(commands, add_node_options) -> None:
    parser = commands.add_parser(
        "replay",
        help="open the console on a recording (space pauses, +/- speed, [ ] seek)",
        description="Open the console on a recording made by `opsconsole record` or the record key.",
    )
    parser.add_argument("file", metavar="FILE", help="the recording")
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help="config file (theme, keys)")
    parser.add_argument("--speed", type=float, default=1.0, help="playback speed (1 = real time)")
    parser.add_argument(
        "--at",
        metavar="OFFSET",
        default=None,
        help="start this far into the recording: seconds (90), 2m, or m:ss / h:mm:ss as the replay bar shows",
    )
    parser.set_defaults(handler=command_replay)


def command_replay(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from opsconsole.commands._arguments import UsageError, config_from_args, console_theme
    from opsconsole.recording.replay import SPEEDS, ReplayFleet
    from opsconsole.recording.seek import SeekError, offset_seconds, offset_text
    from opsconsole.recording.store import RecordingError
    from opsconsole.sanitize import printable_line

    if not (0 < args.speed <= SPEEDS[-1]):  # NaN and inf fail too
        raise UsageError("--speed must be positive, at most %g, got %g" % (SPEEDS[-1], args.speed))
    at = None
    if args.at is not None:
        try:
            at = offset_seconds(args.at)
        except SeekError as exc:
            raise UsageError(printable_line("--at %s" % exc)) from None
    config = console_theme(config_from_args(args), args)
    config = replace(config, console=replace(config.console, read_only=True))  # nothing to act on in the past
    # The alert hook runs a command outside the console (a pager, a chat webhook): a replayed alert
    # happened in the past, and replaying an incident must not page anyone again. Shown, not sent.
    config = replace(config, alerting=replace(config.alerting, hook=()))
    # [logs] and [[checkpoints]] name this machine's files as they are now, not the recording's: followed
    # in a replay, today's log lines were shown (and their findings alerted, on the recording's clock)
    # as if the recorded nodes had written them. The config is read for its theme and keys.
    config = replace(config, logs=replace(config.logs, paths=(), node_paths=()), checkpoints=())
    try:
        fleet = ReplayFleet(args.file)
    except RecordingError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError("%s: %s" % (printable_line(args.file), exc.strerror or exc)) from None
    fleet.speed = args.speed
    if at is not None:
        length = fleet.reader.end - fleet.reader.start
        if at > length:  # it used to start at the end without a word
            raise UsageError(
                "--at %s is past the end of the recording (%s long): give 0 to %s"
                % (printable_line(args.at.strip()), offset_text(length), offset_text(length))
            )
        fleet.start_at = fleet.reader.start + at
    from opsconsole.tui.app import run_console
    from opsconsole.tui.replay import ReplayConsole

    return run_console(config, fleet, now=fleet.now, console=ReplayConsole)
