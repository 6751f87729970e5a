"""The one sanitiser (opsconsole.sanitize): table-driven cases and fuzzing of its promises."""

from __future__ import annotations

import json
import re
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from opsconsole.sanitize import escaped, printable, printable_json, printable_line

# Any code point, lone surrogates included (what os.fsdecode makes of undecodable bytes), with the
# dangerous ones drawn often: C0, DEL, C1, bidi overrides, line separators, backslashes.
DANGEROUS = "\x00\x07\x08\t\n\r\x1b\x7f\x85\x9b\x9d\u2028\u2029\u202e\u2066\u200f\\\udcff\udc80\ud800"
# Drawn per character from three pools, so each text mixes plain, dangerous and arbitrary ones
# (st.text with a mixed alphabet draws the dangerous ones too rarely to find anything).
any_text = st.lists(
    st.one_of(st.sampled_from(DANGEROUS), st.characters(codec=None), st.sampled_from("ab. ")), max_size=40
).map("".join)

_UNESCAPE = re.compile(r"\\(\\|n|t|r|x[0-9a-f]{2}|u[0-9a-f]{4})")


def unescape(text: str) -> str:
    """The inverse of `escaped`: what an audit-log reader does to get the original text back."""

    def one(match: "re.Match[str]") -> str:
        code = match.group(1)
        if code in ("\\", "n", "t", "r"):
            return {"\\": "\\", "n": "\n", "t": "\t", "r": "\r"}[code]
        value = int(code[1:], 16)
        if code[0] == "x" and value >= 0x80:
            return chr(0xDC00 + value)  # a byte os.fsdecode could not decode
        return chr(value)

    return _UNESCAPE.sub(one, text)


def is_control(ch: str) -> bool:
    return unicodedata.category(ch) == "Cc" or 0xD800 <= ord(ch) <= 0xDFFF or ch in "\u2028\u2029"


def test_the_reported_sequences_are_made_visible():
    osc52 = "grad ok \x1b]52;c;cm0gLXJmIH4=\x07 title \x1b]0;pwned\x07 clear \x1b[2J\x1b[H"
    shown = printable(osc52)
    assert "\x1b" not in shown and "\x07" not in shown and len(shown) == len(osc52)
    assert shown.startswith("grad ok ␛]52;c;cm0gLXJmIH4=␇")
    assert printable_line("ckpt-b\n.pt") == "ckpt-b␤.pt"
    assert printable_line("ckpt-\udcff.pt") == "ckpt-\ufffd.pt"
    assert printable("two\nlines\tkept") == "two\nlines\tkept"


def test_escaped_keeps_bytes_and_controls_apart():
    # An undecodable byte 0x85 and the character U+0085 are different names: their escapes differ.
    assert escaped("a\udc85") == "a\\x85"
    assert escaped("a\x85") == "a\\u0085"
    assert escaped("back\\slash\x1b\n") == "back\\\\slash\\x1b\\n"
    assert escaped("line\u2028sep") == "line\\u2028sep"


def test_printable_json_never_raises_and_prints_no_control():
    document = {"name": "ckpt-\udcff.pt", "excerpt": "a\x1b]52;c;x\x07\x9b2J\u202e", "n": 3, "obj": object()}
    text = printable_json(document)
    assert text.encode("utf-8")  # strict: no lone surrogate left
    assert not any(is_control(ch) for ch in text)
    back = json.loads(text)
    assert back["name"] == "ckpt-\\xff.pt"  # escaped: undecodable bytes shown as the byte
    assert back["excerpt"] == document["excerpt"]  # valid text round-trips exactly
    assert back["n"] == 3 and isinstance(back["obj"], str)
    assert "\n" in printable_json({"a": [1, 2]}, indent=2) and "\n" not in printable_json({"a": "x\ny"})


@settings(max_examples=120)
@given(any_text)
def test_fuzz_printable_keeps_length_and_only_newline_and_tab(text):
    shown = printable(text)
    assert len(shown) == len(text)
    assert all(not is_control(ch) or ch in "\n\t" for ch in shown if ch not in "\u2028\u2029")
    shown.encode("utf-8", errors="strict")


@settings(max_examples=120)
@given(any_text)
def test_fuzz_printable_line_is_one_visible_line(text):
    shown = printable_line(text)
    assert len(shown) == len(text)
    assert not any(is_control(ch) for ch in shown)
    assert len(shown.splitlines()) <= 1
    shown.encode("utf-8", errors="strict")


@settings(max_examples=120)
@given(any_text)
def test_fuzz_escaped_is_one_utf8_line_and_lossless(text):
    out = escaped(text)
    out.encode("utf-8", errors="strict")
    assert not any(is_control(ch) for ch in out)
    assert len(out.splitlines()) <= 1
    assert unescape(out) == text


@settings(max_examples=80)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | any_text,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
        max_leaves=12,
    )
)
def test_fuzz_printable_json_is_strict_utf8_with_no_control(value):
    text = printable_json(value)
    text.encode("utf-8", errors="strict")
    assert not any(is_control(ch) for ch in text)
    assert len(text.splitlines()) <= 1
    json.loads(text)
