"""Checkpoint cleanup as a registered action: real torch.save checkpoints, the retention plan, audited deletion."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from opsconsole.actions.audit import AuditLog  # noqa: E402
from opsconsole.actions.registry import (  # noqa: E402
    TARGET_CHECKPOINT_DIR,
    ActionContext,
    Refused,
    Target,
    plan_action,
    run_plan,
)
from opsconsole.actions.runner import ActionRunner  # noqa: E402
from opsconsole.config import ActionsConfig, CheckpointDirConfig, Config, NodeConfig  # noqa: E402

HOUR = 3600.0


def checkpoints(folder: Path, steps) -> None:
    """step_N.pt files from torch.save, the oldest first, all older than an hour."""
    folder.mkdir()
    now = time.time()
    for position, step in enumerate(steps):
        path = folder / ("step_%d.pt" % step)
        torch.save({"step": step, "model": {"w": torch.full((4, 4), float(step))}}, path)
        when = now - 10 * HOUR + position * HOUR
        os.utime(path, (when, when))


class LocalNode:
    """The local node's link as the registry sees it: commands run on this machine."""

    name = "local"
    commands_run = "here"


def context(tmp_path: Path, folder: Path, keep: int = 2) -> ActionContext:
    config = Config(
        nodes=(NodeConfig(name="local", local=True),),
        checkpoints=(CheckpointDirConfig(path=str(folder), keep=keep, min_age=600.0),),
        actions=ActionsConfig(audit_log=str(tmp_path / "audit.log")),
    )
    return ActionContext(
        config=config,
        get_state=lambda: None,
        link=LocalNode(),
        runner=ActionRunner(AuditLog(str(tmp_path / "audit.log"))),
    )


async def test_cleanup_keeps_the_newest_and_deletes_the_rest_audited(tmp_path):
    folder = tmp_path / "ckpt"
    checkpoints(folder, [100, 200, 300, 400, 500])
    ctx = context(tmp_path, folder, keep=2)
    plan = await plan_action("checkpoint_cleanup", Target(TARGET_CHECKPOINT_DIR, "local", path=str(folder)), ctx)
    assert plan.word == "ckpt"
    assert plan.argv == ("opsconsole", "cleanup", str(folder), "--keep", "2", "--min-age", "600")
    assert plan.notes[0].startswith("deletes 3 of 5")
    assert sorted(os.listdir(folder)) == [
        "step_%d.pt" % s for s in (100, 200, 300, 400, 500)
    ]  # planning deletes nothing
    report = await run_plan(plan, ctx)
    assert report.ok, report.lines
    assert sorted(os.listdir(folder)) == ["step_400.pt", "step_500.pt"]
    assert report.lines[0].startswith("deleted 3 of 3")
    records = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    runner_records = [(r["action"], r["outcome"]) for r in records if r["action"] == "checkpoint_cleanup"]
    assert runner_records == [("checkpoint_cleanup", "attempt"), ("checkpoint_cleanup", "ok")]
    # Each deletion was audited by execute_plan before it happened, between the two.
    deletes = [r for r in records if r["action"] == "checkpoint.delete"]
    assert [r["outcome"] for r in deletes] == ["confirmed", "ok"] * 3
    assert records[0]["action"] == "checkpoint_cleanup" and records[-1]["action"] == "checkpoint_cleanup"


async def test_the_command_and_the_console_name_one_cleanup_one_way_in_the_audit_log(tmp_path):
    """`opsconsole cleanup`'s refusals wrote "checkpoint.cleanup" with no target, the console's runner
    "checkpoint_cleanup" with "dir PATH": one action under two names in one log."""
    import subprocess
    import sys

    folder = tmp_path / "ckpt"
    checkpoints(folder, [100, 200, 300, 400])
    ctx = context(tmp_path, folder, keep=3)
    assert (
        await run_plan(
            await plan_action("checkpoint_cleanup", Target(TARGET_CHECKPOINT_DIR, "local", path=str(folder)), ctx), ctx
        )
    ).ok
    config = tmp_path / "config.toml"
    config.write_text('[actions]\naudit_log = "%s"\n' % (tmp_path / "audit.log"))
    env = dict(os.environ, OPSCONSOLE_CONFIG=str(config))
    refused = subprocess.run(  # no --yes and no terminal: refused, and audited
        [sys.executable, "-m", "opsconsole", "cleanup", str(folder), "--keep", "1", "--min-age", "0"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert refused.returncode == 2 and "without --yes" in refused.stderr
    records = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    console, command = records[0], records[-1]
    assert console["outcome"] == "attempt" and command["outcome"] == "refused"
    assert (
        (command["action"], command["target"])
        == (console["action"], console["target"])
        == (
            "checkpoint_cleanup",
            "dir %s" % folder,
        )
    )
    assert "(opsconsole cleanup)" in command["detail"]


async def test_only_configured_directories_are_cleaned(tmp_path):
    folder = tmp_path / "ckpt"
    checkpoints(folder, [1, 2, 3])
    other = tmp_path / "elsewhere"
    ctx = context(tmp_path, other)
    with pytest.raises(Refused, match="is not a \\[\\[checkpoints\\]\\] directory"):
        await plan_action("checkpoint_cleanup", Target(TARGET_CHECKPOINT_DIR, "local", path=str(folder)), ctx)
    keep_all = context(tmp_path, folder, keep=5)
    with pytest.raises(Refused, match="nothing to delete"):
        await plan_action("checkpoint_cleanup", Target(TARGET_CHECKPOINT_DIR, "local", path=str(folder)), keep_all)
    assert len(os.listdir(folder)) == 3


class FillingAuditLog(AuditLog):
    """An audit log on a disk that fills after `room` records: later writes go to /dev/full (ENOSPC)."""

    def __init__(self, path: str, room: int) -> None:
        super().__init__(path)
        self.room = room

    def _append(self, data: bytes):
        if self.room <= 0:
            self.path = "/dev/full"
        self.room -= 1
        return super()._append(data)


async def test_a_deletion_that_cannot_be_audited_stops_the_cleanup_before_it(tmp_path):
    folder = tmp_path / "ckpt"
    checkpoints(folder, [100, 200, 300, 400, 500])
    ctx = context(tmp_path, folder, keep=2)
    # Room for the attempt, the first deletion's confirmed and ok records: the second deletion's is refused.
    ctx = replace(ctx, runner=ActionRunner(FillingAuditLog(str(tmp_path / "audit.log"), room=3)))
    plan = await plan_action("checkpoint_cleanup", Target(TARGET_CHECKPOINT_DIR, "local", path=str(folder)), ctx)
    report = await run_plan(plan, ctx)
    assert not report.ok
    # The plan deletes the newest of the doomed first: step_300 went, step_200 and step_100 were not tried.
    assert sorted(os.listdir(folder)) == ["step_%d.pt" % s for s in (100, 200, 400, 500)]
    assert report.lines[0].startswith("deleted 1 of 3") and "STOPPED, 2 not attempted" in report.lines[0]
    assert report.lines[1] == "deleted %s" % (folder / "step_300.pt")
    assert [line for line in report.lines if line.startswith("not attempted")] == [
        "not attempted %s" % (folder / "step_200.pt"),
        "not attempted %s" % (folder / "step_100.pt"),
    ]
    assert "stopped:" in report.lines[-1] and "No space left" in report.lines[-1]
    records = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert [(r["action"], r["outcome"]) for r in records] == [
        ("checkpoint_cleanup", "attempt"),
        ("checkpoint.delete", "confirmed"),
        ("checkpoint.delete", "ok"),
    ]


async def test_hostile_and_undecodable_names_are_shown_one_line_and_audited_escaped(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    now = time.time()
    # One series whose names carry an OSC 52 escape and a byte that is not UTF-8; a name with a
    # newline belongs to no series (kept, and listed as kept).
    prefix = b"\x1b]52;c;cm0gLXJm\x07-\xff-"
    names = [b"step_1\n.pt"] + [prefix + b"step_%d.pt" % n for n in (2, 3, 4, 5)]
    for position, raw in enumerate(names):
        path = os.path.join(os.fsencode(str(folder)), raw)
        torch.save({"step": position + 1}, os.fsdecode(path))
        os.utime(path, (now - 10 * HOUR + position * HOUR,) * 2)
    ctx = context(tmp_path, folder, keep=2)
    plan = await plan_action("checkpoint_cleanup", Target(TARGET_CHECKPOINT_DIR, "local", path=str(folder)), ctx)
    assert not any(ch in line for line in plan.notes for ch in "\n\x1b\x07\udcff")
    assert any("step_1␤.pt" in line for line in plan.notes) and any("␛]52;c;" in line for line in plan.notes)
    report = await run_plan(plan, ctx)
    assert report.ok, report.lines
    assert sorted(os.listdir(os.fsencode(str(folder)))) == sorted([names[0], names[3], names[4]])
    assert not any(ch in line for line in report.lines for ch in "\n\x1b\x07\udcff")
    data = (tmp_path / "audit.log").read_bytes()
    data.decode("utf-8")  # strict
    records = [json.loads(line) for line in data.decode().splitlines()]
    deleted = [r["detail"] for r in records if r["action"] == "checkpoint.delete" and r["outcome"] == "ok"]
    assert len(deleted) == 2 and all("\\xff-step_" in detail for detail in deleted)


async def test_a_unit_that_failed_part_way_is_shown_partly_deleted_not_kept(tmp_path, monkeypatch):
    """The Checkpoints pane's report: checkpoint-N/ that lost some files before a failure is
    'partly', with how many went, not 'kept' (it is no longer whole)."""
    from opsconsole.probe import delete_units
    from tests.checkpoint_writers import set_mtime, write_hf_layout

    folder = tmp_path / "run"
    write_hf_layout(folder, steps=(100, 200), best=200)
    for path in folder.rglob("*"):
        set_mtime(path, time.time() - 10 * HOUR)
    real_unlink = delete_units.unlink_at

    def unlink_at(name, dir_fd):
        if name == "optimizer.pt":
            raise OSError(5, "Input/output error")
        real_unlink(name, dir_fd)

    monkeypatch.setattr(delete_units, "unlink_at", unlink_at)
    ctx = context(tmp_path, folder, keep=1)
    plan = await plan_action("checkpoint_cleanup", Target(TARGET_CHECKPOINT_DIR, "local", path=str(folder)), ctx)
    report = await run_plan(plan, ctx)
    assert not report.ok
    assert (
        "partly  %s: partly deleted: 2 of 5 files went, the unit is no longer whole "
        "(went: checkpoint-100/config.json, checkpoint-100/model.safetensors): "
        "checkpoint-100/optimizer.pt: Input/output error" % (folder / "checkpoint-100")
    ) in report.lines, "\n".join(report.lines)
