"""The recording file: SQLite holding zlib-compressed chunks of node states, plus small events.

Why this shape: SQLite gives one portable file that survives a crash mid-write (WAL) and
an index by time for seeking; chunks of ~5 s compress well because consecutive frames of
a node differ in a few numbers (each frame is stored as a delta against the node's
previous one, the probe's own delta form). Every `keyframe_every`-th chunk opens with a
full state of every node, so a seek decodes at most that many chunks.

A chunk's payload is JSON lines, one per record, in time order:
    {"t": received_at, "n": node, "s": {state fields but frame}, "f": wire frame, or its delta}
"f" is absent when the frame did not change (a state change only), null when the state has none.
"""

from __future__ import annotations

import json
import os
import sqlite3
import zlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

FORMAT = "opsconsole-recording"
FORMAT_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    t0 REAL NOT NULL,
    t1 REAL NOT NULL,
    keyframe INTEGER NOT NULL,
    records INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_t0 ON chunks (t0);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    t REAL NOT NULL,
    kind TEXT NOT NULL,
    node TEXT,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_t ON events (t);
"""


class RecordingError(Exception):
    """A file that is not a recording, or one of a newer format; worded for the user."""


@dataclass(frozen=True)
class Chunk:
    id: int
    t0: float
    t1: float
    keyframe: bool
    records: List[Dict[str, Any]]


def open_for_writing(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(_SCHEMA)
    found = dict(db.execute("SELECT key, value FROM meta"))
    if found and found.get("format") != FORMAT:
        raise RecordingError("%s: not an opsconsole recording" % path)
    if not found:
        db.executemany("INSERT INTO meta VALUES (?, ?)", [("format", FORMAT), ("version", str(FORMAT_VERSION))])
    return db


def open_for_reading(path: str) -> sqlite3.Connection:
    if not os.path.isfile(path):
        raise RecordingError("%s: no such file" % path)
    try:
        db = sqlite3.connect("file:%s?mode=ro" % path, uri=True, check_same_thread=False)
        meta = dict(db.execute("SELECT key, value FROM meta"))
    except sqlite3.Error as exc:
        raise RecordingError("%s: not an opsconsole recording (%s)" % (path, exc)) from None
    if meta.get("format") != FORMAT:
        raise RecordingError("%s: not an opsconsole recording" % path)
    if int(meta.get("version", "0")) > FORMAT_VERSION:
        raise RecordingError("%s: recording format %s is newer than this opsconsole reads (%d)"
                             % (path, meta.get("version"), FORMAT_VERSION))
    return db


def pack(records: List[Dict[str, Any]]) -> bytes:
    text = "\n".join(json.dumps(r, separators=(",", ":")) for r in records)
    return zlib.compress(text.encode(), 6)


def unpack(blob: bytes) -> List[Dict[str, Any]]:
    text = zlib.decompress(blob).decode()
    return [json.loads(line) for line in text.split("\n") if line]


def write_chunk(db: sqlite3.Connection, records: List[Dict[str, Any]], keyframe: bool) -> int:
    """Store one chunk; returns its compressed size in bytes."""
    blob = pack(records)
    db.execute(
        "INSERT INTO chunks (t0, t1, keyframe, records, data) VALUES (?, ?, ?, ?, ?)",
        (records[0]["t"], records[-1]["t"], int(keyframe), len(records), blob),
    )
    return len(blob)


def write_event(db: sqlite3.Connection, t: float, kind: str, node: Optional[str], data: Dict[str, Any]) -> None:
    db.execute("INSERT INTO events (t, kind, node, data) VALUES (?, ?, ?, ?)",
               (t, kind, node, json.dumps(data, separators=(",", ":"))))


def set_meta(db: sqlite3.Connection, key: str, value: str) -> None:
    db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))


def meta(db: sqlite3.Connection) -> Dict[str, str]:
    return dict(db.execute("SELECT key, value FROM meta"))


def time_range(db: sqlite3.Connection) -> Optional[Tuple[float, float]]:
    row = db.execute("SELECT MIN(t0), MAX(t1) FROM chunks").fetchone()
    return None if row[0] is None else (row[0], row[1])


def chunks_from_keyframe(db: sqlite3.Connection, t: float) -> Iterator[Chunk]:
    """Chunks starting at the last keyframe chunk at or before `t` (or the first one), onwards."""
    row = db.execute("SELECT MAX(id) FROM chunks WHERE keyframe = 1 AND t0 <= ?", (t,)).fetchone()
    start = row[0]
    if start is None:
        row = db.execute("SELECT MIN(id) FROM chunks WHERE keyframe = 1").fetchone()
        start = row[0]
    if start is None:
        return
    for cid, t0, t1, keyframe, blob in db.execute(
        "SELECT id, t0, t1, keyframe, data FROM chunks WHERE id >= ? ORDER BY id", (start,)
    ):
        yield Chunk(cid, t0, t1, bool(keyframe), unpack(blob))


def events_between(db: sqlite3.Connection, t0: float, t1: float) -> List[Tuple[float, str, Optional[str], Dict[str, Any]]]:
    return [(t, kind, node, json.loads(data)) for t, kind, node, data in db.execute(
        "SELECT t, kind, node, data FROM events WHERE t > ? AND t <= ? ORDER BY t, id", (t0, t1))]


def size_bytes(db: sqlite3.Connection) -> int:
    """Bytes the stored chunks and events take (what retention bounds)."""
    chunks = db.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM chunks").fetchone()[0]
    events = db.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM events").fetchone()[0]
    return int(chunks) + int(events)


def drop_before_keyframe(db: sqlite3.Connection, keep_from_t: float) -> int:
    """Delete whole keyframe groups that end before `keep_from_t`; returns chunks deleted.

    Deletion stops at a keyframe chunk, so what is left still starts with a full state.
    """
    row = db.execute("SELECT MAX(id) FROM chunks WHERE keyframe = 1 AND t0 <= ?", (keep_from_t,)).fetchone()
    if row[0] is None:
        return 0
    cur = db.execute("DELETE FROM chunks WHERE id < ?", (row[0],))
    first = db.execute("SELECT MIN(t0) FROM chunks").fetchone()[0]
    if first is not None:
        db.execute("DELETE FROM events WHERE t < ?", (first,))
    return cur.rowcount
