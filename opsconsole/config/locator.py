"""Which line of a TOML text a key path was written on: tomllib keeps no positions."""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

from opsconsole.config.errors import KeyPath
from opsconsole.config.toml import tomllib


class KeyLines:
    """Map key paths like ("nodes", 2, "port") to the line they were written on.

    tomllib keeps no positions, so this scans the (already valid) TOML text:
    table headers, arrays of tables (the Nth [[nodes]] is nodes[N-1]), key = value
    lines, dotted keys, inline tables and array elements. A surprise in the text
    stops the scan; what was found so far is kept and lookups fall back to the
    nearest enclosing table, then line 1.
    """

    def __init__(self, text: str) -> None:
        self.lines: Dict[KeyPath, int] = {}
        self._text = text
        self._pos = 0
        self._line = 1
        self._array_counts: Dict[KeyPath, int] = {}
        try:
            self._scan_document()
        except (ScanStop, RecursionError):  # deep nesting: lines found so far are kept
            pass

    def line_of(self, path: KeyPath) -> int:
        """Return the line of `path`, else of its nearest enclosing table, else 1."""
        for end in range(len(path), 0, -1):
            line = self.lines.get(tuple(path[:end]))
            if line is not None:
                return line
        return 1

    # scanning helpers

    def _peek(self, count: int = 1) -> str:
        return self._text[self._pos : self._pos + count]

    def _advance_to(self, end: int) -> None:
        if end <= self._pos:
            raise ScanStop()
        self._line += self._text.count("\n", self._pos, end)
        self._pos = end

    def _skip(self, newlines: bool) -> None:
        text, pos = self._text, self._pos
        while pos < len(text):
            ch = text[pos]
            if ch in " \t":
                pos += 1
            elif newlines and ch in "\r\n":
                pos += 1
            elif newlines and ch == "#":
                end = text.find("\n", pos)
                pos = len(text) if end < 0 else end
            else:
                break
        if pos > self._pos:
            self._advance_to(pos)

    def _expect(self, token: str) -> None:
        if not self._text.startswith(token, self._pos):
            raise ScanStop()
        self._advance_to(self._pos + len(token))

    def _record(self, path: KeyPath, line: int) -> None:
        for end in range(1, len(path) + 1):
            self.lines.setdefault(tuple(path[:end]), line)

    # grammar

    def _scan_document(self) -> None:
        table: KeyPath = ()
        while True:
            self._skip(newlines=True)
            if self._pos >= len(self._text):
                return
            line = self._line
            if self._peek(2) == "[[":
                self._advance_to(self._pos + 2)
                table = self._array_header(line)
                self._skip(newlines=False)
                self._expect("]]")
            elif self._peek() == "[":
                self._advance_to(self._pos + 1)
                table = self._resolve(self._key())
                self._record(table, line)
                self._skip(newlines=False)
                self._expect("]")
            else:
                self._key_value(table)

    def _array_header(self, line: int) -> KeyPath:
        parts = self._key()
        whole = self._resolve(parts[:-1]) + (parts[-1],)
        index = self._array_counts.get(whole, 0)
        self._array_counts[whole] = index + 1
        path = whole + (index,)
        self._record(path, line)
        return path

    def _resolve(self, parts: Tuple[str, ...]) -> KeyPath:
        # [nodes.sub] after [[nodes]] means the latest nodes entry.
        path: KeyPath = ()
        for part in parts:
            path = path + (part,)
            count = self._array_counts.get(path)
            if count:
                path = path + (count - 1,)
        return path

    def _key_value(self, table: KeyPath) -> None:
        line = self._line
        path = table + self._key()
        self._record(path, line)
        self._skip(newlines=False)
        self._expect("=")
        self._skip(newlines=False)
        self._value(path)

    def _key(self) -> Tuple[str, ...]:
        parts: List[str] = []
        while True:
            self._skip(newlines=False)
            ch = self._peek()
            if ch in ('"', "'"):
                start = self._pos
                self._string_end()
                raw = self._text[start : self._pos]
                parts.append(tomllib.loads(f"k = {raw}")["k"])
            else:
                match = re.compile(r"[A-Za-z0-9_-]+").match(self._text, self._pos)
                if not match:
                    raise ScanStop()
                parts.append(match.group(0))
                self._advance_to(match.end())
            self._skip(newlines=False)
            if self._peek() != ".":
                return tuple(parts)
            self._advance_to(self._pos + 1)

    def _value(self, path: KeyPath) -> None:
        ch = self._peek()
        if ch in ('"', "'"):
            self._string_end()
        elif ch == "[":
            self._array(path)
        elif ch == "{":
            self._inline_table(path)
        else:
            match = re.compile(r"[^,\]}\r\n#]+").match(self._text, self._pos)
            if not match:
                raise ScanStop()
            self._advance_to(match.end())

    def _string_end(self) -> None:
        text, pos = self._text, self._pos
        for quote in ('"""', "'''"):
            if text.startswith(quote, pos):
                end = pos + 3
                while True:
                    if quote == '"""' and text.startswith("\\", end):
                        end += 2
                        continue
                    if text.startswith(quote, end):
                        break
                    if end >= len(text):
                        raise ScanStop()
                    end += 1
                end += 3
                for _ in range(2):  # up to two quotes may end the content: """a"""""
                    if text.startswith(quote[0], end):
                        end += 1
                self._advance_to(end)
                return
        quote = text[pos]
        end = pos + 1
        while end < len(text) and text[end] != quote:
            end += 2 if quote == '"' and text[end] == "\\" else 1
        if end >= len(text):
            raise ScanStop()
        self._advance_to(end + 1)

    def _array(self, path: KeyPath) -> None:
        self._advance_to(self._pos + 1)
        index = 0
        while True:
            self._skip(newlines=True)
            if self._peek() == "]":
                self._advance_to(self._pos + 1)
                return
            self._record(path + (index,), self._line)
            self._value(path + (index,))
            index += 1
            self._skip(newlines=True)
            if self._peek() == ",":
                self._advance_to(self._pos + 1)

    def _inline_table(self, path: KeyPath) -> None:
        self._advance_to(self._pos + 1)
        while True:
            self._skip(newlines=True)
            if self._peek() == "}":
                self._advance_to(self._pos + 1)
                return
            self._key_value(path)
            self._skip(newlines=True)
            if self._peek() == ",":
                self._advance_to(self._pos + 1)


class ScanStop(Exception):
    """The locator met text it does not follow; it keeps what it found."""
