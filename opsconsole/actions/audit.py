"""The audit log: one JSON line per attempted action (confirmed, cancelled, refused, failed).

Lines are appended with O_APPEND in a single write each, so two consoles on the same
login node (or an NFS home, line by line) do not interleave parts of lines. Writing
never raises: a failure comes back as a message the console shows.
"""

from __future__ import annotations

import datetime
import getpass
import json
import os
import socket
from typing import Optional

from opsconsole.config import ActionsConfig

OUTCOME_CONFIRMED = "confirmed"
OUTCOME_CANCELLED = "cancelled"
OUTCOME_REFUSED = "refused"
OUTCOME_FAILED = "failed"  # confirmed, but carrying it out did not work


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

    def record_line(self, action: str, node: str, detail: str, outcome: str, when: Optional[float] = None) -> str:
        """The JSON line (newline included) for one record."""
        stamp = datetime.datetime.fromtimestamp(
            when if when is not None else datetime.datetime.now().timestamp(), datetime.timezone.utc
        )
        record = {
            "time": stamp.isoformat(timespec="milliseconds"),
            "user": self.user,
            "host": self.host,
            "action": action,
            "node": node,
            "detail": detail,
            "outcome": outcome,
        }
        return json.dumps(record, ensure_ascii=False, sort_keys=False) + "\n"

    def write(self, action: str, node: str, detail: str, outcome: str) -> Optional[str]:
        """Append one record; None when written, else why not (a line the UI can show)."""
        data = self.record_line(action, node, detail, outcome).encode("utf-8")
        try:
            folder = os.path.dirname(self.path)
            if folder and not os.path.exists(folder):  # a file there: let open() say "Not a directory"
                os.makedirs(folder, mode=0o700, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                written = os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            return "audit log %s not written: %s" % (self.path, exc.strerror or exc)
        if written != len(data):
            return "audit log %s: short write (%d of %d bytes)" % (self.path, written, len(data))
        return None


__all__ = [
    "AuditLog",
    "OUTCOME_CANCELLED",
    "OUTCOME_CONFIRMED",
    "OUTCOME_FAILED",
    "OUTCOME_REFUSED",
    "audit_path",
    "default_audit_path",
]
