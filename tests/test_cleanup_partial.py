"""A directory unit that fails part way says what went; a sticky directory's refusal is known before.

Deleting checkpoint-N/ could fail after some of its files went for reasons the pre-checks did not
catch (an immutable file, a sticky directory, EIO): the result said `members_deleted: []` and only
the error, so the user and the audit log believed nothing went while the unit was broken.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from opsconsole import cli
from opsconsole.checkpoints.scan import _trailing_number, scan_directory
from opsconsole.probe import delete_units
from tests.checkpoint_writers import set_mtime, write_hf_layout

NOBODY = 65534
HF_FILES = ("config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json")


def aged(root: Path) -> None:
    """Every mtime two hours older, their order kept (as written): the trainer_state.json written last
    is the highest checkpoint-N's, as in one run (set all to one time in walk order, and another
    checkpoint-N looks written last: latest too, as another run's newest save)."""
    for path in root.rglob("*"):
        set_mtime(path, path.stat().st_mtime - 7200)


def audit_records(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_directory_unit_that_fails_part_way_reports_the_files_that_went(tmp_path, monkeypatch, capsys):
    root = tmp_path / "run"
    write_hf_layout(root, steps=(100, 200, 300), best=300)
    aged(root)
    (tmp_path / "config.toml").write_text('[actions]\naudit_log = "%s"\n' % (tmp_path / "audit.log"))
    monkeypatch.setenv("OPSCONSOLE_CONFIG", str(tmp_path / "config.toml"))
    real_unlink = delete_units.unlink_at
    failed_once = []

    def unlink_at(name, dir_fd):
        if name == "optimizer.pt" and not failed_once:  # an EIO after two files of the first unit went
            failed_once.append(name)
            raise OSError(5, "Input/output error")
        real_unlink(name, dir_fd)

    monkeypatch.setattr(delete_units, "unlink_at", unlink_at)
    assert cli.main(["cleanup", str(root), "--keep", "1", "--yes"]) == 1
    out = capsys.readouterr().out
    broken = root / "checkpoint-200"
    assert sorted(p.name for p in broken.iterdir()) == ["optimizer.pt", "scheduler.pt", "trainer_state.json"]
    assert not (root / "checkpoint-100").exists() and (root / "checkpoint-300").is_dir()
    line = next(line for line in out.splitlines() if line.startswith("FAILED"))
    assert line == (
        "FAILED %s: partly deleted: 2 of 5 files went, the unit is no longer whole "
        "(went: checkpoint-200/config.json, checkpoint-200/model.safetensors): "
        "checkpoint-200/optimizer.pt: Input/output error" % broken
    ), out
    (record,) = [r for r in audit_records(tmp_path / "audit.log") if r["outcome"] == "failed"]
    assert "partly deleted: 2 of 5 files went" in record["detail"] and "checkpoint-200/config.json" in record["detail"]


def test_the_json_result_counts_and_names_what_went(tmp_path, monkeypatch, capsys):
    root = tmp_path / "run"
    write_hf_layout(root, steps=(100, 200), best=200)
    (root / "checkpoint-100" / "global_step100").mkdir()
    (root / "checkpoint-100" / "global_step100" / "shard_0.pt").write_bytes(b"s")
    aged(root)
    (tmp_path / "config.toml").write_text('[actions]\naudit_log = "%s"\n' % (tmp_path / "audit.log"))
    monkeypatch.setenv("OPSCONSOLE_CONFIG", str(tmp_path / "config.toml"))
    real_unlink = delete_units.unlink_at

    def unlink_at(name, dir_fd):
        if name == "optimizer.pt":
            raise PermissionError(1, "Operation not permitted")  # as for a file made immutable (chattr +i)
        real_unlink(name, dir_fd)

    monkeypatch.setattr(delete_units, "unlink_at", unlink_at)
    assert cli.main(["cleanup", str(root), "--keep", "1", "--yes", "--json"]) == 1
    (result,) = json.loads(capsys.readouterr().out)["result"]["results"]
    assert result["partly_deleted"] == {
        "files_went": 3,
        "files": 6,
        "entries_went": 4,
        "went": [
            "checkpoint-100/config.json",
            "checkpoint-100/global_step100/shard_0.pt",
            "checkpoint-100/global_step100/",
            "checkpoint-100/model.safetensors",
        ],
        "more": 0,
    }
    assert result["error"] == "checkpoint-100/optimizer.pt: Operation not permitted"
    assert not result["deleted"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the files to two users")
def test_a_sticky_directory_of_another_user_keeps_the_unit_whole(tmp_path):
    """checkpoint-7/ of mode 1777 owned by root, holding a file of nobody's and one of root's: as
    nobody, faccessat says the directory may be written, and the unlink of root's file fails
    (EPERM) after nobody's went. Checked first now: nothing goes."""
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv to run the helper as nobody")
    folder = Path(tempfile.mkdtemp(prefix="opsconsole-sticky-"))
    try:
        os.chmod(folder, 0o755)
        root = folder / "run"
        unit = root / "checkpoint-7"
        unit.mkdir(parents=True)
        (unit / "config.json").write_text("{}")
        (unit / "model.safetensors").write_bytes(b"w" * 10)
        os.chown(root, NOBODY, NOBODY)
        os.chown(unit / "config.json", NOBODY, NOBODY)  # nobody's own: it could go
        os.chmod(unit, 0o1777)  # root's, sticky: root's model.safetensors cannot go as nobody
        helper = subprocess.Popen(
            ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups"]
            + [sys.executable, "-I", "-u", "-c", inspect.getsource(delete_units)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=str(folder),
        )

        def ask(request):
            helper.stdin.write((json.dumps(request) + "\n").encode())
            helper.stdin.flush()
            return json.loads(helper.stdout.readline())

        try:
            pinned = ask({"op": "pin", "root": str(root), "units": [["checkpoint-7"]]})
            units = [{"members": ["checkpoint-7"], "tree": pinned["units"][0]["tree"]}]
            assert ask({"op": "open", "root": str(root), "root_id": pinned["root_id"], "units": units})["ok"]
            why = ask({"op": "check", "unit": 0})["why"]
            assert why == (
                "checkpoint-7/model.safetensors: Permission denied (in a sticky directory, and neither it nor "
                "the directory is this user's): nothing of the unit deleted"
            )
            assert ask({"op": "delete", "unit": 0}) == {"unit": 0, "went": [], "why": why}
        finally:
            helper.stdin.close()
            helper.wait(30)
        assert sorted(p.name for p in unit.iterdir()) == ["config.json", "model.safetensors"]
    finally:
        shutil.rmtree(folder)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the files to two users")
def test_a_sticky_directory_whose_files_are_this_users_is_no_refusal(tmp_path):
    """Only the case the kernel refuses is refused: nobody's own files in root's sticky directory go."""
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv to run the helper as nobody")
    folder = Path(tempfile.mkdtemp(prefix="opsconsole-sticky-"))
    try:
        os.chmod(folder, 0o1777)  # as /tmp: root's, sticky, holding nobody's run
        root = folder / "run"
        (root / "checkpoint-7").mkdir(parents=True)
        (root / "checkpoint-7" / "config.json").write_text("{}")
        for path in (root, root / "checkpoint-7", root / "checkpoint-7" / "config.json"):
            os.chown(path, NOBODY, NOBODY)
        code = (
            "import sys; sys.path.insert(0, %r); from opsconsole.probe import delete_units as d; "
            "p = d.pin_units(%r, [['checkpoint-7']]); "
            "r = d.PinnedRoot(%r, p['root_id'], [{'members': ['checkpoint-7'], 'tree': p['units'][0]['tree']}]); "
            "print(r.delete(0))" % (str(Path(delete_units.__file__).parents[2]), str(root), str(root))
        )
        done = subprocess.run(
            [
                "setpriv",
                "--reuid=%d" % NOBODY,
                "--regid=%d" % NOBODY,
                "--clear-groups",
                sys.executable,
                "-I",
                "-c",
                code,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.stdout.strip() == "(['checkpoint-7'], None)", done.stderr
        assert list(root.iterdir()) == []
    finally:
        shutil.rmtree(folder)


def test_a_checkpoint_number_past_18_digits_is_the_latest(tmp_path):
    """HF's get_last_checkpoint takes the highest number: checkpoint-<19 digits> is newer than checkpoint-9."""
    assert _trailing_number("checkpoint-" + "1" * 19) == int("1" * 19)
    assert _trailing_number("checkpoint-" + "9" * 255) == int("9" * 255)
    assert _trailing_number("checkpoint-" + "9" * 256) == -1
    assert _trailing_number("checkpoint") == -1
    big = 10**25
    write_hf_layout(tmp_path, steps=(9, big), best=9)
    aged(tmp_path)
    from opsconsole.checkpoints.cache import ResultCache

    listing = scan_directory(str(tmp_path), cache=ResultCache(), crc_cache=ResultCache())
    latest = [e.name for e in listing.entries if e.latest]
    assert latest == ["checkpoint-%d" % big], [(e.name, e.latest) for e in listing.entries]
