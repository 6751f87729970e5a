"""The Checkpoints pane in the real console app, driven by Pilot over real torch checkpoints."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tui_fakes import FakeFleet, ThisMachineFleet, single_node_states  # noqa: E402

from opsconsole.config import ActionsConfig, CheckpointDirConfig, Config, ConsoleConfig  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402
from opsconsole.tui.checkpoints import CheckpointDetailScreen, CheckpointsPane  # noqa: E402
from opsconsole.tui.confirm import ConfirmScreen  # noqa: E402
from tests.sshd import ssh_client, sshd_factory  # noqa: E402,F401,F811 (pytest fixtures)
from tests.test_checkpoints_fixtures import write_seed_layout  # noqa: E402

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


async def wait_for(pilot, predicate, what: str, tries: int = 200):
    """Let the app run until `predicate()` holds (workers finish in their own time)."""
    for _ in range(tries):
        if predicate():
            return
        await pilot.pause(0.05)
    raise AssertionError("never happened: " + what)


def cells(pane: CheckpointsPane, name: str):
    table = pane.checkpoint_table.table
    for row in table.ordered_rows:
        if row.key.value.endswith("/" + name):
            return [str(cell) for cell in table.get_row(row.key)]
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
    await wait_for(pilot, lambda: pane.checkpoint_table.table.row_count == 6, "the scan to list 6 checkpoints")
    return pane


async def test_list_markers_detail_view_and_sort(tmp_path, seed):
    empty = tmp_path / "empty_run"
    empty.mkdir()
    app = make_app(tmp_path, seed, extra_dirs=(CheckpointDirConfig(path=str(empty)),))
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot, app)
        row = cells(pane, "checkpoint_epoch_4.pt")
        assert row[:3] == ["checkpoint_epoch_4.pt", "torch", "4"] and row[7] == "ok" and row[8] == "latest"
        assert cells(pane, "checkpoint_best.pt")[8] == "best"
        assert cells(pane, "checkpoint_epoch_1.pt")[4] == "0.5 ★"  # the lowest loss is marked
        dirs = pane.dir_table.table
        assert dirs.row_count == 2 and [str(c) for c in dirs.get_row_at(0)][2] == "6"
        status = str(pane.status.render())
        assert "6 checkpoints" in status and "free" in status
        # Detail view of the highlighted row.
        pane.checkpoint_table.table.move_cursor(row=names_in_order(pane).index("checkpoint_epoch_2.pt"))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, CheckpointDetailScreen) and app.screen.is_mounted, "the detail view")
        body = app.screen.body.plain
        for text in ("model_state_dict", "optimizer_state_dict", "scheduler_state_dict", "Optimizer         present",
                     "Scheduler         present", "Loss              0.7", "float32 ×4"):
            assert text in body, text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, CheckpointDetailScreen), "the detail view to close")
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
        await wait_for(pilot, lambda: pane.checkpoint_table.table.row_count == 0, "the empty directory")
        assert str(empty) in str(pane.status.render())


async def test_crc_check_runs_in_a_worker_and_marks_the_row(tmp_path, seed):
    app = make_app(tmp_path, seed)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot, app)
        pane.checkpoint_table.table.move_cursor(row=names_in_order(pane).index("checkpoint_epoch_3.pt"))
        await pilot.press("v")
        await wait_for(pilot, lambda: pane.verifying is None and "crc" in cells(pane, "checkpoint_epoch_3.pt")[7],
                       "the CRC check")
        assert cells(pane, "checkpoint_epoch_3.pt")[7] == "ok ✓crc"
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
        await wait_for(pilot, lambda: audit(tmp_path), "the refusal")
    assert sorted(p.name for p in seed.iterdir()) == before
    records = audit(tmp_path)
    assert [(r["action"], r["outcome"]) for r in records] == [("checkpoint_cleanup", "refused")]


async def test_c_runs_the_registered_cleanup_typed_word_cancel_then_confirm_deletes_only_the_plan(tmp_path, seed):
    app = make_app(tmp_path, seed)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_pane(pilot, app)
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed, "the cleanup confirmation")
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
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "the cancel")
        assert len(list(seed.iterdir())) == 7
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed, "the second confirmation")
        await pilot.press(*seed.name, "enter")
        await wait_for(pilot, lambda: pane.checkpoint_table.table.row_count == 3, "the deletions and the rescan")
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

    config = Config(nodes=(node,), checkpoints=(CheckpointDirConfig(path=str(seed), node="n1"),),
                    actions=ActionsConfig(audit_log=str(tmp_path / "audit.log")))
    app = OpsConsole(config, LinkFleet(single_node_states()), now=time.time)
    try:
        async with app.run_test(size=SIZE) as pilot:
            pane = await open_pane(pilot, app)
            assert cells(pane, "checkpoint_epoch_4.pt")[8] == "latest"
            assert [str(c) for c in pane.dir_table.table.get_row_at(0)][:3] == ["n1", str(seed), "6"]
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
    config = Config(nodes=(node,), checkpoints=(CheckpointDirConfig(path=str(seed), node="n1"),),
                    actions=ActionsConfig(audit_log=str(tmp_path / "audit.log")))
    app = OpsConsole(config, LinkFleet(states), now=time.time)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        pane = app.panes["checkpoints"]
        await wait_for(pilot, lambda: pane.listings, "the scan result")
        listing = next(iter(pane.listings.values()))
        assert listing.problem == "node n1 is auth (authentication failed: denied): not scanned"
        assert "not scanned" in str(pane.dir_table.table.get_row_at(0)[6])
    assert link.connect_attempts == 0
