"""Crafted and broken recordings: one line and exit 2 at the CLI, problems as values in a replay, bounded memory."""

import json
import math
import os
import shutil
import sqlite3
import sys
import tracemalloc
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsconsole.cli import main
from opsconsole.recording import store
from opsconsole.recording.recorder import Recorder
from opsconsole.recording.replay import RecordingReader, ReplayFleet
from tests.cli_errors import assert_one_line_exit_2
from tests.recording_frames import fleet_ticks

TICKS = fleet_ticks(nodes=2, ticks=24, gpus=2)


def record(path, ticks=TICKS):
    with Recorder(str(path), chunk_s=4.0, keyframe_every=2) as recorder:
        for states in ticks:
            for state in states:
                recorder.observe(state)
    return path


def tamper(path, *statements):
    db = sqlite3.connect(str(path))
    for statement in statements:
        if isinstance(statement, tuple):
            db.execute(*statement)
        else:
            db.execute(statement)
    db.commit()
    db.close()


def replay_cli(capsys, path):
    """`opsconsole replay PATH` in-process: exit status and stderr (a readable file would start the TUI)."""
    code = main(["replay", str(path)])
    return code, capsys.readouterr().err


def chunk_ids(path):
    db = sqlite3.connect(str(path))
    ids = [row[0] for row in db.execute("SELECT id FROM chunks ORDER BY id")]
    db.close()
    return ids


def read_everything(reader):
    """Play the whole recording forward, seek about, read events; every state's times sane."""
    states = dict(reader.seek(reader.start))
    t = reader.start
    while t < reader.end:
        t += 3.0
        for state in reader.advance(t):
            states[state.name] = state
    for target in (reader.end, reader.start, (reader.start + reader.end) / 2, float("nan"), float("inf")):
        states.update(reader.seek(target))
    reader.events(reader.start - 1, reader.end + 1)
    for state in states.values():
        for value in (state.received_at, state.since, state.rtt_ms):
            assert value is None or (type(value) is float and math.isfinite(value))
    return states


# --- the file as a whole: one line and exit 2 --------------------------------


@pytest.mark.parametrize("version", ["abc", "1.0", "99", "", "-1", "0", "1" * 5000])
def test_a_wrong_version_string_is_one_line(tmp_path, capsys, version):
    path = record(tmp_path / "v.opsrec")
    tamper(path, ("UPDATE meta SET value = ? WHERE key = 'version'", (version,)))
    code, err = replay_cli(capsys, path)
    assert_one_line_exit_2(code, err, "recording")
    assert ("newer" in err) if version == "99" else ("not" in err)


def test_a_version_that_is_not_text_or_missing_is_one_line(tmp_path, capsys):
    for value in (1.5, b"\x01", None):
        path = record(tmp_path / "v.opsrec")
        if value is None:
            tamper(path, "DELETE FROM meta WHERE key = 'version'")
        else:
            tamper(path, ("UPDATE meta SET value = ? WHERE key = 'version'", (value,)))
        assert_one_line_exit_2(*replay_cli(capsys, path), "not an opsconsole recording")
        for name in os.listdir(tmp_path):
            os.unlink(tmp_path / name)


@pytest.mark.parametrize("drop", ["meta", "chunks", "events"])
def test_a_missing_table_is_one_line(tmp_path, capsys, drop):
    path = record(tmp_path / "t.opsrec")
    tamper(path, "DROP TABLE %s" % drop)
    assert_one_line_exit_2(*replay_cli(capsys, path), "no %s table" % drop)


def test_a_view_in_place_of_a_table_is_refused_before_it_runs(tmp_path, capsys):
    path = record(tmp_path / "view.opsrec")
    # A view that never ends: reading it would hang the console.
    tamper(
        path,
        "DROP TABLE chunks",
        "CREATE VIEW chunks AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c)"
        " SELECT x AS id, x AS t0, x AS t1, 1 AS keyframe, 1 AS records, x'00' AS data FROM c",
    )
    assert_one_line_exit_2(*replay_cli(capsys, path), "no chunks table")


def test_a_missing_column_is_one_line(tmp_path, capsys):
    path = record(tmp_path / "c.opsrec")
    tamper(path, "ALTER TABLE events DROP COLUMN node")
    assert_one_line_exit_2(*replay_cli(capsys, path), "events has no column node")


@pytest.mark.parametrize(
    "blob",
    [
        b"junk that is no zlib stream",
        zlib.compress(b"{not json at all"),
        zlib.compress(b"[[[[[[[[" * 50_000),  # nested too deep for json
        zlib.compress(b'{"n": "gpu000", "s": {"state": "up"}}'),  # no time
        zlib.compress(b'{"t": 1800000000.0, "s": {"state": "up"}}'),  # no node
        zlib.compress(b'{"t": 1800000000.0, "n": "gpu000"}'),  # no state
        zlib.compress(b'{"t": NaN, "n": "gpu000", "s": {"state": "up"}}'),
        zlib.compress(b"\xff\xfe not utf-8"),
        zlib.compress(b"x" * 100)[:-4],  # cut short
        "text, not a blob",
    ],
)
def test_a_first_chunk_that_cannot_be_read_is_one_line(tmp_path, capsys, blob):
    path = record(tmp_path / "j.opsrec", TICKS[:3])
    assert len(chunk_ids(path)) == 1
    tamper(path, ("UPDATE chunks SET data = ?", (blob,)))
    assert_one_line_exit_2(*replay_cli(capsys, path), "not a readable recording")


@pytest.mark.parametrize(
    "t0, t1",
    [
        ("nan", "nan"),
        (float("inf"), float("inf")),
        (1e300, 1e300),
        (-5.0, 1.0),
        (2e9, 1e9),
        ("", ""),
        (b"\x00", 1.0),
        (10**18, 10**18),
    ],
)
def test_chunk_times_that_are_not_plausible_are_one_line(tmp_path, capsys, t0, t1):
    path = record(tmp_path / "nan.opsrec", TICKS[:3])
    tamper(path, ("UPDATE chunks SET t0 = ?, t1 = ?", (t0, t1)))
    assert_one_line_exit_2(*replay_cli(capsys, path))


def test_an_empty_recording_and_junk_files_are_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.opsrec"
    Recorder(str(empty)).close()
    assert_one_line_exit_2(*replay_cli(capsys, empty), "holds no frames")
    junk = tmp_path / "junk.opsrec"
    junk.write_bytes(store.SQLITE_MAGIC + os.urandom(5000))
    assert_one_line_exit_2(*replay_cli(capsys, junk), "not an opsconsole recording")
    other = tmp_path / "other.db"
    tamper(other, "CREATE TABLE t (x)")
    assert_one_line_exit_2(*replay_cli(capsys, other), "not an opsconsole recording")


def test_special_files_are_refused_without_opening_them(tmp_path, capsys):
    fifo = tmp_path / "fifo.opsrec"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    assert_one_line_exit_2(*replay_cli(capsys, fifo), "a FIFO")
    assert_one_line_exit_2(*replay_cli(capsys, tmp_path), "a directory")
    assert_one_line_exit_2(*replay_cli(capsys, "/dev/zero"), "a device")


def test_the_path_is_a_path_not_a_uri(tmp_path):
    """`a#b.opsrec` once opened `a`: the path went into the SQLite URI unescaped."""
    for name in ("a#b.opsrec", "a?mode=rwc.opsrec", "a%23b.opsrec", "sp ace.opsrec"):
        decoy = tmp_path / name.split("#")[0].split("?")[0].replace("%23", "#")
        path = record(tmp_path / name, TICKS[:6])
        if decoy != path:
            decoy.write_bytes(b"a decoy that is no recording")
        reader = RecordingReader(str(path))
        assert set(reader.seek(reader.end)) == {"gpu000", "gpu001"}
        reader.close()
    assert not (tmp_path / "a").exists() or (tmp_path / "a").read_bytes() == b"a decoy that is no recording"


# --- a bad part met later: a problem value, the rest plays ---------------------


def bomb(inflated_mib):
    packer = zlib.compressobj(9)
    zeros = b"\0" * (1024 * 1024)
    return b"".join(packer.compress(zeros) for _ in range(inflated_mib)) + packer.flush()


def test_a_decompression_bomb_is_refused_within_the_cap(tmp_path):
    payload = bomb(80)  # ~80 kB that inflate to 80 MiB (the report: 1 MB took 2.1 GB)
    assert len(payload) < 200_000
    tracemalloc.start()
    try:
        with pytest.raises(store.ChunkError, match="inflates beyond 64 MiB"):
            store.inflate(payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < store.MAX_CHUNK_INFLATED * 1.25  # the buffer at the cap, grown by an eighth, and one step


def test_a_bomb_in_a_later_chunk_is_a_problem_and_the_rest_plays(tmp_path):
    path = record(tmp_path / "bomb.opsrec")
    ids = chunk_ids(path)
    assert len(ids) >= 4
    tamper(path, ("UPDATE chunks SET data = ? WHERE id = ?", (bomb(70), ids[2])))
    fleet = ReplayFleet(str(path))
    reader = fleet.reader
    assert reader.problem is None
    states = read_everything(reader)
    assert "inflates beyond 64 MiB" in fleet.problem and "chunk %d" % ids[2] in fleet.problem
    assert set(states) == {"gpu000", "gpu001"}
    assert reader.seek(TICKS[2][0].received_at)["gpu000"] == TICKS[2][0]  # before the bomb: as recorded
    assert reader.seek(reader.end)["gpu001"] == TICKS[-1][1]  # after it: the next keyframe restores all
    reader.close()


@pytest.mark.parametrize(
    "bad_record",
    [
        {"t": float("nan"), "n": "gpu000", "s": {"state": "up"}},
        {"t": 1800000010.0, "n": "gpu000", "s": {"state": "up", "received_at": float("nan")}},
        {"t": 1800000010.0, "n": "gpu000", "s": {"state": "up", "received_at": 1e300}},
        {"t": 1800000010.0, "n": "gpu000", "s": {"state": "up", "rtt_ms": float("inf")}},
        {"t": 1800000010.0, "n": "gpu000", "s": {"state": "exploded"}},
        {"t": 1800000010.0, "n": "gpu000", "s": {"state": "up", "reason": ["not", "text"]}},
        {"t": 1800000010.0, "n": "gpu000", "s": {"state": "up"}, "f": {"node": "gpu000"}},  # frame missing fields
        {"t": 1800000010.0, "n": "gpu000", "s": {"state": "up"}, "f": 42},
        {"t": 1800000010.0, "n": "gpu000", "s": {"state": "up"}, "f": "{not json"},
        {"t": 1800000010.0, "n": "", "s": {"state": "up"}},
        [1, 2, 3],
    ],
)
def test_a_bad_record_in_a_later_chunk_is_left_out_and_said(tmp_path, bad_record):
    path = record(tmp_path / "r.opsrec")
    ids = chunk_ids(path)
    db = sqlite3.connect(str(path))
    blob = db.execute("SELECT data FROM chunks WHERE id = ?", (ids[2],)).fetchone()[0]
    records = store.unpack(blob)
    text = "\n".join(
        [json.dumps(r) for r in records[:3]] + [json.dumps(bad_record)] + [json.dumps(r) for r in records[3:]]
    )
    db.execute("UPDATE chunks SET data = ? WHERE id = ?", (zlib.compress(text.encode()), ids[2]))
    db.commit()
    db.close()
    reader = RecordingReader(str(path))
    states = read_everything(reader)
    assert reader.problem is not None and "left out" in reader.problem
    assert "\n" not in reader.problem
    assert set(states) == {"gpu000", "gpu001"}
    assert reader.seek(reader.end)["gpu000"] == TICKS[-1][0]
    reader.close()


def test_a_file_cut_short_after_opening_is_a_problem_not_a_raise(tmp_path):
    path = record(tmp_path / "cut.opsrec", fleet_ticks(nodes=4, ticks=120, gpus=4))
    reader = RecordingReader(str(path))
    size = path.stat().st_size
    with open(path, "r+b") as handle:  # the recording shrinks under the open reader
        handle.truncate(size // 2)
    read_everything(reader)  # no raise: what cannot be read is a problem
    reader.close()


# --- record --out --------------------------------------------------------------


def record_cli(capsys, out):
    code = main(["record", "--out", str(out), "--duration", "0.5"])
    return code, capsys.readouterr().err


def test_record_into_a_missing_directory_is_one_line(tmp_path, capsys):
    assert_one_line_exit_2(*record_cli(capsys, tmp_path / "no" / "such" / "dir" / "x.opsrec"), "no such directory")
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(
    "content", [b"my notes, not a recording\n", store.SQLITE_MAGIC + b"\0" * 2000], ids=["text", "sqlite-header"]
)
def test_record_onto_a_file_that_is_not_a_recording_never_overwrites_it(tmp_path, capsys, content):
    out = tmp_path / "notes.txt"
    out.write_bytes(content)
    assert_one_line_exit_2(*record_cli(capsys, out), "not an opsconsole recording", "not overwritten")
    assert out.read_bytes() == content


def test_record_onto_someone_elses_database_never_touches_it(tmp_path, capsys):
    out = tmp_path / "app.db"
    tamper(out, "CREATE TABLE users (name TEXT)", "INSERT INTO users VALUES ('alice')")
    before = out.read_bytes()
    assert_one_line_exit_2(*record_cli(capsys, out), "not overwritten")
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["app.db"]  # no WAL left either


def test_record_onto_special_files_is_refused(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_one_line_exit_2(*record_cli(capsys, fifo), "a FIFO")
    assert_one_line_exit_2(*record_cli(capsys, tmp_path), "a directory")
    assert_one_line_exit_2(*record_cli(capsys, "/dev/null"), "a device")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--interval", "1e-300"], "--interval must be between"),
        (["--interval", "nan"], "--interval must be between"),
        (["--max-mb", "inf"], "--max-mb must be"),
        (["--max-mb", "-1"], "--max-mb must be"),
        (["--duration", "inf"], "--duration must be"),
    ],
)
def test_record_numbers_are_checked(tmp_path, capsys, args, message):
    code = main(["record", "--out", str(tmp_path / "x.opsrec")] + args)
    assert_one_line_exit_2(code, capsys.readouterr().err, message)
    assert not (tmp_path / "x.opsrec").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--speed", "inf"], "--speed must be"),
        (["--speed", "nan"], "--speed must be"),
        (["--at", "nan"], "--at 'nan': expected seconds"),
        (["--at", "-5"], "--at '-5': expected"),
        (["--at", "2:75"], "--at '2:75': expected"),
        (["--at", "1e999"], "--at '1e999'"),
        # Past the end: said, not a silent start at the end (the recording is 2 s long).
        (["--at", "5"], "--at 5 is past the end of the recording (0:02 long): give 0 to 0:02"),
        (["--at", "2:25"], "--at 2:25 is past the end of the recording (0:02 long)"),
    ],
)
def test_replay_numbers_are_checked(tmp_path, capsys, args, message):
    path = record(tmp_path / "ok.opsrec", TICKS[:3])
    code = main(["replay", str(path)] + args)
    assert_one_line_exit_2(code, capsys.readouterr().err, message)


def test_recording_appends_to_its_own_file_and_splits_oversized_chunks(tmp_path, monkeypatch):
    path = record(tmp_path / "again.opsrec", TICKS[:5])
    record(path, TICKS[5:10])  # appending to a recording is allowed
    reader = RecordingReader(str(path))
    assert reader.seek(reader.end)["gpu001"] == TICKS[9][1]
    reader.close()
    monkeypatch.setattr(store, "MAX_CHUNK_WRITE", 20_000)  # a full frame of 2 GPUs is ~10 kB
    split = record(tmp_path / "split.opsrec", TICKS[:8])
    db = sqlite3.connect(str(split))
    sizes = [len(zlib.decompress(blob)) for (blob,) in db.execute("SELECT data FROM chunks")]
    db.close()
    assert len(sizes) > 2 and max(sizes) <= 20_000
    reader = RecordingReader(str(split))
    for tick in (0, 3, 7):
        assert reader.seek(TICKS[tick][1].received_at)["gpu001"] == TICKS[tick][1]
    reader.close()


# --- fuzz ------------------------------------------------------------------------

# Each fuzz test runs a bounded budget (conftest: derandomized, no deadline); together they take a few seconds.


@pytest.fixture(scope="module")
def base_recording(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz-base")
    path = record(folder / "base.opsrec", TICKS[:14])
    return path.read_bytes()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-scratch")


def fresh(scratch, content):
    shutil.rmtree(scratch)
    scratch.mkdir()
    path = scratch / "f.opsrec"
    path.write_bytes(content)
    return path


def open_and_play(path):
    """Either a clean RecordingError at open, or a replay that plays to the end without raising."""
    try:
        reader = RecordingReader(str(path))
    except store.RecordingError as exc:
        assert "\n" not in str(exc)
        return None
    try:
        read_everything(reader)
    finally:
        reader.close()
    return reader


@settings(max_examples=40)
@given(content=st.binary(max_size=3000), magic=st.booleans())
def test_fuzz_random_bytes_are_a_clean_error(base_recording, scratch, content, magic):
    path = fresh(scratch, (store.SQLITE_MAGIC if magic else b"") + content)
    assert open_and_play(path) is None


SQL_VALUES = st.one_of(
    st.none(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(),
    st.text(max_size=30),
    st.binary(max_size=30),
    st.sampled_from(["1", "nan", "inf", "1800000000.5", "opsconsole-recording"]),
)
COLUMNS = [
    ("meta", "value"),
    ("meta", "key"),
    ("chunks", "t0"),
    ("chunks", "t1"),
    ("chunks", "keyframe"),
    ("chunks", "records"),
    ("chunks", "data"),
    ("chunks", "id"),
    ("events", "t"),
    ("events", "data"),
    ("events", "kind"),
    ("events", "node"),
]


@settings(max_examples=50)
@given(column=st.sampled_from(COLUMNS), value=SQL_VALUES, row=st.integers(0, 8))
def test_fuzz_one_mutated_value_replays_or_is_a_clean_error(base_recording, scratch, column, value, row):
    path = fresh(scratch, base_recording)
    table, name = column
    db = sqlite3.connect(str(path))
    db.execute("INSERT INTO events (t, kind, node, data) VALUES (1800000003.0, 'finding', 'gpu000', '{}')")
    rowid = db.execute("SELECT rowid FROM %s ORDER BY rowid LIMIT 1 OFFSET ?" % table, (row,)).fetchone()
    if rowid is not None:
        try:
            db.execute("UPDATE %s SET %s = ? WHERE rowid = ?" % (table, name), (value, rowid[0]))
        except sqlite3.IntegrityError:  # a NOT NULL or unique column: the file would not hold it
            pass
    db.commit()
    db.close()
    open_and_play(path)


JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
JSON_VALUE = st.recursive(
    JSON_LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
RECORD = st.fixed_dictionaries(
    {},
    optional={
        "t": st.one_of(st.floats(), st.integers(), st.just(1800000005.0), JSON_VALUE),
        "n": st.one_of(st.sampled_from(["gpu000", "gpu001", "new"]), JSON_VALUE),
        "s": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "state": st.one_of(st.sampled_from(["up", "down", "stale"]), JSON_VALUE),
                    "received_at": st.one_of(st.floats(), st.just(1800000005.0), JSON_VALUE),
                    "since": st.one_of(st.floats(), JSON_VALUE),
                    "rtt_ms": st.one_of(st.floats(), JSON_VALUE),
                    "reason": JSON_VALUE,
                    "address": JSON_VALUE,
                },
            ),
            JSON_VALUE,
        ),
        "f": st.one_of(
            JSON_VALUE,
            st.fixed_dictionaries({"delta": JSON_VALUE, "base": JSON_VALUE, "f": JSON_VALUE}),
            st.dictionaries(st.sampled_from(["node", "time", "seq", "gpus", "host", "processes"]), JSON_VALUE),
        ),
    },
)


@settings(max_examples=50)
@given(records=st.lists(RECORD, min_size=1, max_size=4), where=st.integers(0, 40), which=st.integers(0, 5))
def test_fuzz_records_in_a_chunk_replay_or_are_a_clean_error(base_recording, scratch, records, where, which):
    path = fresh(scratch, base_recording)
    db = sqlite3.connect(str(path))
    ids = [r[0] for r in db.execute("SELECT id FROM chunks ORDER BY id")]
    chunk = ids[which % len(ids)]
    lines = zlib.decompress(db.execute("SELECT data FROM chunks WHERE id = ?", (chunk,)).fetchone()[0]).split(b"\n")
    where %= len(lines) + 1
    mixed = lines[:where] + [json.dumps(r).encode() for r in records] + lines[where:]
    db.execute("UPDATE chunks SET data = ? WHERE id = ?", (zlib.compress(b"\n".join(mixed)), chunk))
    db.commit()
    db.close()
    open_and_play(path)


@settings(max_examples=30)
@given(offset=st.integers(0, 10**9), junk=st.binary(min_size=1, max_size=64))
def test_fuzz_overwritten_bytes_in_the_file_replay_or_are_a_clean_error(base_recording, scratch, offset, junk):
    content = bytearray(base_recording)
    offset %= len(content)
    content[offset : offset + len(junk)] = junk
    open_and_play(fresh(scratch, bytes(content)))


@pytest.mark.parametrize("wal", [False, True], ids=["as shipped", "in WAL mode"])
def test_a_recording_without_its_shm_in_a_directory_nobody_may_write_still_opens(wal):
    """A WAL recording copied alone (no -shm) where the reader may not write: SQLite cannot make the
    -shm and said "attempt to write a readonly database"; it is read as immutable instead. Root may
    write anywhere, so as root the reader runs as nobody (the system python3: store.py is stdlib).
    The shipped example is one file (rollback journal, no side files in git) and opens so too."""
    import subprocess
    import tempfile

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    as_nobody = []
    if os.geteuid() == 0:
        if not (shutil.which("setpriv") and os.path.exists("/usr/bin/python3")):
            pytest.skip("needs setpriv and /usr/bin/python3 to read as another user than root")
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    python = "/usr/bin/python3" if as_nobody else sys.executable
    folder = tempfile.mkdtemp(prefix="opsconsole-ro-")  # not pytest's tmp_path: its parent is 0700
    try:
        recording = os.path.join(folder, "h200.opsrec")
        shutil.copyfile(os.path.join(repo, "examples", "h200-training.opsrec"), recording)
        if wal:  # WAL mode stays in the header; closing the last connection removes -wal and -shm
            db = sqlite3.connect(recording)
            db.execute("PRAGMA journal_mode=WAL").fetchone()
            db.close()
        with open(recording, "rb") as header:
            assert header.read(20)[18:] == (b"\x02\x02" if wal else b"\x01\x01")  # read and write versions
        assert sorted(os.listdir(folder)) == ["h200.opsrec"]
        os.chmod(recording, 0o444)
        os.chmod(folder, 0o555)
        code = (
            "import sys; sys.path.insert(0, %r)\n"
            "from opsconsole.recording.store import open_for_reading\n"
            "db = open_for_reading(%r)\n"
            "print(db.execute('SELECT COUNT(*) FROM chunks').fetchone()[0])\n" % (repo, recording)
        )
        done = subprocess.run(as_nobody + [python, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) > 0
        assert sorted(os.listdir(folder)) == ["h200.opsrec"]  # nothing written beside it
    finally:
        os.chmod(folder, 0o700)
        shutil.rmtree(folder)
