"""A recorded 8-GPU node replayed as a still picture: what the overview and units tests look at."""

from __future__ import annotations

from opsconsole.config import Config, ConsoleConfig
from opsconsole.recording.recorder import Recorder
from opsconsole.recording.replay import RecordingReader, ReplayFleet
from opsconsole.tui.replay import ReplayConsole
from tests.recording_frames import fleet_ticks


def record_one_node(path: str, ticks: int) -> str:
    """A recording of one 8-GPU node (frames derived from the real H200 capture), `ticks` seconds long."""
    with Recorder(path) as recorder:
        for states in fleet_ticks(nodes=1, ticks=ticks):
            for state in states:
                recorder.observe(state)
    return path


def paused_replay(path: str, at: int, history: bool = False) -> ReplayConsole:
    """The replay console paused `at` seconds in (the clock does not move between runs); with
    `history`, its history filled with what the console would have seen playing up to there."""
    fleet = ReplayFleet(path)
    start = RecordingReader(path)
    fleet.start_at = start.start + at
    fleet.paused = True
    app = ReplayConsole(Config(console=ConsoleConfig(read_only=True)), fleet, now=fleet.now)
    if history:
        for second in range(at + 1):
            for state in start.advance(start.start + second):
                app.services.history.observe(state)
    start.close()
    return app
