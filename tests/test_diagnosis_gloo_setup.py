"""gloo losing a peer while the process group is being set up (DDP's first collective) is the peer's loss, not NCCL's
network: a real 2-rank torchrun job on CPU, and its output kept under tests/data/torchrun_gloo_setup_peer_killed.

Rank 1 SIGKILLs itself (the OOM killer's signal) right after init_process_group; rank 0's DDP(model) runs its
parameter shape check (_verify_param_shape_across_processes), where gloo says "Connection closed by peer". That
frame is one of the process-group setup frames, where a lost NCCL connection means peers that could not reach each
other: the line was "NCCL network/system error" [nccl_network], the root cause of rank 0's file read alone.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.torchrun import diagnose_json as diagnose
from tests.torchrun import torchrun_command, torchrun_env

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "tests" / "data" / "torchrun_gloo_setup_peer_killed"
RUN_TIMEOUT_S = 240
# The launcher stops rank 0 at its first look after rank 1's death: a long interval leaves rank 0 the time to reach
# DDP's collective and write what gloo said (the first look comes 30 s after the start, before which rank 1 is dead).
MONITOR_INTERVAL_S = 30

WORKER = textwrap.dedent("""
    import logging, os, sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    log_dir = sys.argv[1]
    rank = int(os.environ["RANK"])
    logging.basicConfig(filename=os.path.join(log_dir, "train_local_rank%d_x.log" % rank), level=logging.INFO,
                        format="%(asctime)s - %(levelname)s - %(message)s")
    log = logging.getLogger("train")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    log.info("rank %d of %d: process group up", rank, dist.get_world_size())
    print("rank %d: process group up, wrapping the model in DDP" % rank, flush=True)
    if rank == 1:
        os.kill(os.getpid(), 9)  # killed (as the OOM killer kills) while rank 0 sets up DDP: its first collective
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    log.info("model wrapped")
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def live_run(tmp_path_factory) -> Path:
    """A fresh run of the worker under torchrun: its directory (launcher.log, torchrun/, the ranks' logs)."""
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("gloo_setup")
    script = base / "worker.py"
    script.write_text(WORKER)
    run = base / "run"
    run.mkdir()
    command = torchrun_command(script, str(run), log_dir=run / "torchrun", monitor_interval_s=MONITOR_INTERVAL_S)
    with open(run / "launcher.log", "wb") as launcher:
        process = subprocess.Popen(command, stdout=launcher, stderr=subprocess.STDOUT, env=torchrun_env())
        try:
            status = process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()  # the launcher this fixture started (its children follow it)
            status = process.wait()
    assert status != 0
    return run


def rank0_stderr(run: Path) -> Path:
    (path,) = run.glob("torchrun/*/attempt_0/0/stderr.log")
    return path


def check_run(run: Path) -> None:
    """The run's verdict names rank 1's SIGKILL; rank 0's lost gloo connection in DDP's setup is the peer's loss."""
    stderr = rank0_stderr(run)
    text = stderr.read_text()
    assert "_verify_param_shape_across_processes" in text and "gloo" in text and "Connection closed by peer" in text
    result = diagnose("--run", str(run))
    assert (result["root_cause"], result["rank"]) == ("rank_crashed", 1), result
    assert result["title"] == "Rank 1 was killed by signal SIGKILL"
    assert not [f for f in result["findings"] if f["category"] == "nccl_network"], result["findings"]
    (lost,) = [f for f in result["findings"] if f["file"] == str(stderr)]
    assert (lost["category"], lost["rank"], lost["title"]) == (
        "nccl_remote",
        0,
        "A peer rank failed (gloo connection lost)",
    )
    assert lost["cause"].startswith("gloo's connection to another rank")
    # Rank 0's file alone: a peer of it was lost (gloo's words), not NCCL's network.
    alone = diagnose(str(stderr))
    assert alone["root_cause"] == "nccl_remote", alone
    assert {(f["category"], f["title"]) for f in alone["findings"]} == {
        ("nccl_remote", "A peer rank failed (gloo connection lost)")
    }


def test_a_peer_killed_during_ddp_setup_in_the_kept_real_run_is_a_lost_gloo_peer_not_nccls_network():
    check_run(KEPT)


def test_a_peer_killed_during_ddp_setup_in_a_fresh_run_is_a_lost_gloo_peer_not_nccls_network(live_run):
    check_run(live_run)
