"""Node states for pane and fleet-view tests, built from the real H200 captures in fixtures/h200.

Values (temperatures, memory, power, utilisation, pid 421 and its GPU memory) come from the
captures; node names, users and the host processes' states are chosen for the tests.
The capture readers and `idle_gpu` here are also what tui_fakes builds its fake fleet on.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path
from typing import Dict, Optional

from opsconsole.model import (
    STATE_CONNECTING,
    STATE_DOWN,
    STATE_UP,
    GpuSample,
    NodeFrame,
    NodeState,
    ProcessSample,
)
from opsconsole.probe.nvml_decode import decode_clock_event_reasons

H200 = Path(__file__).parent / "fixtures" / "h200"
MIB = 1024 * 1024
NOW = 1_796_000_000.0  # a fixed "now", so ages are deterministic


def nvml_capture() -> dict:
    """nvml.json: what NVML reported for the idle H200, and the driver version."""
    return json.loads((H200 / "nvml.json").read_text())


def load_procs() -> dict:
    """load-procs.json: NVML's compute processes and utilisation under load."""
    return json.loads((H200 / "under-load" / "load-procs.json").read_text())


def load_query() -> Dict[str, str]:
    """The nvidia-smi --query-gpu line taken under load, by header name."""
    with open(H200 / "under-load" / "load-query.csv", newline="") as handle:
        rows = [[cell.strip() for cell in row] for row in csv.reader(handle)]
    return dict(zip(rows[0], rows[1]))


def idle_gpu(index: int = 0) -> GpuSample:
    """The idle H200 exactly as NVML reported it (nvml.json)."""
    d = nvml_capture()["devices"][0]
    return GpuSample(
        index=index,
        uuid=d["uuid"],
        name=d["name"],
        pci_bus_id=d["pci"],
        utilization_gpu=float(d["util"]["gpu"]),
        utilization_memory=float(d["util"]["memory"]),
        memory_total=d["mem"]["total"],
        memory_used=d["mem"]["used"],
        memory_free=d["mem"]["free"],
        memory_reserved=d["mem"]["reserved"],
        temperature=float(d["temp"]),
        temperature_slowdown=float(d["temp_thresh_slowdown"]),
        temperature_shutdown=float(d["temp_thresh_shutdown"]),
        power_draw_w=d["power_mw"] / 1000.0,
        power_limit_w=d["power_limit_mw"] / 1000.0,
        energy_j=d["energy_mj"] / 1000.0,
        clock_sm_mhz=d["clock_sm"],
        clock_mem_mhz=d["clock_mem"],
        clock_sm_max_mhz=d["clock_sm_max"],
        clock_event_reasons=decode_clock_event_reasons(d["throttle"]),
        pstate=d["pstate"],
        fan_percent=None,  # NVMLError_NotSupported on this board
        ecc_enabled=bool(d["ecc_mode"][0]),
        ecc_volatile_corrected=d["ecc_vol_corr"],
        ecc_volatile_uncorrected=d["ecc_vol_uncorr"],
        ecc_aggregate_uncorrected=d["ecc_agg_uncorr"],
        remapped_rows_corrected=d["remapped_rows"][0],
        remapped_rows_uncorrected=d["remapped_rows"][1],
        pcie_gen=d["pcie_gen"],
        pcie_width=d["pcie_width"],
        pcie_tx_kbs=d["pcie_tx_kbs"],
        persistence_mode=bool(d["persistence"]),
        compute_mode="Default",
        mig_mode=bool(d["mig"][0]),
    )


def loaded_gpu(index: int = 0) -> GpuSample:
    """The same H200 at 100 % under a bf16 matmul loop (load-procs.json, load-query.csv)."""
    query = load_query()
    used = int(query["memory.used [MiB]"].split()[0]) * MIB
    return replace(
        idle_gpu(index),
        utilization_gpu=float(load_procs()["util"][0]),
        memory_used=used,
        memory_free=idle_gpu().memory_total - used,
        temperature=float(query["temperature.gpu"]),
        power_draw_w=float(query["power.draw [W]"].split()[0]),
    )


def load_process(gpu_index: int = 0, user: str = "alice") -> ProcessSample:
    """pid 421, the torch process seen by NVML under load, with its memory and SM share."""
    procs = load_procs()
    proc = procs["procs"][0]
    sm = next(p["sm"] for p in procs["proc_util"] if p["pid"] == proc["pid"])
    return ProcessSample(
        pid=proc["pid"],
        name="python3",
        user=user,
        command="python3 train.py --bf16-matmul",
        cpu_percent=99.0,
        rss_bytes=2 * 1024 * MIB,
        elapsed_s=125.0,
        state="R",
        gpu_index=gpu_index,
        gpu_memory_bytes=proc["usedGpuMemory"],
        gpu_sm_percent=float(sm),
    )


def hung_worker(pid: Optional[int] = None) -> ProcessSample:
    """A data-loader worker stuck in uninterruptible IO (state D): a host process, no GPU."""
    worker_pid = pid if pid is not None else load_procs()["my_pids"][1]
    return ProcessSample(
        pid=worker_pid,
        name="pt_data_worker",
        user="alice",
        command="python3 train.py [dataloader worker 0]",
        cpu_percent=0.0,
        rss_bytes=900 * MIB,
        elapsed_s=4000.0,
        state="D",
    )


def busy_host_process(user: str = "bob") -> ProcessSample:
    return ProcessSample(
        pid=7001,
        name="tar",
        user=user,
        command="tar czf /scratch/ckpt.tgz /scratch/ckpt",
        cpu_percent=87.5,
        rss_bytes=12 * MIB,
        elapsed_s=30.0,
        state="R",
    )


def three_nodes(now: float = NOW) -> Dict[str, NodeState]:
    """gpu01 up (GPU 0 loaded by alice's pid 421, GPU 1 idle, a D-state worker), gpu02 up
    idle, gpu03 down since 2 minutes with its last frame kept. Config order."""
    load = load_process()
    gpu01 = NodeFrame(
        node="gpu01",
        time=now - 1,
        seq=10,
        gpus=(loaded_gpu(0), idle_gpu(1)),
        processes=(load,),
        top_processes=(replace(load, gpu_index=None, gpu_memory_bytes=None, gpu_sm_percent=None), hung_worker()),
        gpu_source="nvml",
        driver_version="580.159.04",
    )
    gpu02 = NodeFrame(
        node="gpu02",
        time=now - 1,
        seq=10,
        gpus=(idle_gpu(0),),
        top_processes=(busy_host_process(),),
        gpu_source="nvml",
    )
    gpu03 = NodeFrame(node="gpu03", time=now - 120, seq=4, gpus=(idle_gpu(0),), gpu_source="nvml")
    return {
        "gpu01": NodeState("gpu01", STATE_UP, frame=gpu01, received_at=now - 1, rtt_ms=0.8),
        "gpu02": NodeState("gpu02", STATE_UP, frame=gpu02, received_at=now - 2, rtt_ms=12.0),
        "gpu03": NodeState(
            "gpu03",
            STATE_DOWN,
            reason="connection refused",
            frame=gpu03,
            received_at=now - 120,
            since=now - 100,
        ),
    }


def connecting_node(name: str = "gpu04") -> NodeState:
    """A node that never delivered a frame."""
    return NodeState(name, STATE_CONNECTING)
