"""The probe's health mode: its comparisons with torch on the CPU, its refusals, its `error` paths, and its
start through the probe bundle locally and over a real sshd."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opsconsole.config import HealthConfig, NodeConfig, SshConfig
from opsconsole.health.remote import health_bundle, parse_suite_output, run_gpu_suite, suite_args
from opsconsole.probe import health_mode as hm
from tests.sshd import ssh_client, sshd_factory  # noqa: F401

torch = pytest.importorskip("torch")


def test_relative_error_of_fp64_matmul_on_the_cpu():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(64, 64, dtype=torch.float64, generator=g)
    b = torch.randn(64, 64, dtype=torch.float64, generator=g)
    reference = a @ b
    reordered = a.t().contiguous().t() @ b  # another memory layout, same maths
    assert hm.relative_error(reordered, reference) <= hm.FP64_RELATIVE_BOUND
    wrong = reference.clone()
    wrong[3, 5] += 1.0
    assert hm.relative_error(wrong, reference) > 1e-4
    assert hm.relative_error(torch.zeros(2), torch.zeros(2)) == 0.0


def test_bitwise_comparison_sees_one_flipped_bit_and_treats_nan_as_bits():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(128, 128, generator=g).to(torch.bfloat16)
    b = a.clone()
    assert hm.bitwise_mismatches(a, b) == 0
    flipped = b.view(torch.int16)
    flipped[7, 9] ^= 1  # the lowest mantissa bit: equal under a tolerance, not bit for bit
    assert hm.bitwise_mismatches(a, b) == 1
    nan = torch.full((4,), float("nan"), dtype=torch.bfloat16)
    assert hm.bitwise_mismatches(nan, nan.clone()) == 0  # NaN != NaN as numbers, same as bits
    with pytest.raises(ValueError, match="shapes or dtypes differ"):
        hm.bitwise_mismatches(a, a.float())


def test_non_finite_count():
    t = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0])
    assert hm.non_finite_count(t) == 3
    assert hm.non_finite_count(torch.randn(100)) == 0


@pytest.mark.parametrize("pattern", hm.PATTERNS)
def test_memory_patterns_verify_and_find_one_corrupted_word(pattern):
    buffer = torch.empty(10_000, dtype=torch.int64)
    hm.fill_pattern(buffer, pattern, offset=5_000)
    assert hm.pattern_mismatches(buffer, pattern, offset=5_000) == 0
    buffer[1234] ^= 1 << 40
    assert hm.pattern_mismatches(buffer, pattern, offset=5_000) == 1
    if pattern == 0:  # address-derived: the same words at another offset do not verify
        hm.fill_pattern(buffer, 0, offset=0)
        assert hm.pattern_mismatches(buffer, 0, offset=1) == buffer.numel()


def test_bus_bandwidth_as_nccl_tests_computes_it():
    algbw, busbw = hm.bus_bandwidth_gbps(8 * 10**9, 0.1, 8)
    assert algbw == pytest.approx(80.0) and busbw == pytest.approx(80.0 * 2 * 7 / 8)
    assert hm.bus_bandwidth_gbps(1, 0.0, 2) == (0.0, 0.0)


INVENTORY = [
    {"index": 0, "uuid": "GPU-a", "pids": []},
    {"index": 1, "uuid": "GPU-b", "pids": [4242, 77]},
    {"index": 2, "uuid": "GPU-c", "pids": [77]},
]


def test_a_gpu_with_compute_processes_is_refused_unless_forced():
    testable, refused = hm.refusals(INVENTORY, "nvml", None, False, "n1", own_pid=77)
    assert testable == [0, 2]  # our own context on GPU 2 does not count
    [refusal] = refused
    assert refusal["check"] == "gpu_sanity.refused" and refusal["status"] == "error" and refusal["gpu"] == 1
    assert "pid 4242" in refusal["message"] and "--force" in refusal["remedy"]
    assert hm.refusals(INVENTORY, "nvml", None, True, "n1", own_pid=1) == ([0, 1, 2], [])
    testable, refused = hm.refusals(INVENTORY, "nvml", [0, 5], False, "n1", own_pid=1)
    assert testable == [0] and "GPU 5 does not exist (GPUs: 0,1,2)" in refused[0]["message"]


def test_memory_in_use_without_a_listed_process_is_refused_too():
    hidden = [
        {"index": 0, "uuid": "GPU-a", "pids": [], "used_bytes": 20 << 30},
        {"index": 1, "uuid": "GPU-b", "pids": [], "used_bytes": 500 << 20},
    ]  # driver/context overhead only
    testable, refused = hm.refusals(hidden, "nvml", None, False, "n1", own_pid=1)
    assert (
        testable == [1]
        and refused[0]["gpu"] == 0
        and "20.0 GiB in use by processes not visible here" in refused[0]["message"]
    )
    assert hm.refusals(hidden, "nvml", None, True, "n1", own_pid=1)[0] == [0, 1]


def test_without_a_process_list_every_gpu_is_refused_unless_forced():
    testable, refused = hm.refusals(None, "NVML failed (x) and nvidia-smi is missing", None, False, "n1", 1)
    assert testable == [] and refused[0]["status"] == "error" and "nvidia-smi is missing" in refused[0]["message"]
    assert hm.refusals(None, "why", None, True, "n1", 1) == (None, [])  # forced: whatever torch sees


def run_module(*args):
    return subprocess.run(
        [sys.executable, "-m", "opsconsole.probe.health_mode", *args], capture_output=True, text=True, timeout=120
    )


def test_without_a_gpu_the_suite_is_skipped_with_the_reason_not_an_error():
    if hm.nvidia_device_files():
        pytest.skip("this machine has a GPU")
    for args in (("--json", "--node-name", "cpu-box"), ("--json", "--node-name", "cpu-box", "--force")):
        done = run_module(*args)
        assert done.returncode == 0, done.stderr
        [result] = [json.loads(line) for line in done.stdout.splitlines()]
        assert (result["check"], result["status"], result["node"]) == ("gpu_sanity.suite", "skip", "cpu-box")
        assert result["message"].startswith("skipped: no GPU (") and "--force" not in result["message"]
        assert "Traceback" not in done.stderr
    assert hm.exit_status([]) == 2 and hm.exit_status([{"status": "warn"}]) == 0
    assert hm.exit_status([{"status": "skip"}]) == 0
    assert hm.exit_status([{"status": "fail"}, {"status": "error"}]) == 1


def test_bad_arguments_are_one_line_errors():
    done = run_module("--memory-share", "2")
    assert done.returncode == 2 and "must be > 0 and <= 0.9" in done.stderr
    done = run_module("--gpus", "a,b")
    assert done.returncode == 2 and "expected GPU indices" in done.stderr


def test_suite_output_parsing_keeps_results_and_explains_an_empty_run():
    line = json.dumps(hm.result("d2d_copy", "x", "pass", "ok", 0, (("copy_gbps", "1913.0"),), "", 0.03))
    results = parse_suite_output("some library warning\n%s\n{not json\n" % line, "n1", 0)
    assert [(r.check, r.node, r.gpu, r.evidence, r.duration_s) for r in results] == [
        ("gpu_sanity.d2d_copy", "n1", 0, (("copy_gbps", "1913.0"),), 0.03)
    ]
    [empty] = parse_suite_output("", "n1", 1, "ImportError: no module named x\n")
    assert empty.status == "error" and "exit 1" in empty.message and "ImportError" in empty.message


async def test_the_bundle_starts_the_health_mode_locally():
    results = await run_gpu_suite("here", HealthConfig(), python=sys.executable, force=True)
    assert results and all(r.check.startswith("gpu_sanity.") and r.node == "here" for r in results)
    assert (
        "--force" in suite_args("n", HealthConfig(), force=True) and "opsconsole.probe.health_mode" in health_bundle()
    )


async def test_a_missing_interpreter_or_a_timeout_is_an_error_result():
    [missing] = await run_gpu_suite("n1", HealthConfig(), python="/nonexistent/python3")
    assert missing.status == "error" and "could not run the GPU suite" in missing.message
    slow = HealthConfig(gpu_test_timeout_s=0.05)
    [late] = await run_gpu_suite("n1", slow, python=sys.executable + " -c 'import time; time.sleep(5)'")
    assert late.status == "error" and "did not finish within 0.05 s" in late.message


@pytest.mark.sshd
async def test_the_health_mode_runs_over_the_nodes_ssh_connection(sshd_factory):
    from opsconsole.nodes.ssh import SshLink

    server = sshd_factory.start()
    node = NodeConfig(name="remote1", host=server.address, port=server.port, python=sys.executable)
    link = SshLink(node, SshConfig(connect_timeout=5.0), 1.0)
    try:
        results = await run_gpu_suite("remote1", HealthConfig(), link=link, force=True)
    finally:
        await link.close()
    assert results and all(r.check.startswith("gpu_sanity.") for r in results), results
    assert all(r.node == "remote1" for r in results)
    if not hm.nvidia_device_files():  # the suite ran on the node: it found no GPU there
        assert [(r.check, r.status) for r in results] == [("gpu_sanity.suite", "skip")], results
