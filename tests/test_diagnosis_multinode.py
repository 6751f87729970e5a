"""A two-node torchrun run (two launchers on 127.0.0.1, --nnodes 2, two ranks each, gloo, CPU): the verdict
names the global rank that failed, not the local rank its log's folder gives.

torchrun's --log-dir writes each node's ranks under attempt_0/<local_rank>/: on the second node the
failing global rank 3 is in folder 1. The rank's own lines say `[rank3]:` (torch's global rank); the
verdict used to say "Started on rank 1" (and "rank 1 is the one that failed") for the ValueError that
says it was raised on rank 3.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_diagnosis_torchrun import report, verdict
from tests.torchrun import free_port, torchrun_env

pytest.importorskip("torch")

RUN_TIMEOUT_S = 240
WORKER = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
for step in range(3):
    dist.all_reduce(t)
    print("step %d rank %d" % (step, rank), flush=True)
if rank == 3:
    raise ValueError("bad batch on global rank 3")
dist.all_reduce(t)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("two_nodes")
    script = base / "worker.py"
    script.write_text(WORKER)
    port = free_port()
    started = []
    for node in (0, 1):
        launcher = open(base / ("launcher%d.log" % node), "wb")
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node)]
        command += ["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
        command += ["--monitor-interval", "2", "--redirects", "3", "--log-dir", str(base / ("node%d" % node))]
        started.append(
            (
                subprocess.Popen(
                    command + [str(script)], stdout=launcher, stderr=subprocess.STDOUT, env=torchrun_env()
                ),
                launcher,
            )
        )
    for process, launcher in started:
        try:
            process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        launcher.close()
    return base


def test_the_verdict_names_the_global_rank_not_the_folders_local_rank(two_node_run):
    base = two_node_run
    result = verdict(base / "node0", base / "node1")
    assert (result["root_cause"], result["rank"]) == ("app_error", 3), result["rank"]
    # The file is node 1's local rank 1: where global rank 3 writes.
    assert "/node1/" in result["file"] and Path(result["file"]).parent.name == "1"
    root = next(f for f in result["findings"] if f["category"] == "app_error")
    assert root["exception"] == "ValueError: bad batch on global rank 3" and root["rank"] == 3
    text = report(base / "node0", base / "node1")
    assert "Started on rank 3, in " in text and "Started on rank 1" not in text
