"""Where a user's "go to" text points in a recording: relative, percent, offset or clock time."""

from __future__ import annotations

import math
import re
import time
from typing import Optional

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^([+-]?)(\d+(?:\.\d+)?)([smh]?)$")
_CLOCK = re.compile(r"^(?:(\d{4}-\d{2}-\d{2})[ T])?(\d{1,2}):(\d{2})(?::(\d{2}))?$")


class SeekError(ValueError):
    """Text that names no point in time; worded for the user."""


def seek_target(text: str, start: float, end: float, position: float) -> float:
    """The time `text` names, clamped to [start, end].

    "+30s", "-5m", "+1h": relative to the position; "90", "2m": from the start;
    "50%": share of the length; "14:05", "14:05:30", "2026-12-02 14:05:30": local clock time
    (a time of day alone is taken on the recording's first day).
    """
    text = text.strip().lower()
    if not text:
        raise SeekError("type a time: +30s, -5m, 90, 50%, 14:05:30")
    target: Optional[float] = None
    if text.endswith("%"):
        try:
            share = float(text[:-1])
        except ValueError:
            raise SeekError("%r: expected a percent like 50%%" % text) from None
        if not math.isfinite(share):  # "nan%" parses as a float: a position of NaN breaks the clock
            raise SeekError("%r: expected a percent like 50%%" % text)
        target = start + (end - start) * share / 100.0
    elif _DURATION.match(text):
        sign, number, unit = _DURATION.match(text).groups()
        seconds = float(number) * _UNITS[unit]
        target = position + seconds if sign == "+" else position - seconds if sign == "-" else start + seconds
    else:
        clock = _CLOCK.match(text)
        if clock is None:
            raise SeekError("%r: expected +30s, -5m, 90, 50%% or a clock time like 14:05:30" % text)
        day, hours, minutes, seconds = clock.groups()
        day = day or time.strftime("%Y-%m-%d", time.localtime(start))
        try:
            stamp = time.strptime("%s %s:%s:%s" % (day, hours, minutes, seconds or "00"), "%Y-%m-%d %H:%M:%S")
            target = time.mktime(stamp)
        except (ValueError, OverflowError):
            raise SeekError("%r: not a valid date and time" % text) from None
    if not math.isfinite(target):  # "+9999...9" overflows to inf: clamps; nan cannot
        target = end if target > 0 else start
    return min(max(target, start), end)
