"""Reading real checkpoints: every layout, metadata without tensors, the restricted unpickler, integrity."""

from __future__ import annotations

import io
import os
import pickle
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from opsconsole.checkpoints import formats, zipmeta
from opsconsole.checkpoints.cache import ResultCache
from opsconsole.checkpoints.records import (
    FORMAT_DCP,
    FORMAT_HF,
    FORMAT_LEGACY,
    FORMAT_LIGHTNING,
    FORMAT_LINK,
    FORMAT_SAFETENSORS,
    FORMAT_TORCH,
)
from opsconsole.checkpoints.safe_unpickle import restricted_loads
from opsconsole.checkpoints.scan import scan_directory
from opsconsole.checkpoints.verify import verify_checkpoint
from tests.checkpoint_writers import (
    safetensors_bytes,
    small_model,
    write_dcp,
    write_hf_layout,
    write_lightning_layout,
    write_seed_layout,
)


def scan(root: Path, **kwargs):
    return scan_directory(str(root), cache=ResultCache(), crc_cache=ResultCache(), **kwargs)


def by_name(listing):
    return {e.name: e for e in listing.entries}


# --- the seed layout --------------------------------------------------------------------------


def test_seed_layout_lists_epochs_loss_markers_and_totals(tmp_path):
    paths = write_seed_layout(tmp_path)
    listing = scan(tmp_path)
    entries = by_name(listing)
    assert set(entries) == {"checkpoint_epoch_%d.pt" % i for i in range(5)} | {"checkpoint_best.pt"}
    # The symlink is not a row of its own: its target carries the latest marker.
    assert [e.name for e in listing.entries if e.latest] == ["checkpoint_epoch_4.pt"]
    assert [e.name for e in listing.entries if e.best] == ["checkpoint_best.pt"]
    for epoch, path in paths.items():
        entry = entries[path.name]
        saved = torch.load(path, weights_only=True)  # the truth, from torch itself
        assert entry.format == FORMAT_TORCH and entry.integrity == "ok" and entry.problem is None
        assert entry.meta.epoch == saved["epoch"] and entry.meta.loss == saved["loss"]
        assert entry.meta.best_loss == saved["best_loss"]
        assert entry.meta.timestamp == saved["timestamp"]
        assert dict(entry.meta.metrics) == saved["metrics"]
        assert entry.meta.has_optimizer is True and entry.meta.has_scheduler is True
        state = saved["model_state_dict"]
        assert entry.meta.state_dict.keys == len(state)
        assert entry.meta.state_dict.bytes == sum(t.numel() * t.element_size() for t in state.values())
        assert entry.meta.state_dict.dtypes == (("float32", len(state)),)
        with zipfile.ZipFile(path) as archive:
            data = [i for i in archive.infolist() if "/data/" in i.filename]
        assert entry.meta.tensor_count == len(data)
        assert entry.meta.tensor_bytes == sum(i.file_size for i in data)
        assert set(entry.meta.top_keys) == set(saved)
        assert entry.size_bytes == path.stat().st_size
    assert [e.name for e in listing.entries if e.lowest_loss] == ["checkpoint_best.pt", "checkpoint_epoch_1.pt"]
    assert listing.total_bytes == sum(p.stat().st_size for p in tmp_path.iterdir() if not p.is_symlink())
    st = os.statvfs(tmp_path)
    assert listing.fs_bytes == st.f_blocks * st.f_frsize
    assert abs(listing.free_bytes - st.f_bavail * st.f_frsize) < 2**30  # others write to this disk meanwhile
    # Natural order: epoch_10 would sort after epoch_9, not after epoch_1.
    assert [e.name for e in listing.entries][1:] == ["checkpoint_epoch_%d.pt" % i for i in range(5)]


def test_a_broken_best_copy_makes_the_lowest_loss_the_best(tmp_path):
    write_seed_layout(tmp_path)
    best = tmp_path / "checkpoint_best.pt"
    best.write_bytes(best.read_bytes()[:1000])  # the copy was cut short (disk full during the save)
    entries = by_name(scan(tmp_path))
    assert entries["checkpoint_best.pt"].integrity == "truncated"
    assert entries["checkpoint_epoch_1.pt"].best  # loss 0.5: kept as the best instead


def test_a_scalar_saved_as_a_tensor_is_read_from_the_zip(tmp_path):
    model, _, _ = small_model()
    path = tmp_path / "ckpt_step_70.pt"
    torch.save(
        {
            "epoch": torch.tensor(7),
            "loss": torch.tensor(0.125, dtype=torch.bfloat16),
            "metrics": {"ppl": torch.tensor(3.5, dtype=torch.float64)},
            "model": model.state_dict(),
        },
        path,
    )
    entry = by_name(scan(tmp_path))["ckpt_step_70.pt"]
    assert entry.meta.epoch == 7 and entry.meta.loss == 0.125 and entry.meta.step == 70
    assert dict(entry.meta.metrics) == {"ppl": 3.5}
    assert entry.meta.has_optimizer is False


def test_a_bare_state_dict_is_summarized(tmp_path):
    model, _, _ = small_model()
    torch.save(model.half().state_dict(), tmp_path / "weights.pth")
    entry = by_name(scan(tmp_path))["weights.pth"]
    assert entry.meta.state_dict.keys == 4 and entry.meta.state_dict.dtypes == (("float16", 4),)
    assert entry.meta.epoch is None and entry.meta.loss is None


# --- other layouts ----------------------------------------------------------------------------


def test_lightning_names_callbacks_and_last_ckpt(tmp_path):
    write_lightning_layout(tmp_path)
    entries = by_name(scan(tmp_path))
    entry = entries["epoch=1-step=200.ckpt"]
    assert entry.format == FORMAT_LIGHTNING
    assert (entry.meta.epoch, entry.meta.step) == (1, 200)
    assert entry.meta.loss == pytest.approx(0.4) and entry.meta.best_loss == pytest.approx(0.4)
    assert entry.meta.has_optimizer and entry.meta.has_scheduler
    assert entries["last.ckpt"].format == FORMAT_LIGHTNING and entries["last.ckpt"].meta.step == 300
    assert formats.lightning_fields("epoch=2-step=300-val_loss=0.25-v1.ckpt") == {
        "epoch": "2",
        "step": "300",
        "val_loss": "0.25",
    }
    assert formats.meta_from_name("epoch=2-step=300-val_loss=0.25.ckpt").loss == 0.25


def test_hf_trainer_dirs_with_trainer_state_and_best_model_checkpoint(tmp_path):
    write_hf_layout(tmp_path, steps=(500, 1000), best=500)
    (tmp_path / "runs.log").write_text("not a checkpoint\n")
    listing = scan(tmp_path)
    entries = by_name(listing)
    assert set(entries) == {"checkpoint-500", "checkpoint-1000"} and listing.other_files == 1
    newest = entries["checkpoint-1000"]
    assert newest.format == FORMAT_HF and newest.is_dir
    assert (newest.meta.epoch, newest.meta.step) == (2, 1000)
    assert newest.meta.loss == pytest.approx(0.4)  # the last eval_loss in log_history
    assert newest.meta.best_loss == 0.3 and newest.meta.has_optimizer and newest.meta.has_scheduler
    assert newest.meta.state_dict.keys == 4 and newest.integrity == "ok"
    assert entries["checkpoint-500"].best and not newest.best
    assert newest.size_bytes == sum(p.stat().st_size for p in (tmp_path / "checkpoint-1000").iterdir())


def test_safetensors_header_is_bounds_checked(tmp_path):
    tensors = {"w": torch.ones(4, 4), "b": torch.zeros(4, dtype=torch.float16)}
    data = safetensors_bytes(tensors, {"format": "pt", "step": "12"})
    (tmp_path / "model.safetensors").write_bytes(data)
    (tmp_path / "cut.safetensors").write_bytes(data[:-10])
    (tmp_path / "huge.safetensors").write_bytes(struct.pack("<Q", 2**40) + b"{}")
    (tmp_path / "overlong.safetensors").write_bytes(struct.pack("<Q", 500) + b'{"a": 1}')
    entries = by_name(scan(tmp_path))
    good = entries["model.safetensors"]
    assert good.format == FORMAT_SAFETENSORS and good.integrity == "ok" and good.meta.step == 12
    assert good.meta.state_dict.keys == 2 and good.meta.tensor_bytes == 4 * 4 * 4 + 4 * 2
    assert dict(good.meta.state_dict.dtypes) == {"float32": 1, "float16": 1}
    assert entries["cut.safetensors"].integrity == "truncated"
    assert entries["huge.safetensors"].integrity == "corrupt" and "100 MB" in entries["huge.safetensors"].problem
    assert entries["overlong.safetensors"].integrity == "truncated"


def test_dcp_directory_saved_by_torch_distributed_checkpoint(tmp_path):
    path = write_dcp(tmp_path, "step_40")
    write_dcp(tmp_path, "step_20")
    (tmp_path / "plain_dir").mkdir()
    (tmp_path / "latest").write_text("step_20\n")  # DeepSpeed-style: the tag of the newest checkpoint
    entries = by_name(scan(tmp_path))
    entry = entries["step_40"]
    assert entry.format == FORMAT_DCP and entry.is_dir and entry.meta.step == 40
    assert entries["step_20"].latest and not entry.latest
    assert entry.size_bytes == sum(p.stat().st_size for p in path.iterdir())
    assert "plain_dir" not in entries


def test_legacy_pickle_is_listed_and_never_opened(tmp_path):
    torch.save({"epoch": 1}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    entry = by_name(scan(tmp_path))["old.pt"]
    assert entry.format == FORMAT_LEGACY and entry.integrity == "unchecked"
    assert "not opened" in entry.problem and entry.meta.epoch is None


# --- the restricted unpickler -----------------------------------------------------------------


class WritesMarker:
    """Unpickling this with plain pickle would run os.system and create the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, ("touch %s" % self.marker,))


def test_a_pickle_that_would_run_code_never_does(tmp_path):
    marker = tmp_path / "PWNED"
    path = tmp_path / "checkpoint_epoch_3.pt"
    torch.save({"epoch": 3, "loss": 0.25, "payload": WritesMarker(str(marker))}, path)
    entry = by_name(scan(tmp_path))[path.name]
    assert not marker.exists()
    assert entry.meta.epoch == 3 and entry.meta.loss == 0.25
    assert entry.problem == "uses types outside the safe list: posix.system"
    assert entry.meta.unsafe_globals == ("posix.system",)
    # The same payload as a bare pickle, and through the classic getattr/eval gadgets.
    for payload in (WritesMarker(str(marker)),):
        result = restricted_loads(pickle.dumps(payload))
        assert result.unsafe_globals == ["posix.system"] and not marker.exists()
    gadget = b"cbuiltins\neval\n(Vopen(%r, 'w')\ntR." % str(marker).encode()
    assert restricted_loads(gadget).unsafe_globals == ["builtins.eval"] and not marker.exists()
    getattr_gadget = b"cbuiltins\ngetattr\n(cos\nsystem\nVtouch %s\ntR." % str(marker).encode()
    assert restricted_loads(getattr_gadget).unsafe_globals == ["builtins.getattr", "os.system"]
    assert not marker.exists()


def test_datetime_is_reported_outside_the_safe_list(tmp_path):
    import datetime

    torch.save({"epoch": 2, "saved": datetime.datetime(2026, 12, 2, 18, 0)}, tmp_path / "a.pt")
    entry = by_name(scan(tmp_path))["a.pt"]
    assert entry.problem == "uses types outside the safe list: datetime.datetime"
    assert (
        entry.meta.epoch == 2
        and ("saved", "<datetime.datetime: not loaded (outside the safe list)>") in entry.meta.details
    )


def test_a_damaged_pickle_is_an_error_value():
    for data in (b"", b"\x80\x02}q\x00(X", b"garbage that is not a pickle"):
        result = restricted_loads(data)
        assert result.error and result.value is None


# --- integrity ----------------------------------------------------------------------------------


def test_truncated_file_and_a_file_still_being_written(tmp_path):
    model, optimizer, _ = small_model()
    full = tmp_path / "src.pt"
    torch.save({"epoch": 1, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, full)
    data = full.read_bytes()
    full.unlink()
    old = tmp_path / "checkpoint_epoch_1.pt"
    old.write_bytes(data[: len(data) // 2])
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    growing = tmp_path / "checkpoint_epoch_2.pt"
    # Another process writes the first half and keeps the file open, as torch.save mid-write does.
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time\nf=open(sys.argv[1],'wb')\nf.write(sys.stdin.buffer.read(%d))\nf.flush()\n"
            "print('ready',flush=True)\nsys.stdin.buffer.readline()\nf.write(sys.stdin.buffer.read())\nf.close()"
            % (len(data) // 2),
            str(growing),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        writer.stdin.write(data[: len(data) // 2])
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == b"ready"
        cache = ResultCache()
        listing = scan_directory(str(tmp_path), cache=cache, crc_cache=ResultCache())
        entries = by_name(listing)
        assert entries[old.name].integrity == "truncated" and "still being written" not in entries[old.name].problem
        assert entries[growing.name].integrity == "truncated"
        assert "probably still being written" in entries[growing.name].problem
        from opsconsole.checkpoints.open_files import open_files_local

        assert str(growing) in open_files_local(str(tmp_path)).paths
        writer.stdin.write(b"\n" + data[len(data) // 2 :])
        writer.stdin.close()
        writer.wait(10)
        # Size and mtime changed: the cache reads it again and it is whole now.
        entries = by_name(scan_directory(str(tmp_path), cache=cache, crc_cache=ResultCache()))
        assert entries[growing.name].integrity == "ok" and entries[growing.name].meta.epoch == 1
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()


def test_full_crc_check_finds_a_flipped_byte_that_torch_load_does_not(tmp_path):
    model, _, _ = small_model()
    path = tmp_path / "model.pt"
    torch.save({"epoch": 1, "model": model.state_dict()}, path)
    entry = by_name(scan(tmp_path))["model.pt"]
    seen = []
    result = verify_checkpoint(entry, progress=lambda done, total: seen.append((done, total)), cache=ResultCache())
    assert result.integrity == "ok" and seen[-1][0] == seen[-1][1] > 0
    with zipfile.ZipFile(path) as archive:
        info = next(i for i in archive.infolist() if i.filename.endswith("/data/0"))
        header_len = 30 + len(info.filename) + len(info.extra)
    raw = bytearray(path.read_bytes())
    # The local extra field can differ from the central one: find the data by the local header.
    local_extra = struct.unpack_from("<H", raw, info.header_offset + 28)[0]
    position = info.header_offset + 30 + len(info.filename) + local_extra
    raw[position] ^= 0xFF
    stat = path.stat()
    path.write_bytes(bytes(raw))
    os.utime(path, (stat.st_atime, stat.st_mtime + 1))
    torch.load(path, weights_only=True)  # torch does not notice
    entry = by_name(scan(tmp_path))["model.pt"]
    assert entry.integrity == "ok"  # the quick check cannot see it either
    result = verify_checkpoint(entry, cache=ResultCache())
    assert result.integrity == "corrupt" and "data/0" in result.problem and header_len > 0


def test_no_crc_where_torch_wrote_none(tmp_path):
    torch.serialization.set_crc32_options(False)
    try:
        torch.save({"epoch": 1, "w": torch.ones(3)}, tmp_path / "nocrc.pt")
    finally:
        torch.serialization.set_crc32_options(True)
    entry = by_name(scan(tmp_path))["nocrc.pt"]
    assert entry.integrity == "no_crc" and entry.meta.crc_recorded is False
    assert verify_checkpoint(entry, cache=ResultCache()).integrity == "no_crc"


def test_garbage_empty_and_zero_files_are_values_not_crashes(tmp_path):
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "zeros.pt").write_bytes(b"\x00" * 4096)
    (tmp_path / "text.bin").write_bytes(b"hello world, not a checkpoint")
    (tmp_path / "fake.pt").write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    entries = by_name(scan(tmp_path))
    assert entries["empty.pt"].integrity == "truncated"
    assert entries["zeros.pt"].integrity == "truncated"
    assert entries["text.bin"].format == "unknown"
    assert entries["fake.pt"].integrity == "truncated" and "no zip end record" in entries["fake.pt"].problem


def test_symlinks_out_of_the_root_and_dangling_are_listed_as_links(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    torch.save({"epoch": 9}, outside / "elsewhere.pt")
    root = tmp_path / "ckpts"
    root.mkdir()
    torch.save({"epoch": 1}, root / "checkpoint_epoch_1.pt")
    (root / "checkpoint_epoch_9.pt").symlink_to(outside / "elsewhere.pt")
    (root / "gone.pt").symlink_to(root / "missing.pt")
    (root / "latest").symlink_to("checkpoint_epoch_1.pt")
    entries = by_name(scan(root))
    assert (
        entries["checkpoint_epoch_9.pt"].format == FORMAT_LINK and "outside" in entries["checkpoint_epoch_9.pt"].problem
    )
    assert entries["gone.pt"].format == FORMAT_LINK and "dangling" in entries["gone.pt"].problem
    assert entries["checkpoint_epoch_1.pt"].latest


def test_unchanged_files_come_from_the_cache(tmp_path, monkeypatch):
    # Files seconds old are read again until SETTLE_S has passed (scan.settled): not what this test is about.
    monkeypatch.setattr("opsconsole.checkpoints.scan.SETTLE_S", 0.0)
    write_seed_layout(tmp_path, losses=(0.5, 0.4))
    cache = ResultCache()
    first = scan_directory(str(tmp_path), cache=cache, crc_cache=ResultCache())
    misses = cache.misses
    second = scan_directory(str(tmp_path), cache=cache, crc_cache=ResultCache())
    assert cache.misses == misses and cache.hits >= 3
    assert [e.meta for e in first.entries] == [e.meta for e in second.entries]


def test_optimizer_none_is_absent_and_a_scheduler_dict_is_present(tmp_path):
    torch.save(
        {"step": 1200, "loss": 1.5, "optimizer": None, "scheduler": {"last_epoch": 3}}, tmp_path / "run_step_1200.pt"
    )
    entry = by_name(scan(tmp_path))["run_step_1200.pt"]
    assert entry.meta.step == 1200 and entry.meta.loss == 1.5
    assert entry.meta.has_optimizer is False and entry.meta.has_scheduler is True


def test_zip64_directory_entries_parse():
    # zipfile writes zip64 records when forced: the directory reader must follow them.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", allowZip64=True) as archive:
        with archive.open("a/data.pkl", "w", force_zip64=True) as member:
            member.write(pickle.dumps({"epoch": 5}, protocol=2))
    data = buffer.getvalue()
    reader = zipmeta.directory_reader(len(data))
    request = next(reader)
    try:
        while True:
            request = reader.send(data[request[0] : request[0] + request[1]])
    except StopIteration as stop:
        directory = stop.value
    assert directory.find("data.pkl") is not None


def test_a_pickle_of_shared_lists_does_not_explode():
    # l1 = [l0, l0], l2 = [l1, l1], ... l60: a few hundred bytes, 2**60 paths when walked naively.
    import pickletools

    level = []
    for _ in range(60):
        level = [level, level]
    data = pickletools.optimize(pickle.dumps({"epoch": 1, "tree": level, "note": "x" * 10**6}, protocol=2))
    assert len(data) < 2 * 10**6
    result = restricted_loads(data)
    from opsconsole.checkpoints.metadata import metadata_from_tree

    meta = metadata_from_tree(result.value)
    assert meta.epoch == 1 and dict(meta.details)["tree"] == "list: 2 items"


def test_a_kept_crc_result_never_makes_what_a_listing_reads_now_better(tmp_path):
    """A full CRC check's result is kept by size and mtime. A file damaged in place since, with both
    kept (its mtime set back), must be listed as what its read finds now, not as the kept 'ok'."""
    path = tmp_path / "model.pt"
    torch.save({"epoch": 1, "w": torch.ones(64)}, path)
    crc_cache = ResultCache()
    entry = by_name(scan_directory(str(tmp_path), cache=ResultCache(), crc_cache=crc_cache))["model.pt"]
    assert verify_checkpoint(entry, cache=crc_cache).integrity == "ok"
    st = path.stat()
    with open(path, "r+b") as out:  # the end of central directory record's signature: no zip end any more
        out.seek(st.st_size - 22)
        out.write(b"XXXX")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    fresh = by_name(scan(tmp_path))["model.pt"]
    assert fresh.integrity in ("corrupt", "truncated")
    listed = by_name(scan_directory(str(tmp_path), cache=ResultCache(), crc_cache=crc_cache))["model.pt"]
    assert listed.integrity == fresh.integrity, (listed.integrity, listed.problem)
