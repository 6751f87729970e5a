"""Cleanup deletes a unit only while its files are the ones its verdict was judged from.

The listing stats each file it judges (device, inode, size, mtime); the plan carries those
identities, the pin records them instead of what it finds, and the deleter (here in-process,
on a node through the helper over real SSH) re-checks them just before each unit goes. A file
rewritten, replaced or added between the listing and the pin used to be pinned as it was then,
so the deletion went ahead on a verdict made from other content; now that unit is kept,
"changed since it was judged", and audited, while every other unit goes as before.

Every test deletes only inside its own tmp_path.
"""

from __future__ import annotations

import asyncio
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
from tests.checkpoint_writers import set_mtime, write_hf_layout  # noqa: E402
from tests.remote_fs import remote_fs  # noqa: E402
from tests.sshd import ssh_client, sshd_factory  # noqa: E402,F401,F811 (pytest fixtures)

OLD = time.time() - 7200  # past min_age


def listing_of(root: Path, fs=None):
    kwargs = {} if fs is None else {"fs": fs}
    return scan_directory(str(root), cache=ResultCache(), crc_cache=ResultCache(), keep_proofs=False, **kwargs)


def step_files(root: Path, steps) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for step in steps:
        torch.save({"step": step, "model": {"w": torch.full((4,), float(step))}}, root / ("step_%d.pt" % step))
        set_mtime(root / ("step_%d.pt" % step), OLD + step)


def age_everything(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        set_mtime(path, OLD)


def audit_records(log: Path):
    return [json.loads(line) for line in log.read_text().splitlines()]


def rewrite_in_place(path: Path, data: bytes) -> None:
    """New content over the same inode (what a training run saving again does)."""
    with open(path, "r+b") as handle:
        handle.write(data)
        handle.truncate()


def test_a_unit_rewritten_between_the_listing_and_the_pin_is_kept_and_audited(tmp_path):
    root = tmp_path / "run"
    step_files(root, (1, 2, 3, 4, 5))
    write_hf_layout(root, steps=(100, 200, 300, 400), best=400)
    age_everything(root)
    listing = listing_of(root)
    judged = {entry.name: entry for entry in listing.entries}
    assert all(len(f) == 6 and f[1] != -1 and f[5] != -1 for f in judged["step_2.pt"].judged)
    assert {f[0] for f in judged["checkpoint-200"].judged} == {
        "checkpoint-200/" + name
        for name in ("config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json")
    }

    # Between the listing and the plan being pinned, four units change:
    grown = root / "step_2.pt"  # saved again: more content, a new mtime
    torch.save({"step": 2, "model": {"w": torch.zeros(64)}}, grown)
    swapped = root / "step_3.pt"  # replaced by another file of the same size, its mtime put back exactly
    before = swapped.stat()
    other = tmp_path / "other.pt"
    other.write_bytes(b"x" * before.st_size)
    os.rename(other, swapped)
    os.utime(swapped, ns=(before.st_atime_ns, before.st_mtime_ns))
    optimizer = root / "checkpoint-200" / "optimizer.pt"  # same size, other bytes, a new mtime
    rewrite_in_place(optimizer, bytes(reversed(optimizer.read_bytes())))
    (root / "checkpoint-300" / "extra.bin").write_bytes(b"new")  # a file the listing never judged

    plan = plan_directory(listing, keep=1, min_age=600, now=time.time())
    doomed = sorted(item.name for item in plan.to_delete)
    assert doomed == sorted(
        ["step_1.pt", "step_2.pt", "step_3.pt", "step_4.pt", "checkpoint-100", "checkpoint-200", "checkpoint-300"]
    )
    log = tmp_path / "audit.log"
    result = execute_plan(plan, str(root), AuditLog(str(log)))

    errors = {Path(r.path).name: r.error for r in result.failed}
    assert errors == {
        "step_2.pt": "step_2.pt changed since it was judged (size or mtime)",
        "step_3.pt": "step_3.pt was replaced since it was judged (another file has its name)",
        "checkpoint-200": "checkpoint-200/optimizer.pt changed since it was judged (size or mtime)",
        "checkpoint-300": "checkpoint-300/extra.bin appeared since it was judged: not deleted",
    }
    assert sorted(Path(r.path).name for r in result.deleted) == ["checkpoint-100", "step_1.pt", "step_4.pt"]
    left = sorted(p.name for p in root.iterdir())
    assert left == ["checkpoint-200", "checkpoint-300", "checkpoint-400", "step_2.pt", "step_3.pt", "step_5.pt"]
    assert sorted(p.name for p in (root / "checkpoint-300").iterdir())[0] == "config.json"
    # Each kept unit has its refusal in the audit log, with why; each deleted one its two records.
    records = audit_records(log)
    refused = {r["detail"].split(" ")[1]: r["detail"] for r in records if r["outcome"] == "refused"}
    assert sorted(Path(p).name for p in refused) == sorted(errors)
    for path, detail in refused.items():
        assert "skipped: " + errors[Path(path).name] in detail
    assert sorted(r["outcome"] for r in records if r["outcome"] != "refused") == ["confirmed"] * 3 + ["ok"] * 3

    # Listed again, the changed units are judged as they are now and go (the extra file with its unit).
    relisted = plan_directory(listing_of(root), keep=1, min_age=0, now=time.time() + 1)
    again = execute_plan(relisted, str(root), AuditLog(str(log)))
    assert again.ok, again.summary()
    kept = {item.name: item.reason for item in relisted.items if not item.delete}
    assert sorted(p.name for p in root.iterdir()) == sorted(kept) == ["checkpoint-400", "step_3.pt", "step_5.pt"]
    assert "not managed" in kept["step_3.pt"]  # what replaced it is no torch file: judged so now, and kept


def test_a_unit_whose_files_were_not_all_judged_is_never_deleted(tmp_path):
    root = tmp_path / "run"
    step_files(root, (1, 2, 3))
    listing = listing_of(root)
    plan = plan_directory(listing, keep=1, min_age=0, now=time.time())
    assert len(plan.to_delete) == 2
    # A plan whose items carry no judged identities (made by hand, or by an older listing): pinned, nothing goes.
    from dataclasses import replace

    from opsconsole.checkpoints.cleanup import pin_plan
    from opsconsole.checkpoints.retention import RetentionPlan

    bare = RetentionPlan(
        plan.root, plan.node, plan.keep, plan.min_age, tuple(replace(item, judged=()) for item in plan.items)
    )
    pinned = pin_plan(bare)
    assert not pinned.to_delete
    assert all("did not judge all of its files" in item.reason for item in pinned.items if item.name != "step_3.pt")
    assert sorted(p.name for p in root.iterdir()) == ["step_1.pt", "step_2.pt", "step_3.pt"]


# --- on a node, over real SSH to 127.0.0.1: the helper re-checks the identities the SFTP listing judged ---


@pytest.mark.sshd
async def test_remote_unit_rewritten_after_the_listing_is_kept_by_the_node_helper(sshd_factory, tmp_path):

    root = tmp_path / "run"
    step_files(root, (1, 2, 3, 4))
    write_hf_layout(root, steps=(100, 200, 300), best=300)
    age_everything(root)
    link, fs = remote_fs(sshd_factory)
    try:
        listing = await asyncio.to_thread(listing_of, root, fs)
        entries = {entry.name: entry for entry in listing.entries}
        assert listing.node == "n1" and entries["step_2.pt"].judged[0][1:3] == (-1, -1)  # SFTP: no inode
        grown = root / "step_2.pt"
        torch.save({"step": 2, "model": {"w": torch.zeros(64)}}, grown)
        set_mtime(grown, OLD + 2)  # a different size, even with the old mtime
        (root / "checkpoint-100" / "extra.bin").write_bytes(b"new")
        plan = await asyncio.to_thread(plan_directory, listing, fs, keep=1, min_age=600, now=time.time())
        assert sorted(item.name for item in plan.to_delete) == [
            "checkpoint-100",
            "checkpoint-200",
            "step_1.pt",
            "step_2.pt",
            "step_3.pt",
        ]
        log = tmp_path / "audit.log"
        result = await asyncio.to_thread(execute_plan, plan, str(root), AuditLog(str(log)), fs=fs)
    finally:
        await fs.aclose()
        await link.close()
    errors = {Path(r.path).name: r.error for r in result.failed}
    assert errors == {
        "step_2.pt": "step_2.pt changed since it was judged (size or mtime)",
        "checkpoint-100": "checkpoint-100/extra.bin appeared since it was judged: not deleted",
    }
    assert sorted(Path(r.path).name for r in result.deleted) == ["checkpoint-200", "step_1.pt", "step_3.pt"]
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-100", "checkpoint-300", "step_2.pt", "step_4.pt"]
    records = audit_records(log)
    refused = [r for r in records if r["outcome"] == "refused"]
    assert len(refused) == 2 and all(r["node"] == "n1" and "since it was judged" in r["detail"] for r in refused)
