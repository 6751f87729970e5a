"""scripts/device-multi-gpu's parts on this machine's CPUs (issue 20).

- Step 3's logic on gloo: a real 2-rank torchrun job where rank 1 skips collective 5; hang.py must
  get `opsconsole stacks --json` naming rank 1's line and `opsconsole fr` naming rank 1 and the
  all_reduce from the ranks' dumps, then the process group's timeout must end the job.
- Step 2's refused field on several GPUs: the real GpuReader over the recorded H200 (nvml_replay)
  with nvmlDeviceGetPowerUsage refused on one GPU; and the field comparison, on the run kept from
  the H200 (tests/data/device_runs/) and on a reading that disagrees.
- The script itself where there is no GPU: each step says why it is skipped and the script goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.nvml_replay import ReplayNvml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "multi_gpu"))

import probe_vs_smi  # noqa: E402

RUNS = ROOT / "tests" / "data" / "device_runs"
PY_SPY = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")


@pytest.mark.libraries  # a real 2-rank torchrun job on gloo, as hung_job's (tests/conftest.py)
def test_the_hang_on_gloo_is_named_by_stacks_and_fr(tmp_path):
    pytest.importorskip("torch")
    if not os.path.exists(PY_SPY):
        pytest.skip("py-spy is not installed (it is in the test extra)")
    env = {**os.environ, "PATH": os.path.dirname(PY_SPY) + os.pathsep + os.environ.get("PATH", "")}
    done = subprocess.run(
        [
            sys.executable,
            "scripts/multi_gpu/hang.py",
            "--backend",
            "gloo",
            "--timeout-s",
            "8",
            "--out",
            str(tmp_path / "hang"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    summary = json.loads((tmp_path / "hang" / "summary.json").read_text())
    stacks_errors = " ".join(str(e) for e in summary.get("stacks", {}).get("errors") or []).lower()
    if "permission" in stacks_errors or "not permitted" in stacks_errors:
        pytest.skip("ptrace refused here: %s" % stacks_errors[:200])
    assert done.returncode == 0 and summary["ok"], done.stdout + done.stderr
    assert summary["stacks"]["odd"] == [1]
    assert summary["stacks"]["rank1_top"]["function"] == "skip_the_evaluation"
    assert summary["stacks"]["rank1_top"]["line"] == summary["hang_line"]
    assert "barrier" in summary["stacks"]["rank0_functions"]
    own = summary["fr_own"]
    assert (own["culprit_ranks"], own["seq"], own["op"], own["kind"]) == ([1], 5, "all_reduce", "not_joined")
    assert own["summary"].startswith("rank 1 never joined collective 5 (all_reduce [3] Float)")
    assert summary["job_exit"] not in (None, 0)  # the timeout ended it, not this test
    assert "step 3 (gloo): rank 1 and collective 5 named by fr and stacks" in done.stdout
    assert sorted(os.listdir(tmp_path / "hang" / "own")) == ["trace_rank_0", "trace_rank_1"]


@pytest.mark.parametrize("refused_gpu", [0, 2, None])
def test_a_refused_field_stays_on_its_gpu(refused_gpu):
    report = probe_vs_smi.isolate_refused_field(ReplayNvml(gpus=4).module, gpu=refused_gpu)
    assert report["ok"] and report["refusals"] == 1
    target = 3 if refused_gpu is None else refused_gpu
    for gpu in report["gpus"]:
        if gpu["gpu"] == target:
            assert gpu["power_draw_w"] is None and gpu["clean_power_draw_w"] is not None
            assert gpu["errors"] and gpu["errors"][0].startswith("power_draw: ")
            assert all(present for name, present in gpu["fields_present"].items() if name != "power_draw_w")
        else:
            assert gpu["power_draw_w"] == gpu["clean_power_draw_w"] is not None and gpu["errors"] == []


def device_run() -> Path:
    runs = sorted(RUNS.glob("*/device-multi-gpu"))
    if not runs:
        pytest.skip("no device run kept under tests/data/device_runs")
    return runs[-1]


def test_the_kept_h200_frame_agrees_with_nvidia_smi_field_by_field():
    probe = device_run() / "2_probe"
    frame = json.loads((probe / "probe_frame.json").read_text())
    rows = probe_vs_smi.smi_rows((probe / "smi.csv").read_text())
    report = probe_vs_smi.compare(frame["gpus"], rows)
    assert [g["gpu"] for g in report] == [int(r["index"]) for r in rows] and all(g["agree"] for g in report)
    assert report[0]["fields"]["name"]["probe"] == rows[0]["name"]
    kept = json.loads((probe / "compare.json").read_text())
    assert kept["ok"] and abs(kept["seconds_apart"]) <= probe_vs_smi.SAME_SECOND_S


def test_a_field_beyond_its_tolerance_is_flagged():
    row = {
        "index": "0",
        "name": "NVIDIA H200",
        "utilization.gpu": "0",
        "memory.used": "0",
        "memory.total": "143771",
        "temperature.gpu": "30",
        "power.draw": "120.00",
        "clocks.sm": "345",
    }
    gpu = {
        "index": 0,
        "name": "NVIDIA H200",
        "utilization_gpu": 0.0,
        "memory_used": 40 << 20,
        "memory_total": 143771 << 20,
        "temperature": 35.0,
        "power_draw_w": 125.0,
        "clock_sm_mhz": 345,
    }
    fields = probe_vs_smi.compare([gpu], [row])[0]["fields"]
    assert not fields["temperature.gpu"]["agree"] and fields["power.draw"]["agree"] and fields["memory.used"]["agree"]
    gpu["power_draw_w"] = None  # the probe has no power where nvidia-smi has one
    assert not probe_vs_smi.compare([gpu], [row])[0]["fields"]["power.draw"]["agree"]
    row["power.draw"] = "[N/A]"  # neither has one: they agree
    assert probe_vs_smi.compare([gpu], [row])[0]["fields"]["power.draw"]["agree"]


def test_the_script_without_a_gpu_skips_each_step_and_goes_on(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    env = {**os.environ, "PYTHON": sys.executable, "WHEELS": str(tmp_path / "none"), "STEPS": "1 2 3 4"}
    done = subprocess.run(
        [str(ROOT / "scripts" / "device-multi-gpu"), str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "the GPU suite: skipped: needs a GPU (found 0)" in lines
    assert "the probe vs nvidia-smi: skipped: needs a GPU (found 0)" in lines
    assert "NCCL hang: skipped: needs 2 GPUs (found 0)" in lines
    assert lines[-1].startswith("device-multi-gpu: every step that ran passed (0 GPU(s))")
    assert (tmp_path / "out" / "machine.txt").exists()


def test_the_kept_gloo_hang_dumps_name_rank_1_and_collective_5():
    from opsconsole.hang.flight_recorder import analyse_dir

    kept = sorted(RUNS.glob("*/vm-gloo-hang"))
    if not kept:
        pytest.skip("no gloo hang kept under tests/data/device_runs")
    found = analyse_dir(str(kept[-1] / "own")).mismatch
    assert (found.culprit_ranks, found.seq, found.op) == ((1,), 5, "all_reduce")
    stacks = json.loads((kept[-1] / "stacks.json").read_text())
    assert stacks["odd"] == [1]
