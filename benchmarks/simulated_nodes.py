"""Simulated GPU nodes behind a real in-process asyncssh server on loopback, for scale runs.

The server speaks what a node does for the console: a command that starts the probe
(`python3 - ...`) gets its stdin bundle read and thrown away, then one 8-GPU H200
NodeFrame line every interval (with `--delta`: a keyframe, then deltas, made by the
agent's own encoder, opsconsole.probe.wire_delta); an `nvidia-smi --query-gpu=...` exec
gets the 8-line CSV once and exits (what gpustat-web-style pollers run). It runs in its
own process so its CPU is not counted against the client being measured. Streams tick on
the wall-clock grid as the agent does (opsconsole.probe.agent.delay_to_grid), each line
made ahead of its tick so that all nodes' lines leave together, as parallel nodes' do.

Numbers start from the real H200 capture in tests/fixtures/h200/ and then move every
tick as a busy training node's do (ChangingNode): every GPU's utilization, memory,
temperature, power, clocks, PCIe rates and energy; most cores' CPU %; every process's
CPU %, RSS and elapsed time; top processes re-sorted by CPU, data-loader workers exiting
and new ones starting, now and then a short-lived extra GPU process.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
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
from opsconsole.probe.agent import delay_to_grid  # noqa: E402
from opsconsole.probe.wire_delta import DEFAULT_KEYFRAME_EVERY, DeltaEncoder, round_wire  # noqa: E402

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


class ChangingNode:
    """One simulated node whose readings move every tick, in the wire form the agent sends (floats rounded).

    Each tick() returns a fresh wire dict (the encoder keeps the previous one), built
    from state that drifts as a busy 8-GPU training node's does; see the module docstring.
    """

    def __init__(self, node: str, interval: float = 1.0, seed: Optional[int] = None) -> None:
        self.rng = random.Random(seed if seed is not None else node)
        self.interval = interval
        self.state = to_wire(h200_frame(node, seq=0, now=time.time()))
        self.seq = 0
        self.next_pid = 20000
        self.extra = []  # type: List[list]  # [ticks left, GPU process wire dict]
        for gpu in self.state["gpus"]:
            gpu["busy"] = True  # every GPU of a training node works; the template's idle ones ramp up
        self.idle_cores = set(range(40, 192))

    def _gpus(self) -> List[dict]:
        rng = self.rng
        out = []
        for gpu in self.state["gpus"]:
            gpu["utilization_gpu"] = float(rng.choice((96, 97, 98, 99, 100, 100, 100)))
            gpu["utilization_memory"] = float(rng.randint(18, 31))
            gpu["memory_used"] = min(gpu["memory_total"], max(0, 22525509632 + rng.randint(-64, 64) * 2 * MIB))
            gpu["memory_free"] = gpu["memory_total"] - gpu["memory_used"]
            if rng.random() < 0.3:
                gpu["temperature"] = float(min(75, max(50, int(gpu["temperature"] or 55) + rng.choice((-1, 1)))))
            gpu["power_draw_w"] = rng.randint(640000, 699990) / 1000.0  # NVML gives mW
            gpu["energy_j"] = (
                (gpu["energy_j"] or 0.0) + gpu["power_draw_w"] * self.interval + rng.randint(0, 999) / 1000.0
            )
            gpu["clock_sm_mhz"] = rng.choice(range(1395, 1981, 15))
            gpu["pcie_tx_kbs"] = rng.randint(800, 40000)
            gpu["pcie_rx_kbs"] = rng.randint(800, 40000)
            if rng.random() < 0.05:
                gpu["clock_event_reasons"] = [] if gpu["clock_event_reasons"] else ["sw_power_cap"]
            item = dict(gpu)
            del item["busy"]
            out.append(item)
        return out

    def _host(self) -> dict:
        rng = self.rng
        host = self.state["host"]
        cores = []
        for i in range(host["cpu_count"]):
            if i in self.idle_cores:
                cores.append(0.0 if rng.random() < 0.6 else rng.randint(1, 40) / 10.0)
            elif i < 10:
                cores.append(rng.randint(950, 1000) / 10.0)  # the ranks' main threads
            else:
                cores.append(rng.randint(200, 1000) / 10.0)  # data-loader workers
        host["cpu_per_core"] = cores
        host["cpu_percent"] = sum(cores) / len(cores)
        host["load_avg"] = [max(0.0, v + rng.uniform(-0.5, 0.5)) for v in host["load_avg"]]
        host["iowait_percent"] = rng.randint(0, 15) / 10.0
        host["mem_used"] = host["mem_used"] + rng.randint(-256, 256) * MIB
        host["mem_available"] = host["mem_total"] - host["mem_used"] - 20 * 1024 * MIB
        host["uptime_s"] = host["uptime_s"] + self.interval + rng.uniform(-0.01, 0.01)
        host["net"] = [
            dict(
                rate,
                rx_bytes_per_s=rng.uniform(0.5, 1.0) * (2.1e9 if rate["interface"] == "ib0" else 1.2e6),
                tx_bytes_per_s=rng.uniform(0.5, 1.0) * (2.0e9 if rate["interface"] == "ib0" else 0.8e6),
            )
            for rate in host["net"]
        ]
        if rng.random() < 0.02:
            disk = host["disks"][0]
            used = disk["used"] + rng.randint(1, 100) * MIB
            host["disks"] = [dict(disk, used=used, free=disk["total"] - used)]
        return dict(host)

    def _processes(self, gpus: List[dict]) -> List[dict]:
        rng = self.rng
        for proc in self.state["processes"]:
            proc["cpu_percent"] = rng.randint(950, 1010) / 10.0
            proc["rss_bytes"] = proc["rss_bytes"] + rng.randint(-8, 8) * MIB
            proc["elapsed_s"] = proc["elapsed_s"] + self.interval + rng.uniform(-0.005, 0.005)
            proc["gpu_sm_percent"] = float(rng.randint(88, 99))
        if rng.random() < 0.03:  # a profiler or eval process on one GPU for a few ticks
            gpu = rng.randrange(len(gpus))
            self.next_pid += 1
            self.extra.append(
                [
                    rng.randint(2, 8),
                    dict(
                        self.state["processes"][0],
                        pid=self.next_pid,
                        name="nsys",
                        command="nsys profile -p %d" % self.next_pid,
                        cpu_percent=rng.randint(10, 300) / 10.0,
                        rss_bytes=300 * MIB,
                        elapsed_s=0.0,
                        threads=12,
                        gpu_index=gpu,
                        gpu_uuid=gpus[gpu]["uuid"],
                        gpu_memory_bytes=512 * MIB,
                        gpu_sm_percent=1.0,
                    ),
                ]
            )
        for entry in self.extra:
            entry[0] -= 1
            entry[1] = dict(
                entry[1], elapsed_s=entry[1]["elapsed_s"] + self.interval, cpu_percent=rng.randint(10, 300) / 10.0
            )
        self.extra = [entry for entry in self.extra if entry[0] > 0]
        procs = [dict(p) for p in self.state["processes"]] + [dict(entry[1]) for entry in self.extra]
        return sorted(procs, key=lambda p: (p["gpu_index"], p["pid"]))

    def _top(self) -> List[dict]:
        rng = self.rng
        top = self.state["top_processes"]
        for proc in top:
            if proc["name"] == "python3":
                proc["cpu_percent"] = rng.randint(950, 1010) / 10.0
            else:
                proc["cpu_percent"] = rng.randint(150, 950) / 10.0
                proc["state"] = "R" if rng.random() < 0.7 else "S"
            proc["rss_bytes"] = proc["rss_bytes"] + rng.randint(-4, 4) * MIB
            proc["elapsed_s"] = proc["elapsed_s"] + self.interval + rng.uniform(-0.005, 0.005)
        if rng.random() < 0.1:  # a data-loader worker exits, a new one starts
            workers = [i for i, p in enumerate(top) if p["name"] != "python3"]
            i = rng.choice(workers)
            self.next_pid += 1
            top[i] = dict(top[i], pid=self.next_pid, elapsed_s=0.0, cpu_percent=rng.randint(150, 950) / 10.0)
        top.sort(key=lambda p: -p["cpu_percent"])
        return [dict(p) for p in top]

    def tick(self, now: Optional[float] = None) -> dict:
        """The next frame's wire dict, rounded as the agent rounds it."""
        self.seq += 1
        gpus = self._gpus()
        wire = dict(self.state)
        wire.update(
            time=time.time() if now is None else now,
            seq=self.seq,
            probe_ms=self.rng.randint(2500, 4000) / 100.0,
            host=self._host(),
            gpus=gpus,
            processes=self._processes(gpus),
            top_processes=self._top(),
        )
        return round_wire(wire)


class FrameLines:
    """One node's stream lines: full frames of a ChangingNode, or (delta) the agent encoder's keyframes and deltas."""

    def __init__(
        self, node: str, interval: float = 1.0, delta: bool = False, keyframe_every: int = DEFAULT_KEYFRAME_EVERY
    ) -> None:
        self.source = ChangingNode(node, interval)
        self.encoder = DeltaEncoder(keyframe_every) if delta else None

    @property
    def seq(self) -> int:
        return self.source.seq

    def next(self, now: Optional[float] = None) -> bytes:
        """The next line, its frame stamped `now` (default: the time it is made)."""
        wire = self.source.tick(now)
        if self.encoder is not None:
            return (self.encoder.encode_wire(wire) + "\n").encode()
        return (json.dumps(wire, separators=(",", ":")) + "\n").encode()


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
_KEYFRAME_EVERY = re.compile(r"--keyframe-every[= ]([0-9]+)")


def _is_probe(command: str) -> bool:
    words = shlex.split(command) if command else []
    return bool(words) and "python" in os.path.basename(words[0]) and ("-" in words[1:] or "-c" in words[1:])


async def _serve_probe(process, command: str, stats: Dict[str, int]) -> None:
    match = _INTERVAL.search(command)
    interval = float(match.group(1)) if match else 1.0
    named = _NODE.search(command)
    username = process.get_extra_info("username") or "sim"
    every = _KEYFRAME_EVERY.search(command)
    lines = FrameLines(
        named.group(1) if named else username,
        interval,
        delta="--delta" in command.split(),
        keyframe_every=int(every.group(1)) if every else DEFAULT_KEYFRAME_EVERY,
    )
    # The bundle (probe source) arrives on stdin; a real `python3 -` reads it to EOF.
    # Clients that keep stdin open for commands send the source first: read what comes
    # for a moment, then start streaming either way.
    drain = asyncio.ensure_future(_discard(process.stdin, stats))
    try:
        await asyncio.wait_for(asyncio.shield(drain), timeout=0.2)
    except asyncio.TimeoutError:
        pass
    stats["streams"] += 1
    try:
        process.stdout.write(lines.next())  # the first frame at once, then on the wall-clock grid, as the agent
        stats["frames"] += 1
        tick = time.time() + delay_to_grid(time.time(), interval)
        while not process.is_closing():
            # Each line is made ahead and written at its tick, on the grid: on a cluster every
            # node polls at the same moment on its own CPU, so the lines leave together, where
            # one process making 256 in turn at the tick would spread them over tens of ms.
            line = lines.next(tick)
            await asyncio.sleep(max(0.0, tick - time.time()))
            if process.is_closing():
                break
            process.stdout.write(line)
            stats["frames"] += 1
            tick += interval
            await asyncio.sleep(interval / 4.0)  # every node's line of this tick goes out before the next are made
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


# sshd opens a session channel's window in two steps: the open confirmation, then a
# WINDOW_ADJUST (seen on loopback with OpenSSH 9: confirmation, adjust, exec success).
OPENSSH_WINDOW_ADJUST = 2 * MIB


def _open_like_openssh(process) -> None:
    """Send the WINDOW_ADJUST that sshd sends after opening a session channel (asyncssh sends none)."""
    from asyncssh.constants import MSG_CHANNEL_WINDOW_ADJUST
    from asyncssh.packet import UInt32

    channel = process.channel
    channel._recv_window += OPENSSH_WINDOW_ADJUST  # the window the adjust grants, as asyncssh's own adjusts keep it
    channel.send_packet(MSG_CHANNEL_WINDOW_ADJUST, UInt32(OPENSSH_WINDOW_ADJUST))


def _exit_like_openssh(process, status: int) -> None:
    """End an exec as sshd does: EOF when the command's output closes, then exit-status and CLOSE.

    asyncssh's exit() sends exit-status and CLOSE only; sshd sends CHANNEL_EOF first.
    """
    process.stdout.write_eof()
    process.exit(status)


def _handler(stats: Dict[str, int], csv: bytes, like_openssh: bool = True):
    """The process factory: what each exec on a simulated node does.

    like_openssh: every session channel gets sshd's packets besides asyncssh's own (the
    WINDOW_ADJUST after opening, CHANNEL_EOF before exit-status): 7 packets to the client
    per exec as from the real sshd, not asyncssh's 5 (tests/test_ssh_stream_tuning.py compares them).
    """
    frame_lines: Dict[str, FrameLines] = {}
    opened = _open_like_openssh if like_openssh else (lambda process: None)
    exit = _exit_like_openssh if like_openssh else (lambda process, status: process.exit(status))

    async def handle(process) -> None:
        command = process.command or ""
        opened(process)
        if command.startswith("nvidia-smi"):
            stats["execs"] += 1
            process.stdout.write(csv)
            exit(process, 0)
        elif command.startswith(INSTALLED_PROBE_ONCE):
            # A probe installed on the node, run once per poll: the same data as our stream, one exec each.
            stats["execs"] += 1
            named = _NODE.search(command)
            node = named.group(1) if named else "sim"
            if node not in frame_lines:
                frame_lines[node] = FrameLines(node)
            process.stdout.write(frame_lines[node].next())
            exit(process, 0)
        elif _is_probe(command):
            await _serve_probe(process, command, stats)
        elif command.startswith("exit") or command == "true":
            exit(process, 0)
        else:
            stats["unknown"] += 1
            process.stderr.write(("sim: %s: command not found\n" % command.split(" ")[0]).encode())
            exit(process, 127)

    return handle


async def _serve(keys: SimKeys, count: int, ready, stop_event, like_openssh: bool = True) -> None:
    import asyncssh

    stats = {"execs": 0, "frames": 0, "streams": 0, "stdin_bytes": 0, "unknown": 0}
    handle = _handler(stats, nvidia_smi_csv(), like_openssh)
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


def send_no_ignore_packets() -> None:
    """Make this process's asyncssh send no SSH_MSG_IGNORE before each packet, as OpenSSH's sshd does.

    asyncssh (2.24, connection.py send_packet) puts an empty IGNORE in front of every
    packet it encrypts, with no setting to turn it off; sshd sends IGNOREs only to blur
    keystroke timing in interactive tty sessions, never on exec channels. Left in, every
    server packet reaches the client twice and both clients measured here pay for
    packets a real node would not send. Called in the simulator's own process only: the
    clients measured keep asyncssh as it is.
    """
    from asyncssh.connection import SSHConnection
    from asyncssh.constants import MSG_IGNORE
    from asyncssh.packet import String

    send_packet = SSHConnection.send_packet
    padding_only = (String(b""),)

    def send_packet_without_ignore(self, pkttype, *args, handler=None):
        if pkttype == MSG_IGNORE and args == padding_only and handler is None:
            return  # the inserted one; asyncssh sends no other empty IGNORE
        send_packet(self, pkttype, *args, handler=handler)

    SSHConnection.send_packet = send_packet_without_ignore


def _server_main(keys: SimKeys, count: int, ready, stop_event, like_openssh: bool = True) -> None:
    if like_openssh:
        send_no_ignore_packets()
    asyncio.run(_serve(keys, count, ready, stop_event, like_openssh))


class SimulatedNodes:
    """The server process: `with SimulatedNodes(dir, ports=4) as sim: sim.ports ...`.

    like_openssh (the default) turns off asyncssh's IGNORE packet before every packet
    in the server (see send_no_ignore_packets); False keeps asyncssh's own behaviour.
    """

    def __init__(self, directory: Path, ports: int = 4, like_openssh: bool = True) -> None:
        self.keys = make_keys(directory)
        self._count = ports
        ctx = multiprocessing.get_context("spawn")
        self._ready = ctx.Queue()
        self._stop = ctx.Event()
        self._process = ctx.Process(
            target=_server_main, args=(self.keys, ports, self._ready, self._stop, like_openssh), daemon=True
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
