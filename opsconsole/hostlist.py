"""Slurm-style hostlists: "gpu[001-016,020]" to host names and back.

The maintained `hostlist` module (python-hostlist) does the work when it is
installed; a small stdlib fallback with the same syntax covers the rest.
Bad patterns raise ValueError with a message fit to show a user.
"""

from __future__ import annotations

import re
from typing import Iterable, List

try:  # python-hostlist; the name check guards against importing ourselves
    import hostlist as _lib

    if not hasattr(_lib, "BadHostlist"):
        _lib = None
except ImportError:  # pragma: no cover - exercised by calling the fallback
    _lib = None

# Same cap as python-hostlist: a typo like [1-1000000] should not eat memory.
MAX_HOSTS = 100000

_WHITESPACE = re.compile(r"\s")


def expand_hostlist(pattern: str, *, allow_duplicates: bool = False) -> List[str]:
    """Expand a hostlist pattern into host names, keeping order and zero padding."""
    text = _check_pattern(pattern)
    if _lib is None:
        hosts = expand_hostlist_fallback(text)
    else:
        try:
            hosts = _lib.expand_hostlist(text, allow_duplicates=True)
        except _lib.BadHostlist as exc:
            raise ValueError(f"bad hostlist {_quote(pattern)}: {exc}") from None
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"bad hostlist {_quote(pattern)}: results too large")
    if not hosts:
        raise ValueError(f"bad hostlist {_quote(pattern)}: names no hosts")
    return hosts if allow_duplicates else _unique(hosts)


def collect_hostlist(hosts: Iterable[str]) -> str:
    """Compress host names into one hostlist pattern ("gpu[001-003],n1")."""
    names = [h.strip() for h in hosts if h.strip()]
    for name in names:
        if re.search(r"[\[\],]", name):
            raise ValueError(f"host name {_quote(name)} contains one of [ ] ,")
    if _lib is not None:
        return _lib.collect_hostlist(names)
    return collect_hostlist_fallback(names)


def _check_pattern(pattern: object) -> str:
    if not isinstance(pattern, str):
        raise ValueError(f"hostlist must be a string, got {type(pattern).__name__}")
    text = pattern.strip()
    if not text:
        raise ValueError("bad hostlist \"\": names no hosts")
    if _WHITESPACE.search(text):
        raise ValueError(f"bad hostlist {_quote(pattern)}: host names cannot contain whitespace")
    return text


def _quote(text: str) -> str:
    """Quote a pattern for a one-line message (escapes newlines and the like)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return '"' + "".join(out) + '"'


def _unique(hosts: List[str]) -> List[str]:
    seen = set()
    out = []
    for host in hosts:
        if host not in seen:
            seen.add(host)
            out.append(host)
    return out


# --- stdlib fallback -------------------------------------------------------


def expand_hostlist_fallback(pattern: str) -> List[str]:
    """Expand a hostlist without python-hostlist; keeps duplicates, raises ValueError."""
    hosts: List[str] = []
    for part in _split_top_level(pattern):
        if part:
            hosts.extend(_expand_part(part, pattern))
            if len(hosts) > MAX_HOSTS:
                raise ValueError(f"bad hostlist {_quote(pattern)}: results too large")
    return hosts


def _split_top_level(pattern: str) -> List[str]:
    parts, depth, current = [], 0, []
    for ch in pattern:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"bad hostlist {_quote(pattern)}: nested brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"bad hostlist {_quote(pattern)}: unbalanced brackets")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise ValueError(f"bad hostlist {_quote(pattern)}: unbalanced brackets")
    parts.append("".join(current))
    return parts


def _expand_part(part: str, pattern: str) -> List[str]:
    # "a[1-2]b[3-4]": literal text and bracket groups, then their product.
    results = [""]
    for literal, ranges in re.findall(r"([^\[]*)(\[[^\]]*\])?", part):
        results = [r + literal for r in results]
        if ranges:
            numbers = _expand_ranges(ranges[1:-1], pattern)
            if len(results) * len(numbers) > MAX_HOSTS:
                raise ValueError(f"bad hostlist {_quote(pattern)}: results too large")
            results = [r + n for r in results for n in numbers]
    return results


def _expand_ranges(ranges: str, pattern: str) -> List[str]:
    numbers: List[str] = []
    for item in ranges.split(","):
        if re.fullmatch(r"[0-9]+", item):
            numbers.append(item)
            continue
        match = re.fullmatch(r"([0-9]+)-([0-9]+)", item)
        if not match:
            raise ValueError(f"bad hostlist {_quote(pattern)}: bad range")
        low, high = int(match.group(1)), int(match.group(2))
        width = len(match.group(1))  # "01-10": padding comes from the start
        if high < low:
            raise ValueError(f"bad hostlist {_quote(pattern)}: start > stop")
        if high - low > MAX_HOSTS:
            raise ValueError(f"bad hostlist {_quote(pattern)}: range too large")
        numbers.extend("%0*d" % (width, i) for i in range(low, high + 1))
    return numbers


def collect_hostlist_fallback(hosts: Iterable[str]) -> str:
    """Compress host names without python-hostlist: runs of the last number only."""
    groups: dict = {}  # (prefix, width or 0) -> set of numbers; order of first sight
    plain: List[str] = []
    for host in hosts:
        match = re.fullmatch(r"(.*?)([0-9]+)", host)
        if not match:
            if host not in plain:
                plain.append(host)
            continue
        digits = match.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((match.group(1), width), set()).add(int(digits))
    pieces = list(plain)
    for (prefix, width), numbers in groups.items():
        runs = _runs(sorted(numbers))
        if len(runs) == 1 and runs[0][0] == runs[0][1]:
            pieces.append(f"{prefix}{runs[0][0]:0{width}d}")
            continue
        body = ",".join(
            f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}" for lo, hi in runs
        )
        pieces.append(f"{prefix}[{body}]")
    return ",".join(pieces)


def _runs(numbers: List[int]) -> List[tuple]:
    runs: List[list] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return [tuple(r) for r in runs]
