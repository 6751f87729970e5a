"""GpuReader over a fake pynvml that replays real H200 readings (tests/nvml_replay.py).

Expected values are read from the same captures the fake replays, never typed in here.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nvml_replay import ReplayNvml, load_capture, load_procs_capture, replicated_uuid

from opsconsole.model import GpuSample, NodeFrame, ProcessSample, from_wire, to_wire
from opsconsole.probe import gpu as gpu_module
from opsconsole.probe import nvidia_driver
from opsconsole.probe.gpu import GpuReader, GpuReading, SmiError
from opsconsole.probe.nvml_decode import (
    CLOCK_EVENT_REASONS,
    compute_mode_name,
    decode_clock_event_reasons,
    describe_xid,
    pstate_number,
)
from opsconsole.probe.smi import (
    BASIC_GPU_FIELD_LIST,
    QUERY_GPU_FIELD_LIST,
    query_apps_argv,
    query_gpu_argv,
)

ROOT = Path(__file__).parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
PROBE_CAPTURES = FIXTURES / "h200_probe"
SUBPROCESS_GUARD_S = 120  # only so a hang fails the test instead of blocking the run
RECORDED = load_capture()["devices"][0]
LOAD = load_procs_capture()
MIB = 1024 * 1024

FAST_CALLS = (
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlEventSetWait_v2",
)
SLOW_CALLS = (
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetMigMode",
)
STATIC_CALLS = ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo")


def make_reader(replay: ReplayNvml, slow_every: int = 5, **kwargs) -> GpuReader:
    return GpuReader(slow_every=slow_every, nvml=replay.module, **kwargs)


# --- values come through --------------------------------------------------------------


def test_recorded_h200_values_come_through_in_their_units():
    replay = ReplayNvml()
    reader = make_reader(replay)
    assert reader.read().gpus[0].pcie_tx_kbs is None  # the PCIe rates come with the second reading
    reading = reader.read()
    assert reading.source == "nvml" and reading.note is None and reading.errors == ()
    assert reading.driver_version == load_capture()["driver"]
    (gpu,) = reading.gpus
    mem = RECORDED["mem"]
    assert gpu.index == 0
    assert gpu.uuid == RECORDED["uuid"]
    assert gpu.name == RECORDED["name"]
    assert gpu.pci_bus_id == RECORDED["pci"]  # pynvml gives busId as bytes
    assert (gpu.utilization_gpu, gpu.utilization_memory) == (RECORDED["util"]["gpu"], RECORDED["util"]["memory"])
    assert (gpu.memory_total, gpu.memory_used, gpu.memory_free, gpu.memory_reserved) == (
        mem["total"],
        mem["used"],
        mem["free"],
        mem["reserved"],
    )
    assert gpu.temperature == RECORDED["temp"]
    assert (gpu.temperature_slowdown, gpu.temperature_shutdown) == (
        RECORDED["temp_thresh_slowdown"],
        RECORDED["temp_thresh_shutdown"],
    )
    assert gpu.power_draw_w == pytest.approx(RECORDED["power_mw"] / 1000.0)
    assert gpu.power_limit_w == pytest.approx(RECORDED["power_limit_mw"] / 1000.0)
    assert gpu.energy_j == pytest.approx(RECORDED["energy_mj"] / 1000.0)
    assert (gpu.clock_sm_mhz, gpu.clock_mem_mhz, gpu.clock_sm_max_mhz) == (
        RECORDED["clock_sm"],
        RECORDED["clock_mem"],
        RECORDED["clock_sm_max"],
    )
    assert RECORDED["throttle"] == 1 and gpu.clock_event_reasons == ("GpuIdle",)
    assert gpu.pstate == RECORDED["pstate"]
    assert gpu.ecc_enabled is bool(RECORDED["ecc_mode"][0])
    assert (gpu.ecc_volatile_uncorrected, gpu.ecc_aggregate_uncorrected, gpu.ecc_volatile_corrected) == (
        RECORDED["ecc_vol_uncorr"],
        RECORDED["ecc_agg_uncorr"],
        RECORDED["ecc_vol_corr"],
    )
    corr, unc, pending, failure = RECORDED["remapped_rows"]
    assert (gpu.remapped_rows_corrected, gpu.remapped_rows_uncorrected) == (corr, unc)
    assert (gpu.remapped_rows_pending, gpu.remapped_rows_failure) == (bool(pending), bool(failure))
    assert (gpu.pcie_gen, gpu.pcie_width, gpu.pcie_tx_kbs) == (
        RECORDED["pcie_gen"],
        RECORDED["pcie_width"],
        RECORDED["pcie_tx_kbs"],
    )
    assert gpu.persistence_mode is bool(RECORDED["persistence"])
    assert gpu.compute_mode == compute_mode_name(RECORDED["compute_mode"]) == "Default"
    assert gpu.mig_mode is bool(RECORDED["mig"][0])
    assert gpu.xid_events == () and not gpu.lost and gpu.errors == ()
    assert reading.processes == ()


def test_not_supported_fields_are_none_and_not_asked_again():
    replay = ReplayNvml()
    reader = make_reader(replay, slow_every=1)
    readings = [reader.read() for _ in range(3)]
    assert RECORDED["fan"].startswith("ERR NVMLError_NotSupported")
    assert RECORDED["retired_pages_pending"].startswith("ERR NVMLError_NotSupported")
    for reading in readings:
        (gpu,) = reading.gpus
        assert gpu.fan_percent is None and gpu.retired_pages_pending is None
        assert gpu.errors == ()
    assert replay.count("nvmlDeviceGetFanSpeed") == 1
    assert replay.count("nvmlDeviceGetRetiredPagesPendingStatus") == 1
    assert replay.count("nvmlDeviceGetRemappedRows") == 3  # a supported slow field: every slow tick


def test_loaded_gpu_reports_power_cap_and_its_process_with_sm_percent():
    replay = ReplayNvml(load=True)
    reading = make_reader(replay).read()
    (gpu,) = reading.gpus
    assert LOAD["throttle"] == 4 and gpu.clock_event_reasons == ("SwPowerCap",)
    assert gpu.utilization_gpu == LOAD["util"][0]
    (proc,) = reading.processes
    (recorded,) = LOAD["procs"]
    (util,) = LOAD["proc_util"]
    assert isinstance(proc, ProcessSample)
    assert proc.pid == recorded["pid"] == util["pid"]
    assert proc.gpu_memory_bytes == recorded["usedGpuMemory"]
    assert proc.gpu_sm_percent == util["sm"]
    assert (proc.gpu_index, proc.gpu_uuid) == (0, gpu.uuid)


def test_process_utilisation_asks_only_for_samples_newer_than_the_last_seen():
    replay = ReplayNvml(load=True)
    reader = make_reader(replay)
    seen = []
    original = replay.module.nvmlDeviceGetProcessUtilization

    def spy(handle, since):
        seen.append(since)
        return original(handle, since)

    replay.module.nvmlDeviceGetProcessUtilization = spy
    first, second, third = reader.read(), reader.read(), reader.read()
    assert seen[0] == 0 and seen[1] > 0  # ticks 1 and 3: every second tick
    assert second.processes[0].gpu_sm_percent == first.processes[0].gpu_sm_percent  # kept between reads
    assert third.processes[0].gpu_sm_percent == first.processes[0].gpu_sm_percent


def test_process_utilisation_is_read_every_second_tick_and_at_once_when_the_processes_change():
    replay = ReplayNvml(load=True)
    reader = make_reader(replay)
    for _ in range(4):
        assert reader.read().processes[0].gpu_sm_percent is not None
    assert replay.count("nvmlDeviceGetProcessUtilization", 0) == 2  # ticks 1 and 3
    newcomer = dict(replay.procs_capture["procs"][0], pid=4242)
    replay.procs_capture["procs"].append(newcomer)
    replay.procs_capture["proc_util"].append(dict(replay.procs_capture["proc_util"][0], pid=4242))
    reading = reader.read()  # tick 5 would be read anyway; tick 6 shows the rule
    replay.procs_capture["procs"].pop()
    reading = reader.read()  # tick 6: the newcomer left, the set changed: read at once
    assert replay.count("nvmlDeviceGetProcessUtilization", 0) == 4
    assert [p.pid for p in reading.processes] == [replay.procs_capture["procs"][0]["pid"]]
    replay.procs_capture["procs"].append(newcomer)
    reading = reader.read()  # tick 7: it is back, read at once, its share shown on this tick
    assert replay.count("nvmlDeviceGetProcessUtilization", 0) == 5
    assert {p.pid: p.gpu_sm_percent for p in reading.processes}[4242] is not None


def test_idle_gpu_does_not_ask_for_process_utilisation():
    replay = ReplayNvml()
    make_reader(replay).read()
    assert replay.count("nvmlDeviceGetProcessUtilization") == 0


# --- isolation ------------------------------------------------------------------------


def test_an_error_on_one_field_of_one_gpu_leaves_the_rest_reporting():
    replay = ReplayNvml(gpus=3, faults={1: {"nvmlDeviceGetUtilizationRates": "NVMLError_Unknown"}})
    reading = make_reader(replay).read()
    assert [g.index for g in reading.gpus] == [0, 1, 2]
    bad = reading.gpus[1]
    assert bad.utilization_gpu is None and bad.utilization_memory is None
    assert bad.errors == ("utilization: Unknown Error",)
    assert not bad.lost
    assert bad.memory_total == RECORDED["mem"]["total"] and bad.uuid == replicated_uuid(RECORDED["uuid"], 1)
    for good in (reading.gpus[0], reading.gpus[2]):
        assert good.errors == ()
        assert good.utilization_gpu == RECORDED["util"]["gpu"]
    assert reading.errors == ()


def test_an_error_is_retried_next_tick_not_remembered_as_unsupported():
    replay = ReplayNvml(faults={0: {"nvmlDeviceGetUtilizationRates": "NVMLError_Unknown"}})
    reader = make_reader(replay)
    assert reader.read().gpus[0].errors == ("utilization: Unknown Error",)
    del replay.faults[0]
    gpu = reader.read().gpus[0]
    assert gpu.errors == () and gpu.utilization_gpu == RECORDED["util"]["gpu"]


def test_a_static_field_that_keeps_failing_is_asked_again_on_slow_ticks_only():
    """Not every tick: each retry costs the static tier's calls, for a field that cannot have changed."""
    replay = ReplayNvml(faults={0: {"nvmlDeviceGetTemperatureThreshold": "NVMLError_Unknown"}})
    reader = make_reader(replay, slow_every=5)
    readings = [reader.read() for _ in range(7)]
    # Ticks 1 and 6 are slow: two reads of the static tier in seven ticks, not seven.
    assert replay.calls[("nvmlDeviceGetName", 0)] == 2
    for reading in readings:  # the failure is shown on every tick until a retry reads it
        gpu = reading.gpus[0]
        assert gpu.errors == ("temperature_slowdown: Unknown Error", "temperature_shutdown: Unknown Error")
        assert gpu.temperature_slowdown is None and gpu.name == RECORDED["name"]
        assert gpu.utilization_gpu == RECORDED["util"]["gpu"]  # the fast tier reads on
    del replay.faults[0]
    for _ in range(3):  # ticks 8-10
        assert reader.read().gpus[0].errors  # not yet a slow tick
    gpu = reader.read().gpus[0]  # tick 11: slow, the retry reads it
    assert gpu.errors == () and gpu.temperature_slowdown is not None
    assert replay.calls[("nvmlDeviceGetName", 0)] == 3
    reader.read()
    assert replay.calls[("nvmlDeviceGetName", 0)] == 3  # whole now: not asked again


def test_a_static_value_read_before_stays_when_its_retry_fails():
    replay = ReplayNvml(faults={0: {"nvmlDeviceGetTemperatureThreshold": "NVMLError_Unknown"}})
    reader = make_reader(replay, slow_every=1)
    assert reader.read().gpus[0].name == RECORDED["name"]
    replay.faults[0]["nvmlDeviceGetName"] = "NVMLError_Unknown"
    gpu = reader.read().gpus[0]
    assert gpu.name == RECORDED["name"] and "name: Unknown Error" in gpu.errors


def test_a_lost_gpu_is_marked_and_costs_one_call_while_the_others_report():
    replay = ReplayNvml(gpus=3)
    reader = make_reader(replay)
    reader.read()
    replay.faults[2] = {"*": "NVMLError_GpuIsLost"}
    calls_before = sum(n for (name, index), n in replay.calls.items() if index == 2)
    reading = reader.read()
    calls_after = sum(n for (name, index), n in replay.calls.items() if index == 2)
    lost = reading.gpus[2]
    assert lost.lost is True
    assert lost.errors and "GPU is lost" in lost.errors[0]
    assert lost.uuid == replicated_uuid(RECORDED["uuid"], 2) and lost.name == RECORDED["name"]  # kept from before
    assert lost.temperature is None and lost.memory_total is None
    assert calls_after - calls_before == 1
    for good in reading.gpus[:2]:
        assert not good.lost and good.errors == () and good.temperature == RECORDED["temp"]


def test_a_gpu_lost_from_the_start_still_appears():
    replay = ReplayNvml(gpus=2, faults={0: {"*": "NVMLError_GpuIsLost"}})
    reading = make_reader(replay).read()
    assert [g.index for g in reading.gpus] == [0, 1]
    assert reading.gpus[0].lost and reading.gpus[0].uuid is None
    assert reading.gpus[1].uuid == replicated_uuid(RECORDED["uuid"], 1) and not reading.gpus[1].lost


@pytest.mark.parametrize("error, lost", [("NVMLError_Unknown", False), ("NVMLError_GpuIsLost", True)])
def test_a_gpu_without_a_handle_still_appears(error, lost):
    replay = ReplayNvml(gpus=3, no_handle={1: error})
    reader = make_reader(replay, slow_every=5)
    reading = reader.read()
    missing = reading.gpus[1]
    assert missing == GpuSample(index=1, lost=lost, errors=(missing.errors[0],))
    assert missing.errors[0].startswith("handle: ")
    assert [g.uuid for g in (reading.gpus[0], reading.gpus[2])] == [
        replicated_uuid(RECORDED["uuid"], 0),
        replicated_uuid(RECORDED["uuid"], 2),
    ]
    for _ in range(5):  # ticks 2..6: the handle is asked for again on slow tick 6 only
        reader.read()
    assert replay.count("nvmlDeviceGetHandleByIndex", 1) == 3  # open, slow tick 1, slow tick 6
    del replay.no_handle[1]
    for _ in range(5):
        reading = reader.read()  # tick 11 is slow: the handle comes back
    assert reading.gpus[1].uuid == replicated_uuid(RECORDED["uuid"], 1) and reading.gpus[1].errors == ()


def test_device_count_failure_is_a_reading_error_not_an_exception():
    replay = ReplayNvml()

    def broken_count():
        raise replay.error("NVMLError_Unknown")

    replay.module.nvmlDeviceGetCount = broken_count
    reading = make_reader(replay).read()
    assert reading.source == "nvml" and reading.gpus == ()
    assert reading.errors == ("device count: Unknown Error",)


# --- tiering --------------------------------------------------------------------------


def test_slow_fields_are_read_every_n_ticks_and_static_ones_once():
    replay = ReplayNvml(gpus=2)
    reader = make_reader(replay, slow_every=5)
    readings = [reader.read() for _ in range(11)]
    for index in (0, 1):
        for name in FAST_CALLS[:-1]:
            assert replay.count(name, index) == 11, name
        for name in SLOW_CALLS:
            assert replay.count(name, index) == 3, name  # ticks 1, 6, 11
        for name in STATIC_CALLS:
            assert replay.count(name, index) == 1, name
        assert replay.count("nvmlDeviceGetTemperatureThreshold", index) == 2  # slowdown, shutdown: once
        assert replay.count("nvmlDeviceGetTotalEnergyConsumption", index) == 1  # every 6th slow tick
    assert replay.count("nvmlEventSetWait_v2") == 22  # one drain per GPU per tick
    assert replay.count("nvmlInit") == 1
    # Between slow ticks the last slow values are reported again.
    assert all(r.gpus[0].pcie_gen == RECORDED["pcie_gen"] for r in readings)
    assert all(r.gpus[1].energy_j == readings[0].gpus[1].energy_j for r in readings)


def test_the_energy_counter_is_read_on_every_sixth_slow_tick_and_kept_between():
    replay = ReplayNvml()
    reader = make_reader(replay, slow_every=2)
    first = reader.read().gpus[0]
    replay.device["energy_mj"] = replay.device["energy_mj"] + 5000
    readings = [reader.read().gpus[0] for _ in range(12)]  # ticks 2..13: slow on 3, 5, 7, 9, 11, 13
    assert replay.count("nvmlDeviceGetTotalEnergyConsumption", 0) == 2  # slow reads 0 and 6 (tick 13)
    assert all(r.energy_j == first.energy_j for r in readings[:-1])  # kept, not None, in between
    assert readings[-1].energy_j == first.energy_j + 5.0


def test_slow_values_refresh_only_on_slow_ticks():
    replay = ReplayNvml()
    reader = make_reader(replay, slow_every=3)
    first = reader.read().gpus[0]
    replay.device["remapped_rows"] = [first.remapped_rows_corrected + 2, 1, 1, 0]
    replay.device["temp"] = RECORDED["temp"] + 5
    second = reader.read().gpus[0]
    assert second.remapped_rows_corrected == first.remapped_rows_corrected  # slow: reused
    assert second.temperature == RECORDED["temp"] + 5  # fast: fresh
    reader.read()
    fourth = reader.read().gpus[0]  # tick 4 is slow
    assert fourth.remapped_rows_corrected == first.remapped_rows_corrected + 2
    assert fourth.remapped_rows_pending is True


PCIE_TX0, PCIE_RX0 = 10_000_000, 20_000_000  # the byte counters at the first reading


def counting_pcie_reader(slow_every: int):
    """(replay with PCIe byte counters, its reader, the reader's clock as a one-item list)."""
    replay = ReplayNvml(pcie_counters={0: (PCIE_TX0, PCIE_RX0)})
    reader = make_reader(replay, slow_every=slow_every)
    now = [100.0]
    reader.clock = lambda: now[0]
    return replay, reader, now


def test_pcie_rates_come_from_byte_counters_when_the_gpu_has_them():
    tx0, rx0 = PCIE_TX0, PCIE_RX0
    replay, reader, now = counting_pcie_reader(slow_every=1)
    first = reader.read().gpus[0]
    # No previous counters: unknown, rather than 2 x 20 ms of the sampling call on the first reading.
    assert (first.pcie_tx_kbs, first.pcie_rx_kbs) == (None, None) and first.errors == ()
    replay.pcie_counters[0] = (tx0 + 4 * 1024 * 1000, rx0 + 2 * 1024 * 1000)
    now[0] += 2.0
    second = reader.read().gpus[0]
    assert (second.pcie_tx_kbs, second.pcie_rx_kbs) == (2000, 1000)
    assert replay.count("nvmlDeviceGetPcieThroughput") == 0  # never the sampling call


def test_the_first_readings_pcie_rates_come_with_the_next_read_not_the_next_slow_tick():
    tx0, rx0 = PCIE_TX0, PCIE_RX0
    replay, reader, now = counting_pcie_reader(slow_every=5)
    first = reader.read().gpus[0]
    assert first.pcie_tx_kbs is None and first.pcie_gen == RECORDED["pcie_gen"]  # the slow tier's link is read
    replay.pcie_counters[0] = (tx0 + 1024 * 1000, rx0)
    now[0] += 1.0
    second = reader.read().gpus[0]  # tick 2: not a slow tick
    assert (second.pcie_tx_kbs, second.pcie_rx_kbs) == (1000, 0)
    assert second.pcie_gen == first.pcie_gen and second.ecc_enabled == first.ecc_enabled  # slow values kept
    replay.pcie_counters[0] = (tx0 + 9 * 1024 * 1000, rx0)
    now[0] += 1.0
    third = reader.read().gpus[0]  # tick 3: the rates of tick 2 stay until the next slow tick
    assert third.pcie_tx_kbs == 1000
    assert replay.count("nvmlDeviceGetFieldValues") == 2  # the first reading and tick 2 only
    assert replay.count("nvmlDeviceGetPcieThroughput") == 0


def test_pcie_rates_use_the_sampling_call_without_counters():
    replay = ReplayNvml()
    reader = make_reader(replay, slow_every=1)
    first = reader.read().gpus[0]
    assert first.pcie_tx_kbs is None  # the first reading does not wait for the 20 ms windows
    second = reader.read().gpus[0]
    assert second.pcie_tx_kbs == RECORDED["pcie_tx_kbs"]
    reader.read()
    assert replay.count("nvmlDeviceGetFieldValues") == 1  # tried once, unsupported, not again
    # TX on the second and third reads; RX was not recorded (NotSupported in the replay), so asked once only.
    assert replay.count("nvmlDeviceGetPcieThroughput") == 3


# --- XID events -----------------------------------------------------------------------


def test_xid_events_are_drained_each_tick_per_gpu():
    replay = ReplayNvml(gpus=2)
    reader = make_reader(replay)
    assert [g.xid_events for g in reader.read().gpus] == [(), ()]
    replay.push_xid(1, 79)
    replay.push_xid(1, 48)
    reading = reader.read()
    assert reading.gpus[1].xid_events == (79, 48)
    assert reading.gpus[0].xid_events == ()
    assert reader.read().gpus[1].xid_events == ()  # drained
    assert describe_xid(79) == "XID 79: GPU has fallen off the bus"


def test_xid_events_unsupported_are_noted_once_and_skipped():
    replay = ReplayNvml(events_supported=False)
    reader = make_reader(replay)
    first, second = reader.read(), reader.read()
    assert first.errors == ("xid events: not supported on GPU 0",)
    assert second.errors == ()
    assert first.gpus[0].errors == () and first.gpus[0].xid_events == ()
    assert replay.count("nvmlEventSetWait_v2") == 0


def test_close_frees_event_sets_and_shuts_nvml_down_once():
    replay = ReplayNvml(gpus=2)
    reader = make_reader(replay)
    reader.read()
    reader.close()
    reader.close()
    assert replay.freed_sets == 2 and replay.shutdowns == 1
    after = reader.read()
    assert after.source == "none" and after.gpus == ()


# --- versioned calls --------------------------------------------------------------------


def test_processes_fall_back_from_v3_to_v2_and_remember():
    replay = ReplayNvml(
        load=True, faults={0: {"nvmlDeviceGetComputeRunningProcesses_v3": "NVMLError_FunctionNotFound"}}
    )
    reader = make_reader(replay)
    first, second = reader.read(), reader.read()
    assert [p.pid for p in first.processes] == [p["pid"] for p in LOAD["procs"]] == [p.pid for p in second.processes]
    assert first.gpus[0].errors == ()
    assert replay.count("nvmlDeviceGetComputeRunningProcesses_v3") == 1
    assert replay.count("nvmlDeviceGetComputeRunningProcesses_v2") == 2


def test_memory_info_falls_back_to_v1_without_reserved():
    replay = ReplayNvml()
    original = replay.module.nvmlDeviceGetMemoryInfo

    def v1_only(handle, version=None):
        if version:
            raise replay.error("NVMLError_FunctionNotFound")
        return original(handle)

    replay.module.nvmlDeviceGetMemoryInfo = v1_only
    gpu = make_reader(replay).read().gpus[0]
    mem = RECORDED["mem"]
    assert gpu.memory_total == mem["total"] and gpu.memory_free == mem["free"]
    assert gpu.memory_used == mem["used"] + mem["reserved"] and gpu.memory_reserved is None
    assert gpu.errors == ()


def test_an_older_pynvml_without_a_function_reports_none_for_that_field():
    replay = ReplayNvml()
    del replay.module.nvmlDeviceGetCurrentClocksEventReasons  # before 12.535 only the Throttle name
    gpu = make_reader(replay).read().gpus[0]
    assert gpu.clock_event_reasons == ("GpuIdle",)
    del replay.module.nvmlDeviceGetMigMode
    gpu = make_reader(replay).read().gpus[0]
    assert gpu.mig_mode is None and gpu.errors == ()


# --- no NVML: nvidia-smi, or nothing -----------------------------------------------------


def real_smi(argv):
    """nvidia-smi as captured on the H200 while a torch process ran (our own argv)."""
    if argv == query_gpu_argv():
        return (PROCESS_CAPTURE_QUERY).read_text()
    if argv == query_apps_argv():
        return (PROCESS_CAPTURE_APPS).read_text()
    raise AssertionError("unexpected argv %r" % argv)


PROCESS_CAPTURE_QUERY = PROBE_CAPTURES / "smi-query-load.csv"
PROCESS_CAPTURE_APPS = PROBE_CAPTURES / "smi-apps-load.csv"


def _capture_cells():
    return [c.strip() for c in PROCESS_CAPTURE_QUERY.read_text().strip().split(",")]


@pytest.mark.parametrize(
    "error, note",
    [
        ("NVMLError_LibraryNotFound", "no NVIDIA driver: NVML Shared Library Not Found"),
        ("NVMLError_DriverNotLoaded", "no NVIDIA driver: Driver Not Loaded"),
        ("NVMLError_Unknown", "NVML init failed: Unknown Error"),
    ],
)
def test_no_nvml_falls_back_to_nvidia_smi(error, note):
    replay = ReplayNvml(init_error=error)
    reading = make_reader(replay, smi_run=real_smi).read()
    cells = dict(zip(QUERY_GPU_FIELD_LIST, _capture_cells()))
    assert reading.source == "nvidia-smi"
    assert reading.note == note + "; read by nvidia-smi"
    assert reading.driver_version == cells["driver_version"]
    (gpu,) = reading.gpus
    assert gpu.uuid == cells["uuid"] and gpu.index == int(cells["index"])
    assert gpu.memory_total == int(cells["memory.total"]) * MIB
    assert gpu.clock_event_reasons == decode_clock_event_reasons(int(cells["clocks_event_reasons.active"], 16))
    pid, name, used, uuid = [c.strip() for c in PROCESS_CAPTURE_APPS.read_text().strip().split(",")]
    (proc,) = reading.processes
    assert (proc.pid, proc.name, proc.gpu_memory_bytes, proc.gpu_index, proc.gpu_uuid) == (
        int(pid),
        name,
        int(used) * MIB,
        0,
        uuid,
    )


def test_missing_pynvml_falls_back_to_nvidia_smi(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    # The capture's node had its driver (nvidia-smi answered): its /proc file is the evidence.
    on_that_node = functools.partial(nvidia_driver.without_pynvml, evidence_of=lambda: nvidia_driver.PROC_VERSION)
    reading = GpuReader(smi_run=real_smi, without_pynvml=on_that_node, nothing_for_nvml=lambda: False).read()
    assert reading.source == "nvidia-smi" and reading.note.startswith("pynvml not installed")
    assert "the NVIDIA driver is present: /proc/driver/nvidia/version" in reading.note
    assert len(reading.gpus) == 1


def python_without_pynvml(tmp_path: Path) -> Path:
    """A real interpreter that cannot import pynvml: a fresh venv without site packages (as a bare node's python3)."""
    venv = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=SUBPROCESS_GUARD_S)
    python = venv / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import pynvml"], capture_output=True).returncode != 0
    return python


def note_without_pynvml_or_smi(python: Path) -> str:
    """The GPU note of a real probe reading under `python`, with no nvidia-smi on PATH."""
    code = "from opsconsole.probe.gpu import read_gpus_once; r = read_gpus_once(); print(r.source); print(r.note)"
    env = {"PYTHONPATH": str(ROOT), "PATH": str(python.parent), "HOME": "/nonexistent"}
    done = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, env=env, timeout=SUBPROCESS_GUARD_S, check=True
    )
    source, note = done.stdout.splitlines()
    assert source == "none"
    return note


@pytest.mark.skipif(Path(nvidia_driver.PROC_VERSION).exists(), reason="this machine has an NVIDIA driver")
def test_no_pynvml_on_a_node_without_a_driver_says_no_driver_not_pynvml(tmp_path):
    note = note_without_pynvml_or_smi(python_without_pynvml(tmp_path))
    assert (
        note
        == "no NVIDIA driver on this node (no /proc/driver/nvidia/version, libnvidia-ml.so.1 not loadable); nvidia-smi not found"
    )
    assert "pynvml" not in note


@pytest.mark.skipif(Path(nvidia_driver.PROC_VERSION).exists(), reason="this machine has an NVIDIA driver")
def test_a_node_without_a_driver_never_imports_pynvml_though_it_is_installed():
    # This interpreter has pynvml; the node has no driver, so its init could only fail, and the module
    # (~2 MB of the console's RSS) stayed loaded for nothing (issue 17).
    code = (
        "import sys\n"
        "from opsconsole.probe.gpu import read_gpus_once\n"
        "r = read_gpus_once()\n"
        "print(r.source); print(r.note); print('pynvml' in sys.modules)\n"
    )
    env = dict(os.environ, PATH="/nonexistent")  # no nvidia-smi either
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=SUBPROCESS_GUARD_S
    )
    assert done.returncode == 0, done.stderr
    assert subprocess.run([sys.executable, "-c", "import pynvml"], capture_output=True).returncode == 0
    source, note, imported = done.stdout.splitlines()
    assert source == "none"
    assert note == nvidia_driver.NO_DRIVER_DETAIL + "; nvidia-smi not found"
    assert imported == "False"


@pytest.mark.skipif(not Path(nvidia_driver.PROC_VERSION).exists(), reason="needs a machine with an NVIDIA driver")
def test_no_pynvml_on_a_node_with_a_driver_names_pynvml(tmp_path):
    note = note_without_pynvml_or_smi(python_without_pynvml(tmp_path))
    assert note.startswith("pynvml not installed (No module named 'pynvml'")
    assert "the NVIDIA driver is present: /proc/driver/nvidia/version" in note and "no NVIDIA driver" not in note


def test_no_nvml_and_no_nvidia_smi_reports_none_with_the_reason(monkeypatch):
    monkeypatch.setattr(gpu_module.shutil, "which", lambda name: None)
    replay = ReplayNvml(init_error="NVMLError_LibraryNotFound")
    reading = make_reader(replay).read()
    assert reading == GpuReading(
        gpus=(),
        processes=(),
        source="none",
        note="no NVIDIA driver: NVML Shared Library Not Found; nvidia-smi not found",
        driver_version=None,
        errors=(),
    )


def test_nvidia_smi_vanishing_later_reports_none():
    replay = ReplayNvml(init_error="NVMLError_LibraryNotFound")

    def gone(argv):
        raise FileNotFoundError("nvidia-smi")

    reading = make_reader(replay, smi_run=gone).read()
    assert reading.source == "none" and reading.note.endswith("nvidia-smi not found")


def test_nvidia_smi_failing_is_an_error_in_the_reading():
    replay = ReplayNvml(init_error="NVMLError_LibraryNotFound")

    def failing(argv):
        raise SmiError("Unable to determine the device handle for GPU0000:00:06.0: Unknown Error")

    reading = make_reader(replay, smi_run=failing).read()
    assert reading.source == "nvidia-smi" and reading.gpus == ()
    assert reading.errors == ("nvidia-smi: Unable to determine the device handle for GPU0000:00:06.0: Unknown Error",)


def test_an_older_nvidia_smi_refusing_a_field_is_asked_the_basic_fields():
    cells = dict(zip(QUERY_GPU_FIELD_LIST, _capture_cells()))
    asked = []

    def old_smi(argv):
        asked.append(argv)
        if argv == query_gpu_argv():
            raise SmiError('Field "memory.reserved" is not a valid field to query.')
        if argv == query_gpu_argv(",".join(BASIC_GPU_FIELD_LIST)):
            # The same real row, cut down to the basic fields (power.limit reads as enforced).
            renamed = dict(cells, **{"power.limit": cells["enforced.power.limit"]})
            return ", ".join(renamed[f] for f in BASIC_GPU_FIELD_LIST) + "\n"
        return PROCESS_CAPTURE_APPS.read_text()

    replay = ReplayNvml(init_error="NVMLError_LibraryNotFound")
    reader = make_reader(replay, smi_run=old_smi)
    reading = reader.read()
    (gpu,) = reading.gpus
    assert gpu.uuid == cells["uuid"] and gpu.memory_reserved is None
    assert gpu.power_limit_w == float(cells["enforced.power.limit"])
    reader.read()
    assert sum(1 for a in asked if a == query_gpu_argv()) == 1  # remembered


# --- real frames from the H200 -----------------------------------------------------------


def _without_new_defaults(wire, captured):
    """`wire` less the fields added to the model after `captured` was recorded, where they hold their default."""
    if isinstance(wire, dict) and isinstance(captured, dict):
        return {
            key: _without_new_defaults(value, captured.get(key))
            for key, value in wire.items()
            if key in captured or value not in (None, [], (), {})
        }
    if isinstance(wire, list) and isinstance(captured, list) and len(wire) == len(captured):
        return [_without_new_defaults(a, b) for a, b in zip(wire, captured)]
    return wire


def test_real_h200_frame_loads_into_the_model():
    data = json.loads((FIXTURES / "h200_frame.json").read_text())
    frame = from_wire(NodeFrame, data)
    assert _without_new_defaults(to_wire(frame), data) == data  # nothing lost or renamed on the way
    assert frame.gpu_source == "nvml" and frame.errors == ()
    (gpu,) = frame.gpus
    assert isinstance(gpu, GpuSample) and gpu.uuid.startswith("GPU-")
    assert gpu.memory_used + gpu.memory_free + gpu.memory_reserved == gpu.memory_total
    assert "SwPowerCap" in gpu.clock_event_reasons and gpu.power_draw_w <= gpu.power_limit_w * 1.05
    (proc,) = frame.processes
    assert proc.gpu_index == gpu.index and proc.gpu_uuid == gpu.uuid
    assert proc.gpu_sm_percent is not None and proc.gpu_memory_bytes <= gpu.memory_used
    assert proc.user is not None and proc.name  # joined with host info by procs.py


@pytest.mark.parametrize("name", ["h200_nvml_frame.json", "h200_probe/h200_nvml_frame_idle.json"])
def test_real_h200_gpu_readings_load_into_gpu_samples(name):
    data = json.loads((FIXTURES / name).read_text())
    gpus = tuple(from_wire(GpuSample, g) for g in data["gpus"])
    procs = tuple(from_wire(ProcessSample, p) for p in data["processes"])
    reading = GpuReading(gpus, procs, data["source"], data["note"], data["driver_version"], tuple(data["errors"]))
    assert _without_new_defaults(to_wire(reading), data) == data
    assert reading.source == "nvml" and all(not g.errors for g in reading.gpus)
    assert all(g.fan_percent is None and g.clock_mem_max_mhz for g in reading.gpus)


# --- decode tables ----------------------------------------------------------------------


@pytest.mark.parametrize("bit, name", CLOCK_EVENT_REASONS)
def test_each_clock_event_reason_bit_decodes_to_its_pynvml_name(bit, name):
    pynvml = pytest.importorskip("pynvml")
    assert decode_clock_event_reasons(bit) == (name,)
    # BoardLimit and Reliability exist only in newer pynvml (13.615 has them, 13.610 not).
    constant = getattr(pynvml, "nvmlClocksEventReason" + name, None)
    if constant is None:
        constant = getattr(pynvml, "nvmlClocksThrottleReason" + name, None)
    if constant is None:
        pytest.skip("this pynvml has no constant for %s" % name)
    assert constant == bit


def test_clock_event_masks_decode_all_bits_in_order_and_keep_unknown_ones():
    assert decode_clock_event_reasons(0) == ()
    assert decode_clock_event_reasons(0x4 | 0x1 | 0x40) == ("GpuIdle", "SwPowerCap", "HwThermalSlowdown")
    assert decode_clock_event_reasons(0x4 | 0x10000) == ("SwPowerCap", "0x10000")


def test_codes_match_the_real_pynvml():
    pynvml = pytest.importorskip("pynvml")
    from opsconsole.probe import nvml_decode as nv

    for name in ("NVML_CLOCK_SM", "NVML_CLOCK_MEM", "NVML_TEMPERATURE_GPU", "NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC"):
        assert getattr(nv, name) == getattr(pynvml, name)
    assert nv.NVML_MEMORY_INFO_V2 == pynvml.nvmlMemory_v2
    assert nv.NVML_EVENT_TYPE_XID_CRITICAL_ERROR == pynvml.nvmlEventTypeXidCriticalError
    assert nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES == pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    for code in nv.LOST_CODES | nv.UNSUPPORTED_CODES | nv.NO_DRIVER_CODES:
        assert pynvml.nvmlExceptionClass(code)
    assert compute_mode_name(pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS) == "Exclusive_Process"
    assert pstate_number(pynvml.NVML_PSTATE_UNKNOWN) is None and pstate_number(pynvml.NVML_PSTATE_0) == 0


def test_the_fake_mirrors_pynvml_names_and_error_classes():
    pynvml = pytest.importorskip("pynvml")
    fake = ReplayNvml().module
    functions = [n for n in dir(fake) if n.startswith("nvml")]
    assert functions and [n for n in functions if not hasattr(pynvml, n)] == []
    for name in ("NVMLError_NotSupported", "NVMLError_GpuIsLost", "NVMLError_Timeout", "NVMLError_LibraryNotFound"):
        real, ours = getattr(pynvml, name), getattr(fake, name)
        assert ours().value == real.__new__(real).value
        assert isinstance(fake.NVMLError(ours().value), ours)  # NVMLError(code) maps to the subclass


# --- shipping constraints --------------------------------------------------------------


@pytest.mark.parametrize("module", ["gpu.py", "smi.py", "nvml_decode.py", "nvidia_driver.py"])
def test_probe_modules_parse_as_python_38_and_import_only_stdlib(module):
    source = (ROOT / "opsconsole" / "probe" / module).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    stdlib = set(getattr(sys, "stdlib_module_names", ())) or {
        "shutil",
        "subprocess",
        "time",
        "dataclasses",
        "typing",
        "os",
        "re",
    }
    for node in tree.body:  # module level only: pynvml is imported inside functions
        if isinstance(node, ast.Import):
            roots = [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            roots = [(node.module or "").split(".")[0]]
        else:
            continue
        for root in roots:
            assert root in stdlib or root in ("__future__", "opsconsole"), root
