"""The process details screen of a GPU-only row: a live process on a slow poll is not called exited.

A GPU row carries how long the process had run when the probe sampled it, somewhere within the
poll (probe_ms) after the frame's time. The screen used to take the start as frame.time - elapsed
with the fixed 1.5 s slack, so on an 8 s poll a live process read as started 4 s earlier than it
did, and the node's reader answered "this process has exited". It now estimates the start as the
signal actions do (actions.signals.identity_in_frame: mid-poll, the slack widened by half the poll)
and passes that slack to the reader. Real parts: a child process this test starts, the real /proc
reader through a real LocalLink, the real screen in a Textual app.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from textual.app import App

from opsconsole.config import NodeConfig
from opsconsole.model import NodeFrame, ProcessSample
from opsconsole.nodes.local import LocalLink
from opsconsole.nodes.process_details import MOVED, fetch_process_details
from opsconsole.probe.proc_details import read_details
from opsconsole.tui.process_details import ProcessDetailsScreen, frame_text, listed_start, listed_start_slack
from tests.waiting import wait_for

POLL_MS = 8000.0  # a slow poll: the GPU row's age was sampled up to 8 s after the frame's time


@pytest.fixture
def sleeper():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def gpu_only_frame(pid: int, started: float, sampled_after: float, probe_ms: float = POLL_MS) -> NodeFrame:
    """A frame listing `pid` on a GPU only, its age sampled `sampled_after` s after the frame's time."""
    frame_time = time.time()
    elapsed = round(frame_time + sampled_after - started, 1)
    row = ProcessSample(pid=pid, name="python", elapsed_s=elapsed, gpu_index=0, gpu_memory_bytes=1 << 30)
    return NodeFrame(node="local", time=frame_time, processes=(row,), probe_ms=probe_ms)


async def test_a_live_gpu_process_sampled_late_in_a_slow_poll_is_read_not_called_exited(sleeper):
    started = read_details(sleeper.pid)["start_time"]
    frame = gpu_only_frame(sleeper.pid, started, sampled_after=POLL_MS / 1000.0 * 0.9)
    assert listed_start_slack(sleeper.pid, frame) > POLL_MS / 2000.0
    assert abs(listed_start(sleeper.pid, frame) - started) <= listed_start_slack(sleeper.pid, frame)
    link = LocalLink(NodeConfig(name="local", local=True), interval=1.0)

    class DetailsApp(App):
        def on_mount(self) -> None:
            self.push_screen(ProcessDetailsScreen("local", sleeper.pid, frame, link))

    app = DetailsApp()
    async with app.run_test() as pilot:
        # Read by a worker: waited for up to the shared bound, not 200 polls (10 s, or less under load).
        await wait_for(
            lambda: isinstance(app.screen, ProcessDetailsScreen) and app.screen.details is not None,
            "the details read",
            pilot=pilot,
        )
        details = app.screen.details
    assert details is not None and details.problem is None, details
    assert details.args[:2] == (sys.executable, "-c")


async def test_a_start_outside_the_widened_slack_is_still_another_process(sleeper):
    """The widened slack is half the poll, no more: a start 60 s away is still a later owner of the PID."""
    started = read_details(sleeper.pid)["start_time"]
    frame = gpu_only_frame(sleeper.pid, started + 60.0, sampled_after=0.0)
    link = LocalLink(NodeConfig(name="local", local=True), interval=1.0)
    details = await fetch_process_details(
        link,
        sleeper.pid,
        expected_start=listed_start(sleeper.pid, frame),
        start_slack=listed_start_slack(sleeper.pid, frame),
    )
    assert details.problem == MOVED


def test_a_gpu_process_shows_the_readings_joined_this_poll_not_an_older_host_row():
    # The host list may be carried from an earlier poll while no pane shows it (every fifth poll);
    # a GPU row's host readings are joined afresh each poll, so state, CPU, RSS and threads come from it.
    host = ProcessSample(
        pid=4242,
        name="python",
        user="alice",
        command="python train.py",
        cpu_percent=1.0,
        rss_bytes=100 * 2**20,
        state="S",
        threads=3,
        ppid=1,
        start_time=1_700_000_000.0,
    )
    gpu = ProcessSample(
        pid=4242,
        name="python",
        user="alice",
        command="python train.py",
        cpu_percent=99.0,
        rss_bytes=200 * 2**20,
        state="D",
        threads=40,
        ppid=1,
        gpu_index=0,
        gpu_memory_bytes=2**30,
    )
    frame = NodeFrame(node="local", time=1_700_000_100.0, top_processes=(host,), processes=(gpu,))
    shown = frame_text("local", 4242, frame).plain
    assert "99%" in shown and "200 MiB" in shown and "40" in shown and "D" in shown.split("State")[1].split("\n")[0]
    assert "1.0%" not in shown and "100 MiB" not in shown
    # Without a GPU row (or one whose host readings could not be joined) the host row is what there is.
    shown = frame_text("local", 4242, NodeFrame(node="local", time=1_700_000_100.0, top_processes=(host,))).plain
    assert "100 MiB" in shown and "S" in shown.split("State")[1].split("\n")[0]
