"""py-spy's `dump --json` output read as input from a node: bounded, type-checked, sanitized.

py-spy prints a list of threads, each with `frames` innermost first; a frame has `name`,
`filename`, `short_filename` and `line`. What comes back from a node can be anything: text cut
short, nesting deep enough to overflow the parser, wrong types, terminal escapes in a function
name. Whatever arrives, the result is a tuple of ThreadStack (possibly empty) and at most one
problem line; nothing raises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from opsconsole.sanitize import printable_line

MAX_DUMP_CHARS = 4 * 1024 * 1024  # more than the node helper forwards (2 MiB of py-spy's output)
MAX_THREADS = 256
MAX_FRAMES = 512  # per thread; deeper stacks keep their innermost frames
MAX_NAME_CHARS = 200
MAX_FILE_CHARS = 400
MAX_LINE = 10**8


@dataclass(frozen=True)
class Frame:
    """One frame of a stack: function, file (py-spy's full path) and line (0 for a native frame)."""

    function: str
    file: str
    line: int

    def to_json(self) -> dict:
        return {"function": self.function, "file": self.file, "line": self.line}


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a process: py-spy's name for it, its OS thread id, frames innermost first."""

    name: str
    os_thread_id: Optional[int]
    frames: Tuple[Frame, ...]
    active: bool = False
    frames_cut: int = 0  # frames left out past MAX_FRAMES


def _text(value: Any, limit: int) -> Optional[str]:
    if not isinstance(value, str):
        return None
    return printable_line(value[:limit])


def _int(value: Any, low: int, high: int) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return None
    return value


def _frame(raw: Any) -> Optional[Frame]:
    if not isinstance(raw, dict):
        return None
    function = _text(raw.get("name"), MAX_NAME_CHARS)
    file = _text(raw.get("filename"), MAX_FILE_CHARS) or _text(raw.get("short_filename"), MAX_FILE_CHARS)
    line = _int(raw.get("line"), 0, MAX_LINE)
    if function is None and file is None:
        return None
    return Frame(function or "?", file or "?", line if line is not None else 0)


def _thread(raw: Any) -> Tuple[Optional[ThreadStack], int]:
    """A thread and the number of frames that were not frames (skipped)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("frames"), list):
        return None, 0
    frames: List[Frame] = []
    skipped = 0
    for item in raw["frames"][:MAX_FRAMES]:
        frame = _frame(item)
        if frame is None:
            skipped += 1
        else:
            frames.append(frame)
    name = _text(raw.get("thread_name"), MAX_NAME_CHARS) or ""
    os_thread_id = _int(raw.get("os_thread_id"), 0, 2**63)
    stack = ThreadStack(
        name,
        os_thread_id,
        tuple(frames),
        active=raw.get("active") is True,
        frames_cut=max(0, len(raw["frames"]) - MAX_FRAMES),
    )
    return stack, skipped


def parse_dump(text: Any) -> Tuple[Tuple[ThreadStack, ...], Optional[str]]:
    """The threads of one py-spy JSON dump, and a problem line (None when it read cleanly)."""
    if not isinstance(text, str):
        return (), "py-spy output is not text"
    if len(text) > MAX_DUMP_CHARS:
        return (), "py-spy output over %d characters: not read" % MAX_DUMP_CHARS
    if not text.strip():
        return (), "py-spy printed nothing"
    try:
        raw = json.loads(text)
    except RecursionError:
        return (), "py-spy output nested too deep: not read"
    except ValueError as exc:
        return (), printable_line("py-spy output is not JSON: %s" % str(exc)[:200])
    if not isinstance(raw, list):
        return (), "py-spy output is not a list of threads"
    threads: List[ThreadStack] = []
    skipped = 0
    for item in raw[:MAX_THREADS]:
        thread, bad_frames = _thread(item)
        skipped += bad_frames
        if thread is None:
            skipped += 1
        else:
            threads.append(thread)
    problems = []
    if len(raw) > MAX_THREADS:
        problems.append("%d threads past the first %d left out" % (len(raw) - MAX_THREADS, MAX_THREADS))
    if skipped:
        problems.append("%d malformed thread(s) or frame(s) skipped" % skipped)
    if not threads and not problems:
        problems.append("py-spy found no Python thread")
    return tuple(threads), "; ".join(problems) or None


def main_thread(threads: Tuple[ThreadStack, ...], pid: int) -> Optional[ThreadStack]:
    """The thread that runs the training loop: the one whose OS id is the PID, else MainThread, else the first."""
    for thread in threads:
        if thread.os_thread_id == pid:
            return thread
    for thread in threads:
        if thread.name == "MainThread":
            return thread
    return threads[0] if threads else None
