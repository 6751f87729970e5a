"""What torchelastic (torchrun) says about a failed child: its failure table and its error file.

When a child fails, the launcher raises ChildFailedError and prints a table:

    Root Cause (first observed failure):
    [0]:
      time      : 2026-12-03_10:10:09
      host      : gpu07
      rank      : 1 (local_rank: 1)
      exitcode  : -9 (pid: 4242)
      error_file: <N/A>
      traceback : Signal 9 (SIGKILL) received by PID 4242

"Failures:" lists the other failed children the same way (or <NO_OTHER_FAILURES>). `FailureTable`
reads it line by line (the diagnosis feeds it each line of each source) so the findings on those
lines get the failing rank, and the run's verdict the first observed failure. A child started
with @record (or TORCHELASTIC_ERROR_FILE set) writes its exception as JSON:
{"message": {"message": "...", "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "..."}}};
`read_error_file` gives its traceback's lines.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable, List, Optional

from opsconsole.diagnosis.timestamps import line_time

ROOT_CAUSE_HEADER = "Root Cause (first observed failure):"
OTHER_FAILURES_HEADER = "Failures:"
MAX_ERROR_FILE_BYTES = 4 * 1024 * 1024

_ENTRY = re.compile(r"^\s*\[(\d{1,7})\]:\s*$")
_FIELD = re.compile(r"^\s+(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_RANK = re.compile(r"(-?\d{1,7})(?: \(local_rank: (\d{1,7})\))?")
_EXITCODE = re.compile(r"(-?\d{1,7})(?: \(pid: (\d{1,10})\))?")
_SIGNAL = re.compile(r"Signal (\d{1,3}) \((SIG\w+)\) received by PID")


@dataclass
class LauncherFailure:
    """One failed child as the launcher's table lists it."""

    rank: Optional[int] = None
    local_rank: Optional[int] = None
    exitcode: Optional[int] = None
    pid: Optional[int] = None
    signal: Optional[str] = None  # "SIGKILL" when the table says "Signal 9 (SIGKILL) received by PID"
    host: Optional[str] = None
    time: Optional[float] = None
    error_file: Optional[str] = None  # None for <N/A>
    first: bool = False  # listed under "Root Cause (first observed failure)"

    @property
    def killed(self) -> bool:
        """Killed by SIGKILL (exit code -9): what the OOM killer does, among others."""
        return self.signal == "SIGKILL" or self.exitcode == -9


class FailureTable:
    """Streaming reader of one source's failure tables; `current` is the entry being read."""

    def __init__(self) -> None:
        self.failures: List[LauncherFailure] = []
        self.current: Optional[LauncherFailure] = None
        self._section: Optional[bool] = None  # None outside a table; else whether it is the root cause section

    @property
    def reading(self) -> bool:
        """Whether a table is being read (its lines go to feed)."""
        return self._section is not None

    def feed(self, text: str) -> bool:
        """Read one line; True while the line belongs to a table (its findings are the entry's)."""
        stripped = text.strip()
        if self._section is None:
            if stripped == ROOT_CAUSE_HEADER or stripped == OTHER_FAILURES_HEADER:
                self._section = stripped == ROOT_CAUSE_HEADER
                self.current = None
                return True
            return False
        if stripped.startswith("=" * 8):  # the table's end
            self._section = None
            self.current = None
            return False
        if stripped.startswith("-" * 8):
            self._section = False
            self.current = None
            return True
        if stripped == ROOT_CAUSE_HEADER or stripped == OTHER_FAILURES_HEADER:
            self._section = stripped == ROOT_CAUSE_HEADER
            self.current = None
            return True
        entry = _ENTRY.match(text)
        if entry:
            self.current = LauncherFailure(first=self._section)
            self.failures.append(self.current)
            return True
        field = _FIELD.match(text)
        if field and self.current is not None:
            _set_field(self.current, field.group(1), field.group(2).strip())
        return True


def _set_field(failure: LauncherFailure, name: str, value: str) -> None:
    if name == "rank":
        match = _RANK.match(value)
        if match:
            failure.rank = int(match.group(1))
            failure.local_rank = int(match.group(2)) if match.group(2) else None
    elif name == "exitcode":
        match = _EXITCODE.match(value)
        if match:
            failure.exitcode = int(match.group(1))
            failure.pid = int(match.group(2)) if match.group(2) else None
    elif name == "traceback":
        signal = _SIGNAL.search(value)
        if signal:
            failure.signal = signal.group(2)
    elif name == "error_file":
        failure.error_file = None if value in ("", "<N/A>") else value
    elif name == "host":
        failure.host = value or None
    elif name == "time":
        failure.time = line_time(value)[0]


def parse_failure_table(lines: Iterable[str]) -> List[LauncherFailure]:
    """Every failed child the launcher's tables in `lines` list, the first observed failure marked."""
    table = FailureTable()
    for line in lines:
        table.feed(line)
    return table.failures


@dataclass(frozen=True)
class ErrorFile:
    """A child's exception as torchelastic's error file records it."""

    message: str
    traceback: str  # the Python traceback text, "" when the file has none
    timestamp: Optional[float] = None


def parse_error_file(data: bytes) -> Optional[ErrorFile]:
    """The error file's contents, or None when the bytes are not torchelastic's error-file JSON."""
    try:
        document = json.loads(data.decode("utf-8", errors="replace"))
    except ValueError:
        return None
    if not isinstance(document, dict) or "message" not in document:
        return None
    message = document["message"]
    if isinstance(message, str):
        return ErrorFile(message=message, traceback="")
    if not isinstance(message, dict):
        return None
    extra = message.get("extraInfo")
    extra = extra if isinstance(extra, dict) else {}
    callstack = extra.get("py_callstack")
    stamp = extra.get("timestamp")
    try:
        timestamp = float(stamp) if stamp is not None else None
    except (TypeError, ValueError):
        timestamp = None
    text = message.get("message")
    return ErrorFile(
        message=text if isinstance(text, str) else "",
        traceback=callstack if isinstance(callstack, str) else "",
        timestamp=timestamp,
    )


def read_error_file(path: str) -> Optional[ErrorFile]:
    """parse_error_file of the file at `path` (its first MAX_ERROR_FILE_BYTES); OSError when unreadable."""
    with open(path, "rb") as handle:
        return parse_error_file(handle.read(MAX_ERROR_FILE_BYTES))


def error_file_lines(error: ErrorFile) -> List[str]:
    """The lines the diagnosis reads from an error file: its traceback, else its message."""
    text = error.traceback or error.message
    return text.splitlines()
