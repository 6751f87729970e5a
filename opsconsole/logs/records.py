"""What crosses from the log followers to the console and the diagnosis: plain frozen records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

MAX_LINE_BYTES = 64 * 1024  # longer lines are cut for display, with TRUNCATED_MARKER appended
TRUNCATED_MARKER = " [… line cut at 64 KiB]"


@dataclass(frozen=True)
class LogSource:
    """One followed file on one node, with the labels parsed from its name."""

    node: str  # node name from the config ("local" for the console's machine)
    path: str  # absolute path on that node
    host: Optional[str] = None  # from train_{hostname}_rank{rank}_{timestamp}.log, else None
    rank: Optional[int] = None
    label: str = ""  # what the console shows: "host:rank3", or the file name

    @property
    def key(self) -> str:
        """Stable id of the source across reconnects and rotations."""
        return self.node + ":" + self.path


@dataclass(frozen=True)
class LogLine:
    """One complete line (newline seen) of one source."""

    source: LogSource
    number: int  # 1-based line number within the current file (after a rotation it restarts)
    offset: int  # byte offset of the line's start in the file
    text: str  # decoded with errors="replace", no newline, cut at MAX_LINE_BYTES
    time: Optional[float] = None  # epoch seconds parsed from the line, None when it has none
    level: Optional[str] = None  # "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL" when recognised
    rank: Optional[int] = None  # from the source name, or a "[rank3]:" prefix inside the line
    truncated: bool = False  # the line was longer than MAX_LINE_BYTES
    # In the file when following began (its last page read at the start, a remote node's too): written before
    # the console started, at a time its text may not say.
    earlier: bool = False
