"""The console on a real recording (Pilot): panes show the recorded frames; pause, speed, seek keys."""

from __future__ import annotations

import json

import pytest
from textual import events
from textual.widgets import DataTable

from opsconsole.config import Config, ConsoleConfig
from opsconsole.recording.recorder import Recorder
from opsconsole.recording.replay import ReplayFleet
from opsconsole.tui.replay import ReplayConsole, replay_text
from opsconsole.tui.table_diff import row_keys_in_order
from tests.recording_frames import fleet_ticks
from tests.waiting import pane_shown, wait_for

SIZE = (140, 40)


@pytest.fixture
def recording(tmp_path):
    path = tmp_path / "run.opsrec"
    ticks = fleet_ticks(nodes=2, ticks=120)
    with Recorder(str(path)) as recorder:
        for states in ticks:
            for state in states:
                recorder.observe(state)
    return str(path), ticks


def make_console(path):
    fleet = ReplayFleet(path)
    config = Config(console=ConsoleConfig(read_only=True))
    return ReplayConsole(config, fleet, now=fleet.now), fleet


async def test_replay_console_shows_recorded_gpus_and_moves_with_the_keys(recording):
    path, ticks = recording
    app, fleet = make_console(path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("space")  # hold the clock still while we look
        # The first pane is made and drawn in the app's loop: waited for, not one pause (so below).
        await wait_for(
            lambda: pane_shown(app, "gpus") and "PAUSED" in str(app.replay_bar.render()), "paused", pilot=pilot
        )
        table = app.panes["gpus"].query_one(DataTable)
        assert table.row_count == 16  # 2 nodes x 8 GPUs, as recorded
        bar = str(app.replay_bar.render())
        assert "REPLAY" in bar and "PAUSED" in bar and "actions disabled" in bar
        start = fleet.now()

        await pilot.press("right_square_bracket")
        await pilot.pause()
        assert fleet.now() == pytest.approx(start + 10, abs=0.01)
        await pilot.press("left_curly_bracket")
        assert fleet.now() == fleet.reader.start  # clamped at the start

        await pilot.press("plus", "plus")
        assert fleet.speed == 4.0
        await pilot.press("minus")
        assert fleet.speed == 2.0

        await pilot.press("g")
        await wait_for(lambda: app.focused is app.seek_input, "the seek line", pilot=pilot)
        assert app.seek_input.display and app.focused is app.seek_input
        await pilot.press(*"50%")
        await pilot.press("enter")
        await wait_for(lambda: not app.seek_input.display, "the seek", pilot=pilot)
        middle = fleet.reader.start + (fleet.reader.end - fleet.reader.start) / 2
        assert fleet.now() == pytest.approx(middle, abs=0.01)
        assert not app.seek_input.display
        tick = int(middle - ticks[0][0].received_at)
        shown = fleet.states()["gpu000"]
        assert shown.frame.seq == ticks[tick][0].frame.seq

        # The bar's own m:ss: 0:42 is 42 s in (it jumped to 0:00, read as 00:42 at night).
        await pilot.press("g", *"0:42", "enter")
        await wait_for(lambda: "0:42 / " in str(app.replay_bar.render()), "the seek to 0:42", pilot=pilot)
        assert fleet.now() == pytest.approx(fleet.reader.start + 42, abs=0.01)
        assert "0:42 / " in str(app.replay_bar.render())
        await pilot.press("g", *"50%", "enter")
        await wait_for(lambda: app.seek_input.value == "50%" and not app.seek_input.display, "50%", pilot=pilot)

        await pilot.press("g", *"soon", "enter")
        await wait_for(
            lambda: app.seek_input.value == "soon" and any(n.severity == "warning" for n in app._notifications),
            "the refusal",
            pilot=pilot,
        )
        assert fleet.now() == pytest.approx(middle, abs=0.01)  # refused, position kept
        assert app.seek_input.display
        await pilot.press("escape")
        assert not app.seek_input.display

        await pilot.press("space")
        assert not fleet.paused


async def test_a_seek_typed_in_one_burst_with_g_goes_to_the_seek_line_not_the_panes(recording):
    """`g0:42<enter>` arriving at once (a paste, a laggy SSH link, a loaded machine): every key after `g`
    is the seek line's. The line's focus came after the queued keys, so `0` opened the Audit pane and
    `2` Processes, and the seek never happened."""
    path, _ = recording
    app, fleet = make_console(path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space")  # the clock held still
        await wait_for(lambda: pane_shown(app, "gpus") and fleet.paused, "the GPUs pane, paused", pilot=pilot)
        for key, character in (("g", "g"), ("0", "0"), ("colon", ":"), ("4", "4"), ("2", "2"), ("enter", "\r")):
            app._driver.send_message(events.Key(key, character))  # as the terminal delivers a burst
        await wait_for(
            lambda: app.seek_input.value and not app.seek_input.display, "the seek line typed in, closed", pilot=pilot
        )
        assert app.visible_pane_id == "gpus" and pane_shown(app, "gpus")
        assert fleet.now() - fleet.reader.start == pytest.approx(42, abs=0.01)


async def test_replay_help_lists_the_replay_keys_and_read_only_shows(recording):
    path, _ = recording
    app, fleet = make_console(path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        ids = [row[0] for row in app.help_rows()]
        assert "replay.pause" in ids and "replay.goto" in ids
        assert "[R]" in str(app.header.render())


def test_replay_text_shows_position_and_state():
    text = replay_text(0.0, 3600.0, 1800.0, 2.0, paused=False, width=10).plain
    assert "[=====-----]" in text and "30:00 / 1:00:00" in text and "x2" in text
    assert "END" in replay_text(0.0, 60.0, 60.0, 1.0, paused=False).plain


def test_replay_text_says_what_part_of_the_file_was_left_out():
    text = replay_text(0.0, 60.0, 30.0, 1.0, paused=False, problem="chunk at 10.0: inflates past 64 MiB\x1b[2J").plain
    assert "unreadable part left out: chunk at 10.0: inflates past 64 MiB␛[2J" in text
    assert "left out" not in replay_text(0.0, 60.0, 30.0, 1.0, paused=False).plain


async def test_process_details_on_a_replay_say_it_is_a_replay(recording):
    """`enter` on a replayed process: the node part says nothing is read on a replay, not "no connection"."""
    path, _ = recording
    app, _ = make_console(path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space", "2")
        pane = app.panes["processes"]
        table = await wait_for(
            lambda: next((t for t in (pane.gpu_table.table, pane.host_table.table) if t.row_count), None),
            "a recorded process row",
            pilot=pilot,
        )
        table.focus()
        await pilot.press("enter")
        node_part = await wait_for(
            lambda: (lambda part: part if "replayed node" in str(part.render()) else None)(
                app.screen.query_one("#details-node")
            ),
            "the replay's reason in the details",
            pilot=pilot,
        )
        assert "no connection" not in str(node_part.render())


async def test_processes_hide_the_kernel_threads_of_a_recording_from_before_the_flag():
    """The shipped H200 recording's probe sent no kernel-thread flag: replayed, Processes hides its
    kernel threads and says how many, as on a live node."""
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[1] / "examples" / "h200-training.opsrec"
    app, fleet = make_console(str(shipped))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space", "2")
        pane = app.panes["processes"]
        host = await wait_for(
            lambda: pane.host_table.table if pane.host_table.table.row_count else None, "host processes", pilot=pilot
        )
        listed = {int(key.rpartition("/")[2]) for key in row_keys_in_order(host)}
        rows = fleet.states()["local"].frame.top_processes
        kernel = {row.pid for row in rows if row.kernel_thread}
        assert 2 in kernel and not listed & kernel
        assert {1, 430} <= listed
        assert "%d kernel threads hidden: T" % len(kernel) in str(pane.status.render())


async def test_stacks_in_a_replay_are_refused_and_audited_before_anything_is_run(tmp_path):
    """`S` in a replay: the recording's PIDs name no process here, so the stacks screen says so, the
    refusal is audited and nothing is run (it used to try every node, audit an attempt, and not answer)."""
    from pathlib import Path

    from opsconsole.config import ActionsConfig
    from opsconsole.tui.stacks import StacksScreen

    shipped = Path(__file__).resolve().parents[1] / "examples" / "h200-training.opsrec"
    audit = tmp_path / "audit.log"
    fleet = ReplayFleet(str(shipped))
    config = Config(console=ConsoleConfig(), actions=ActionsConfig(audit_log=str(audit)))
    app = ReplayConsole(config, fleet, now=fleet.now)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space", "4")  # Nodes
        await wait_for(
            lambda: app.panes.get("nodes") and app.panes["nodes"].tables[0].table.row_count, "nodes", pilot=pilot
        )
        await pilot.press("S")
        screen = await wait_for(
            lambda: app.screen if isinstance(app.screen, StacksScreen) else None, "stacks", pilot=pilot
        )
        await wait_for(lambda: screen.problem, "the stacks screen's answer", pilot=pilot)
        assert screen.report is None
        assert (
            screen.problem
            == "not run: the nodes are replayed from a recording; stacks are read from live processes only"
        )
        assert "replayed from a recording" in str(screen.query_one("#stacks-verdict").render())
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(r["action"], r["outcome"]) for r in records] == [
        ("stacks", "refused")
    ]  # refused, audited, never attempted
    assert "replayed from a recording" in records[0]["detail"]
