"""The one sanitiser for text that came from outside (nodes, files, logs, configs, recordings).

Control characters reach a terminal as they are when printed: ESC starts an escape sequence (a
colour, a cursor move, a screen clear, a window title, OSC 52 writing the clipboard), the others
shift or blank cells, and a newline in a file name forges a table row. Every text from outside goes
through here before the console draws it or a headless command prints it:

- printable(text): each control character becomes one visible character (the control picture, ESC
  as ␛, for C0 and DEL; U+FFFD for C1, lone surrogates from undecodable file names, and the bidi
  overrides that reorder what is shown). One character for one keeps lengths, so a Rich Text's spans
  stay where they were. Newline and tab are kept: they are the layout of multi-line text.
- printable_line(text): the same, and newline, carriage return and tab made visible too, for a
  name or a table cell that must stay one line.
- escaped(text): a lossless one-line form for logs that must be read back (the audit log):
  control characters and undecodable bytes as backslash escapes, always encodable as UTF-8. An
  undecodable byte is \\xff and a character above U+007F is \\u0085, so the two never collide.
- printable_json(value): JSON text that is safe to print and always encodes as UTF-8: a string
  holding undecodable bytes is written escaped(), C1 controls, DEL, bidi overrides and the line
  separators U+2028/U+2029 as JSON \\u escapes (JSON itself escapes C0); other text round-trips.

Stdlib only: the headless commands use it without Textual.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, Optional

_BIDI_CONTROLS = tuple(range(0x202A, 0x202F)) + tuple(range(0x2066, 0x206A)) + (0x200E, 0x200F, 0x061C)

_MULTILINE: Dict[int, int] = {code: 0x2400 + code for code in range(0x20) if chr(code) not in "\n\t"}
_MULTILINE[0x7F] = 0x2421
_MULTILINE.update((code, 0xFFFD) for code in range(0x80, 0xA0))
_MULTILINE.update((code, 0xFFFD) for code in _BIDI_CONTROLS)
# Lone surrogates (undecodable file names, surrogateescape) become U+FFFD too, by _SURROGATES rather than
# the tables: their 2,048 entries in each of the three tables held 0.4 MB for every run of the console.
_SURROGATES = re.compile("[\ud800-\udfff]")

_ONE_LINE = dict(_MULTILINE)
_ONE_LINE.update({ord("\n"): 0x2424, ord("\t"): 0x2409})  # ␤ and ␉
# Line and paragraph separators: no terminal breaks on them, but str.splitlines() and JavaScript do.
_ONE_LINE.update({0x2028: 0x2424, 0x2029: 0x2424})

# What json.dumps(ensure_ascii=False) leaves raw that a terminal or a line reader acts on (a lone
# surrogate never reaches it: _json_ready writes such a string escaped()).
_JSON_ESCAPES: Dict[int, str] = {code: "\\u%04x" % code for code in _ONE_LINE if code >= 0x7F}
JSON_MAX_DEPTH = 64  # deeper containers are written as a note, not walked


def printable(text: str) -> str:
    """`text` with every control character but newline and tab made visible (ESC as ␛), same length."""
    text = text.translate(_MULTILINE)
    return text if text.isascii() else _SURROGATES.sub("\ufffd", text)  # isascii() reads a flag: no scan


def printable_line(text: str) -> str:
    """`text` as one visible line: newline, tab and every other control character made visible, same length."""
    text = text.translate(_ONE_LINE)
    return text if text.isascii() else _SURROGATES.sub("\ufffd", text)


def escaped(text: str) -> str:
    """A one-line, UTF-8-encodable, lossless form of `text`: controls as \\n, \\x1b, \\u202e; undecodable bytes as \\xff."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that os.fsdecode could not decode (surrogateescape)
            out.append("\\x%02x" % (code - 0xDC00))
        elif code in _ONE_LINE or 0xD800 <= code <= 0xDFFF:
            # \\n, \\t, \\x1b below U+0080; \\u0085 above, so that \\xNN always means an undecodable byte.
            out.append(ch.encode("unicode_escape").decode("ascii") if code < 0x80 else "\\u%04x" % code)
        else:
            out.append(ch)
    return "".join(out)


def has_undecodable(text: str) -> bool:
    """Whether `text` holds a lone surrogate (an undecodable byte), which no UTF-8 output can carry."""
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in text)


def _json_ready(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        return escaped(value) if has_undecodable(value) else value
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth >= JSON_MAX_DEPTH:
        return "(nested deeper than %d levels: not written)" % JSON_MAX_DEPTH
    if isinstance(value, dict):
        return {
            _json_ready(k if isinstance(k, str) else str(k), depth + 1): _json_ready(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_json_ready(item, depth + 1) for item in value]
    return _json_ready(str(value), depth + 1)  # not JSON: its text, rather than a TypeError


def printable_json(value: Any, indent: Optional[int] = None) -> str:
    """JSON text of `value` safe to print (see the module docstring); one line unless `indent`; never raises on content."""
    text = json.dumps(_json_ready(value, 0), ensure_ascii=False, indent=indent)
    return text.translate(_JSON_ESCAPES)


__all__ = ["escaped", "has_undecodable", "printable", "printable_json", "printable_line"]
