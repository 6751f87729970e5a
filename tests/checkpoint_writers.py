"""Real checkpoints for the checkpoint tests, written by torch in each layout the console reads.

A helper module, not a test file: collecting the suite does not import torch for it.

The seed layout is written by the seed chapter's own CheckpointManager (copied below, with
its `torch.save`, `checkpoint_best.pt` copy and `checkpoint_latest.pt` symlink), so the
tests read exactly what that code leaves on disk. No tests live here.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence

import torch

torch.manual_seed(0)


def small_model() -> "tuple":
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    scheduler.step()
    return model, optimizer, scheduler


class CheckpointManager:
    """The seed's CheckpointManager (save, best copy, latest symlink, max_to_keep cleanup)."""

    def __init__(self, save_dir, max_to_keep=5, save_best=True):
        self.save_dir = save_dir
        self.max_to_keep = max_to_keep
        self.save_best = save_best
        self.best_loss = float("inf")
        os.makedirs(save_dir, exist_ok=True)

    def save(self, model, optimizer, scheduler, epoch, loss, metrics=None):
        checkpoint = {
            "epoch": epoch,
            "model_state_dict": model.state_dict(),
            "optimizer_state_dict": optimizer.state_dict(),
            "scheduler_state_dict": scheduler.state_dict() if scheduler else None,
            "loss": loss,
            "best_loss": self.best_loss,
            "timestamp": datetime.datetime.now().isoformat(),
        }
        if metrics:
            checkpoint["metrics"] = metrics
        path = os.path.join(self.save_dir, f"checkpoint_epoch_{epoch}.pt")
        torch.save(checkpoint, path)
        self._update_latest(path)
        if self.save_best and loss < self.best_loss:
            self.best_loss = loss
            best_path = os.path.join(self.save_dir, "checkpoint_best.pt")
            torch.save(checkpoint, best_path)
        self._cleanup()
        return path

    def _update_latest(self, path):
        latest_path = os.path.join(self.save_dir, "checkpoint_latest.pt")
        if os.path.lexists(latest_path):
            os.remove(latest_path)
        os.symlink(os.path.basename(path), latest_path)

    def _cleanup(self):
        checkpoints = sorted(glob.glob(os.path.join(self.save_dir, "checkpoint_epoch_*.pt")))
        while len(checkpoints) > self.max_to_keep:
            os.remove(checkpoints.pop(0))


def set_mtime(path: Path, when: float) -> None:
    os.utime(path, (when, when), follow_symlinks=False)


def write_seed_layout(
    root: Path, losses: Sequence[float] = (0.9, 0.5, 0.7, 0.6, 0.65), age_s: float = 3600.0
) -> Dict[int, Path]:
    """checkpoint_epoch_{N}.pt per loss, checkpoint_best.pt, the checkpoint_latest.pt symlink; mtimes
    one minute apart, the newest `age_s` ago (older than min_age)."""
    model, optimizer, scheduler = small_model()
    manager = CheckpointManager(str(root), max_to_keep=100)
    paths = {}
    for epoch, loss in enumerate(losses):
        paths[epoch] = Path(manager.save(model, optimizer, scheduler, epoch, loss, metrics={"acc": 0.5 + epoch / 100}))
    start = time.time() - age_s - 60 * len(losses)
    for epoch, path in paths.items():
        set_mtime(path, start + 60 * epoch)
    set_mtime(root / "checkpoint_best.pt", start + 60 * losses.index(min(losses)))
    return paths


def write_lightning_layout(root: Path) -> List[Path]:
    """Checkpoints as Lightning's ModelCheckpoint names and fills them (callbacks state, global_step)."""
    root.mkdir(parents=True, exist_ok=True)
    model, optimizer, scheduler = small_model()
    out = []
    for epoch, (step, loss) in enumerate([(100, 0.8), (200, 0.4), (300, 0.45)]):
        state = {
            "epoch": epoch,
            "global_step": step,
            "pytorch-lightning_version": "2.4.0",
            "state_dict": model.state_dict(),
            "optimizer_states": [optimizer.state_dict()],
            "lr_schedulers": [scheduler.state_dict()],
            "callbacks": {
                "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}": {
                    "monitor": "val_loss",
                    "best_model_score": torch.tensor(min(0.8, loss)),
                    "current_score": torch.tensor(loss),
                },
            },
        }
        path = root / ("epoch=%d-step=%d.ckpt" % (epoch, step))
        torch.save(state, path)
        out.append(path)
    torch.save(state, root / "last.ckpt")
    return out


def safetensors_bytes(tensors: Dict[str, "torch.Tensor"], metadata: Dict[str, str]) -> bytes:
    """A safetensors file written by hand: 8-byte header length, JSON header, raw data."""
    names = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64"}
    header: Dict[str, object] = {"__metadata__": metadata}
    data = b""
    for name, tensor in tensors.items():
        raw = bytes(tensor.detach().contiguous().view(-1).view(torch.uint8).tolist())  # no numpy needed
        header[name] = {
            "dtype": names[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def write_hf_layout(root: Path, steps: Sequence[int] = (500, 1000), best: int = 500) -> List[Path]:
    """Hugging Face Trainer checkpoint-N/ dirs: trainer_state.json, model.safetensors, optimizer.pt ..."""
    model, optimizer, scheduler = small_model()
    out = []
    for index, step in enumerate(steps):
        folder = root / ("checkpoint-%d" % step)
        folder.mkdir(parents=True)
        tensors = {k: v.detach() for k, v in model.state_dict().items()}
        (folder / "model.safetensors").write_bytes(safetensors_bytes(tensors, {"format": "pt"}))
        torch.save(optimizer.state_dict(), folder / "optimizer.pt")
        torch.save(scheduler.state_dict(), folder / "scheduler.pt")
        (folder / "config.json").write_text("{}")
        history = [{"loss": 1.0 / (i + 1), "step": s} for i, s in enumerate(steps[: index + 1])]
        history.append({"eval_loss": 0.3 + 0.1 * index, "eval_accuracy": 0.9, "step": step})
        state = {
            "epoch": float(index + 1),
            "global_step": step,
            "best_metric": 0.3,
            "best_model_checkpoint": str(root / ("checkpoint-%d" % best)),
            "log_history": history,
        }
        (folder / "trainer_state.json").write_text(json.dumps(state))
        out.append(folder)
    return out


def write_dcp(root: Path, name: str = "step_40") -> Path:
    """A torch.distributed.checkpoint directory saved by DCP itself (CPU, one process)."""
    import torch.distributed.checkpoint as dcp

    model, _, _ = small_model()
    path = root / name
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(path))
    return path


def write_in_other_process(path: Path, code: str) -> None:
    """Run `code` (with `path` as PATH) in a fresh interpreter: a file written by another process."""
    subprocess.run(
        [sys.executable, "-c", "PATH = %r\n" % str(path) + code],
        check=True,
        timeout=60,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
