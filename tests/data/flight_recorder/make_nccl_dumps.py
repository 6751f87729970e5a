"""Make the NCCL flight-recorder fixtures of this folder on a machine with one CUDA GPU.

Run: TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DEBUG_INFO_TEMP_FILE=OUTDIR/nccl_trace_rank_ \
     TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/fr_pipe_ python3 make_nccl_dumps.py OUTDIR

One rank, an NCCL group of one: a few collectives of different ops, sizes and dtypes, then a
dump asked for through the pipe (`<pipe file><rank>.pipe`, as an operator would) which torch
writes to `<temp file><rank>`, and the same trace taken in-process with `_dump_nccl_trace()`.
"""

import json
import os
import pickle
import sys
import time

import torch
import torch.distributed as dist


def main(outdir: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    rank = dist.get_rank()
    device = torch.device("cuda", 0)

    def train_step() -> None:
        grads = torch.ones(1024, 256, device=device, dtype=torch.bfloat16)
        dist.all_reduce(grads)
        loss = torch.tensor([2.5], device=device, dtype=torch.float32)
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)

    weights = torch.arange(4096, device=device, dtype=torch.float32)
    dist.broadcast(weights, src=0)
    for _ in range(3):
        train_step()
    flags = torch.zeros(8, device=device, dtype=torch.int64)
    dist.broadcast(flags, src=0)
    gathered = torch.empty(1, 16, device=device, dtype=torch.float16)
    dist.all_gather_into_tensor(gathered, torch.ones(1, 16, device=device, dtype=torch.float16))
    dist.barrier()
    torch.cuda.synchronize()

    pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + "%d.pipe" % rank
    dump = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + "%d" % rank
    for _ in range(300):
        if os.path.exists(pipe):
            break
        time.sleep(0.1)
    print("pipe exists:", os.path.exists(pipe), pipe)
    fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    os.write(fd, b"1\n")
    os.close(fd)
    for _ in range(600):
        if os.path.exists(dump) and os.path.getsize(dump) > 0:
            break
        time.sleep(0.1)
    time.sleep(1)
    print("pipe dump:", dump, os.path.getsize(dump) if os.path.exists(dump) else "missing")

    import torch._C._distributed_c10d as c10d

    direct = c10d._dump_nccl_trace()
    with open(os.path.join(outdir, "direct_dump_nccl_trace_rank_0.pkl"), "wb") as out:
        out.write(direct)
    if hasattr(c10d, "_dump_nccl_trace_json"):
        with open(os.path.join(outdir, "direct_dump_nccl_trace_rank_0.json"), "wb") as out:
            out.write(c10d._dump_nccl_trace_json())
    trace = pickle.loads(direct)
    summary = {
        "torch": torch.__version__,
        "nccl": list(torch.cuda.nccl.version()),
        "keys": sorted(trace),
        "version": trace.get("version"),
        "pg_config": trace.get("pg_config"),
        "pg_status": trace.get("pg_status"),
        "entries": [{k: v for k, v in e.items() if k != "frames"} for e in trace.get("entries", [])],
        "first_frames": trace["entries"][0].get("frames", [])[:6] if trace.get("entries") else None,
    }
    print(json.dumps(summary, indent=1, default=str))
    with open(os.path.join(outdir, "summary.json"), "w") as out:
        json.dump(summary, out, indent=1, default=str)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
