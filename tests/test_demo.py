"""`opsconsole demo`: a real 2-rank CPU training run that writes seed-style logs and checkpoints, hits a
NaN, and the console on it shows the finding, the checkpoints and the shipped H200 recording (Pilot)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from opsconsole.commands.demo import demo_config_text, demo_links, shipped_recording, start_training, stop_training
from opsconsole.config import load_config
from opsconsole.nodes.fleet import Fleet
from opsconsole.tui.app import OpsConsole
from tests.waiting import wait_for

pytest.importorskip("torch")

SIZE = (160, 45)
LOG_NAME = re.compile(r"^train_.+_rank(\d+)_\d{8}_\d{6}\.log$")


@pytest.fixture
def demo_run(tmp_path):
    """The demo's training, failing early (epoch 2), with the console's config beside it."""
    config_path = tmp_path / "config.toml"
    config_path.write_text(demo_config_text(tmp_path))
    proc = start_training(tmp_path, ranks=2, fail_at_epoch=2)
    yield tmp_path, load_config(str(config_path))
    stop_training(proc)


async def test_the_console_on_the_demo_shows_the_nan_finding_checkpoints_and_the_replay(demo_run):
    directory, config = demo_run
    recording = shipped_recording()
    assert recording is not None, "examples/ ships an H200 recording"
    app = OpsConsole(config, Fleet(config, links=demo_links(config, recording)))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")
        feed_ready = lambda: app.log_feed is not None  # noqa: E731
        await wait_for(feed_ready, "the log feed to start", pilot=pilot)
        await wait_for(lambda: app.log_feed.summary()[1] == "nan_inf", "the NaN finding", pilot=pilot)
        rows, root = app.log_feed.summary()
        nan = next(row for row in rows if row.category == "nan_inf")
        assert nan.ranks == (0,) and "nan" in nan.first.excerpt.lower()
        # The finding became an alert as well.
        assert any(event.rule == "finding.nan_inf" for event in app.services.alerts.history)
        # The rank logs are named as in the seed, one per rank.
        names = sorted(p.name for p in (directory / "logs").iterdir())
        assert sorted(int(LOG_NAME.match(n).group(1)) for n in names) == [0, 1]
        # Checkpoints of the epoch before the failure, in the CheckpointManager layout.
        await pilot.press("7")
        pane = app.panes["checkpoints"]
        listed = lambda: {r.key.value.rsplit("/", 1)[1] for r in pane.checkpoint_table.table.ordered_rows}  # noqa: E731
        await wait_for(
            lambda: {"checkpoint_epoch_1.pt", "checkpoint_best.pt"} <= listed(), "the checkpoints", pilot=pilot
        )
        # The shipped recording plays as a node of its own, with its H200.
        replay = recording.stem + "-replay"
        await wait_for(
            lambda: app.fleet.states()[replay].frame is not None, "the replayed node's first frame", pilot=pilot
        )
        assert app.fleet.states()[replay].frame.gpus[0].name == "NVIDIA H200"


@pytest.mark.libraries  # the demo's real torch training run, as demo_run's (tests/conftest.py)
def test_demo_without_the_console_runs_to_its_failure_and_says_where_the_files_are(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "demo", "--dir", str(tmp_path), "--no-console", "--fail-at-epoch", "2"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "training exited with status 1" in done.stderr and str(tmp_path / "checkpoints") in done.stderr
    text = "".join(p.read_text() for p in (tmp_path / "logs").glob("train_*_rank0_*.log"))
    assert "loss contains NaN!" in text
