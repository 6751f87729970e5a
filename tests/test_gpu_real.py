"""GpuReader against a real NVIDIA GPU and real nvidia-smi (marker `gpu`; skipped elsewhere).

Run on a GPU machine: `python -m pytest -m gpu tests/test_gpu_real.py`. Each reading is
checked against a direct pynvml call, so nothing here depends on which GPU it is.
"""

from __future__ import annotations

import json
import shutil
import types

import pytest

from opsconsole.model import GpuSample, NodeFrame, from_wire, to_wire
from opsconsole.probe.gpu import GpuReader, run_nvidia_smi
from opsconsole.probe.smi import parse_query_apps_csv, parse_query_gpu_csv_with_driver, query_apps_argv, query_gpu_argv

pytestmark = pytest.mark.gpu


def _real_nvml():
    try:
        import pynvml
    except ImportError:
        pytest.skip("pynvml not installed")
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        pytest.skip("no NVML here: %s" % exc)
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            pytest.skip("NVML sees no GPU")
    finally:
        pynvml.nvmlShutdown()
    return pynvml


@pytest.fixture(scope="module")
def nvml():
    return _real_nvml()


@pytest.fixture
def reader(nvml):
    reader = GpuReader(slow_every=3, nvml=nvml)
    yield reader
    reader.close()


def test_real_reading_matches_direct_nvml_calls(nvml, reader):
    reading = reader.read()
    nvml.nvmlInit()
    try:
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [nvml.nvmlDeviceGetUUID(h) for h in handles]
        totals = [nvml.nvmlDeviceGetMemoryInfo(h).total for h in handles]
        driver = nvml.nvmlSystemGetDriverVersion()
    finally:
        nvml.nvmlShutdown()
    assert reading.source == "nvml"
    assert reading.driver_version == driver
    assert [g.index for g in reading.gpus] == list(range(count))
    assert [g.uuid for g in reading.gpus] == uuids
    assert [g.memory_total for g in reading.gpus] == totals
    for gpu in reading.gpus:
        assert not gpu.lost, gpu.errors
        assert gpu.errors == (), gpu.errors
        assert gpu.name and gpu.pci_bus_id
        assert gpu.temperature is not None and gpu.power_draw_w is not None and gpu.power_limit_w
        assert gpu.clock_sm_mhz is not None and gpu.clock_sm_max_mhz
        assert isinstance(gpu.clock_event_reasons, tuple)
        assert gpu.memory_used + gpu.memory_free + (gpu.memory_reserved or 0) == gpu.memory_total
        assert gpu.pcie_gen and gpu.pcie_width
        assert gpu.compute_mode in ("Default", "Exclusive_Process", "Prohibited")


def test_real_xid_event_set_registers(reader):
    reading = reader.read()
    assert not [e for e in reading.errors if e.startswith("xid events")], reading.errors


def test_real_tiering_reuses_slow_values_between_slow_ticks(reader):
    readings = [reader.read() for _ in range(4)]  # slow on ticks 1 and 4 (slow_every=3)
    for gpu_a, gpu_b, gpu_c in zip(readings[0].gpus, readings[1].gpus, readings[2].gpus):
        # The first reading's PCIe rates are left to the second read (no 2 x 20 ms sampling on the
        # first frame's path); the third keeps them until the next slow tick.
        assert gpu_a.pcie_tx_kbs is None and gpu_b.pcie_tx_kbs is not None
        assert gpu_b.pcie_tx_kbs == gpu_c.pcie_tx_kbs
        assert gpu_a.temperature_slowdown == gpu_b.temperature_slowdown
        assert gpu_b.energy_j >= gpu_a.energy_j  # a fast field: read again, and it only grows


def test_real_readings_survive_the_wire(reader):
    reading = reader.read()
    for gpu in reading.gpus:
        wire = json.loads(json.dumps(to_wire(gpu)))
        assert from_wire(GpuSample, wire) == gpu


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="nvidia-smi not on PATH")
def test_real_nvidia_smi_agrees_with_nvml(reader):
    reading = reader.read()
    smi_gpus = parse_query_gpu_csv_with_driver(run_nvidia_smi(query_gpu_argv()))[0]
    assert [g.uuid for g in smi_gpus] == [g.uuid for g in reading.gpus]
    for smi, ours in zip(smi_gpus, reading.gpus):
        assert smi.errors == (), smi.errors
        assert smi.pci_bus_id == ours.pci_bus_id
        assert abs(smi.memory_total - ours.memory_total) < 1024 * 1024  # nvidia-smi rounds to MiB
        assert smi.ecc_enabled == ours.ecc_enabled and smi.persistence_mode == ours.persistence_mode
    procs = parse_query_apps_csv(run_nvidia_smi(query_apps_argv()), smi_gpus)
    assert all(p.gpu_index is not None for p in procs)


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="nvidia-smi not on PATH")
def test_real_fallback_to_nvidia_smi_when_nvml_cannot_load(nvml):
    class LibraryNotFound(Exception):
        value = 12  # NVML_ERROR_LIBRARY_NOT_FOUND

        def __str__(self):
            return "NVML Shared Library Not Found"

    def fail_init():
        raise LibraryNotFound()

    reader = GpuReader(nvml=types.SimpleNamespace(nvmlInit=fail_init))
    reading = reader.read()
    reader.close()
    assert reading.source == "nvidia-smi"
    assert "NVML Shared Library Not Found" in reading.note
    assert reading.gpus and all(g.uuid and g.uuid.startswith("GPU-") for g in reading.gpus)
    assert reading.driver_version


def test_real_agent_frame(nvml):
    agent = pytest.importorskip("opsconsole.probe.agent")
    probe = agent.Probe(node_name="gpu-test", gpu_reader=GpuReader(nvml=nvml), top=5)
    try:
        frame = probe.poll()
    finally:
        probe.close()
    assert frame.gpu_source == "nvml" and frame.gpus
    assert from_wire(NodeFrame, json.loads(agent.frame_line(frame))) == frame
