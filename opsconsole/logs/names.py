"""Labels from log file names, and the time, level and rank a log line carries."""

from __future__ import annotations

import calendar
import os
import re
import time
from typing import Dict, Optional, Tuple

from opsconsole.logs.records import LogSource

# The seed's naming: f'train_{hostname}_rank{rank}_{timestamp}.log', timestamp '%Y%m%d_%H%M%S'.
# The host may hold underscores; the last "_rank<N>_" splits it from the timestamp.
TRAIN_LOG_NAME = re.compile(r"^train_(?P<host>.+)_rank(?P<rank>\d+)_(?P<stamp>.+?)\.log$")

# torch.distributed's per-rank prefix (torchrun --tee / log redirects): "[rank3]:" or "[default3]:", and
# both when torchrun --tee prints a rank's own "[rank3]:" lines ("[default3]:[rank3]: Traceback ..."); the
# "default" number is the local rank, the "rank" one the global rank, which wins.
RANK_PREFIX = re.compile(r"\[(?:rank|default)(\d+)\]:\s?(?:\[rank(\d+)\]:\s?)?")
# NCCL's debug prefix: "%hostname:%pid:%tid [%cudaDev] NCCL INFO ...". The bracket is the CUDA
# device on that host, not the global rank, so only the level is taken from it.
NCCL_PREFIX = re.compile(r"^\S+:\d+:\d+ \[\d+\] NCCL (INFO|WARN|ERROR|TRACE|ABORT)\b")
NCCL_LEVELS = {"INFO": "INFO", "WARN": "WARNING", "ERROR": "ERROR", "TRACE": "DEBUG", "ABORT": "ERROR"}
# A level word near the start of a line: "- INFO -", "[ERROR]", "WARNING:root:", "| INFO |" ...
LEVEL_WORD = re.compile(r"(?:^|[\s\[(|:-])(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)(?=$|[\s\])|:,-])")
LEVEL_NAMES = {"WARN": "WARNING", "FATAL": "CRITICAL"}
LEVEL_SEARCH_CHARS = 48  # how far past the timestamp a level word still counts as the line's level
GLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
ISO_STAMP = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d):(\d\d):(\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?")

# torchrun's --log-dir: <dir>/<run id>/attempt_<N>/<local rank>/{stdout,stderr}.log (and error.json where a child
# recorded its exception); the folder is the local rank. A rank has at most 7 digits (int() of more is slow).
TORCHRUN_RANK_DIR = re.compile(r"(?:^|/)(attempt_\d+/(\d{1,7})/[^/]+)$")
# "rank2" in a file name ("worker-rank_2.out", "log.rank3.txt"), set apart by _ . - or the ends.
RANK_IN_NAME = re.compile(r"(?:^|[_.-])rank[_-]?(\d{1,7})(?=[_.-]|$)", re.IGNORECASE)

_hour_cache: Dict[Tuple[str, str], float] = {}  # ("YYYY-MM-DD HH", zone) -> epoch of that hour


def label_source(node: str, path: str) -> LogSource:
    """The source for `path` on `node`, with the host and rank its name or place gives (the Logs pane's labels and
    the diagnosis's, `diagnose --run` included, are these).

    The seed's naming gives host and rank ("gpu07:rank3"); torchrun's --log-dir layout
    (`.../attempt_0/{local_rank}/stderr.log`) the folder's rank, labelled "rank1:attempt_0/1/stderr.log" (the local
    rank: the global one on a single node; the diagnosis of a run relabels a folder whose lines name another); a
    `rank{N}` in the name that rank ("rank2:worker-rank_2.out"); else the label is the file name."""
    name = os.path.basename(path)
    match = TRAIN_LOG_NAME.match(name)
    if match:
        host, rank = match.group("host"), int(match.group("rank"))
        return LogSource(node=node, path=path, host=host, rank=rank, label="%s:rank%d" % (host, rank))
    layout = TORCHRUN_RANK_DIR.search(path.replace(os.sep, "/"))
    if layout is not None:
        return ranked_source(LogSource(node=node, path=path), int(layout.group(2)))
    named = RANK_IN_NAME.search(name)
    if named is not None:
        return ranked_source(LogSource(node=node, path=path), int(named.group(1)))
    return LogSource(node=node, path=path, label=name)


def torchrun_place(path: str) -> str:
    """What a label shows of a file: "attempt_0/1/stderr.log" in torchrun's --log-dir layout, else its name."""
    layout = TORCHRUN_RANK_DIR.search(path.replace(os.sep, "/"))
    return layout.group(1) if layout is not None else os.path.basename(path)


def ranked_source(source: LogSource, rank: int) -> LogSource:
    """`source` as rank `rank`, labelled "rank{N}:" and its place (torchrun's folders, else the file name)."""
    return LogSource(
        node=source.node,
        path=source.path,
        host=source.host,
        rank=rank,
        label="rank%d:%s" % (rank, torchrun_place(source.path)),
    )


def _hour_epoch(stamp: str, zone: Optional[str]) -> Optional[float]:
    """Epoch seconds of "YYYY-MM-DD HH" (local time when there is no zone); cached per hour."""
    key = (stamp, zone or "")
    cached = _hour_cache.get(key)
    if cached is not None:
        return cached
    try:
        fields = (int(stamp[0:4]), int(stamp[5:7]), int(stamp[8:10]), int(stamp[11:13]), 0, 0)
    except ValueError:
        return None
    if not (1 <= fields[1] <= 12 and 1 <= fields[2] <= 31 and fields[3] <= 23):
        return None
    if zone is None:
        value = time.mktime(fields + (0, 0, -1))
    else:
        value = float(calendar.timegm(fields + (0, 0, 0)))
        if zone != "Z":
            sign = -1 if zone[0] == "+" else 1
            digits = zone[1:].replace(":", "")
            value += sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    if len(_hour_cache) > 4096:
        _hour_cache.clear()
    _hour_cache[key] = value
    return value


def _iso_time(text: str, start: int) -> Tuple[Optional[float], int]:
    """A "YYYY-MM-DD[ T]HH:MM:SS[,.fff][zone]" timestamp at `start`: (epoch, end index)."""
    match = ISO_STAMP.match(text, start)
    if match is None:
        return None, start
    hour = _hour_epoch(match.group(1), match.group(5))
    minute, second = int(match.group(2)), int(match.group(3))
    if hour is None or minute > 59 or second > 60:
        return None, start
    fraction = match.group(4)
    value = hour + minute * 60 + second
    if fraction:
        value += float("0." + fraction)
    return value, match.end()


def _glog_time(text: str) -> Tuple[Optional[float], int]:
    """glog's "I1202 18:30:01.123456" (no year: the latest one that is not in the future)."""
    s = text
    if len(s) < 21 or s[5] != " " or s[8] != ":" or s[11] != ":" or not s[1:5].isdigit():
        return None, 0
    year = time.localtime().tm_year
    stamp = "%04d-%s-%s %s" % (year, s[1:3], s[3:5], s[6:8])
    try:
        minute, second = int(s[9:11]), int(s[12:14])
    except ValueError:
        return None, 0
    hour = _hour_epoch(stamp, None)
    if hour is None:
        return None, 0
    if hour > time.time() + 86400:  # December's lines read in January
        hour = _hour_epoch("%04d%s" % (year - 1, stamp[4:]), None)
        if hour is None:
            return None, 0
    end = 14
    fraction = 0.0
    if s[14] == ".":
        end = 15
        while end < len(s) and s[end].isdigit():
            end += 1
        if end > 15:
            fraction = float("0." + s[15:end])
    return hour + minute * 60 + second + fraction, end


def parse_line(text: str) -> Tuple[Optional[float], Optional[str], Optional[int]]:
    """(epoch time, level, rank) a line carries; None for what it does not say.

    Knows the seed's '%(asctime)s - %(levelname)s - %(message)s', ISO 8601 stamps (bare or in
    brackets), glog's 'I1202 18:30:01.123', NCCL's 'host:pid:tid [dev] NCCL WARN', and torch's
    '[rank3]:' prefix in front of any of them.
    """
    rank = None
    body = text
    if body.startswith(("[rank", "[default")):
        match = RANK_PREFIX.match(body)
        if match:
            rank = int(match.group(2) or match.group(1))
            body = body[match.end() :]
    if not body:
        return None, None, rank
    first = body[0]
    when: Optional[float] = None
    end = 0
    if first.isdigit():
        when, end = _iso_time(body, 0)
    elif first == "[":
        when, end = _iso_time(body, 1)
    elif first in GLOG_LEVELS and len(body) > 5 and body[1].isdigit():
        when, end = _glog_time(body)
        if when is not None:
            return when, GLOG_LEVELS[first], rank
    if when is None:
        end = 0
        if ":" in body[:64] and " NCCL " in body[:96]:
            match = NCCL_PREFIX.match(body)
            if match:
                return None, NCCL_LEVELS[match.group(1)], rank
    match = LEVEL_WORD.search(body, end, end + LEVEL_SEARCH_CHARS)
    level = None
    if match:
        word = match.group(1)
        level = LEVEL_NAMES.get(word, word)
    return when, level, rank
