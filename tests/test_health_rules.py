"""Threshold rules, table-driven over frames derived from the real H200 captures (fixtures/h200_frame.json)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from opsconsole.config import HealthConfig, parse_config
from opsconsole.health import rules
from opsconsole.health.monitor import HealthMonitor
from opsconsole.health.result import STATUS_FAIL, STATUS_PASS, STATUS_WARN
from opsconsole.health.runner import evaluate_state, exit_status
from opsconsole.model import STATE_DOWN, STATE_STALE, STATE_UP, DiskUsage, NodeFrame, NodeState, from_wire

FIXTURES = Path(__file__).parent / "fixtures"
CFG = HealthConfig()


def captured_frame(name: str = "h200_frame.json") -> NodeFrame:
    path = FIXTURES / name if (FIXTURES / name).exists() else FIXTURES / "h200_probe" / name
    return from_wire(NodeFrame, json.loads(path.read_text()))


LOADED = captured_frame()  # the H200 at 98 % under a bf16 matmul, 55 C, SwPowerCap
IDLE = captured_frame("h200_frame_idle.json")  # the same H200 idle, 34 C, GpuIdle
GPU = LOADED.gpus[0]


def with_gpu(frame: NodeFrame = LOADED, **changes) -> NodeFrame:
    return replace(frame, gpus=(replace(frame.gpus[0], **changes),))


def with_host(frame: NodeFrame = LOADED, **changes) -> NodeFrame:
    return replace(frame, host=replace(frame.host, **changes))


def by_check(results, check):
    found = [r for r in results if r.check == check]
    assert len(found) == 1, (check, results)
    return found[0]


def test_the_real_captures_pass_every_rule():
    for frame in (LOADED, IDLE):
        results = rules.evaluate_frame(frame, CFG, now=frame.time)
        assert results, frame
        assert {r.status for r in results} == {STATUS_PASS}, [r for r in results if r.status != STATUS_PASS]
        checks = {r.check for r in results}
        assert {
            "gpu_temperature",
            "gpu_ecc",
            "gpu_remapped_rows",
            "gpu_xid",
            "gpu_clock_events",
            "gpu_pcie_link",
            "gpu_lost",
            "disk_free",
            "memory",
            "iowait",
            "nvml",
        } <= checks
        assert "gpu_retired_pages" not in checks  # NVML gave None for it on the H200: no guess
        assert "swap" not in checks  # the VM has no swap configured


GPU_CASES = [
    # (id, GPU changes, check, status, words in the message)
    ("hot", {"temperature": 86.0}, "gpu_temperature", STATUS_FAIL, "86°C (limit 85°C)"),
    ("at-slowdown", {"temperature": 89.0, "temperature_slowdown": 89.0}, "gpu_temperature", STATUS_FAIL, "89°C"),
    (
        "near-slowdown",
        {"temperature": 82.0, "temperature_slowdown": 86.0},
        "gpu_temperature",
        STATUS_WARN,
        "4°C from slowdown",
    ),
    ("warm-ok", {"temperature": 80.0}, "gpu_temperature", STATUS_PASS, "80°C"),
    ("ecc", {"ecc_volatile_uncorrected": 3}, "gpu_ecc", STATUS_FAIL, "3 uncorrected ECC errors"),
    ("remap-pending", {"remapped_rows_pending": True}, "gpu_remapped_rows", STATUS_WARN, "remap pending"),
    (
        "remap-failed",
        {"remapped_rows_failure": True, "remapped_rows_pending": True},
        "gpu_remapped_rows",
        STATUS_FAIL,
        "remapping failed",
    ),
    ("retired-pending", {"retired_pages_pending": True}, "gpu_retired_pages", STATUS_WARN, "retirement pending"),
    (
        "xid-79",
        {"xid_events": (79,)},
        "gpu_xid",
        STATUS_FAIL,
        "Xid 79 (GPU has fallen off the bus: the host no longer reaches it): reboot the node",
    ),
    (
        "xid-48-63",
        {"xid_events": (48, 63)},
        "gpu_xid",
        STATUS_FAIL,
        "Xid 48 (double-bit (uncorrectable) ECC error): reset the GPU",
    ),
    ("thermal", {"clock_event_reasons": ("SwThermalSlowdown",)}, "gpu_clock_events", STATUS_WARN, "thermal slowdown"),
    (
        "hw-brake",
        {"clock_event_reasons": ("SwPowerCap", "HwPowerBrakeSlowdown")},
        "gpu_clock_events",
        STATUS_FAIL,
        "HwPowerBrakeSlowdown",
    ),
    ("power-cap", {"clock_event_reasons": ("SwPowerCap",)}, "gpu_clock_events", STATUS_PASS, "power cap"),
    ("pcie-gen", {"pcie_gen": 3}, "gpu_pcie_link", STATUS_WARN, "gen 3 of 5"),
    ("pcie-width", {"pcie_width": 8}, "gpu_pcie_link", STATUS_WARN, "x8 of x16"),
    ("lost", {"lost": True}, "gpu_lost", STATUS_FAIL, "lost"),
    ("nvml-errors", {"errors": ("temperature: Unknown Error",)}, "gpu_lost", STATUS_WARN, "Unknown Error"),
]


@pytest.mark.parametrize("changes,check,status,words", [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_gpu_rules(changes, check, status, words):
    result = by_check(rules.evaluate_frame(with_gpu(**changes), CFG, now=1.0), check)
    assert result.status == status
    assert words in result.message
    assert result.gpu == GPU.index and result.node == LOADED.node and result.time == 1.0
    assert result.evidence and result.remedy
    others = [r for r in rules.evaluate_frame(with_gpu(**changes), CFG) if r.check != check]
    assert all(r.status == STATUS_PASS for r in others), others  # one change, one finding


def test_an_idle_gpu_at_a_lower_pcie_gen_is_power_saving_but_a_narrow_link_is_not():
    idle = IDLE.gpus[0]
    assert idle.utilization_gpu == 0.0
    assert by_check(rules.evaluate_frame(with_gpu(IDLE, pcie_gen=1), CFG), "gpu_pcie_link").status == STATUS_PASS
    assert by_check(rules.evaluate_frame(with_gpu(IDLE, pcie_width=4), CFG), "gpu_pcie_link").status == STATUS_WARN


def test_missing_fields_give_no_result_rather_than_a_guess():
    frame = with_gpu(
        temperature=None,
        ecc_volatile_uncorrected=None,
        remapped_rows_pending=None,
        remapped_rows_failure=None,
        clock_event_reasons=None,
        pcie_gen=None,
        pcie_width=None,
    )
    checks = {r.check for r in rules.evaluate_frame(frame, CFG)}
    assert not checks & {"gpu_temperature", "gpu_ecc", "gpu_remapped_rows", "gpu_clock_events", "gpu_pcie_link"}
    assert {"gpu_xid", "gpu_lost"} <= checks


GIB = 1024**3
HOST_CASES = [
    ("disk-low", {"disks": (DiskUsage("/", 100 * GIB, 95 * GIB, 5 * GIB),)}, "disk_free", STATUS_FAIL, "/: 5% free"),
    ("memory-high", {"mem_available": int(LOADED.host.mem_total * 0.05)}, "memory", STATUS_FAIL, "memory 95% used"),
    ("swap", {"swap_total": 8 * GIB, "swap_used": 2 * GIB}, "swap", STATUS_WARN, "swap 25% in use"),
    ("swap-little", {"swap_total": 8 * GIB, "swap_used": GIB // 2}, "swap", STATUS_PASS, "swap 6.2% in use"),
    ("iowait", {"iowait_percent": 35.0}, "iowait", STATUS_WARN, "iowait 35%"),
]


@pytest.mark.parametrize("changes,check,status,words", [c[1:] for c in HOST_CASES], ids=[c[0] for c in HOST_CASES])
def test_host_rules(changes, check, status, words):
    result = by_check(rules.evaluate_frame(with_host(**changes), CFG), check)
    assert result.status == status
    assert words in result.message
    assert result.gpu is None and result.remedy


def test_thresholds_come_from_the_health_section():
    cfg = parse_config(
        "[health]\ngpu_temperature_c = 50\ndisk_free_percent = 80\ntemperature_margin_c = 40\niowait_percent = 0\n",
        "t.toml",
    ).health
    results = rules.evaluate_frame(with_host(iowait_percent=0.5), cfg)
    assert by_check(results, "gpu_temperature").status == STATUS_FAIL  # 55 C > 50
    assert by_check(results, "disk_free").status == STATUS_FAIL  # the capture's / is 25 % free
    assert by_check(results, "iowait").status == STATUS_WARN
    # Only the configured mount points are checked.
    other = parse_config('[health]\ndisk_paths = ["/data"]\n', "t.toml").health
    assert "disk_free" not in {r.check for r in rules.evaluate_frame(LOADED, other)}


def test_bad_health_values_are_config_errors_with_the_line():
    from opsconsole.config import ConfigError

    with pytest.raises(ConfigError, match=r"t.toml:2: health.iowait_percent: must be between 0 and 100"):
        parse_config("[health]\niowait_percent = 150\n", "t.toml")
    with pytest.raises(ConfigError, match="gpu_test_memory_share"):
        parse_config("[health]\ngpu_test_memory_share = 1.5\n", "t.toml")


def test_nvidia_smi_fallback_is_reported_as_nvml_failing():
    frame = replace(LOADED, gpu_source="nvidia-smi", gpu_note="NVML: Driver Not Loaded")
    result = by_check(rules.evaluate_frame(frame, CFG), "nvml")
    assert result.status == STATUS_WARN and "NVML" in result.message


def test_eight_gpus_get_results_per_gpu():
    temps = (40.0, 50.0, 60.0, 70.0, 75.0, 80.0, 84.0, 90.0)  # slowdown at 89: 84 is within 5, 90 past 85
    frame = replace(LOADED, gpus=tuple(replace(GPU, index=i, temperature=t) for i, t in enumerate(temps)))
    temps = [r for r in rules.evaluate_frame(frame, CFG) if r.check == "gpu_temperature"]
    assert [r.gpu for r in temps] == list(range(8))
    assert [r.status for r in temps] == [STATUS_PASS] * 6 + [STATUS_WARN, STATUS_FAIL]


def test_node_states_and_exit_status():
    up = NodeState("n1", STATE_UP, frame=with_gpu(ecc_volatile_uncorrected=1), received_at=LOADED.time)
    results = evaluate_state(up, CFG, now=LOADED.time)
    assert by_check(results, "node_reachable").status == STATUS_PASS
    assert exit_status(results) == 1
    assert exit_status(evaluate_state(NodeState("n1", STATE_UP, frame=LOADED, received_at=1.0), CFG)) == 0
    stale = evaluate_state(
        NodeState("n1", STATE_STALE, frame=LOADED, received_at=LOADED.time - 30), CFG, now=LOADED.time
    )
    assert by_check(stale, "node_reachable").status == STATUS_WARN
    assert "data_loader" not in {r.check for r in stale}  # telemetry only on fresh frames
    down = evaluate_state(NodeState("n1", STATE_DOWN, reason="connection refused", frame=LOADED), CFG)
    assert by_check(down, "node_reachable").status == STATUS_FAIL
    never = evaluate_state(NodeState("n1", STATE_DOWN, reason="no answer within 5 s"), CFG)
    assert [r.status for r in never] == ["error"] and exit_status(never) == 2
    assert exit_status([]) == 2


def test_monitor_keeps_the_time_a_status_began_and_drops_gone_gpus():
    clock = [100.0]
    monitor = HealthMonitor(CFG, now=lambda: clock[0])
    two = replace(LOADED, gpus=(GPU, replace(GPU, index=1)))
    first = monitor.observe(NodeState("n1", STATE_UP, frame=two, received_at=1.0))
    assert first and monitor.failing() == 0
    clock[0] = 110.0
    hot = replace(two, gpus=(GPU, replace(GPU, index=1, temperature=90.0)), seq=2)
    changed = monitor.observe(NodeState("n1", STATE_UP, frame=hot, received_at=2.0))
    assert [(r.check, r.gpu, r.status) for r in changed] == [("gpu_temperature", 1, STATUS_FAIL)]
    assert monitor.failing() == 1
    newest = monitor.entries()[0]
    assert (newest.result.check, newest.result.gpu, newest.since) == ("gpu_temperature", 1, 110.0)
    assert all(e.since == 100.0 for e in monitor.entries()[1:])
    same = NodeState("n1", STATE_UP, frame=hot, received_at=2.0)
    assert monitor.observe(same) == []  # the same frame is not evaluated again
    clock[0] = 120.0
    monitor.observe(NodeState("n1", STATE_UP, frame=replace(LOADED, seq=3), received_at=3.0))
    assert {e.result.gpu for e in monitor.entries()} == {None, 0}  # GPU 1 left: its results too
    assert monitor.failing() == 0
    assert monitor.observe(NodeState("n2")) == []  # connecting: nothing to say yet


def test_the_fast_constructor_builds_the_same_result():
    from opsconsole.health.result import HealthResult, make_result

    args = (
        "gpu_ecc",
        "n1",
        STATUS_FAIL,
        "GPU 0: 1 uncorrected ECC errors",
        0,
        (("ecc_volatile_uncorrected", "1"),),
        "reset",
        5.0,
    )
    fast, slow = make_result(*args), HealthResult(*args)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert replace(fast, status=STATUS_PASS).status == STATUS_PASS and fast.duration_s is None
