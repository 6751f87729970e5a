"""`opsconsole check` as a real subprocess: exit codes 0/1/2, --json, --node, --gpu-tests, on the local node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import ROOT, clean_home, closed_loopback_port  # noqa: F401

from opsconsole.health.runner import evidence_value
from opsconsole.probe.health_mode import no_gpu_reason, nvidia_device_files
from opsconsole.probe.nvidia_driver import PROC_VERSION

RELAXED = "[health]\ndisk_free_percent = 0\nmemory_percent = 100\nswap_used_percent = 100\niowait_percent = 100\n"
LOCAL = '[[nodes]]\nname = "box"\nlocal = true\n'


def check(tmp_path: Path, env, config: str, *args: str):
    path = tmp_path / "opsconsole.toml"
    path.write_text(config)
    return subprocess.run(
        [sys.executable, "-m", "opsconsole", "check", "--config", str(path), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def results_of(done):
    document = json.loads(done.stdout)
    assert set(document) == {"results"}
    return document["results"]


def test_all_pass_exits_0_and_json_lists_every_result(tmp_path, clean_home):
    _, env = clean_home
    done = check(tmp_path, env, LOCAL + RELAXED, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    results = results_of(done)
    assert {r["node"] for r in results} == {"box"}
    assert {"node_reachable", "disk_free", "memory"} <= {r["check"] for r in results}
    assert {r["status"] for r in results} <= {"pass", "warn"}
    disk = next(r for r in results if r["check"] == "disk_free")
    assert disk["evidence"]["path"] == "/" and float(disk["evidence"]["free_percent"]) > 0
    # Readings are JSON numbers, not strings ("28.9"); text evidence stays text.
    assert all(isinstance(disk["evidence"][key], (int, float)) for key in ("free_percent", "free_gib"))  # 28 or 28.9
    memory = next(r for r in results if r["check"] == "memory")
    assert memory["evidence"]["limit_percent"] == 100 and isinstance(memory["evidence"]["limit_percent"], int)
    assert isinstance(memory["evidence"]["memory_percent"], (int, float))
    assert set(disk) == {"check", "node", "gpu", "status", "message", "evidence", "remedy", "time", "duration_s"}


@pytest.mark.parametrize(
    "text, value",
    [
        ("28.9", 28.9),
        ("90", 90),
        ("-3", -3),
        ("0", 0),
        ("0.5", 0.5),
        ("1.23457e+06", 1234570.0),
        ("x16/x16", "x16/x16"),
        ("/", "/"),
        ("1e400", "1e400"),
        ("nan", "nan"),
        ("007", "007"),
        ("", ""),
        ("1" * 40, "1" * 40),
        ("2.", "2."),
        (" 5", " 5"),
    ],
)
def test_evidence_values_become_json_numbers_only_when_plain_numbers(text, value):
    assert evidence_value(text) == value and type(evidence_value(text)) is type(value)


def test_a_failing_check_exits_1_and_the_table_shows_it_with_its_remedy(tmp_path, clean_home):
    _, env = clean_home
    strict = RELAXED.replace("disk_free_percent = 0", "disk_free_percent = 100")
    done = check(tmp_path, env, LOCAL + strict)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL  box" in done.stdout and "disk_free" in done.stdout
    assert "remedy: free space" in done.stdout
    assert "1 fail" in done.stdout.splitlines()[-1]
    fail = [r for r in results_of(check(tmp_path, env, LOCAL + strict, "--json")) if r["status"] == "fail"]
    assert [r["check"] for r in fail] == ["disk_free"]


def test_an_unreachable_node_exits_2_and_a_failure_elsewhere_still_exits_1(tmp_path, clean_home):
    _, env = clean_home
    gone = (
        '[ssh]\nconnect_timeout = 2\n[[nodes]]\nname = "gone"\nhost = "127.0.0.1"\nport = %d\n' % closed_loopback_port()
    )
    done = check(tmp_path, env, LOCAL + gone + RELAXED, "--json", "--timeout", "5")
    assert done.returncode == 2, done.stdout + done.stderr
    unreachable = [r for r in results_of(done) if r["node"] == "gone"]
    assert [(r["check"], r["status"]) for r in unreachable] == [("node_reachable", "error")]
    strict = RELAXED.replace("disk_free_percent = 0", "disk_free_percent = 100")
    assert check(tmp_path, env, LOCAL + gone + strict, "--timeout", "5").returncode == 1


def test_node_selection_and_unknown_names(tmp_path, clean_home):
    _, env = clean_home
    two = LOCAL + '[[nodes]]\nname = "other"\nhost = "127.0.0.1"\nport = %d\n' % closed_loopback_port() + RELAXED
    done = check(tmp_path, env, two, "--json", "--node", "box")
    assert done.returncode == 0 and {r["node"] for r in results_of(done)} == {"box"}  # the unreachable one left out
    bad = check(tmp_path, env, two, "--node", "bx")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "opsconsole: check: no node is named bx (did you mean box?); nodes: box, other"


def test_level_and_force_without_gpu_tests_are_refused_not_ignored(tmp_path, clean_home):
    """`check --level 2` used to pass on the telemetry alone, no GPU tested and nothing said."""
    _, env = clean_home
    for option in (["--level", "2"], ["--level", "1"], ["--force"]):
        done = check(tmp_path, env, LOCAL + RELAXED, *option)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.strip() == (
            "opsconsole: check: --level and --force go with --gpu-tests, e.g. check --gpu-tests --level 2"
        )


def test_gpu_tests_on_a_node_without_a_gpu_are_skipped_not_an_error(tmp_path, clean_home):
    if nvidia_device_files():
        return  # on a GPU machine the suite runs for real (tests/test_health_gpu.py)
    _, env = clean_home
    config = '[[nodes]]\nname = "box"\nlocal = true\npython = "%s"\n' % sys.executable + RELAXED
    done = check(tmp_path, env, config, "--json", "--gpu-tests")
    assert done.returncode == 0, done.stdout + done.stderr
    suite = [r for r in results_of(done) if r["check"].startswith("gpu_sanity.")]
    assert [(r["check"], r["status"]) for r in suite] == [("gpu_sanity.suite", "skip")]
    assert suite[0]["message"].startswith("skipped: no GPU (")
    table = check(tmp_path, env, config, "--gpu-tests")
    assert table.returncode == 0, table.stdout + table.stderr
    assert "SKIP  box" in table.stdout and "skipped: no GPU" in table.stdout
    assert table.stdout.splitlines()[-1].endswith("1 skipped")
    assert "--force" not in table.stdout


def test_gpu_tests_under_a_python_without_pynvml_on_a_node_without_a_driver_say_no_driver(tmp_path, clean_home):
    if nvidia_device_files() or Path(PROC_VERSION).exists():
        pytest.skip("this machine has an NVIDIA driver")
    _, env = clean_home
    venv = tmp_path / "bare-venv"  # a real python3 without pynvml, as on a bare node
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    config = '[[nodes]]\nname = "box"\nlocal = true\npython = "%s"\n' % (venv / "bin" / "python") + RELAXED
    done = check(tmp_path, env, config, "--json", "--gpu-tests")
    assert done.returncode == 0, done.stdout + done.stderr
    (suite,) = [r for r in results_of(done) if r["check"].startswith("gpu_sanity.")]
    assert suite["status"] == "skip"
    assert suite["message"].startswith("skipped: no GPU (no NVIDIA driver on this node (no /proc/driver/nvidia/version")
    assert "pynvml" not in suite["message"]


@pytest.mark.parametrize(
    "inventory, devices, reason",
    [
        (None, [], "NVML failed (x) and nvidia-smi is missing"),  # no driver, no device: no GPU
        ([], [], "nvml lists no GPU"),
        (None, ["nvidia0"], ""),  # a GPU whose processes cannot be listed: refused, not skipped
        (
            [{"index": 0, "uuid": "GPU-1", "pids": [], "used_bytes": 0}],
            [],
            "",
        ),  # a GPU without device files (a container)
    ],
)
def test_no_gpu_reason(inventory, devices, reason):
    source = "nvml" if inventory is not None else "NVML failed (x) and nvidia-smi is missing"
    assert no_gpu_reason(inventory, source, devices) == reason


def test_nvidia_device_files_names_only_gpus(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-caps", "null"):
        (tmp_path / name).touch()
    assert nvidia_device_files(str(tmp_path)) == ["nvidia0", "nvidia1"]
    assert nvidia_device_files(str(tmp_path / "missing")) == []
