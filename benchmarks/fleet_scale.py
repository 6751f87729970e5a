"""Console CPU and frame age watching 256 simulated 8-GPU nodes over SSH, against gpustat-web's way.

Both clients talk to the same in-process asyncssh server (benchmarks/simulated_nodes.py,
in its own process, so its CPU is not counted), each in a fresh process of its own:

- ours: a Fleet of SshLink nodes streaming one line per node per interval over one
  persistent connection each (`--delta`: a keyframe, then only what changed, made by the
  agent's own encoder, decoded into complete NodeFrames); the callback stores the state,
  as the TUI's handler does. The simulated readings change every tick (simulated_nodes.py).
- gpustat-web's way (baseline): the same nodes over persistent connections, but a new exec
  channel per node per tick, as gpustat_web/app.py's run_client() polls
  (`await asyncio.wait_for(conn.run(cmd), timeout)`, asyncssh's default ciphers); the
  command is `nvidia-smi --query-gpu=...` and its CSV is split into GPUs.
- a second baseline, like for like: an exec per node per tick that returns our whole frame
  (a probe installed on the node, run `--once`), decoded as ours is. It separates what the
  stream saves (channel set-up per poll) from what the richer frame costs (decoding).

Each client's CPU is its process CPU time over wall time in a window after every node
answered. Frame age is sampled each second for every node (now - received_at); latency is
arrival time minus the frame's own time stamp.
Targets: ours <= 50 % of one core, p99 frame age <= 2 s, gpustat-way CPU >= 3x ours.

    .venv/bin/python benchmarks/fleet_scale.py [--nodes 256] [--seconds 30] [--interval 1]

FLEET_SCALE_PROFILE=FILE writes a cProfile of our side's measured window to FILE.
FLEET_SCALE_COUNTERS=1 (a diagnostic) prints, per client, event-loop wake-ups, SSH packets in and
out, GC runs, time and cyclic garbage, and user/sys CPU, per second of the window.
FLEET_SCALE_TRANSPORT_ONLY=1 (a diagnostic): ours reads every line but decodes none after
the first, which leaves what SSH and asyncio cost. --ciphers LIST sets the SSH ciphers of
every client (ours through ~/.ssh/config, as a user would).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulated_nodes import (  # noqa: E402
    INSTALLED_PROBE_ONCE,
    NVIDIA_SMI_COMMAND,
    NVIDIA_SMI_QUERY,
    SimKeys,
    SimulatedNodes,
)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def node_names(count: int) -> List[str]:
    return ["sim%03d" % i for i in range(count)]


class Counters:
    """FLEET_SCALE_COUNTERS=1 (a diagnostic): event-loop wake-ups, SSH packets, GC time, user/sys split.

    Counting costs a little itself (a wrapper per select, a callback per collection), so
    the CPU figure of a run with counters is not the result; the counts are.
    """

    def __init__(self, conns) -> None:
        import gc

        self._conns = conns  # a callable: the SSH connections to count packets on
        self.wakeups = 0
        self.gc_s = [0.0, 0.0, 0.0]
        self.gc_runs = [0, 0, 0]
        self._gc_started = 0.0
        loop = asyncio.get_running_loop()
        selector = loop._selector  # type: ignore[attr-defined]
        select = selector.select

        def counting_select(timeout=None):
            self.wakeups += 1
            return select(timeout)

        selector.select = counting_select

        def on_gc(phase, info) -> None:
            if phase == "start":
                self._gc_started = time.perf_counter()
            else:
                generation = info.get("generation", 0)
                self.gc_s[generation] += time.perf_counter() - self._gc_started
                self.gc_runs[generation] += 1

        gc.callbacks.append(on_gc)
        self._start = self._snapshot()

    def _snapshot(self):
        received = sent = 0
        for conn in self._conns():
            received += getattr(conn, "_recv_seq", 0)
            sent += getattr(conn, "_send_seq", 0)
        times = os.times()
        import gc

        collected = [stat["collected"] for stat in gc.get_stats()]
        return {
            "collected": collected,
            "wakeups": self.wakeups,
            "received": received,
            "sent": sent,
            "gc_s": list(self.gc_s),
            "gc_runs": list(self.gc_runs),
            "user": times.user,
            "sys": times.system,
            "wall": time.perf_counter(),
        }

    def report(self) -> Dict[str, object]:
        end, start = self._snapshot(), self._start
        wall = end["wall"] - start["wall"]
        return {
            "wakeups_per_s": (end["wakeups"] - start["wakeups"]) / wall,
            "packets_in_per_s": (end["received"] - start["received"]) / wall,
            "packets_out_per_s": (end["sent"] - start["sent"]) / wall,
            "gc_percent": [round((e - s) / wall * 100.0, 2) for e, s in zip(end["gc_s"], start["gc_s"])],
            "gc_runs_per_s": [round((e - s) / wall, 2) for e, s in zip(end["gc_runs"], start["gc_runs"])],
            "gc_collected_per_s": [round((e - s) / wall, 1) for e, s in zip(end["collected"], start["collected"])],
            "user_percent": (end["user"] - start["user"]) / wall * 100.0,
            "sys_percent": (end["sys"] - start["sys"]) / wall * 100.0,
        }


async def _measure_window(seconds: float, sample_ages, conns=None) -> Dict[str, float]:
    """CPU % of this process and frame ages, sampled once a second over `seconds`."""
    counters = Counters(conns) if conns is not None and os.environ.get("FLEET_SCALE_COUNTERS") else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    ages: List[float] = []
    deadline = wall0 + seconds
    while time.perf_counter() < deadline:
        await asyncio.sleep(1.0)
        ages.extend(sample_ages(time.time()))
    cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0) * 100.0
    result = {
        "cpu_percent": cpu,
        "age_p50": percentile(ages, 50),
        "age_p99": percentile(ages, 99),
        "age_max": max(ages) if ages else math.nan,
        "age_samples": len(ages),
    }
    if counters is not None:
        result["counters"] = counters.report()
    return result


async def _wait_all(count_ready, total: int, timeout: float) -> float:
    started = time.perf_counter()
    while count_ready() < total:
        if time.perf_counter() - started > timeout:
            break
        await asyncio.sleep(0.1)
    return time.perf_counter() - started


# --- ours ----------------------------------------------------------------------


async def run_ours(
    keys: SimKeys, ports: Sequence[int], count: int, interval: float, seconds: float, ready_timeout: float
) -> Dict[str, float]:
    from opsconsole.config import Config, ConsoleConfig, NodeConfig, SshConfig
    from opsconsole.model import LIVE_STATES
    from opsconsole.nodes.fleet import Fleet

    nodes = tuple(
        NodeConfig(name=name, host="127.0.0.1", port=ports[i % len(ports)], user=name, identity=keys.client_key)
        for i, name in enumerate(node_names(count))
    )
    config = Config(console=ConsoleConfig(interval=interval), nodes=nodes, ssh=SshConfig(known_hosts=keys.known_hosts))
    if os.environ.get("FLEET_SCALE_TRANSPORT_ONLY"):
        # Diagnostic, not a result: lines are read but only the first is decoded (the
        # node's frame is then republished as it is), so what is left is SSH + asyncio.
        from opsconsole.probe import wire_delta

        decode_line = wire_delta.StreamDecoder.decode_line

        def transport_only(self, line):
            return decode_line(self, line) if self.last is None else (self.last, None)

        wire_delta.StreamDecoder.decode_line = transport_only
    fleet = Fleet(config)
    states: Dict[str, object] = {}
    latencies: List[float] = []
    window = {"open": False, "frames": 0}
    last_seq: Dict[str, int] = {}

    def on_change(state) -> None:
        states[state.name] = state  # what the console's message handler does, minimally
        frame = state.frame
        if window["open"] and frame is not None and last_seq.get(state.name) != frame.seq:
            window["frames"] += 1
            latencies.append(state.received_at - frame.time)
        if frame is not None:
            last_seq[state.name] = frame.seq

    def live() -> int:
        return sum(1 for s in states.values() if s.state in LIVE_STATES and s.frame is not None)

    def ages(now: float) -> List[float]:
        return [now - s.received_at if s.received_at else math.inf for s in states.values()] + [
            math.inf for _ in range(count - len(states))
        ]

    started = time.perf_counter()
    await fleet.start(on_change)
    to_all_up = await _wait_all(live, count, ready_timeout)
    up_at_start = live()
    await asyncio.sleep(2 * interval)  # let the connect burst settle
    window["open"] = True
    profiler = None
    if os.environ.get("FLEET_SCALE_PROFILE"):  # where our CPU goes, for whoever tunes the SSH path
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()

    def our_conns():
        return [c for c in (getattr(fleet.link(n.name), "_conn", None) for n in nodes) if c is not None]

    result = await _measure_window(seconds, ages, our_conns)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(os.environ["FLEET_SCALE_PROFILE"])
    window["open"] = False
    conn = getattr(fleet.link(nodes[0].name), "_conn", None)
    result.update(
        cipher=conn.get_extra_info("recv_cipher") if conn is not None else "?",
        all_up_s=to_all_up,
        up_at_start=up_at_start,
        up_at_end=live(),
        frames_per_s=window["frames"] / seconds,
        latency_p50=percentile(latencies, 50),
        latency_p99=percentile(latencies, 99),
        not_up=sorted("%s: %s %s" % (s.name, s.state, s.reason) for s in states.values() if s.state not in LIVE_STATES)[
            :5
        ],
        total_s=time.perf_counter() - started,
    )
    _report(result)
    try:
        await asyncio.wait_for(fleet.stop(), 15.0)
    except asyncio.TimeoutError:
        pass
    return result


# --- gpustat-web's way -----------------------------------------------------------


async def run_gpustat_way(
    keys: SimKeys,
    ports: Sequence[int],
    count: int,
    interval: float,
    seconds: float,
    ready_timeout: float,
    full_frames: bool = False,
) -> Dict[str, float]:
    """Persistent connections, one exec per node per tick: nvidia-smi CSV, or (full_frames) a whole frame."""
    import asyncssh

    from opsconsole.model import NodeFrame, from_wire

    limiter = asyncio.Semaphore(8)  # the same login cap as ours, so sshd-like servers survive the burst
    columns = NVIDIA_SMI_QUERY.split(",")
    results: Dict[str, tuple] = {}
    window = {"open": False, "polls": 0}

    async def connect(i: int, name: str):
        async with limiter:
            return await asyncssh.connect(
                "127.0.0.1",
                ports[i % len(ports)],
                username=name,
                client_keys=[keys.client_key],
                known_hosts=keys.known_hosts,
                config=None,
                **(
                    {"encryption_algs": os.environ["FLEET_SCALE_CIPHERS"].split(",")}
                    if os.environ.get("FLEET_SCALE_CIPHERS")
                    else {}
                ),
            )

    async def poll_forever(name: str, conn) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                if full_frames:
                    answer = await conn.run("%s --node-name %s" % (INSTALLED_PROBE_ONCE, name), check=False)
                    gpus = list(from_wire(NodeFrame, json.loads(answer.stdout)).gpus)
                else:
                    # gpustat_web/app.py run_client(): wait_for(conn.run(cmd), timeout) and a time stamp
                    # per poll, the output kept as text for the page. We also split it into GPUs
                    # (gpustat-web leaves that to the browser), which it needs to show any totals.
                    answer = await asyncio.wait_for(conn.run(NVIDIA_SMI_COMMAND, check=False), timeout=30.0)
                    datetime.now().strftime("%Y/%m/%d-%H:%M:%S.%f")
                    gpus = [
                        dict(zip(columns, (f.strip() for f in line.split(","))))
                        for line in str(answer.stdout).splitlines()
                        if line.strip()
                    ]
                results[name] = (time.time(), gpus)
                if window["open"]:
                    window["polls"] += 1
            except (asyncssh.Error, OSError) as exc:
                results[name] = (results.get(name, (None,))[0], exc)
            await asyncio.sleep(max(0.0, interval - (loop.time() - started)))

    names = node_names(count)
    started = time.perf_counter()
    conns = await asyncio.gather(*(connect(i, n) for i, n in enumerate(names)))
    tasks = [asyncio.create_task(poll_forever(n, c)) for n, c in zip(names, conns)]

    def answered() -> int:
        return sum(1 for t, gpus in results.values() if t is not None and isinstance(gpus, list))

    def ages(now: float) -> List[float]:
        return [now - results[n][0] if n in results and results[n][0] else math.inf for n in names]

    to_all_up = await _wait_all(answered, count, ready_timeout)
    await asyncio.sleep(2 * interval)
    window["open"] = True
    result = await _measure_window(seconds, ages, lambda: conns)
    window["open"] = False
    result.update(
        cipher=conns[0].get_extra_info("recv_cipher"),
        all_up_s=to_all_up,
        up_at_end=answered(),
        frames_per_s=window["polls"] / seconds,
        total_s=time.perf_counter() - started,
    )
    _report(result)  # before the clean-up, which has been seen to hang at 256 nodes
    for task in tasks:
        task.cancel()
    try:
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10.0)
    except asyncio.TimeoutError:
        pass
    for conn in conns:
        conn.close()
    return result


# --- each client in a fresh process --------------------------------------------------


_reported = []  # type: List[dict]


def _report(result: dict) -> None:
    """Hand the result to the parent once (set up by _client_main); later calls do nothing."""
    if not _reported:
        _reported.append(result)
        if _queue is not None:
            _queue.put(result)


_queue = None


def _client_main(which: str, home: str, queue, *args) -> None:
    global _queue
    _queue = queue
    os.environ["HOME"] = home  # no ~/.ssh/config or agent of the real user leaks in
    os.environ.pop("SSH_AUTH_SOCK", None)
    runner = {"ours": run_ours, "gpustat": run_gpustat_way, "exec-frames": run_gpustat_way}[which]
    if which == "exec-frames":
        args = args + (True,)
    try:
        _report(asyncio.run(runner(*args)))
    except BaseException as exc:
        _report({"error": "%s: %s" % (type(exc).__name__, exc)})
        raise


def run_client(which: str, home: str, *args, timeout: float) -> Dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_client_main, args=(which, home, queue) + args)
    child.start()
    try:
        return queue.get(timeout=timeout)
    except Exception:  # queue.Empty: the client hung or died before answering
        return {"error": "no result within %.0f s (exit code %s)" % (timeout, child.exitcode)}
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.terminate()
            child.join(timeout=5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--ports", type=int, default=4, help="listening ports of the simulated server")
    parser.add_argument("--ready-timeout", type=float, default=120.0)
    parser.add_argument("--only", choices=["ours", "gpustat", "exec-frames"], help="run one client only")
    parser.add_argument(
        "--ciphers",
        default=None,
        metavar="LIST",
        help="SSH ciphers for every client (default: asyncssh's, chacha20-poly1305 first)",
    )
    parser.add_argument(
        "--asyncssh-ignore",
        action="store_true",
        help="let the simulated server behave as asyncssh's own server: an IGNORE packet before "
        "every packet, and no WINDOW_ADJUST after a channel opens nor EOF before an exec's "
        "exit status (default: as OpenSSH's sshd sends them)",
    )
    parser.add_argument(
        "--no-exec-frames",
        action="store_true",
        help="skip the second baseline (an exec per tick returning our full frame)",
    )
    args = parser.parse_args()

    budget = args.ready_timeout + args.seconds + 60
    if args.ciphers:
        os.environ["FLEET_SCALE_CIPHERS"] = args.ciphers  # inherited by the spawned baseline clients
    with tempfile.TemporaryDirectory(prefix="opsconsole-fleet-scale-") as tmp:
        home = Path(tmp) / "home"
        (home / ".ssh").mkdir(parents=True)
        if args.ciphers:  # ours reads ~/.ssh/config as ssh does; the baselines get the same list directly
            (home / ".ssh" / "config").write_text("Host *\n    Ciphers %s\n" % args.ciphers)
        with SimulatedNodes(Path(tmp) / "keys", ports=args.ports, like_openssh=not args.asyncssh_ignore) as sim:
            common = (sim.keys, sim.ports, args.nodes, args.interval, args.seconds, args.ready_timeout)
            # The baseline first: a stream client's 256 closing channels have been seen to slow the next logins.
            theirs = (
                run_client("gpustat", str(home), *common, timeout=budget) if args.only in (None, "gpustat") else None
            )
            ours = run_client("ours", str(home), *common, timeout=budget) if args.only in (None, "ours") else None
            want_frames = args.only == "exec-frames" or (args.only is None and not args.no_exec_frames)
            frames = run_client("exec-frames", str(home), *common, timeout=budget) if want_frames else None
        server = sim.stats

    print(
        "fleet scale: %d simulated 8-GPU nodes, %.0f s interval, %.0f s window, %d cores on this machine, "
        "ciphers %s, server %s"
        % (
            args.nodes,
            args.interval,
            args.seconds,
            os.cpu_count() or 0,
            args.ciphers or "each client's default (ours: AES-GCM first; gpustat-web: asyncssh's, chacha20 first)",
            "as asyncssh's server (IGNORE before every packet)"
            if args.asyncssh_ignore
            else "sending what sshd sends (no IGNOREs; WINDOW_ADJUST on open, EOF before exit status)",
        )
    )
    if os.environ.get("FLEET_SCALE_TRANSPORT_ONLY"):
        print("FLEET_SCALE_TRANSPORT_ONLY: ours decodes no frames (a diagnostic of the transport, not a result)")
    for label, result in (("ours", ours), ("gpustat-web way", theirs), ("exec full frame", frames)):
        if result is None:
            continue
        if "error" in result:
            print("%-16s failed: %s" % (label, result["error"]))
            continue
        print(
            "%-16s CPU %5.1f %%, all up in %5.1f s, up at end %d/%d, %6.1f frames/s, "
            "frame age p50 %.2f s p99 %.2f s max %.2f s, cipher %s"
            % (
                label,
                result["cpu_percent"],
                result["all_up_s"],
                result["up_at_end"],
                args.nodes,
                result["frames_per_s"],
                result["age_p50"],
                result["age_p99"],
                result["age_max"],
                result.get("cipher"),
            )
        )
        if "latency_p99" in result:
            print(
                "%-16s arrival latency p50 %.1f ms p99 %.1f ms"
                % ("", result["latency_p50"] * 1000, result["latency_p99"] * 1000)
            )
        if result.get("counters"):
            print("%-16s counters: %s" % ("", result["counters"]))
        if result.get("not_up"):
            print("%-16s not up: %s" % ("", "; ".join(result["not_up"])))
    print("server (own process, not counted): %s" % server)
    if ours and theirs and "error" not in ours and "error" not in theirs:
        ratio = theirs["cpu_percent"] / ours["cpu_percent"] if ours["cpu_percent"] else math.inf
        print("ours CPU            %6.1f %% of one core   (target <= 50 %%)" % ours["cpu_percent"])
        print("p99 frame age       %6.2f s               (target <= 2 s)" % ours["age_p99"])
        print("gpustat-web way CPU %6.1f %% of one core" % theirs["cpu_percent"])
        print("ratio gpustat/ours  %6.2f x               (target >= 3 x)" % ratio)
        # The same ratio per frame received: a client the loaded machine let fall behind looks cheaper.
        per_ours, per_theirs = (
            r["cpu_percent"] * 10000.0 / r["frames_per_s"] if r["frames_per_s"] else math.inf for r in (ours, theirs)
        )
        print(
            "CPU per frame       ours %.0f us, gpustat-web way %.0f us: %.2f x"
            % (per_ours, per_theirs, per_theirs / per_ours if per_ours else math.inf)
        )
    if ours and frames and "error" not in ours and "error" not in frames:
        print(
            "exec-per-tick, our full frame: %5.1f %% of one core, ratio to ours %.2f x (same data, like for like)"
            % (frames["cpu_percent"], frames["cpu_percent"] / ours["cpu_percent"] if ours["cpu_percent"] else math.inf)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
