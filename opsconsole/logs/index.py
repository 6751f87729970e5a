"""Huge log files: the last page read backwards from the end, and a sparse line-offset index.

The index keeps the offset of every `every`-th line start only (a 1 GB file of 10 M lines costs
10,000 integers), built by a background thread; a line's number is then one bisect plus a count
of newlines inside one stretch of `every` lines.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from typing import Callable, List, Optional, Tuple

from opsconsole.probe.filetail import read_lines_before

INDEX_EVERY = 1024  # lines between two kept offsets
INDEX_BLOCK = 4 << 20


def read_last_lines(path: str, count: int, reads: Optional[List[int]] = None) -> List[Tuple[int, bytes, bool]]:
    """The last `count` complete lines of a file, read backwards from its end: [(offset, raw, cut)]."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_lines_before(fd, os.fstat(fd).st_size, count, reads=reads)
    finally:
        os.close(fd)


def nth_newline(block: bytes, start: int, n: int, line_bytes: int = 100) -> int:
    """Index of the n-th newline (n >= 1) at or after `start`, or -1 when the block has fewer.

    Guesses where it is from the usual line length, counts the newlines up to the guess in one C
    call, then steps over the few it guessed wrong by; one Python step per line only for lines
    far from the usual length.
    """
    guess = min(len(block), start + n * line_bytes)
    have = block.count(b"\n", start, guess)  # newlines in [start, guess)
    if have < n:
        position = guess - 1
        while have < n:
            position = block.find(b"\n", position + 1)
            if position < 0:
                return -1
            have += 1
        return position
    position = guess
    while have >= n:  # the last newline before `position` is the have-th one
        position = block.rfind(b"\n", start, position)
        have -= 1
    return position


class LineIndex:
    """Sparse offsets of a file's line starts, for line numbers and scroll-back."""

    def __init__(self, path: str, every: int = INDEX_EVERY) -> None:
        self.path = path
        self.every = every
        self.marks: List[int] = [0]  # marks[k] = offset where line k*every+1 starts
        self.indexed_to = 0  # bytes scanned so far
        self._lines_seen = 0  # newlines in the scanned bytes
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.bytes_read = 0
        self.average_line_bytes = 100  # line length seen so far: where nth_newline guesses first

    def cancel(self) -> None:
        self._cancel.set()

    def start_background(self, on_done: Optional[Callable[[], None]] = None) -> None:
        """Index the file up to its present size in a thread; `on_done` is called from there."""

        def work() -> None:
            self.extend()
            if on_done is not None and not self._cancel.is_set():
                on_done()

        self._thread = threading.Thread(target=work, name="log-index", daemon=True)
        self._thread.start()

    def wait(self, timeout: Optional[float] = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def extend(self, upto: Optional[int] = None) -> None:
        """Scan from where the index stops to `upto` (default: the file's size now)."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            end = os.fstat(fd).st_size if upto is None else upto
            position = self.indexed_to
            seen = self._lines_seen
            marks: List[int] = []
            while position < end and not self._cancel.is_set():
                block = os.pread(fd, min(INDEX_BLOCK, end - position), position)
                if not block:
                    break
                self.bytes_read += len(block)
                # Only the newline that ends each `every`-th line is looked for (C calls, not a Python
                # step per line: this thread shares the GIL with the follower and the console).
                cursor = 0
                while True:
                    wanted = self.every - seen % self.every
                    found = nth_newline(block, cursor, wanted, self.average_line_bytes)
                    if found < 0:
                        seen += block.count(b"\n", cursor)
                        break
                    seen += wanted
                    marks.append(position + found + 1)
                    cursor = found + 1
                position += len(block)
                if seen:
                    self.average_line_bytes = max(1, position // seen)
            with self._lock:
                self.marks.extend(marks)
                self.indexed_to, self._lines_seen = position, seen
        finally:
            os.close(fd)

    @property
    def complete(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def number_at(self, offset: int) -> int:
        """1-based number of the line that starts at `offset`; 0 while the index has not got there."""
        with self._lock:
            if offset > self.indexed_to:
                return 0
            k = bisect_right(self.marks, offset) - 1
            mark = self.marks[k]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            between = os.pread(fd, offset - mark, mark) if offset > mark else b""
        finally:
            os.close(fd)
        return k * self.every + between.count(b"\n") + 1

    def offset_of(self, number: int) -> Optional[int]:
        """Offset where line `number` (1-based) starts, None beyond what is indexed."""
        with self._lock:
            k = (number - 1) // self.every
            if number < 1 or k >= len(self.marks):
                return None
            mark = self.marks[k]
        skip = (number - 1) - k * self.every
        fd = os.open(self.path, os.O_RDONLY)
        try:
            position = mark
            while skip > 0:
                block = os.pread(fd, 1 << 20, position)
                if not block:
                    return None
                found = -1
                while skip > 0:
                    found = block.find(b"\n", found + 1)
                    if found < 0:
                        break
                    skip -= 1
                if skip > 0:
                    position += len(block)
                else:
                    position += found + 1
            return position
        finally:
            os.close(fd)

    def lines_before(self, before: int, count: int) -> List[Tuple[int, int, bytes, bool]]:
        """Up to `count` lines before offset `before` (< 0: the end): [(offset, number, raw, cut)]."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if before < 0:
                before = os.fstat(fd).st_size
            found = read_lines_before(fd, before, count)
        finally:
            os.close(fd)
        first = self.number_at(found[0][0]) if found else 0
        return [(offset, first + i if first else 0, raw, cut) for i, (offset, raw, cut) in enumerate(found)]
