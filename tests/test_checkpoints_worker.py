"""The metadata worker: hostile checkpoints end at its limits, one file each, and the scan goes on.

Each crafted file is a few hundred bytes to a few MB. Read in-process they segfault the
interpreter (a 1M-deep tuple hashed as a dict key), spin for minutes (ints that all hash
alike, as dict keys: quadratic) or take gigabytes (bytearray of one memo-shared bytes,
again and again). Through the worker each is "unreadable: <reason>" with the reason the
worker's own outcome (killed by SIGSEGV, SIGXCPU, its memory limit, a timeout), never a
measured time; the real checkpoints beside them read as they should in the same scan.
"""

from __future__ import annotations

import io
import os
import signal
import struct
import threading
import time
import zipfile

import pytest
import torch

from opsconsole.checkpoints import formats, safe_unpickle
from opsconsole.checkpoints import worker as worker_module
from opsconsole.checkpoints.access import LOCAL, LocalFileSystem
from opsconsole.checkpoints.cache import ResultCache
from opsconsole.checkpoints.records import INTEGRITY_OK, INTEGRITY_TRUNCATED, INTEGRITY_UNCHECKED, StateDictSummary
from opsconsole.checkpoints.scan import scan_directory
from opsconsole.checkpoints.worker import (
    MetadataWorkers,
    WorkerFailure,
    WorkerLimits,
    _result_types,
    _stand_ins_fingerprint,
    from_plain,
    read_checkpoint_file,
    to_plain,
)
from tests.waiting import wait_for_sync

MiB = 1024 * 1024
# The hang must meet the CPU limit, not the wall clock, however busy the machine: a long timeout.
# 4 s of CPU (the product's is 10) leaves the deep tuple (about 2 s of opcode walk before the hash)
# room to crash, and the colliding keys (minutes of CPU) meet it sooner: the limit is what is tested.
# The optimistic first try gets 1 s (the product's 2): the files it kills are read again, carefully.
TABLE_LIMITS = WorkerLimits(memory_bytes=256 * MiB, cpu_seconds=4, timeout_s=600.0, first_try_cpu_seconds=1)


# --- crafted pickles ---------------------------------------------------------------------------


def torch_zip(pickled: bytes, deflate: bool = False) -> bytes:
    """data.pkl laid out as torch.save does (stem folder, version member)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as archive:
        archive.writestr("ckpt/data.pkl", pickled)
        archive.writestr("ckpt/version", b"3\n")
    return buffer.getvalue()


def deep_tuple_key(depth: int = 1_000_000) -> bytes:
    """{((((None,),),)...): None}: building it is iterative, hashing it recurses in C past the stack.

    Hashing crashes an 8 MiB stack from between 100,000 and 200,000 levels (measured here); a million
    keeps a wide margin at half the opcode walk of two million.
    """
    return b"\x80\x02}N" + b"\x85" * depth + b"Ns."


def colliding_int_keys(count: int = 200_000) -> bytes:
    """{k * (2**61 - 1) + 7: None, ...}: every key hashes to 7, so each insertion probes all before it."""
    modulus = (1 << 61) - 1
    parts = [b"\x80\x02}("]
    for index in range(count):
        value = (index + 1) * modulus + 7
        raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        parts.append(b"\x8a" + bytes([len(raw)]) + raw + b"N")  # LONG1, None
    parts.append(b"u.")
    return b"".join(parts)


def memo_doubled_tuple_key(levels: int = 60) -> bytes:
    """t1 = (t0, t0), t2 = (t1, t1) ... through the memo, used as a dict key: 2**60 to hash."""
    body = b"\x80\x02}N\x94"  # {}, None memoized as 0
    for level in range(levels):
        body += b"h" + bytes([level]) + b"h" + bytes([level]) + b"\x86\x94"  # (m, m), memoized as level + 1
    return body + b"Ns."


def bytearray_bomb(mib: int = 64, copies: int = 8) -> bytes:
    """One `mib` MiB bytes, memoized, and bytearray() of it `copies` times: deflated, a few hundred KB."""
    body = b"\x80\x02\x8e" + struct.pack("<Q", mib * MiB) + bytes(mib * MiB) + b"\x94" + b"0("
    body += b"cbuiltins\nbytearray\n\x94" + b"0"
    for _ in range(copies):
        body += b"h\x01h\x00\x85R"
    return body + b"l."


def build_into_float32(slot_state: bool) -> bytes:
    """BUILD on the shared torch.float32 stand-in: rename it to int8 for every later read, if it could."""
    state = b"N}Vname\nVint8\ns\x86" if slot_state else b"}Vname\nVint8\ns"
    return b"\x80\x02}Vdtype\nctorch\nfloat32\n" + state + b"bs."


def real_checkpoint(epoch: int, loss: float = 0.5) -> bytes:
    torch.manual_seed(epoch)
    buffer = io.BytesIO()
    torch.save({"epoch": epoch, "model": torch.nn.Linear(3, 2).state_dict(), "loss": torch.tensor(loss)}, buffer)
    return buffer.getvalue()


def deflate_bomb() -> bytes:
    """A data.pkl of 50 MB that deflates to 50 KB, its directory claiming 100 bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("ckpt/data.pkl", b"\x80\x02N" + b"0" * 50_000_000 + b"N.")
    data = bytearray(buffer.getvalue())
    struct.pack_into("<I", data, data.rfind(b"PK\x01\x02") + 24, 100)  # the directory's uncompressed size
    return bytes(data)


# The table: file name -> (bytes, what its entry must say). Neighbours sort between them.
HOSTILE = {
    "a_deep_tuple_key.pt": (lambda: torch_zip(deep_tuple_key()), "unreadable: worker killed by SIGSEGV"),
    "b_colliding_int_keys.pt": (
        lambda: torch_zip(colliding_int_keys()),
        "unreadable: worker killed by SIGXCPU: over its CPU limit of 4 s",
    ),
    "c_memo_doubled_tuple.pt": (
        lambda: torch_zip(memo_doubled_tuple_key()),
        "data.pkl not read: objects that take over",
    ),
    "d_deflate_bomb.pt": (deflate_bomb, "inflates to over 100 bytes"),
    "e_bytearray_bomb.pt": (
        lambda: torch_zip(bytearray_bomb(), deflate=True),
        "unreadable: over the worker's memory limit (256 MiB)",
    ),
    "f_huge_shape.pt": (None, None),  # built below: readable, its odd tensor described, not multiplied out
    "g_build_float32.pt": (lambda: torch_zip(build_into_float32(slot_state=False)), "data.pkl unreadable"),
    "h_truncated.pt": (lambda: real_checkpoint(7)[: len(real_checkpoint(7)) // 2], "no zip end record"),
    "i_random.pt": (lambda: os.urandom(4096).replace(b"PK", b"pk").replace(b"\x80", b"\x7f"), "not a torch zip"),
}


def huge_shape() -> bytes:
    """A tensor of shape (10**9, "ab") and one of (10**9, 10**9) on a one-element storage."""
    storage = b"(Vstorage\nctorch\nFloatStorage\nV0\nVcpu\nK\x01tQ"

    def tensor(size):
        return (
            b"ctorch._utils\n_rebuild_tensor_v2\n("
            + storage
            + b"K\x00"
            + size
            + b"(K\x01K\x01t\x89ccollections\nOrderedDict\n)RtR"
        )

    odd = b"(J\x00\xca\x9a;Vab\nt"
    big = b"(J\x00\xca\x9a;J\x00\xca\x9a;t"
    return torch_zip(b"\x80\x02}(Vodd\n" + tensor(odd) + b"Vbig\n" + tensor(big) + b"Vepoch\nK\x05u.")


@pytest.fixture(scope="module")
def table_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    for name, (make, _) in HOSTILE.items():
        (folder / name).write_bytes(huge_shape() if make is None else make())
    for epoch in (1, 2, 3):
        (folder / ("checkpoint_epoch_%d.pt" % epoch)).write_bytes(real_checkpoint(epoch, loss=1.0 / epoch))
    os.mkfifo(folder / "j_fifo.pt")
    return folder


@pytest.fixture(scope="module")
def table_listing(table_dir):
    workers = MetadataWorkers(size=1, limits=TABLE_LIMITS)
    try:
        # The scan's reads go through the module's default workers: point them at these limits.
        saved = worker_module.METADATA_WORKERS
        worker_module.METADATA_WORKERS = workers
        try:
            listing = scan_directory(str(table_dir), cache=ResultCache(), crc_cache=ResultCache())
        finally:
            worker_module.METADATA_WORKERS = saved
        yield listing, workers.starts
    finally:
        workers.close()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_checkpoint_is_bounded_and_its_problem_says_how(table_listing, name):
    listing, _ = table_listing
    entries = {entry.name: entry for entry in listing.entries}
    assert name in entries, "every hostile file is still listed"
    expected = HOSTILE[name][1]
    entry = entries[name]
    if expected is None:
        assert entry.problem is None and entry.meta.epoch == 5
        details = dict(entry.meta.details)
        assert "malformed shape" in details["odd"] and "1000000000, 1000000000" in details["big"]
    else:
        assert entry.problem is not None and expected in entry.problem, entry.problem
    if entry.problem and entry.problem.startswith("unreadable:"):
        assert entry.integrity == INTEGRITY_UNCHECKED  # not known broken: never "corrupt", never deleted as such
        assert getattr(entry, "unreadable", "n/a")  # kept by retention, never ranked among the newest


def test_the_neighbours_of_hostile_files_list_correctly_in_the_same_scan(table_listing):
    listing, starts = table_listing
    assert listing.problem is None
    entries = {entry.name: entry for entry in listing.entries}
    for epoch in (1, 2, 3):
        entry = entries["checkpoint_epoch_%d.pt" % epoch]
        assert (entry.meta.epoch, entry.integrity, entry.problem) == (epoch, INTEGRITY_OK, None)
        assert entry.meta.loss == pytest.approx(1.0 / epoch)
        assert entry.meta.state_dict.dtypes == (("float32", 2),)
    assert entries["checkpoint_epoch_3.pt"].best  # the lowest loss among what could be read
    assert entries["h_truncated.pt"].integrity == INTEGRITY_TRUNCATED
    # The FIFO is never opened: not a regular file, so not read at all, and the scan did not block.
    assert "j_fifo.pt" not in entries and listing.other_files == 1
    # One worker for the scan, restarted only after a death: at least once for each of the crash,
    # the CPU hang and the bomb, at most twice (quick try, careful try) for those and the memo-doubled tuple.
    assert 4 <= starts <= 8


def test_a_fifo_is_refused_by_the_client_and_by_the_worker_itself(tmp_path):
    fifo = tmp_path / "swapped.pt"
    os.mkfifo(fifo)
    workers = MetadataWorkers(size=1, limits=WorkerLimits(timeout_s=60.0))
    try:
        with pytest.raises(WorkerFailure, match="a FIFO, not a regular file: never opened"):
            workers.read(LOCAL, str(fifo), "file", name="swapped.pt")
        # A FIFO swapped in after the client's lstat: the worker's own lstat/O_NONBLOCK/fstat refuse it.
        with pytest.raises(WorkerFailure, match="a FIFO, not a regular file: never opened"):
            workers.run({"reader": "file", "args": {"name": "swapped.pt"}, "path": str(fifo)})
        result = read_checkpoint_file(LOCAL, str(fifo), "swapped.pt", 65536, workers)
        assert result.problem == "unreadable: a FIFO, not a regular file: never opened"
        assert workers.starts == 1  # refusing is not a death
    finally:
        workers.close()


def test_build_into_a_shared_stand_in_does_not_reach_the_next_file_in_the_same_worker(tmp_path):
    benign = tmp_path / "benign.pt"
    benign.write_bytes(real_checkpoint(4))
    workers = MetadataWorkers(size=1)
    try:
        before = workers.stats()["pid"]
        for slot_state in (False, True):
            hostile = tmp_path / ("build_%s.pt" % slot_state)
            hostile.write_bytes(torch_zip(build_into_float32(slot_state)))
            refused = workers.read(LOCAL, str(hostile), "file", name=hostile.name)
            assert refused.problem.startswith("data.pkl unreadable")
            result = workers.read(LOCAL, str(benign), "file", name="benign.pt")
            assert result.meta.state_dict.dtypes == (("float32", 2),) and result.meta.epoch == 4
        assert workers.stats()["pid"] == before and workers.starts == 1  # the same process throughout
    finally:
        workers.close()


def test_the_stand_ins_fingerprint_sees_a_changed_stand_in():
    """The worker compares it after every request and leaves when it changed (the next file gets a fresh one)."""
    before = _stand_ins_fingerprint()
    key = ("torch", "float32")
    saved = safe_unpickle.SAFE_GLOBALS[key]
    safe_unpickle.SAFE_GLOBALS[key] = safe_unpickle.DtypeStub("int8")
    try:
        assert _stand_ins_fingerprint() != before
    finally:
        safe_unpickle.SAFE_GLOBALS[key] = saved
    assert _stand_ins_fingerprint() == before


def test_a_wall_clock_timeout_kills_the_worker_and_the_next_read_gets_a_new_one(tmp_path):
    hang = tmp_path / "hang.pt"
    hang.write_bytes(torch_zip(colliding_int_keys()))
    good = tmp_path / "good.pt"
    good.write_bytes(real_checkpoint(2))
    workers = MetadataWorkers(size=1, limits=WorkerLimits(cpu_seconds=600, timeout_s=1.0))
    try:
        result = read_checkpoint_file(LOCAL, str(hang), "hang.pt", 65536, workers)
        assert result.problem == "unreadable: timed out after 1 s"
        assert read_checkpoint_file(LOCAL, str(good), "good.pt", 65536, workers).meta.epoch == 2
        assert workers.starts == 3  # the quick try, the careful try, the good file
    finally:
        workers.close()


def test_a_worker_slow_to_start_is_not_a_file_that_timed_out(tmp_path, monkeypatch):
    """A new worker's start (interpreter, imports) is bounded apart from the file's timeout: a start
    slower than timeout_s made a good checkpoint 'unreadable: timed out after 1 s' (the wall-clock
    test's good file, on a loaded machine)."""
    good = tmp_path / "good.pt"
    good.write_bytes(real_checkpoint(2))
    pid_file = tmp_path / "worker.pid"
    real_command = worker_module.worker_command

    def stopped_at_start(limits):
        # The worker's process stops itself before its interpreter runs: no CPU, as on a busy machine.
        script = 'echo $$ > "$0"; kill -STOP $$; exec "$@"'
        return ["sh", "-c", script, str(pid_file)] + real_command(limits)

    monkeypatch.setattr(worker_module, "worker_command", stopped_at_start)
    workers = MetadataWorkers(size=1, limits=WorkerLimits(timeout_s=1.0))

    def continue_after_twice_the_timeout() -> None:
        pid = int(wait_for_sync(lambda: pid_file.exists() and pid_file.read_text().strip(), "the worker's pid"))
        wait_for_sync(lambda: process_state(pid) in ("T", None), "the worker stopped")
        time.sleep(2.0)  # the start takes twice the file's timeout
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # killed meanwhile (as the timeout did before)

    thread = threading.Thread(target=continue_after_twice_the_timeout)
    thread.start()
    try:
        result = read_checkpoint_file(LOCAL, str(good), "good.pt", 65536, workers)
        assert result.problem is None and result.meta.epoch == 2
        assert workers.starts == 1
    finally:
        thread.join()
        workers.close()


def process_state(pid: int):
    """The one-letter state of a process (R, S, T, Z ...), None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def test_a_reply_over_its_cap_is_a_problem_not_a_flood(tmp_path):
    many = tmp_path / "many_keys.pt"
    buffer = io.BytesIO()
    torch.save({"key_%05d_%s" % (i, "x" * 150): i for i in range(200)}, buffer)
    many.write_bytes(buffer.getvalue())
    workers = MetadataWorkers(size=1, limits=WorkerLimits(max_reply_bytes=4096))
    try:
        result = read_checkpoint_file(LOCAL, str(many), "many_keys.pt", 65536, workers)
        assert (
            result.problem.startswith("unreadable: metadata of ") and "over the 4096-byte reply limit" in result.problem
        )
        assert workers.starts == 1
    finally:
        workers.close()


class FetchedFileSystem(LocalFileSystem):
    """A remote file system in all but the wire: the parent answers the worker's reads (as over SFTP)."""

    node = "fake-remote"
    remote = True

    def __init__(self) -> None:
        self.reads = 0

    def run_reader(self, path, make_reader):
        with open(path, "rb") as handle:
            data = handle.read()
        reader = make_reader(len(data))
        try:
            request = next(reader)
            while True:
                offset, length = request
                self.reads += 1
                request = reader.send(data[offset : offset + length])
        except StopIteration as stop:
            return stop.value


def test_remote_bytes_are_parsed_in_the_worker_too(tmp_path):
    good = tmp_path / "checkpoint_epoch_6.pt"
    good.write_bytes(real_checkpoint(6))
    crash = tmp_path / "crash.pt"
    crash.write_bytes(torch_zip(deep_tuple_key()))
    fs = FetchedFileSystem()
    workers = MetadataWorkers(size=2, limits=WorkerLimits(timeout_s=600.0))
    try:
        remote = read_checkpoint_file(fs, str(good), good.name, 16 * 1024, workers)
        local = read_checkpoint_file(LOCAL, str(good), good.name, 16 * 1024, workers)
        assert remote == local and remote.meta.epoch == 6 and fs.reads >= 1
        crashed = read_checkpoint_file(fs, str(crash), crash.name, 16 * 1024, workers)
        assert crashed.problem == "unreadable: worker killed by SIGSEGV"
        assert read_checkpoint_file(fs, str(good), good.name, 16 * 1024, workers) == remote
    finally:
        workers.close()


def test_results_cross_as_plain_json_and_come_back_equal():
    meta = formats.CheckpointMeta(
        epoch=3,
        loss=0.25,
        metrics=(("acc", 0.9), ("note", "text")),
        top_keys=("a", "b"),
        details=(("a", "1"),),
        state_dict=StateDictSummary(keys=2, dtypes=(("float32", 2),), bytes=32, source="model"),
        has_optimizer=True,
        unsafe_globals=("datetime.datetime",),
    )
    result = formats.ReadResult("torch", meta, INTEGRITY_OK, "a problem \udcff")
    plain = to_plain(result)
    assert from_plain(__import__("json").loads(__import__("json").dumps(plain)), _result_types()) == result
    with pytest.raises(ValueError):
        from_plain({"$": "os.system"}, _result_types())


def test_an_unreadable_file_keeps_what_its_name_says(tmp_path, monkeypatch):
    path = tmp_path / "epoch=3-step=300.ckpt"
    path.write_bytes(b"x")

    def dead(*args, **kwargs):
        raise WorkerFailure("worker killed by SIGSEGV")

    workers = MetadataWorkers(size=1)
    monkeypatch.setattr(workers, "read", dead)
    result = read_checkpoint_file(LOCAL, str(path), path.name, 65536, workers)
    assert (result.format, result.meta.epoch, result.meta.step) == ("lightning", 3, 300)
    assert result.problem == "unreadable: worker killed by SIGSEGV" and result.integrity == INTEGRITY_UNCHECKED


def test_a_missing_file_is_an_oserror_as_before(tmp_path):
    workers = MetadataWorkers(size=1)
    try:
        with pytest.raises(FileNotFoundError):
            workers.read(LOCAL, str(tmp_path / "gone.pt"), "file", name="gone.pt")
    finally:
        workers.close()


def test_a_hostile_dcp_metadata_is_parsed_in_the_worker_and_its_neighbours_list(tmp_path, monkeypatch):
    """A DCP directory's .metadata is a pickle too: a crafted one (a 1M-deep tuple used as a key)
    kills the worker, not the console; that save is 'could not read', its neighbours read well."""
    import torch
    import torch.distributed.checkpoint as dcp

    from opsconsole.checkpoints.scan import scan_directory

    # The table's limits: the crash must meet the careful read's walk (about 2 s of CPU) and then the
    # C stack, not the default 10 s wall clock, which a loaded machine reached first.
    workers = MetadataWorkers(size=1, limits=TABLE_LIMITS)
    monkeypatch.setattr(worker_module, "METADATA_WORKERS", workers)
    root = tmp_path / "run"
    for step in (100, 200):
        dcp.save({"w": torch.arange(4.0) + step}, checkpoint_id=str(root / ("step-%d" % step)))
    hostile = root / "step-300"
    dcp.save({"w": torch.arange(4.0)}, checkpoint_id=str(hostile))
    (hostile / ".metadata").write_bytes(deep_tuple_key())
    try:
        listing = scan_directory(str(root))
    finally:
        workers.close()
    by_name = {entry.name: entry for entry in listing.entries}
    assert set(by_name) >= {"step-100", "step-200", "step-300"}
    crashed = by_name["step-300"]
    assert crashed.integrity == INTEGRITY_UNCHECKED and "SIGSEGV" in (crashed.problem or "") + str(crashed.unreadable)
    assert by_name["step-100"].integrity == "ok" and by_name["step-200"].integrity == "ok"
