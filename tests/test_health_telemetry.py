"""Telemetry findings with real processes read by the probe's ProcessTable, on frames from the real captures."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from test_health_rules import IDLE, LOADED, by_check

from opsconsole.config import HealthConfig
from opsconsole.health.result import STATUS_PASS, STATUS_WARN
from opsconsole.health.telemetry import evaluate_telemetry, training_processes, visible_devices_agree
from opsconsole.model import ProcessSample
from opsconsole.probe.procs import ProcessTable, read_watched_env
from tests.waiting import wait_for_sync

CFG = HealthConfig()
# A "training process" whose data-loader worker is a busy Python child; prints the child's pid.
TRAINER = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
    "print(child.pid, flush=True)\n"
    "try:\n"
    "    time.sleep(60)\n"
    "finally:\n"
    "    child.kill()\n"
)
SLEEPER = "import time; print('up', flush=True); time.sleep(60)"


@pytest.fixture
def trainer():
    parent = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    try:
        yield parent.pid, child_pid
    finally:
        try:
            os.kill(child_pid, 9)
        except ProcessLookupError:
            pass
        parent.kill()
        parent.wait()


def sleeper(env=None):
    proc = subprocess.Popen(
        [sys.executable, "-c", SLEEPER], stdout=subprocess.PIPE, text=True, env=dict(os.environ, **(env or {}))
    )
    assert proc.stdout.readline().strip() == "up"
    return proc


def read_frame(base, gpu_procs, busy_pid=None):
    """A frame like `base` with real process rows: the GPU processes joined, host processes sampled.

    CPU % is a rate between two samples: with `busy_pid`, sampling goes on until that process is
    seen busy (on a loaded machine it may get no CPU for a while), instead of one fixed sleep.
    """
    table = ProcessTable(use_psutil=False)
    table.prime()

    def sampled():
        time.sleep(0.3)
        top = table.sample(limit=4000)
        seen = busy_pid is None or any(
            p.pid == busy_pid and (p.cpu_percent or 0) > CFG.loader_busy_percent for p in top
        )
        return top if seen else None

    top = wait_for_sync(sampled, "process %s seen busy" % busy_pid, interval=0)
    joined = table.join(gpu_procs)
    return replace(base, processes=joined, top_processes=top)


def test_idle_gpu_with_a_busy_data_loader_child_is_a_data_loading_bottleneck(trainer):
    parent, child = trainer
    gpu = IDLE.gpus[0]
    frame = read_frame(IDLE, [ProcessSample(pid=parent, gpu_index=gpu.index, gpu_uuid=gpu.uuid)], busy_pid=child)
    assert frame.processes[0].ppid is not None  # the probe reports parents now
    worker = next(p for p in frame.top_processes if p.pid == child)
    assert worker.ppid == parent and worker.cpu_percent > CFG.loader_busy_percent
    result = by_check(evaluate_telemetry(frame, CFG), "data_loader")
    assert result.status == STATUS_WARN
    assert "data-loader workers" in result.message and "num_workers" in result.remedy and "pin_memory" in result.remedy
    assert dict(result.evidence)["workers"] == "1" and result.gpu == gpu.index
    # The same job on a busy GPU keeps up: no finding.
    busy = read_frame(LOADED, [ProcessSample(pid=parent, gpu_index=0, gpu_uuid=LOADED.gpus[0].uuid)])
    assert by_check(evaluate_telemetry(busy, CFG), "data_loader").status == STATUS_PASS


def test_environment_disabling_p2p_and_hiding_the_gpu_is_found_from_proc_environ():
    gpu = IDLE.gpus[0]
    bad = sleeper({"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1", "CUDA_VISIBLE_DEVICES": "3"})
    good = sleeper({"CUDA_VISIBLE_DEVICES": gpu.uuid or "0", "NCCL_P2P_DISABLE": "0"})
    try:
        frame = read_frame(
            IDLE,
            [
                ProcessSample(pid=bad.pid, gpu_index=gpu.index, gpu_uuid=gpu.uuid),
                ProcessSample(pid=good.pid, gpu_index=gpu.index, gpu_uuid=gpu.uuid),
            ],
        )
    finally:
        bad.kill()
        good.kill()
        bad.wait()
        good.wait()
    envs = {p.pid: p.watched_env for p in frame.processes}
    assert set(envs[bad.pid]) == {"NCCL_P2P_DISABLE=1", "NCCL_IB_DISABLE=1", "CUDA_VISIBLE_DEVICES=3"}
    results = {dict(r.evidence)["pid"]: r for r in evaluate_telemetry(frame, CFG) if r.check == "process_env"}
    flagged = results[str(bad.pid)]
    assert flagged.status == STATUS_WARN
    assert "NCCL_P2P_DISABLE=1" in flagged.message and "NCCL_IB_DISABLE=1" in flagged.message
    assert "CUDA_VISIBLE_DEVICES='3' but it uses GPU 0" in flagged.message
    assert "topo" in flagged.remedy and "ibstat" in flagged.remedy
    assert results[str(good.pid)].status == STATUS_PASS


def test_an_unreadable_environment_gives_no_finding():
    gpu = IDLE.gpus[0]
    frame = replace(IDLE, processes=(ProcessSample(pid=1, gpu_index=gpu.index, watched_env=None),))
    assert [r for r in evaluate_telemetry(frame, CFG) if r.check == "process_env"] == []
    assert read_watched_env(b"PATH=/bin\0NCCL_P2P_DISABLE=1\0NCCL_DEBUG=INFO\0") == ("NCCL_P2P_DISABLE=1",)


def test_idle_gpus_idle_cpus_and_high_iowait_point_at_storage():
    gpu = IDLE.gpus[0]
    job = (ProcessSample(pid=4242, gpu_index=gpu.index, cpu_percent=3.0),)
    stalled = replace(IDLE, processes=job, host=replace(IDLE.host, cpu_percent=4.0, iowait_percent=45.0))
    result = by_check(evaluate_telemetry(stalled, CFG), "storage_bottleneck")
    assert result.status == STATUS_WARN and "waits on storage" in result.message and "iostat" in result.remedy
    for changes in ({"cpu_percent": 60.0, "iowait_percent": 45.0}, {"cpu_percent": 4.0, "iowait_percent": 2.0}):
        calm = replace(stalled, host=replace(IDLE.host, **changes))
        assert by_check(evaluate_telemetry(calm, CFG), "storage_bottleneck").status == STATUS_PASS
    busy_gpu = replace(stalled, gpus=LOADED.gpus)
    assert by_check(evaluate_telemetry(busy_gpu, CFG), "storage_bottleneck").status == STATUS_PASS
    assert [r for r in evaluate_telemetry(replace(stalled, processes=()), CFG) if r.check == "storage_bottleneck"] == []


def test_a_process_on_two_gpus_is_one_training_process():
    two = (IDLE.gpus[0], replace(IDLE.gpus[0], index=1, uuid="GPU-other"))
    frame = replace(IDLE, gpus=two, processes=(ProcessSample(pid=7, gpu_index=0), ProcessSample(pid=7, gpu_index=1)))
    [(proc, gpus)] = training_processes(frame)
    assert proc.pid == 7 and [g.index for g in gpus] == [0, 1]


GPU0 = IDLE.gpus[0]


@pytest.mark.parametrize(
    "value,agrees",
    [
        ("0", True),
        ("1,0", True),
        ("1", False),
        ("", False),
        ("-1", False),
        ("0,-1", True),
        ("-1,0", False),
        (GPU0.uuid, True),
        ((GPU0.uuid or "")[:12], True),
        ("GPU-00000000", False),
        (" 0 ", True),
    ],
)
def test_cuda_visible_devices_matching(value, agrees):
    assert visible_devices_agree(value, [GPU0]) is agrees


def test_a_frame_without_the_host_process_list_judges_no_input_pipeline(trainer):
    """The console's first local frame carries GPU processes but no host process list (044251f): a
    job's data-loader workers cannot be seen in it, so it says nothing of them. It said 'input
    pipeline keeps up' of the idle GPU whose busy worker the next frame shows, or judged the main
    process alone on its lifetime CPU average."""
    parent, child = trainer
    gpu = IDLE.gpus[0]
    procs = [ProcessSample(pid=parent, gpu_index=gpu.index, gpu_uuid=gpu.uuid)]
    first = replace(IDLE, processes=ProcessTable(use_psutil=False).join(procs), top_processes=())
    assert first.processes[0].ppid is not None  # the GPU process itself is read
    assert not [r for r in evaluate_telemetry(first, CFG) if r.check == "data_loader"]
    later = read_frame(IDLE, procs, busy_pid=child)
    assert by_check(evaluate_telemetry(later, CFG), "data_loader").status == STATUS_WARN
