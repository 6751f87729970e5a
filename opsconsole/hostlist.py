"""Slurm-style hostlists: "gpu[001-016,020]" to host names and back.

The maintained `hostlist` module (python-hostlist, a required dependency) does the work;
this module adds the checks and messages the console needs: bad patterns raise ValueError
with a message fit to show a user, and a pattern naming too many hosts is refused.
"""

from __future__ import annotations

import re
from typing import Iterable, List

import hostlist as _lib  # python-hostlist

# Same cap as python-hostlist: a typo like [1-1000000] should not eat memory.
MAX_HOSTS = 100000

_WHITESPACE = re.compile(r"\s")


def expand_hostlist(pattern: str, *, allow_duplicates: bool = False) -> List[str]:
    """Expand a hostlist pattern into host names, keeping order and zero padding."""
    text = _check_pattern(pattern)
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
    return _lib.collect_hostlist(names)


def _check_pattern(pattern: object) -> str:
    if not isinstance(pattern, str):
        raise ValueError(f"hostlist must be a string, got {type(pattern).__name__}")
    text = pattern.strip()
    if not text:
        raise ValueError('bad hostlist "": names no hosts')
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
