"""The real torch workload the shipped H200 recording was made under: a small transformer trained in bf16.

Phases, so the recording shows what the console is for: warm-up, steady training near full
utilisation, a checkpoint pause every 40 s (the GPU idles while the host writes), and a
larger-batch phase that raises memory and power.

    python examples/h200_training_load.py --seconds 150
"""

import argparse
import os
import tempfile
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=150.0)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=2048, nhead=16, dim_feedforward=8192, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=8).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    start = time.time()
    step = 0
    next_checkpoint = start + 40
    with tempfile.TemporaryDirectory() as ckpt_dir:
        while time.time() - start < args.seconds:
            elapsed = time.time() - start
            batch = 8 if elapsed < 90 else 24  # a larger-batch phase: more memory, more power
            x = torch.randn(batch, 512, 2048, device=device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % 20 == 0:
                torch.cuda.synchronize()
                print(
                    "t=%.0fs step %d batch %d loss %.4f mem %.1f GiB"
                    % (elapsed, step, batch, loss.item(), torch.cuda.memory_allocated() / 2**30),
                    flush=True,
                )
            if time.time() >= next_checkpoint:
                torch.cuda.synchronize()
                t0 = time.time()
                torch.save(
                    {"step": step, "model_state_dict": model.state_dict()},
                    os.path.join(ckpt_dir, "checkpoint_step_%d.pt" % step),
                )
                time.sleep(3)  # the host side of a checkpoint: the GPU waits
                print("checkpoint at step %d took %.1fs" % (step, time.time() - t0), flush=True)
                next_checkpoint += 40


if __name__ == "__main__":
    main()
