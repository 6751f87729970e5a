"""On a machine with one CUDA GPU: the console's collector asks a live NCCL rank for a dump through its FIFO.

Run from the repository root: python3 tests/data/flight_recorder/check_pipe_collect.py OUTDIR

Starts one rank (an NCCL group of one, TORCH_FR_BUFFER_SIZE=2000, the dump FIFO on) that runs a few
collectives and then waits, as a hung rank would; then opsconsole.hang.flight_recorder.collect_dumps,
given only the rank's (pid, rank), reads its environment, writes to its FIFO, waits for torch's dump
and copies it into OUTDIR/<host>/; the dump is then read and matched as `opsconsole fr` does.
"""

import asyncio
import os
import subprocess
import sys
import time

RANK = r"""
import os, time, torch, torch.distributed as dist
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
x = torch.ones(256, 256, device="cuda", dtype=torch.bfloat16)
for _ in range(4):
    dist.all_reduce(x)
dist.broadcast(torch.zeros(16, device="cuda", dtype=torch.int64), src=0)
torch.cuda.synchronize()
open(os.environ["READY_FILE"], "w").close()
time.sleep(120)
"""


async def main(outdir: str) -> None:
    sys.path.insert(0, os.getcwd())
    from opsconsole.hang import flight_recorder as fr

    os.makedirs(outdir, exist_ok=True)
    scratch = "/tmp/fr_check"
    os.makedirs(scratch, exist_ok=True)
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29533",
        TORCH_FR_BUFFER_SIZE="2000",
        TORCH_FR_DUMP_TEMP_FILE=scratch + "/nccl_trace_rank_",
        TORCH_NCCL_DEBUG_INFO_PIPE_FILE=scratch + "/pipe_",
        READY_FILE=scratch + "/ready",
    )
    rank = subprocess.Popen([sys.executable, "-c", RANK], env=env)
    try:
        for _ in range(600):
            if os.path.exists(env["READY_FILE"]) and os.path.exists(scratch + "/pipe_0.pipe"):
                break
            time.sleep(0.1)
        started = time.monotonic()
        collected = await fr.collect_dumps(None, [], outdir, host="h200", wait_s=30, rank_pids=[(rank.pid, 0)])
        print("collected in %.2f s:" % (time.monotonic() - started), collected)
        analysis = fr.match_dumps(
            [fr.replace(fr.dump_from_bytes(open(p, "rb").read()), path=p, rank=0, host="h200") for p in collected.saved]
        )
        print(fr.summary_text(analysis))
        for dump in analysis.dumps:
            print(
                dump.path,
                dump.version,
                dump.comm_lib_version,
                [(e.collective_seq_id, e.op, e.state) for e in dump.entries],
            )
    finally:
        rank.kill()
        rank.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
