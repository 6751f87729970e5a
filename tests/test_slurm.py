"""Slurm job to nodes, against a fake `scontrol` executable placed first on PATH."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from opsconsole.nodes.slurm import SlurmUnavailable, job_nodes, parse_job_fields

# One line of `scontrol -o show job` as Slurm 23.x prints it for a running 4-node job.
RUNNING_JOB = (
    "JobId=4242 JobName=train-llm UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A "
    "Priority=4294901758 Nice=0 Account=research QOS=normal JobState=RUNNING Reason=None "
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=01:02:03 "
    "TimeLimit=2-00:00:00 TimeMin=N/A SubmitTime=2026-12-02T10:00:00 EligibleTime=2026-12-02T10:00:00 "
    "StartTime=2026-12-02T10:00:05 EndTime=2026-12-04T10:00:05 Deadline=N/A Partition=gpu "
    "AllocNode:Sid=login1:12345 ReqNodeList=(null) ExcNodeList=(null) NodeList=gpu-a[01-03],gpu-b07 "
    "BatchHost=gpu-a01 NumNodes=4 NumCPUs=512 NumTasks=32 CPUs/Task=16 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=512,mem=2000G,node=4,billing=512,gres/gpu=32 Socks/Node=* MinCPUsNode=128 "
    "Features=(null) Command=/home/alice/train.sbatch WorkDir=/home/alice StdOut=/home/alice/slurm-4242.out "
    "TresPerNode=gres:gpu:8"
)
PENDING_JOB = (
    "JobId=77 JobName=queued UserId=alice(1000) JobState=PENDING Reason=Resources Partition=gpu "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList=(null) NumNodes=2-2 NumCPUs=256"
)
HOSTNAMES = ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-b07"]

FAKE_SCONTROL = """#!/bin/sh
# A stand-in for Slurm's scontrol: answers what a real cluster printed, logs its argv.
echo "$*" >> "{log}"
case "$*" in
  "-o show job 4242") echo '{running}' ;;
  "-o show job 77") echo '{pending}' ;;
  "-o show job "*) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
  "show hostnames gpu-a[01-03],gpu-b07") printf '{hostnames}\\n' ;;
  *) echo "scontrol: error: Invalid command: $*" >&2; exit 1 ;;
esac
"""


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    script = bin_dir / "scontrol"
    script.write_text(
        FAKE_SCONTROL.format(log=log, running=RUNNING_JOB, pending=PENDING_JOB, hostnames="\\n".join(HOSTNAMES))
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", str(bin_dir) + os.pathsep + os.environ.get("PATH", ""))
    return log


def test_job_nodes_asks_scontrol_for_the_job_and_expands_its_nodelist(fake_scontrol):
    assert job_nodes("4242") == HOSTNAMES
    calls = fake_scontrol.read_text().splitlines()
    assert calls == ["-o show job 4242", "show hostnames gpu-a[01-03],gpu-b07"]


def test_unknown_job_is_reported_with_scontrols_own_words(fake_scontrol):
    with pytest.raises(SlurmUnavailable, match="Invalid job id specified"):
        job_nodes("999")


def test_pending_job_has_no_nodes_yet(fake_scontrol):
    with pytest.raises(SlurmUnavailable, match=r"job 77 has no nodes yet \(state PENDING\)"):
        job_nodes("77")


@pytest.mark.parametrize("job_id", ["", "abc", "12;rm -rf /", "--help"])
def test_text_that_is_not_a_job_id_never_reaches_scontrol(fake_scontrol, job_id):
    with pytest.raises(SlurmUnavailable, match="is not a Slurm job id"):
        job_nodes(job_id)
    assert not fake_scontrol.exists()


def test_array_task_ids_are_accepted(fake_scontrol):
    with pytest.raises(SlurmUnavailable, match="Invalid job id"):
        job_nodes("4242_7")  # our fake knows no such task; the point is that scontrol was asked
    assert fake_scontrol.read_text().splitlines() == ["-o show job 4242_7"]


def test_no_scontrol_on_path_says_slurm_is_not_available(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(SlurmUnavailable) as caught:
        job_nodes("4242")
    assert str(caught.value) == "Slurm is not available here: scontrol not found on PATH"


def test_the_record_key_nodelist_is_not_confused_with_reqnodelist():
    fields = parse_job_fields(RUNNING_JOB + "\n")
    assert fields["ReqNodeList"] == "(null)"
    assert fields["NodeList"] == "gpu-a[01-03],gpu-b07"
    assert fields["JobState"] == "RUNNING"


def test_cli_slurm_job_without_slurm_exits_2_with_one_line(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = dict(os.environ, PATH=str(empty), HOME=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "opsconsole", "snapshot", "--slurm-job", "4242"],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "opsconsole: --slurm-job 4242: Slurm is not available here: scontrol not found on PATH"
    ]
    assert result.stdout == ""
