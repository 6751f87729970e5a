"""Local followers against files another process writes, rotates and truncates; the last page and scroll-back."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from opsconsole.config import Config, LogsConfig
from opsconsole.logs.hub import LogHub
from opsconsole.logs.index import LineIndex, read_last_lines
from opsconsole.logs.records import MAX_LINE_BYTES, TRUNCATED_MARKER
from opsconsole.probe.filetail import FileTail
from tests.waiting import wait_for

WRITER = r"""
import os, sys, time
path, action = sys.argv[1], sys.argv[2]
def append(data, name=path):
    with open(name, "ab") as f:
        f.write(data)
if action == "lines":
    start, stop = int(sys.argv[3]), int(sys.argv[4])
    for i in range(start, stop):
        append(b"2024-12-02 18:30:01,000 - INFO - line %d\n" % i)
elif action == "rotate":
    os.rename(path, path + ".1")
    append(b"first of new file\n")
elif action == "truncate_grow":
    with open(path, "r+b") as f:
        f.truncate(0)
    append(b"after truncate %s\n" % (b"z" * int(sys.argv[3])))
elif action == "bytes":
    append(bytes.fromhex(sys.argv[3]))
"""


def write(path, action, *args):
    """Run the writer as a separate process (the way a training job writes its log)."""
    subprocess.run([sys.executable, "-c", WRITER, str(path), action, *map(str, args)], check=True)


@pytest.fixture(params=["inotify", "polling"])
def mode(request):
    return request.param


async def start_hub(tmp_path, mode):
    got = []
    hub = LogHub(
        Config(logs=LogsConfig(paths=(str(tmp_path / "*.log"),), poll_interval=0.05, rescan_interval=0.2)),
        use_inotify=mode == "inotify",
    )
    await hub.start(got.extend)
    assert hub._local.mode == mode
    return hub, got


async def test_rotation_truncation_and_partial_lines(tmp_path, mode):
    log = tmp_path / "train_gpu-a_rank3_20241202_183001.log"
    write(log, "lines", 1, 51)
    hub, got = await start_hub(tmp_path, mode)
    try:
        await wait_for(lambda: len(got) == 50)
        assert [line.number for line in got] == list(range(1, 51))
        assert got[0].source.label == "gpu-a:rank3" and got[0].rank == 3 and got[0].level == "INFO"
        write(log, "bytes", b"partial".hex())
        await asyncio.sleep(0.3)
        assert len(got) == 50  # no newline yet: the line waits
        write(log, "bytes", b" end\n".hex())
        await wait_for(lambda: len(got) == 51)
        assert got[-1].text == "partial end"
        write(log, "lines", 52, 61)
        write(log, "rotate")
        await wait_for(lambda: got[-1].text == "first of new file")
        texts = [line.text.rsplit(" ", 1)[-1] for line in got[51:-1]]
        assert texts == [str(i) for i in range(52, 61)]  # the old file's rest, once, before the new one
        assert got[-1].number == 1 and got[-1].offset == 0
        # Truncated and grown past the old size between two polls: read again from 0.
        before = len(got)
        write(log, "truncate_grow", 400)
        await wait_for(lambda: len(got) == before + 1)
        assert got[-1].text.startswith("after truncate") and got[-1].number == 1
        keys = {line.source.key for line in got}
        assert keys == {"local:" + str(log)}
    finally:
        await hub.stop()


async def test_invalid_utf8_and_a_10_mb_line(tmp_path, mode):
    log = tmp_path / "plain.log"
    log.write_bytes(b"")
    hub, got = await start_hub(tmp_path, mode)
    try:
        write(log, "bytes", (b"ok \xff\xfe bytes\n").hex())
        big = tmp_path / "big.bin"
        big.write_bytes(b"A" * (10 << 20) + b"\nafter\n")
        with open(log, "ab") as out:
            out.write(big.read_bytes())
        await wait_for(lambda: len(got) == 3)
        assert got[0].text == "ok \ufffd\ufffd bytes"
        assert got[1].truncated and got[1].text == "A" * MAX_LINE_BYTES + TRUNCATED_MARKER
        assert got[2].text == "after" and got[2].number == 3
        assert got[2].offset == len(b"ok \xff\xfe bytes\n") + (10 << 20) + 1
        # The follower never held the whole line.
        tail = hub._local.tails[str(log)]
        assert len(tail.partial) <= MAX_LINE_BYTES
    finally:
        await hub.stop()


async def test_new_files_matching_the_glob_are_picked_up(tmp_path, mode):
    (tmp_path / "a.log").write_text("a1\n")
    hub, got = await start_hub(tmp_path, mode)
    try:
        await wait_for(lambda: len(got) == 1)
        write(tmp_path / "b.log", "bytes", b"b1\nb2\n".hex())
        (tmp_path / "c.txt").write_text("not matched\n")
        await wait_for(lambda: len(got) == 3)
        assert [(line.source.label, line.text) for line in got[1:]] == [("b.log", "b1"), ("b.log", "b2")]
        assert {s.label for s in hub.sources()} == {"a.log", "b.log"}
    finally:
        await hub.stop()


async def test_problems_name_unreadable_files_and_empty_globs(tmp_path):
    locked = tmp_path / "locked.log"
    locked.write_text("secret\n")
    locked.chmod(0)
    if os.access(locked, os.R_OK):
        pytest.skip("running as root: permissions are not enforced")
    hub = LogHub(Config(logs=LogsConfig(paths=(str(tmp_path / "*.log"), str(tmp_path / "none/*.log")))))
    got = []
    await hub.start(got.extend)
    try:
        await wait_for(lambda: "local:" + str(locked) in hub.problems())
        problems = hub.problems()
        assert problems["local:" + str(locked)] == "permission denied"
        assert problems[str(tmp_path / "none/*.log")] == "no file matches"
        assert got == []
    finally:
        await hub.stop()
        locked.chmod(0o600)


def make_big_log(path, lines):
    with open(path, "wb") as out:
        chunk = []
        for i in range(1, lines + 1):
            chunk.append(b"2024-12-02 18:30:01,000 - INFO - step %d\n" % i)
            if len(chunk) == 10000:
                out.write(b"".join(chunk))
                chunk = []
        out.write(b"".join(chunk))


def test_last_page_reads_a_few_blocks_only(tmp_path):
    log = tmp_path / "big.log"
    make_big_log(log, 300_000)
    reads = [0]
    lines = read_last_lines(str(log), 200, reads=reads)
    assert len(lines) == 200
    assert lines[-1][1] == b"2024-12-02 18:30:01,000 - INFO - step 300000"
    assert lines[0][1].endswith(b"step 299801")
    assert reads[0] <= 2  # 200 lines of ~43 bytes: one or two 64 KiB blocks of a 13 MB file


async def test_scroll_back_through_the_index(tmp_path):
    log = tmp_path / "big.log"
    make_big_log(log, 300_000)
    hub = LogHub(Config(logs=LogsConfig(paths=(str(log),))))
    got = []
    await hub.start(got.extend)
    try:
        await wait_for(lambda: len(got) > 0)
        first = got[0]
        assert got[-1].text.endswith("step 300000") and first.offset > 0  # the last page only
        key = first.source.key
        older = await hub.older(key, first.offset, 500)
        assert len(older) == 500 and older[-1].offset < first.offset
        start = int(older[0].text.rsplit(" ", 1)[-1])
        assert [int(line.text.rsplit(" ", 1)[-1]) for line in older] == list(range(start, start + 500))
        assert [line.number for line in older] == list(range(start, start + 500))
        top = await hub.older(key, 0, 10)
        assert top == []
        last = await hub.last_lines(key, 3)
        assert [line.number for line in last] == [299998, 299999, 300000]
    finally:
        await hub.stop()


def test_sparse_index_numbers_and_offsets(tmp_path):
    log = tmp_path / "big.log"
    make_big_log(log, 5000)
    index = LineIndex(str(log), every=100)
    index.extend()
    assert len(index.marks) == 51  # bounded: one offset per 100 lines
    offset = index.offset_of(4321)
    with open(log, "rb") as f:
        f.seek(offset)
        assert f.readline().rstrip() == b"2024-12-02 18:30:01,000 - INFO - step 4321"
    assert index.number_at(offset) == 4321


def test_file_tail_resumes_only_in_the_same_bytes(tmp_path):
    log = tmp_path / "r.log"
    log.write_bytes(b"one\ntwo\n")
    tail = FileTail(str(log))
    assert [raw for _, _, raw, _ in tail.poll()] == [b"one", b"two"]
    offset, number, inode, fingerprint = tail.resume_state()
    tail.close()
    with open(log, "ab") as out:
        out.write(b"three\n")
    resumed = FileTail(str(log), offset, number, inode, fingerprint)
    assert [(n, raw) for _, n, raw, _ in resumed.poll()] == [(3, b"three")]
    resumed.close()
    log.write_bytes(b"XXX\nYYY\nZZZ\n")  # rewritten in place: the offset means nothing any more
    again = FileTail(str(log), offset, number, inode, fingerprint)
    assert [(n, raw) for _, n, raw, _ in again.poll()] == [(1, b"XXX"), (2, b"YYY"), (3, b"ZZZ")]
    again.close()
