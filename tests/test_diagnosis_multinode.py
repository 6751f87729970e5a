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

from opsconsole.commands.diagnose import _decoded_lines
from opsconsole.diagnosis.run import diagnose_run
from tests.test_diagnosis_torchrun import report, verdict
from tests.torchrun import free_port, torchrun_env

pytest.importorskip("torch")

RUN_TIMEOUT_S = 240
# @record (as the remedies advise) has each rank write its exception to an error.json in its folder as well.
WORKER = """
import torch, torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
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

main()
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


def test_the_second_nodes_folder_is_labelled_with_the_global_rank_its_lines_name(two_node_run):
    # Node 1's folder 1 holds global rank 3: its stderr.log says "[rank3]:", its error.json (@record) has the
    # traceback without a prefix. The sources were labelled "rank1:stderr.log" (rank 1) and the error file's
    # finding said rank 1 while the verdict said rank 3.
    base = two_node_run
    result = diagnose_run([str(base / "node0"), str(base / "node1")], _decoded_lines)
    folder = [
        source for source in result.sources.values() if "/node1/" in source.path and "/attempt_0/1/" in source.path
    ]
    assert {Path(source.path).name for source in folder} >= {"stderr.log", "error.json"}, folder
    for source in folder:
        assert source.rank == 3 and source.label == "rank3:attempt_0/1/%s" % Path(source.path).name, source
    # Node 0's folder 1 is global rank 1, and says so.
    first = [
        source for source in result.sources.values() if "/node0/" in source.path and "/attempt_0/1/" in source.path
    ]
    assert first and all(source.rank == 1 and source.label.startswith("rank1:attempt_0/1/") for source in first)
    errors = [finding for finding in result.diagnosis.findings if finding.category == "app_error"]
    assert {Path(result.file_of(finding)).name for finding in errors} == {"stderr.log", "error.json"}, errors
    assert {finding.rank for finding in errors} == {3}, errors
    assert (result.root_cause, result.verdict.rank) == ("app_error", 3)
