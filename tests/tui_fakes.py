"""A fake fleet for the console tests, publishing frames built from the real H200 and /proc captures."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from h200_fleet import H200, MIB, idle_gpu, load_procs, load_query, nvml_capture

from opsconsole.model import (
    STATE_DOWN,
    STATE_UP,
    DiskUsage,
    GpuSample,
    HostSample,
    NodeFrame,
    NodeState,
    ProcessSample,
)
from opsconsole.nodes.totals import FleetTotals, totals_of
from opsconsole.probe.host import host_sample_from_snapshots, snapshot_from_proc_texts
from opsconsole.probe.nvml_decode import parse_clock_event_mask
from opsconsole.probe.procs import parse_cmdline, parse_pid_stat, parse_pid_status

PROC = Path(__file__).parent / "fixtures" / "proc"

# 2026-12-02 12:34:03 UTC, the minute the under-load capture was taken; tests freeze the clock here.
FROZEN_NOW = 1796214843.0
CLOCK_TICKS = 100  # USER_HZ of the captured machine

# The under-load CSV has no header; these are its columns, in order (see the capture's README).
UNDER_LOAD_COLUMNS = (
    "index",
    "uuid",
    "name",
    "pci",
    "util",
    "util_mem",
    "mem_total_mib",
    "mem_used_mib",
    "temp",
    "power",
    "power_limit",
    "clock_sm",
    "clock_mem",
    "pstate",
    "ecc_vol_uncorr",
    "fan",
    "persistence",
    "mig",
)


def _under_load_row() -> Dict[str, str]:
    text = (H200 / "under-load" / "nvidia-smi-query.csv").read_text().split("--stderr--")[0]
    cells = [cell.strip() for cell in next(csv.reader(text.strip().splitlines()))]
    row = dict(zip(UNDER_LOAD_COLUMNS, cells))
    row["mask"] = load_query()["clocks_event_reasons.active"]  # the full query has no mask column
    return row


def loaded_gpu(index: int = 0) -> GpuSample:
    """The same H200 under a bf16 matmul loop (under-load/): 100 % busy, 21491 MiB used, 59 C."""
    row = _under_load_row()
    idle = idle_gpu(index)
    total = int(row["mem_total_mib"]) * MIB
    used = int(row["mem_used_mib"]) * MIB
    return replace(
        idle,
        uuid=row["uuid"],
        utilization_gpu=float(row["util"]),
        utilization_memory=float(row["util_mem"]),
        memory_total=total,
        memory_used=used,
        memory_free=total - used,
        temperature=float(row["temp"]),
        power_draw_w=float(row["power"]),
        power_limit_w=float(row["power_limit"]),
        clock_sm_mhz=int(row["clock_sm"]),
        clock_mem_mhz=int(row["clock_mem"]),
        clock_event_reasons=parse_clock_event_mask(row["mask"]),
        pstate=int(row["pstate"].lstrip("P")),
        ecc_volatile_uncorrected=int(row["ecc_vol_uncorr"]),
    )


def load_process(gpu: GpuSample) -> ProcessSample:
    """The compute process NVML saw during the load (load-procs.json): pid 421."""
    data = load_procs()
    proc, util = data["procs"][0], data["proc_util"][0]
    return ProcessSample(
        pid=proc["pid"],
        name="python3",
        user="root",
        command="python3",
        gpu_index=gpu.index,
        gpu_uuid=gpu.uuid,
        gpu_memory_bytes=proc["usedGpuMemory"],
        gpu_sm_percent=float(util["sm"]),
        state="R",
    )


def _proc_texts(root: Path) -> dict:
    names = {"stat": "stat", "meminfo": "meminfo", "loadavg": "loadavg", "uptime": "uptime", "net_dev": "net/dev"}
    return {key: (root / name).read_text() for key, name in names.items()}


def captured_host(hostname: str) -> HostSample:
    """Host readings from the two /proc captures one second apart, through the probe's own parser."""
    prev = snapshot_from_proc_texts(**_proc_texts(PROC / "t0"))
    cur = snapshot_from_proc_texts(**_proc_texts(PROC / "t1"))
    # No disk was captured: one round-number disk, so the row has something to show.
    disk = DiskUsage(path="/", total=100 * 2**30, used=70 * 2**30, free=30 * 2**30)
    return host_sample_from_snapshots(prev, cur, hostname, disks=(disk,))


def captured_top_processes() -> List[ProcessSample]:
    """The two processes of the /proc captures, CPU % from their ticks between t0 and t1."""
    elapsed = float((PROC / "t1" / "uptime").read_text().split()[0]) - float(
        (PROC / "t0" / "uptime").read_text().split()[0]
    )
    boot_uptime = float((PROC / "t1" / "uptime").read_text().split()[0])
    out = []
    for pid_dir in sorted((PROC / "t1").iterdir()):
        if not pid_dir.name.isdigit():
            continue
        before = parse_pid_stat((PROC / "t0" / pid_dir.name / "stat").read_text())
        after = parse_pid_stat((pid_dir / "stat").read_text())
        status = parse_pid_status((pid_dir / "status").read_text())
        ticks = after["utime"] + after["stime"] - before["utime"] - before["stime"]
        out.append(
            ProcessSample(
                pid=after["pid"],
                name=status.get("name", after["comm"]),
                user="root" if status.get("uid") == 0 else str(status.get("uid")),
                command=parse_cmdline((pid_dir / "cmdline").read_bytes()),
                cpu_percent=100.0 * ticks / CLOCK_TICKS / elapsed,
                rss_bytes=status.get("rss_bytes"),
                elapsed_s=boot_uptime - after["starttime"] / CLOCK_TICKS,
                state=status.get("state", after["state"]),
                threads=status.get("threads", after["threads"]),
            )
        )
    return out


def node_frame(name: str, gpus: Sequence[GpuSample], hostname: Optional[str] = None, seq: int = 1) -> NodeFrame:
    """A frame with these GPUs, the load process on every busy one, and the captured host."""
    processes = tuple(load_process(g) for g in gpus if g.utilization_gpu)
    return NodeFrame(
        node=name,
        time=FROZEN_NOW - 0.4,
        seq=seq,
        host=captured_host(hostname or name),
        gpus=tuple(gpus),
        processes=processes,
        top_processes=tuple(captured_top_processes()),
        gpu_source="nvml",
        driver_version=nvml_capture()["driver"],
    )


def up_state(name: str, gpus: Sequence[GpuSample], hostname: Optional[str] = None, age: float = 0.4) -> NodeState:
    return NodeState(
        name=name,
        state=STATE_UP,
        address="127.0.0.1",
        frame=node_frame(name, gpus, hostname),
        received_at=FROZEN_NOW - age,
        rtt_ms=1.8,
        since=FROZEN_NOW - 600,
    )


def down_state(name: str, gpus: Sequence[GpuSample], age: float = 42.0) -> NodeState:
    """A node that went away: its last frame kept (shown dimmed), with the reason."""
    return NodeState(
        name=name,
        state=STATE_DOWN,
        reason="connection refused (127.0.0.1:2222)",
        address="127.0.0.1:2222",
        frame=node_frame(name, gpus),
        received_at=FROZEN_NOW - age,
        since=FROZEN_NOW - age + 3.0,
    )


def single_node_states() -> List[NodeState]:
    """One node with the idle GPU as #0 and the loaded one as #1."""
    return [up_state("local", [idle_gpu(0), loaded_gpu(1)], hostname="h200-box")]


def cluster_states() -> List[NodeState]:
    """Three nodes: an 8-GPU node half busy, a 1-GPU node, and a node down with its last frame."""
    eight = [loaded_gpu(i) if i < 4 else idle_gpu(i) for i in range(8)]
    return [
        up_state("gpu-a01", eight),
        up_state("gpu-a02", [idle_gpu(0)], age=1.2),
        down_state("gpu-a03", [loaded_gpu(0), loaded_gpu(1)]),
    ]


class FakeFleet:
    """The Fleet interface the console uses, fed by the test instead of by links."""

    def __init__(self, states: Sequence[NodeState], stale_after: float = 8.0) -> None:
        self._states: Dict[str, NodeState] = {s.name: s for s in states}
        self._on_change: Optional[Callable[[NodeState], None]] = None
        self.stale_after = stale_after
        self.started = False
        self.stopped = False

    def states(self) -> Dict[str, NodeState]:
        return dict(self._states)

    async def start(self, on_change: Callable[[NodeState], None]) -> None:
        self._on_change = on_change
        self.started = True
        for state in self._states.values():
            on_change(state)

    async def stop(self) -> None:
        self.stopped = True

    def publish(self, state: NodeState) -> None:
        """Deliver a new state as the real fleet would: stored, then on_change in the loop."""
        self._states[state.name] = state
        if self._on_change is not None:
            self._on_change(state)

    def totals(self, now: float) -> FleetTotals:
        return totals_of(self._states.values(), now, self.stale_after)

    @property
    def names(self) -> List[str]:
        return list(self._states)

    def link(self, name: str):
        raise KeyError(name)  # no links: the console reads local files only

    async def retry(self, name: str) -> bool:
        return False


class ThisMachineFleet(FakeFleet):
    """A fake fleet whose node `local` is this machine: its link is a LocalLink, so actions run here."""

    def link(self, name: str):
        from opsconsole.config import NodeConfig
        from opsconsole.nodes.local import LocalLink

        if name != "local":
            raise KeyError(name)
        return LocalLink(NodeConfig(name="local", local=True), 1.0)
