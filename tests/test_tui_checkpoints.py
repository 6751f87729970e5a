"""The Checkpoints pane in the real console app, driven by Pilot over real torch checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tui_fakes import FakeFleet, ThisMachineFleet, single_node_states  # noqa: E402

from opsconsole.config import ActionsConfig, CheckpointDirConfig, Config, ConsoleConfig  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402
from opsconsole.tui.checkpoints import CheckpointDetailScreen, CheckpointsPane  # noqa: E402
from opsconsole.tui.confirm import ConfirmScreen  # noqa: E402
from tests.checkpoint_writers import write_seed_layout  # noqa: E402
from tests.sshd import ssh_client, sshd_factory  # noqa: E402,F401,F811 (pytest fixtures)
from tests.waiting import pane_shown, wait_for  # noqa: E402

SIZE = (170, 45)


def make_app(tmp_path: Path, root: Path, read_only: bool = False, extra_dirs=()) -> OpsConsole:
    config = Config(
        console=ConsoleConfig(read_only=read_only),
        checkpoints=(CheckpointDirConfig(path=str(root), keep=2, min_age=600),) + tuple(extra_dirs),
        actions=ActionsConfig(audit_log=str(tmp_path / "audit.log")),
    )
    return OpsConsole(config, ThisMachineFleet(single_node_states()), now=time.time)


def audit(tmp_path: Path):
    path = tmp_path / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def cells(pane: CheckpointsPane, name: str):
    """The row of `name` as {column key: text} (the narrow pane has fewer columns)."""
    table = pane.checkpoint_table.table
    keys = [c.key for c in pane.checkpoint_table.columns]
    for row in table.ordered_rows:
        if row.key.value.endswith("/" + name):
            return dict(zip(keys, (str(cell) for cell in table.get_row(row.key))))
    raise KeyError(name)


def names_in_order(pane: CheckpointsPane):
    return [row.key.value.rsplit("/", 1)[1] for row in pane.checkpoint_table.table.ordered_rows]


@pytest.fixture
def seed(tmp_path):
    root = tmp_path / "ckpts"
    write_seed_layout(root)  # losses 0.9 0.5 0.7 0.6 0.65; best copy; latest -> epoch 4
    return root


async def open_pane(pilot, app):
    await pilot.press("7")
    pane = app.panes["checkpoints"]
    await wait_for(lambda: pane.checkpoint_table.table.row_count == 6, "the scan to list 6 checkpoints", pilot=pilot)
    # And holding the focus: a key typed before that is not the pane's (under load `c` never asked).
    await wait_for(lambda: pane_shown(app, "checkpoints"), "the Checkpoints pane focused", pilot=pilot)
    return pane


async def test_list_markers_detail_view_and_sort(tmp_path, seed):
    empty = tmp_path / "empty_run"
    empty.mkdir()
    app = make_app(tmp_path, seed, extra_dirs=(CheckpointDirConfig(path=str(empty)),))
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot, app)
        row = cells(pane, "checkpoint_epoch_4.pt")
        assert (row["name"], row["format"], row["epoch"], row["integrity"], row["marks"]) == (
            "checkpoint_epoch_4.pt",
            "torch",
            "4",
            "ok",
            "latest",
        )
        assert (row["layout"], row["series"], row["note"]) == ("ckpt manager", "checkpoint_epoch_N.pt", "")
        best = cells(pane, "checkpoint_best.pt")
        assert best["marks"] == "best" and best["series"] == "not managed"
        assert best["note"] == "CheckpointManager's copy: not part of the epoch series"
        assert cells(pane, "checkpoint_epoch_1.pt")["loss"] == "0.5000 ★"  # the lowest loss is marked
        dirs = pane.dir_table.table
        # The directory's count and size are its managed units' (5 epochs), not the best copy's too.
        assert dirs.row_count == 2 and [str(c) for c in dirs.get_row_at(0)][2] == "5"
        status = str(pane.status.render())
        assert "6 units" in status and "5 managed" in status and "1 not managed" in status and "free" in status
        # Detail view of the highlighted row.
        pane.checkpoint_table.table.move_cursor(row=names_in_order(pane).index("checkpoint_epoch_2.pt"))
        await pilot.press("enter")
        await wait_for(
            lambda: isinstance(app.screen, CheckpointDetailScreen) and app.screen.is_mounted,
            "the detail view",
            pilot=pilot,
        )
        body = app.screen.body.plain
        for text in (
            "model_state_dict",
            "optimizer_state_dict",
            "scheduler_state_dict",
            "Optimizer         present",
            "Scheduler         present",
            "Loss              0.7",
            "float32 ×4",
            "Layout            ckpt manager  (checkpoint-manager)",
            "Series            checkpoint_epoch_N.pt",
            "Members (whole)   checkpoint_epoch_2.pt\n",
            "Protected by      nothing recorded\n",
        ):
            assert text in body, text
        await pilot.press("escape")
        await wait_for(
            lambda: not isinstance(app.screen, CheckpointDetailScreen), "the detail view to close", pilot=pilot
        )
        # Sort by loss, then the second directory with d.
        pane.checkpoint_table.sort.sort_by("loss")
        pane.redraw()
        await pilot.pause()
        assert names_in_order(pane)[:2] == ["checkpoint_best.pt", "checkpoint_epoch_1.pt"]
        assert names_in_order(pane)[-1] == "checkpoint_epoch_0.pt"
        # The / filter: epoch above 2 and the format.
        pane.apply_filter("epoch>2 format:torch")
        await pilot.pause()
        assert sorted(names_in_order(pane)) == ["checkpoint_epoch_3.pt", "checkpoint_epoch_4.pt"]
        pane.apply_filter("")
        await pilot.press("d")
        await wait_for(lambda: pane.checkpoint_table.table.row_count == 0, "the empty directory", pilot=pilot)
        assert str(empty) in str(pane.status.render())


async def test_losses_read_alike_in_the_pane_its_details_and_the_listing(tmp_path):
    """`0.0099` (`%.4g`) printed beside `0.01` in the pane and the listing, the details `%.6g`: one spelling
    everywhere now, four significant digits with their zeros (units.format_metric)."""
    root = tmp_path / "ckpts"
    write_seed_layout(root, losses=(0.0099, 0.01, 0.012345))
    listing = subprocess.run(
        [sys.executable, "-m", "opsconsole", "checkpoints", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(Path(__file__).resolve().parents[1]),
    )
    assert listing.returncode == 0, listing.stderr
    listed = {line.split()[0]: line.split() for line in listing.stdout.splitlines()[1:-1]}
    assert "0.009900*" in listed["checkpoint_epoch_0.pt"] and "0.01000" in listed["checkpoint_epoch_1.pt"], (
        listing.stdout
    )
    assert "0.01235" in listed["checkpoint_epoch_2.pt"], listing.stdout
    app = make_app(tmp_path, root)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        pane = app.panes["checkpoints"]
        await wait_for(lambda: pane.checkpoint_table.table.row_count == 4, "the scan to list 4 units", pilot=pilot)
        assert cells(pane, "checkpoint_epoch_0.pt")["loss"] == "0.009900 ★"
        assert cells(pane, "checkpoint_epoch_1.pt")["loss"] == "0.01000"
        assert cells(pane, "checkpoint_epoch_2.pt")["loss"] == "0.01235"
        pane.checkpoint_table.table.move_cursor(row=names_in_order(pane).index("checkpoint_epoch_1.pt"))
        await pilot.press("enter")
        await wait_for(
            lambda: isinstance(app.screen, CheckpointDetailScreen) and app.screen.is_mounted,
            "the detail view",
            pilot=pilot,
        )
        body = app.screen.body.plain
        assert "Loss              0.01000\n" in body, body
        assert "Metric acc        0.5100\n" in body, body  # the CheckpointManager's metrics: the same spelling


async def test_crc_check_runs_in_a_worker_and_marks_the_row(tmp_path, seed):
    app = make_app(tmp_path, seed)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot, app)
        pane.checkpoint_table.table.move_cursor(row=names_in_order(pane).index("checkpoint_epoch_3.pt"))
        await pilot.press("v")
        await wait_for(
            lambda: pane.verifying is None and "crc" in cells(pane, "checkpoint_epoch_3.pt")["integrity"],
            "the CRC check",
            pilot=pilot,
        )
        assert cells(pane, "checkpoint_epoch_3.pt")["integrity"] == "ok ✓crc"
        assert pane.progress.progress == pane.progress.total


async def test_cleanup_is_absent_in_read_only(tmp_path, seed):
    before = sorted(p.name for p in seed.iterdir())
    app = make_app(tmp_path, seed, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot, app)
        assert "checkpoints.cleanup" not in {b.binding.id for b in app.active_bindings.values()}
        await pilot.press("c")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ConfirmScreen)
        # Asked for anyway (the palette, a script): the registered action refuses it, audited.
        app.action_flow.start("checkpoint_cleanup", pane.action_target("checkpoint_cleanup"))
        await wait_for(lambda: audit(tmp_path), "the refusal", pilot=pilot)
    assert sorted(p.name for p in seed.iterdir()) == before
    records = audit(tmp_path)
    assert [(r["action"], r["outcome"]) for r in records] == [("checkpoint_cleanup", "refused")]


async def test_c_runs_the_registered_cleanup_typed_word_cancel_then_confirm_deletes_only_the_plan(tmp_path, seed):
    app = make_app(tmp_path, seed)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot, app)
        await pilot.press("c")
        await wait_for(
            lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed, "the cleanup confirmation", pilot=pilot
        )
        screen = app.screen
        assert app.focused.id == "confirm-word"  # deleting checkpoints: the directory's name must be typed
        body = screen.body.plain
        assert "Clean up" in screen.title_text and str(seed) in screen.title_text
        assert "opsconsole cleanup %s --keep 2 --min-age 600" % seed in body  # the headless command it equals
        assert "deletes 3 of 6" in body
        for name in ("checkpoint_epoch_0.pt", "checkpoint_epoch_1.pt", "checkpoint_epoch_2.pt"):
            assert next(line for line in body.splitlines() if name in line).lstrip("· ").startswith("delete")
        assert "best" in next(line for line in body.splitlines() if "checkpoint_best.pt" in line)
        assert "latest" in next(line for line in body.splitlines() if "checkpoint_epoch_4.pt" in line)
        await pilot.press("y", "enter")  # y is a letter of the word, and a wrong word confirms nothing
        await pilot.pause()
        assert app.screen is screen and len(list(seed.iterdir())) == 7
        await pilot.press("escape")
        await wait_for(lambda: not isinstance(app.screen, ConfirmScreen), "the cancel", pilot=pilot)
        assert len(list(seed.iterdir())) == 7
        await pilot.press("c")
        await wait_for(
            lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed, "the second confirmation", pilot=pilot
        )
        await pilot.press(*seed.name, "enter")
        await wait_for(lambda: pane.checkpoint_table.table.row_count == 3, "the deletions and the rescan", pilot=pilot)
    left = sorted(p.name for p in seed.iterdir())
    assert left == ["checkpoint_best.pt", "checkpoint_epoch_3.pt", "checkpoint_epoch_4.pt", "checkpoint_latest.pt"]
    records = audit(tmp_path)
    assert (records[0]["action"], records[0]["outcome"]) == ("checkpoint_cleanup", "cancelled")
    deletes = [r for r in records if r["action"] == "checkpoint.delete"]
    assert [r["outcome"] for r in deletes] == ["confirmed", "ok"] * 3
    assert [r["outcome"] for r in records if r["action"] == "checkpoint_cleanup"] == ["cancelled", "attempt", "ok"]


async def test_a_remote_directory_is_listed_over_the_nodes_ssh_connection(tmp_path, seed, sshd_factory):
    from opsconsole.config import NodeConfig, SshConfig
    from opsconsole.nodes.ssh import SshLink

    server = sshd_factory.start()
    node = NodeConfig(name="n1", host=server.address, port=server.port)
    link = SshLink(node, SshConfig(connect_timeout=5.0), 1.0)

    class LinkFleet(FakeFleet):
        def link(self, name):
            return {"n1": link}[name]

    config = Config(
        nodes=(node,),
        checkpoints=(CheckpointDirConfig(path=str(seed), node="n1"),),
        actions=ActionsConfig(audit_log=str(tmp_path / "audit.log")),
    )
    app = OpsConsole(config, LinkFleet(single_node_states()), now=time.time)
    try:
        async with app.run_test(size=SIZE) as pilot:
            pane = await open_pane(pilot, app)
            assert cells(pane, "checkpoint_epoch_4.pt")["marks"] == "latest"
            assert [str(c) for c in pane.dir_table.table.get_row_at(0)][:3] == ["n1", str(seed), "5"]  # managed
    finally:
        await link.close()


async def test_a_node_waiting_in_auth_is_not_logged_into_by_the_pane(tmp_path, seed):
    from opsconsole.config import NodeConfig, SshConfig
    from opsconsole.model import STATE_AUTH, NodeState
    from opsconsole.nodes.ssh import SshLink

    node = NodeConfig(name="n1", host="127.0.0.1", port=9)
    link = SshLink(node, SshConfig(connect_timeout=2.0), 1.0)

    class LinkFleet(FakeFleet):
        def link(self, name):
            return {"n1": link}[name]

    states = single_node_states() + [NodeState(name="n1", state=STATE_AUTH, reason="authentication failed: denied")]
    config = Config(
        nodes=(node,),
        checkpoints=(CheckpointDirConfig(path=str(seed), node="n1"),),
        actions=ActionsConfig(audit_log=str(tmp_path / "audit.log")),
    )
    app = OpsConsole(config, LinkFleet(states), now=time.time)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        pane = app.panes["checkpoints"]
        await wait_for(lambda: pane.listings, "the scan result", pilot=pilot)
        listing = next(iter(pane.listings.values()))
        assert listing.problem == "node n1 is auth (authentication failed: denied): not scanned"
        assert "not scanned" in str(pane.dir_table.table.get_row_at(0)[6])
    assert link.connect_attempts == 0


# --- units as the training libraries write them (tests/checkpoint_libraries.py) ---------------

from opsconsole.tui.checkpoints import CKPT_COLUMNS, CKPT_COLUMNS_NARROW  # noqa: E402
from tests.checkpoint_libraries import (  # noqa: E402,F401  (session fixtures)
    HF_STEPS,
    copy_artifact,
    hf_run,
    library_root,
    lightning_run,
    write_deepspeed_layout,
)


def screen_text(app) -> str:
    """What the terminal shows, as plain text (to read the table as an operator would)."""
    from rich.console import Console

    console = Console(
        width=app.size.width, height=app.size.height, record=True, color_system=None, file=open(os.devnull, "w")
    )
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


async def open_units(pilot, app, count: int):
    await pilot.press("7")
    pane = app.panes["checkpoints"]
    await wait_for(
        lambda: pane.checkpoint_table.table.row_count == count,
        "the scan to list %d units" % count,
        timeout=30,
        pilot=pilot,
    )
    return pane


@pytest.mark.parametrize("size", [(170, 45), (120, 40)])
async def test_hf_trainer_output_shows_layout_series_marks_and_why_not_managed(tmp_path, hf_run, size):
    root = copy_artifact(hf_run.output_dir, tmp_path)
    app = make_app(tmp_path, root)
    async with app.run_test(size=size) as pilot:
        pane = await open_units(pilot, app, 1 + len(hf_run.checkpoints))
        expected = CKPT_COLUMNS if size[0] == 170 else CKPT_COLUMNS_NARROW
        # A pane mounted on its first show learns its width from its first resize: wait for it.
        await wait_for(
            lambda: [c.key for c in pane.checkpoint_table.columns] == [c.key for c in expected],
            "the columns for %d cells" % size[0],
            pilot=pilot,
        )
        final = cells(pane, "model.safetensors")
        assert (final["layout"], final["series"]) == ("final model", "not managed")
        assert final["note"].startswith("final model (save_model/save_pretrained output)")
        best = cells(pane, hf_run.best_checkpoint)
        newest = cells(pane, hf_run.checkpoints[-1])
        assert (best["layout"], best["series"], best["marks"], best["step"]) == (
            "HF checkpoint",
            "checkpoint-N/",
            "best",
            "4",
        )
        assert (newest["marks"], newest["step"], newest["integrity"]) == ("latest", str(HF_STEPS), "ok")
        shown = screen_text(app)
        # The row as the operator reads it: layout, series and mark on one line, inside the width.
        line = next(line for line in shown.splitlines() if hf_run.best_checkpoint + " " in line)
        assert "HF checkpoint" in line and "checkpoint-N/" in line and "best" in line
        final_line = next(line for line in shown.splitlines() if "model.safetensors" in line)
        assert "final model" in final_line and "not managed" in final_line
        # Details: the final model's members and the best checkpoint's protections.
        pane.checkpoint_table.table.move_cursor(row=names_in_order(pane).index("model.safetensors"))
        await pilot.press("enter")
        await wait_for(
            lambda: isinstance(app.screen, CheckpointDetailScreen) and app.screen.is_mounted, "details", pilot=pilot
        )
        body = app.screen.body.plain
        members = body.split("Members (whole)", 1)[1].split("\n\n", 1)[0].split()
        assert set(hf_run.final_files) <= set(members)
        assert "Layout            final model  (hf-final-model)" in body
        assert "Series            not managed: final model" in body
        await pilot.press("escape")
        await wait_for(lambda: not isinstance(app.screen, CheckpointDetailScreen), "close", pilot=pilot)
        pane.checkpoint_table.table.move_cursor(row=names_in_order(pane).index(hf_run.best_checkpoint))
        await pilot.press("enter")
        await wait_for(
            lambda: isinstance(app.screen, CheckpointDetailScreen) and app.screen.is_mounted, "details", pilot=pilot
        )
        body = app.screen.body.plain
        assert "Protected by      best (best_model_checkpoint of the newest trainer_state.json)\n" in body
        assert (
            "Members (whole)   %s/  (the directory and all it holds: checkpoint (8 files))" % hf_run.best_checkpoint
            in body
        )


async def test_lightning_top_k_best_and_last(tmp_path, lightning_run):
    root = copy_artifact(lightning_run.dir, tmp_path)
    count = len([p for p in root.iterdir()])
    app = make_app(tmp_path, root)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_units(pilot, app, count)
        best_name = Path(lightning_run.best_model_path).name
        best = cells(pane, best_name)
        assert best["layout"] == "Lightning" and best["series"] == "ModelCheckpoint .ckpt"
        assert best["marks"].split() == ["best", "top-k"]
        for name in lightning_run.best_k_models:
            assert "top-k" in cells(pane, name)["marks"].split()
        last = cells(pane, "last.ckpt")
        assert last["marks"] == "latest" and last["series"] == "not managed"
        assert last["note"] == "Lightning's last.ckpt: kept as latest"


async def test_deepspeed_current_tag(tmp_path):
    root = write_deepspeed_layout(tmp_path / "ds")
    app = make_app(tmp_path, root)
    async with app.run_test(size=(120, 40)) as pilot:
        pane = await open_units(pilot, app, 3)
        assert cells(pane, "global_step200")["marks"] == "current tag"
        assert cells(pane, "global_step200")["layout"] == "DeepSpeed"
        assert cells(pane, "global_step300")["marks"] == ""


def test_note_says_the_problem_then_why_unreadable_then_why_not_managed():
    from opsconsole.checkpoints.records import CheckpointEntry
    from opsconsole.tui.checkpoints import marks_text, note_text

    entry = CheckpointEntry(
        path="/r/big.pt",
        name="big.pt",
        format="torch",
        size_bytes=1,
        mtime=0.0,
        unreadable="could not read: data.pkl is 300000000 bytes, over the reader's limit",
        unmanaged="no epoch or step in its name: not part of a series",
    )
    assert note_text(entry) == (
        "could not read: data.pkl is 300000000 bytes, over the reader's limit; "
        "no epoch or step in its name: not part of a series"
    )
    crashed = CheckpointEntry(
        path="/r/x_step_3.pt",
        name="x_step_3.pt",
        format="torch",
        size_bytes=1,
        mtime=0.0,
        series="x_step_N.pt",
        problem="worker crashed (SIGSEGV)",
        unreadable="worker crashed (SIGSEGV)",
        protections=("top-k of ModelCheckpoint(monitor=val_acc, mode=max)",),
        best=True,
        latest=True,
    )
    assert note_text(crashed) == "worker crashed (SIGSEGV)"
    assert marks_text(crashed) == "best top-k latest"


async def test_two_hf_runs_in_one_output_dir_the_pane_says_which_checkpoint_resume_true_takes(tmp_path, hf_run):
    """A real second Trainer run from step 0 into a copy of the first run's output_dir, to step 6: the
    pane's status line says which checkpoint `resume_from_checkpoint=True` (transformers' own
    get_last_checkpoint) resumes, and where the run that saved last stopped (hf_runs.resume_warnings)."""
    from transformers.trainer_utils import get_last_checkpoint

    from tests.checkpoint_libraries import hf_second_run

    root = copy_artifact(hf_run.output_dir, tmp_path)
    old = time.time() - 7200  # the first run two hours ago, the second an hour ago: both older than min_age
    for path in root.rglob("*"):
        os.utime(path, (old, path.lstat().st_mtime - 7200), follow_symlinks=False)
    second = hf_second_run(root)
    for path in root.rglob("*"):
        if path.lstat().st_mtime > old:
            os.utime(path, (old, path.lstat().st_mtime - 3600), follow_symlinks=False)
    assert second.state.global_step == 6
    picked = Path(get_last_checkpoint(str(root))).name  # what resume_from_checkpoint=True resumes
    assert picked == "checkpoint-%d" % HF_STEPS
    count = sum(1 for p in root.iterdir() if p.name.startswith("checkpoint-")) + 1  # and the final model
    app = make_app(tmp_path, root)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_units(pilot, app, count)
        # Both runs' newest saves are marked latest (checkpoint-6 is its run's best too).
        assert "latest" in cells(pane, picked)["marks"].split()
        assert "latest" in cells(pane, "checkpoint-6")["marks"].split()
        words = (
            "two runs saved checkpoints here: resume_from_checkpoint=True resumes %s, the highest step (%d), "
            "saved by the earlier run; the run that saved last stopped at checkpoint-6 (step 6)" % (picked, HF_STEPS)
        )
        (warning,) = pane.listings[pane.current_dir_key()].warnings
        assert warning.startswith(words), warning
        # On the screen as the operator reads it, whole (wrapped above the units; before, it ended the
        # one-line status and was cut at the terminal's width after "warning: two").
        # (Waited for: the line shows from the next layout after the scan's redraw.)
        await wait_for(
            lambda: ("warning: " + warning) in " ".join(screen_text(app).split()), "the warning on screen", pilot=pilot
        )
        shown = screen_text(app)
        assert "1 warning above the units" in str(pane.status.render())
        # Where it stands: between the directory table and the units.
        lines = shown.splitlines()
        at = next(i for i, line in enumerate(lines) if "warning: two runs saved checkpoints here" in line)
        directory = next(i for i, line in enumerate(lines) if line.lstrip().startswith("local ") and str(root) in line)
        header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("Name "))
        assert directory < at < header, shown
