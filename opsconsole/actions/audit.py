"""The audit log: one JSON line per attempted action (confirmed, cancelled, refused, failed).

Lines are appended with O_APPEND in a single write each, so two consoles on the same
login node (or an NFS home, line by line) do not interleave parts of lines, and each is
fsynced before the call returns: an action runs only after its record is on disk. Writing
never raises: a failure comes back as a message the console shows, and the caller does not act.

Content never makes a write fail: records are written by sanitize.printable_json, so a file name
with undecodable bytes is written escaped (`ckpt-\\xff.pt`), control characters are JSON escapes
(an ESC never reaches a terminal that `cat`s the log), and each record stays one line.

Every record has one shape: time, user, host, action, node, detail, outcome, target, command
(argv) and id; the action runner's "attempt" record precedes the command and its result record
("ok" or "failed", with exit status and output tails in "result") shares the id. Records written
before this shape (no target, command, id) still read: the Audit pane shows what they have.
"""

from __future__ import annotations

import datetime
import errno
import getpass
import json
import os
import socket
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

from opsconsole.audit_outcomes import (  # noqa: F401 (the writer's vocabulary, imported from here too)
    OUTCOME_ATTEMPT,
    OUTCOME_CANCELLED,
    OUTCOME_CONFIRMED,
    OUTCOME_FAILED,
    OUTCOME_OK,
    OUTCOME_REFUSED,
    Outcome,
)
from opsconsole.config import ActionsConfig
from opsconsole.sanitize import printable_json

READ_TAIL_BYTES = 512 * 1024  # the Audit pane reads at most this much of the file's end


def default_audit_path() -> str:
    """`$XDG_STATE_HOME/opsconsole/audit.log`, `~/.local/state/opsconsole/audit.log` without it."""
    state_home = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state_home, "opsconsole", "audit.log")


def audit_path(actions: ActionsConfig) -> str:
    """The audit log file of this config: actions.audit_log (with ~ expanded), else the default."""
    if actions.audit_log:
        return os.path.expanduser(actions.audit_log)
    return default_audit_path()


def current_user() -> str:
    """The login name, or the uid when the system has no name for it (containers)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


class AuditLog:
    """Appends audit records to `path` (its folder is made, 0700, when missing)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.user = current_user()
        self.host = socket.gethostname()  # the login node the console runs on

    def record_line(
        self,
        action: str,
        node: str,
        detail: str,
        outcome: Outcome,
        *,
        target: str = "",
        command: Sequence[str] = (),
        entry_id: str = "",
        result: Optional[Dict[str, Any]] = None,
        when: Optional[float] = None,
    ) -> str:
        """The JSON line (newline included) of one record; any text is safe in it (see the module docstring).

        One shape for every record: time, user, host, action, node, detail, outcome, target, command
        (argv) and id (a new one unless given: the runner links an attempt and its result by it), plus
        result when a command ran.
        """
        stamp = datetime.datetime.fromtimestamp(
            when if when is not None else datetime.datetime.now().timestamp(), datetime.timezone.utc
        )
        record: Dict[str, Any] = {
            "time": stamp.isoformat(timespec="milliseconds"),
            "user": self.user,
            "host": self.host,
            "action": action,
            "node": node,
            "detail": detail,
            "outcome": outcome,
            "target": target,
            "command": [str(word) for word in command],
            "id": entry_id or new_entry_id(),
        }
        if result is not None:
            record["result"] = result
        return printable_json(record) + "\n"

    def write(self, action: str, node: str, detail: str, outcome: Outcome, **fields: Any) -> Optional[str]:
        """Append one record (see record_line), on disk before it returns; None when written, else why not."""
        try:
            data = self.record_line(action, node, detail, outcome, **fields).encode("utf-8")
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:  # never expected: still a value
            return "audit record for %s not written: %s" % (action, exc)
        return self._append(data)

    def _append(self, data: bytes) -> Optional[str]:
        try:
            folder = os.path.dirname(self.path)
            if folder and not os.path.exists(folder):  # a file there: let open() say "Not a directory"
                os.makedirs(folder, mode=0o700, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                written = os.write(fd, data)
                # On disk before the action runs: a crash or power cut right after keeps the record.
                try:
                    os.fsync(fd)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:  # EINVAL: a pipe or special file, nothing to sync
                        raise
            finally:
                os.close(fd)
        except OSError as exc:
            return "audit log %s not written: %s" % (self.path, exc.strerror or exc)
        if written != len(data):
            return "audit log %s: short write (%d of %d bytes)" % (self.path, written, len(data))
        return None


def new_entry_id() -> str:
    """A short random id linking an attempt record with its result record."""
    return uuid.uuid4().hex[:12]


def read_recent_records(path: str, limit: int = 500) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """The last `limit` records of the log, newest first, and a problem line (None when fine).

    Reads only the file's last READ_TAIL_BYTES. A line that is not a JSON object (a hand
    edit, a torn write on a full disk) becomes a record with outcome "unreadable", so it
    shows instead of hiding the rest. A missing file is no records and no problem.
    """
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            start = max(0, size - READ_TAIL_BYTES)
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return [], None
    except OSError as exc:
        return [], "audit log %s not readable: %s" % (path, exc.strerror or exc)
    lines = data.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first line was cut by the seek
    records: List[Dict[str, Any]] = []
    for raw in reversed(lines):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            record = None
        if not isinstance(record, dict):
            record = {"outcome": "unreadable", "detail": raw.decode("utf-8", "replace")[:300]}
        records.append(record)
        if len(records) >= limit:
            break
    return records, None


__all__ = [
    "AuditLog",
    "OUTCOME_ATTEMPT",
    "OUTCOME_CANCELLED",
    "OUTCOME_CONFIRMED",
    "OUTCOME_FAILED",
    "OUTCOME_OK",
    "OUTCOME_REFUSED",
    "audit_path",
    "default_audit_path",
    "new_entry_id",
    "read_recent_records",
]
