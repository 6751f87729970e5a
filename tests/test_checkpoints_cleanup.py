"""Executing plans on real files (root only, symlinks never followed, audit first) and the two CLI commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from opsconsole import cli
from opsconsole.actions.audit import AuditLog
from opsconsole.checkpoints.cache import ResultCache
from opsconsole.checkpoints.cleanup import execute_plan, pin_plan, plan_directory
from opsconsole.checkpoints.retention import PlanItem, RetentionPlan
from opsconsole.checkpoints.scan import scan_directory
from opsconsole.probe import delete_units
from tests.checkpoint_writers import write_seed_layout

REPO = Path(__file__).resolve().parents[1]


def listing_of(root: Path):
    return scan_directory(str(root), cache=ResultCache(), crc_cache=ResultCache())


def audit_records(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def seed(tmp_path):
    root = tmp_path / "ckpts"
    write_seed_layout(root)  # losses 0.9 0.5 0.7 0.6 0.65: best is epoch 1, latest epoch 4
    return root


def test_execute_deletes_only_the_plan_and_audits_each_before(seed, tmp_path):
    listing = listing_of(seed)
    plan = plan_directory(listing, keep=2, min_age=600, now=time.time())
    names = sorted(i.name for i in plan.to_delete)
    assert names == ["checkpoint_epoch_0.pt", "checkpoint_epoch_1.pt", "checkpoint_epoch_2.pt"]
    before = {p.name for p in seed.iterdir()}
    log = tmp_path / "audit.log"
    result = execute_plan(plan, str(seed), AuditLog(str(log)))
    assert result.ok and sorted(Path(r.path).name for r in result.deleted) == names
    assert {p.name for p in seed.iterdir()} == before - set(names)
    assert os.readlink(seed / "checkpoint_latest.pt") == "checkpoint_epoch_4.pt"
    assert (seed / "checkpoint_best.pt").exists()
    records = audit_records(log)
    for name in names:
        mine = [r for r in records if name in r["detail"]]
        assert [r["outcome"] for r in mine] == ["confirmed", "ok"]  # the confirmed record came first
        assert mine[0]["action"] == "checkpoint.delete" and mine[0]["node"] == "local"
    assert result.bytes_freed == sum(i.size_bytes for i in plan.to_delete)


def test_a_symlink_out_of_the_root_is_never_followed(tmp_path):
    outside = tmp_path / "precious"
    outside.mkdir()
    torch.save({"epoch": 0}, outside / "keep_me.pt")
    root = tmp_path / "ckpts"
    write_seed_layout(root, losses=(0.3, 0.4, 0.5))
    (root / "checkpoint_epoch_7.pt").symlink_to(outside / "keep_me.pt")
    (root / "escape").symlink_to(outside)
    plan = plan_directory(listing_of(root), keep=0, min_age=0, now=time.time())
    link_items = [i for i in plan.items if i.name == "checkpoint_epoch_7.pt"]
    assert link_items and not link_items[0].delete
    # A planned file swapped for a symlink out of the root after planning: skipped, target intact.
    victim = next(i for i in plan.to_delete)
    os.unlink(victim.path)
    os.symlink(outside / "keep_me.pt", victim.path)
    # A forged plan entry added after the plan was made: never pinned, never deleted.
    forged = PlanItem(
        str(root / "escape" / "keep_me.pt"), "keep_me.pt", 1, 0.0, True, ("forged",), members=("escape/keep_me.pt",)
    )
    forged_plan = replace(plan, items=plan.items + (forged,))
    result = execute_plan(forged_plan, str(root), AuditLog(str(tmp_path / "a.log")))
    errors = {Path(r.path).name: r.error for r in result.failed}
    assert "symlink" in errors[victim.name]
    assert "keep_me.pt" in errors and "not pinned" in errors["keep_me.pt"]
    assert (outside / "keep_me.pt").exists() and os.path.islink(victim.path)
    assert not result.ok and result.deleted  # the rest went ahead
    # Pinned like a real plan, the walk through the `escape` dir link stops at the link: kept, with why.
    repinned = pin_plan(RetentionPlan(str(root), "local", 0, 0.0, (forged,)))
    assert not repinned.to_delete and "escape is a symlink: never followed" in repinned.items[0].reason
    assert (outside / "keep_me.pt").exists()


def test_partial_failure_is_reported_per_file(seed, tmp_path):
    plan = plan_directory(listing_of(seed), keep=1, min_age=0, now=time.time())
    gone = plan.to_delete[0]
    os.unlink(gone.path)  # removed by someone else between plan and execution
    changed = plan.to_delete[1]
    with open(changed.path, "ab") as f:
        f.write(b"more")  # the run wrote to it again: not what the plan saw
    result = execute_plan(plan, str(seed), AuditLog(str(tmp_path / "a.log")))
    errors = {r.path: r.error for r in result.failed}
    assert errors == {
        gone.path: "already gone",
        changed.path: "%s changed since it was judged (size or mtime)" % changed.name,
    }
    assert len(result.deleted) == len(plan.to_delete) - 2
    assert os.path.exists(changed.path)
    assert "2 failed" in result.summary()


def test_read_only_refuses_and_an_unwritable_audit_log_deletes_nothing(seed, tmp_path):
    plan = plan_directory(listing_of(seed), keep=1, min_age=0, now=time.time())
    before = sorted(p.name for p in seed.iterdir())
    log = tmp_path / "a.log"
    result = execute_plan(plan, str(seed), AuditLog(str(log)), read_only=True)
    assert result.refused and not result.results and audit_records(log)[0]["outcome"] == "refused"
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = execute_plan(plan, str(seed), AuditLog(str(blocker / "audit.log")))  # its folder is a file
    assert not result.ok and not result.results and "audit log" in result.stopped  # stopped before the first
    assert result.remaining == tuple(item.path for item in plan.to_delete)
    assert "deleted 0 of %d" % len(plan.to_delete) in result.summary() and "STOPPED" in result.summary()
    assert sorted(p.name for p in seed.iterdir()) == before
    # A plan for another directory is refused too.
    assert execute_plan(plan, str(tmp_path), AuditLog(str(log))).refused


def test_an_hf_directory_is_removed_whole_without_following_links_inside(tmp_path):
    from tests.checkpoint_writers import write_hf_layout

    outside = tmp_path / "shared_tokenizer"
    outside.mkdir()
    (outside / "vocab.txt").write_text("a b c")
    root = tmp_path / "out"
    old, new = write_hf_layout(root, steps=(100, 200), best=200)
    (old / "tokenizer").symlink_to(outside)
    past = time.time() - 7200
    os.utime(old, (past, past))
    for p in old.iterdir():
        os.utime(p, (past, past), follow_symlinks=False)
    plan = plan_directory(listing_of(root), keep=1, min_age=600, now=time.time())
    assert [i.name for i in plan.to_delete] == ["checkpoint-100"]
    result = execute_plan(plan, str(root), lambda *record: True)
    assert result.ok and not old.exists() and new.exists()
    assert (outside / "vocab.txt").read_text() == "a b c"


# --- the CLI ------------------------------------------------------------------------------------


def run_cli(*argv, tmp_path, stdin=None):
    """Run the real command in a subprocess (no terminal): (exit code, stdout, stderr)."""
    env = dict(os.environ, OPSCONSOLE_CONFIG=str(tmp_path / "config.toml"), PYTHONPATH=str(REPO))
    (tmp_path / "config.toml").write_text('[actions]\naudit_log = "%s"\n' % (tmp_path / "audit.log"))
    proc = subprocess.run(
        [sys.executable, "-m", "opsconsole"] + list(argv),
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL if stdin is None else stdin,
        timeout=60,
    )
    return proc.returncode, proc.stdout, proc.stderr


def test_a_directory_one_level_above_its_runs_points_to_them(seed, tmp_path, capsys):
    # `opsconsole checkpoints runs/` where runs/ holds the run directories: not "no checkpoints" alone.
    runs = seed.parent
    (runs / "notes").mkdir()
    (runs / "notes" / "readme.txt").write_text("not a checkpoint")
    assert cli.main(["checkpoints", str(runs)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("no checkpoints in %s\n" % runs)
    assert "checkpoints one level down, in ckpts/: list one with opsconsole checkpoints %s\n" % seed in out
    assert cli.main(["checkpoints", str(seed)]) == 0
    assert "one level down" not in capsys.readouterr().out  # a listing with checkpoints: no hint


def test_checkpoints_json_shape(seed, tmp_path, capsys):
    assert cli.main(["checkpoints", str(seed), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dir"] == str(seed)
    keys = {
        "path",
        "format",
        "size_bytes",
        "mtime",
        "epoch",
        "step",
        "loss",
        "best",
        "latest",
        "current_tag",  # the tag DeepSpeed's `latest` or Megatron's tracker names (latest too)
        "integrity",
        "problem",
        "layout",
        "unit",
        "series",
        "managed",
        "unmanaged",
        "protections",
        "unreadable",
        "members",
    }  # issue 13: units
    assert all(set(c) == keys for c in doc["checkpoints"])
    by_name = {Path(c["path"]).name: c for c in doc["checkpoints"]}
    assert by_name["checkpoint_epoch_4.pt"]["latest"] and by_name["checkpoint_best.pt"]["best"]
    assert by_name["checkpoint_epoch_2.pt"]["loss"] == 0.7 and by_name["checkpoint_epoch_2.pt"]["integrity"] == "ok"
    assert cli.main(["checkpoints", str(seed)]) == 0
    table = capsys.readouterr().out
    assert "checkpoint_epoch_4.pt" in table and "latest" in table
    assert "5 checkpoints managed" in table and "1 not managed" in table  # the epochs; the best copy apart
    assert (doc["managed"]["count"], doc["not_managed"]["count"]) == (5, 1)
    import struct
    import zipfile

    damaged = seed / "checkpoint_epoch_3.pt"
    with zipfile.ZipFile(damaged) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/data/0"))
    raw = bytearray(damaged.read_bytes())
    raw[info.header_offset + 30 + len(info.filename) + struct.unpack_from("<H", raw, info.header_offset + 28)[0]] ^= (
        0xFF
    )
    damaged.write_bytes(bytes(raw))
    assert cli.main(["checkpoints", str(seed), "--verify", "--json"]) == 0
    verified = {Path(c["path"]).name: c for c in json.loads(capsys.readouterr().out)["checkpoints"]}
    bad = verified.pop("checkpoint_epoch_3.pt")
    assert bad["integrity"] == "corrupt" and "CRC mismatch" in bad["problem"]
    assert {c["integrity"] for c in verified.values()} == {"ok"}


def test_cli_exit_codes(seed, tmp_path, monkeypatch, capsys):
    before = sorted(p.name for p in seed.iterdir())
    # A real process with no terminal and no --yes: refused, nothing deleted.
    code, out, err = run_cli("cleanup", str(seed), "--keep", "2", tmp_path=tmp_path)
    assert (
        code == 2 and "without --yes" in err and "plan: delete 3 of 5 checkpoints managed (1 not managed, kept)" in out
    )
    assert sorted(p.name for p in seed.iterdir()) == before
    monkeypatch.setenv("OPSCONSOLE_CONFIG", str(tmp_path / "config.toml"))

    def main(*argv):
        code = cli.main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    code, out, err = main("cleanup", str(seed), "--keep", "2", "--dry-run")
    assert code == 0 and "DELETE" in out and "plan: delete 3 of 5 checkpoints managed (1 not managed, kept)" in out
    for bad in (["--keep", "-1"], ["--keep", "x"], ["--keep", "2", "--min-age", "soon"], []):
        assert main("cleanup", str(seed), *bad)[0] == 2, bad
    code, _, err = main("cleanup", str(tmp_path / "nope"), "--keep", "1")
    assert code == 2 and "no such directory" in err
    assert main("checkpoints", str(tmp_path / "nope"))[0] == 2
    code, out, err = main("--read-only", "cleanup", str(seed), "--keep", "2", "--yes")
    assert code == 2 and "read-only" in err
    assert sorted(p.name for p in seed.iterdir()) == before
    code, out, err = main("cleanup", str(seed), "--keep", "2", "--yes", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert sorted(Path(r["path"]).name for r in doc["result"]["results"] if r["deleted"]) == [
        "checkpoint_epoch_0.pt",
        "checkpoint_epoch_1.pt",
        "checkpoint_epoch_2.pt",
    ]
    assert [i["action"] for i in doc["plan"]["plan"]].count("delete") == 3
    assert any(r["outcome"] == "confirmed" for r in audit_records(tmp_path / "audit.log"))


def test_cli_exit_1_when_a_deletion_fails(seed, tmp_path, monkeypatch, capsys):
    (tmp_path / "config.toml").write_text('[actions]\naudit_log = "%s"\n' % (tmp_path / "audit.log"))
    monkeypatch.setenv("OPSCONSOLE_CONFIG", str(tmp_path / "config.toml"))
    real_unlink = delete_units.unlink_at

    def unlink_at(name, dir_fd):
        if name == "checkpoint_epoch_0.pt":
            raise PermissionError(13, "Permission denied")  # as on a read-only mount (root ignores modes)
        real_unlink(name, dir_fd)

    monkeypatch.setattr(delete_units, "unlink_at", unlink_at)
    assert cli.main(["cleanup", str(seed), "--keep", "3", "--yes"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "Permission denied" in out and "deleted 1 of 2" in out
    assert (seed / "checkpoint_epoch_0.pt").exists() and not (seed / "checkpoint_epoch_1.pt").exists()
    outcomes = [r["outcome"] for r in audit_records(tmp_path / "audit.log") if "epoch_0" in r["detail"]]
    assert outcomes == ["confirmed", "failed"]


@pytest.mark.parametrize("answer, deleted", [(b"n\n", False), (b"y\n", False), (b"ckpts\n", True)])
def test_on_a_terminal_cleanup_asks_first(seed, tmp_path, answer, deleted):
    """Two to delete: the directory's name must be typed; `y` alone deletes nothing."""
    import pty
    import select

    (tmp_path / "config.toml").write_text('[actions]\naudit_log = "%s"\n' % (tmp_path / "audit.log"))
    env = dict(os.environ, OPSCONSOLE_CONFIG=str(tmp_path / "config.toml"), PYTHONPATH=str(REPO))
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "opsconsole", "cleanup", str(seed), "--keep", "3"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    seen = b""
    try:
        while b"to confirm: " not in seen:
            ready, _, _ = select.select([master], [], [], 30)
            assert ready, seen
            seen += os.read(master, 4096)
        os.write(master, answer)
        while True:
            ready, _, _ = select.select([master], [], [], 30)
            try:
                chunk = os.read(master, 4096) if ready else b""
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(30) == 0
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"delete 2 checkpoints" in seen
    assert (seed / "checkpoint_epoch_0.pt").exists() is not deleted
    assert (b"cancelled: nothing deleted" in seen) is not deleted


def test_keep_and_min_age_default_to_the_configured_directory(seed, tmp_path, monkeypatch, capsys):
    config = tmp_path / "configured.toml"
    config.write_text('[[checkpoints]]\npath = "%s"\nkeep = 4\nmin_age = 0\n' % seed)
    monkeypatch.setenv("OPSCONSOLE_CONFIG", str(config))
    assert cli.main(["cleanup", str(seed), "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert (plan["keep"], plan["min_age_s"]) == (4, 0.0)
    assert [Path(i["path"]).name for i in plan["plan"] if i["action"] == "delete"] == ["checkpoint_epoch_0.pt"]
    assert cli.main(["cleanup", str(tmp_path), "--dry-run"]) == 2  # not configured: --keep is required
    assert "--keep N is required" in capsys.readouterr().err
