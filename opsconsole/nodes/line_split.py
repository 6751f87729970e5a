"""Cutting a node's output into lines without ever holding a line longer than a cap."""

from __future__ import annotations

from typing import Callable, List

# A real 8-GPU node with 2,000 GPU processes sends keyframe lines of about 1.5 MB (a process with
# its 512-character command line is under 700 bytes); 4 MiB leaves room and bounds the memory and
# the parsing (tens of ms) one line can cost the console.
MAX_LINE_CHARS = 4 * 1024 * 1024


class LineSplitter:
    """Feeds text in, hands each complete line (newline kept) to `on_line`.

    A line longer than `limit` characters is dropped as it arrives (what came of it so far is let
    go, the rest is skipped up to its newline) and reported to `on_too_long` with its length, so
    memory stays bounded whatever a node sends. Pieces are joined once per line, not per chunk.
    """

    def __init__(
        self, on_line: Callable[[str], None], on_too_long: Callable[[int], None], limit: int = MAX_LINE_CHARS
    ) -> None:
        self._on_line = on_line
        self._on_too_long = on_too_long
        self.limit = limit
        self._parts: List[str] = []
        self._size = 0
        self._dropped = -1  # characters skipped of the line being dropped; -1 while not dropping

    def feed(self, data: str) -> None:
        end = data.find("\n")
        if end == len(data) - 1 and not self._parts and self._dropped < 0 and end < self.limit:
            self._on_line(data)  # the usual case: one packet, one whole line
            return
        start = 0
        while end >= 0:
            self._line_ends(data[start : end + 1])
            start = end + 1
            end = data.find("\n", start)
        if start < len(data):
            self._keep(data[start:])

    def _line_ends(self, piece: str) -> None:
        if self._dropped >= 0:
            length, self._dropped = self._dropped + len(piece), -1
            self._on_too_long(length)
            return
        size = self._size + len(piece)
        parts, self._parts, self._size = self._parts, [], 0
        if size > self.limit:
            self._on_too_long(size)
        else:
            self._on_line("".join(parts) + piece if parts else piece)

    def _keep(self, rest: str) -> None:
        if self._dropped >= 0:
            self._dropped += len(rest)
            return
        self._size += len(rest)
        if self._size > self.limit:  # let go of it now: the rest of this line is skipped as it comes
            self._dropped, self._parts, self._size = self._size, [], 0
        else:
            self._parts.append(rest)

    def flush(self) -> None:
        """Hand over what is left without a newline (the stream ended)."""
        if self._dropped >= 0:
            length, self._dropped = self._dropped, -1
            self._on_too_long(length)
        elif self._parts:
            parts, self._parts, self._size = self._parts, [], 0
            self._on_line("".join(parts))


__all__ = ["MAX_LINE_CHARS", "LineSplitter"]
