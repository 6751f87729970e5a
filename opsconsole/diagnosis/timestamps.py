"""The time a log line carries, from every common prefix, for the diagnosis's first and last seen.

Recognised: Python logging's "2026-12-03 10:10:09,123 - name - LEVEL", ISO 8601 ("T", fraction,
"Z" or "+01:00"), torchelastic's "[2026-12-03 10:10:09,123] torch.distributed...", glog's
"E1203 10:10:09.123456 12345 file.cc:42]" and torch's C++ "[E1203 10:10:09.123456 ...]" (no year:
the caller's reference year, else the latest one not in the future), each of them behind Ray's
"(pid=123, ip=10.0.0.1) " or "(RayTrainWorker pid=123, ip=...) " prefix. NCCL's "host:pid:tid [dev]"
lines carry no time: the caller keeps the previous line's.

`may_carry_time` is a few character comparisons, so that the diagnosis can afford it on every line
(most lines of a healthy log start with a time); the regexes run only on the lines it lets through.
A stamp without a zone is local time, as Python's logging writes it.
"""

from __future__ import annotations

import calendar
import re
import time
from typing import Dict, Optional, Tuple

_GLOG_LEVELS = frozenset("IWEF")
_ISO = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T_](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)?")
_GLOG = re.compile(r"[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?")
_RAY_PREFIX = re.compile(r"\((?:[\w.-]+ )?pid=\d+(?:, ip=[\w.:-]+)?\) ")
RAY_PREFIX_CHARS = 120  # how far into a line Ray's "(Actor pid=..., ip=...)" prefix may reach
_FUTURE_SLACK = 86400.0  # a yearless stamp more than a day ahead of now is last year's

_minute_cache: Dict[Tuple[int, int, int, int, int, str], Optional[float]] = {}


def may_carry_time(text: str) -> bool:
    """Whether the line may start with a time; False means it certainly does not (cheap)."""
    first = text[:1]
    if first == "[":
        second = text[1:2]
        return (second.isdigit() and text[5:6] == "-") or (second in _GLOG_LEVELS and text[2:6].isdigit())
    if first.isdigit():
        return text[4:5] == "-"
    if first in _GLOG_LEVELS:
        return text[1:5].isdigit() and text[5:6] == " "
    return first == "(" and "pid=" in text[:RAY_PREFIX_CHARS]


def line_time(text: str, year: Optional[int] = None) -> Tuple[Optional[float], Optional[int]]:
    """(epoch seconds, the year the stamp named) of the time the line starts with; (None, None) if none.

    A glog stamp names no year: `year` (e.g. that of a full stamp seen earlier in the run) is used,
    else the latest year that does not put the stamp in the future; the second value is then None.
    """
    if text[:1] == "(":
        prefix = _RAY_PREFIX.match(text, 0, RAY_PREFIX_CHARS)
        if prefix is None:
            return None, None
        text = text[prefix.end() :]
    start = 1 if text[:1] == "[" else 0
    first = text[start : start + 1]
    if first.isdigit():
        match = _ISO.match(text, start)
        if match is None:
            return None, None
        stamp_year = int(match.group(1))
        when = _epoch(
            stamp_year,
            int(match.group(2)),
            int(match.group(3)),
            int(match.group(4)),
            int(match.group(5)),
            int(match.group(6)),
            match.group(7),
            match.group(8),
        )
        return (when, stamp_year) if when is not None else (None, None)
    if first in _GLOG_LEVELS:
        match = _GLOG.match(text, start)
        if match is None:
            return None, None
        month, day, hour, minute, second = (int(group) for group in match.groups()[:5])
        fraction = match.group(6)
        if year is not None:
            return _epoch(year, month, day, hour, minute, second, fraction, None), None
        this_year = time.localtime().tm_year
        when = _epoch(this_year, month, day, hour, minute, second, fraction, None)
        if when is not None and when > time.time() + _FUTURE_SLACK:  # December's lines read in January
            when = _epoch(this_year - 1, month, day, hour, minute, second, fraction, None)
        return when, None
    return None, None


def _epoch(
    year: int, month: int, day: int, hour: int, minute: int, second: int, fraction: Optional[str], zone: Optional[str]
) -> Optional[float]:
    """Epoch seconds of the fields (local time without a zone); None for an impossible date."""
    if second > 60:
        return None
    key = (year, month, day, hour, minute, zone or "")
    base = _minute_cache.get(key)
    if base is None:
        if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and 1 <= year <= 9999):
            return None
        fields = (year, month, day, hour, minute, 0)
        try:
            if not zone:
                base = time.mktime(fields + (0, 0, -1))
            else:
                base = float(calendar.timegm(fields + (0, 0, 0)))
                if zone != "Z":
                    digits = zone[1:].replace(":", "")
                    offset = int(digits[:2]) * 3600 + int(digits[2:4] or 0) * 60
                    base += -offset if zone[0] == "+" else offset
        except (OverflowError, ValueError):
            return None
        if len(_minute_cache) > 4096:
            _minute_cache.clear()
        _minute_cache[key] = base
    value = base + second
    if fraction:
        value += int(fraction) / 10 ** len(fraction)
    return value
