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
  control characters and undecodable bytes as backslash escapes, always encodable as UTF-8.

Stdlib only: the headless commands use it without Textual.
"""

from __future__ import annotations

from typing import Dict

_BIDI_CONTROLS = tuple(range(0x202A, 0x202F)) + tuple(range(0x2066, 0x206A)) + (0x200E, 0x200F, 0x061C)

_MULTILINE: Dict[int, int] = {code: 0x2400 + code for code in range(0x20) if chr(code) not in "\n\t"}
_MULTILINE[0x7F] = 0x2421
_MULTILINE.update((code, 0xFFFD) for code in range(0x80, 0xA0))
_MULTILINE.update((code, 0xFFFD) for code in _BIDI_CONTROLS)
_MULTILINE.update((code, 0xFFFD) for code in range(0xD800, 0xE000))  # lone surrogates (surrogateescape)

_ONE_LINE = dict(_MULTILINE)
_ONE_LINE.update({ord("\n"): 0x2424, ord("\t"): 0x2409})  # ␤ and ␉


def printable(text: str) -> str:
    """`text` with every control character but newline and tab made visible (ESC as ␛), same length."""
    return text.translate(_MULTILINE)


def printable_line(text: str) -> str:
    """`text` as one visible line: newline, tab and every other control character made visible, same length."""
    return text.translate(_ONE_LINE)


def escaped(text: str) -> str:
    """A one-line, UTF-8-encodable, lossless form of `text`: controls as \\n, \\x1b, \\u202e; undecodable bytes as \\xff."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that os.fsdecode could not decode (surrogateescape)
            out.append("\\x%02x" % (code - 0xDC00))
        elif code in _ONE_LINE:
            out.append(ch.encode("unicode_escape").decode("ascii") if code < 0xD800 or code > 0xDFFF else "\\u%04x" % code)
        else:
            out.append(ch)
    return "".join(out)


__all__ = ["escaped", "printable", "printable_line"]
