"""The Logs pane in the real console, on real files that another process writes (real LogHub, Diagnoser).

Each test writes `train_{host}_rank{rank}_{stamp}.log` files in its temp dir, points `[logs] paths`
at them, and drives the app with Pilot. Waits are bounded polls for what the pane shows, not
timed assertions.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest  # noqa: E402
from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states  # noqa: E402

from opsconsole.config import Config, ConsoleConfig, LogsConfig  # noqa: E402
from opsconsole.logs.records import MAX_LINE_BYTES, TRUNCATED_MARKER  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402
from opsconsole.tui.findings import COLUMNS  # noqa: E402
from opsconsole.tui.logs import LogsPane  # noqa: E402
from tests.waiting import pane_shown, wait_for


def module_present(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# The pane runs the real followers and diagnosis; until both are in the tree these tests cannot run.
FOLLOWERS_MISSING = [
    name for name in ("opsconsole.logs.hub", "opsconsole.diagnosis.engine") if not module_present(name)
]
needs_followers = pytest.mark.skipif(bool(FOLLOWERS_MISSING), reason="not in the tree yet: %s" % FOLLOWERS_MISSING)

SIZE = (140, 40)
WAIT_S = 15.0  # upper bound of a wait; each returns as soon as the pane shows what it waits for

OOM_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/workspace/train.py", line 211, in <module>',
    "    loss.backward()",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "139.72 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 138.65 GiB memory "
    "in use. Of the allocated memory 135.20 GiB is allocated by PyTorch, and 1.93 GiB is reserved by PyTorch "
    "but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
]


def stamp(second: int) -> str:
    """A logging.Formatter asctime (the seed's '%(asctime)s - %(levelname)s - %(message)s')."""
    return "2026-12-02 12:%02d:%02d,%03d" % (second // 60 % 60, second % 60, 0)


def record(second: int, level: str, message: str) -> str:
    return "%s - %s - %s" % (stamp(second), level, message)


def append_from_another_process(path: Path, data: bytes) -> None:
    """Append bytes to `path` from a separate Python process (as a training rank would)."""
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nwith open(sys.argv[1], 'ab') as f:\n    f.write(sys.stdin.buffer.read())\n",
            str(path),
        ],
        input=data,
        check=True,
    )


def write_lines(path: Path, lines: List[str]) -> None:
    append_from_another_process(path, "".join(line + "\n" for line in lines).encode())


def rank_file(tmp_path: Path, host: str, rank: int) -> Path:
    return tmp_path / ("train_%s_rank%d_20261202_120000.log" % (host, rank))


def console(tmp_path: Path, **console_options) -> OpsConsole:
    config = Config(
        logs=LogsConfig(paths=(str(tmp_path / "train_*_rank*_*.log"),)), console=ConsoleConfig(**console_options)
    )
    return OpsConsole(config, FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)


def pane_of(app: OpsConsole) -> LogsPane:
    pane = app.panes["logs"]
    assert isinstance(pane, LogsPane)
    return pane


def shown_texts(pane: LogsPane) -> List[str]:
    return [entry.text for entry in pane.view.visible]


def screen_rows(pane: LogsPane) -> List[str]:
    """The rows the line view renders now (the real render_line, as drawn on screen)."""
    height = pane.lines.scrollable_content_region.height
    return [pane.lines.render_line(y).text for y in range(height)]


def status_text(pane: LogsPane) -> str:
    return str(pane.status.render())


def oom_time(pane: LogsPane) -> float:
    """The effective time of the OOM line: it has no timestamp, so its predecessor's (second 201)."""
    return next(e.time for e in pane.view.entries if "CUDA out of memory" in e.text)


async def open_logs(pilot, pane: LogsPane, count: int) -> None:
    await pilot.pause()
    await pilot.press("6")
    await wait_for(lambda: pane.app.visible_pane_id == "logs", "itself (key 6)", pilot=pilot)
    await wait_for(lambda: len(pane.view.entries) >= count, "%d lines" % count, pilot=pilot)
    await pilot.pause()


# --- following ----------------------------------------------------------------------------------


@needs_followers
async def test_lines_written_by_another_process_appear_labelled(tmp_path):
    rank0, rank1 = rank_file(tmp_path, "gpu01", 0), rank_file(tmp_path, "gpu02", 1)
    write_lines(rank0, [record(1, "INFO", "Training started on gpu01")])
    write_lines(rank1, [record(2, "INFO", "Training started on gpu02")])
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = pane_of(app)
        await open_logs(pilot, pane, 2)
        write_lines(rank1, [record(3, "INFO", "step 1 loss 2.31")])
        write_lines(rank0, [record(4, "INFO", "step 1 loss 2.30")])
        await wait_for(lambda: len(pane.view.entries) == 4, "the two new lines", pilot=pilot)
        await pilot.pause()
        assert [t.split(" - ")[-1] for t in shown_texts(pane)] == [
            "Training started on gpu01",
            "Training started on gpu02",
            "step 1 loss 2.31",
            "step 1 loss 2.30",
        ]
        rows = [row for row in screen_rows(pane) if row.strip()]
        assert rows[0].split()[0] == "gpu01:rank0" and rows[2].split()[0] == "gpu02:rank1"
        assert "step 1 loss 2.30" in rows[3]
        assert "2 sources" in status_text(pane) and "following" in status_text(pane)


@needs_followers
async def test_scrolling_up_stops_following_and_counts_new_lines(tmp_path):
    rank0 = rank_file(tmp_path, "gpu01", 0)
    write_lines(rank0, [record(n, "INFO", "step %d loss 2.0" % n) for n in range(120)])
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = pane_of(app)
        await open_logs(pilot, pane, 120)
        assert "step 119 " in screen_rows(pane)[-1]  # following: the last line is at the bottom
        pane.lines.focus()
        await pilot.press("pageup")
        await pilot.pause()
        assert not pane.view.following
        top_before = pane.lines.top_entry()
        write_lines(rank0, [record(200 + n, "INFO", "late %d" % n) for n in range(5)])
        await wait_for(lambda: pane.view.new_lines == 5, "5 new lines counted", pilot=pilot)
        await pilot.pause()
        assert "5 new lines" in status_text(pane) and "paused" in status_text(pane)
        assert pane.lines.top_entry() is top_before  # the user's place stays put
        await pilot.press("end")
        await pilot.pause()
        assert pane.view.following and pane.view.new_lines == 0
        assert "late 4" in screen_rows(pane)[-1]
        write_lines(rank0, [record(300, "INFO", "after resume")])
        await wait_for(lambda: "after resume" in screen_rows(pane)[-1], "the line after resuming", pilot=pilot)


# --- search, level, n / N -------------------------------------------------------------------------


@needs_followers
async def test_search_filters_and_a_bad_regex_is_a_message(tmp_path):
    rank0 = rank_file(tmp_path, "gpu01", 0)
    write_lines(rank0, [record(n, "INFO", "step %d loss %d.5" % (n, 3 if n % 3 == 0 else 2)) for n in range(30)])
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = pane_of(app)
        await open_logs(pilot, pane, 30)
        await pilot.press("slash", *"3\\.5", "enter")
        await pilot.pause()
        assert len(shown_texts(pane)) == 10 and all("loss 3.5" in t for t in shown_texts(pane))
        assert all("loss 3.5" in row for row in screen_rows(pane) if row.strip())
        assert "10 of 30 lines" in status_text(pane)
        await pilot.press("slash", "ctrl+u", "[", "enter")
        await pilot.pause()
        assert "invalid regex" in status_text(pane) and shown_texts(pane) == []
        await pilot.press("slash", "escape")
        await pilot.pause()
        assert len(shown_texts(pane)) == 30


@needs_followers
async def test_n_and_N_go_to_errors_and_l_filters_levels(tmp_path):
    rank0, rank1 = rank_file(tmp_path, "gpu01", 0), rank_file(tmp_path, "gpu02", 1)
    lines0 = [record(n, "INFO", "step %d" % n) for n in range(0, 60, 2)]
    lines1 = [record(n, "INFO", "step %d" % n) for n in range(1, 60, 2)]
    lines0[5] = record(10, "ERROR", "first failure")
    lines1[20] = record(41, "WARNING", "slow step")
    lines1[25] = record(51, "ERROR", "second failure")
    write_lines(rank0, lines0)
    write_lines(rank1, lines1)
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = pane_of(app)
        await open_logs(pilot, pane, 60)
        pane.lines.focus()
        await pilot.press("N")  # from the bottom of the screen: the latest error first
        await pilot.pause()
        assert pane.lines.cursor is not None and pane.lines.cursor.text.endswith("second failure")
        assert not pane.view.following
        await pilot.press("N")
        await pilot.pause()
        assert pane.lines.cursor.text.endswith("first failure")
        await pilot.press("n")
        await pilot.pause()
        assert pane.lines.cursor.text.endswith("second failure")
        await pilot.press("l")  # >= WARNING
        await pilot.pause()
        assert [t.split(" - ")[-1] for t in shown_texts(pane)] == ["first failure", "slow step", "second failure"]
        await pilot.press("l")  # >= ERROR
        await pilot.pause()
        assert [t.split(" - ")[-1] for t in shown_texts(pane)] == ["first failure", "second failure"]
        assert "level ≥ ERROR" in status_text(pane)


# --- findings ------------------------------------------------------------------------------------


@needs_followers
async def test_a_finding_is_listed_and_enter_jumps_to_its_line(tmp_path):
    rank0, rank1 = rank_file(tmp_path, "gpu01", 0), rank_file(tmp_path, "gpu02", 1)
    write_lines(rank0, [record(n, "INFO", "step %d loss 2.0" % n) for n in range(0, 200, 2)])
    write_lines(rank1, [record(n, "INFO", "step %d loss 2.0" % n) for n in range(1, 200, 2)])
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = pane_of(app)
        await open_logs(pilot, pane, 200)
        write_lines(rank1, [record(201, "ERROR", "step 201 failed")] + OOM_TRACEBACK)
        write_lines(rank1, [record(202 + n, "INFO", "cleanup %d" % n) for n in range(60)])
        await wait_for(lambda: pane.findings.table.row_count > 0, "a finding", pilot=pilot)
        await pilot.pause()
        assert "cuda_oom" in [summary.category for summary in pane.findings.summaries]
        row = {key: cell.plain for (key, _, _), cell in zip(COLUMNS, pane.findings.table.get_row("cuda_oom"))}
        assert row["category"] == "cuda_oom" and row["severity"] == "critical"
        assert int(row["count"]) >= 1 and row["ranks"] == "1"
        assert row["first"] == time.strftime("%H:%M:%S", time.localtime(oom_time(pane)))
        assert "memory" in row["cause"].lower()
        marked = [e for e in pane.view.entries if e.finding is not None]
        assert marked and any("CUDA out of memory" in e.text for e in marked)
        pane.lines.focus()
        await pilot.press("F")
        await wait_for(lambda: pane.findings.table.has_focus, "the findings table focused", pilot=pilot)
        cursor_row = pane.findings.table.get_row_index("cuda_oom")
        pane.findings.table.move_cursor(row=cursor_row)
        await pilot.press("enter")
        await wait_for(lambda: pane.lines.has_focus, "the lines focused", pilot=pilot)
        cursor = pane.lines.cursor
        assert cursor is not None and cursor.finding is not None and cursor.finding.category == "cuda_oom"
        assert pane.lines.has_focus and not pane.view.following
        assert any(row.startswith("●") and "CUDA out of memory" in row for row in screen_rows(pane))


@needs_followers
async def test_binary_bytes_show_as_replacement_characters_and_a_10_mb_line_is_cut(tmp_path):
    rank0 = rank_file(tmp_path, "gpu01", 0)
    write_lines(rank0, [record(1, "INFO", "before")])
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = pane_of(app)
        await open_logs(pilot, pane, 1)
        append_from_another_process(
            rank0,
            b"BIN \xff\xfe\x00\x1b[31m\x07 payload \xc3\n"
            + record(2, "INFO", "x" * (10 * 1024 * 1024)).encode()
            + b"\n"
            + record(3, "INFO", "after the long one").encode()
            + b"\n",
        )
        await wait_for(lambda: len(pane.view.entries) == 4, "the binary line, the long one and the next", pilot=pilot)
        await pilot.pause()
        rows = [row for row in screen_rows(pane) if row.strip()]
        assert len(rows) == 4 and rows[-1].rstrip().endswith("after the long one")
        binary = rows[1]
        assert "\ufffd" in binary and "payload" in binary
        assert "\x00" not in binary and "\x1b" not in binary and "\x07" not in binary
        long_entry = pane.view.entries[2]
        assert long_entry.line.truncated and long_entry.text.endswith(TRUNCATED_MARKER)
        assert len(long_entry.text.encode()) <= MAX_LINE_BYTES + len(TRUNCATED_MARKER.encode())
        assert rows[2].split()[0] == "gpu01:rank0" and "xxxxxxxx" in rows[2]
        pane.lines.focus()
        await pilot.press("up", "end")  # the view scrolls over it, and back to following
        await pilot.pause()
        assert pane.view.following


# --- views, keys, configuration ---------------------------------------------------------------------


@needs_followers
async def test_v_shows_one_source_and_back_to_the_merge(tmp_path):
    rank0, rank1 = rank_file(tmp_path, "gpu01", 0), rank_file(tmp_path, "gpu02", 1)
    write_lines(rank0, [record(n, "INFO", "rank0 step %d" % n) for n in range(0, 20, 2)])
    write_lines(rank1, [record(n, "INFO", "rank1 step %d" % n) for n in range(1, 20, 2)])
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = pane_of(app)
        await open_logs(pilot, pane, 20)
        pane.lines.focus()
        await pilot.press("v")
        await pilot.pause()
        from opsconsole.tui.logs import SourceScreen

        assert isinstance(app.screen, SourceScreen)
        keys = [key for key, _ in app.screen.choices]
        assert keys[0] == "" and len(keys) == 3
        wanted = next(key for key in keys[1:] if key.endswith(rank1.name))
        await pilot.press(*["down"] * keys.index(wanted), "enter")
        await pilot.pause()
        assert not isinstance(app.screen, SourceScreen)
        assert {t.split(" - ")[-1].split()[0] for t in shown_texts(pane)} == {"rank1"}
        assert "only gpu02:rank1" in status_text(pane)
        write_lines(rank0, [record(30, "INFO", "rank0 late")])
        write_lines(rank1, [record(31, "INFO", "rank1 late")])
        await wait_for(lambda: len(pane.view.entries) == 22, "both late lines", pilot=pilot)
        assert shown_texts(pane)[-1].endswith("rank1 late") and len(shown_texts(pane)) == 11
        await pilot.press("v", "home", "enter")
        await pilot.pause()
        assert len(shown_texts(pane)) == 22 and "merged" in status_text(pane)
        await pilot.press("right_square_bracket")  # ] steps to the first source alone
        await pilot.pause()
        assert len(shown_texts(pane)) == 11 and pane.view.source == keys[1]
        await pilot.press("left_square_bracket")  # [ steps back to the merge
        await pilot.pause()
        assert pane.view.source is None and len(shown_texts(pane)) == 22


@needs_followers
async def test_pane_keys_are_in_the_registry_and_can_be_remapped(tmp_path):
    rank0 = rank_file(tmp_path, "gpu01", 0)
    write_lines(rank0, [record(1, "INFO", "ok"), record(2, "ERROR", "broken"), record(3, "INFO", "ok again")])
    app = console(tmp_path, keys=(("logs.next_error", "j"),))
    async with app.run_test(size=SIZE) as pilot:
        pane = pane_of(app)
        await open_logs(pilot, pane, 3)
        rows = {binding_id: (key, description) for binding_id, key, description in app.help_rows()}
        assert rows["logs.next_error"][0] == "j" and "Logs" in rows["logs.next_error"][1]
        for binding_id in ("logs.previous_error", "logs.level", "logs.follow", "logs.source", "logs.findings"):
            assert binding_id in rows
        pane.lines.focus()
        await pilot.press("home", "j")
        await pilot.pause()
        assert pane.lines.cursor is not None and pane.lines.cursor.text.endswith("broken")


async def test_without_log_paths_the_pane_says_how_to_add_them():
    app = OpsConsole(Config(), FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("6")
        # Made on its first show, then drawn: waited for, not one pause.
        await wait_for(lambda: pane_shown(app, "logs"), "the Logs pane", pilot=pilot)
        assert app.log_feed is None
        assert "no [logs] paths" in status_text(pane_of(app))
        await pilot.press("n", "N", "l", "f")  # keys on an empty pane do nothing harmful
        await pilot.pause()
        assert len(pane_of(app).view) == 0


async def test_sources_of_a_node_that_is_down_are_shown_as_such():
    # Lines of a remote source reach the pane as LogHub delivers them; the node's state comes from the fleet.
    from tui_fakes import cluster_states

    from opsconsole.logs.records import LogLine, LogSource

    app = OpsConsole(Config(), FakeFleet(cluster_states()), now=lambda: FROZEN_NOW)
    source = LogSource("gpu-a03", "/scratch/run/train_gpu-a03_rank8_20261202_120000.log", "gpu-a03", 8, "gpu-a03:rank8")
    async with app.run_test(size=SIZE) as pilot:
        pane = pane_of(app)
        await pilot.pause()
        await pilot.press("6")
        pane.add_lines([LogLine(source, 1, 0, record(1, "INFO", "step 1"), time=1.0, level="INFO", rank=8)], [None])
        await wait_for(lambda: len(pane.view.entries) == 1, "the remote line", pilot=pilot)
        app.redraw()
        await pilot.pause()
        problems = str(pane.problems_box.render())
        assert "gpu-a03: node down: connection refused (127.0.0.1:2222)" in problems
        assert pane.problems_box.display


@needs_followers
async def test_scrolling_to_the_top_loads_older_lines_and_following_reloads_a_dropped_tail(tmp_path):
    rank0 = rank_file(tmp_path, "gpu01", 0)
    TOTAL = 20000  # about 900 KB: more than the last page (filetail.LAST_PAGE_BYTES) the hub shows first
    write_lines(rank0, [record(n, "INFO", "step %d" % n) for n in range(TOTAL)])
    app = console(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        pane = pane_of(app)
        await open_logs(pilot, pane, 1)
        await wait_for(lambda: pane.view.entries[-1].line.number == TOTAL, "the last line", pilot=pilot)
        first = pane.view.entries[0].line.number
        assert first > 1  # the last page first, not the whole file
        pane.lines.focus()
        await pilot.press("home")  # loads older lines and shows the first of them
        await wait_for(lambda: pane.view.entries[0].line.number < first, "older lines", pilot=pilot)
        await pilot.pause()
        numbers = [entry.line.number for entry in pane.view.entries]
        assert numbers == list(range(numbers[0], TOTAL + 1))  # contiguous: nothing lost, nothing twice
        assert not pane.view.following and "paused" in status_text(pane)
        assert pane.lines.top_entry() is pane.view.entries[0]
        second = numbers[0]
        if second > 1:
            await pilot.press("up")  # up at the top: more older lines, above the user's place
            await wait_for(lambda: pane.view.entries[0].line.number < second, "more older lines", pilot=pilot)
            await pilot.pause()
            assert pane.lines.top_entry().line.number == second
            numbers = [entry.line.number for entry in pane.view.entries]
            assert numbers == list(range(numbers[0], TOTAL + 1))
        # A buffer just full: more older lines push the newest out; new lines are then only counted.
        pane.view.max_lines = len(pane.view.entries)
        oldest = pane.view.entries[0].line.number
        await pilot.press("home")
        await wait_for(lambda: pane.view.tail_dropped, "the tail dropped", pilot=pilot)
        assert pane.view.entries[0].line.number < oldest and len(pane.view.entries) == pane.view.max_lines
        assert pane.view.entries[-1].line.number < TOTAL
        write_lines(rank0, [record(4000 + n, "INFO", "new %d" % n) for n in range(3)])
        await wait_for(lambda: pane.view.new_lines == 3, "3 new lines counted", pilot=pilot)
        await pilot.press("end")
        await wait_for(lambda: not pane.view.tail_dropped and pane.view.following, "the tail reloaded", pilot=pilot)
        await pilot.pause()
        offsets = [entry.line.offset for entry in pane.view.entries]
        assert offsets == sorted(set(offsets))  # in file order, none twice
        texts = [entry.text.split(" - ")[-1] for entry in pane.view.entries]
        assert texts[-4:] == ["step %d" % (TOTAL - 1), "new 0", "new 1", "new 2"]
        assert [row for row in screen_rows(pane) if row.strip()][-1].rstrip().endswith("new 2")


async def test_the_first_page_is_drawn_as_it_comes_and_its_diagnosis_marks_it_after():
    # LogFeed hands lines over before it diagnoses them: the first page must not wait for the
    # diagnosis nor for the next flush tick; findings found after the lines were drawn still mark them.
    from tui_fakes import cluster_states

    from opsconsole.diagnosis.finding import Finding
    from opsconsole.logs.records import LogLine, LogSource

    app = OpsConsole(Config(), FakeFleet(cluster_states()), now=lambda: FROZEN_NOW)
    source = LogSource("gpu-a01", "/scratch/run/train_gpu-a01_rank0_20261202_120000.log", "gpu-a01", 0, "gpu-a01:rank0")
    page = [
        LogLine(source, n, n * 100, record(n, "INFO", "step %d" % n), time=float(n), level="INFO", rank=0)
        for n in range(1, 4)
    ]
    async with app.run_test(size=SIZE) as pilot:
        pane = pane_of(app)
        await pilot.pause()
        await pilot.press("6")
        await wait_for(lambda: pane_shown(app, "logs"), "the Logs pane", pilot=pilot)
        pane.add_lines(page, [None] * len(page))
        assert [e.line for e in pane.view.entries] == page  # drawn at once: no flush tick waited for
        later = [LogLine(source, 4, 400, record(4, "INFO", "step 4"), time=4.0, level="INFO", rank=0)]
        pane.add_lines(later, [None])
        assert len(pane.view.entries) == 3  # later lines wait for the flush, as before
        oom = Finding(
            line=2,
            category="cuda_oom",
            severity="critical",
            title="CUDA out of memory",
            cause="not enough GPU memory",
            remedy="smaller batch",
            excerpt=page[1].text,
            source=source.key,
            rank=0,
            time=2.0,
        )
        pane.add_findings(page, [None, oom, None])
        assert pane.view.entries[1].finding is oom and pane.view.entries[1].level == "CRITICAL"
        assert pane.findings_of(page) == [None, oom, None]  # remembered for lines read again
        await wait_for(lambda: len(pane.view.entries) == 4, "the later line", pilot=pilot)
