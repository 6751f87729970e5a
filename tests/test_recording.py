"""Record then replay: every state equal, seeking, retention, bad files, the replaying fleet."""

import asyncio
import re
import sqlite3
import statistics
from dataclasses import replace

import pytest

from opsconsole.model import STATE_DOWN
from opsconsole.recording import store
from opsconsole.recording.recorder import Recorder
from opsconsole.recording.replay import RecordingReader, ReplayFleet
from tests.recording_frames import fleet_ticks
from tests.waiting import wait_for


def record(path, ticks, **kw):
    with Recorder(str(path), **kw) as recorder:
        for states in ticks:
            for state in states:
                recorder.observe(state)
    return recorder


def test_round_trip_equal_frame_for_frame(tmp_path):
    path = tmp_path / "run.opsrec"
    ticks = fleet_ticks(nodes=4, ticks=70)
    # a node going down (no frame kept by this state) and coming back, mid-recording
    ticks[30][2] = replace(ticks[30][2], state=STATE_DOWN, reason="connection refused", frame=None)
    record(path, ticks, chunk_s=5.0, keyframe_every=2)
    reader = RecordingReader(str(path))
    for states in ticks:
        t = max(s.received_at for s in states)
        reader.advance(t)
        got = reader.states()
        for state in states:
            assert got[state.name] == state, (state.name, t)
    reader.close()


def test_seek_anywhere_forward_and_back_gives_the_states_of_that_time(tmp_path):
    path = tmp_path / "run.opsrec"
    ticks = fleet_ticks(nodes=3, ticks=100)
    record(path, ticks, chunk_s=4.0, keyframe_every=3)
    reader = RecordingReader(str(path))
    for tick in (99, 0, 57, 12, 12, 88, 3, 41):
        t = max(s.received_at for s in ticks[tick])
        states = reader.seek(t)
        assert [states[s.name] for s in ticks[tick]] == ticks[tick]
    assert reader.seek(reader.end + 1000)["gpu001"] == ticks[-1][1]  # clamped to the end
    reader.close()


def test_a_chunk_is_compressed_well(tmp_path):
    path = tmp_path / "run.opsrec"
    ticks = fleet_ticks(nodes=8, ticks=60)
    recorder = record(path, ticks)
    raw = sum(len(s.frame.__repr__()) for states in ticks for s in states)
    assert recorder.stats.bytes_written * 20 < raw
    assert recorder.stats.records >= 8 * 60


def test_retention_keeps_the_file_bounded_and_still_replayable(tmp_path):
    path = tmp_path / "run.opsrec"
    ticks = fleet_ticks(nodes=4, ticks=300)
    recorder = record(path, ticks, chunk_s=5.0, keyframe_every=2, max_bytes=40_000)
    assert recorder.stats.dropped_chunks > 0
    db = sqlite3.connect(str(path))
    assert store.size_bytes(db) <= 40_000 + 2 * (recorder.stats.bytes_written // recorder.stats.chunks) * 2
    db.close()
    reader = RecordingReader(str(path))
    assert reader.start > ticks[0][0].received_at  # the oldest part is gone
    last = reader.seek(reader.end)
    assert [last[s.name] for s in ticks[-1]] == ticks[-1]
    reader.close()


def test_max_age_drops_old_groups(tmp_path):
    path = tmp_path / "run.opsrec"
    ticks = fleet_ticks(nodes=2, ticks=200)
    clock = [ticks[0][0].received_at]

    with Recorder(str(path), chunk_s=5.0, keyframe_every=2, max_age_s=60.0, clock=lambda: clock[0]) as recorder:
        for states in ticks:
            clock[0] = states[0].received_at
            for state in states:
                recorder.observe(state)
    reader = RecordingReader(str(path))
    assert reader.end - reader.start <= 60.0 + 2 * 5.0 * 2
    reader.close()


@pytest.mark.parametrize("content", [b"", b"not sqlite at all" * 100])
def test_a_file_that_is_not_a_recording_is_a_clear_error(tmp_path, content):
    path = tmp_path / "x.opsrec"
    path.write_bytes(content)
    with pytest.raises(store.RecordingError, match="not an opsconsole recording"):
        RecordingReader(str(path))


def test_an_empty_recording_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.opsrec"
    Recorder(str(path)).close()
    with pytest.raises(store.RecordingError, match="holds no frames"):
        RecordingReader(str(path))


def test_events_are_kept_with_their_times(tmp_path):
    path = tmp_path / "run.opsrec"
    ticks = fleet_ticks(nodes=1, ticks=5)
    with Recorder(str(path)) as recorder:
        for states in ticks:
            recorder.observe(states[0])
        recorder.event("finding", "gpu000", {"category": "nan_inf", "line": 7}, t=ticks[2][0].received_at)
    reader = RecordingReader(str(path))
    events = reader.events(reader.start - 1, reader.end)
    assert events == [(ticks[2][0].received_at, "finding", "gpu000", {"category": "nan_inf", "line": 7})]
    reader.close()


async def test_replay_fleet_plays_pauses_speeds_and_seeks(tmp_path):
    path = tmp_path / "run.opsrec"
    ticks = fleet_ticks(nodes=2, ticks=40)
    record(path, ticks)
    wall = [0.0]
    fleet = ReplayFleet(str(path), wall=lambda: wall[0])
    seen = []
    await fleet.start(seen.append)
    assert {s.name for s in seen} == {"gpu000", "gpu001"}
    start = fleet.now()
    wall[0] += 5.0
    fleet._catch_up()
    assert fleet.now() == pytest.approx(start + 5.0)
    assert fleet.states()["gpu000"] == ticks[5][0]
    fleet.toggle_pause()
    wall[0] += 10.0
    fleet._catch_up()
    assert fleet.now() == pytest.approx(start + 5.0)
    fleet.toggle_pause()
    assert fleet.faster() == 2.0
    wall[0] += 5.0
    fleet._catch_up()
    assert fleet.now() == pytest.approx(start + 15.0)
    fleet.seek(start + 1.5)
    assert fleet.states()["gpu001"] == ticks[1][1]
    fleet.step(30.0)
    assert fleet.states()["gpu001"] == ticks[31][1]
    totals = fleet.totals(fleet.now())
    assert (totals.nodes, totals.gpus) == (2, 16)
    with pytest.raises(KeyError, match="actions are disabled"):
        fleet.link("gpu000")
    await fleet.stop()


def test_record_command_records_the_local_node_until_its_duration(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "local.opsrec"
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "record", "--out", str(out), "--duration", "3", "--interval", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "recorded" in done.stderr and "1 node(s)" in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr  # not a terminal, no --progress: the summary only
    reader = RecordingReader(str(out))
    state = reader.seek(reader.end)["local"]
    assert state.frame is not None and state.frame.host is not None
    assert reader.end - reader.start >= 1.0
    reader.close()


PROGRESS = re.compile(
    r"recording to \S+: (\d+) states, (\d+) chunks, ([\d.]+ (?:B|KiB|MiB|GiB)) written, (\d+:\d\d) elapsed"
)


def test_record_progress_lines_with_the_flag_when_stderr_is_not_a_terminal(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "local.opsrec"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "opsconsole",
            "record",
            "--out",
            str(out),
            "--duration",
            "3",  # a progress line is due at 2 s
            "--interval",
            "0.5",
            "--progress",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    *progress, summary = done.stderr.splitlines()
    assert summary.startswith("recorded ") and "\r" not in done.stderr and "\x1b" not in done.stderr
    assert 1 <= len(progress) <= 2, done.stderr  # every 2 s over 3 s
    counts = [int(PROGRESS.fullmatch(line).group(1)) for line in progress]
    assert counts == sorted(counts) and counts[-1] > 0


def test_record_progress_is_rewritten_in_place_on_a_terminal(tmp_path):
    import os
    import subprocess
    import sys

    out = tmp_path / "local.opsrec"
    controller, terminal = os.openpty()
    proc = subprocess.Popen(
        # 3 s: a progress line is due at 2 s
        [sys.executable, "-m", "opsconsole", "record", "--out", str(out), "--duration", "3", "--interval", "0.5"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=terminal,
    )
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # EIO: the child's side closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(controller)
    assert proc.wait(timeout=30) == 0, seen
    text = seen.decode("utf-8", "replace")
    updates = text.split("\r\x1b[K")
    assert len(updates) >= 3, text  # at least one progress line, then the one that clears it
    assert PROGRESS.fullmatch(updates[1]), text
    assert updates[-1].startswith("recorded ") and "states of 1 node(s)" in updates[-1]


def test_record_command_stops_cleanly_on_sigint(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "local.opsrec"
    proc = subprocess.Popen(
        [sys.executable, "-m", "opsconsole", "record", "--out", str(out), "--interval", "0.5"],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (out.exists() and out.stat().st_size > 0):
        time.sleep(0.2)
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    reader = RecordingReader(str(out))  # flushed and closed: readable
    assert "local" in reader.seek(reader.end)
    reader.close()


@pytest.mark.parametrize(
    "args, message",
    [
        (["replay", "MISSING"], "no such file"),
        (["replay", "NOTREC"], "not an opsconsole recording"),
        (["replay", "NOTREC", "--speed", "0"], "--speed must be positive"),
        (["record", "--out", "X", "--duration", "-1"], "--duration must be a positive"),
    ],
)
def test_record_and_replay_usage_errors_exit_2_with_one_line(tmp_path, capsys, args, message):
    from opsconsole.cli import main

    (tmp_path / "NOTREC").write_text("hello")
    args = [str(tmp_path / a) if a in ("MISSING", "NOTREC", "X") else a for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


SHIPPED = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "h200-training.opsrec"


def test_the_shipped_h200_recording_replays_a_real_training_load():
    reader = RecordingReader(str(SHIPPED))
    assert 140 <= reader.end - reader.start <= 160
    peaks, dips = [], []
    t = reader.first_full_time()
    while t <= reader.end:
        gpu = reader.seek(t)["local"].frame.gpus[0]
        assert gpu.name == "NVIDIA H200"
        (peaks if gpu.utilization_gpu >= 95 else dips).append(gpu.power_draw_w)
        t += 2.0
    assert len(peaks) > len(dips) > 0  # mostly training, with checkpoint pauses
    assert statistics.median(peaks) > 600 and min(dips) < 200
    reader.close()


async def test_replay_link_plays_the_recording_as_a_live_looking_node():
    from opsconsole.recording.replay_link import ReplayLink

    link = ReplayLink("h200-replay", str(SHIPPED))
    seen = []
    task = asyncio.create_task(link.run(seen.append))
    await wait_for(lambda: seen, "a state played")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await link.close()
    assert seen and all(s.name == "h200-replay" for s in seen)
    assert seen[-1].frame.node == "h200-replay"
    assert seen[-1].age(__import__("time").time()) < 5  # shifted to the present
    assert "replay of h200-training.opsrec" == seen[-1].address


def test_the_shipped_recording_marks_its_kernel_threads_though_its_probe_did_not():
    """examples/h200-training.opsrec was recorded before the probe flagged kernel threads (and sent
    ppid): replayed, its kworkers and kthreadd are marked, every process with a command line is not."""
    reader = RecordingReader(str(SHIPPED))
    t = reader.first_full_time()
    while t <= reader.end:
        rows = reader.seek(t)["local"].frame.top_processes
        kernel = {row.pid for row in rows if row.kernel_thread}
        by_pid = {row.pid: row for row in rows}
        assert 2 in kernel and all(by_pid[pid].command == "[%s]" % by_pid[pid].name for pid in kernel)
        assert {1, 421, 430} <= set(by_pid) - kernel  # init, the job's shell and the training process
        t += 10.0
    reader.close()


def test_kernel_threads_of_an_old_probe_are_told_from_user_processes_by_what_it_sent():
    """The rule a replay uses on samples without the flag, on the shapes old probes sent."""
    from opsconsole.model import ProcessSample
    from opsconsole.probe.procs import looks_like_kernel_thread

    def sample(pid, ppid, command, rss=0, state="S", name="kworker/0:1"):
        return ProcessSample(pid=pid, name=name, command=command, ppid=ppid, rss_bytes=rss, state=state)

    assert looks_like_kernel_thread(sample(2, 0, "[kworker/0:1]"))  # kthreadd itself
    assert looks_like_kernel_thread(sample(77, 2, ""))  # kthreadd's child, no command line
    assert looks_like_kernel_thread(sample(77, None, "[kworker/0:1]"))  # no ppid sent: no memory, not a zombie
    assert not looks_like_kernel_thread(sample(2, 1, "sleep 60", rss=900))  # pid 2 in a container
    assert not looks_like_kernel_thread(sample(77, 2, "python train.py"))  # has a command line
    assert not looks_like_kernel_thread(sample(77, 1, "[kworker/0:1]"))  # its parent is not kthreadd
    assert not looks_like_kernel_thread(sample(77, None, "[python]", state="Z"))  # a zombie
    assert not looks_like_kernel_thread(sample(77, None, "[python]", rss=4096))  # memory of its own
