"""Step 3's job: two ranks under torchrun; rank 1 skips the evaluation's collective and waits.

Run by scripts/multi_gpu/hang.py:  torchrun --nproc-per-node 2 hang_job.py BACKEND DIR TIMEOUT_S
(BACKEND nccl: one GPU per rank; gloo: the CPU). Collectives 1-4 are the train steps (all_reduce,
all_reduce + broadcast, all_reduce); collective 5 is the evaluation's all_reduce, which rank 1 never
joins; rank 0 then stands in a barrier (collective 6) until the process group's timeout ends it.
Each rank writes its own flight-recorder trace to DIR/own/trace_rank_<rank> once the hang is set,
so a set of dumps exists whatever the watchdog does; DIR/ready_<rank> says where each one is.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

backend, directory, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
timeout = datetime.timedelta(seconds=timeout_s)
if backend == "nccl":
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=timeout, device_id=device)
    dtype = torch.bfloat16
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo", timeout=timeout)
    dtype = torch.float32


def dump_own_trace():
    import torch._C._distributed_c10d as c10d

    path = os.path.join(directory, "own", "trace_rank_%d" % rank)
    try:  # gloo's recorder is read with _dump_fr_trace (torch 2.13); a build without it is said so
        data = c10d._dump_nccl_trace() if backend == "nccl" else c10d._dump_fr_trace()
    except Exception as exc:
        with open(path + ".error", "w") as out:
            out.write("%s: %s\n" % (type(exc).__name__, exc))
        return
    with open(path + ".tmp", "wb") as out:
        out.write(data)
    os.rename(path + ".tmp", path)


def ready(where):
    with open(os.path.join(directory, "ready_%d" % rank), "w") as out:
        out.write(where)


def train_step(step):
    grads = torch.ones(1024, 256, device=device, dtype=dtype)
    dist.all_reduce(grads)
    if step == 1:
        dist.broadcast(torch.zeros(8, device=device, dtype=torch.int64), src=0)


def evaluate():
    return dist.all_reduce(torch.ones(3, device=device), async_op=True)  # collective 5


def skip_the_evaluation():
    dump_own_trace()
    ready("skip_the_evaluation")
    time.sleep(3600)  # HANG: rank 1 waits here and never joins collective 5


for step in range(3):
    train_step(step)
if backend == "nccl":
    torch.cuda.synchronize()
if rank == 1:
    skip_the_evaluation()
work = evaluate()
dump_own_trace()
ready("barrier")
dist.barrier()  # rank 0 stands in collective 6 behind collective 5 until the timeout
print("rank %d: the barrier returned, which a hang should not allow" % rank, flush=True)
sys.exit(3)
