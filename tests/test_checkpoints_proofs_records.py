"""The records the proofs store keeps (opsconsole/checkpoints/proofs.py): one wrong value rejects the record.

A kept unit's CheckpointMeta is a flat JSON list; a kept listing is its entries' records by
column. Both are decoded without the dataclasses' __init__ after C-level type checks. Each test changes one value of a real
record (from a real HF listing, or built from real entries) to a value of another type and
asserts the record is refused (None), and that a store whose kept listing is off in any way is
passed over for the unit results and the files, listing the same.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from opsconsole.checkpoints import proofs
from opsconsole.checkpoints.cache import ResultCache
from opsconsole.checkpoints.proofs import (
    ProofStore,
    entries_from_columns,
    listing_columns,
    meta_from_record,
    record_of_entry,
    record_of_meta,
)
from opsconsole.checkpoints.records import CheckpointEntry, CheckpointMeta, StateDictSummary
from opsconsole.checkpoints.scan import scan_directory
from tests.checkpoint_writers import write_hf_layout
from tests.waiting import wait_for_sync

RACY_S = 0.05

META = CheckpointMeta(
    epoch=3,
    step=300,
    loss=0.25,
    best_loss=0.125,
    metrics=(("eval_loss", 0.25), ("eval_steps", 4)),
    top_keys=("epoch", "global_step"),
    details=(("epoch", "3.0"), ("file config.json", "818 bytes")),
    state_dict=StateDictSummary(keys=2, dtypes=(("float32", 2),), bytes=64, source="model"),
    has_optimizer=True,
    has_scheduler=False,
    tensor_count=2,
    tensor_bytes=64,
    best_checkpoint="/runs/a/checkpoint-100",
    epoch_float=3.0,
)
ENTRY = CheckpointEntry(
    path="/runs/a/checkpoint-300",
    name="checkpoint-300",
    format="hf-trainer",
    size_bytes=4096,
    mtime=1700000000.5,
    is_dir=True,
    meta=META,
    integrity="ok",
    problem=None,
    latest=True,
    best=False,
    layout="hf-trainer",
    unit="checkpoint (8 files)",
    series="checkpoint-N/",
    members=("checkpoint-300",),
    protections=("latest (the newest checkpoint-N/: what a resume loads)",),
)


def wrong_for(value):
    """A JSON value no field of `value`'s kind takes: a number for a text, a list for null, else a text."""
    if isinstance(value, str):
        return 7
    return [] if value is None else "x"


def through_json(record):
    return json.loads(json.dumps(record))


def through_store(columns):
    """Columns as a store keeps them (JSON) and decodes them (each value's type checked): None when refused."""
    return proofs.decode_columns(json.dumps(columns).encode())


def entries_of(columns, place):
    """The entries of columns gone through the store: None when the decoder or entries_from_columns refuses them."""
    decoded = through_store(columns)
    return None if decoded is None else entries_from_columns(decoded, place)


def entry_from_record(record, path, judged):
    """One entry's record decoded as the only row of a kept listing's columns (None: refused)."""
    entries = entries_of(listing_columns([record]), lambda names, is_dirs: [(path, judged)])
    return None if entries is None else entries[0]


def test_a_meta_record_round_trips_to_an_equal_meta():
    assert meta_from_record(through_json(record_of_meta(META))) == META
    assert meta_from_record(through_json(record_of_meta(CheckpointMeta()))) == CheckpointMeta()


def test_an_entry_record_round_trips_with_the_path_and_judged_given():
    judged = (("checkpoint-300/config.json", 1, 2, 818, 3, 4),)
    entry = entry_from_record(through_json(record_of_entry(ENTRY)), ENTRY.path, judged)
    assert entry == CheckpointEntry(**{**ENTRY.__dict__, "judged": judged})


@pytest.mark.parametrize("index", range(len(record_of_meta(META))))
def test_a_meta_record_with_one_value_of_a_wrong_type_is_refused(index):
    record = through_json(record_of_meta(META))
    record[index] = wrong_for(record[index])
    assert meta_from_record(record) is None


@pytest.mark.parametrize(
    "where",
    [
        "metric name",
        "metric value",
        "metric value bool",
        "top key",
        "detail",
        "odd details",
        "dtype count",
        "summary keys",
        "summary source",
        "summary length",
    ],
)
def test_a_meta_record_with_one_wrong_value_inside_a_list_is_refused(where):
    record = through_json(record_of_meta(META))
    metrics, top_keys, details, summary = record[10], record[11], record[12], record[13]
    if where == "metric name":
        metrics[2] = 5
    elif where == "metric value":
        metrics[1] = "0.25"
    elif where == "metric value bool":
        metrics[3] = True
    elif where == "top key":
        top_keys[1] = None
    elif where == "detail":
        details[3] = 818
    elif where == "odd details":
        details.append("a key without its value")
    elif where == "dtype count":
        summary[1][1] = 2.0
    elif where == "summary keys":
        summary[0] = "2"
    elif where == "summary source":
        summary[3] = None
    else:
        summary.append(1)
    assert meta_from_record(record) is None


@pytest.mark.parametrize("index", range(len(record_of_entry(ENTRY))))
def test_an_entry_record_with_one_value_of_a_wrong_type_is_refused(index):
    record = through_json(record_of_entry(ENTRY))
    record[index] = wrong_for(record[index])
    assert entry_from_record(record, ENTRY.path, ()) is None


@pytest.mark.parametrize("where", ["integrity", "member", "protection", "bool for int", "odd metrics"])
def test_an_entry_record_with_one_wrong_value_is_refused(where):
    record = through_json(record_of_entry(ENTRY))
    if where == "integrity":
        record[5] = "fine"
    elif where == "member":
        record[15] = [None]
    elif where == "protection":
        record[16] = ["best", 1]
    elif where == "bool for int":
        record[2] = True
    else:
        record[17][10] = ["eval_loss"]
    assert entry_from_record(record, ENTRY.path, ()) is None


@pytest.mark.parametrize("where", ["a column short", "a column too many", "a column too few", "not lists", "empty"])
def test_a_listing_whose_columns_are_not_one_row_per_entry_is_refused(where):
    columns = through_json(listing_columns([record_of_entry(ENTRY), record_of_entry(ENTRY)]))
    place = lambda names, is_dirs: [(ENTRY.path, ())] * len(names)  # noqa: E731
    assert len(entries_of(copy.deepcopy(columns), place)) == 2
    if where == "a column short":
        columns[20].pop()
    elif where == "a column too many":
        columns.append([1, 2])
    elif where == "a column too few":
        columns.pop()
    elif where == "not lists":
        columns[3] = {"0": 1.0, "1": 2.0}
    else:
        columns = []
    assert entries_of(columns, place) is None


def test_what_a_record_cannot_hold_is_not_kept():
    assert record_of_meta(CheckpointMeta(loss=float("nan"))) is None
    assert record_of_meta(CheckpointMeta(step=2**70)) is None
    assert record_of_meta(CheckpointMeta(unsafe_globals=("os.system",))) is None
    assert record_of_entry(CheckpointEntry(**{**ENTRY.__dict__, "is_link": True})) is None
    assert record_of_entry(CheckpointEntry(**{**ENTRY.__dict__, "crc_checked": True})) is None


# --- a kept listing on disk -------------------------------------------------------------------------


def age_tree(root: Path, hours: float = 2.0) -> None:
    for path in sorted(root.rglob("*"), key=lambda p: p.lstat().st_mtime):
        st = path.lstat()
        os.utime(path, (st.st_atime - hours * 3600, st.st_mtime - hours * 3600), follow_symlinks=False)


def scan(root: Path, store=None):
    return scan_directory(str(root), cache=ResultCache(), crc_cache=ResultCache(), proofs=store, keep_proofs=False)


@pytest.fixture
def kept_listing(tmp_path):
    root = tmp_path / "run"
    write_hf_layout(root, steps=(500, 1000), best=500)
    age_tree(root)
    wait_for_sync(
        lambda: all(time.time_ns() - p.lstat().st_ctime_ns > RACY_S * 1e9 for p in root.rglob("*")),
        "the files' ctimes past the racy margin",
        timeout=10,
    )
    store_dir = tmp_path / "proofs"
    first = ProofStore("local", str(root), str(store_dir), racy_s=RACY_S)
    scan(root, first)
    assert first.listings_stored == 1 and first.units_stored == 2
    (path,) = list(store_dir.glob("*.json"))
    return root, store_dir, path


def rewrite_listing(path: Path, change) -> None:
    head, units, files = path.read_bytes().split(b"\n")
    document = json.loads(head)
    change(document["listing"])
    path.write_bytes(b"\n".join((json.dumps(document).encode(), units, files)))


@pytest.mark.parametrize(
    "damage",
    [
        "integrity",
        "a unit twice",
        "a unit left out",
        "a unit renamed",
        "other files",
        "digest",
        "ragged",
        "not a list",
        "a table's text not a text",
        "an index past its table",
        "an index not an int",
        "a pair past the texts",
        "a summary of another shape",
        "a table left out",
    ],
)
def test_a_kept_listing_off_in_any_way_is_passed_over_and_each_unit_is_used(kept_listing, damage):
    root, store_dir, path = kept_listing
    before = {e.name: e for e in scan(root).entries}

    def change(listing):
        columns = listing[2]  # one list per field, an entry per row, then the tables their texts point into
        rows, (texts, pairs, text_tuples, pair_tuples, summaries) = (
            columns[: proofs.LISTING_ROW_COLUMNS],
            columns[proofs.LISTING_ROW_COLUMNS :],
        )
        members = len(proofs._ENTRY_SCALARS)
        if damage == "integrity":
            columns[5][0] = "fine"
        elif damage == "a unit twice":
            for column in rows:
                column[1] = copy.deepcopy(column[0])
        elif damage == "a unit left out":
            for column in rows:
                del column[0]
        elif damage == "a table's text not a text":
            texts[len(texts) // 2] = 7
        elif damage == "an index past its table":
            columns[members][0] = len(text_tuples)
        elif damage == "an index not an int":
            pair_tuples[0][0] = "0"
        elif damage == "a pair past the texts":
            pairs[1] = len(texts)
        elif damage == "a summary of another shape":
            summaries[0] = summaries[0][:3]
        elif damage == "a table left out":
            del columns[-1]
        elif damage == "a unit renamed":
            columns[0][0] = "checkpoint-9999"
        elif damage == "other files":
            listing[1] += 1
        elif damage == "digest":
            listing[0] = "0" * len(listing[0])
        elif damage == "ragged":
            del columns[7][0]
        else:
            listing[2] = {"names": columns[0]}

    rewrite_listing(path, change)
    store = ProofStore("local", str(root), str(store_dir), racy_s=RACY_S)
    after = {e.name: e for e in scan(root, store).entries}
    assert store.listing_hits == 0 and store.unit_hits == 2
    assert after == before


def test_a_kept_listing_is_not_used_when_a_crc_result_of_this_process_could_change_an_entry(kept_listing):
    root, store_dir, _ = kept_listing
    crc_cache = ResultCache()
    crc_cache.put("local", "/elsewhere/checkpoint_epoch_1.pt", (1, 1.0), "a CRC result")
    store = ProofStore("local", str(root), str(store_dir), racy_s=RACY_S)
    scan_directory(str(root), cache=ResultCache(), crc_cache=crc_cache, proofs=store, keep_proofs=False)
    assert store.listing_hits == 0 and store.unit_hits == 2


def test_a_listing_with_a_file_changed_moments_ago_is_not_kept(tmp_path):
    root = tmp_path / "run"
    write_hf_layout(root, steps=(500,), best=500)
    store = ProofStore("local", str(root), str(tmp_path / "proofs"), racy_s=3600)
    scan(root, store)
    assert store.listings_stored == 0


def test_a_listing_that_could_not_read_a_file_is_not_kept(kept_listing, tmp_path):
    """A read that failed may pass (EACCES fixed, EIO): the listing made without it is not kept on disk."""
    if os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    root, store_dir, path = kept_listing
    path.unlink()
    (root / "checkpoint-1000" / "optimizer.pt").chmod(0)
    time.sleep(RACY_S * 2)
    store = ProofStore("local", str(root), str(store_dir), racy_s=RACY_S)
    entries = {e.name: e for e in scan(root, store).entries}
    assert "optimizer.pt" in (entries["checkpoint-1000"].problem or "")
    assert store.listings_stored == 0


def test_the_code_stamp_is_part_of_what_a_kept_listing_and_a_kept_unit_are_for(kept_listing, monkeypatch):
    """A listing or a unit's result kept by other code (an upgrade that judges a unit differently: an
    accelerate save without random_states_N.pkl was ok, now incomplete) is not this code's: read again."""
    from opsconsole.checkpoints import scan as scan_module

    root, store_dir, _ = kept_listing
    before = {e.name: e for e in scan(root).entries}
    monkeypatch.setattr(scan_module, "_code_stamp", lambda: "other code")
    store = ProofStore("local", str(root), str(store_dir), racy_s=RACY_S)
    after = {e.name: e for e in scan(root, store).entries}
    assert store.listing_hits == 0 and store.unit_hits == 0 and store.units_stored == 2
    assert after == before
    assert proofs.FORMAT == 4  # (3 to 4: the kept listing's tables; the code stamp needs no bump of it)


def test_a_rescan_sees_a_directory_under_checkpoints_become_a_save_state(tmp_path, monkeypatch):
    """accelerate makes checkpoints/checkpoint_N/ before it writes into it: listed empty, it is no unit;
    once written it is one, though no stat of the project's own entries changed (checkpoints/ keeps
    its mtime). Neither the rescan nor a new process with the kept listing misses it."""
    from opsconsole.checkpoints import scan as scan_module
    from tests.test_checkpoints_layouts import write_save_state

    monkeypatch.setattr(scan_module, "SETTLE_S", RACY_S)
    project = tmp_path / "project"
    write_save_state(project / "checkpoints" / "checkpoint_0", 0)
    (project / "checkpoints" / "checkpoint_1").mkdir()
    age_tree(project)
    checkpoints_mtime = (project / "checkpoints").stat().st_mtime_ns
    time.sleep(RACY_S * 2)
    cache, crc_cache = ResultCache(), ResultCache()
    store_dir = tmp_path / "proofs"

    def rescan():
        store = ProofStore("local", str(project), str(store_dir), racy_s=RACY_S)
        listing = scan_directory(str(project), cache=cache, crc_cache=crc_cache, proofs=store)
        return sorted(e.name for e in listing.entries), store

    assert rescan()[0] == ["checkpoints/checkpoint_0"]
    assert rescan()[0] == ["checkpoints/checkpoint_0"]
    for path in (project / "checkpoints" / "checkpoint_0").iterdir():
        shutil.copy2(path, project / "checkpoints" / "checkpoint_1" / path.name)
    assert (project / "checkpoints").stat().st_mtime_ns == checkpoints_mtime  # nothing added in checkpoints/
    time.sleep(RACY_S * 2)
    assert rescan()[0] == ["checkpoints/checkpoint_0", "checkpoints/checkpoint_1"]
    cache, crc_cache = ResultCache(), ResultCache()  # a new process: only the kept listing
    names, store = rescan()
    assert names == ["checkpoints/checkpoint_0", "checkpoints/checkpoint_1"]
