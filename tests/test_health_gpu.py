"""The GPU suite on a real NVIDIA GPU (marker `gpu`; skipped without CUDA).

Run on a GPU machine: `python -m pytest -m gpu tests/test_health_gpu.py`.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from opsconsole.config import HealthConfig
from opsconsole.health.remote import health_bundle, parse_suite_output, suite_args
from opsconsole.probe import health_mode

pytestmark = pytest.mark.gpu

EXPECTED = ("cuda_init", "fp64_matmul", "bf16_gemm", "memory_pattern", "d2d_copy", "nan_inf")


@pytest.fixture(scope="module")
def cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    return torch


def test_suite_passes_every_check_on_each_gpu(cuda):
    results = health_mode.run_suite("here", level=1, memory_share=0.05)
    by_gpu = {}
    for item in results:
        if item["gpu"] is not None:
            by_gpu.setdefault(item["gpu"], {})[item["check"][len(health_mode.PREFIX) :]] = item
    if any(item["check"].endswith("refused") for item in results):
        pytest.skip("a GPU here runs a job: %s" % [r["message"] for r in results if r["check"].endswith("refused")])
    assert by_gpu, results
    for gpu, checks in by_gpu.items():
        assert set(EXPECTED) <= set(checks), (gpu, sorted(checks))
        for name in EXPECTED:
            assert checks[name]["status"] == "pass", checks[name]
            assert checks[name]["duration_s"] is not None
    summary = [r for r in results if r["check"] == health_mode.PREFIX + "suite"]
    assert summary and summary[0]["status"] == "pass"
    if len(by_gpu) >= 2:
        nccl = [r for r in results if r["check"] == health_mode.PREFIX + "nccl_allreduce"]
        assert nccl and nccl[0]["status"] == "pass", nccl


def test_a_gpu_running_a_compute_process_is_refused_unless_forced(cuda):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import torch,time; x=torch.ones(1,device='cuda:0'); print('up',flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "up"
        time.sleep(0.5)  # NVML lists the context a moment after it exists
        args = suite_args("here", HealthConfig(gpu_test_memory_share=0.02), gpus=[0])
        done = subprocess.run(
            [sys.executable, "-"] + args, input=health_bundle(), capture_output=True, text=True, timeout=120
        )
        results = parse_suite_output(done.stdout, "here", done.returncode, done.stderr)
        assert done.returncode == 2
        assert [r.check for r in results] == ["gpu_sanity.refused"]
        assert str(holder.pid) in results[0].message
        forced = subprocess.run(
            [sys.executable, "-"] + args + ["--force"],
            input=health_bundle(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        forced_results = parse_suite_output(forced.stdout, "here", forced.returncode, forced.stderr)
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert {r.check for r in forced_results} >= {"gpu_sanity." + name for name in EXPECTED}
    finally:
        holder.kill()
        holder.wait()


def test_nccl_all_reduce_runs_and_checks_its_sum(cuda):
    # One process over every GPU here (a single GPU makes a one-rank communicator: the code path, bus bw 0).
    devices = [(i, i) for i in range(cuda.cuda.device_count())]
    result = health_mode.nccl_allreduce("here", devices, 16)
    assert result["status"] == "pass", result
    evidence = dict(result["evidence"])
    assert evidence["wrong_elements"] == "0" and int(evidence["bytes"]) == 16 << 20
    if len(devices) >= 2:
        assert float(evidence["busbw_gbps"]) > 0
