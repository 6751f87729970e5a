"""Checkpoints written by the training libraries themselves, for the acceptance tests of every layout.

Each builder trains a tiny model on the CPU for a few steps with the real library and leaves its
directory exactly as the library writes it: Lightning's `ModelCheckpoint` (top-k by a metric to
maximise, and `last.ckpt`), Hugging Face `Trainer` (`checkpoint-N/` with `save_total_limit`,
`load_best_model_at_end`, then `save_model()` into the output directory), accelerate's
`save_state` (automatic naming and a plain directory) and `torch.distributed.checkpoint.save`
(complete, a truncated shard, no `.metadata`). Nothing is downloaded: models come from configs,
data is a few random token rows made here, and the hub is offline.

The session fixtures build each artifact once per test session into a temp dir (about a minute in
all on 2 cores); tests copy an artifact before changing it. The metric each run logs is a fixed
schedule, so the best checkpoint is known in advance and is never the newest one.

DeepSpeed and Megatron-LM cannot run here (no GPU, no NCCL): their layouts are written from their
documented names with plain `torch.save` (see `write_deepspeed_layout`, `write_megatron_layout`).
"""

from __future__ import annotations

import os

# Before transformers or accelerate is imported anywhere: never reach the hub, never report.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

import contextlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
import torch

# --- shared tiny pieces ----------------------------------------------------------------------

SEQ_LEN = 16
VOCAB = 100


def token_rows(count: int, seed: int) -> List[Dict[str, torch.Tensor]]:
    """A tiny in-memory causal-LM dataset: random token rows whose labels are the inputs."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=generator)
        rows.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return rows


def tiny_gpt2_config():
    from transformers import GPT2Config

    return GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Train on one thread: the machine is shared, and the models are too small to gain from more."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def reset_accelerate_state() -> None:
    """accelerate keeps one process-wide state; each run (and HF Trainer) starts from a clean one."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def pause() -> None:
    """Successive saves get distinct mtimes even on a file system with coarse timestamps."""
    time.sleep(0.02)


# --- Lightning ----------------------------------------------------------------------------------

# val_acc per epoch, maximised: top-3 ends as epochs 2 (best), 4 and 5; the best is not the newest.
LIGHTNING_VAL_ACC = (0.20, 0.50, 0.90, 0.40, 0.70, 0.60)
LIGHTNING_BEST_EPOCH = 2


def _lightning_module_class():
    import lightning.pytorch as pl

    class TinyClassifier(pl.LightningModule):
        def __init__(self, width: int = 8, lr: float = 0.05):
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y))
            # The schedule, so that which checkpoint is best is known (and is not the newest).
            self.log("val_acc", torch.tensor(LIGHTNING_VAL_ACC[self.current_epoch]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    return TinyClassifier


_LIGHTNING_CLASS = None


def lightning_module_class():
    """The LightningModule the run trained (one class object, so load_from_checkpoint can use it)."""
    global _LIGHTNING_CLASS
    if _LIGHTNING_CLASS is None:
        _LIGHTNING_CLASS = _lightning_module_class()
    return _LIGHTNING_CLASS


@dataclass(frozen=True)
class LightningRun:
    dir: Path  # ModelCheckpoint's dirpath
    best_model_path: str  # as ModelCheckpoint recorded it
    best_k_models: Tuple[str, ...]  # basenames
    last_model_path: str
    newest_top_k: str  # basename of the top-k file of the last epoch


def build_lightning(root: Path) -> LightningRun:
    """ModelCheckpoint(monitor="val_acc", mode="max", save_top_k=3, save_last=True) over 6 epochs."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    torch.manual_seed(0)
    x = torch.randn(32, 8)
    y = (x[:, 0] > 0).long()
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:16], y[:16]), batch_size=16)
    dirpath = root / "lightning" / "checkpoints"
    callback = ModelCheckpoint(dirpath=str(dirpath), monitor="val_acc", mode="max", save_top_k=3, save_last=True)

    class Pause(pl.Callback):
        def on_validation_end(self, trainer, module):
            pause()

    trainer = pl.Trainer(
        max_epochs=len(LIGHTNING_VAL_ACC),
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[callback, Pause()],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(root / "lightning"),
    )
    with one_thread():
        trainer.fit(lightning_module_class()(), train, val)
    newest = max(callback.best_k_models, key=lambda p: Path(p).stat().st_mtime)
    return LightningRun(
        dir=dirpath,
        best_model_path=callback.best_model_path,
        best_k_models=tuple(sorted(Path(p).name for p in callback.best_k_models)),
        last_model_path=callback.last_model_path,
        newest_top_k=Path(newest).name,
    )


# --- Hugging Face Trainer -----------------------------------------------------------------------

# The `score` of each evaluation (every 2 steps, 12 steps), maximised: the best is step 4.
HF_SCORES = (0.10, 0.90, 0.30, 0.40, 0.50, 0.20)
HF_EVERY = 2
HF_STEPS = HF_EVERY * len(HF_SCORES)
HF_BEST_STEP = 4
HF_SAVE_TOTAL_LIMIT = 3  # Trainer keeps checkpoint-4 (best), -10 and -12


@dataclass(frozen=True)
class HfRun:
    output_dir: Path
    checkpoints: Tuple[str, ...]  # checkpoint-N names the Trainer left, in step order
    best_checkpoint: str  # basename of trainer_state.json's best_model_checkpoint
    final_files: Tuple[str, ...]  # what save_model() wrote at the top of output_dir


def hf_training_args(output_dir: Path, **overrides):
    from transformers import TrainingArguments

    settings = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        learning_rate=1e-3,
        max_steps=HF_STEPS,
        eval_strategy="steps",
        eval_steps=HF_EVERY,
        save_strategy="steps",
        save_steps=HF_EVERY,
        save_total_limit=HF_SAVE_TOTAL_LIMIT,
        load_best_model_at_end=True,
        metric_for_best_model="score",
        greater_is_better=True,
        logging_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        save_only_model=False,
    )
    settings.update(overrides)
    return TrainingArguments(**settings)


def build_hf(root: Path) -> HfRun:
    """Trainer with save_total_limit and load_best_model_at_end, then trainer.save_model() into output_dir."""
    from transformers import AutoModelForCausalLM, Trainer

    output_dir = root / "hf" / "run"
    evaluations = iter(HF_SCORES)

    def compute_metrics(_prediction):
        pause()
        return {"score": next(evaluations)}

    reset_accelerate_state()
    torch.manual_seed(0)
    with one_thread():
        model = AutoModelForCausalLM.from_config(tiny_gpt2_config())
        trainer = Trainer(
            model=model,
            args=hf_training_args(output_dir),
            train_dataset=token_rows(16, 1),
            eval_dataset=token_rows(4, 2),
            compute_metrics=compute_metrics,
        )
        trainer.train()
        pause()
        trainer.save_model()
    reset_accelerate_state()
    checkpoints = sorted((p.name for p in output_dir.glob("checkpoint-*")), key=lambda n: int(n.split("-")[1]))
    best = trainer.state.best_model_checkpoint
    return HfRun(
        output_dir=output_dir,
        checkpoints=tuple(checkpoints),
        best_checkpoint=Path(best).name if best else "",
        final_files=tuple(sorted(p.name for p in output_dir.iterdir() if p.is_file())),
    )


def hf_second_run(output_dir: Path, max_steps: int = 6, scores=(0.30, 0.20, 0.95)):
    """A second Trainer run from step 0 into an earlier run's output_dir (save_total_limit=None: the
    earlier run's checkpoints stay), evaluated at `scores`; the Trainer, after train()."""
    from transformers import AutoModelForCausalLM, Trainer

    evaluations = iter(scores)

    def compute_metrics(_prediction):
        pause()
        return {"score": next(evaluations)}

    reset_accelerate_state()
    torch.manual_seed(1)
    with one_thread():
        model = AutoModelForCausalLM.from_config(tiny_gpt2_config())
        trainer = Trainer(
            model=model,
            args=hf_training_args(output_dir, max_steps=max_steps, save_total_limit=None),
            train_dataset=token_rows(16, 1),
            eval_dataset=token_rows(4, 2),
            compute_metrics=compute_metrics,
        )
        trainer.train()
    reset_accelerate_state()
    return trainer


def hf_resume_one_step(checkpoint: Path, scratch: Path) -> int:
    """Resume the Trainer from `checkpoint` (weights, optimizer, scheduler, RNG, state) and train one step more."""
    from transformers import AutoModelForCausalLM, Trainer

    step = int(checkpoint.name.split("-")[1])
    reset_accelerate_state()
    with one_thread():
        model = AutoModelForCausalLM.from_config(tiny_gpt2_config())
        args = hf_training_args(
            scratch,
            max_steps=step + 1,
            eval_strategy="no",
            save_strategy="no",
            load_best_model_at_end=False,
            metric_for_best_model=None,
            save_total_limit=None,
        )
        trainer = Trainer(model=model, args=args, train_dataset=token_rows(16, 1))
        trainer.train(resume_from_checkpoint=str(checkpoint))
    reset_accelerate_state()
    return trainer.state.global_step


# --- accelerate ---------------------------------------------------------------------------------

ACCELERATE_SAVES = 3


@dataclass(frozen=True)
class AccelerateRun:
    project_dir: Path  # automatic naming: project_dir/checkpoints/checkpoint_0 .. _2
    plain_dir: Path  # save_state(plain_dir)
    weights: Dict[str, Dict[str, torch.Tensor]]  # saved model weights by directory name


def _accelerate_objects():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    return model, optimizer, scheduler


def make_accelerator(project_dir: Path = None):
    """A fresh Accelerator with a fresh model, optimizer and scheduler prepared (for saving and loading)."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    reset_accelerate_state()
    config = None
    if project_dir is not None:
        config = ProjectConfiguration(project_dir=str(project_dir), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    model, optimizer, scheduler = accelerator.prepare(*_accelerate_objects())
    return accelerator, model, optimizer, scheduler


def _accelerate_step(accelerator, model, optimizer, scheduler) -> None:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()


def build_accelerate(root: Path) -> AccelerateRun:
    """save_state with ProjectConfiguration(automatic_checkpoint_naming=True) three times, and into a plain dir."""
    project_dir = root / "accelerate" / "project"
    plain_dir = root / "accelerate" / "plain_state"
    weights: Dict[str, Dict[str, torch.Tensor]] = {}
    with one_thread():
        accelerator, model, optimizer, scheduler = make_accelerator(project_dir)
        for index in range(ACCELERATE_SAVES):
            _accelerate_step(accelerator, model, optimizer, scheduler)
            accelerator.save_state()
            weights["checkpoint_%d" % index] = {k: v.clone() for k, v in model.state_dict().items()}
            pause()
        accelerator, model, optimizer, scheduler = make_accelerator()
        _accelerate_step(accelerator, model, optimizer, scheduler)
        accelerator.save_state(str(plain_dir))
        weights[plain_dir.name] = {k: v.clone() for k, v in model.state_dict().items()}
    reset_accelerate_state()
    return AccelerateRun(project_dir=project_dir, plain_dir=plain_dir, weights=weights)


def accelerate_load(directory: Path) -> Dict[str, torch.Tensor]:
    """Accelerator.load_state(directory) into fresh objects; the model weights it restored."""
    with one_thread():
        accelerator, model, _optimizer, _scheduler = make_accelerator()
        accelerator.load_state(str(directory))
    reset_accelerate_state()
    return {k: v.clone() for k, v in model.state_dict().items()}


# --- torch.distributed.checkpoint ---------------------------------------------------------------

DCP_COMPLETE = ("step_100", "step_200")
DCP_TRUNCATED = "step_300"  # complete save, then a shard cut in half (a full disk, a killed copy)
DCP_NO_METADATA = "step_400"  # the shards without .metadata (the coordinator died before finishing)


@dataclass(frozen=True)
class DcpRun:
    dir: Path  # holds one DCP directory per save
    weights: Dict[str, Dict[str, torch.Tensor]]


def dcp_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def build_dcp(root: Path) -> DcpRun:
    """dcp.save in one process (no process group), into step_N/ directories."""
    import torch.distributed.checkpoint as dcp

    parent = root / "dcp"
    weights: Dict[str, Dict[str, torch.Tensor]] = {}
    with one_thread():
        for index, name in enumerate(DCP_COMPLETE + (DCP_TRUNCATED, DCP_NO_METADATA)):
            torch.manual_seed(index)
            state = {"model": dcp_model().state_dict()}
            dcp.save(state, checkpoint_id=str(parent / name))
            weights[name] = {k: v.clone() for k, v in state["model"].items()}
            pause()
    shard = max((parent / DCP_TRUNCATED).glob("*.distcp"), key=lambda p: p.stat().st_size)
    with open(shard, "r+b") as handle:
        handle.truncate(shard.stat().st_size // 2)
    (parent / DCP_NO_METADATA / ".metadata").unlink()
    return DcpRun(dir=parent, weights=weights)


def dcp_load(directory: Path) -> Dict[str, torch.Tensor]:
    """dcp.load into a fresh model's state dict; the weights it restored."""
    import torch.distributed.checkpoint as dcp

    state = {"model": dcp_model().state_dict()}
    dcp.load(state, checkpoint_id=str(directory))
    return state["model"]


# --- DeepSpeed and Megatron-LM, from their documented names ----------------------------------


def _small_state(seed: int) -> Dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in torch.nn.Linear(8, 8).state_dict().items()}


def write_deepspeed_layout(root: Path, steps=(100, 200, 300), latest_tag: str = "global_step200") -> Path:
    """DeepSpeed's engine.save_checkpoint(save_dir) names: global_stepN/ with mp_rank_00_model_states.pt and
    zero_pp_rank_0_mp_rank_00_optim_states.pt per rank, a `latest` file holding the tag, and the
    zero_to_fp32.py script it copies in. `latest` may lag the newest tag (a save that died before
    updating it): here it names global_step200 while global_step300 exists."""
    root.mkdir(parents=True)
    for step in steps:
        tag = root / ("global_step%d" % step)
        tag.mkdir()
        torch.save(
            {
                "module": _small_state(step),
                "global_steps": step,
                "iteration": step,
                "dp_world_size": 1,
                "mp_world_size": 1,
            },
            tag / "mp_rank_00_model_states.pt",
        )
        torch.save(
            {"optimizer_state_dict": {"state": {}}, "ds_version": "0.16.0"},
            tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        )
        pause()
    (root / "latest").write_text(latest_tag)
    (root / "zero_to_fp32.py").write_text("#!/usr/bin/env python\n# DeepSpeed's conversion script (stand-in)\n")
    return root


def write_megatron_layout(root: Path, iterations=(100, 200, 300), tracked: int = 200) -> Path:
    """Megatron-LM's save_checkpoint names: iter_0000100/mp_rank_00/model_optim_rng.pt per iteration and
    latest_checkpointed_iteration.txt holding the iteration that finished (here 200 of 300)."""
    root.mkdir(parents=True)
    for iteration in iterations:
        rank_dir = root / ("iter_%07d" % iteration) / "mp_rank_00"
        rank_dir.mkdir(parents=True)
        torch.save(
            {"model": _small_state(iteration), "iteration": iteration, "checkpoint_version": 3.0},
            rank_dir / "model_optim_rng.pt",
        )
        pause()
    (root / "latest_checkpointed_iteration.txt").write_text(str(tracked))
    return root


# --- session fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def library_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("library-checkpoints")


@pytest.fixture(scope="session")
def lightning_run(library_root) -> LightningRun:
    pytest.importorskip("lightning")
    return build_lightning(library_root)


@pytest.fixture(scope="session")
def hf_run(library_root) -> HfRun:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    return build_hf(library_root)


@pytest.fixture(scope="session")
def accelerate_run(library_root) -> AccelerateRun:
    pytest.importorskip("accelerate")
    return build_accelerate(library_root)


@pytest.fixture(scope="session")
def dcp_run(library_root) -> DcpRun:
    return build_dcp(library_root)


def copy_artifact(source: Path, dest_parent: Path) -> Path:
    """A copy that keeps every mtime (copy2 for files, copystat for directories), as rsync -a would."""
    dest = dest_parent / source.name
    shutil.copytree(source, dest, symlinks=True)
    return dest


def tree(root: Path) -> Dict[str, int]:
    """Every file under root (relative path -> size)."""
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}
