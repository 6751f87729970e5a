"""A real, small distributed torch training run on the CPU that ends the way real runs often do.

Written after the seed chapter's own code: `setup_training_logger` (one log per rank,
`train_{hostname}_rank{rank}_{timestamp}.log`, '%(asctime)s - %(levelname)s - %(message)s'),
`CheckpointManager` (checkpoint_epoch_{N}.pt, checkpoint_best.pt, a checkpoint_latest.pt
symlink, the newest max_to_keep), `check_nan`, and `GracefulKiller` (SIGINT/SIGTERM save a
checkpoint, then exit). Ranks run DistributedDataParallel over gloo on 127.0.0.1.

At `--fail-at-epoch` the data loader starts yielding a corrupt batch (an inf in the
inputs): the loss goes NaN, rank 0 logs it and raises, and the other ranks lose their
peer, as a real NaN incident reads in the logs.

    python -m opsconsole.demo.train --dir DIR [--ranks 2] [--epochs 40] [--fail-at-epoch 12]
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import signal
import socket
import sys
import time
from datetime import datetime


def setup_training_logger(log_dir: str, rank: int) -> logging.Logger:
    """The seed's logger: one file per rank, named for the host and rank."""
    os.makedirs(log_dir, exist_ok=True)
    logger = logging.getLogger("training")
    logger.setLevel(logging.INFO)
    timestamp = datetime.now().strftime("%Y%m%d_%H%M%S")
    hostname = socket.gethostname()
    handler = logging.FileHandler(os.path.join(log_dir, "train_%s_rank%d_%s.log" % (hostname, rank, timestamp)))
    handler.setFormatter(logging.Formatter("%(asctime)s - %(levelname)s - %(message)s"))
    logger.addHandler(handler)
    return logger


class CheckpointManager:
    """The seed's checkpoint manager: epoch files, best, a latest symlink, the newest max_to_keep."""

    def __init__(self, save_dir: str, logger: logging.Logger, max_to_keep: int = 3) -> None:
        self.save_dir = save_dir
        self.max_to_keep = max_to_keep
        self.best_loss = float("inf")
        self.logger = logger
        os.makedirs(save_dir, exist_ok=True)

    def save(self, model, optimizer, scheduler, epoch: int, loss: float, metrics=None) -> None:
        import torch

        checkpoint = {
            "epoch": epoch,
            "model_state_dict": model.state_dict(),
            "optimizer_state_dict": optimizer.state_dict(),
            "scheduler_state_dict": scheduler.state_dict() if scheduler else None,
            "loss": loss,
            "best_loss": self.best_loss,
            "timestamp": datetime.now().isoformat(),
        }
        if metrics:
            checkpoint["metrics"] = metrics
        path = os.path.join(self.save_dir, "checkpoint_epoch_%d.pt" % epoch)
        torch.save(checkpoint, path)
        self.logger.info("Checkpoint saved: %s", path)
        latest = os.path.join(self.save_dir, "checkpoint_latest.pt")
        if os.path.lexists(latest):
            os.remove(latest)
        os.symlink(os.path.basename(path), latest)
        if loss < self.best_loss:
            self.best_loss = loss
            torch.save(checkpoint, os.path.join(self.save_dir, "checkpoint_best.pt"))
            self.logger.info("Best checkpoint updated: loss=%.4f", loss)
        checkpoints = sorted(
            glob.glob(os.path.join(self.save_dir, "checkpoint_epoch_*.pt")),
            key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]),
        )
        while len(checkpoints) > self.max_to_keep:
            old = checkpoints.pop(0)
            os.remove(old)
            self.logger.info("Removed old checkpoint: %s", old)


class GracefulKiller:
    """SIGINT/SIGTERM ask the loop to save a checkpoint and stop (the seed's pattern)."""

    def __init__(self) -> None:
        self.kill_now = False
        signal.signal(signal.SIGINT, self.exit_gracefully)
        signal.signal(signal.SIGTERM, self.exit_gracefully)

    def exit_gracefully(self, signum, frame) -> None:
        self.kill_now = True


def check_nan(tensor, name: str, logger: logging.Logger) -> bool:
    import torch

    if torch.isnan(tensor).any():
        logger.error("%s contains NaN!", name)
        return True
    if torch.isinf(tensor).any():
        logger.error("%s contains Inf!", name)
        return True
    return False


def run_rank(rank: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    logger = setup_training_logger(os.path.join(args.dir, "logs"), rank)
    dist.init_process_group(
        "gloo",
        init_method="tcp://127.0.0.1:%d" % args.port,
        rank=rank,
        world_size=args.ranks,
        timeout=__import__("datetime").timedelta(seconds=args.peer_timeout),
    )
    torch.manual_seed(1234 + rank)
    logger.info("Training started on %s", socket.gethostname())
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    logger.info("Model: %s, %d parameters", model.__class__.__name__, sum(p.numel() for p in model.parameters()))
    logger.info("GPU: none (CPU demo), world size %d, backend gloo", args.ranks)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
    manager = CheckpointManager(os.path.join(args.dir, "checkpoints"), logger, max_to_keep=3) if rank == 0 else None
    killer = GracefulKiller()
    weights = torch.randn(32, 1)
    steps_per_epoch = args.steps
    loss_value = float("nan")
    for epoch in range(1, args.epochs + 1):
        total = 0.0
        for step in range(1, steps_per_epoch + 1):
            x = torch.randn(64, 32)
            if args.fail_at_epoch and epoch >= args.fail_at_epoch and step == steps_per_epoch // 2 and rank == 0:
                x[3, 7] = float("inf")  # a corrupt record in this rank's shard
            y = x @ weights + 0.05 * torch.randn(64, 1)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            if check_nan(loss, "loss", logger):
                logger.error(
                    "Epoch %d step %d: loss is %s; stopping (check the learning rate, loss scaling and the data)",
                    epoch,
                    step,
                    loss.item(),
                )
                raise FloatingPointError("loss is %s at epoch %d step %d" % (loss.item(), epoch, step))
            loss.backward()
            optimizer.step()
            total += loss.item()
            if step % 10 == 0:
                logger.info(
                    "Epoch %d step %d/%d loss %.4f lr %.2e",
                    epoch,
                    step,
                    steps_per_epoch,
                    loss.item(),
                    scheduler.get_last_lr()[0],
                )
            time.sleep(args.step_sleep)
            if killer.kill_now:
                break
        scheduler.step()
        loss_value = total / steps_per_epoch
        logger.info("Epoch %d done: mean loss %.4f", epoch, loss_value)
        if manager is not None:
            manager.save(ddp.module, optimizer, scheduler, epoch, loss_value, metrics={"mse": loss_value})
        if killer.kill_now:
            logger.warning("Received a stop signal: checkpoint saved at epoch %d, exiting", epoch)
            break
    dist.destroy_process_group()
    logger.info("Training finished, final loss %.4f", loss_value)


def _rank_main(rank: int, args: argparse.Namespace) -> None:
    try:
        run_rank(rank, args)
    except Exception:
        logging.getLogger("training").exception("Rank %d failed", rank)
        raise


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="A small distributed CPU training run for the demo.")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=40, help="steps per epoch")
    parser.add_argument("--step-sleep", type=float, default=0.02, help="seconds per step, so the run is watchable")
    parser.add_argument("--fail-at-epoch", type=int, default=6, help="0: never fail")
    parser.add_argument("--port", type=int, default=0, help="rendezvous port (0: a free one)")
    parser.add_argument("--peer-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    if not args.port:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    import torch.multiprocessing as mp

    try:
        mp.spawn(_rank_main, args=(args,), nprocs=args.ranks, join=True)
    except Exception as exc:  # a rank failed: the logs say why; the exit status says that it did
        print("demo training stopped: %s" % str(exc).strip().splitlines()[-1], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
