"""Simulated GPU nodes behind a real in-process asyncssh server on loopback, for scale runs.

The server speaks what a node does for the console: a command that starts the probe
(`python3 - ...`) gets its stdin bundle read and thrown away, then one 8-GPU H200
NodeFrame JSON line every interval; an `nvidia-smi --query-gpu=...` exec gets the
8-line CSV once and exits (what gpustat-web-style pollers run). It runs in its own
process so its CPU is not counted against the client being measured.

Numbers come from the real H200 capture in tests/fixtures/h200/.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsconsole.model import (  # noqa: E402
    DiskUsage,
    GpuSample,
    HostSample,
    NetRate,
    NodeFrame,
    ProcessSample,
    to_wire,
)

FIXTURE = ROOT / "tests" / "fixtures" / "h200"
GPUS_PER_NODE = 8
GPU_PROCESSES = 10
TOP_PROCESSES = 30
MIB = 1024 * 1024

# What gpustat-web-style pollers ask nvidia-smi for, in the order of the captured CSV.
NVIDIA_SMI_QUERY = (
    "index,uuid,name,pci.bus_id,utilization.gpu,utilization.memory,memory.total,memory.used,"
    "temperature.gpu,power.draw,power.limit,clocks.sm,clocks.mem,pstate,"
    "ecc.errors.uncorrected.volatile.total,fan.speed,ecc.mode.current,mig.mode.current"
)
INSTALLED_PROBE_ONCE = "opsconsole-probe --once"
NVIDIA_SMI_COMMAND = "nvidia-smi --query-gpu=%s --format=csv,noheader,nounits" % NVIDIA_SMI_QUERY


# --- the data a simulated node reports -------------------------------------


def _uuid(base: str, index: int) -> str:
    return base[:-2] + "%02x" % index


def h200_gpus() -> List[GpuSample]:
    """Eight GPUs with the numbers NVML gave for the real H200 (idle), varied per index."""
    nvml = json.loads((FIXTURE / "nvml.json").read_text())
    dev = nvml["devices"][0]
    mem = dev["mem"]
    load_mem_used = 22525509632  # under-load/load-procs.json: the torch process's usedGpuMemory
    gpus = []
    for i in range(GPUS_PER_NODE):
        busy = i % 2 == 1  # half of them as they were under the bf16 load, half idle
        gpus.append(
            GpuSample(
                index=i,
                uuid=_uuid(dev["uuid"], i),
                name=dev["name"],
                pci_bus_id=dev["pci"].replace(":06.0", ":%02x.0" % (6 + i)),
                utilization_gpu=100.0 if busy else float(dev["util"]["gpu"]),
                utilization_memory=23.0 if busy else float(dev["util"]["memory"]),
                memory_total=mem["total"],
                memory_used=load_mem_used if busy else mem["used"],
                memory_free=mem["total"] - (load_mem_used if busy else mem["used"]),
                memory_reserved=mem["reserved"],
                temperature=59.0 if busy else float(dev["temp"]),
                temperature_slowdown=float(dev["temp_thresh_slowdown"]),
                temperature_shutdown=float(dev["temp_thresh_shutdown"]),
                power_draw_w=692.06 if busy else dev["power_mw"] / 1000.0,
                power_limit_w=dev["power_limit_mw"] / 1000.0,
                energy_j=dev["energy_mj"] / 1000.0,
                clock_sm_mhz=1500 if busy else dev["clock_sm"],
                clock_mem_mhz=dev["clock_mem"],
                clock_sm_max_mhz=dev["clock_sm_max"],
                clock_event_reasons=("sw_power_cap",) if busy else ("gpu_idle",),
                pstate=dev["pstate"],
                ecc_enabled=bool(dev["ecc_mode"][0]),
                ecc_volatile_corrected=dev["ecc_vol_corr"],
                ecc_volatile_uncorrected=dev["ecc_vol_uncorr"],
                ecc_aggregate_uncorrected=dev["ecc_agg_uncorr"],
                remapped_rows_corrected=dev["remapped_rows"][0],
                remapped_rows_uncorrected=dev["remapped_rows"][1],
                remapped_rows_pending=bool(dev["remapped_rows"][2]),
                remapped_rows_failure=bool(dev["remapped_rows"][3]),
                pcie_gen=dev["pcie_gen"],
                pcie_gen_max=dev["pcie_gen"],
                pcie_width=dev["pcie_width"],
                pcie_width_max=dev["pcie_width"],
                pcie_tx_kbs=dev["pcie_tx_kbs"],
                pcie_rx_kbs=dev["pcie_tx_kbs"],
                persistence_mode=bool(dev["persistence"]),
                compute_mode="Default",
                mig_mode=bool(dev["mig"][0]),
            )
        )
    return gpus


def h200_frame(node: str, seq: int = 1, now: Optional[float] = None) -> NodeFrame:
    """A realistic frame of one 8-GPU node: 10 GPU processes, 30 top host processes."""
    now = time.time() if now is None else now
    gpus = h200_gpus()
    procs = tuple(
        ProcessSample(
            pid=421 + i,
            name="python3",
            user="alice",
            command="python3 train.py --config llama-70b.yaml --rank %d" % i,
            cpu_percent=98.5,
            rss_bytes=38 * 1024 * MIB,
            elapsed_s=3723.0 + i,
            state="R",
            threads=64,
            gpu_index=i % GPUS_PER_NODE,
            gpu_uuid=gpus[i % GPUS_PER_NODE].uuid,
            gpu_memory_bytes=22525509632,
            gpu_sm_percent=96.0,
        )
        for i in range(GPU_PROCESSES)
    )
    top = tuple(
        ProcessSample(
            pid=421 + i,
            name="python3" if i < GPU_PROCESSES else "pt_data_worker",
            user="alice",
            command="python3 train.py --config llama-70b.yaml",
            cpu_percent=100.0 - i * 3.0,
            rss_bytes=(38 if i < GPU_PROCESSES else 2) * 1024 * MIB,
            elapsed_s=3723.0,
            state="R" if i < 20 else "S",
            threads=64 if i < GPU_PROCESSES else 4,
        )
        for i in range(TOP_PROCESSES)
    )
    host = HostSample(
        hostname=node,
        cpu_count=192,
        cpu_percent=41.7,
        cpu_per_core=tuple(float((i * 37) % 100) for i in range(192)),
        load_avg=(80.1, 78.9, 75.2),
        iowait_percent=0.4,
        mem_total=2015 * 1024 * MIB,
        mem_used=612 * 1024 * MIB,
        mem_available=1380 * 1024 * MIB,
        swap_total=0,
        swap_used=0,
        disks=(DiskUsage("/", 1_000_000_000_000, 410_000_000_000, 590_000_000_000),),
        net=(NetRate("ib0", 2.1e9, 2.0e9), NetRate("eth0", 1.2e6, 0.8e6)),
        uptime_s=1_234_567.0,
        source="psutil",
    )
    return NodeFrame(
        node=node,
        time=now,
        seq=seq,
        host=host,
        gpus=tuple(gpus),
        processes=procs,
        top_processes=top,
        gpu_source="nvml",
        driver_version=json.loads((FIXTURE / "nvml.json").read_text())["driver"],
        probe_ms=31.0,
    )


def nvidia_smi_csv() -> bytes:
    """The 8-line `--format=csv,noheader,nounits` answer, from the captured line."""
    line = (FIXTURE / "nvidia-smi-query.csv").read_text().splitlines()[0]
    fields = [f.strip() for f in line.split(",")]
    rows = []
    for i in range(GPUS_PER_NODE):
        row = list(fields)
        row[0] = str(i)
        row[1] = _uuid(fields[1], i)
        row[3] = fields[3].replace(":06.0", ":%02x.0" % (6 + i))
        rows.append(", ".join(row))
    return ("\n".join(rows) + "\n").encode()


class FrameLines:
    """One node's frame as a JSON line, re-stamped per tick without re-encoding it all."""

    def __init__(self, node: str) -> None:
        wire = to_wire(h200_frame(node, seq=0, now=0.0))
        wire["time"] = "@TIME@"
        wire["seq"] = "@SEQ@"
        text = json.dumps(wire, separators=(",", ":"))
        before_time, rest = text.split('"@TIME@"')
        between, after_seq = rest.split('"@SEQ@"')
        self._parts = (before_time, between, after_seq + "\n")
        self.seq = 0

    def next(self) -> bytes:
        self.seq += 1
        a, b, c = self._parts
        return ("%s%.6f%s%d%s" % (a, time.time(), b, self.seq, c)).encode()


# --- keys and known_hosts --------------------------------------------------


@dataclass(frozen=True)
class SimKeys:
    host_key: str
    client_key: str
    client_pub: str
    known_hosts: str


def make_keys(directory: Path, ports: Sequence[int] = ()) -> SimKeys:
    """A host key and a client key in `directory`; known_hosts lines for the given ports."""
    import asyncssh

    directory.mkdir(parents=True, exist_ok=True)
    host = asyncssh.generate_private_key("ssh-ed25519")
    client = asyncssh.generate_private_key("ssh-ed25519")
    paths = SimKeys(
        host_key=str(directory / "host_ed25519"),
        client_key=str(directory / "client_ed25519"),
        client_pub=str(directory / "client_ed25519.pub"),
        known_hosts=str(directory / "known_hosts"),
    )
    host.write_private_key(paths.host_key)
    host.write_public_key(paths.host_key + ".pub")
    client.write_private_key(paths.client_key)
    client.write_public_key(paths.client_pub)
    os.chmod(paths.client_key, 0o600)
    Path(paths.known_hosts).write_text("")
    return paths


def write_known_hosts(keys: SimKeys, ports: Sequence[int], address: str = "127.0.0.1") -> None:
    """known_hosts lines `[127.0.0.1]:PORT ssh-ed25519 AAAA...` for every listening port."""
    public = Path(keys.host_key + ".pub").read_text().split()
    lines = ["[%s]:%d %s %s" % (address, port, public[0], public[1]) for port in ports]
    Path(keys.known_hosts).write_text("\n".join(lines) + "\n")


# --- the server ------------------------------------------------------------

_INTERVAL = re.compile(r"--interval[= ]([0-9.]+)")
_NODE = re.compile(r"--node(?:-name)?[= ](\S+)")


def _is_probe(command: str) -> bool:
    words = shlex.split(command) if command else []
    return bool(words) and "python" in os.path.basename(words[0]) and ("-" in words[1:] or "-c" in words[1:])


async def _serve_probe(process, command: str, stats: Dict[str, int]) -> None:
    match = _INTERVAL.search(command)
    interval = float(match.group(1)) if match else 1.0
    named = _NODE.search(command)
    username = process.get_extra_info("username") or "sim"
    lines = FrameLines(named.group(1) if named else username)
    # The bundle (probe source) arrives on stdin; a real `python3 -` reads it to EOF.
    # Clients that keep stdin open for commands send the source first: read what comes
    # for a moment, then start streaming either way.
    drain = asyncio.ensure_future(_discard(process.stdin, stats))
    try:
        await asyncio.wait_for(asyncio.shield(drain), timeout=0.2)
    except asyncio.TimeoutError:
        pass
    stats["streams"] += 1
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    try:
        while not process.is_closing():
            process.stdout.write(lines.next())
            stats["frames"] += 1
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))
    except (OSError, asyncio.CancelledError, Exception):  # the client went away
        pass
    finally:
        drain.cancel()
        stats["streams"] -= 1
        try:
            process.exit(0)
        except Exception:
            pass


async def _discard(stream, stats: Dict[str, int]) -> None:
    try:
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            stats["stdin_bytes"] += len(chunk)
    except Exception:
        return


def _handler(stats: Dict[str, int], csv: bytes):
    frame_lines: Dict[str, FrameLines] = {}

    async def handle(process) -> None:
        command = process.command or ""
        if command.startswith("nvidia-smi"):
            stats["execs"] += 1
            process.stdout.write(csv)
            process.exit(0)
        elif command.startswith(INSTALLED_PROBE_ONCE):
            # A probe installed on the node, run once per poll: the same data as our stream, one exec each.
            stats["execs"] += 1
            named = _NODE.search(command)
            node = named.group(1) if named else "sim"
            if node not in frame_lines:
                frame_lines[node] = FrameLines(node)
            process.stdout.write(frame_lines[node].next())
            process.exit(0)
        elif _is_probe(command):
            await _serve_probe(process, command, stats)
        elif command.startswith("exit") or command == "true":
            process.exit(0)
        else:
            stats["unknown"] += 1
            process.stderr.write(("sim: %s: command not found\n" % command.split(" ")[0]).encode())
            process.exit(127)

    return handle


async def _serve(keys: SimKeys, count: int, ready, stop_event) -> None:
    import asyncssh

    stats = {"execs": 0, "frames": 0, "streams": 0, "stdin_bytes": 0, "unknown": 0}
    handle = _handler(stats, nvidia_smi_csv())
    servers = []
    for _ in range(count):
        server = await asyncssh.create_server(
            asyncssh.SSHServer,
            "127.0.0.1",
            0,
            server_host_keys=[keys.host_key],
            authorized_client_keys=keys.client_pub,
            process_factory=handle,
            sftp_factory=True,
            encoding=None,
            allow_scp=False,
            backlog=512,
        )
        servers.append(server)
    ports = [server.sockets[0].getsockname()[1] for server in servers]
    ready.put(ports)
    while not stop_event.is_set():
        await asyncio.sleep(0.2)
    ready.put(dict(stats))
    for server in servers:
        server.close()


def _server_main(keys: SimKeys, count: int, ready, stop_event) -> None:
    asyncio.run(_serve(keys, count, ready, stop_event))


class SimulatedNodes:
    """The server process: `with SimulatedNodes(dir, ports=4) as sim: sim.ports ...`."""

    def __init__(self, directory: Path, ports: int = 4) -> None:
        self.keys = make_keys(directory)
        self._count = ports
        ctx = multiprocessing.get_context("spawn")
        self._ready = ctx.Queue()
        self._stop = ctx.Event()
        self._process = ctx.Process(
            target=_server_main, args=(self.keys, ports, self._ready, self._stop), daemon=True
        )
        self.ports: List[int] = []
        self.stats: Dict[str, int] = {}

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid

    def __enter__(self) -> "SimulatedNodes":
        self._process.start()
        self.ports = self._ready.get(timeout=60)
        write_known_hosts(self.keys, self.ports)
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        try:
            self.stats = self._ready.get(timeout=10)
        except Exception:
            self.stats = {}
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=5)
