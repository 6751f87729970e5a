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
import math
import os
import sqlite3
import stat
import time
import zlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import quote

from opsconsole.file_kinds import file_kind
from opsconsole.sanitize import printable_line

FORMAT = "opsconsole-recording"
FORMAT_VERSION = 1
SQLITE_MAGIC = b"SQLite format 3\x00"

# A chunk of 5 s from 256 nodes of 8 GPUs at the 0.1 s interval floor holds about 20 MiB of JSON
# (a delta record is ~1.2 kB, a keyframe's full frame ~20 kB); the recorder splits a chunk beyond
# MAX_CHUNK_WRITE. A reader refuses a chunk that inflates beyond MAX_CHUNK_INFLATED: a zlib bomb
# of 1 MB would otherwise inflate to about 1 GB.
MAX_CHUNK_INFLATED = 64 * 1024 * 1024
MAX_CHUNK_WRITE = MAX_CHUNK_INFLATED // 2
INFLATE_STEP = 1024 * 1024
MAX_CHUNK_STORED = MAX_CHUNK_INFLATED  # a compressed blob is never larger than its text (plus a few bytes)
MAX_EVENT_BYTES = 1024 * 1024
MAX_EVENTS_READ = 10_000
MAX_META_ROWS = 64
MAX_NAME_CHARS = 256
# Times are epoch seconds: from 1970 to 2100 is plausible; anything else (NaN, inf, 1e300, text)
# is a crafted or broken file, and would crash the clock the console draws.
EARLIEST_TIME = 0.0
LATEST_TIME = 4_102_444_800.0  # 2100-01-01

_TABLES = {
    "meta": ("key", "value"),
    "chunks": ("id", "t0", "t1", "keyframe", "records", "data"),
    "events": ("id", "t", "kind", "node", "data"),
}

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
    """A file that is not a recording, or one of a newer format; worded for the user (one line)."""


class ChunkError(ValueError):
    """A chunk (or a record in it) that cannot be read: the reason, worded for the user."""


@dataclass(frozen=True)
class Chunk:
    id: int
    t0: float
    t1: float
    keyframe: bool
    records: List[Dict[str, Any]]
    problem: Optional[str] = None  # why this chunk (or some of its records) could not be read


def valid_time(value: Any) -> Optional[float]:
    """`value` as epoch seconds if it is a plausible time (finite, 1970..2100), else None."""
    if type(value) is int:
        if not EARLIEST_TIME <= value <= LATEST_TIME:  # compared as int: 10**400 must not overflow
            return None
        return float(value)
    if type(value) is not float or not math.isfinite(value):
        return None
    return value if EARLIEST_TIME <= value <= LATEST_TIME else None


def _shown(path: str) -> str:
    return printable_line(path)


def _regular_file_head(path: str, *, must_exist: bool) -> Optional[bytes]:
    """The first bytes of the regular file at `path`; None if it does not exist (and need not).

    Special files are refused from os.stat, before any open; the open itself is non-blocking
    and checked again (fstat), so a FIFO swapped in after the stat cannot hang us.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if must_exist:
            raise RecordingError("%s: no such file" % _shown(path)) from None
        return None
    except OSError as exc:
        raise RecordingError("%s: %s" % (_shown(path), exc.strerror or exc.__class__.__name__)) from None
    if not stat.S_ISREG(info.st_mode):
        raise RecordingError("%s: not a recording file (it is %s)" % (_shown(path), file_kind(info.st_mode)))
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise RecordingError("%s: %s" % (_shown(path), exc.strerror or exc.__class__.__name__)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RecordingError("%s: not a recording file (not a regular file)" % _shown(path))
        return os.read(fd, len(SQLITE_MAGIC))
    except OSError as exc:
        raise RecordingError("%s: %s" % (_shown(path), exc.strerror or exc.__class__.__name__)) from None
    finally:
        os.close(fd)


def _uri(path: str, mode: str) -> str:
    """A `file:` URI naming exactly `path`: '#', '?' and '%' in a name are quoted, not parsed."""
    return "file:%s?mode=%s" % (quote(os.path.abspath(path)), mode)


def _harden(db: sqlite3.Connection) -> None:
    # The file may be crafted: no schema-defined functions, no value over the chunk cap in memory.
    db.execute("PRAGMA trusted_schema=OFF")
    db.execute("PRAGMA cell_size_check=ON")
    setlimit = getattr(db, "setlimit", None)  # Python 3.11+
    if setlimit is not None:
        setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_CHUNK_STORED + 1024)


def _check_schema(db: sqlite3.Connection, path: str) -> None:
    """Our three tables, as real tables (a view could run forever) with the columns we read."""
    kinds = {
        name: (kind, sql)
        for name, kind, sql in db.execute(
            "SELECT name, type, sql FROM sqlite_master WHERE name IN ('meta', 'chunks', 'events')"
        )
    }
    for name, columns in _TABLES.items():
        kind, sql = kinds.get(name, (None, None))
        if kind != "table" or type(sql) is not str or not sql.lstrip().upper().startswith("CREATE TABLE"):
            raise RecordingError("%s: not an opsconsole recording (no %s table)" % (_shown(path), name))
        found = {row[1]: row[6] for row in db.execute("PRAGMA table_xinfo(%s)" % name)}
        for column in columns:
            if column not in found:
                raise RecordingError(
                    "%s: not an opsconsole recording (%s has no column %s)" % (_shown(path), name, column)
                )
            if found[column] not in (0, 1):  # 2, 3: a generated column, computed from the crafted schema
                raise RecordingError(
                    "%s: not an opsconsole recording (%s.%s is generated)" % (_shown(path), name, column)
                )


def _meta_value(db: sqlite3.Connection, key: str) -> Optional[str]:
    row = db.execute("SELECT value FROM meta WHERE key = ? LIMIT 1", (key,)).fetchone()
    if row is None or type(row[0]) is not str or len(row[0]) > 1000:
        return None
    return row[0]


def _check_meta(db: sqlite3.Connection, path: str, *, writing: bool) -> None:
    if _meta_value(db, "format") != FORMAT:
        raise RecordingError("%s: not an opsconsole recording" % _shown(path))
    version = _meta_value(db, "version")
    if version is None or not version.isascii() or not version.isdigit() or len(version) > 6:
        raise RecordingError(
            "%s: not an opsconsole recording (format version %s)"
            % (_shown(path), "missing" if version is None else _shown(repr(version)))
        )
    number = int(version)
    if number > FORMAT_VERSION:
        raise RecordingError(
            "%s: recording format %d is newer than this opsconsole reads (%d)" % (_shown(path), number, FORMAT_VERSION)
        )
    if number < 1 or (writing and number != FORMAT_VERSION):
        raise RecordingError(
            "%s: recording format %d is not one this opsconsole %s (%d)"
            % (_shown(path), number, "appends to" if writing else "reads", FORMAT_VERSION)
        )


def open_for_writing(path: str) -> sqlite3.Connection:
    """A recording to append to: a new file, an empty one, or an opsconsole recording; anything else is refused.

    The parent directory must exist, and a file that is not a recording is never written to.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise RecordingError("%s: no such directory: %s" % (_shown(path), _shown(directory)))
    head = _regular_file_head(path, must_exist=False)
    if head and head != SQLITE_MAGIC:
        raise RecordingError("%s: exists and is not an opsconsole recording (not overwritten)" % _shown(path))
    try:
        db = sqlite3.connect(_uri(path, "rwc"), uri=True, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise RecordingError("%s: cannot open (%s)" % (_shown(path), exc)) from None
    try:
        _harden(db)
        if head:
            try:
                if db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]:  # only ours may be appended to
                    _check_schema(db, path)
                    _check_meta(db, path, writing=True)
            except (RecordingError, sqlite3.Error):
                raise RecordingError(
                    "%s: exists and is not an opsconsole recording (not overwritten)" % _shown(path)
                ) from None
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        if _meta_value(db, "format") is None:
            db.executemany("INSERT INTO meta VALUES (?, ?)", [("format", FORMAT), ("version", str(FORMAT_VERSION))])
    except sqlite3.Error as exc:
        db.close()
        raise RecordingError("%s: cannot write a recording (%s)" % (_shown(path), exc)) from None
    except RecordingError:
        db.close()
        raise
    return db


def open_for_reading(path: str) -> sqlite3.Connection:
    """A recording, read-only, its schema and format checked; RecordingError (one line) otherwise."""
    head = _regular_file_head(path, must_exist=True)
    if head != SQLITE_MAGIC:
        raise RecordingError("%s: not an opsconsole recording" % _shown(path))
    try:
        return _checked_for_reading(path, _uri(path, "ro"))
    except sqlite3.OperationalError as exc:
        if "readonly" not in str(exc):
            raise RecordingError("%s: not an opsconsole recording (%s)" % (_shown(path), exc)) from None
    # A recording in WAL mode whose -shm file is missing, in a directory we may not write (someone
    # else's run, a read-only copy): SQLite cannot make the -shm. Nobody can be writing it there,
    # so it is read as immutable: the main file alone, no locks.
    try:
        return _checked_for_reading(path, _uri(path, "ro") + "&immutable=1")
    except sqlite3.Error as exc:
        raise RecordingError("%s: not an opsconsole recording (%s)" % (_shown(path), exc)) from None


def _checked_for_reading(path: str, uri: str) -> sqlite3.Connection:
    """The connection, its schema and format checked; sqlite3.OperationalError left to the caller."""
    try:
        db = sqlite3.connect(uri, uri=True, check_same_thread=False)
    except sqlite3.OperationalError:
        raise
    except sqlite3.Error as exc:
        raise RecordingError("%s: not an opsconsole recording (%s)" % (_shown(path), exc)) from None
    try:
        _harden(db)
        db.execute("PRAGMA query_only=ON")
        _check_schema(db, path)
        _check_meta(db, path, writing=False)
    except sqlite3.OperationalError:
        db.close()
        raise
    except sqlite3.Error as exc:
        db.close()
        raise RecordingError("%s: not an opsconsole recording (%s)" % (_shown(path), exc)) from None
    except RecordingError:
        db.close()
        raise
    return db


def pack(records: List[Dict[str, Any]]) -> bytes:
    return zlib.compress(_text_of(records), 6)


def _text_of(records: List[Dict[str, Any]]) -> bytes:
    return "\n".join(json.dumps(r, separators=(",", ":")) for r in records).encode()


def inflate(blob: bytes, limit: int = MAX_CHUNK_INFLATED) -> bytearray:
    """The zlib stream `blob` inflated, refused (ChunkError) beyond `limit` bytes or when cut short.

    Inflated a MiB at a time into one growing buffer: peak memory stays near `limit`
    (one call with max_length joins its blocks at the end, twice that).
    """
    inflater = zlib.decompressobj()
    out = bytearray()
    pending = blob
    try:
        while True:
            out += inflater.decompress(pending, INFLATE_STEP)
            if len(out) > limit:
                raise ChunkError("inflates beyond %d MiB" % (limit // (1024 * 1024)))
            pending = inflater.unconsumed_tail
            if not pending:
                break
        out += inflater.flush(limit + 1 - len(out))
    except zlib.error as exc:
        raise ChunkError("not a zlib stream (%s)" % exc) from None
    if len(out) > limit:
        raise ChunkError("inflates beyond %d MiB" % (limit // (1024 * 1024)))
    if not inflater.eof:
        raise ChunkError("compressed data cut short")
    return out


def check_record(record: Any) -> Dict[str, Any]:
    """A record's container fields checked: t a plausible time, n a node name, s an object, f a frame's form."""
    if type(record) is not dict:
        raise ChunkError("a record is not an object")
    t = valid_time(record.get("t"))
    if t is None:
        raise ChunkError("a record's time is not a plausible time: %s" % _shown(repr(record.get("t"))[:40]))
    record["t"] = t
    name = record.get("n")
    if type(name) is not str or not name or len(name) > MAX_NAME_CHARS:
        raise ChunkError("a record's node name is not a short string")
    if type(record.get("s")) is not dict:
        raise ChunkError("a record's state is not an object")
    if "f" in record and type(record["f"]) not in (dict, str, type(None)):
        raise ChunkError("a record's frame is not an object")
    return record


def unpack(blob: Any) -> List[Dict[str, Any]]:
    """The records of a chunk's blob; ChunkError when the blob as a whole is unreadable.

    A record that is not one (bad JSON, no time, no node) is left out; `unpack_counting`
    says how many were.
    """
    return unpack_counting(blob)[0]


def unpack_counting(blob: Any) -> Tuple[List[Dict[str, Any]], int, Optional[str]]:
    """(records, records left out, why the first was)."""
    if type(blob) is not bytes:
        raise ChunkError("its data is not a blob")
    try:
        text = inflate(blob).decode("utf-8")
    except UnicodeDecodeError:
        raise ChunkError("its data is not UTF-8 text") from None
    records: List[Dict[str, Any]] = []
    left_out, first_reason = 0, None
    for line in text.split("\n"):
        if not line:
            continue
        try:
            records.append(check_record(json.loads(line)))
        except (ValueError, RecursionError) as exc:  # ChunkError and JSONDecodeError are ValueErrors
            left_out += 1
            if first_reason is None:
                first_reason = (
                    str(exc)
                    if isinstance(exc, ChunkError)
                    else ("a record is not JSON" if isinstance(exc, ValueError) else "a record is nested too deep")
                )
    return records, left_out, first_reason


def write_chunk(db: sqlite3.Connection, records: List[Dict[str, Any]], keyframe: bool) -> int:
    """Store one chunk (split in two while its text is over MAX_CHUNK_WRITE); returns the bytes stored.

    A lone record over the cap is left out: a reader could not inflate it.
    """
    text = _text_of(records)
    if len(text) > MAX_CHUNK_WRITE:
        if len(records) == 1:
            return 0
        half = len(records) // 2
        return write_chunk(db, records[:half], keyframe) + write_chunk(db, records[half:], False)
    blob = zlib.compress(text, 6)
    db.execute(
        "INSERT INTO chunks (t0, t1, keyframe, records, data) VALUES (?, ?, ?, ?, ?)",
        (records[0]["t"], records[-1]["t"], int(keyframe), len(records), blob),
    )
    return len(blob)


def write_event(db: sqlite3.Connection, t: float, kind: str, node: Optional[str], data: Dict[str, Any]) -> None:
    db.execute(
        "INSERT INTO events (t, kind, node, data) VALUES (?, ?, ?, ?)",
        (t, kind, node, json.dumps(data, separators=(",", ":"))),
    )


def set_meta(db: sqlite3.Connection, key: str, value: str) -> None:
    db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))


def meta(db: sqlite3.Connection) -> Dict[str, str]:
    """The meta table's short text values (a crafted file may hold anything there)."""
    return {
        key: value
        for key, value in db.execute("SELECT key, value FROM meta LIMIT ?", (MAX_META_ROWS,))
        if type(key) is str and type(value) is str and len(key) <= 100 and len(value) <= 1000
    }


def time_range(db: sqlite3.Connection) -> Optional[Tuple[float, float]]:
    """(first, last) time of the chunks; None without chunks; ChunkError when they are not plausible times."""
    row = db.execute("SELECT MIN(t0), MAX(t1), COUNT(*) FROM chunks").fetchone()
    if not row[2]:
        return None
    start, end = valid_time(row[0]), valid_time(row[1])
    if start is None or end is None or end < start:
        raise ChunkError(
            "its chunks' times are not plausible (%s to %s)" % (_shown(repr(row[0])[:40]), _shown(repr(row[1])[:40]))
        )
    return start, end


def chunks_from_keyframe(db: sqlite3.Connection, t: float) -> Iterator[Chunk]:
    """Chunks starting at the last keyframe chunk at or before `t` (or the first one), onwards.

    A chunk that cannot be read comes with its `problem` and no records (or the records that
    could be read); a file that fails mid-way ends with such a chunk. Nothing here raises
    for what the file holds.
    """
    try:
        row = db.execute("SELECT MAX(id) FROM chunks WHERE keyframe = 1 AND t0 <= ?", (t,)).fetchone()
        start = row[0]
        if start is None:
            row = db.execute("SELECT MIN(id) FROM chunks WHERE keyframe = 1").fetchone()
            start = row[0]
        if start is None:
            return
        rows = db.execute(
            "SELECT id, t0, t1, keyframe, records, typeof(data), LENGTH(data),"
            " CASE WHEN typeof(data) = 'blob' AND LENGTH(data) <= ? THEN data END"
            " FROM chunks WHERE id >= ? ORDER BY id",
            (MAX_CHUNK_STORED, start),
        )
    except sqlite3.Error as exc:
        yield Chunk(-1, 0.0, 0.0, False, [], "the chunks cannot be read (%s)" % exc)
        return
    last_t1 = 0.0
    while True:
        try:
            found = rows.fetchone()
        except sqlite3.Error as exc:  # a corrupt page met mid-way
            yield Chunk(
                -1, last_t1, last_t1, False, [], "the chunks after %s cannot be read (%s)" % (_clock(last_t1), exc)
            )
            return
        if found is None:
            return
        chunk = _chunk_of(*found)
        last_t1 = chunk.t1
        yield chunk


def _chunk_of(cid: Any, t0: Any, t1: Any, keyframe: Any, count: Any, kind: Any, length: Any, blob: Any) -> Chunk:
    start, end = valid_time(t0), valid_time(t1)
    if start is None or end is None or end < start:
        return Chunk(cid, start or 0.0, end or start or 0.0, False, [], "chunk %s: its times are not plausible" % cid)
    where = "chunk %s (%s)" % (cid, _clock(start))
    if blob is None:
        reason = (
            "its data is %d bytes, over the %d MiB cap" % (length, MAX_CHUNK_STORED // (1024 * 1024))
            if kind == "blob"
            else "its data is not a blob"
        )
        return Chunk(cid, start, end, False, [], "%s: %s" % (where, reason))
    try:
        records, left_out, reason = unpack_counting(blob)
    except ChunkError as exc:
        return Chunk(cid, start, end, False, [], "%s: %s" % (where, exc))
    problem = None
    if left_out:
        problem = "%s: %d record(s) left out (%s)" % (where, left_out, reason)
    return Chunk(cid, start, end, bool(keyframe), records, problem)


def _clock(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def events_between(
    db: sqlite3.Connection, t0: float, t1: float
) -> List[Tuple[float, str, Optional[str], Dict[str, Any]]]:
    """Events in (t0, t1], at most MAX_EVENTS_READ; one that is not readable is left out."""
    events: List[Tuple[float, str, Optional[str], Dict[str, Any]]] = []
    try:
        rows = db.execute(
            "SELECT t, kind, node, CASE WHEN LENGTH(data) <= ? THEN data END FROM events"
            " WHERE t > ? AND t <= ? ORDER BY t, id LIMIT ?",
            (MAX_EVENT_BYTES, t0, t1, MAX_EVENTS_READ),
        ).fetchall()
    except sqlite3.Error:
        return events
    for t, kind, node, data in rows:
        if valid_time(t) is None or type(kind) is not str or len(kind) > 100 or type(data) is not str:
            continue
        if node is not None and (type(node) is not str or len(node) > MAX_NAME_CHARS):
            continue
        try:
            value = json.loads(data)
        except (ValueError, RecursionError):
            continue
        if type(value) is dict:
            events.append((float(t), kind, node, value))
    return events


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
