"""ConfigError and the words of its messages: one line naming file, line and key, values shown as TOML spells them."""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Iterable, Optional, Tuple, Union

KeyPath = Tuple[Union[str, int], ...]  # ("nodes", 2, "port") is nodes[2].port


class ConfigError(Exception):
    """A config problem, already formatted as one line: `file:line: key: message`."""

    def __init__(
        self,
        message: str,
        *,
        file: Optional[str] = None,
        line: Optional[int] = None,
        key: Optional[str] = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.key = key
        head = []
        if file is not None:
            head.append(file if line is None else f"{file}:{line}")
        if key:
            head.append(key)
        super().__init__(one_line(": ".join(head + [message])))


def suggest(word: str, choices: Iterable[Any]) -> str:
    """Return '; did you mean "x"?' for a close match, else the list of valid choices."""
    options = [str(c) for c in choices]
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {quote(close[0])}?"
    if options and len(options) <= 12:
        return "; expected one of: " + ", ".join(options)
    return ""


def format_path(path: KeyPath) -> str:
    """Format ("nodes", 2, "port") as nodes[2].port."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if re.fullmatch(r"[A-Za-z0-9_-]+", part) else quote(part)
            out += ("." if out else "") + text
    return out


def show(value: Any) -> str:
    """Describe a TOML value briefly, on one line, as TOML would spell it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return quote(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # 22.0 stays 22.0, so "expected an integer" makes sense
    if isinstance(value, int):
        digits = str(abs(value)) if value.bit_length() < 14000 else None  # str() of 4300+ digits raises
        if digits is not None and len(digits) <= 30:
            return repr(value)
        return "a%s integer of %s digits" % (
            " negative" if value < 0 else "n",
            len(digits) if digits else "thousands of",
        )
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (list, tuple)):
        return "an empty array" if not value else "an array"
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return type(value).__name__


def quote(text: str) -> str:
    """Double-quote text with backslash escapes, so that it stays on one line."""
    return '"' + escape(text, '"\\') + '"'


def escape(text: str, also: str = "") -> str:
    out = []
    for ch in text:
        if ch in also:
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def one_line(text: str) -> str:
    # Every message is one line, whatever a file name or value holds.
    return escape(text)
