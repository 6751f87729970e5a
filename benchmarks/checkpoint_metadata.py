"""Metadata of a 2 GB checkpoint with optimizer state: our read vs torch.load, in the same run.

Writes a CheckpointManager-style checkpoint (model weights + AdamW exp_avg/exp_avg_sq +
scheduler, epoch, loss, timestamp) of about 2 GB into a temp dir, warms the page cache,
then times (median of several runs each):
  ours        opsconsole's reader: zip directory + data.pkl through the restricted unpickler
  worker      the same reader in the limited metadata worker process (how the console reads),
              and the worker's peak memory (what RLIMIT_AS must leave room for)
  full        torch.load(weights_only=True)
  mmap        torch.load(mmap=True, weights_only=True)
and prints the figures and the ratios full/ours and mmap/ours. The file is removed at the end.

Run: .venv/bin/python benchmarks/checkpoint_metadata.py [--gb 2.0] [--repeat 5]
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
warnings.filterwarnings("ignore")


def make_checkpoint(path: str, gigabytes: float) -> int:
    import torch

    # Weights are a third of the file: AdamW keeps two more tensors of the same size per parameter.
    per_tensor = 4 * 1024 * 1024  # floats (16 MiB)
    count = max(1, int(gigabytes * 2**30 / 3 / (per_tensor * 4)))
    model = {"layer%d.weight" % i: torch.randn(per_tensor // 1024, 1024) for i in range(count)}
    model["head.bias"] = torch.zeros(1024)
    state = {}
    for index, tensor in enumerate(model.values()):
        state[index] = {
            "step": torch.tensor(100.0),
            "exp_avg": torch.randn_like(tensor),
            "exp_avg_sq": torch.rand_like(tensor),
        }
    optimizer = {
        "state": state,
        "param_groups": [
            {
                "lr": 1e-3,
                "betas": (0.9, 0.999),
                "eps": 1e-8,
                "weight_decay": 0.01,
                "amsgrad": False,
                "params": list(range(len(model))),
            }
        ],
    }
    checkpoint = {
        "epoch": 12,
        "model_state_dict": model,
        "optimizer_state_dict": optimizer,
        "scheduler_state_dict": {"step_size": 1, "gamma": 0.1, "base_lrs": [1e-3], "last_epoch": 12},
        "loss": 0.4321,
        "best_loss": 0.4,
        "timestamp": datetime.datetime.now().isoformat(),
    }
    torch.save(checkpoint, path)
    return os.path.getsize(path)


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import torch

    from opsconsole.checkpoints import formats
    from opsconsole.checkpoints.access import LOCAL

    folder = tempfile.mkdtemp(prefix="ckpt-bench-")
    try:
        path = os.path.join(folder, "checkpoint_epoch_12.pt")
        size = make_checkpoint(path, args.gb)
        with open(path, "rb") as f:  # warm the page cache: every method reads from memory
            while f.read(64 * 2**20):
                pass

        def ours():
            result = LOCAL.run_reader(path, lambda n: formats.file_reader("checkpoint_epoch_12.pt", n))
            assert result.meta.epoch == 12 and result.meta.has_optimizer and result.integrity == "ok", result

        def full():
            loaded = torch.load(path, weights_only=True)
            assert loaded["epoch"] == 12

        def mmap():
            loaded = torch.load(path, mmap=True, weights_only=True)
            assert loaded["epoch"] == 12

        ours()
        result = LOCAL.run_reader(path, lambda n: formats.file_reader("checkpoint_epoch_12.pt", n))
        from opsconsole.checkpoints.worker import METADATA_WORKERS

        def in_worker():
            result = METADATA_WORKERS.read(LOCAL, path, "file", name="checkpoint_epoch_12.pt", window=64 * 1024)
            assert result.meta.epoch == 12 and result.meta.has_optimizer and result.integrity == "ok", result

        in_worker()  # starts it
        t_ours = median_time(ours, args.repeat * 4)
        t_worker = median_time(in_worker, args.repeat * 4)
        worker_stats = METADATA_WORKERS.stats()
        t_full = median_time(full, args.repeat)
        t_mmap = median_time(mmap, args.repeat)
        meta = result.meta
        print(
            "checkpoint: %.2f GB, %d storages, state dict %d tensors, optimizer %s"
            % (size / 1e9, meta.tensor_count, meta.state_dict.keys, meta.has_optimizer)
        )
        print("metadata read (ours):                     %8.2f ms" % (t_ours * 1e3))
        print(
            "metadata read in the worker:              %8.2f ms  (worker peak RSS %d KiB, peak VM %d KiB, RLIMIT_AS %d MiB)"
            % (
                t_worker * 1e3,
                worker_stats.get("VmHWM", 0),
                worker_stats.get("VmPeak", 0),
                METADATA_WORKERS.limits.memory_bytes >> 20,
            )
        )
        print("torch.load(weights_only=True):            %8.2f ms" % (t_full * 1e3))
        print("torch.load(mmap=True, weights_only=True): %8.2f ms" % (t_mmap * 1e3))
        print(
            "ratio full/ours: %.0fx (target >= 50x)   ratio mmap/ours: %.1fx (target > 1x)"
            % (t_full / t_ours, t_mmap / t_ours)
        )
        print(
            "ratio full/worker: %.0fx (target >= 50x)   ratio worker/ours: %.2fx"
            % (t_full / t_worker, t_worker / t_ours)
        )
        ok = t_full / t_worker >= 50 and t_mmap > t_ours
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
