"""The probe as a Prometheus exporter: dcgm-exporter names and labels over a real H200 frame,
XIDs remembered across frames, and `opsconsole agent --metrics-port` as a real process on loopback."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Dict, Tuple

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from opsconsole.exporter.collector import FrameCollector, clock_reason_mask
from opsconsole.model import NodeFrame, from_wire
from opsconsole.sources import metric_names as names

ROOT = Path(__file__).resolve().parents[1]
H200_FRAME = ROOT / "tests" / "fixtures" / "h200_frame.json"  # the probe on a real H200 under a bf16 matmul


def h200_frame() -> NodeFrame:
    return from_wire(NodeFrame, json.loads(H200_FRAME.read_text()))


def scrape(collector: FrameCollector) -> Dict[str, list]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    samples: Dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def only(samples: Dict[str, list], name: str) -> Tuple[dict, float]:
    assert len(samples[name]) == 1, samples.get(name)
    return samples[name][0]


def test_gpu_series_use_dcgm_exporter_names_labels_and_units():
    frame = h200_frame()
    gpu = frame.gpus[0]
    collector = FrameCollector()
    collector.update(frame)
    samples = scrape(collector)
    labels, value = only(samples, "DCGM_FI_DEV_GPU_UTIL")
    assert labels == {
        "gpu": "0",
        "UUID": gpu.uuid,
        "device": "nvidia0",
        "modelName": "NVIDIA H200",
        "Hostname": frame.node,
        "pci_bus_id": gpu.pci_bus_id,
        "DCGM_FI_DRIVER_VERSION": frame.driver_version,
    }
    assert value == gpu.utilization_gpu
    assert only(samples, "DCGM_FI_DEV_FB_USED")[1] * names.MIB == gpu.memory_used  # MiB, as dcgm-exporter
    assert only(samples, "DCGM_FI_DEV_FB_FREE")[1] * names.MIB == gpu.memory_free
    assert only(samples, "DCGM_FI_DEV_GPU_TEMP")[1] == gpu.temperature
    assert only(samples, "DCGM_FI_DEV_POWER_USAGE")[1] == gpu.power_draw_w
    assert only(samples, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")[1] == pytest.approx(gpu.energy_j * 1000)  # mJ
    assert only(samples, "DCGM_FI_DEV_SM_CLOCK")[1] == gpu.clock_sm_mhz
    assert only(samples, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")[1] == gpu.ecc_volatile_uncorrected
    assert only(samples, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")[1] == gpu.remapped_rows_uncorrected
    # Throttle reasons: NVML's bitmask under both dcgm names, and one of ours per active reason.
    assert gpu.clock_event_reasons == ("SwPowerCap",)
    assert only(samples, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")[1] == 0x4
    assert only(samples, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")[1] == 0x4
    reason_labels, reason_value = only(samples, names.METRIC_CLOCK_REASON_ACTIVE)
    assert reason_labels["reason"] == "SwPowerCap" and reason_value == 1
    # Our health fields: remapped rows pending, process count and the process itself.
    assert only(samples, "opsconsole_gpu_remapped_rows_pending")[1] == 0
    assert only(samples, names.METRIC_GPU_PROCESSES)[1] == len(frame.processes) == 1
    proc = frame.processes[0]
    proc_labels, proc_memory = only(samples, names.METRIC_PROCESS_MEMORY)
    assert (proc_labels["pid"], proc_labels["process_name"], proc_labels["user"]) == (
        str(proc.pid),
        proc.name,
        proc.user,
    )
    assert proc_memory == proc.gpu_memory_bytes
    # Fields the GPU does not report are left out, not exported as 0.
    assert gpu.fan_percent is None and "DCGM_FI_DEV_FAN_SPEED" not in samples
    assert gpu.retired_pages_pending is None and "DCGM_FI_DEV_RETIRED_PENDING" not in samples


def test_host_fields_are_under_the_opsconsole_prefix():
    frame = h200_frame()
    collector = FrameCollector()
    collector.update(frame)
    samples = scrape(collector)
    host = frame.host
    assert only(samples, names.HOST_MEM_TOTAL)[1] == host.mem_total
    assert only(samples, names.HOST_CPU_COUNT)[1] == host.cpu_count
    assert only(samples, names.HOST_CPU_PERCENT)[1] == host.cpu_percent
    loads = {labels["period"]: value for labels, value in samples[names.HOST_LOAD]}
    assert loads == dict(zip(("1", "5", "15"), host.load_avg))
    disk = host.disks[0]
    fs = {name: only(samples, name) for name in (names.HOST_FS_SIZE, names.HOST_FS_USED, names.HOST_FS_FREE)}
    assert [v for _, v in fs.values()] == [disk.total, disk.used, disk.free]
    assert all(labels == {"Hostname": frame.node, "mountpoint": "/"} for labels, _ in fs.values())
    assert {labels["device"] for labels, _ in samples[names.HOST_NET_RX]} == {n.interface for n in host.net}
    assert only(samples, names.FRAME_SEQ)[1] == frame.seq
    assert only(samples, names.FRAME_TIME)[1] == frame.time
    info_labels, _ = only(samples, names.NODE_INFO)
    assert info_labels["gpu_source"] == "nvml" and info_labels["driver_version"] == frame.driver_version


def test_xid_gauge_keeps_the_last_code_and_the_counter_counts_every_event():
    frame = h200_frame()
    gpu = frame.gpus[0]
    collector = FrameCollector()
    collector.update(frame)
    assert only(scrape(collector), "DCGM_FI_DEV_XID_ERRORS")[1] == 0
    collector.update(replace(frame, gpus=(replace(gpu, xid_events=(79,)),)))
    collector.update(replace(frame, gpus=(replace(gpu, xid_events=()),)))  # the next frame: no new XID
    samples = scrape(collector)
    assert only(samples, "DCGM_FI_DEV_XID_ERRORS")[1] == 79  # as dcgm-exporter: the last one, kept
    assert only(samples, "opsconsole_gpu_xid_events_total")[1] == 1
    collector.update(replace(frame, gpus=(replace(gpu, xid_events=(13, 48)),)))
    samples = scrape(collector)
    assert only(samples, "DCGM_FI_DEV_XID_ERRORS")[1] == 48
    assert only(samples, "opsconsole_gpu_xid_events_total")[1] == 3


def test_nothing_is_served_before_the_first_frame_and_masks_round_trip():
    assert scrape(FrameCollector()) == {}
    assert clock_reason_mask(("SwPowerCap", "HwSlowdown", "0x800")) == 0x4 | 0x8 | 0x800
    assert clock_reason_mask(()) == 0


# --- the agent command, as a real process -------------------------------------------------------


def agent(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "opsconsole", "agent", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        **kwargs,
    )


def run_agent(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opsconsole", "agent", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def test_agent_serves_metrics_on_loopback_only_and_stops_on_sigterm():
    proc = agent("--metrics-port", "0", "--interval", "0.2", "--node-name", "t1")
    try:
        line = proc.stdout.readline()
        assert line.startswith("opsconsole exporter: serving t1 on http://127.0.0.1:"), line
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as answer:
            text = answer.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        cpus = families[names.HOST_CPU_COUNT].samples[0]
        assert cpus.labels == {"Hostname": "t1"} and cpus.value >= 1
        # Bound to 127.0.0.1, not to every address: another loopback address is refused.
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", port), timeout=2).close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def get(url: str) -> Tuple[int, str, str]:
    """(status, content type, body) of a real GET, an HTTP error's too."""
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.headers.get("Content-Type", ""), answer.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers.get("Content-Type", ""), error.read().decode()


def test_agent_answers_metrics_on_metrics_a_pointer_on_root_and_404_elsewhere():
    """prometheus_client's server answered every path with the metrics; node_exporter answers /metrics only."""
    proc = agent("--metrics-port", "0", "--interval", "0.2", "--node-name", "t1")
    try:
        line = proc.stdout.readline()
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        base = "http://127.0.0.1:%d" % port
        status, kind, text = get(base + "/metrics")
        assert status == 200 and kind.startswith("text/plain"), (status, kind)
        assert names.HOST_CPU_COUNT in {f.name for f in text_string_to_metric_families(text)}
        status, kind, text = get(base + "/")
        assert status == 200 and kind.startswith("text/html") and 'href="/metrics"' in text, (status, kind, text)
        assert names.HOST_CPU_COUNT not in text
        for path in ("/metric", "/metrics/", "/metrics/x", "/favicon.ico", "/anything?name[]=x"):
            status, kind, text = get(base + path)
            assert (status, text) == (404, "404 page not found\n"), path
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_agent_bad_bind_address_and_busy_port_are_one_line_errors():
    result = run_agent("--metrics-port", "0", "--bind", "not-an-address")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["opsconsole: --bind 'not-an-address' is not an IP address (e.g. 127.0.0.1)"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_agent("--metrics-port", str(port))
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["opsconsole: cannot listen on 127.0.0.1:%d: Address already in use" % port]
    result = run_agent("--bind", "127.0.0.1")
    assert result.returncode == 2 and result.stderr.splitlines() == ["opsconsole: --bind needs --metrics-port"]
    result = run_agent("--metrics-port", "70000")
    assert result.returncode == 2 and "expected a port between 0 and 65535" in result.stderr


def test_a_gpu_process_job_travels_as_labels_and_the_source_reads_it_back():
    """Our exporter labels each GPU process with its Slurm job and container; the Prometheus source's
    decoder turns the scraped series back into the same ProcessSample fields."""
    from dataclasses import replace

    from opsconsole.sources import prom_decode

    frame = h200_frame()
    proc = replace(frame.processes[0], job_id="812", job_step="0", job_user="alice", container="docker/2403ccfe427f")
    collector = FrameCollector()
    collector.update(replace(frame, processes=(proc,)))
    samples = scrape(collector)
    labels, _ = only(samples, names.METRIC_PROCESS_MEMORY)
    assert (
        labels["slurm_job_id"],
        labels["slurm_job_step"],
        labels["slurm_job_user"],
        labels["process_container"],
    ) == ("812", "0", "alice", "docker/2403ccfe427f")
    rows = [
        (dict(labels, __name__=name), value)
        for name in (names.METRIC_PROCESS_MEMORY,)
        for labels, value in samples[name]
    ]
    values = prom_decode.FastValues()
    prom_decode.take_fast(rows, values, lambda l: l.get("Hostname"), "gpu")
    (read,) = prom_decode.process_samples(values.procs[frame.node], [])
    assert (read.pid, read.job_id, read.job_step, read.job_user, read.container) == (
        proc.pid,
        "812",
        "0",
        "alice",
        "docker/2403ccfe427f",
    )
