"""PrometheusSource at fleet scale: 128 and 1,024 nodes of 8 GPUs served by one real Prometheus.

The samples are written into Prometheus's TSDB with `promtool tsdb create-blocks-from
openmetrics` (dcgm-exporter's default counter set with its labels, node-exporter's CPU,
memory, load and file system series, and `up` for both targets of every node), so
Prometheus does no scraping while we measure and its CPU is not ours. The source's clock is
set to the time of the samples, so they are as fresh as a live scrape.

The targets are what a site's static or file_sd config gives: addresses, not names
(instance="10.0.3.1:9100" and "10.0.3.1:9400"), so every node is joined from its two exporters
by node_uname_info's nodename and dcgm-exporter's Hostname; GPUs carry dcgm-exporter's
Kubernetes pod labels (even nodes) or its hpc_job label (odd nodes); DOWN_NODES nodes have
their node_exporter down (up == 0, no host series): they are degraded.

For each size: full refresh cycles (slow_every = 6: the slow tier's queries spread one per
refresh over the cycle) are run several times; we report wall time per refresh, our process's CPU per
refresh, CPU as a share of one core at a 5 s interval, and HTTP requests per refresh. The
baseline, measured in the same run, is the raw HTTP fetch plus json.loads of the very same
queries (what any client must pay); the ratio says what building NodeFrames adds.
Targets: a full refresh <= 1 s and <= 30 % of one core at 5 s at 1,024 nodes; requests per
refresh the same at 128 and 1,024 nodes.

    .venv/bin/python benchmarks/prometheus_scale.py [--sizes 128,1024] [--cycles 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsconsole.config import SourceConfig  # noqa: E402
from opsconsole.sources.prometheus import PARALLEL_QUERIES, PrometheusSource  # noqa: E402

# dcgm-exporter 3.x default-counters.csv, with realistic values.
DCGM_DEFAULT = (
    ("DCGM_FI_DEV_SM_CLOCK", 1980),
    ("DCGM_FI_DEV_MEM_CLOCK", 3201),
    ("DCGM_FI_DEV_MEMORY_TEMP", 45),
    ("DCGM_FI_DEV_GPU_TEMP", 55),
    ("DCGM_FI_DEV_POWER_USAGE", 690.7),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 10203506),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 0),
    ("DCGM_FI_DEV_GPU_UTIL", 98),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", 22),
    ("DCGM_FI_DEV_ENC_UTIL", 0),
    ("DCGM_FI_DEV_DEC_UTIL", 0),
    ("DCGM_FI_DEV_XID_ERRORS", 0),
    ("DCGM_FI_DEV_FB_FREE", 142144),
    ("DCGM_FI_DEV_FB_USED", 1010),
    ("DCGM_FI_DEV_FB_RESERVED", 615),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 0),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", 0),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 0),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 0),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 4),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.97),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.61),
    ("DCGM_FI_PROF_DRAM_ACTIVE", 0.4),
)
CPUS = 32
CPU_MODES = ("idle", "user", "system", "iowait")
STEP_S = 10.0  # two samples per series, STEP_S apart: enough for rate() over 30 s
DOWN_NODES = 8  # nodes whose node_exporter is down: degraded, GPUs still shown


def address(n: int) -> str:
    return "10.%d.%d.1" % (n // 256, n % 256)


def node_exporter_up(n: int) -> bool:
    return n % max(1, 1024 // DOWN_NODES) != 7


def openmetrics(nodes: int, t1: float) -> str:
    """The OpenMetrics text of `nodes` nodes at t1 - STEP_S and t1."""
    stamps = (t1 - STEP_S, t1)
    lines = []
    for metric, value in DCGM_DEFAULT:
        lines.append("# TYPE %s gauge" % metric)
        for n in range(nodes):
            host = "gpu%04d" % n
            for g in range(8):
                owner = (
                    'pod="train-%d",namespace="ml",container="trainer"' % (n // 2)
                    if n % 2 == 0
                    else 'hpc_job="%d"' % (100000 + n // 2)
                )
                labels = (
                    '{gpu="%d",UUID="GPU-6777fcb4-080d-bc07-9109-%08x%04x",device="nvidia%d",modelName="NVIDIA H200",'
                    'Hostname="%s",pci_bus_id="00000000:%02X:00.0",DCGM_FI_DRIVER_VERSION="580.159.04",%s,'
                    'job="dcgm",instance="%s:9400"}' % (g, n, g, g, host, 0x18 + g, owner, address(n))
                )
                v = value + (n + g) % 7 if metric == "DCGM_FI_DEV_GPU_UTIL" and value else value
                for stamp in stamps:
                    lines.append("%s%s %s %.3f" % (metric, labels, v, stamp))
    gauges = (
        ("node_load1", 12.5),
        ("node_load5", 11.0),
        ("node_load15", 10.2),
        ("node_memory_MemTotal_bytes", 2.16e12),
        ("node_memory_MemAvailable_bytes", 1.9e12),
        ("node_memory_SwapTotal_bytes", 0),
        ("node_memory_SwapFree_bytes", 0),
        ("node_boot_time_seconds", t1 - 86400),
    )
    up_nodes = [n for n in range(nodes) if node_exporter_up(n)]
    for metric, value in gauges:
        lines.append("# TYPE %s gauge" % metric)
        for n in up_nodes:
            for stamp in stamps:
                lines.append('%s{job="node",instance="%s:9100"} %s %.3f' % (metric, address(n), value, stamp))
    lines.append("# TYPE node_uname_info gauge")
    for n in up_nodes:
        for stamp in stamps:
            lines.append(
                'node_uname_info{job="node",instance="%s:9100",nodename="gpu%04d",sysname="Linux",'
                'release="6.8.0-49-generic",machine="x86_64"} 1 %.3f' % (address(n), n, stamp)
            )
    for metric, value in (
        ("node_filesystem_size_bytes", 3.8e12),
        ("node_filesystem_free_bytes", 3.0e12),
        ("node_filesystem_avail_bytes", 2.8e12),
    ):
        lines.append("# TYPE %s gauge" % metric)
        for n in up_nodes:
            for stamp in stamps:
                lines.append(
                    '%s{job="node",instance="%s:9100",mountpoint="/",fstype="ext4",device="/dev/nvme0n1p1"} %s %.3f'
                    % (metric, address(n), value, stamp)
                )
    lines.append("# TYPE node_cpu_seconds_total counter")
    for n in up_nodes:
        for cpu in range(CPUS):
            for mode in CPU_MODES:
                per_step = {"idle": 2.0, "user": 7.0, "system": 0.8, "iowait": 0.2}[mode]
                for i, stamp in enumerate(stamps):
                    lines.append(
                        'node_cpu_seconds_total{job="node",instance="%s:9100",cpu="%d",mode="%s"} %s %.3f'
                        % (address(n), cpu, mode, 100000 + per_step * i, stamp)
                    )
    lines.append("# TYPE up gauge")
    for n in range(nodes):
        for job, port in (("dcgm", 9400), ("node", 9100)):
            for stamp in stamps:
                up = 0 if job == "node" and not node_exporter_up(n) else 1
                lines.append('up{job="%s",instance="%s:%d"} %d %.3f' % (job, address(n), port, up, stamp))
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_prometheus(data: Path, nodes: int, t1: float) -> subprocess.Popen:
    source = data.parent / ("samples-%d.om" % nodes)
    source.write_text(openmetrics(nodes, t1))
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(source), str(data)], check=True)
    source.unlink()
    config = data.parent / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1h}\nscrape_configs: []\n")
    port = free_port()
    proc = subprocess.Popen(
        [
            "prometheus",
            "--config.file=%s" % config,
            "--storage.tsdb.path=%s" % data,
            "--storage.tsdb.retention.time=30d",
            "--web.listen-address=127.0.0.1:%d" % port,
            "--log.level=error",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc.url = "http://127.0.0.1:%d" % port  # type: ignore[attr-defined]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(proc.url + "/-/ready", timeout=1) as answer:  # type: ignore[attr-defined]
                if answer.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.terminate()
    raise SystemExit("prometheus did not become ready")


def measure(url: str, nodes: int, t1: float, cycles: int) -> dict:
    config = SourceConfig(url=url, rate_window="30s", slow_every=6, stale_after=3600.0, timeout=60.0)
    source = PrometheusSource(config, interval=5.0, clock=lambda: t1 + 1.0)
    states = source.refresh()  # warm: Prometheus loads the block's index
    gpus = sum(len(s.frame.gpus) for s in states if s.frame)
    assert len(states) == nodes and gpus == nodes * 8, (len(states), gpus)
    # One node per host, joined from its exporters' addresses: every one named by its nodename.
    assert sorted(s.name for s in states) == ["gpu%04d" % n for n in range(nodes)], [s.name for s in states][:5]
    degraded = [s.name for s in states if s.state == "degraded"]
    assert len(degraded) == sum(1 for n in range(nodes) if not node_exporter_up(n)), degraded
    assert all(s.state in ("up", "degraded") for s in states), {s.state for s in states}
    assert states[0].frame.host.cpu_count == CPUS and states[0].frame.host.cpu_percent is not None
    assert states[0].frame.gpus[0].pod == "train-0" and states[1].frame.gpus[0].job_id == "100000"
    walls, cpus, requests, asked = [], [], [], []
    connections_before = source.http.connections_opened
    for _ in range(cycles * config.slow_every):
        asked.append([source.query_up] + source.queries_fast + [source.query_rates] + source.slow_now())
        wall0, cpu0, req0 = time.perf_counter(), time.process_time(), source.http.requests
        source.refresh()
        walls.append(time.perf_counter() - wall0)
        cpus.append(time.process_time() - cpu0)
        requests.append(source.http.requests - req0)
    connections = source.http.connections_opened - connections_before
    # Baseline: the very same queries of each refresh, raw HTTP fetch + json.loads only.
    base_walls, base_cpus = [], []

    def fetch_and_parse(expr: str) -> object:
        return json.loads(source.http.fetch_raw("/api/v1/query", {"query": expr, "time": "%.3f" % (t1 + 1.0)}))

    # The same requests with the same concurrency as the source uses.
    with ThreadPoolExecutor(max_workers=PARALLEL_QUERIES) as pool:
        for exprs in asked:
            wall0, cpu0 = time.perf_counter(), time.process_time()
            list(pool.map(fetch_and_parse, exprs))
            base_walls.append(time.perf_counter() - wall0)
            base_cpus.append(time.process_time() - cpu0)
    return {
        "nodes": nodes,
        "wall_mean_s": statistics.mean(walls),
        "wall_max_s": max(walls),
        "cpu_mean_s": statistics.mean(cpus),
        "cpu_share_at_5s": statistics.mean(cpus) / 5.0,
        "requests": sorted(set(requests)),
        "requests_mean": statistics.mean(requests),
        "base_wall_mean_s": statistics.mean(base_walls),
        "base_cpu_mean_s": statistics.mean(base_cpus),
        "connections_per_refresh": connections / len(walls),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,1024")
    parser.add_argument("--cycles", type=int, default=3, help="slow-tier cycles (6 refreshes each) per size")
    args = parser.parse_args()
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        raise SystemExit("needs prometheus and promtool (apt-get install prometheus)")
    t1 = float(int(time.time()) - 3 * 3600)  # hours ago: blocks never overlap Prometheus's head
    results = []
    for nodes in (int(n) for n in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="prom-scale-") as tmp:
            data = Path(tmp) / "data"
            started = time.perf_counter()
            proc = start_prometheus(data, nodes, t1)
            print(
                "%5d nodes: samples written and Prometheus ready in %.1f s" % (nodes, time.perf_counter() - started),
                flush=True,
            )
            try:
                results.append(measure(proc.url, nodes, t1, args.cycles))  # type: ignore[attr-defined]
            finally:
                proc.terminate()
                proc.wait(30)
    print()
    print(
        "nodes  GPUs   refresh wall mean/max   CPU/refresh  CPU@5s   requests/refresh   baseline wall  baseline CPU  ratio wall  ratio CPU"
    )
    for r in results:
        print(
            "%5d  %5d   %6.3f s / %6.3f s     %6.3f s    %5.1f %%   %-17s  %8.3f s     %8.3f s     %5.2fx     %5.2fx"
            % (
                r["nodes"],
                r["nodes"] * 8,
                r["wall_mean_s"],
                r["wall_max_s"],
                r["cpu_mean_s"],
                100 * r["cpu_share_at_5s"],
                "%s (mean %.2f)" % (r["requests"], r["requests_mean"]),
                r["base_wall_mean_s"],
                r["base_cpu_mean_s"],
                r["wall_mean_s"] / r["base_wall_mean_s"],
                r["cpu_mean_s"] / max(r["base_cpu_mean_s"], 1e-9),
            )
        )
    if len(results) >= 2:
        same = results[0]["requests"] == results[-1]["requests"]
        print("\nrequests per refresh independent of node count: %s" % ("yes" if same else "NO"))
    print(
        "TCP connections opened per refresh (pooled, kept alive): %s"
        % ", ".join("%.2f at %d nodes" % (r["connections_per_refresh"], r["nodes"]) for r in results)
    )
    last = results[-1]
    print(
        "target at %d nodes: full refresh <= 1 s: %s (max %.3f s); <= 30 %% of a core at 5 s: %s (%.1f %%)"
        % (
            last["nodes"],
            "met" if last["wall_max_s"] <= 1.0 else "NOT met",
            last["wall_max_s"],
            "met" if last["cpu_share_at_5s"] <= 0.30 else "NOT met",
            100 * last["cpu_share_at_5s"],
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
