"""Headless commands as a user runs them, on hostile names and log lines: nothing reaches the terminal raw.

Each reported defect is a case here: OSC 52 (clipboard write), window-title and clear-screen sequences
in `diagnose` excerpts; escape sequences and newlines in file names in the `checkpoints` and `cleanup`
tables (a newline forged a row); a non-UTF-8 file name aborting `cleanup` halfway; `cleanup` refused
in read-only mode without an audit record.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsconsole.commands.check import results_table
from opsconsole.health.result import HealthResult

ROOT = Path(__file__).resolve().parent.parent

OSC52 = b"\x1b]52;c;cm0gLXJmIH4=\x07"  # "rm -rf ~" into the clipboard
TITLE = b"\x1b]0;pwned\x07"
CLEAR = b"\x1b[2J\x1b[H"
C1_CSI = "\x9b2J".encode()  # the one-byte CSI, UTF-8 encoded
RLO = "\u202e".encode()  # right-to-left override: reorders what is shown


def run(*args: str, tmp_path: Path, input_bytes: bytes = b"", config: str = "") -> subprocess.CompletedProcess:
    """`opsconsole ARGS` in a real process with a UTF-8 locale (strict stdout), its own state dir and config."""
    (tmp_path / "config.toml").write_text(config)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "OPSCONSOLE_CONFIG": str(tmp_path / "config.toml"),
    }
    argv = [os.fsencode(sys.executable), b"-m", b"opsconsole"] + [os.fsencode(a) for a in args]
    return subprocess.run(argv, cwd=ROOT, input=input_bytes, capture_output=True, timeout=120, env=env)


def assert_no_controls(data: bytes, allowed: bytes = b"\n") -> None:
    """No C0 but `allowed`, no DEL, no C1, no bidi override, and valid UTF-8."""
    text = data.decode("utf-8")  # strict
    bad = [
        ch
        for ch in text
        if (ord(ch) < 0x20 and ch.encode() not in allowed)
        or 0x7F <= ord(ch) < 0xA0
        or ch in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
    ]
    assert not bad, bad


def audit_records(tmp_path: Path) -> list:
    path = tmp_path / "state" / "opsconsole" / "audit.log"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


# --- diagnose ---------------------------------------------------------------------------------


def test_diagnose_excerpts_show_escape_sequences_as_visible_text(tmp_path):
    log = tmp_path / "train_rank0.log"
    log.write_bytes(
        b"step 1 ok\n" + TITLE + CLEAR + b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        b"2.00 GiB " + OSC52 + b" " + C1_CSI + b" " + RLO + b"\n"
    )
    done = run("diagnose", str(log), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_no_controls(done.stdout)
    text = done.stdout.decode()
    assert "Root cause: CUDA out of memory" in text
    assert "line 2: ␛]0;pwned␇␛[2J␛[Htorch.OutOfMemoryError" in text and "␛]52;c;cm0gLXJmIH4=␇" in text
    done = run("diagnose", "--json", str(log), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_no_controls(done.stdout)
    (finding,) = json.loads(done.stdout)["findings"]
    assert OSC52.decode() in finding["excerpt"] and "\x9b2J" in finding["excerpt"]  # JSON keeps the text exactly


def test_diagnose_a_non_utf8_file_name_and_escapes_in_names(tmp_path):
    folder = os.fsencode(str(tmp_path))
    odd = os.path.join(folder, b"rank-\xff-" + TITLE + b"\n.log")
    with open(odd, "wb") as f:
        f.write(b"RuntimeError: CUDA error: an illegal memory access was encountered\n")
    done = run("diagnose", os.fsdecode(odd), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_no_controls(done.stdout)
    assert done.stdout.decode().startswith("== %s/rank-\ufffd-␛]0;pwned␇␤.log (1 line)" % tmp_path)
    done = run("diagnose", "--json", os.fsdecode(odd), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_no_controls(done.stdout)
    # A text holding an undecodable byte is written escaped whole (sanitize.escaped): one line, lossless.
    assert json.loads(done.stdout)["file"] == "%s/rank-\\xff-\\x1b]0;pwned\\x07\\n.log" % tmp_path
    missing = os.path.join(folder, b"gone-\x1b[2J-\xff.log")
    done = run("diagnose", os.fsdecode(missing), tmp_path=tmp_path)
    assert done.returncode == 2 and done.stderr.count(b"\n") == 1
    assert_no_controls(done.stderr)


# --- checkpoints and cleanup --------------------------------------------------------------------

HOSTILE_NAMES = [
    b"ckpt-1\n.pt",
    b"ckpt-2" + OSC52 + b".pt",
    b"ckpt-3-\xff.pt",
    b"ckpt-4" + TITLE + CLEAR + b".pt",
    b"ckpt-5.pt",
    b"ckpt-6.pt",
]


@pytest.fixture
def hostile_dir(tmp_path):
    """Torch checkpoints whose names hold a newline, OSC 52, a non-UTF-8 byte, title and clear sequences."""
    torch = pytest.importorskip("torch")
    root = tmp_path / "ckpts"
    root.mkdir()
    now = time.time()
    for position, raw in enumerate(HOSTILE_NAMES):
        path = os.path.join(os.fsencode(str(root)), raw)
        torch.save({"epoch": position}, os.fsdecode(path))
        os.utime(path, (now - 10000 + position * 60,) * 2)
    # A torch zip with a member whose name holds escapes and a newline, its data damaged: a CRC check
    # names that member in the checkpoint's problem.
    import zipfile

    damaged = os.fsdecode(os.path.join(os.fsencode(str(root)), b"ckpt-0.pt"))
    torch.save({"epoch": -1}, damaged)
    payload = b"PAYLOAD-" * 16
    with zipfile.ZipFile(damaged, "a", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("ckpt-0/evil" + TITLE.decode() + "\nrow", payload)
    data = Path(damaged).read_bytes()
    at = data.rindex(payload)
    Path(damaged).write_bytes(data[:at] + b"X" + data[at + 1 :])
    os.utime(damaged, (now - 20000,) * 2)
    return root


# One numbered series (a cleanup deletes only series members) whose shared prefix holds OSC 52, a
# non-UTF-8 byte and title/clear sequences; the series is `<prefix>step_N.pt`.
SERIES_PREFIX = b"ckpt" + OSC52 + b"-\xff" + TITLE + CLEAR + b"-"
SERIES_NAMES = [SERIES_PREFIX + b"step_%d.pt" % n for n in range(1, 7)]


@pytest.fixture
def hostile_series(tmp_path):
    """Six members of one series with hostile names, oldest first, and a lone file with a newline (not managed)."""
    torch = pytest.importorskip("torch")
    root = tmp_path / "series"
    root.mkdir()
    now = time.time()
    for position, raw in enumerate(SERIES_NAMES + [b"final\nmodel.pt"]):
        path = os.path.join(os.fsencode(str(root)), raw)
        torch.save({"epoch": position}, os.fsdecode(path))
        os.utime(path, (now - 10000 + position * 60,) * 2)
    return root


def test_checkpoints_table_has_one_row_per_checkpoint_and_no_escapes(hostile_dir, tmp_path):
    done = run("checkpoints", "--verify", str(hostile_dir), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_no_controls(done.stdout)
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1 + len(HOSTILE_NAMES) + 1 + 1  # header, one row each (and the zip), totals
    names = [line.split()[0] for line in lines[1:-1]]
    assert "ckpt-1␤.pt" in names and "ckpt-3-\ufffd.pt" in names
    assert any(n.startswith("ckpt-2␛]52;c;") for n in names) and any(
        n.startswith("ckpt-4␛]0;pwned␇␛[2J") for n in names
    )
    assert "CRC mismatch in ckpt-0/evil␛]0;pwned␇␤row" in done.stdout.decode()  # a zip member's name
    done = run("checkpoints", "--json", str(hostile_dir), tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_no_controls(done.stdout)
    names = {Path(entry["path"]).name for entry in json.loads(done.stdout)["checkpoints"]}
    assert "ckpt-3-\\xff.pt" in names and "ckpt-1\n.pt" in names  # undecodable: escaped; valid text: exact


def test_cleanup_of_a_non_utf8_name_runs_to_the_end_and_audits_every_deletion(hostile_series, tmp_path):
    done = run("cleanup", str(hostile_series), "--keep", "2", "--min-age", "0", "--yes", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_no_controls(done.stdout)
    out = done.stdout.decode()
    rows = [line for line in out.splitlines() if line.startswith(("keep", "DELETE"))]
    assert len(rows) == len(SERIES_NAMES) + 1  # the table: one row per checkpoint, none forged by the newline
    assert "deleted 4 of 4" in out
    left = sorted(os.listdir(os.fsencode(str(hostile_series))))
    assert left == sorted([b"final\nmodel.pt"] + SERIES_NAMES[-2:])  # the newest two, and what is not managed
    records = audit_records(tmp_path)
    deletes = [r for r in records if r["action"] == "checkpoint.delete"]
    assert [r["outcome"] for r in deletes] == ["confirmed", "ok"] * 4
    assert all("\\xff" in r["detail"] and "\x1b" not in r["detail"] for r in deletes)
    assert_no_controls((tmp_path / "state" / "opsconsole" / "audit.log").read_bytes())


def test_cleanup_json_with_a_non_utf8_name(hostile_dir, tmp_path):
    done = run("cleanup", str(hostile_dir), "--keep", "2", "--min-age", "0", "--dry-run", "--json", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert_no_controls(done.stdout)
    names = {Path(item["path"]).name for item in json.loads(done.stdout)["plan"]["plan"]}
    assert "ckpt-3-\\xff.pt" in names


@pytest.mark.parametrize("how", ["flag", "config"])
def test_cleanup_refused_read_only_is_audited_and_says_one_line(hostile_series, tmp_path, how):
    before = sorted(os.listdir(os.fsencode(str(hostile_series))))
    args = ("--read-only",) if how == "flag" else ()
    config = "[console]\nread_only = true\n" if how == "config" else ""
    done = run(
        *args,
        "cleanup",
        str(hostile_series),
        "--keep",
        "1",
        "--min-age",
        "0",
        "--yes",
        tmp_path=tmp_path,
        config=config,
    )
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == ["opsconsole: read-only config: cleanup refused (nothing deleted)"]
    assert sorted(os.listdir(os.fsencode(str(hostile_series)))) == before
    (record,) = audit_records(tmp_path)
    assert (record["action"], record["outcome"]) == ("checkpoint_cleanup", "refused")
    assert str(hostile_series) in record["detail"] and "read-only" in record["detail"]


def test_cleanup_without_yes_off_a_terminal_is_refused_and_audited(hostile_series, tmp_path):
    done = run("cleanup", str(hostile_series), "--keep", "1", "--min-age", "0", tmp_path=tmp_path)
    assert done.returncode == 2 and b"without --yes" in done.stderr
    (record,) = audit_records(tmp_path)
    assert record["outcome"] == "refused" and "no --yes" in record["detail"]


def test_a_refusal_that_cannot_be_audited_says_so(hostile_series, tmp_path):
    done = run(
        "--read-only",
        "cleanup",
        str(hostile_series),
        "--keep",
        "1",
        "--min-age",
        "0",
        "--yes",
        tmp_path=tmp_path,
        config='[actions]\naudit_log = "/dev/full"\n',
    )
    assert done.returncode == 2 and done.stderr.count(b"\n") == 1
    assert b"cleanup refused" in done.stderr and b"not recorded" in done.stderr and b"No space" in done.stderr


# --- check ------------------------------------------------------------------------------------


def test_check_table_prints_messages_as_one_visible_line():
    hostile = HealthResult(
        "gpu_xid",
        "node\x1b]0;t\x07",
        "fail",
        "Xid 79 \x1b]52;c;eA==\x07\nFAIL forged row",
        gpu=0,
        remedy="reset \x9b2J",
    )
    text = results_table([hostile], show_all=True)
    assert_no_controls(text.encode())
    lines = text.splitlines()
    assert len(lines) == 3  # the result, its remedy, the summary: the newline forged nothing
    assert "Xid 79 ␛]52;c;eA==␇␤FAIL forged row" in lines[0] and lines[1].endswith("reset \ufffd2J")
