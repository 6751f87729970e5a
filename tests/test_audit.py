"""The audit log: JSON lines appended with O_APPEND, its default path, and failures as messages."""

from __future__ import annotations

import json
import os
import stat

from opsconsole.actions.audit import AuditLog, audit_path, default_audit_path
from opsconsole.config import ActionsConfig

FIELDS = ["time", "user", "host", "action", "node", "detail", "outcome", "target", "command", "id"]


def read_records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f.read().splitlines()]


def test_records_are_json_lines_with_every_field(tmp_path):
    path = tmp_path / "state" / "opsconsole" / "audit.log"
    log = AuditLog(str(path))
    assert log.write("trust_hostkey", "gpu-a01", "[127.0.0.1]:2222 ssh-ed25519 SHA256:x", "confirmed") is None
    assert log.write("trust_hostkey", "gpu-a02", 'quote " and newline\n inside', "cancelled") is None
    records = read_records(path)
    assert [list(r) for r in records] == [FIELDS, FIELDS]
    assert [(r["node"], r["outcome"]) for r in records] == [("gpu-a01", "confirmed"), ("gpu-a02", "cancelled")]
    assert records[1]["detail"] == 'quote " and newline\n inside'  # one line per record, escaped
    assert records[0]["host"] == os.uname().nodename
    assert records[0]["user"] and records[0]["time"].endswith("+00:00")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700


def test_appends_to_what_is_there_and_two_writers_keep_whole_lines(tmp_path):
    path = tmp_path / "audit.log"
    path.write_text('{"old": "record"}\n')
    first, second = AuditLog(str(path)), AuditLog(str(path))
    for i in range(50):
        (first if i % 2 else second).write("kill", "n%d" % i, "x" * 300, "refused")
    records = read_records(path)
    assert records[0] == {"old": "record"}
    assert [r["node"] for r in records[1:]] == ["n%d" % i for i in range(50)]


def test_a_write_failure_is_a_message_not_an_exception(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    log = AuditLog(str(blocker / "audit.log"))
    problem = log.write("trust_hostkey", "n1", "d", "confirmed")
    assert problem is not None
    assert str(blocker / "audit.log") in problem and "Not a directory" in problem
    assert blocker.read_text() == ""


def test_default_path_follows_xdg_state_home_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_audit_path() == str(tmp_path / "xdg" / "opsconsole" / "audit.log")
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_audit_path() == str(tmp_path / "home" / ".local" / "state" / "opsconsole" / "audit.log")
    assert audit_path(ActionsConfig()) == default_audit_path()
    assert audit_path(ActionsConfig(audit_log="~/audit.jsonl")) == str(tmp_path / "home" / "audit.jsonl")


def test_hostile_content_is_written_escaped_one_line_each(tmp_path):
    """Undecodable names, terminal escapes, C1 and line separators: written, never raised, never raw."""
    path = tmp_path / "audit.log"
    log = AuditLog(str(path))
    name = os.fsdecode(b"/ckpts/ckpt-\xff.pt")  # what os.listdir gives for a non-UTF-8 name
    assert log.write("checkpoint.delete", "gpu\x1b]0;pwned\x07", "delete %s" % name, "confirmed") is None
    assert (
        log.write(
            "checkpoint.cleanup", "n1", "osc52 \x1b]52;c;cm0gLXJm\x07 csi \x9b2J rlo \u202e sep \u2028 nl\n", "refused"
        )
        is None
    )
    assert (
        log.write(
            "checkpoint_cleanup",
            "n1",
            "about to run",
            "attempt",
            target=name,
            command=["opsconsole", "cleanup", name],
            entry_id="abc",
            result={"stdout": "deleted %s\n" % name, "odd": object()},
        )
        is None
    )
    data = path.read_bytes()
    data.decode("utf-8")  # strict: the log is valid UTF-8
    assert data.count(b"\n") == 3 and not any(b < 0x20 and b != 0x0A for b in data)
    assert b"\xc2\x9b" not in data and "\u202e".encode() not in data and "\u2028".encode() not in data
    first, second, third = read_records(path)
    assert first["detail"] == "delete /ckpts/ckpt-\\xff.pt"  # the byte, as sanitize.escaped writes it
    assert first["node"] == "gpu\x1b]0;pwned\x07"  # valid text round-trips exactly (JSON-escaped on disk)
    assert second["detail"].startswith("osc52 \x1b]52;c;") and "\u2028" in second["detail"]
    assert third["target"] == "/ckpts/ckpt-\\xff.pt" and third["command"][-1] == "/ckpts/ckpt-\\xff.pt"
    # A text holding an undecodable byte is escaped whole (its newline too): still one line.
    assert third["result"]["stdout"] == "deleted /ckpts/ckpt-\\xff.pt\\n" and isinstance(third["result"]["odd"], str)


def test_a_full_disk_is_a_message_not_an_exception():
    log = AuditLog("/dev/full")  # every write fails with ENOSPC
    problem = log.write("checkpoint.delete", "n1", os.fsdecode(b"ckpt-\xff.pt"), "confirmed")
    assert problem is not None and "/dev/full" in problem and "No space" in problem
    assert log.write("kill", "n1", "d", "attempt", command=["kill", "1"], entry_id="x") is not None
