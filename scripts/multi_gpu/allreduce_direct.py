"""Step 1's yardstick: torch.distributed all-reduce (NCCL, one process per GPU) timed directly.

    python scripts/multi_gpu/allreduce_direct.py --out FILE.json [--mib 1024] [--iterations 5]

The same message as the suite's level-2 NCCL check (1024 MiB of float32, sum), on every GPU that
torch sees, one process each (torch.multiprocessing); two warm-ups, then --iterations timed between
barriers and cuda syncs. Bus bandwidth as nccl-tests reports it (algbw x 2(n-1)/n), the same formula
as opsconsole/probe/health_mode.py's bus_bandwidth_gbps, so the two figures can stand side by side.
Needs 2 GPUs: with fewer it writes {"skipped": ...} and says so.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worker(rank, world, port, mib, iterations, result_path):
    import datetime

    import torch
    import torch.distributed as dist

    from opsconsole.probe.health_mode import bus_bandwidth_gbps

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", rank=rank, world_size=world, device_id=device, timeout=datetime.timedelta(seconds=120)
    )
    count = (mib << 20) // 4
    tensor = torch.empty(count, dtype=torch.float32, device=device)
    for _ in range(2):  # warm-up: builds the communicator and its channels
        tensor.fill_(float(rank + 1))
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        tensor.fill_(float(rank + 1))
        torch.cuda.synchronize()
        dist.barrier()
        begin = time.perf_counter()
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
    expected = world * (world + 1) / 2.0
    wrong = int((tensor != expected).sum().item())
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a collective ends when its slowest rank does
    if rank == 0:
        per_iteration = slowest.tolist()
        median = statistics.median(per_iteration)
        algbw, busbw = bus_bandwidth_gbps(count * 4, median, world)
        best_algbw, best_busbw = bus_bandwidth_gbps(count * 4, min(per_iteration), world)
        with open(result_path, "w") as out:
            json.dump(
                {
                    "ranks": world,
                    "bytes": count * 4,
                    "iterations": iterations,
                    "seconds": per_iteration,
                    "median_s": median,
                    "algbw_gbps": round(algbw, 1),
                    "busbw_gbps": round(busbw, 1),
                    "best_busbw_gbps": round(best_busbw, 1),
                    "wrong_elements": wrong,
                    "torch": torch.__version__,
                    "nccl": ".".join(str(p) for p in torch.cuda.nccl.version()),
                },
                out,
                indent=1,
            )
    dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # as the suite numbers GPUs
    for name, value in (
        ("NCCL_NVLS_ENABLE", "0"),
        ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
        ("NVSHMEM_DISABLE_NVLS", "1"),
    ):
        os.environ[name] = value  # NVLink multicast stays off
    import torch
    import torch.multiprocessing as mp

    world = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if world < 2:
        message = "skipped: needs 2 GPUs (found %d)" % world
        with open(args.out, "w") as out:
            json.dump({"skipped": message}, out)
        print("torch.distributed all-reduce: " + message)
        return 0
    mp.spawn(worker, args=(world, free_port(), args.mib, args.iterations, args.out), nprocs=world, join=True)
    with open(args.out) as handle:
        result = json.load(handle)
    print(
        "torch.distributed all-reduce, NCCL, %d processes, %d MiB: median %.2f ms, bus bandwidth %.0f GB/s (best %.0f), %d wrong"
        % (
            world,
            args.mib,
            result["median_s"] * 1000,
            result["busbw_gbps"],
            result["best_busbw_gbps"],
            result["wrong_elements"],
        )
    )
    return 0 if result["wrong_elements"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
