"""`opsconsole record --out FILE`: record the fleet's states headless, until stopped or --duration."""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opsconsole.recording.recorder import RecorderStats


def register(commands, add_node_options) -> None:
    parser = commands.add_parser(
        "record",
        help="record every node's states to a file (replay it with `opsconsole replay`)",
        description="Poll the configured nodes and record their states, headless, until interrupted.",
    )
    add_node_options(parser)
    parser.add_argument("--out", metavar="FILE", required=True, help="recording file to write (appended if it exists)")
    parser.add_argument("--duration", metavar="S", type=float, default=None, help="stop after S seconds")
    parser.add_argument("--interval", metavar="S", type=float, default=None, help="seconds between polls")
    # MiB, as the recorder counts them ([record] max_mb, 1024 * 1024 bytes each); the flag keeps its name.
    parser.add_argument("--max-mb", metavar="MIB", type=float, default=None, help="keep the file under MIB MiB")
    parser.add_argument(
        "--progress",
        action="store_true",
        help="print a progress line every %g s even when stderr is not a terminal" % PROGRESS_S,
    )
    parser.set_defaults(handler=command_record)


PROGRESS_S = 2.0  # how often the progress line is written: readable, and cheap on a slow terminal


def progress_line(out: str, stats, elapsed_s: float) -> str:
    """ "recording to FILE: 120 states, 3 chunks, 41 KiB written, 1:02 elapsed"."""
    from opsconsole.recording.seek import offset_text
    from opsconsole.sanitize import printable_line
    from opsconsole.units import format_bytes

    return "recording to %s: %d states, %d chunks, %s written, %s elapsed" % (
        printable_line(out),
        stats.records,
        stats.chunks,
        format_bytes(stats.bytes_written),
        offset_text(elapsed_s),
    )


class ProgressReporter:
    """Writes the progress line to `stream`: rewritten in place on a terminal, a line each time otherwise."""

    def __init__(self, stream, out: str, started: float, in_place: bool) -> None:
        self.stream, self.out, self.started, self.in_place = stream, out, started, in_place
        self.shown = False

    def show(self, stats) -> None:
        line = progress_line(self.out, stats, time.monotonic() - self.started)
        self.stream.write("\r\x1b[K" + line if self.in_place else line + "\n")
        self.stream.flush()
        self.shown = True

    def finish(self) -> None:
        """Leave the in-place line, so the summary starts on a line of its own."""
        if self.in_place and self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


async def report_progress(recorder, reporter: "ProgressReporter") -> None:
    while True:
        await asyncio.sleep(PROGRESS_S)
        reporter.show(recorder.stats)


async def record(
    config, out: str, duration, stop_event: asyncio.Event, reporter: "ProgressReporter" = None
) -> "RecorderStats":
    from opsconsole.recording.recorder import Recorder
    from opsconsole.sources import fleet_with_sources

    rec = config.record
    # The file first: a bad --out is refused before any node is reached.
    recorder = Recorder(out, chunk_s=rec.chunk_s, max_bytes=int(rec.max_mb * 1024 * 1024), max_age_s=rec.max_age_s)
    fleet = fleet_with_sources(config)
    progress = None if reporter is None else asyncio.ensure_future(report_progress(recorder, reporter))
    try:
        await fleet.start(recorder.observe)
        try:
            await asyncio.wait_for(stop_event.wait(), duration)
        except asyncio.TimeoutError:
            pass
    finally:
        if progress is not None:
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)
            reporter.finish()
        await fleet.stop()
        recorder.close()
    return recorder.stats


def command_record(args: argparse.Namespace) -> int:
    import sqlite3
    from dataclasses import replace

    from opsconsole.commands._arguments import UsageError, config_from_args
    from opsconsole.config import MAX_INTERVAL_S, MAX_RECORD_MB, MIN_INTERVAL_S
    from opsconsole.recording.store import RecordingError
    from opsconsole.sanitize import printable_line

    if args.duration is not None and not (args.duration > 0 and math.isfinite(args.duration)):
        raise UsageError("--duration must be a positive number of seconds")
    if args.interval is not None and not (MIN_INTERVAL_S <= args.interval <= MAX_INTERVAL_S):
        raise UsageError(
            "--interval must be between %g and %g seconds, got %g" % (MIN_INTERVAL_S, MAX_INTERVAL_S, args.interval)
        )
    if args.max_mb is not None and not (0 < args.max_mb <= MAX_RECORD_MB):
        raise UsageError("--max-mb must be above 0 and at most %g, got %g" % (MAX_RECORD_MB, args.max_mb))
    config = config_from_args(args)
    if args.max_mb is not None:
        config = replace(config, record=replace(config.record, max_mb=args.max_mb))
    loop = asyncio.new_event_loop()
    stop_event = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop_event.set)
    started = time.monotonic()
    in_place = sys.stderr.isatty()
    reporter = ProgressReporter(sys.stderr, args.out, started, in_place) if in_place or args.progress else None
    try:
        stats = loop.run_until_complete(record(config, args.out, args.duration, stop_event, reporter))
    except RecordingError as exc:  # already names the file
        raise UsageError(str(exc)) from None
    except (OSError, sqlite3.Error) as exc:
        raise UsageError("%s: %s" % (printable_line(args.out), getattr(exc, "strerror", None) or exc)) from None
    finally:
        loop.close()
    from opsconsole.units import format_bytes, format_duration

    print(
        "recorded %d states of %d node(s) in %s to %s (%d chunks, %s)"
        % (
            stats.records,
            len(config.nodes),
            format_duration(time.monotonic() - started),
            printable_line(args.out),
            stats.chunks,
            format_bytes(stats.bytes_written),
        ),
        file=sys.stderr,
    )
    return 0
