"""An adversarial trial's findings, each at the entry point where the input came in.

Each table is a hostile input the trial broke the console or a command with, built from real parts:
a recording written by the real Recorder from the real H200 capture (tests.recording_frames) and
replayed by the real ReplayConsole, checkpoint files written as the libraries write them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, List, Tuple

import pytest
import torch

from opsconsole.config import Config, ConsoleConfig
from opsconsole.logs.follow import LocalFollower
from opsconsole.model import DiskUsage, NetRate, NodeState
from opsconsole.probe.filetail import MAX_FOLLOWED_FILES, start_tail
from opsconsole.recording.recorder import Recorder
from opsconsole.recording.replay import ReplayFleet
from opsconsole.tui.replay import ReplayConsole
from tests.recording_frames import node_state
from tests.waiting import wait_for

SIZE = (160, 50)


def screen_text(app) -> str:
    """What the terminal would receive for the current screen, line by line."""
    return "\n".join("".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips())


def control_characters(text: str) -> List[str]:
    """The C0 and C1 control characters in `text` but the newlines between screen lines (a tab is one)."""
    return sorted({hex(ord(ch)) for ch in text if ch != "\n" and (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0)})


# --- one-line node text in the Overview and Host panes ----------------------------------------------

# Host name, disk mount point and interface name as a node reports them: a tab, a newline and a carriage
# return in them reached the terminal raw (the tab moves the cursor to the next tab stop, so the rest of
# the row is drawn where Textual does not think it is) or broke the line in two.
ONE_LINE_TEXT = [
    pytest.param("host\tname", "host␉name", id="tab"),
    pytest.param("host\nname", "host␤name", id="newline"),
    pytest.param("host\r\n\tname", "host␍␤␉name", id="crlf-tab"),
]


def hostile_host_state(tick: int, text: str) -> NodeState:
    state = node_state(0, tick)
    frame = state.frame
    host = replace(
        frame.host,
        hostname=text,
        disks=(DiskUsage(path="/mnt/" + text, total=100 * 2**30, used=40 * 2**30, free=60 * 2**30),),
        net=(NetRate(interface="if-" + text, rx_bytes_per_s=1.0, tx_bytes_per_s=2.0),),
    )
    return replace(state, frame=replace(frame, host=host))


@pytest.mark.parametrize("text, shown", ONE_LINE_TEXT)
@pytest.mark.parametrize("pane", ["o", "3"])
async def test_a_hosts_name_disk_and_interface_are_drawn_on_one_line_with_their_controls_visible(
    tmp_path, text, shown, pane
):
    path = str(tmp_path / "run.opsrec")
    with Recorder(path) as recorder:
        for tick in range(5):
            recorder.observe(hostile_host_state(tick, text))
    fleet = ReplayFleet(path)
    app = ReplayConsole(Config(console=ConsoleConfig(read_only=True)), fleet, now=fleet.now)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space", pane)
        await wait_for(lambda: " rx " in screen_text(app), "the host's network line on screen", pilot=pilot)
        await pilot.pause()
        drawn = screen_text(app)
        assert app.is_running
        assert control_characters(drawn) == []
        for expected in ("(%s)" % shown, "/mnt/" + shown, "if-" + shown):
            assert expected in drawn, "%r is not drawn on one line" % expected


@pytest.mark.parametrize("text, shown", ONE_LINE_TEXT)
async def test_a_node_drilled_into_is_named_on_one_line_in_the_header(tmp_path, text, shown):
    """Node names in a recording are whatever the file says: one drilled into is named in the header."""
    path = str(tmp_path / "run.opsrec")
    with Recorder(path) as recorder:
        for tick in range(5):
            for node in range(2):
                recorder.observe(replace(node_state(node, tick), name="%s-%d" % (text, node)))
    fleet = ReplayFleet(path)
    app = ReplayConsole(Config(console=ConsoleConfig(read_only=True)), fleet, now=fleet.now)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space", "4")
        await wait_for(lambda: "%s-1" % shown in screen_text(app), "the Nodes pane's rows", pilot=pilot)
        await pilot.press("enter")
        await wait_for(lambda: "  > " in screen_text(app), "the drilled-into node in the header", pilot=pilot)
        await pilot.pause()
        drawn = screen_text(app)
        assert app.is_running
        assert control_characters(drawn) == []
        assert "  > %s-" % shown in drawn.split("\n")[0]


# --- a log glob that matches thousands of files -------------------------------------------------------


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


# More files than a login node's usual open-file limit (1024): the follower kept one descriptor open per
# file, so the console ran out of descriptors (EMFILE) and died with a traceback in Textual's next import.
@pytest.mark.parametrize("files", [MAX_FOLLOWED_FILES + 1, 1500])
def test_a_glob_matching_more_files_than_the_cap_follows_the_newest_and_says_so(tmp_path, files):
    for index in range(files):
        path = tmp_path / ("rank%05d.log" % index)
        path.write_text("step %d\n" % index)
        os.utime(path, (1_800_000_000 + index, 1_800_000_000 + index))  # the later the index, the newer
    pattern = str(tmp_path / "rank*.log")
    batches: List[Any] = []
    before = open_descriptors()
    follower = LocalFollower([pattern], batches.append, use_inotify=False)
    try:
        follower.start()
        assert open_descriptors() - before <= MAX_FOLLOWED_FILES + 1  # the inotify descriptor, when used
        followed = sorted(os.path.basename(path) for path in follower.tails)
        assert followed == ["rank%05d.log" % index for index in range(files - MAX_FOLLOWED_FILES, files)]
        assert follower.problems[pattern] == (
            "%d files match: following the %d most recently written" % (files, MAX_FOLLOWED_FILES)
        )
        delivered = [raw for batch in batches for _, lines in batch for _, _, raw, _ in lines]
        assert b"step %d" % (files - 1) in delivered and b"step 0" not in delivered
    finally:
        follower.stop()
    assert open_descriptors() == before


# --- a FIFO where a followed log was --------------------------------------------------------------------


def finishes(call: Callable[[], Any]) -> bool:
    """Whether `call` returns (in a thread of its own, waited for up to 30 s: before the fix it never did)."""
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(30)
    return not thread.is_alive()


def rotated_to_a_fifo(tmp_path: Path) -> Tuple[str, LocalFollower]:
    """A followed log replaced, as a rotation replaces it, by a FIFO: no writer ever opens it."""
    path = tmp_path / "train.log"
    path.write_text("step 1\n")
    follower = LocalFollower([str(tmp_path / "*.log")], lambda batch: None, use_inotify=False)
    follower.start()
    os.mkfifo(tmp_path / "next.fifo")
    os.rename(tmp_path / "next.fifo", path)
    return str(path), follower


def fifo_seen_first(tmp_path: Path) -> Tuple[str, LocalFollower]:
    """A FIFO at a path the glob matched as a file (swapped in between the glob and the open)."""
    path = tmp_path / "train.log"
    os.mkfifo(path)
    follower = LocalFollower([str(tmp_path / "*.log")], lambda batch: None, use_inotify=False)
    follower.tails[str(path)] = start_tail(str(path), True)
    return str(path), follower


# A FIFO's open blocks until a writer comes: the follower's thread hung in it holding its lock, and the
# console's quit waited on that lock for ever ('q' did nothing; the real console was killed by timeout).
@pytest.mark.parametrize("make", [rotated_to_a_fifo, fifo_seen_first], ids=["rotated", "seen-first"])
def test_a_fifo_at_a_followed_path_is_a_problem_not_a_hang(tmp_path, make):
    path, follower = make(tmp_path)
    assert finishes(follower.poll_all), "the poll hung on the FIFO"
    assert follower.problems[path] == "not a regular file"
    assert finishes(follower.stop), "stopping hung"


def diagnose_cli(*argv: str) -> subprocess.CompletedProcess:
    """The real command; the guard only turns a hang into a failure (it hung before the fix)."""
    return subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", *argv], capture_output=True, text=True, timeout=120
    )


# Walking a run's directory, a FIFO named like a log was opened as one: the open waits for a writer for ever.
# A FIFO named on the command line is still read (process substitution, diagnose <(zcat ...), is one).
@pytest.mark.parametrize("special", ["rank0.log", "stderr.log", "attempt_0/0/stdout.log"])
def test_diagnose_run_leaves_out_a_fifo_named_like_a_log_in_its_directory(tmp_path, special):
    (tmp_path / "attempt_0" / "0").mkdir(parents=True)
    os.mkfifo(tmp_path / special)
    (tmp_path / "rank1.log").write_text(
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    )
    result = diagnose_cli("--run", "--json", str(tmp_path))
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["root_cause"] == "cuda_oom" and document["rank"] == 1
    assert special not in result.stdout


def test_diagnose_still_reads_a_fifo_named_on_the_command_line(tmp_path):
    fifo = tmp_path / "piped.log"
    os.mkfifo(fifo)
    writer = threading.Thread(
        target=lambda: fifo.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    )
    writer.start()
    result = diagnose_cli("--json", str(fifo))
    writer.join()
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["root_cause"] == "cuda_oom"


# --- epoch and step numbers a checkpoint claims ----------------------------------------------------------


def write_trainer_state(directory: Path, state: dict) -> None:
    """A Hugging Face Trainer checkpoint as the Trainer leaves it, with `state` as its trainer_state.json."""
    from safetensors.torch import save_file

    directory.mkdir()
    save_file({"w": torch.zeros(2)}, str(directory / "model.safetensors"))
    (directory / "trainer_state.json").write_text(json.dumps(state))


def write_safetensors_file(path: Path, metadata: dict) -> None:
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(path), metadata=metadata)


def write_torch_file(path: Path, content: dict) -> None:
    torch.save(dict(content, state_dict={"w": torch.zeros(2)}), str(path))


# Numbers no run reaches, read as they were: an epoch of 1e308 was listed as its 309 digits (the EPOCH
# column 310 cells wide), a step of 10**30 as 31. They are no epoch or step: '-', like an absent one.
HUGE_NUMBERS = [
    pytest.param(
        lambda d: write_trainer_state(d / "checkpoint-10", {"epoch": 1e308, "global_step": 10**30}), id="hf-state"
    ),
    pytest.param(
        lambda d: write_trainer_state(d / "checkpoint-10", {"epoch": -1e300, "global_step": -(10**40)}),
        id="hf-negative",
    ),
    pytest.param(
        lambda d: write_safetensors_file(d / "model.safetensors", {"epoch": "9" * 300, "step": "-" + "9" * 40}),
        id="safetensors-metadata",
    ),
    pytest.param(lambda d: write_torch_file(d / "model.pt", {"epoch": 10**30, "global_step": 1e300}), id="torch-dict"),
]


@pytest.mark.parametrize("write", HUGE_NUMBERS)
def test_an_epoch_or_step_no_run_reaches_is_listed_as_none(tmp_path, write):
    write(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "opsconsole", "checkpoints", "--json", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    (entry,) = json.loads(result.stdout)["checkpoints"]
    assert (entry["epoch"], entry["step"]) in ((None, None), (None, 10))  # checkpoint-10: the name's step
    table = subprocess.run(
        [sys.executable, "-m", "opsconsole", "checkpoints", str(tmp_path)], capture_output=True, text=True, timeout=120
    ).stdout
    assert max(len(line) for line in table.splitlines()) < 300


# --- many nodes at once ----------------------------------------------------------------------------------


def counting_redraws(app: ReplayConsole) -> List[int]:
    """A one-item list counting the app's redraws (each draws the header and the whole visible pane)."""
    count = [0]
    redraw = app.redraw

    def counted() -> None:
        count[0] += 1
        redraw()

    app.redraw = counted  # type: ignore[method-assign]
    return count


# Every state that came before the first redraw ran queued a redraw of its own: the first states of N nodes
# (a replay's start publishes all of them at once, as a live fleet's first tick can) drew the GPUs pane N
# times, each time with every node's rows. 250 nodes of 8 GPUs took 66 s to open; 10,000, more than 300 s.
@pytest.mark.parametrize("nodes", [2, 40])
async def test_the_first_states_of_many_nodes_are_drawn_once_not_once_each(tmp_path, nodes):
    path = str(tmp_path / "run.opsrec")
    with Recorder(path) as recorder:
        for tick in range(3):
            for node in range(nodes):
                recorder.observe(node_state(node, tick, gpus=1))
    fleet = ReplayFleet(path)
    app = ReplayConsole(Config(console=ConsoleConfig(read_only=True)), fleet, now=fleet.now)
    redraws = counting_redraws(app)
    app.tick = lambda: None  # type: ignore[method-assign]  # the clock's redraws, one a second, are not counted
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space")
        await wait_for(lambda: "gpu%03d" % (nodes - 1) in screen_text(app), "the last node's GPU", pilot=pilot)
        # At start, the first frame's, the pane's first show, the pause key's and a coalesced change's: a few
        # whatever the node count (5 here with 2 or 40 nodes), not one a node (44 for 40 before).
        assert redraws[0] <= 8


# --- a checkpoint directory with no file to date it -------------------------------------------------------


def test_a_unit_with_no_regular_file_is_as_old_as_its_directory_not_the_epoch(tmp_path):
    """A checkpoint-N/ holding only a FIFO named like its weights has no file to date it: it was dated 0
    (1970), 20,000 days old and past every min_age; it is as old as its directory."""
    from opsconsole.checkpoints.cache import ResultCache
    from opsconsole.checkpoints.scan import scan_directory

    write_trainer_state(tmp_path / "checkpoint-10", {"global_step": 10})
    begun = tmp_path / "checkpoint-20"
    begun.mkdir()
    os.mkfifo(begun / "model.safetensors")
    listing = scan_directory(str(tmp_path), cache=ResultCache(), crc_cache=ResultCache(), keep_proofs=False)
    entry = {e.name: e for e in listing.entries}["checkpoint-20"]
    assert entry.mtime == begun.lstat().st_mtime
