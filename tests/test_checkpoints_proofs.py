"""What a listing proves of each unit's files, and the proofs it keeps on disk for the next listing.

A HF checkpoint-N/ is a good one only when every weight and state file in it is whole: the
safetensors header and the size it implies, each torch file's zip end and directory
(optimizer.pt, scheduler.pt, rng_state.pth, training_args.bin). A unit with one of them cut
short is never the newest good one. The proofs are kept by each file's identity (device, inode,
size, mtime, ctime: opsconsole/checkpoints/proofs.py); a file changed after its proof was kept is
read again and found as it now is. Files are real (torch.save, safetensors written by spec).
"""

from __future__ import annotations

import io
import os
import pickle
import time
from pathlib import Path

import pytest
import torch

from opsconsole.checkpoints import proofs as proofs_module
from opsconsole.checkpoints import scan as scan_module
from opsconsole.checkpoints import zipmeta
from opsconsole.checkpoints.access import LOCAL, LocalFileSystem
from opsconsole.checkpoints.cache import ResultCache
from opsconsole.checkpoints.proofs import ProofStore, cache_home
from opsconsole.checkpoints.retention import plan_retention
from opsconsole.checkpoints.scan import scan_directory
from tests.checkpoint_writers import write_hf_layout
from tests.waiting import wait_for_sync

HOUR = 3600.0
RACY_S = 0.05  # the tests' files are seconds old; a user's are minutes old and meet the default 3 s


def age_tree(root: Path, hours: float = 2.0) -> None:
    """Every mtime under root moved back `hours` (older than cleanup's min_age); ctimes are now."""
    for path in sorted(root.rglob("*"), key=lambda p: p.lstat().st_mtime):
        st = path.lstat()
        os.utime(path, (st.st_atime - hours * HOUR, st.st_mtime - hours * HOUR), follow_symlinks=False)


def ctimes_older_than(root: Path, seconds: float) -> bool:
    """Every file's ctime (which no one can set) at least `seconds` old."""
    now = time.time_ns()
    return all(now - p.lstat().st_ctime_ns > seconds * 1e9 for p in root.rglob("*"))


def scan(root: Path, proofs=None):
    return scan_directory(str(root), cache=ResultCache(), crc_cache=ResultCache(), proofs=proofs, keep_proofs=False)


def by_name(listing):
    return {e.name: e for e in listing.entries}


def doomed(listing, keep: int):
    plan = plan_retention(listing.entries, keep=keep, min_age=600, now=time.time(), root=listing.root)
    return sorted(item.name for item in plan.items if item.delete)


def cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# --- what a listing proves ---------------------------------------------------------------------------


@pytest.mark.parametrize("member", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "model.safetensors"])
def test_a_unit_with_any_member_cut_short_is_truncated_and_never_the_newest_good_one(tmp_path, member):
    write_hf_layout(tmp_path, steps=(500, 1000), best=500)
    for folder in ("checkpoint-500", "checkpoint-1000"):
        torch.save({"cpu_rng_state": torch.get_rng_state()}, tmp_path / folder / "rng_state.pth")
    cut_in_half(tmp_path / "checkpoint-1000" / member)
    age_tree(tmp_path)
    listing = scan(tmp_path)
    entries = by_name(listing)
    assert entries["checkpoint-1000"].integrity == "truncated", entries["checkpoint-1000"]
    assert member in entries["checkpoint-1000"].problem
    assert entries["checkpoint-500"].integrity == "ok" and entries["checkpoint-500"].latest
    assert not entries["checkpoint-1000"].latest
    # Broken takes no keep place: 500 keeps the one place, the damaged newest goes.
    assert doomed(listing, keep=1) == ["checkpoint-1000"]


def test_a_member_that_is_no_zip_at_all_is_unchecked_not_truncated(tmp_path):
    """A legacy (pre-zip) torch.save or a plain pickle named training_args.bin is no damage."""
    write_hf_layout(tmp_path, steps=(500,), best=500)
    (tmp_path / "checkpoint-500" / "training_args.bin").write_bytes(pickle.dumps({"output_dir": "x"}))
    entry = by_name(scan(tmp_path))["checkpoint-500"]
    assert entry.integrity == "ok"
    assert "training_args.bin: not a zip archive" in entry.problem


def test_the_lean_zip_check_agrees_with_the_directory_reader_at_every_cut(tmp_path):
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(64.0), "step": 3}, buffer)
    data = buffer.getvalue()

    def drive(reader, blob):
        try:
            request = next(reader)
            while True:
                request = reader.send(blob[request[0] : request[0] + request[1]])
        except StopIteration as stop:
            return stop.value

    for cut in list(range(0, len(data), 7)) + [len(data)]:
        blob = data[:cut]
        lean = drive(zipmeta.directory_check_reader(len(blob)), blob)
        try:
            full = zipmeta.quick_integrity(drive(zipmeta.directory_reader(len(blob)), blob))
        except zipmeta.ZipProblem as problem:
            full = problem.integrity
        assert lean[0] == full, (cut, lean, full)  # every prefix of a zip starts as one: cut short, not "no zip"


def test_the_lean_directory_pass_says_what_the_careful_one_says_for_any_damaged_entry():
    """zipmeta._check_directory passes a sound directory in one lean pass and hands anything else to
    the careful pass: every field of every entry of a real torch zip damaged in turn, same verdict."""
    buffer = io.BytesIO()
    torch.save({"w": torch.arange(64.0), "b": torch.ones(3), "step": 3}, buffer)
    data = buffer.getvalue()
    end_at = data.rfind(zipmeta.SIG_EOCD)
    _, _, _, _, count, cd_size, cd_offset, _ = zipmeta.EOCD.unpack_from(data, end_at)
    directory = data[cd_offset : cd_offset + cd_size]
    starts = []
    pos = 0
    while pos < len(directory):
        starts.append(pos)
        fields = zipmeta.CENTRAL_HEADER.unpack_from(directory, pos)
        pos += zipmeta.CENTRAL_HEADER.size + fields[10] + fields[11] + fields[12]
    assert len(starts) == count > 3
    # (offset in the header, bytes): the signature, CRC, sizes, the name's length, the local header's offset
    damages = [
        (0, b"PK\x01\x03"),
        (16, b"\0\0\0\0"),
        (20, b"\xff\xff\xff\xff"),
        (24, b"\xff\xff\xff\xff"),
        (20, b"\xff\xff\xff\x7f"),
        (28, b"\xff\x7f"),
        (42, b"\xff\xff\xff\xff"),
        (42, b"\xf0\xff\xff\x7f"),
    ]
    verdicts = set()
    for start in starts:
        for at, patch in damages:
            damaged = bytearray(directory)
            damaged[start + at : start + at + len(patch)] = patch
            for blob in (bytes(damaged), bytes(damaged[: start + 30])):
                lean = zipmeta._check_directory(blob, count, cd_offset)
                careful = zipmeta._check_directory_carefully(blob, count, cd_offset)
                assert lean == careful, (start, at, patch, lean, careful)
                verdicts.add(lean[0])
    assert zipmeta._check_directory(directory, count, cd_offset) == ("ok", None)
    assert zipmeta._check_directory(directory, count + 1, cd_offset) == zipmeta._check_directory_carefully(
        directory, count + 1, cd_offset
    )
    assert verdicts >= {"corrupt", "truncated", "ok"}  # damage of every kind, and CRCs only zeroed


# --- the proofs kept on disk -----------------------------------------------------------------------


@pytest.fixture
def kept_units(tmp_path):
    """Two HF units whose files are old enough (by ctime) for their proofs to be kept, and a store."""
    root = tmp_path / "run"
    write_hf_layout(root, steps=(500, 1000), best=500)
    age_tree(root)
    wait_for_sync(lambda: ctimes_older_than(root, RACY_S), "the files' ctimes past the racy margin", timeout=10)
    store_dir = tmp_path / "proofs"
    first = ProofStore("local", str(root), str(store_dir), racy_s=RACY_S)
    listing = scan(root, first)
    first.flush()
    assert first.stored == 6  # model.safetensors, optimizer.pt, scheduler.pt of each unit
    assert first.units_stored == 2  # and what each unit read: trainer_state.json's fields with the proofs
    assert all(e.integrity == "ok" for e in listing.entries)
    return root, store_dir


def fresh_store(root: Path, store_dir: Path) -> ProofStore:
    """What a new process opens: the proofs on disk, nothing in memory."""
    return ProofStore("local", str(root), str(store_dir), racy_s=RACY_S)


def test_a_later_listing_uses_the_kept_listing_and_lists_the_same(kept_units):
    """Nothing changed: a new process takes the whole listing kept for exactly these files, entry for entry."""
    root, store_dir = kept_units
    before = by_name(scan(root))
    store = fresh_store(root, store_dir)
    after = by_name(scan(root, store))
    assert store.listing_hits == 1 and store.unit_hits == store.hits == 0
    assert store.stored == store.units_stored == store.listings_stored == 0
    assert after == before  # every field, the judged identities (taken from the stats just made) too


def test_a_new_name_beside_the_units_misses_the_kept_listing_and_each_units_result_is_used(kept_units):
    root, store_dir = kept_units
    (root / "notes.txt").write_text("a name the kept listing was not made with")
    before = by_name(scan(root))
    store = fresh_store(root, store_dir)
    after = by_name(scan(root, store))
    assert store.listing_hits == 0 and store.unit_hits == 2 and store.hits == 0
    assert after == before


def test_a_file_truncated_after_its_proof_was_kept_is_read_again_and_found_truncated(kept_units):
    root, store_dir = kept_units
    cut_in_half(root / "checkpoint-1000" / "optimizer.pt")
    store = fresh_store(root, store_dir)
    entries = by_name(scan(root, store))
    assert entries["checkpoint-1000"].integrity == "truncated" and "optimizer.pt" in entries["checkpoint-1000"].problem
    assert store.unit_hits == 1  # checkpoint-500 as kept; in checkpoint-1000 only the changed file is read
    assert store.hits == 2
    assert entries["checkpoint-500"].latest and not entries["checkpoint-1000"].latest


def test_a_file_rewritten_to_the_same_size_and_mtime_is_read_again_and_found_corrupt(kept_units):
    """The mtime can be set back and the size kept; the ctime cannot be, so the identity differs."""
    root, store_dir = kept_units
    weights = root / "checkpoint-1000" / "model.safetensors"
    st = weights.stat()
    data = bytearray(weights.read_bytes())
    data[8:16] = b"not json"  # the header's first bytes: no JSON object any more
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (weights.stat().st_size, weights.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    store = fresh_store(root, store_dir)
    entry = by_name(scan(root, store))["checkpoint-1000"]
    assert entry.integrity == "corrupt" and "model.safetensors" in entry.problem
    assert store.unit_hits == 1 and store.hits == 2


class DirectoryCountingFileSystem(LocalFileSystem):
    """The local file system, counting the directories it reads (listdir) and those it is told the names of."""

    def __init__(self) -> None:
        self.read: list = []
        self.told: list = []

    def listdir(self, path):
        self.read.append(os.path.basename(path))
        return super().listdir(path)

    def listdir_known(self, path, names):
        self.told.append(os.path.basename(path))
        return super().listdir_known(path, names)


def scan_counting(root: Path, proofs) -> tuple:
    fs = DirectoryCountingFileSystem()
    listing = scan_directory(
        str(root), fs, cache=ResultCache(), crc_cache=ResultCache(), proofs=proofs, keep_proofs=False
    )
    return listing, fs


def test_a_later_listing_reads_no_unit_directory_again_whose_identity_is_unchanged(kept_units):
    """Only the root is read: each unit directory's names are the kept listing's (its device, inode, mtime
    and ctime as then), each name's lstat made afresh, and the listing is the same entry for entry."""
    root, store_dir = kept_units
    before = by_name(scan(root))
    store = fresh_store(root, store_dir)
    listing, fs = scan_counting(root, store)
    assert fs.read == ["run"] and sorted(fs.told) == ["checkpoint-1000", "checkpoint-500"]
    assert store.listing_hits == 1 and by_name(listing) == before


@pytest.mark.parametrize("change", ["made", "removed", "renamed"])
def test_a_name_made_removed_or_renamed_in_a_unit_directory_is_seen_though_its_mtime_is_set_back(kept_units, change):
    """A change of names in a directory changes its mtime and its ctime: the mtime can be set back, the
    ctime cannot, so the directory is read again and the listing is of what is there now."""
    root, store_dir = kept_units
    unit = root / "checkpoint-1000"
    st = unit.stat()
    if change == "made":
        (unit / "adapter_model.safetensors").write_bytes(b"")
    elif change == "removed":
        (unit / "config.json").unlink()
    else:
        (unit / "config.json").rename(unit / "config.json.bak")
    os.utime(unit, ns=(st.st_atime_ns, st.st_mtime_ns))
    store = fresh_store(root, store_dir)
    listing, fs = scan_counting(root, store)
    assert "checkpoint-1000" in fs.read and "checkpoint-500" in fs.told and "checkpoint-500" not in fs.read
    assert store.listing_hits == 0
    assert by_name(listing) == by_name(scan(root))  # as a listing with nothing kept finds it
    files = {"made": 6, "removed": 4, "renamed": 5}[change]  # of 5: weights, optimizer, scheduler, config, state
    assert by_name(listing)["checkpoint-1000"].unit.endswith("(%d files)" % files)


@pytest.mark.parametrize("names", [["../../etc"], ["a/b"], [""], ["."], ["..", "config.json"], ["x\0y"]])
def test_kept_names_that_no_directory_entry_can_have_are_not_used(kept_units, names):
    """The store is ours (only a file of our own that nobody else may write is read), yet a name in it
    that is a path, empty, . or .. is never joined to a directory: that directory is read."""
    import json

    root, store_dir = kept_units
    (path,) = list(store_dir.glob("*.json"))
    head, units, files = path.read_text().splitlines()
    record = json.loads(head)
    record["dirs"]["checkpoint-500"][4] = names
    path.write_text("\n".join((json.dumps(record), units, files)))
    store = fresh_store(root, store_dir)
    listing, fs = scan_counting(root, store)
    assert fs.told == ["checkpoint-1000"] and "checkpoint-500" in fs.read
    assert by_name(listing) == by_name(scan(root))


def test_kept_names_of_which_one_is_gone_are_not_used(tmp_path):
    """listdir_known answers None when one of the names is gone: the caller reads the directory."""
    (tmp_path / "a").write_text("a")
    assert [item.name for item in LocalFileSystem().listdir_known(str(tmp_path), ["a"])] == ["a"]
    assert LocalFileSystem().listdir_known(str(tmp_path), ["a", "b"]) is None


def test_a_file_changed_moments_ago_gets_no_kept_proof(tmp_path):
    """git's racy-clean rule: a second change within one timestamp tick would not show."""
    write_hf_layout(tmp_path / "run", steps=(500,), best=500)
    store = ProofStore("local", str(tmp_path / "run"), str(tmp_path / "proofs"), racy_s=3600)
    scan(tmp_path / "run", store)
    store.flush()
    assert store.stored == 0 and not (tmp_path / "proofs").exists()


@pytest.mark.parametrize(
    "damage",
    ["garbage", "not-an-object", "other-format", "wrong-types", "group-writable", "symlink"],
)
def test_a_damaged_or_foreign_store_is_ignored_and_the_files_are_read(kept_units, damage):
    root, store_dir = kept_units
    (path,) = list(store_dir.glob("*.json"))
    text = path.read_text()
    if damage == "garbage":
        path.write_bytes(b"\x00\xff{[" * 100)
    elif damage == "not-an-object":
        path.write_text("[1, 2, 3]")
    elif damage == "other-format":
        path.write_text(text.replace('"format":%d' % proofs_module.FORMAT, '"format":999'))
    elif damage == "wrong-types":
        # Every record's integrity a number, its problem a list: each one a miss, never a result.
        import json

        head, units, files = (json.loads(line) for line in text.splitlines())
        for record in files["files"].values():
            record[6], record[7] = 1, ["x"]
        for record in units["units"].values():
            record[4][12] = ["a", 1]  # the details, flattened: a number where a text goes
        details = head["listing"][2][len(proofs_module._ENTRY_SCALARS) + 2 + 12]  # the details column (indexes)
        details[0] = ["a", 1]  # a list where an index goes
        path.write_text("\n".join(json.dumps(part) for part in (head, units, files)))
    elif damage == "group-writable":
        path.chmod(0o664)
    else:
        elsewhere = store_dir / "elsewhere.data"
        path.rename(elsewhere)
        path.symlink_to(elsewhere)
    cut_in_half(root / "checkpoint-1000" / "scheduler.pt")  # a change only a read finds
    store = fresh_store(root, store_dir)
    entries = by_name(scan(root, store))
    assert store.hits == store.unit_hits == store.listing_hits == 0
    assert entries["checkpoint-1000"].integrity == "truncated" and entries["checkpoint-500"].integrity == "ok"


def test_listings_keep_proofs_under_xdg_cache_home_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cache_home() == str(tmp_path / "cache" / "opsconsole" / "proofs")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_home() == str(tmp_path / "home" / ".cache" / "opsconsole" / "proofs")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "run"
    write_hf_layout(root, steps=(500,), best=500)
    listing = scan_directory(str(root), LOCAL, cache=ResultCache(), crc_cache=ResultCache())
    assert listing.entries[0].integrity == "ok"  # files seconds old: nothing kept yet, nothing broken either


# --- rescans with the caches kept (the console's refresh) ----------------------------------------


def test_a_rescan_with_the_caches_kept_sees_every_change(tmp_path, monkeypatch):
    """The rescan of an unchanged directory reuses its last listing; any change in a stat it depends on is seen."""
    monkeypatch.setattr(scan_module, "SETTLE_S", RACY_S)
    write_hf_layout(tmp_path, steps=(500, 1000), best=500)
    age_tree(tmp_path)
    wait_for_sync(lambda: ctimes_older_than(tmp_path, RACY_S), "the files' ctimes past the racy margin", timeout=10)
    cache, crc_cache = ResultCache(), ResultCache()

    def rescan():
        return by_name(scan_directory(str(tmp_path), cache=cache, crc_cache=crc_cache, keep_proofs=False))

    rescan()  # (the first read of a file may set its access time, which is part of its stat)
    first = rescan()
    again = rescan()
    assert again["checkpoint-1000"] is first["checkpoint-1000"]  # nothing changed: the same records
    cut_in_half(tmp_path / "checkpoint-1000" / "scheduler.pt")
    entries = rescan()
    assert entries["checkpoint-1000"].integrity == "truncated" and entries["checkpoint-500"].latest
    (tmp_path / "checkpoint-1500").mkdir()
    (tmp_path / "checkpoint-1500" / "trainer_state.json").write_text('{"global_step": 1500}')
    assert "checkpoint-1500" in rescan()
    (tmp_path / "latest").symlink_to(tmp_path / "checkpoint-500")
    assert any("latest links to it" in why for why in rescan()["checkpoint-500"].protections)
    # A full CRC check recorded after the listing shows in the next one.
    entry = rescan()["checkpoint-500"]
    crc_cache.put(
        "local", entry.path, (entry.size_bytes, entry.mtime), zipmeta.CrcResult("corrupt", "CRC mismatch", 0, 0)
    )
    assert rescan()["checkpoint-500"].integrity == "corrupt"


def test_a_rescan_sees_a_member_rewritten_to_the_same_size_and_mtime_within_the_same_second(tmp_path, monkeypatch):
    """A member damaged in place, its size kept and its mtime set back, in the same second as its last
    change: only its ctime in nanoseconds differs (an os.stat_result compares its times in whole
    seconds), and that must be enough for the rescan with the caches kept to read it again."""
    monkeypatch.setattr(scan_module, "SETTLE_S", 0.0)  # results kept however recent: the nanoseconds alone
    write_hf_layout(tmp_path, steps=(500, 1000), best=500)
    age_tree(tmp_path)
    cache, crc_cache = ResultCache(), ResultCache()

    def rescan():
        return by_name(scan_directory(str(tmp_path), cache=cache, crc_cache=crc_cache, keep_proofs=False))

    weights = tmp_path / "checkpoint-1000" / "model.safetensors"
    sound = weights.read_bytes()
    rescan()  # (the first read of a file may set its access time, which is part of its stat)
    for _ in range(50):  # until the listing and the damage fall in one second (a loaded machine may need tries)
        wait_for_sync(lambda: time.time() % 1.0 < 0.3, "the start of a second", timeout=5)
        st = weights.stat()
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))  # the ctime now: the listing below reads it
        changed = weights.stat().st_ctime_ns
        assert rescan()["checkpoint-1000"].integrity == "ok"
        data = bytearray(sound)
        data[8:16] = b"not json"  # the header's first bytes: no JSON object any more
        with open(weights, "r+b") as out:  # in place: the same inode
            out.write(bytes(data))
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
        damaged = weights.stat()
        assert (damaged.st_size, damaged.st_mtime_ns, damaged.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
        if damaged.st_ctime_ns // 10**9 == changed // 10**9:
            break
        with open(weights, "r+b") as out:  # the second turned: sound again, and another try
            out.write(sound)
    else:
        pytest.fail("no listing and damage within one second in 50 tries")
    entries = rescan()
    entry = entries["checkpoint-1000"]
    assert entry.integrity == "corrupt" and "model.safetensors" in entry.problem
    assert entries["checkpoint-500"].latest and not entry.latest  # never the newest good one


@pytest.mark.parametrize("place", ["symlink", "others-writable"])
def test_proofs_are_written_only_to_a_directory_of_ones_own_and_never_prune_other_files(kept_units, tmp_path, place):
    """The proofs directory a symlink (planted in a shared cache directory, say) or writable by others:
    nothing is written there, and no file that is not a store (a hex name) is ever pruned from it."""
    root, _ = kept_units
    data = tmp_path / "data"
    data.mkdir()
    for number in range(300):  # more than MAX_STORES: the prune would go for the oldest of them
        record = data / ("record-%03d.json" % number)
        record.write_text("{}")
        os.utime(record, (1e9 + number, 1e9 + number))
    if place == "symlink":
        store_dir = tmp_path / "cache" / "proofs"
        store_dir.parent.mkdir()
        store_dir.symlink_to(data)
    else:
        store_dir = data
        data.chmod(0o777)
    store = ProofStore("local", str(root), str(store_dir), racy_s=RACY_S)
    scan(root, store)
    store.flush()
    assert store.stored == 6  # proved and meant to be kept, but not in that directory
    assert sorted(p.name for p in data.iterdir()) == ["record-%03d.json" % n for n in range(300)]


def test_the_store_files_are_bounded_the_oldest_going_first(kept_units, monkeypatch):
    from opsconsole.checkpoints import proofs

    root, store_dir = kept_units
    (first,) = store_dir.glob("*.json")
    os.utime(first, (1e9, 1e9))
    (store_dir / "notes.json").write_text("{}")  # not a store's name: never pruned
    os.utime(store_dir / "notes.json", (1e9, 1e9))
    monkeypatch.setattr(proofs, "MAX_STORES", 2)
    written = []
    for node in ("node-a", "node-b"):
        store = ProofStore(node, str(root), str(store_dir), racy_s=RACY_S)
        scan(root, store)
        store.flush()
        written.append(Path(store.path).name)
    assert sorted(p.name for p in store_dir.iterdir()) == sorted(written + ["notes.json"])


class CountingFileSystem(LocalFileSystem):
    """This machine, counting the files opened for a read."""

    def __init__(self) -> None:
        self.reads = 0

    def run_reader_identified(self, path, make_reader):
        self.reads += 1
        return super().run_reader_identified(path, make_reader)

    def read_file(self, path, limit):
        self.reads += 1
        return super().read_file(path, limit)


def test_what_was_read_of_files_changed_moments_ago_is_read_again_at_the_next_rescan(tmp_path, monkeypatch):
    """git's racy-clean rule for the caches in memory too: a second change within the timestamp tick of
    the first (1 s on some file systems) would leave every stat the same, so a file changed within
    SETTLE_S of a read is read again by the next rescan; once settled, the rescan reads nothing."""
    write_hf_layout(tmp_path, steps=(500, 1000), best=500)
    cache, crc_cache = ResultCache(), ResultCache()
    fs = CountingFileSystem()

    def rescan():
        return by_name(scan_directory(str(tmp_path), fs, cache=cache, crc_cache=crc_cache, keep_proofs=False))

    monkeypatch.setattr(scan_module, "SETTLE_S", 3600.0)  # every file "changed moments ago"
    rescan()
    first_reads = fs.reads
    assert first_reads > 0 and rescan()["checkpoint-1000"].integrity == "ok"
    assert fs.reads == 2 * first_reads  # every file read again
    monkeypatch.setattr(scan_module, "SETTLE_S", 0.0)
    rescan()
    settled_reads = fs.reads
    rescan()
    assert fs.reads == settled_reads  # settled: nothing read again


def test_every_member_of_a_unit_of_many_shards_is_proved_before_it_counts_as_good(tmp_path):
    """A checkpoint-N/ of 70 weight shards besides optimizer.pt and scheduler.pt: the member cut short
    is found wherever it sorts (only the first 64 of the unit's weight and state files were checked)."""
    import torch as torch_module

    from tests.checkpoint_writers import safetensors_bytes

    for folder in write_hf_layout(tmp_path, steps=(500, 1000), best=500):
        for number in range(1, 71):
            shard = {"layer%d.weight" % number: torch_module.full((4,), float(number))}
            (folder / ("model-%05d-of-00070.safetensors" % number)).write_bytes(
                safetensors_bytes(shard, {"format": "pt"})
            )
    cut_in_half(tmp_path / "checkpoint-1000" / "optimizer.pt")
    age_tree(tmp_path)
    entries = by_name(scan(tmp_path))
    assert entries["checkpoint-1000"].integrity == "truncated" and "optimizer.pt" in entries["checkpoint-1000"].problem
    assert entries["checkpoint-500"].latest and not entries["checkpoint-1000"].latest
    # checkpoint-500 is the newest good one: it stays, and the broken one goes (not the other way round).
    assert doomed(scan(tmp_path), keep=1) == ["checkpoint-1000"]


@pytest.mark.parametrize("member", ["optimizer.pt", "scheduler.pt"])
def test_a_member_of_zero_bytes_only_is_corrupt_not_unchecked(tmp_path, member):
    """What a crash leaves of a file whose data never reached the disk: its size, all zeros. That is
    no legacy torch.save (a pickle: b'\\x80' first) and no zip; the unit is never the newest good one."""
    write_hf_layout(tmp_path, steps=(500, 1000), best=500)
    path = tmp_path / "checkpoint-1000" / member
    path.write_bytes(bytes(path.stat().st_size))
    entries = by_name(scan(tmp_path))
    assert entries["checkpoint-1000"].integrity == "corrupt" and member in entries["checkpoint-1000"].problem
    assert entries["checkpoint-500"].latest and not entries["checkpoint-1000"].latest


def test_a_store_read_as_long_as_its_fstat_says_and_one_that_grew_while_read_is_ignored(kept_units, monkeypatch):
    """The store is read for its own size (not the 16 MiB bound); more bytes than fstat gave: rewritten in place."""
    root, store_dir = kept_units
    before = by_name(scan(root))
    store = fresh_store(root, store_dir)
    assert by_name(scan(root, store)) == before and store.listing_hits == 1

    real_fstat = os.fstat
    (kept,) = list(store_dir.glob("*.json"))
    kept_inode = kept.stat().st_ino

    def shorter(fd):
        st = real_fstat(fd)
        if st.st_ino != kept_inode:
            return st  # the checkpoints' own files: as they are
        fields = list(st)
        fields[6] = st.st_size - 1  # st_size: the file grew after its fstat
        return os.stat_result(fields)

    cut_in_half(root / "checkpoint-1000" / "scheduler.pt")  # a change only a read finds
    monkeypatch.setattr(proofs_module.os, "fstat", shorter)
    store = fresh_store(root, store_dir)
    entries = by_name(scan(root, store))
    assert store.hits == store.unit_hits == store.listing_hits == 0
    assert entries["checkpoint-1000"].integrity == "truncated" and entries["checkpoint-500"].integrity == "ok"
