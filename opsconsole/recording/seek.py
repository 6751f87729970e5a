"""Where a user's "go to" text points in a recording: relative, percent, offset or clock time."""

from __future__ import annotations

import math
import re
import time
from typing import Optional

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^([+-]?)(\d+(?:\.\d+)?)([smh]?)$")
_CLOCK = re.compile(r"^(?:(\d{4}-\d{2}-\d{2})[ T])?(\d{1,2}):(\d{2})(?::(\d{2}))?$")
# An offset as the replay bar writes it: m:ss or h:mm:ss ("2:25", "1:02:03"), signed when relative.
_COLON_OFFSET = re.compile(r"^([+-]?)(\d{1,6}):([0-5]\d)(?::([0-5]\d))?$")


class SeekError(ValueError):
    """Text that names no point in time; worded for the user."""


def colon_seconds(text: str) -> Optional[float]:
    """Seconds of "m:ss" or "h:mm:ss" (unsigned), None when `text` is not written so."""
    match = _COLON_OFFSET.match(text.strip())
    if match is None or match.group(1):
        return None
    first, second, third = match.group(2), match.group(3), match.group(4)
    if third is None:
        return float(int(first) * 60 + int(second))
    if int(second) > 59:
        return None
    return float(int(first) * 3600 + int(second) * 60 + int(third))


def offset_seconds(text: str) -> float:
    """An offset from the start as `--at` takes it: "90", "2m", "1.5h", "2:25", "1:02:03"."""
    text = text.strip().lower()
    colon = colon_seconds(text)
    if colon is not None:
        return colon
    match = _DURATION.match(text)
    if match is None or match.group(1):
        raise SeekError(
            "%r: expected seconds (90), a duration (2m, 1h) or m:ss / h:mm:ss as the replay bar shows" % text
        )
    seconds = float(match.group(2)) * _UNITS[match.group(3)]
    if not math.isfinite(seconds):
        raise SeekError("%r: too large" % text)
    return seconds


def offset_text(seconds: float) -> str:
    """Seconds as the replay bar writes them: m:ss, or h:mm:ss from an hour."""
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return "%d:%02d:%02d" % (hours, rest // 60, rest % 60) if hours else "%d:%02d" % (rest // 60, rest % 60)


def seek_target(text: str, start: float, end: float, position: float) -> float:
    """The time `text` names, clamped to [start, end].

    "+30s", "-5m", "+1h", "+1:30": relative to the position; "90", "2m": from the start;
    "50%": share of the length; "2:25", "1:02:03": an offset as the replay bar shows it;
    "14:05", "14:05:30", "2026-12-02 14:05:30": local clock time (a time of day alone is taken
    on the recording's first day). "a:bb" is read as a clock time when that time is inside the
    recording, else as an offset when the recording is that long.
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
    elif _COLON_OFFSET.match(text) and _COLON_OFFSET.match(text).group(1):
        sign = text[0]
        seconds = colon_seconds(text[1:])
        if seconds is None:
            raise SeekError("%r: expected +m:ss or -h:mm:ss" % text)
        target = position + seconds if sign == "+" else position - seconds
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
            target = None
        offset = None if clock.group(1) else colon_seconds(text)
        if offset is not None and offset <= end - start and (target is None or not start <= target <= end):
            target = start + offset  # "2:25" as the replay bar shows it, not 02:25 at night
        if target is None:
            raise SeekError("%r: not a valid date and time" % text)
    if not math.isfinite(target):  # "+9999...9" overflows to inf: clamps; nan cannot
        target = end if target > 0 else start
    return min(max(target, start), end)
