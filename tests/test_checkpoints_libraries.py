"""Acceptance tests: checkpoints as the training libraries write them, and cleanup checked by their own loaders.

For each layout (Lightning, HF Trainer, accelerate, DCP; DeepSpeed and Megatron from their
documented names): `opsconsole checkpoints DIR --json` lists the units the library made, with best
and latest where the library recorded them; then `opsconsole cleanup DIR --keep 1 --yes` runs on an
aged copy of the artifact and what must remain is loaded with the library's own loader
(`from_pretrained`, `Trainer.train(resume_from_checkpoint=...)`, `Accelerator.load_state`,
`dcp.load`, `LightningModule.load_from_checkpoint`). Pointed at one unit (a `checkpoint-N/`, a
`save_state` directory, a DCP directory), cleanup deletes nothing inside it.

The artifacts are built once per session by tests/checkpoint_libraries.py. A copy is aged by an
hour (every mtime shifted, order kept) so the default min_age does not protect it, and the command
runs exactly as an operator types it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Set

import pytest
import torch

from opsconsole import cli
from opsconsole.commands.checkpoints import size_text
from tests.checkpoint_libraries import (  # noqa: F401  (session fixtures)
    ACCELERATE_SAVES,
    DCP_COMPLETE,
    DCP_NO_METADATA,
    DCP_TRUNCATED,
    HF_BEST_STEP,
    HF_STEPS,
    accelerate_load,
    accelerate_run,
    copy_artifact,
    dcp_load,
    dcp_run,
    hf_resume_one_step,
    hf_run,
    hf_second_run,
    hf_training_args,
    library_root,
    lightning_module_class,
    lightning_run,
    make_accelerator,
    one_thread,
    pause,
    reset_accelerate_state,
    tiny_gpt2_config,
    token_rows,
    tree,
    write_deepspeed_layout,
    write_megatron_layout,
)

BROKEN = {"truncated", "corrupt"}
AGE_S = 3600.0


# --- running the commands -----------------------------------------------------------------------


@pytest.fixture
def console(tmp_path, monkeypatch, capsys):
    """The real commands, in-process, with a config of this test's own (its audit log in tmp_path)."""
    config = tmp_path / "config.toml"
    config.write_text('[actions]\naudit_log = "%s"\n' % (tmp_path / "audit.log"))
    monkeypatch.setenv("OPSCONSOLE_CONFIG", str(config))
    return Console(capsys)


class Console:
    def __init__(self, capsys):
        self.capsys = capsys

    def run(self, *argv: str):
        self.capsys.readouterr()
        code = cli.main(list(argv))
        captured = self.capsys.readouterr()
        return code, captured.out, captured.err

    def listing(self, directory: Path) -> dict:
        code, out, err = self.run("checkpoints", str(directory), "--json")
        assert code == 0, err
        return json.loads(out)

    def cleanup(self, directory: Path, keep: int = 1) -> dict:
        code, out, err = self.run("cleanup", str(directory), "--keep", str(keep), "--yes", "--json")
        assert code == 0, "cleanup exit %d: %s\n%s" % (code, err, out)
        return json.loads(out)


def units(doc: dict) -> Dict[str, dict]:
    """The listed units by their path relative to the listed directory ('.' for the directory itself)."""
    root = Path(doc["dir"])
    return {os.path.relpath(entry["path"], root): entry for entry in doc["checkpoints"]}


def flagged(doc: dict, flag: str) -> Set[str]:
    return {name for name, entry in units(doc).items() if entry[flag]}


def deleted(doc: dict, root: Path) -> Set[str]:
    results = (doc.get("result") or {}).get("results") or []
    return {os.path.relpath(r["path"], root) for r in results if r["deleted"]}


def listing_text(doc: dict) -> str:
    """The listing, one line per unit, for assertion messages (what was listed, with its marks and problem)."""
    lines = [
        "%s %s integrity=%s%s%s %s"
        % (
            name,
            e["format"],
            e["integrity"],
            " best" if e["best"] else "",
            " latest" if e["latest"] else "",
            e["problem"] or "",
        )
        for name, e in sorted(units(doc).items())
    ]
    return "listing of %s:\n  %s" % (doc["dir"], "\n  ".join(lines) or "(nothing)")


def plan_text(doc: dict) -> str:
    """The plan, one line per unit, for assertion messages (what was kept or deleted, and why)."""
    lines = [
        "%s %s (%s)" % (item["action"], Path(item["path"]).name, "; ".join(item["reasons"]))
        for item in doc["plan"]["plan"]
    ]
    return "\n".join(lines + ["result: %s" % json.dumps(doc.get("result"))])


def aged_copy(source: Path, tmp_path: Path) -> Path:
    """A copy of an artifact with every mtime an hour older (their order kept), as a run from yesterday."""
    dest = copy_artifact(source, tmp_path / "copy")
    for path in sorted(dest.rglob("*"), key=lambda p: len(p.parts), reverse=True) + [dest]:
        st = path.lstat()
        os.utime(path, (st.st_atime - AGE_S, st.st_mtime - AGE_S), follow_symlinks=False)
    return dest


def assert_same_weights(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key


def assert_one_unit_and_nothing_deleted(console: Console, unit: Path, fmt_hint: str) -> None:
    """Pointed at one unit: listed as that one unit, and cleanup --keep 1 --yes leaves every file in it."""
    doc = console.listing(unit)
    listed = units(doc)
    assert list(listed) == ["."], "%s: expected the directory itself as one unit\n%s" % (fmt_hint, listing_text(doc))
    before = tree(unit)
    result = console.cleanup(unit)
    assert tree(unit) == before, "%s: cleanup changed the unit\n%s" % (fmt_hint, plan_text(result))
    assert not deleted(result, unit), plan_text(result)


# --- Lightning ----------------------------------------------------------------------------------


def test_lightning_model_checkpoint_listing(lightning_run, console):
    doc = console.listing(lightning_run.dir)
    expected = set(lightning_run.best_k_models) | {"last.ckpt"}
    assert set(units(doc)) == expected, listing_text(doc)
    best = Path(lightning_run.best_model_path).name
    assert best != lightning_run.newest_top_k  # the run was made so
    assert flagged(doc, "best") == {best}, "Lightning recorded best_model_path=%s (monitor val_acc, max)\n%s" % (
        best,
        listing_text(doc),
    )
    assert "last.ckpt" in flagged(doc, "latest"), (
        "last.ckpt (a regular file) is ModelCheckpoint's last_model_path\n" + listing_text(doc)
    )


def test_lightning_cleanup_keeps_best_and_last_loadable(lightning_run, console, tmp_path):
    copy = aged_copy(lightning_run.dir, tmp_path)
    result = console.cleanup(copy)
    best = Path(lightning_run.best_model_path).name
    remaining = {p.name for p in copy.iterdir()}
    assert {best, "last.ckpt"} <= remaining, plan_text(result)
    # Only other top-k members may go (keep 1); nothing outside ModelCheckpoint's own files.
    assert deleted(result, copy) <= set(lightning_run.best_k_models) - {best}, plan_text(result)
    module_class = lightning_module_class()
    for name in (best, "last.ckpt"):
        loaded = module_class.load_from_checkpoint(str(copy / name), map_location="cpu")
        original = module_class.load_from_checkpoint(str(lightning_run.dir / name), map_location="cpu")
        assert_same_weights(loaded.state_dict(), original.state_dict())
    saved = torch.load(copy / best, map_location="cpu", weights_only=True)
    callback_state = next(v for k, v in saved["callbacks"].items() if k.startswith("ModelCheckpoint"))
    assert Path(callback_state["best_model_path"]).name == best


def test_lightning_run_again_into_the_same_dir_keeps_each_runs_best(lightning_run, console, tmp_path, monkeypatch):
    """A second fit into the first run's dirpath (3 epochs, its best the first epoch): Lightning writes
    its files beside the first run's and last-v1.ckpt. The newest callback state by step is the first
    run's; the second run's best and top-k were deleted as 'older than the newest 1'."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests import checkpoint_libraries

    copy = aged_copy(lightning_run.dir, tmp_path)
    monkeypatch.setattr(checkpoint_libraries, "LIGHTNING_VAL_ACC", (0.30, 0.20, 0.10))
    torch.manual_seed(1)
    x = torch.randn(32, 8)
    y = (x[:, 0] > 0).long()
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:16], y[:16]), batch_size=16)
    callback = ModelCheckpoint(dirpath=str(copy), monitor="val_acc", mode="max", save_top_k=3, save_last=True)
    trainer = pl.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[callback],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path / "second"),
    )
    with one_thread():
        trainer.fit(lightning_module_class()(), train, val)
    second_best = Path(callback.best_model_path).name
    assert second_best == "epoch=0-step=2.ckpt" and second_best not in lightning_run.best_k_models
    for path in copy.iterdir():  # the second run an hour ago too: older than min_age
        st = path.lstat()
        os.utime(path, (st.st_atime - AGE_S, st.st_mtime - AGE_S), follow_symlinks=False)
    module_class = lightning_module_class()
    weights = module_class.load_from_checkpoint(str(copy / second_best), map_location="cpu").state_dict()
    doc = console.listing(copy)
    assert second_best in flagged(doc, "best"), listing_text(doc)
    result = console.cleanup(copy)
    first_best = Path(lightning_run.best_model_path).name
    kept = {second_best, first_best} | {Path(p).name for p in callback.best_k_models}
    assert not deleted(result, copy) & kept, plan_text(result)
    loaded = module_class.load_from_checkpoint(str(copy / second_best), map_location="cpu")
    assert_same_weights(loaded.state_dict(), weights)
    module_class.load_from_checkpoint(str(copy / first_best), map_location="cpu")


# --- Hugging Face Trainer -----------------------------------------------------------------------


def final_model_units(listed: Dict[str, dict]) -> List[str]:
    return [name for name in listed if name in (".", "model.safetensors")]


def test_hf_trainer_listing(hf_run, console):
    assert hf_run.checkpoints == ("checkpoint-%d" % HF_BEST_STEP, "checkpoint-10", "checkpoint-%d" % HF_STEPS)
    assert hf_run.best_checkpoint == "checkpoint-%d" % HF_BEST_STEP
    doc = console.listing(hf_run.output_dir)
    listed = units(doc)
    stray = sorted(set(listed) & {"config.json", "generation_config.json", "training_args.bin"})
    assert not stray, "save_model()'s files listed as checkpoints of their own: %s\n%s" % (stray, listing_text(doc))
    assert len(final_model_units(listed)) == 1, "the final model (save_model) as one unit\n" + listing_text(doc)
    for name in hf_run.checkpoints:
        assert listed[name]["format"] == "hf-trainer", (name, listed[name])
    series = {name for name in listed if name.startswith("checkpoint-")}
    assert series == set(hf_run.checkpoints), listing_text(doc)
    assert flagged(doc, "best") & series == {hf_run.best_checkpoint}, listing_text(doc)
    assert flagged(doc, "latest") & series == {"checkpoint-%d" % HF_STEPS}, listing_text(doc)


def test_hf_trainer_cleanup_keeps_final_best_and_newest_loadable(hf_run, console, tmp_path):
    from transformers import AutoModelForCausalLM

    copy = aged_copy(hf_run.output_dir, tmp_path)
    before = tree(copy)
    result = console.cleanup(copy)
    assert deleted(result, copy) == {"checkpoint-10"}, plan_text(result)
    after = tree(copy)
    kept = {path: size for path, size in before.items() if not path.startswith("checkpoint-10/")}
    assert after == kept, "files lost: %s\n%s" % (sorted(set(kept) - set(after)), plan_text(result))
    final = AutoModelForCausalLM.from_pretrained(str(copy))
    best = AutoModelForCausalLM.from_pretrained(str(copy / hf_run.best_checkpoint))
    # load_best_model_at_end: the final model is the best checkpoint's weights.
    assert_same_weights(final.state_dict(), best.state_dict())
    newest = copy / ("checkpoint-%d" % HF_STEPS)
    assert hf_resume_one_step(newest, tmp_path / "resumed") == HF_STEPS + 1


def test_hf_two_runs_in_one_output_dir_each_keep_their_best(hf_run, console, tmp_path):
    """A second run from step 0 into the first run's output dir (save_total_limit=None: the first's
    checkpoint-12 stays, and get_last_checkpoint still resumes it). The newest trainer_state.json by
    step is the first run's; the second run's best was deleted as 'older than the newest 1'."""
    from transformers import AutoModelForCausalLM

    copy = aged_copy(hf_run.output_dir, tmp_path)
    trainer = hf_second_run(copy)  # scores 0.30, 0.20, 0.95: its best is checkpoint-6, its newest
    second_best = Path(trainer.state.best_model_checkpoint).name
    assert second_best == "checkpoint-6"
    for path in copy.rglob("*"):  # the second run an hour ago too: older than min_age
        st = path.lstat()
        os.utime(path, (st.st_atime - AGE_S, st.st_mtime - AGE_S), follow_symlinks=False)
    weights = {
        k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(str(copy / second_best)).state_dict().items()
    }
    doc = console.listing(copy)
    assert second_best in flagged(doc, "best"), listing_text(doc)
    result = console.cleanup(copy)
    assert second_best not in deleted(result, copy), plan_text(result)
    assert_same_weights(AutoModelForCausalLM.from_pretrained(str(copy / second_best)).state_dict(), weights)
    newest = "checkpoint-%d" % HF_STEPS  # what the first run's resume (and get_last_checkpoint) takes
    assert newest not in deleted(result, copy), plan_text(result)


def test_hf_checkpoint_rewritten_by_a_later_run_is_not_best_on_the_older_runs_word(hf_run, console, tmp_path):
    """A second run from step 0 into the first run's output dir, to step 6: it writes checkpoint-2, -4
    and -6 again, so the first run's best, checkpoint-4, now holds the second run's step 4 (not its
    best). The first run's checkpoint-12, the newest trainer_state.json by step, still names
    checkpoint-4 as best_model_checkpoint: it was called best on that stale word. checkpoint-4's own
    trainer_state.json (written after checkpoint-12's) names checkpoint-2 with another best_metric:
    the evidence disagrees, so it is kept and says why, and not called best. The second run's newest,
    checkpoint-6, is the trainer_state.json written last: latest beside checkpoint-12 (what
    get_last_checkpoint resumes), and never 'older than the newest 1'."""
    from transformers import AutoModelForCausalLM, Trainer

    copy = aged_copy(hf_run.output_dir, tmp_path)
    scores = iter((0.95, 0.30, 0.20))  # the second run's best: checkpoint-2

    def compute_metrics(_prediction):
        pause()
        return {"score": next(scores)}

    reset_accelerate_state()
    torch.manual_seed(1)
    with one_thread():
        args = hf_training_args(copy, max_steps=6, save_total_limit=None)
        model = AutoModelForCausalLM.from_config(tiny_gpt2_config())
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=token_rows(16, 1),
            eval_dataset=token_rows(4, 2),
            compute_metrics=compute_metrics,
        )
        trainer.train()
    reset_accelerate_state()
    assert Path(trainer.state.best_model_checkpoint).name == "checkpoint-2"
    first_state = json.loads((copy / ("checkpoint-%d" % HF_STEPS) / "trainer_state.json").read_text())
    rewritten_state = json.loads((copy / "checkpoint-4" / "trainer_state.json").read_text())
    # What the libraries wrote: the first run's newest still names checkpoint-4, whose own state disagrees.
    assert Path(first_state["best_model_checkpoint"]).name == "checkpoint-4"
    assert Path(rewritten_state["best_model_checkpoint"]).name == "checkpoint-2"
    assert rewritten_state["best_metric"] != first_state["best_metric"]
    for path in copy.rglob("*"):  # the second run an hour ago too: older than min_age
        st = path.lstat()
        os.utime(path, (st.st_atime - AGE_S, st.st_mtime - AGE_S), follow_symlinks=False)
    weights = {
        name: {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(str(copy / name)).state_dict().items()}
        for name in ("checkpoint-2", "checkpoint-4")
    }
    doc = console.listing(copy)
    listed = units(doc)
    series = {name for name in listed if name.startswith("checkpoint-")}
    assert flagged(doc, "best") & series == {"checkpoint-2"}, listing_text(doc)
    assert flagged(doc, "latest") & series == {"checkpoint-6", "checkpoint-%d" % HF_STEPS}, listing_text(doc)
    why = " ".join(listed["checkpoint-4"]["protections"])
    assert "checkpoint-%d" % HF_STEPS in why and "not called best" in why, listed["checkpoint-4"]
    result = console.cleanup(copy)
    assert deleted(result, copy) == {"checkpoint-10"}, plan_text(result)
    for name, want in weights.items():  # the second run's best, and the first run's recorded best as it now is
        assert_same_weights(AutoModelForCausalLM.from_pretrained(str(copy / name)).state_dict(), want)
    AutoModelForCausalLM.from_pretrained(str(copy))  # the first run's final model
    assert hf_resume_one_step(copy / "checkpoint-6", tmp_path / "resumed-6") == 7
    assert hf_resume_one_step(copy / ("checkpoint-%d" % HF_STEPS), tmp_path / "resumed-12") == HF_STEPS + 1


def test_hf_two_runs_the_listing_says_which_checkpoint_resume_true_takes(hf_run, console, tmp_path):
    """A second run from step 0 into the first run's output dir, to step 6: both runs' newest saves
    (checkpoint-12, checkpoint-6) are latest, and `resume_from_checkpoint=True` (get_last_checkpoint)
    takes checkpoint-12, the first run's, not the run that saved last. The listing, its JSON and the
    cleanup plan say so in a warning naming the checkpoint transformers itself picks (before: no word)."""
    from transformers.trainer_utils import get_last_checkpoint

    copy = aged_copy(hf_run.output_dir, tmp_path)
    code, out, _ = console.run("checkpoints", str(copy))
    assert code == 0 and "warning" not in out  # one run: nothing in doubt
    hf_second_run(copy)
    picked = Path(get_last_checkpoint(str(copy))).name  # what resume_from_checkpoint=True resumes
    assert picked == "checkpoint-%d" % HF_STEPS
    for path in copy.rglob("*"):  # the second run an hour ago too: older than min_age
        st = path.lstat()
        os.utime(path, (st.st_atime - AGE_S, st.st_mtime - AGE_S), follow_symlinks=False)

    for _ in range(2):  # the second listing from what the first kept (proofs.py): the same words
        doc = console.listing(copy)
        assert flagged(doc, "latest") & {"checkpoint-6", picked} == {"checkpoint-6", picked}, listing_text(doc)
        (warning,) = doc["warnings"]
        assert warning.startswith(
            "two runs saved checkpoints here: resume_from_checkpoint=True resumes %s, the highest step (%d), "
            "saved by the earlier run; the run that saved last stopped at checkpoint-6 (step 6)" % (picked, HF_STEPS)
        ), warning
    code, out, _ = console.run("checkpoints", str(copy))
    assert code == 0 and out.splitlines()[-1] == "warning: " + warning
    code, out, err = console.run("cleanup", str(copy), "--keep", "1", "--dry-run")
    assert code == 0 and "warning: " + warning in out + err


def unit_bytes(root: Path, units) -> int:
    """What the disk holds of these units: a top-level name (a directory with everything in it) or a
    tuple of the names of one unit of files (the final model)."""
    total = 0
    for unit in units:
        for name in (unit,) if isinstance(unit, str) else unit:
            path = root / name
            files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
            total += sum(f.stat().st_size for f in files)
    return total


def assert_totals(console: Console, root: Path, managed, not_managed) -> None:
    """The listing's totals count what they say: the managed units apart from the rest it lists."""
    doc = console.listing(root)
    want = {
        "managed": {"count": len(managed), "bytes": unit_bytes(root, managed)},
        "not_managed": {"count": len(not_managed), "bytes": unit_bytes(root, not_managed)},
    }
    assert {key: doc[key] for key in want} == want, listing_text(doc)
    assert doc["total_bytes"] == want["managed"]["bytes"] + want["not_managed"]["bytes"]
    code, out, err = console.run("checkpoints", str(root))
    assert code == 0, err
    totals = out.splitlines()[-1]
    assert totals.startswith(
        "%d checkpoint%s managed (%s); %d not managed (%s)"
        % (
            len(managed),
            "" if len(managed) == 1 else "s",
            size_text(want["managed"]["bytes"]),
            len(not_managed),
            size_text(want["not_managed"]["bytes"]),
        )
    ), totals


def test_totals_count_managed_checkpoints_apart_from_unrelated_files(hf_run, lightning_run, console, tmp_path):
    """Unrelated top-level .pt/.bin files in an HF output directory (and a Lightning dirpath) are listed
    'not managed', but the directory's total ('4 checkpoints, 1.3 MiB') counted them, and the final
    model and last.ckpt, as checkpoints. The totals now say the managed units and the rest apart."""
    from transformers import AutoModelForCausalLM

    hf = aged_copy(hf_run.output_dir, tmp_path / "hf")
    extra = {"embeddings.pt": {"table": torch.randn(64, 32)}, "extra_weights.bin": {"w": torch.randn(128, 16)}}
    for name, state in extra.items():
        torch.save(state, hf / name)
        os.utime(hf / name, (time.time() - AGE_S, time.time() - AGE_S))
    final = [tuple(hf_run.final_files)]  # save_model()'s files: one unit
    assert_totals(console, hf, hf_run.checkpoints, final + sorted(extra))
    result = console.cleanup(hf)
    assert deleted(result, hf) == {"checkpoint-10"}, plan_text(result)
    kept = [n for n in hf_run.checkpoints if n != "checkpoint-10"]
    assert_totals(console, hf, kept, final + sorted(extra))
    AutoModelForCausalLM.from_pretrained(str(hf))
    AutoModelForCausalLM.from_pretrained(str(hf / hf_run.best_checkpoint))
    for name, state in extra.items():
        assert_same_weights(torch.load(hf / name, weights_only=True), state)
    assert hf_resume_one_step(hf / ("checkpoint-%d" % HF_STEPS), tmp_path / "resumed") == HF_STEPS + 1

    lightning = aged_copy(lightning_run.dir, tmp_path / "lightning")
    features = {"features": torch.randn(16, 8)}
    torch.save(features, lightning / "features.pt")
    os.utime(lightning / "features.pt", (time.time() - AGE_S, time.time() - AGE_S))
    assert_totals(console, lightning, lightning_run.best_k_models, ["features.pt", "last.ckpt"])
    result = console.cleanup(lightning)
    best = Path(lightning_run.best_model_path).name
    went = deleted(result, lightning)
    assert went <= set(lightning_run.best_k_models) - {best}, plan_text(result)
    assert_totals(console, lightning, sorted(set(lightning_run.best_k_models) - went), ["features.pt", "last.ckpt"])
    module_class = lightning_module_class()
    for name in (best, "last.ckpt"):
        module_class.load_from_checkpoint(str(lightning / name), map_location="cpu")
    assert_same_weights(torch.load(lightning / "features.pt", weights_only=True), features)


def test_a_files_kept_proof_is_for_the_code_that_proved_it(hf_run, tmp_path, monkeypatch):
    """Kept listings and unit results carry the checkpoint code's stamp (73d56ee): a fix to how a unit
    is judged reaches directories listed before it. A file's kept proof (its safetensors header, its
    zip directory checked) did not: under other code every file of the Trainer's checkpoints was
    taken from the store, so a fix to a check never reached a file proved before it. Under the same
    code the proofs are still used (a unit read again for a new file in it takes its files' proofs)."""
    from opsconsole.checkpoints import scan as scan_module
    from opsconsole.checkpoints.cache import ResultCache
    from opsconsole.checkpoints.proofs import ProofStore

    copy = aged_copy(hf_run.output_dir, tmp_path)
    store_dir = tmp_path / "proofs"

    def listed(store):
        listing = scan_module.scan_directory(
            str(copy), cache=ResultCache(), crc_cache=ResultCache(), proofs=store, keep_proofs=False
        )
        store.flush()
        return {e.name: (e.integrity, e.best, e.latest, e.meta) for e in listing.entries}

    first = ProofStore("local", str(copy), str(store_dir), racy_s=0.0)
    before = listed(first)
    proved = first.stored
    assert proved >= 3 * 5, "each checkpoint's weights and state files proved and kept: %d" % proved
    # Same code, one unit changed (a note added to checkpoint-10/): its files' kept proofs are used.
    (copy / "checkpoint-10" / "notes.txt").write_text("eval looked off")
    same = ProofStore("local", str(copy), str(store_dir), racy_s=0.0)
    marks = lambda listing: {name: entry[:3] for name, entry in listing.items()}  # noqa: E731
    assert marks(listed(same)) == marks(before)  # (checkpoint-10's details name the note)
    assert same.unit_hits == 2 and same.hits >= 5, (same.unit_hits, same.hits)
    (copy / "checkpoint-10" / "notes.txt").unlink()
    # Other code: nothing kept by this code is used, files included; every file is proved again.
    monkeypatch.setattr(scan_module, "_code_stamp", lambda: "other code")
    other = ProofStore("local", str(copy), str(store_dir), racy_s=0.0)
    assert listed(other) == before
    assert (other.listing_hits, other.unit_hits, other.hits) == (0, 0, 0), (other.unit_hits, other.hits)
    assert other.stored == proved


def test_hf_checkpoint_without_weights_is_corrupt_and_never_the_newest_kept(hf_run, console, tmp_path):
    """A checkpoint-N/ that lost its model.safetensors (a partial copy) kept trainer_state.json: it was
    ok, latest and the newest keep place, while the Trainer refuses to resume from it; the sound
    checkpoint before it went. resume_from_checkpoint=True still takes it: the listing warns."""
    copy = aged_copy(hf_run.output_dir, tmp_path)
    newest = copy / ("checkpoint-%d" % HF_STEPS)
    (newest / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="Can't find a valid checkpoint"):
        hf_resume_one_step(newest, tmp_path / "refused")
    doc = console.listing(copy)
    listed = units(doc)
    assert listed[newest.name]["integrity"] in BROKEN, listing_text(doc)
    assert flagged(doc, "latest") & {n for n in listed if n.startswith("checkpoint-")} == {"checkpoint-10"}, (
        listing_text(doc)
    )
    # Yet resume_from_checkpoint=True (get_last_checkpoint) takes the broken highest one: said so.
    from transformers.trainer_utils import get_last_checkpoint

    assert Path(get_last_checkpoint(str(copy))).name == newest.name
    (warning,) = doc["warnings"]
    assert warning.startswith(
        "resume_from_checkpoint=True resumes %s, the highest step (%d), which is %s: loading it would fail"
        % (newest.name, HF_STEPS, listed[newest.name]["integrity"])
    ), warning
    assert "checkpoint-10 (step 10) is the newest sound checkpoint" in warning
    result = console.cleanup(copy)
    assert "checkpoint-10" not in deleted(result, copy), plan_text(result)
    assert hf_resume_one_step(copy / "checkpoint-10", tmp_path / "resumed") == 11


def test_hf_checkpoint_with_weights_under_another_name_is_kept_unjudged(hf_run, console, tmp_path):
    """A Trainer subclass that saves its own model.pt: no standard weights, but names alone prove no
    damage. Kept (could not judge), and it takes no keep place: the checkpoint before it stays too."""
    from safetensors.torch import load_file

    copy = aged_copy(hf_run.output_dir, tmp_path)
    newest = copy / ("checkpoint-%d" % HF_STEPS)
    weights = load_file(str(newest / "model.safetensors"))
    torch.save(weights, newest / "model.pt")
    (newest / "model.safetensors").unlink()
    for path in [*newest.iterdir(), newest]:  # old again: not kept as mid-write, only as unjudged
        os.utime(path, (time.time() - AGE_S, time.time() - AGE_S))
    doc = console.listing(copy)
    listed = units(doc)
    assert listed[newest.name]["integrity"] not in BROKEN, listing_text(doc)
    assert "could not judge" in (listed[newest.name]["unreadable"] or ""), listing_text(doc)
    result = console.cleanup(copy)
    assert not deleted(result, copy) & {newest.name, "checkpoint-10"}, plan_text(result)
    assert torch.load(newest / "model.pt", weights_only=True).keys() == weights.keys()
    assert hf_resume_one_step(copy / "checkpoint-10", tmp_path / "resumed") == 11


NOBODY = 65534


class OtherUser:
    """An aged copy of the HF run in a directory another user may enter, and the commands run as that
    user (nobody, who then owns the copy, when the tests run as root: root may write anywhere)."""

    def __init__(self, folder: Path, source: Path):
        self.prefix: List[str] = []
        if os.geteuid() == 0:
            if not shutil.which("setpriv"):
                pytest.skip("needs setpriv to run the command as another user than root")
            self.prefix = ["setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups"]
        os.chmod(folder, 0o755)
        self.copy = aged_copy(source, folder)
        config = folder / "config.toml"
        config.write_text('[actions]\naudit_log = "%s"\n' % (folder / "audit.log"))
        if self.prefix:
            for path in [folder, *folder.rglob("*")]:
                os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
        self.env = dict(
            os.environ, HOME=str(folder), XDG_CACHE_HOME=str(folder / "cache"), OPSCONSOLE_CONFIG=str(config)
        )
        probe = subprocess.run(
            self.prefix + [sys.executable, "-c", "import opsconsole.cli"], env=self.env, capture_output=True
        )
        if probe.returncode != 0:
            pytest.skip("the other user cannot run this Python: %s" % probe.stderr[-200:])

    def command(self, *argv: str, codes=(0,)) -> dict:
        done = subprocess.run(
            self.prefix + [sys.executable, "-m", "opsconsole", *argv],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode in codes, done.stderr or done.stdout
        return json.loads(done.stdout)


@pytest.fixture
def other_user(hf_run):
    folder = Path(tempfile.mkdtemp(prefix="opsconsole-other-user-"))
    try:
        yield OtherUser(folder, hf_run.output_dir)
    finally:
        for path in [folder, *folder.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)
        shutil.rmtree(folder)


def test_hf_checkpoint_dirs_that_cannot_be_listed_are_shown_and_kept(hf_run, other_user):
    """checkpoint-N/ directories the user cannot list (mode 000) were left out of the listing without
    a word: the best among them. Each is listed, not managed, 'could not read', and cleanup --yes
    leaves it; opened again, the best loads."""
    from transformers import AutoModelForCausalLM

    copy = other_user.copy
    best = copy / hf_run.best_checkpoint
    best.chmod(0)
    doc = other_user.command("checkpoints", str(copy), "--json")
    listed = units(doc)
    assert hf_run.best_checkpoint in listed, listing_text(doc)
    entry = listed[hf_run.best_checkpoint]
    assert entry["best"] and not entry["managed"] and "cannot list" in entry["unreadable"], listing_text(doc)
    result = other_user.command("cleanup", str(copy), "--keep", "1", "--yes", "--json")
    assert hf_run.best_checkpoint not in deleted(result, copy), plan_text(result)
    best.chmod(0o755)
    AutoModelForCausalLM.from_pretrained(str(best))


def test_a_unit_the_user_cannot_delete_whole_is_left_whole(hf_run, other_user):
    """checkpoint-10/ (planned for deletion) holds a directory its user may not write (global_step10/,
    mode 555: another job's, a read-only copy): cleanup unlinked config.json and
    generation_config.json, then stopped, and said nothing of the unit went. Now it checks every
    directory of the unit before anything goes: the unit stays whole and loads."""
    from transformers import AutoModelForCausalLM

    unit = other_user.copy / "checkpoint-10"
    guarded = unit / "global_step10"
    guarded.mkdir()
    (guarded / "mp_rank_00_model_states.pt").write_bytes((unit / "rng_state.pth").read_bytes())
    if other_user.prefix:
        for path in (guarded, guarded / "mp_rank_00_model_states.pt"):
            os.chown(path, NOBODY, NOBODY)
    for path in (guarded / "mp_rank_00_model_states.pt", guarded, unit):
        os.utime(path, (AGE_S, time.time() - AGE_S))
    guarded.chmod(0o555)
    before = tree(unit)
    # Exit 1: a planned unit was not deleted (the result says why).
    result = other_user.command("cleanup", str(other_user.copy), "--keep", "1", "--yes", "--json", codes=(1,))
    planned = {Path(i["path"]).name for i in result["plan"]["plan"] if i["action"].lower() == "delete"}
    assert "checkpoint-10" in planned, plan_text(result)
    assert "checkpoint-10" not in deleted(result, other_user.copy), plan_text(result)
    assert tree(unit) == before, plan_text(result)
    AutoModelForCausalLM.from_pretrained(str(unit))


def test_hf_cleanup_pointed_at_one_checkpoint_deletes_nothing_inside(hf_run, console, tmp_path):
    from transformers import AutoModelForCausalLM

    checkpoint = aged_copy(hf_run.output_dir / ("checkpoint-%d" % HF_STEPS), tmp_path)
    assert_one_unit_and_nothing_deleted(console, checkpoint, "HF checkpoint-N/")
    AutoModelForCausalLM.from_pretrained(str(checkpoint))
    assert hf_resume_one_step(checkpoint, tmp_path / "resumed") == HF_STEPS + 1


# --- accelerate ---------------------------------------------------------------------------------


def test_accelerate_automatic_naming_listing(accelerate_run, console):
    doc = console.listing(accelerate_run.project_dir / "checkpoints")
    names = {"checkpoint_%d" % i for i in range(ACCELERATE_SAVES)}
    assert set(units(doc)) == names, listing_text(doc)
    assert flagged(doc, "latest") == {"checkpoint_%d" % (ACCELERATE_SAVES - 1)}, listing_text(doc)
    assert not flagged(doc, "best"), listing_text(doc)  # accelerate records no metric


def test_accelerate_cleanup_keeps_the_newest_state_loadable(accelerate_run, console, tmp_path):
    project = aged_copy(accelerate_run.project_dir, tmp_path)
    checkpoints = project / "checkpoints"
    newest = "checkpoint_%d" % (ACCELERATE_SAVES - 1)
    before = tree(checkpoints / newest)
    result = console.cleanup(checkpoints)
    assert deleted(result, checkpoints) == {"checkpoint_%d" % i for i in range(ACCELERATE_SAVES - 1)}, plan_text(result)
    assert tree(checkpoints / newest) == before, plan_text(result)
    assert_same_weights(accelerate_load(checkpoints / newest), accelerate_run.weights[newest])
    # accelerate's own resume: load_state() with no path takes the newest checkpoints/checkpoint_N.
    accelerator, model, _optimizer, _scheduler = make_accelerator(project)
    accelerator.load_state()
    assert_same_weights(model.state_dict(), accelerate_run.weights[newest])
    reset_accelerate_state()


def test_accelerate_save_cut_short_is_incomplete_and_never_the_newest_kept(accelerate_run, console, tmp_path):
    # A save_state killed part way: accelerate writes the model first and random_states_0.pkl last,
    # so checkpoint_N+1 holds only the model. load_state() takes the highest N and fails on it; it
    # took the newest keep place (ok, latest) and cleanup deleted every complete save before it.
    project = aged_copy(accelerate_run.project_dir, tmp_path)
    checkpoints = project / "checkpoints"
    newest = "checkpoint_%d" % (ACCELERATE_SAVES - 1)
    cut_short = checkpoints / ("checkpoint_%d" % ACCELERATE_SAVES)
    cut_short.mkdir()
    (cut_short / "model.safetensors").write_bytes((checkpoints / newest / "model.safetensors").read_bytes())
    old = os.stat(checkpoints / newest).st_mtime
    os.utime(cut_short / "model.safetensors", (old, old))
    os.utime(cut_short, (old, old))
    accelerator, _model, _optimizer, _scheduler = make_accelerator(project)
    with pytest.raises(OSError):
        accelerator.load_state()
    reset_accelerate_state()
    doc = console.listing(checkpoints)
    listed = units(doc)
    assert listed[cut_short.name]["integrity"] in BROKEN, listing_text(doc)
    assert "random_states" in listed[cut_short.name]["problem"], listing_text(doc)
    assert flagged(doc, "latest") == {newest}, listing_text(doc)
    before = tree(checkpoints / newest)
    result = console.cleanup(checkpoints)
    assert newest not in deleted(result, checkpoints), plan_text(result)
    assert tree(checkpoints / newest) == before, plan_text(result)
    accelerator, model, _optimizer, _scheduler = make_accelerator(project)
    accelerator.load_state()
    assert_same_weights(model.state_dict(), accelerate_run.weights[newest])
    reset_accelerate_state()


def test_accelerate_cleanup_pointed_at_a_save_state_dir_deletes_nothing(accelerate_run, console, tmp_path):
    plain = aged_copy(accelerate_run.plain_dir, tmp_path)
    assert_one_unit_and_nothing_deleted(console, plain, "accelerate save_state dir")
    assert_same_weights(accelerate_load(plain), accelerate_run.weights[accelerate_run.plain_dir.name])


# --- torch.distributed.checkpoint ---------------------------------------------------------------


def test_dcp_listing_checks_integrity(dcp_run, console):
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

    # The library's own loader says what is broken: the truncated shard (torch.load inside dcp.load:
    # "failed finding central directory") and the missing .metadata (FileNotFoundError).
    with pytest.raises(CheckpointException, match="central directory"):
        dcp_load(dcp_run.dir / DCP_TRUNCATED)
    with pytest.raises((CheckpointException, OSError)):
        dcp_load(dcp_run.dir / DCP_NO_METADATA)
    doc = console.listing(dcp_run.dir)
    listed = units(doc)
    assert set(listed) == set(DCP_COMPLETE) | {DCP_TRUNCATED, DCP_NO_METADATA}, listing_text(doc)
    for name in DCP_COMPLETE:
        assert listed[name]["integrity"] == "ok", listing_text(doc)
    assert listed[DCP_TRUNCATED]["integrity"] in BROKEN, listing_text(doc)
    incomplete = listed[DCP_NO_METADATA]
    assert incomplete["integrity"] != "ok" and incomplete["problem"], listing_text(doc)


def test_dcp_cleanup_keeps_the_newest_intact_save_loadable(dcp_run, console, tmp_path):
    copy = aged_copy(dcp_run.dir, tmp_path)
    newest_intact = DCP_COMPLETE[-1]
    before = tree(copy / newest_intact)
    result = console.cleanup(copy)
    gone = deleted(result, copy)
    assert DCP_COMPLETE[0] in gone and newest_intact not in gone, plan_text(result)
    assert tree(copy / newest_intact) == before
    assert_same_weights(dcp_load(copy / newest_intact), dcp_run.weights[newest_intact])


def test_dcp_pointed_at_one_save(dcp_run, console, tmp_path):
    one = aged_copy(dcp_run.dir / DCP_COMPLETE[-1], tmp_path)
    doc = console.listing(one)
    assert units(doc).get(".", {}).get("integrity") == "ok", listing_text(doc)
    assert_one_unit_and_nothing_deleted(console, one, "DCP directory")
    assert_same_weights(dcp_load(one), dcp_run.weights[DCP_COMPLETE[-1]])


def test_a_unit_that_fails_part_way_is_counted_in_the_json_and_named_whole_in_the_audit(console, tmp_path, monkeypatch):
    """torchtitan-style step-N/ saves written by dcp.save with one file per tensor (17 files each): the
    oldest fails at its 13th file (an EIO). cleanup --json printed every entry that went in
    members_deleted, and the reason named eight of them again: a unit of thousands of shards printed
    thousands of names. The JSON now gives counts and at most SHOWN_MEMBERS names; the audit record
    names every entry that went."""
    import torch.distributed.checkpoint as dcp

    from opsconsole.checkpoints.cleanup import SHOWN_MEMBERS
    from opsconsole.probe import delete_units

    parent = tmp_path / "titan"
    weights = {}
    with one_thread():
        for step in (1, 2):
            torch.manual_seed(step)
            model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(8)])
            writer = dcp.FileSystemWriter(str(parent / ("step-%d" % step)), single_file_per_rank=False)
            dcp.save({"model": model.state_dict()}, storage_writer=writer)
            weights[step] = {k: v.clone() for k, v in model.state_dict().items()}
            pause()
    files = sorted(p.name for p in (parent / "step-1").iterdir())
    assert len(files) == 17  # .metadata and a shard per tensor
    for path in sorted(parent.rglob("*")):
        st = path.lstat()
        os.utime(path, (st.st_atime - AGE_S, st.st_mtime - AGE_S))
    real_unlink = delete_units.unlink_at
    unlinked: List[str] = []

    failed: List[str] = []

    def unlink_at(name, dir_fd):
        if len(unlinked) == 12:
            failed.append(name)
            raise OSError(5, "Input/output error")
        real_unlink(name, dir_fd)
        unlinked.append(name)

    monkeypatch.setattr(delete_units, "unlink_at", unlink_at)
    code, out, err = console.run("cleanup", str(parent), "--keep", "1", "--yes", "--json")
    assert code == 1, err
    (result,) = json.loads(out)["result"]["results"]
    assert not result["deleted"] and Path(result["path"]).name == "step-1"
    partly = result["partly_deleted"]
    assert (partly["files_went"], partly["files"], partly["entries_went"]) == (12, 17, 12), result
    went = ["step-1/" + name for name in unlinked]
    assert partly["went"] == went[:SHOWN_MEMBERS] and partly["more"] == 12 - SHOWN_MEMBERS, result
    assert result["error"] == "step-1/%s: Input/output error" % failed[0], result  # the cause, no names again
    assert "members_deleted" not in result
    (record,) = [r for r in audit_records(tmp_path / "audit.log") if r["outcome"] == "failed"]
    assert "partly deleted: 12 of 17 files went" in record["detail"]
    assert all(name in record["detail"] for name in went), record["detail"]
    assert sorted(p.name for p in (parent / "step-1").iterdir()) == sorted(set(files) - set(unlinked))
    assert_same_weights(dcp_load_any(parent / "step-2", weights[2]), weights[2])


def dcp_load_any(directory: Path, like: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """dcp.load into tensors shaped as `like` (zeros): the weights it restored."""
    import torch.distributed.checkpoint as dcp

    state = {"model": {k: torch.zeros_like(v) for k, v in like.items()}}
    dcp.load(state, checkpoint_id=str(directory))
    return state["model"]


def audit_records(path: Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- DeepSpeed and Megatron-LM ------------------------------------------------------------------


def test_deepspeed_layout(console, tmp_path):
    """DeepSpeed cannot run here (it needs CUDA and its compiled ops): the layout is written from its
    documented names (global_stepN/ with mp_rank_00_model_states.pt and ZeRO optimizer shards, a
    `latest` file with the tag, zero_to_fp32.py). `latest` names global_step200 while global_step300
    exists (a save that died before updating `latest`): both must stay."""
    root = write_deepspeed_layout(tmp_path / "src" / "deepspeed")
    copy = aged_copy(root, tmp_path)
    doc = console.listing(copy)
    assert set(units(doc)) == {"global_step100", "global_step200", "global_step300"}, listing_text(doc)
    assert flagged(doc, "latest") == {"global_step200"}, listing_text(doc)
    result = console.cleanup(copy)
    assert deleted(result, copy) == {"global_step100"}, plan_text(result)
    assert (copy / "latest").is_file() and (copy / "zero_to_fp32.py").is_file()
    tag = (copy / "latest").read_text().strip()  # what DeepSpeed's load_checkpoint reads first
    state = torch.load(copy / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=True)
    assert state["global_steps"] == 200
    assert (copy / "global_step300" / "mp_rank_00_model_states.pt").is_file()


def test_megatron_layout(console, tmp_path):
    """Megatron-LM cannot run here (it needs CUDA, apex and a process group): the layout is written from
    its documented names (iter_0000100/mp_rank_00/model_optim_rng.pt, and
    latest_checkpointed_iteration.txt naming the last finished iteration, here 200 of 300)."""
    root = write_megatron_layout(tmp_path / "src" / "megatron")
    copy = aged_copy(root, tmp_path)
    doc = console.listing(copy)
    assert set(units(doc)) == {"iter_0000100", "iter_0000200", "iter_0000300"}, listing_text(doc)
    assert flagged(doc, "latest") == {"iter_0000200"}, listing_text(doc)
    result = console.cleanup(copy)
    assert deleted(result, copy) == {"iter_0000100"}, plan_text(result)
    iteration = int((copy / "latest_checkpointed_iteration.txt").read_text())
    state = torch.load(
        copy / ("iter_%07d" % iteration) / "mp_rank_00" / "model_optim_rng.pt", map_location="cpu", weights_only=True
    )
    assert state["iteration"] == 200
    assert (copy / "iter_0000300" / "mp_rank_00" / "model_optim_rng.pt").is_file()
