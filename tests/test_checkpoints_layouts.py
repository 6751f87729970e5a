"""Layouts as units: each library's documented names and files, listed as that library's checkpoints, and
the retention plan over them. Every defect of issue 13 that the layouts cause is a regression test here.

Files whose content matters are real (torch.save, dcp.save, safetensors written by spec); the rest use
the names each library writes (HF Trainer, accelerate save_state, DeepSpeed, Megatron, torchtitan).
"""

from __future__ import annotations

import os
import time
import zipfile
from pathlib import Path

import pytest
import torch

from opsconsole.checkpoints import formats, layouts, zipmeta
from opsconsole.checkpoints.cache import ResultCache
from opsconsole.checkpoints.records import (
    LAYOUT_ACCELERATE,
    LAYOUT_DCP,
    LAYOUT_DEEPSPEED,
    LAYOUT_HF_CHECKPOINT,
    LAYOUT_HF_FINAL,
    LAYOUT_LIGHTNING,
    LAYOUT_MEGATRON,
    LAYOUT_SHARDED,
    LAYOUT_TORCHTITAN,
    CheckpointEntry,
    CheckpointMeta,
)
from opsconsole.checkpoints.retention import plan_retention
from opsconsole.checkpoints.scan import scan_directory
from tests.checkpoint_writers import safetensors_bytes, small_model, write_hf_layout

HOUR = 3600.0


def scan(root: Path):
    return scan_directory(str(root), cache=ResultCache(), crc_cache=ResultCache())


def by_name(listing):
    return {e.name: e for e in listing.entries}


def age_tree(root: Path, hours: float = 2.0) -> None:
    """Every mtime under root moved back `hours`, order kept (older than min_age)."""
    for path in sorted(root.rglob("*"), key=lambda p: p.lstat().st_mtime):
        st = path.lstat()
        os.utime(path, (st.st_atime - hours * HOUR, st.st_mtime - hours * HOUR), follow_symlinks=False)


def plan_of(root: Path, keep: int):
    listing = scan(root)
    return listing, plan_retention(listing.entries, keep=keep, min_age=600, now=time.time(), root=str(root))


def doomed(plan):
    return sorted(item.name for item in plan.items if item.delete)


def tiny_weights() -> dict:
    return {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.zeros(3)}


# --- pure: names to units --------------------------------------------------------------------------

DIR_KINDS = [
    # (directory name, names inside, layout, series; None: not a checkpoint)
    (
        "checkpoint-500",
        {"trainer_state.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth"},
        LAYOUT_HF_CHECKPOINT,
        "checkpoint-N/",
    ),
    (
        "checkpoint-500",
        {"model.safetensors", "optimizer.pt"},
        LAYOUT_HF_CHECKPOINT,
        "checkpoint-N/",
    ),  # trainer_state not yet written
    ("checkpoint-500", {"notes.txt"}, None, None),
    (
        "checkpoint_3",
        {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"},
        LAYOUT_ACCELERATE,
        "checkpoint_N/",
    ),
    ("my_state", {"pytorch_model.bin", "optimizer.bin", "random_states_0.pkl"}, LAYOUT_ACCELERATE, None),
    (
        "global_step200",
        {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"},
        LAYOUT_DEEPSPEED,
        "global_stepN/",
    ),
    (
        "global_step200",
        {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt"},
        LAYOUT_DEEPSPEED,
        "global_stepN/",
    ),
    ("iter_0000100", {"mp_rank_00"}, LAYOUT_MEGATRON, "iter_N/"),
    ("iter_0000100", {"mp_rank_00_000", "mp_rank_01_000"}, LAYOUT_MEGATRON, "iter_N/"),
    ("iter_0000100", {".metadata", "__0_0.distcp", "common.pt", "metadata.json"}, LAYOUT_MEGATRON, "iter_N/"),
    ("step-1000", {".metadata", "__0_0.distcp", "__1_0.distcp"}, LAYOUT_TORCHTITAN, "step-N/"),
    ("step_40", {".metadata", "__0_0.distcp"}, LAYOUT_DCP, "step_N/"),
    ("step_40", {"__0_0.distcp"}, LAYOUT_DCP, "step_N/"),  # shards without .metadata: still that save
    ("whatever", {".metadata", "__0_0.distcp"}, LAYOUT_DCP, None),
    ("runs", {"events.out.tfevents.1"}, None, None),
    ("logs", {"train.log"}, None, None),
]


@pytest.mark.parametrize("name, names, layout, series", DIR_KINDS, ids=["%s:%s" % (c[0], len(c[1])) for c in DIR_KINDS])
def test_directory_kinds(name, names, layout, series):
    kind = layouts.dir_kind(name, names)
    if layout is None:
        assert kind is None
        return
    assert kind is not None and kind.layout == layout
    assert layouts.dir_series(name) == series


FILE_SERIES = [
    ("checkpoint_epoch_7.pt", "checkpoint-manager", "checkpoint_epoch_N.pt"),
    ("checkpoint_best.pt", "checkpoint-manager", None),
    ("checkpoint_latest.pt", "checkpoint-manager", None),
    ("run_step_1200.pt", "numbered-files", "run_step_N.pt"),
    ("model_epoch3.pth", "numbered-files", "model_epochN.pth"),
    ("epoch=3-step=300.ckpt", "lightning", None),  # decided by the callback state, not the name
    ("weights.pth", "file", None),
    ("pytorch_model.bin", "file", None),
    ("model.safetensors", "file", None),
]


@pytest.mark.parametrize("name, layout, series", FILE_SERIES, ids=[c[0] for c in FILE_SERIES])
def test_file_series_by_name(name, layout, series):
    assert layouts.file_series(name) == (layout, series)


def test_hf_output_top_files_are_one_final_model_and_companions_alone_are_nothing():
    names = [
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "training_args.bin",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "README.md",
        "all_results.json",
    ]
    groups, others = layouts.group_top_files(names)
    assert [(g.layout, g.name) for g in groups] == [(LAYOUT_HF_FINAL, "model.safetensors")]
    assert set(groups[0].members) == set(names) - {"README.md", "all_results.json"}
    assert groups[0].unmanaged and "never a deletion candidate" in groups[0].unmanaged
    assert set(others) == {"README.md", "all_results.json"}
    # Beside checkpoint-N/ without save_model(): training_args.bin alone is no checkpoint (it was kept as "newest").
    groups, others = layouts.group_top_files(["training_args.bin", "config.json"])
    assert groups == [] and set(others) == {"training_args.bin", "config.json"}


def test_sharded_safetensors_index_is_one_unit():
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    groups, others = layouts.group_top_files(names, {"model.safetensors.index.json": names[:2]})
    assert len(groups) == 1 and groups[0].layout == LAYOUT_SHARDED and set(groups[0].members) == set(names)
    groups, _ = layouts.group_top_files(names[1:], {"model.safetensors.index.json": names[:2]})
    assert groups[0].missing == ("model-00001-of-00002.safetensors",)


@pytest.mark.parametrize(
    "text, tag", [(b"global_step200\n", "global_step200"), (b"../etc", None), (b"", None), (b"a\nb", None)]
)
def test_deepspeed_latest_tag(text, tag):
    assert layouts.deepspeed_latest_tag(text) == tag


@pytest.mark.parametrize(
    "text, name", [(b"200\n", "iter_0000200"), (b"release", "release"), (b"x", None), (b"9" * 40, None)]
)
def test_megatron_latest(text, name):
    assert layouts.megatron_latest_dir(text) == name


# --- HF Trainer ----------------------------------------------------------------------------------------


def write_hf_output(root: Path) -> None:
    """Trainer output after save_model(): checkpoint-N/ dirs and the final model's files at the top."""
    write_hf_layout(root, steps=(500, 1000, 1500), best=500)
    (root / "model.safetensors").write_bytes(safetensors_bytes(tiny_weights(), {"format": "pt"}))
    (root / "config.json").write_text('{"model_type": "gpt2"}')
    torch.save({"output_dir": str(root)}, root / "training_args.bin")  # small: it was kept as "newest"
    (root / "tokenizer.json").write_text("{}")
    age_tree(root)


def test_hf_output_keep1_keeps_the_final_model_best_and_newest(tmp_path):
    # Issue 13: --keep 1 kept training_args.bin as "newest" and deleted model.safetensors and the newest checkpoint.
    write_hf_output(tmp_path)
    listing, plan = plan_of(tmp_path, keep=1)
    entries = by_name(listing)
    assert set(entries) == {"checkpoint-500", "checkpoint-1000", "checkpoint-1500", "model.safetensors"}
    final = entries["model.safetensors"]
    assert final.layout == LAYOUT_HF_FINAL and final.series is None and final.unit.startswith("final model")
    assert set(final.members) == {"model.safetensors", "config.json", "training_args.bin", "tokenizer.json"}
    assert final.size_bytes == sum((tmp_path / m).stat().st_size for m in final.members)
    assert entries["checkpoint-500"].best and entries["checkpoint-1500"].latest
    assert entries["checkpoint-1500"].meta.epoch_float == 3.0
    assert doomed(plan) == ["checkpoint-1000"]
    item = next(i for i in plan.items if i.delete)
    assert item.members == ("checkpoint-1000",) and item.is_dir and item.series == "checkpoint-N/"
    assert plan.to_json()["plan"][0]["members"]


def test_pointed_at_one_hf_checkpoint_lists_one_unit_and_deletes_nothing(tmp_path):
    # Issue 13: the files inside checkpoint-N/ were separate checkpoints; the model and optimizer were deleted.
    write_hf_output(tmp_path)
    one = tmp_path / "checkpoint-1000"
    listing, plan = plan_of(one, keep=0)
    assert [e.path for e in listing.entries] == [str(one)]
    entry = listing.entries[0]
    assert entry.layout == LAYOUT_HF_CHECKPOINT and entry.meta.step == 1000 and entry.integrity == "ok"
    assert entry.series is None and "itself one checkpoint" in entry.unmanaged
    assert doomed(plan) == []


def test_hf_checkpoint_without_trainer_state_is_an_incomplete_save(tmp_path):
    write_hf_layout(tmp_path, steps=(500, 1000), best=500)
    (tmp_path / "checkpoint-1000" / "trainer_state.json").unlink()
    age_tree(tmp_path)
    listing, plan = plan_of(tmp_path, keep=1)
    entry = by_name(listing)["checkpoint-1000"]
    assert entry.integrity == "truncated" and "trainer_state.json" in entry.problem
    assert by_name(listing)["checkpoint-500"].latest  # the newest sound one is what a resume loads
    assert doomed(plan) == ["checkpoint-1000"]  # broken and old; 500 keeps the one place


def test_unreadable_trainer_state_is_kept_not_corrupt(tmp_path):
    write_hf_layout(tmp_path, steps=(500, 1000, 1500), best=1500)
    (tmp_path / "checkpoint-500" / "trainer_state.json").write_text("{not json")
    age_tree(tmp_path)
    listing, plan = plan_of(tmp_path, keep=1)
    entry = by_name(listing)["checkpoint-500"]
    assert entry.integrity == "ok" and entry.unreadable and "not JSON" in entry.unreadable
    reasons = {i.name: i.reasons for i in plan.items}
    assert any(r.startswith("could not read") for r in reasons["checkpoint-500"])
    assert doomed(plan) == ["checkpoint-1000"]


# --- accelerate -------------------------------------------------------------------------------------------


def write_save_state(folder: Path, seed: int) -> None:
    """What Accelerator.save_state writes for one model, optimizer and scheduler."""
    folder.mkdir(parents=True)
    model, optimizer, scheduler = small_model()
    (folder / "model.safetensors").write_bytes(
        safetensors_bytes({k: v.detach() for k, v in model.state_dict().items()}, {"format": "pt"})
    )
    torch.save(optimizer.state_dict(), folder / "optimizer.bin")
    torch.save(scheduler.state_dict(), folder / "scheduler.bin")
    torch.save({"random_state": seed}, folder / "random_states_0.pkl")


def test_accelerate_automatic_naming_is_found_from_the_project_and_from_checkpoints(tmp_path):
    # Issue 13: checkpoints/checkpoint_N/ was not found at all.
    project = tmp_path / "project"
    for i in range(3):
        write_save_state(project / "checkpoints" / ("checkpoint_%d" % i), i)
    age_tree(project)
    from_project = by_name(scan(project))
    assert set(from_project) == {"checkpoints/checkpoint_%d" % i for i in range(3)}
    assert all(e.layout == LAYOUT_ACCELERATE and e.integrity == "ok" for e in from_project.values())
    _, plan = plan_of(project, keep=0)
    assert doomed(plan) == []  # managed from checkpoints/ itself, said so
    assert all("clean up that directory" in i.reason for i in plan.items)
    listing, plan = plan_of(project / "checkpoints", keep=1)
    assert by_name(listing)["checkpoint_2"].latest and not any(e.best for e in listing.entries)
    assert doomed(plan) == ["checkpoint_0", "checkpoint_1"]


def test_pointed_at_a_save_state_dir_lists_one_unit(tmp_path):
    folder = tmp_path / "state"
    write_save_state(folder, 0)
    age_tree(folder)
    listing, plan = plan_of(folder, keep=0)
    assert len(listing.entries) == 1 and listing.entries[0].layout == LAYOUT_ACCELERATE
    assert listing.entries[0].meta.has_optimizer and doomed(plan) == []


# --- Lightning ------------------------------------------------------------------------------------------

CALLBACK_KEY = "ModelCheckpoint{'monitor': 'val_acc', 'mode': 'max', 'every_n_train_steps': 0, 'every_n_epochs': 1, 'train_time_interval': None}"


def lightning_ckpt(path: Path, epoch: int, step: int, best: str, top_k: dict, last: str) -> None:
    """A .ckpt shaped as Lightning 2.x saves it, with ModelCheckpoint's state (monitor val_acc, mode max)."""
    model, optimizer, _ = small_model()
    torch.save(
        {
            "epoch": epoch,
            "global_step": step,
            "pytorch-lightning_version": "2.6.6",
            "state_dict": model.state_dict(),
            "optimizer_states": [optimizer.state_dict()],
            "lr_schedulers": [],
            "loops": {},
            "hparams_name": "kwargs",
            "hyper_parameters": {},
            "callbacks": {
                CALLBACK_KEY: {
                    "monitor": "val_acc",
                    "best_model_score": torch.tensor(top_k[best]),
                    "best_model_path": best,
                    "current_score": torch.tensor(top_k.get(str(path), 0.0)),
                    "dirpath": str(path.parent),
                    "best_k_models": {k: torch.tensor(v) for k, v in top_k.items()},
                    "kth_best_model_path": min(top_k, key=top_k.get),
                    "kth_value": torch.tensor(min(top_k.values())),
                    "last_model_path": last,
                }
            },
            "val_loss": 0.01 * epoch,  # a loss-like key: never the judge of best here
        },
        path,
    )
    time.sleep(0.01)


def write_lightning_run(root: Path) -> dict:
    """save_top_k=3 by val_acc (max) over 5 epochs; epoch 0's file left over from a crash (not in the top-k)."""
    root.mkdir(parents=True, exist_ok=True)
    scores = [0.5, 0.9, 0.6, 0.7, 0.4]
    name = lambda e: str(root / ("epoch=%d-step=%d.ckpt" % (e, (e + 1) * 10)))  # noqa: E731
    top_k: dict = {}
    for epoch, score in enumerate(scores):
        top_k[name(epoch)] = score
        if len(top_k) > 3:
            del top_k[min(top_k, key=top_k.get)]
        best = max(top_k, key=top_k.get)
        if name(epoch) in top_k or epoch == 0:
            lightning_ckpt(Path(name(epoch)), epoch, (epoch + 1) * 10, best, dict(top_k), str(root / "last.ckpt"))
        lightning_ckpt(root / "last.ckpt", epoch, (epoch + 1) * 10, best, dict(top_k), str(root / "last.ckpt"))
    age_tree(root)
    return {"best": Path(best).name, "top_k": {Path(p).name for p in top_k}}


def test_lightning_best_and_top_k_come_from_the_callback_state(tmp_path):
    # Issue 13: best was guessed from a key named like loss; monitor="val_acc", mode="max" made nothing best,
    # and cleanup deleted best_model_path and the other top-k; a regular-file last.ckpt was not latest.
    run = write_lightning_run(tmp_path)
    assert run == {
        "best": "epoch=1-step=20.ckpt",
        "top_k": {"epoch=1-step=20.ckpt", "epoch=2-step=30.ckpt", "epoch=3-step=40.ckpt"},
    }
    listing, plan = plan_of(tmp_path, keep=1)
    entries = by_name(listing)
    assert {n for n, e in entries.items() if e.best} == {run["best"]}
    assert {n for n, e in entries.items() if e.latest} == {"last.ckpt"}
    assert all(e.layout == LAYOUT_LIGHTNING for e in entries.values())
    state = entries["last.ckpt"].meta.callbacks[0]
    assert (state.monitor, state.mode, state.best_model_score) == ("val_acc", "max", pytest.approx(0.9))
    for name in run["top_k"]:
        assert any("top-k" in p for p in entries[name].protections)
    assert doomed(plan) == ["epoch=0-step=10.ckpt"]  # the leftover: in no top-k, older than the newest


def test_lightning_files_without_a_readable_callback_state_are_not_managed(tmp_path):
    model, _, _ = small_model()
    for epoch in range(3):
        torch.save(
            {"epoch": epoch, "global_step": epoch, "state_dict": model.state_dict()},
            tmp_path / ("epoch=%d-step=%d.ckpt" % (epoch, epoch)),
        )
    age_tree(tmp_path)
    listing, plan = plan_of(tmp_path, keep=0)
    assert doomed(plan) == [] and all("ModelCheckpoint" in e.unmanaged for e in listing.entries)


# --- DeepSpeed and Megatron ------------------------------------------------------------------------------


def test_deepspeed_latest_file_protects_its_tag(tmp_path):
    for step in (100, 200, 300):
        tag = tmp_path / ("global_step%d" % step)
        tag.mkdir()
        torch.save({"module": tiny_weights(), "global_steps": step}, tag / "mp_rank_00_model_states.pt")
        torch.save({"optimizer_state_dict": {}}, tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (tmp_path / "latest").write_text("global_step200")
    (tmp_path / "zero_to_fp32.py").write_text("# script\n")
    age_tree(tmp_path)
    listing, plan = plan_of(tmp_path, keep=1)
    entries = by_name(listing)
    assert set(entries) == {"global_step100", "global_step200", "global_step300"} and listing.other_files == 2
    assert entries["global_step200"].latest and not entries["global_step300"].latest
    assert all(e.layout == LAYOUT_DEEPSPEED and e.integrity == "ok" for e in entries.values())
    assert doomed(plan) == ["global_step100"]


def test_megatron_tracker_file_protects_its_iteration(tmp_path):
    for iteration in (100, 200, 300):
        rank = tmp_path / ("iter_%07d" % iteration) / "mp_rank_00"
        rank.mkdir(parents=True)
        torch.save({"model": tiny_weights(), "iteration": iteration}, rank / "model_optim_rng.pt")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("200")
    age_tree(tmp_path)
    listing, plan = plan_of(tmp_path, keep=1)
    entries = by_name(listing)
    assert entries["iter_0000200"].latest and entries["iter_0000100"].layout == LAYOUT_MEGATRON
    assert (
        entries["iter_0000100"].size_bytes
        == (tmp_path / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt").stat().st_size
    )
    assert doomed(plan) == ["iter_0000100"]
    # A cut rank file inside the iteration is seen (its zip directory).
    cut = tmp_path / "iter_0000300" / "mp_rank_00" / "model_optim_rng.pt"
    cut.write_bytes(cut.read_bytes()[:200])
    assert by_name(scan(tmp_path))["iter_0000300"].integrity == "truncated"


# --- torch.distributed.checkpoint -------------------------------------------------------------------------


def dcp_save(path: Path, step: int) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(
        {"model": {k: v + step for k, v in tiny_weights().items()}, "step": torch.tensor(step)}, checkpoint_id=str(path)
    )


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dcp_integrity_from_its_metadata(tmp_path):
    # Issue 13: a truncated shard was "unchecked" and took the newest keep slot; a save without .metadata was invisible.
    for step in (100, 200, 300, 400):
        dcp_save(tmp_path / ("step-%d" % step), step)
    shard = next((tmp_path / "step-300").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    (tmp_path / "step-400" / ".metadata").unlink()
    age_tree(tmp_path)
    listing, plan = plan_of(tmp_path, keep=1)
    entries = by_name(listing)
    assert entries["step-100"].integrity == entries["step-200"].integrity == "ok"
    assert entries["step-100"].meta.tensor_count == 3 and entries["step-100"].layout == LAYOUT_TORCHTITAN
    assert entries["step-300"].integrity == "truncated" and "records data up to" in entries["step-300"].problem
    assert entries["step-400"].integrity == "truncated" and "incomplete save" in entries["step-400"].problem
    assert entries["step-200"].latest  # the newest intact one
    assert doomed(plan) == ["step-100", "step-300", "step-400"]
    kept = next(i for i in plan.items if i.name == "step-200")
    assert kept.reasons[0].startswith("newest 1")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dcp_missing_shard_is_corrupt_and_one_dir_is_one_unit(tmp_path):
    one = tmp_path / "step-7"
    dcp_save(one, 7)
    entry = scan(one).entries[0]
    assert (entry.path, entry.integrity, entry.meta.step) == (str(one), "ok", 7)
    next(one.glob("*.distcp")).unlink()
    entry = scan(one).entries[0]
    assert entry.integrity == "corrupt" and "missing" in entry.problem


def test_dcp_metadata_that_is_not_dcp_is_unreadable_not_corrupt():
    result = formats.dcp_result(b"garbage", {"__0_0.distcp": 10})
    assert result.integrity == "unchecked" and result.unreadable.startswith("could not read .metadata")
    import pickle

    result = formats.dcp_result(pickle.dumps({"not": "metadata"}), {"__0_0.distcp": 10})
    assert result.unreadable and "not a DCP Metadata" in result.unreadable


# --- files: sharded safetensors, lone files, legacy, the read limit --------------------------------------


def test_sharded_safetensors_listed_as_one_unit_never_deleted(tmp_path):
    for i in (1, 2):
        (tmp_path / ("model-0000%d-of-00002.safetensors" % i)).write_bytes(
            safetensors_bytes({"w%d" % i: torch.ones(2)}, {})
        )
    import json

    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w1": "model-00001-of-00002.safetensors", "w2": "model-00002-of-00002.safetensors"}})
    )
    age_tree(tmp_path)
    listing, plan = plan_of(tmp_path, keep=0)
    assert len(listing.entries) == 1 and listing.entries[0].layout == LAYOUT_SHARDED
    assert listing.entries[0].meta.state_dict.keys == 2 and doomed(plan) == []
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    assert scan(tmp_path).entries[0].integrity == "corrupt"


def test_a_lone_state_dict_and_a_legacy_file_are_never_ranked(tmp_path):
    # Issue 13: a state dict with no epoch and a legacy file were ranked among the "newest N" and deleted.
    model, optimizer, scheduler = small_model()
    for epoch in range(3):
        torch.save(
            {"epoch": epoch, "model_state_dict": model.state_dict()}, tmp_path / ("checkpoint_epoch_%d.pt" % epoch)
        )
        time.sleep(0.01)
    torch.save(model.state_dict(), tmp_path / "weights.pth")
    torch.save({"epoch": 9}, tmp_path / "old_format.pt", _use_new_zipfile_serialization=False)
    age_tree(tmp_path)
    listing, plan = plan_of(tmp_path, keep=1)
    entries = by_name(listing)
    assert entries["weights.pth"].series is None and entries["old_format.pt"].series is None
    assert doomed(plan) == ["checkpoint_epoch_0.pt", "checkpoint_epoch_1.pt"]
    reasons = {i.name: i.reason for i in plan.items}
    assert reasons["weights.pth"].startswith("not managed: no epoch or step")
    assert reasons["old_format.pt"].startswith("not managed: legacy pickle")


def read_file(path: Path):
    return zipmeta.read_local(str(path), lambda size: formats.file_reader(path.name, size))


def test_data_pkl_over_the_read_limit_is_unreadable_not_corrupt(tmp_path, monkeypatch):
    # Issue 13: a data.pkl over the reader's size limit was called corrupt and deleted, though torch.load reads it.
    path = tmp_path / "checkpoint_epoch_3.pt"
    torch.save({"epoch": 3, "note": "x" * 5000}, path)
    monkeypatch.setattr(formats, "MAX_PICKLE_READ", 1000)
    result = read_file(path)
    assert result.integrity == "ok" and result.unreadable and "over the reader's" in result.unreadable
    entry = CheckpointEntry(
        path=str(path),
        name=path.name,
        format=result.format,
        size_bytes=1,
        mtime=0.0,
        meta=formats.merge_meta(result.meta, formats.meta_from_name(path.name)),
        integrity=result.integrity,
        unreadable=result.unreadable,
        series="checkpoint_epoch_N.pt",
    )
    plan = plan_retention([entry], keep=0, min_age=0, now=HOUR)
    assert not plan.items[0].delete and "over the reader's" in plan.items[0].reason


def rewrite_member(path: Path, member_suffix: str, data: bytes) -> None:
    """Replace one member's bytes (same length) in a torch zip; CRC recomputed by zipfile."""
    with zipfile.ZipFile(path) as archive:
        members = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for info, content in members:
            archive.writestr(info, data if info.filename.endswith(member_suffix) else content)


def test_an_unparsable_pickle_is_corrupt_only_when_its_crc_says_so(tmp_path):
    path = tmp_path / "checkpoint_epoch_1.pt"
    torch.save({"epoch": 1, "w": torch.ones(2)}, path)
    with zipfile.ZipFile(path) as archive:
        size = archive.getinfo(next(n for n in archive.namelist() if n.endswith("data.pkl"))).file_size
    rewrite_member(
        path, "data.pkl", b"\x80\x02" + b"\xff" * (size - 2)
    )  # CRC matches these bytes: our reader's failure
    result = read_file(path)
    assert result.integrity == "ok" and result.unreadable
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"\x80\x02\xff") + 5] ^= 0x01  # one flipped byte under the recorded CRC: proven damage
    path.write_bytes(bytes(raw))
    result = read_file(path)
    assert result.integrity == "corrupt" and "CRC mismatch" in result.problem


def test_checkpoint_manager_layout_as_today(tmp_path):
    from tests.checkpoint_writers import write_seed_layout

    write_seed_layout(tmp_path)
    listing, plan = plan_of(tmp_path, keep=2)
    entries = by_name(listing)
    assert entries["checkpoint_epoch_4.pt"].latest and entries["checkpoint_best.pt"].best
    assert (
        entries["checkpoint_epoch_0.pt"].series == "checkpoint_epoch_N.pt"
        and entries["checkpoint_best.pt"].series is None
    )
    assert doomed(plan) == ["checkpoint_epoch_0.pt", "checkpoint_epoch_1.pt", "checkpoint_epoch_2.pt"]


# --- the commands show the unit ----------------------------------------------------------------------------


def test_commands_show_layout_and_unit(tmp_path, monkeypatch, capsys):
    from opsconsole import cli

    config = tmp_path / "config.toml"
    config.write_text('[actions]\naudit_log = "%s"\n' % (tmp_path / "audit.log"))
    monkeypatch.setenv("OPSCONSOLE_CONFIG", str(config))
    root = tmp_path / "out"
    write_hf_output(root)
    assert cli.main(["checkpoints", str(root)]) == 0
    table = capsys.readouterr().out
    line = next(row for row in table.splitlines() if row.startswith("model.safetensors"))
    assert "hf-final-model" in line and "final model (4 files)" in line and "not managed" in line
    assert "checkpoint-N/" in next(row for row in table.splitlines() if row.startswith("checkpoint-1000"))
    assert cli.main(["cleanup", str(root), "--keep", "1", "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "DELETE" in next(row for row in plan.splitlines() if "checkpoint-1000" in row)
    assert "hf-final-model: final model" in next(row for row in plan.splitlines() if "model.safetensors" in row)
    assert sorted(p.name for p in root.iterdir())  # dry run: nothing went
    assert (root / "checkpoint-1000").is_dir()


def test_plan_items_carry_members_and_the_listing_json_has_units():
    entry = CheckpointEntry(
        path="/ck/checkpoint-5",
        name="checkpoint-5",
        format="hf-trainer",
        size_bytes=1,
        mtime=0.0,
        is_dir=True,
        meta=CheckpointMeta(step=5),
        series="checkpoint-N/",
        members=("checkpoint-5",),
    )
    item = plan_retention([entry], keep=0, min_age=0, now=HOUR).items[0]
    assert item.delete and item.members == ("checkpoint-5",) and item.path == "/ck/checkpoint-5"
    doc = entry.to_json()
    assert doc["members"] == ["checkpoint-5"] and doc["managed"] and doc["layout"] == "file"
