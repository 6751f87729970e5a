"""The audit record of a unit that failed part way: every entry that went, up to 64 KiB as written.

A real HF checkpoint-N/ holding many files whose names are control characters (each one six bytes in
the record's JSON, \\u0001) and one file made immutable (chattr +i), which stops its deletion part way
after the others went: the record names what went within AUDIT_WENT_BYTES of the line it is written
to (before, 64 Ki characters of raw names: six times that as written, most of the 512 KiB the Audit
pane reads), and its count agrees with `cleanup --json`'s partly_deleted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from opsconsole import cli
from opsconsole.actions.audit import read_recent_records
from opsconsole.checkpoints.cleanup import AUDIT_WENT_BYTES, SHOWN_MEMBERS
from tests.checkpoint_writers import set_mtime, write_hf_layout

NAMES = 400
ODD_NAME = "\x01" * 200 + "%04d"  # 204 characters, 1,204 bytes in the record's JSON


def immutable(path: Path) -> bool:
    if os.geteuid() != 0 or not shutil.which("chattr"):
        return False
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("chattr"), reason="needs root and chattr for +i")
def test_the_audit_record_of_a_partly_deleted_unit_is_bounded_as_written(tmp_path, monkeypatch, capsys):
    root = tmp_path / "run"
    write_hf_layout(root, steps=(100, 200, 300), best=300)
    unit = root / "checkpoint-100"
    for number in range(NAMES):
        (unit / (ODD_NAME % number)).write_bytes(b"x")
    stuck = unit / "zz_stuck.bin"  # sorted last: every other file of the unit goes first
    stuck.write_bytes(b"x")
    for path in root.rglob("*"):
        set_mtime(path, path.stat().st_mtime - 7200)
    if not immutable(stuck):
        pytest.skip("this file system does not take chattr +i")
    log = tmp_path / "audit.log"
    (tmp_path / "config.toml").write_text('[actions]\naudit_log = "%s"\n' % log)
    monkeypatch.setenv("OPSCONSOLE_CONFIG", str(tmp_path / "config.toml"))
    try:
        assert cli.main(["cleanup", str(root), "--keep", "1", "--min-age", "0", "--yes", "--json"]) == 1
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], check=True)
    results = json.loads(capsys.readouterr().out)["result"]["results"]
    (failed,) = [r for r in results if not r["deleted"]]
    partly = failed["partly_deleted"]
    assert failed["path"] == str(unit) and "zz_stuck.bin: Operation not permitted" in failed["error"]
    assert partly["entries_went"] == partly["files_went"] > NAMES and len(partly["went"]) == SHOWN_MEMBERS

    (line,) = [line for line in log.read_text().splitlines() if '"failed"' in line]
    record = json.loads(line)
    said = re.search(
        r"; every entry that went \((\d+)\): (.*) and (\d+) more \(over \d+ bytes of names\)$", record["detail"]
    )
    assert said, record["detail"][-300:]
    count, names, more = int(said.group(1)), said.group(2).split(", "), int(said.group(3))
    assert count == partly["entries_went"] and len(names) + more == count  # as --json counts them
    assert names[: len(partly["went"])] == partly["went"]
    # The names as written in the record's line fit the bound (before: 383 KiB of them).
    written = json.dumps(", ".join(names), ensure_ascii=False).encode("utf-8")
    assert len(written) - 2 <= AUDIT_WENT_BYTES
    assert len(line.encode("utf-8")) < AUDIT_WENT_BYTES + 16 * 1024
    # The Audit pane's reader takes it whole.
    records, problem = read_recent_records(str(log))
    assert problem is None and any(r.get("outcome") == "failed" and r["detail"] == record["detail"] for r in records)
