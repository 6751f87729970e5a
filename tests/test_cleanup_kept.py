"""Cleanup deletes older checkpoints only while the kept ones that justify it are still as judged.

The plan deletes step_1..3 because step_4 and step_5 are the newest good ones. If step_5 is
truncated (or replaced, or removed) while the confirmation waits, deleting the older sound ones
could leave no sound checkpoint: the plan carries the kept units' judged identities too, and the
deleter (in-process here; on a node the same probe/delete_units.py over SSH) re-checks them before
anything goes. A rewrite in place with the size and mtime put back is caught by the ctime.

Every test deletes only inside its own tmp_path.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from opsconsole.actions.audit import AuditLog  # noqa: E402
from opsconsole.checkpoints.cache import ResultCache  # noqa: E402
from opsconsole.checkpoints.cleanup import execute_plan, plan_directory  # noqa: E402
from opsconsole.checkpoints.scan import scan_directory  # noqa: E402
from tests.checkpoint_writers import set_mtime  # noqa: E402
from tests.remote_fs import remote_fs  # noqa: E402
from tests.sshd import ssh_client, sshd_factory  # noqa: E402,F401,F811 (pytest fixtures)

OLD = time.time() - 7200  # past min_age


def listing_of(root: Path):
    return scan_directory(str(root), cache=ResultCache(), crc_cache=ResultCache(), keep_proofs=False)


def step_files(root: Path, steps) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for step in steps:
        torch.save({"step": step, "model": {"w": torch.full((4,), float(step))}}, root / ("step_%d.pt" % step))
        set_mtime(root / ("step_%d.pt" % step), OLD + step)


def planned(root: Path, keep: int = 2):
    plan = plan_directory(listing_of(root), keep=keep, min_age=600, now=time.time())
    assert sorted(item.name for item in plan.to_delete) == ["step_1.pt", "step_2.pt", "step_3.pt"]
    vouching = {item.name: item.vouches for item in plan.items if item.vouches}
    assert vouching == {"step_5.pt": "the newest kept checkpoint", "step_4.pt": "the newest kept checkpoint"}
    return plan


def refusals(log: Path):
    return [json.loads(line) for line in log.read_text().splitlines() if json.loads(line)["outcome"] == "refused"]


def truncate(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.truncate(size // 2)


def remove(path: Path) -> None:
    path.unlink()


def replace_same_size(path: Path) -> None:
    before = path.stat()
    other = path.with_name("other.tmp")
    other.write_bytes(b"\0" * before.st_size)
    os.rename(other, path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize(
    "change, why",
    [
        (truncate, "step_5.pt changed since it was judged (size or mtime)"),
        (remove, "step_5.pt is gone"),
        (replace_same_size, "step_5.pt was replaced since it was judged (another file has its name)"),
    ],
)
def test_the_newest_kept_checkpoint_changed_while_waiting_nothing_is_deleted(tmp_path, change, why):
    root = tmp_path / "run"
    step_files(root, (1, 2, 3, 4, 5))
    plan = planned(root)
    change(root / "step_5.pt")  # while the confirmation waits
    log = tmp_path / "audit.log"
    result = execute_plan(plan, str(root), AuditLog(str(log)))
    assert result.refused == (
        "the newest kept checkpoint step_5.pt changed since it was judged: nothing deleted (%s)" % why
    )
    assert not result.deleted
    for step in (1, 2, 3, 4):
        assert (root / ("step_%d.pt" % step)).exists()
    (record,) = refusals(log)
    assert "the newest kept checkpoint step_5.pt changed since it was judged: nothing deleted" in record["detail"]


def test_a_kept_checkpoint_changed_midway_stops_the_rest(tmp_path, monkeypatch):
    from opsconsole.probe import delete_units

    root = tmp_path / "run"
    step_files(root, (1, 2, 3, 4, 5))
    plan = planned(root)
    real_unlink = delete_units.unlink_at

    def unlink_then_truncate_newest(name, dir_fd):
        real_unlink(name, dir_fd)
        if (root / "step_5.pt").stat().st_size > 100:
            truncate(root / "step_5.pt")  # the training run crashes mid-save after the first unit went

    monkeypatch.setattr(delete_units, "unlink_at", unlink_then_truncate_newest)
    result = execute_plan(plan, str(root), AuditLog(str(tmp_path / "audit.log")))
    assert len(result.deleted) == 1
    assert all(
        r.error.startswith("the newest kept checkpoint step_5.pt changed since it was judged: not deleted")
        for r in result.failed
    )
    assert len(result.failed) == 2
    assert (root / "step_4.pt").exists()


def test_unchanged_kept_checkpoints_let_the_plan_run(tmp_path):
    root = tmp_path / "run"
    step_files(root, (1, 2, 3, 4, 5))
    result = execute_plan(planned(root), str(root), AuditLog(str(tmp_path / "audit.log")))
    assert result.ok, result.summary()
    assert sorted(p.name for p in root.iterdir()) == ["step_4.pt", "step_5.pt"]


def rewrite_keeping_size_and_mtime(path: Path) -> None:
    """Other bytes over the same inode, same size, the mtime put back to the nanosecond: only the ctime moved."""
    before = path.stat()
    data = path.read_bytes()
    with open(path, "r+b") as handle:
        handle.write(bytes(reversed(data)))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)


def test_a_candidate_rewritten_in_place_with_size_and_mtime_restored_is_refused(tmp_path):
    root = tmp_path / "run"
    step_files(root, (1, 2, 3, 4, 5))
    plan = planned(root)
    rewrite_keeping_size_and_mtime(root / "step_2.pt")
    log = tmp_path / "audit.log"
    result = execute_plan(plan, str(root), AuditLog(str(log)))
    assert {Path(r.path).name: r.error for r in result.failed} == {
        "step_2.pt": "step_2.pt changed since it was judged (rewritten in place: its ctime moved)"
    }
    assert sorted(p.name for p in root.iterdir()) == ["step_2.pt", "step_4.pt", "step_5.pt"]
    (record,) = refusals(log)
    assert "skipped: step_2.pt changed since it was judged (rewritten in place" in record["detail"]


def test_the_newest_kept_rewritten_in_place_with_size_and_mtime_restored_stops_everything(tmp_path):
    root = tmp_path / "run"
    step_files(root, (1, 2, 3, 4, 5))
    plan = planned(root)
    rewrite_keeping_size_and_mtime(root / "step_5.pt")
    result = execute_plan(plan, str(root), AuditLog(str(tmp_path / "audit.log")))
    assert result.refused == (
        "the newest kept checkpoint step_5.pt changed since it was judged: nothing deleted"
        " (step_5.pt changed since it was judged (rewritten in place: its ctime moved))"
    )
    assert len(list(root.iterdir())) == 5


def test_a_unit_whose_walk_was_cut_short_takes_no_keep_place(tmp_path, monkeypatch):
    from opsconsole.checkpoints import scan
    from tests.checkpoint_writers import write_hf_layout

    # The walk's bound lowered so that a test-sized unit passes it: checkpoint-400 holds 8 files
    # (its own five first by name, then three more), the bound is 6: the walk stops short of the
    # last ones, which were never seen, let alone checked.
    monkeypatch.setattr(scan, "MAX_UNIT_FILES", 6)
    root = tmp_path / "run"
    write_hf_layout(root, steps=(100, 200, 300, 400), best=100)
    for index in range(3):
        (root / "checkpoint-400" / ("zz_%d.json" % index)).write_text("{}")
    for path in sorted(root.rglob("*")):
        set_mtime(path, OLD)
    listing = listing_of(root)
    entries = {entry.name: entry for entry in listing.entries}
    assert entries["checkpoint-400"].integrity == "unchecked"
    assert entries["checkpoint-400"].unreadable == "over 6 files: not all of them checked"
    assert entries["checkpoint-300"].integrity == "ok"
    plan = plan_directory(listing, keep=1, min_age=600, now=time.time())
    reasons = {item.name: item.reason for item in plan.items}
    assert sorted(item.name for item in plan.to_delete) == ["checkpoint-200"]
    assert reasons["checkpoint-300"].startswith("newest 1 of")
    assert "could not read: over 6 files" in reasons["checkpoint-400"]
    result = execute_plan(plan, str(root), AuditLog(str(tmp_path / "audit.log")))
    assert result.ok, result.summary()
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-100", "checkpoint-300", "checkpoint-400"]


# --- on a node, over real SSH to 127.0.0.1: the helper there re-checks the kept units too ---


@pytest.mark.sshd
async def test_remote_newest_kept_changed_while_waiting_nothing_is_deleted_on_the_node(sshd_factory, tmp_path):
    import asyncio

    root = tmp_path / "run"
    step_files(root, (1, 2, 3, 4, 5))
    link, fs = remote_fs(sshd_factory)
    log = tmp_path / "audit.log"
    try:
        listing = await asyncio.to_thread(
            scan_directory, str(root), cache=ResultCache(), crc_cache=ResultCache(), keep_proofs=False, fs=fs
        )
        plan = await asyncio.to_thread(plan_directory, listing, fs, keep=2, min_age=600, now=time.time())
        assert sorted(item.name for item in plan.to_delete) == ["step_1.pt", "step_2.pt", "step_3.pt"]
        truncate(root / "step_4.pt")  # the other kept one, while the confirmation waits
        result = await asyncio.to_thread(execute_plan, plan, str(root), AuditLog(str(log)), fs=fs)
    finally:
        await fs.aclose()
        await link.close()
    assert result.refused is not None
    assert result.refused.startswith(
        "the newest kept checkpoint step_4.pt changed since it was judged: nothing deleted"
    )
    assert len(list(root.iterdir())) == 5
    (record,) = refusals(log)
    assert record["node"] == "n1" and "nothing deleted" in record["detail"]


def test_the_kept_best_checkpoint_changed_while_waiting_nothing_is_deleted(tmp_path):
    """What the library recorded (here the Trainer's best_model_checkpoint) vouches for the deletions too."""
    from tests.checkpoint_writers import write_hf_layout

    root = tmp_path / "run"
    write_hf_layout(root, steps=(100, 200, 300, 400), best=200)
    for path in sorted(root.rglob("*")):
        set_mtime(path, OLD)
    plan = plan_directory(listing_of(root), keep=1, min_age=600, now=time.time())
    assert sorted(item.name for item in plan.to_delete) == ["checkpoint-100", "checkpoint-300"]
    assert {item.name: item.vouches for item in plan.items if item.vouches} == {
        "checkpoint-400": "the newest kept checkpoint",
        "checkpoint-200": "the kept best checkpoint",
    }
    (root / "checkpoint-200" / "model.safetensors").unlink()
    result = execute_plan(plan, str(root), AuditLog(str(tmp_path / "audit.log")))
    assert result.refused == (
        "the kept best checkpoint checkpoint-200 changed since it was judged: nothing deleted"
        " (checkpoint-200/model.safetensors gone since it was judged: the unit is not whole)"
    )
    assert sorted(p.name for p in root.iterdir()) == [
        "checkpoint-100",
        "checkpoint-200",
        "checkpoint-300",
        "checkpoint-400",
    ]


# --- CheckpointManager's checkpoint_best.pt: outside the epoch series, the only copy of the best ---


def seed_plan(root: Path):
    """Epochs 0..4 with losses 0.9, 0.5, 0.7, 0.6, 0.65: checkpoint_best.pt is epoch 1's copy, and
    with --keep 1 epoch 1 goes (the copy is sound, so no epoch is marked best): the copy vouches."""
    from tests.checkpoint_writers import write_seed_layout

    write_seed_layout(root)
    plan = plan_directory(listing_of(root), keep=1, min_age=600, now=time.time())
    assert sorted(item.name for item in plan.to_delete) == [
        "checkpoint_epoch_0.pt",
        "checkpoint_epoch_1.pt",
        "checkpoint_epoch_2.pt",
        "checkpoint_epoch_3.pt",
    ]
    assert {item.name: item.vouches for item in plan.items if item.vouches} == {
        "checkpoint_epoch_4.pt": "the newest kept checkpoint",
        "checkpoint_best.pt": "the best copy",
    }
    return plan


def test_the_best_copy_changed_while_waiting_nothing_is_deleted(tmp_path):
    """CheckpointManager's checkpoint_best.pt is never deleted, but the plan deletes the lowest-loss epoch
    because of it: truncated (a crash while a new best is saved) while the prompt waits, nothing goes."""
    root = tmp_path / "run"
    plan = seed_plan(root)
    truncate(root / "checkpoint_best.pt")
    log = tmp_path / "audit.log"
    result = execute_plan(plan, str(root), AuditLog(str(log)))
    assert result.refused == (
        "the best copy checkpoint_best.pt changed since it was judged: nothing deleted"
        " (checkpoint_best.pt changed since it was judged (size or mtime))"
    )
    assert not result.deleted
    assert (root / "checkpoint_epoch_1.pt").exists()
    (record,) = refusals(log)
    assert "the best copy checkpoint_best.pt changed since it was judged: nothing deleted" in record["detail"]


def test_an_unchanged_best_copy_lets_the_plan_run_and_stays(tmp_path):
    root = tmp_path / "run"
    result = execute_plan(seed_plan(root), str(root), AuditLog(str(tmp_path / "audit.log")))
    assert result.ok, result.summary()
    assert sorted(p.name for p in root.iterdir()) == [
        "checkpoint_best.pt",
        "checkpoint_epoch_4.pt",
        "checkpoint_latest.pt",
    ]
    assert torch.load(root / "checkpoint_best.pt", weights_only=True)["epoch"] == 1


def test_the_best_copy_vouches_only_when_the_lowest_loss_epoch_goes(tmp_path):
    """With the lowest-loss epoch kept (the newest here), the copy justifies nothing and is not re-checked."""
    from tests.checkpoint_writers import write_seed_layout

    root = tmp_path / "run"
    write_seed_layout(root, losses=(0.9, 0.8, 0.7, 0.6, 0.5))
    plan = plan_directory(listing_of(root), keep=1, min_age=600, now=time.time())
    assert {item.name: item.vouches for item in plan.items if item.vouches} == {
        "checkpoint_epoch_4.pt": "the newest kept checkpoint"
    }


def test_a_best_copy_never_opened_does_not_stand_in_for_the_lowest_loss_epoch(tmp_path):
    """checkpoint_best.pt written by an old torch.save (a legacy pickle: listed, never opened) proves
    nothing: the lowest-loss epoch is kept as best, as with no copy at all. Before, its presence alone
    let epoch 1 go, the only proved copy of the best model."""
    from tests.checkpoint_writers import write_seed_layout

    root = tmp_path / "run"
    write_seed_layout(root)
    best = root / "checkpoint_best.pt"
    st = best.stat()
    torch.save(torch.load(best, weights_only=True), best, _use_new_zipfile_serialization=False)
    os.utime(best, ns=(st.st_atime_ns, st.st_mtime_ns))
    entries = {entry.name: entry for entry in listing_of(root).entries}
    assert (entries["checkpoint_best.pt"].format, entries["checkpoint_best.pt"].integrity) == (
        "torch-legacy",
        "unchecked",
    )
    assert (
        entries["checkpoint_epoch_1.pt"].best and "best (lowest loss)" in entries["checkpoint_epoch_1.pt"].protections
    )
    plan = plan_directory(listing_of(root), keep=1, min_age=600, now=time.time())
    assert sorted(item.name for item in plan.to_delete) == [
        "checkpoint_epoch_0.pt",
        "checkpoint_epoch_2.pt",
        "checkpoint_epoch_3.pt",
    ]
    assert "checkpoint_best.pt" not in {item.name for item in plan.items if item.vouches}


def test_a_best_copy_of_a_higher_loss_does_not_stand_in_for_the_lowest_loss_epoch(tmp_path):
    """checkpoint_best.pt that is not the lowest-loss epoch's copy (a resumed run's manager starts its best
    afresh and saves a worse epoch as the 'best'; a copy left from another run) holds other weights: the
    lowest-loss epoch is kept as best. Before, any sound copy let --keep 1 delete epoch 1, the only copy
    of the best model."""
    import shutil

    from tests.checkpoint_writers import write_seed_layout

    root = tmp_path / "run"
    paths = write_seed_layout(root)
    best = root / "checkpoint_best.pt"
    st = best.stat()
    shutil.copyfile(paths[3], best)  # epoch 3's loss 0.6, where epoch 1 has 0.5
    os.utime(best, ns=(st.st_atime_ns, st.st_mtime_ns))
    entries = {entry.name: entry for entry in listing_of(root).entries}
    assert entries["checkpoint_best.pt"].integrity == "ok" and entries["checkpoint_best.pt"].meta.loss == 0.6
    assert (
        entries["checkpoint_epoch_1.pt"].best and "best (lowest loss)" in entries["checkpoint_epoch_1.pt"].protections
    )
    plan = plan_directory(listing_of(root), keep=1, min_age=600, now=time.time())
    assert sorted(item.name for item in plan.to_delete) == [
        "checkpoint_epoch_0.pt",
        "checkpoint_epoch_2.pt",
        "checkpoint_epoch_3.pt",
    ]
    result = execute_plan(plan, str(root), AuditLog(str(tmp_path / "audit.log")))
    assert result.ok, result.summary()
    assert torch.load(root / "checkpoint_epoch_1.pt", weights_only=True)["loss"] == 0.5


@pytest.mark.sshd
async def test_remote_best_copy_changed_while_waiting_nothing_is_deleted_on_the_node(sshd_factory, tmp_path):
    """The best copy's re-check goes with the plan to the node helper, as the newest kept units' do."""
    import asyncio

    from tests.checkpoint_writers import write_seed_layout

    root = tmp_path / "run"
    write_seed_layout(root)
    link, fs = remote_fs(sshd_factory)
    log = tmp_path / "audit.log"
    try:
        listing = await asyncio.to_thread(
            scan_directory, str(root), cache=ResultCache(), crc_cache=ResultCache(), keep_proofs=False, fs=fs
        )
        plan = await asyncio.to_thread(plan_directory, listing, fs, keep=1, min_age=600, now=time.time())
        assert "checkpoint_epoch_1.pt" in {item.name for item in plan.to_delete}
        assert {item.name: item.vouches for item in plan.items if item.vouches}["checkpoint_best.pt"] == "the best copy"
        truncate(root / "checkpoint_best.pt")  # a crash while a new best is saved, while the confirmation waits
        result = await asyncio.to_thread(execute_plan, plan, str(root), AuditLog(str(log)), fs=fs)
    finally:
        await fs.aclose()
        await link.close()
    assert result.refused is not None
    assert result.refused.startswith("the best copy checkpoint_best.pt changed since it was judged: nothing deleted")
    assert (root / "checkpoint_epoch_1.pt").exists()
    (record,) = refusals(log)
    assert record["node"] == "n1" and "nothing deleted" in record["detail"]
