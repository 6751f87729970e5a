"""The cluster as it really is, through a real Prometheus (Debian's 2.42) on 127.0.0.x scraping real
prometheus-node-exporter processes (each in its own UTS namespace, so each reports its own host name)
and pages in dcgm-exporter's exact format (tests/dcgm_pages.py renders its own template):

  gpu-a  targets by IP (127.0.0.2): node_exporter + dcgm-exporter (`hostname` label), a pod on GPUs 0-3
  gpu-b  targets by name (localhost): node_exporter + an older dcgm-exporter (`Hostname` label)
  gpu-c  127.0.0.3: dcgm-exporter with one GPU in MIG mode (two 3g.40gb), its node_exporter down from the start
  gpu-d  127.0.0.4: both targets down from the start, named by the source's node_names
  gpu-e  127.0.0.5: a dcgm-exporter that says no host name, its node_exporter not yet started: the node
         is its address until the node_exporter comes up and says its nodename; the fleet then drops
         the address's row instead of keeping a ghost of it

Then gpu-a's node_exporter is stopped: gpu-a turns degraded and keeps its GPUs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

import pytest
from dcgm_pages import Gpu, MigInstance, render_page
from waiting import wait_for_sync

from opsconsole.config import SourceConfig
from opsconsole.model import STATE_DEGRADED, STATE_DOWN, STATE_UP, NodeState
from opsconsole.sources.prometheus import PrometheusSource
from tests.prometheus_server import MetricsPage, Prometheus, answers, free_port, needs_prometheus, stop_process

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
MIB = 1024 * 1024

pytestmark = [
    needs_prometheus,
    pytest.mark.skipif(
        not os.access(NODE_EXPORTER, os.X_OK),
        reason="node exporter not installed (apt-get install prometheus-node-exporter)",
    ),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="each node_exporter runs in its own UTS namespace (unshare needs root)"
    ),
]

POD = {"pod": "train-0", "namespace": "ml", "container": "trainer"}
MIG_GPU = Gpu(
    index=0,
    mig=(
        MigInstance(
            1,
            "3g.40gb",
            fb_used_mib=3000,
            fb_free_mib=39192,
            engine_active=0.5,
            attributes={"pod": "infer-7", "namespace": "serving", "container": "vllm"},
        ),
        MigInstance(2, "3g.40gb", fb_used_mib=12000, fb_free_mib=30192, engine_active=0.25),
    ),
)


class DcgmPage(MetricsPage):
    """A dcgm-exporter-format /metrics page served on (address, port) by a thread of this process."""

    def __init__(self, address: str, gpus: List[Gpu], hostname: str, hostname_label: str) -> None:
        super().__init__(address, render_page(gpus, hostname, hostname_label))


class NodeExporter:
    """prometheus-node-exporter on address:port, in a UTS namespace whose host name is `hostname`."""

    def __init__(self, tmp: Path, hostname: str, address: str, port: int = 0) -> None:
        self.port = port or free_port(address)
        self.log = open(tmp / ("node-exporter-%s.log" % hostname), "w")
        argv = [
            NODE_EXPORTER,
            "--web.listen-address=%s:%d" % (address, self.port),
            "--collector.disable-defaults",
            "--collector.uname",
            "--collector.cpu",
            "--collector.meminfo",
            "--collector.loadavg",
            "--collector.filesystem",
            "--collector.netdev",
            "--collector.time",
        ]
        self.proc = subprocess.Popen(
            [UNSHARE, "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', hostname] + argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        url = "http://%s:%d/metrics" % (address, self.port)
        wait_for_sync(lambda: answers(url), what="node_exporter %s" % hostname)

    def stop(self) -> None:
        stop_process(self.proc, self.log)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prometheus-cluster")
    stoppable: List[object] = []
    try:
        node_a = NodeExporter(tmp, "gpu-a", "127.0.0.2")
        node_b = NodeExporter(tmp, "gpu-b", "127.0.0.1")
        stoppable += [node_a, node_b]
        dcgm_a = DcgmPage("127.0.0.2", [Gpu(i, attributes=POD if i < 4 else {}) for i in range(8)], "gpu-a", "hostname")
        dcgm_b = DcgmPage("127.0.0.1", [Gpu(0, util=80), Gpu(1, util=5)], "gpu-b", "Hostname")
        dcgm_c = DcgmPage("127.0.0.3", [MIG_GPU], "gpu-c", "hostname")
        stoppable += [dcgm_a, dcgm_b, dcgm_c]
        dcgm_e = DcgmPage("127.0.0.5", [Gpu(0)], "", "hostname")  # the template leaves the label out when empty
        stoppable.append(dcgm_e)
        dead = {
            name: free_port(address)
            for name, address in (
                ("c-node", "127.0.0.3"),
                ("d-node", "127.0.0.4"),
                ("d-dcgm", "127.0.0.4"),
                ("e-node", "127.0.0.5"),
            )
        }
        prometheus = Prometheus(
            tmp,
            {
                "node_exporter": [
                    "127.0.0.2:%d" % node_a.port,
                    "localhost:%d" % node_b.port,
                    "127.0.0.3:%d" % dead["c-node"],
                    "127.0.0.4:%d" % dead["d-node"],
                    "127.0.0.5:%d" % dead["e-node"],
                ],
                "dcgm-exporter": [
                    "127.0.0.2:%d" % dcgm_a.port,
                    "localhost:%d" % dcgm_b.port,
                    "127.0.0.3:%d" % dcgm_c.port,
                    "127.0.0.4:%d" % dead["d-dcgm"],
                    "127.0.0.5:%d" % dcgm_e.port,
                ],
            },
            scrape_timeout="400ms",
        )
        stoppable.append(prometheus)
        yield prometheus, {"node_a": node_a, "dead": dead, "tmp": tmp, "stoppable": stoppable}
    finally:
        for part in reversed(stoppable):
            part.stop()  # type: ignore[attr-defined]


def source_for(url: str, **changes) -> PrometheusSource:
    config = replace(
        SourceConfig(url=url, rate_window="5s", stale_after=30.0, node_names=("127.0.0.4=gpu-d",)), **changes
    )
    return PrometheusSource(config, interval=1.0)


def settled(source: PrometheusSource) -> Dict[str, NodeState]:
    """Refresh until every scenario shows (each target scraped, host data in, errors read)."""

    def ready():
        states = {s.name: s for s in source.refresh()}
        a, b, c, d = (states.get(n) for n in ("gpu-a", "gpu-b", "gpu-c", "gpu-d"))
        ok = (
            a is not None
            and a.frame is not None
            and len(a.frame.gpus) == 8
            and a.frame.host is not None
            and a.frame.host.cpu_count > 0
            and a.frame.host.cpu_percent is not None
            and all(g.memory_used is not None for g in a.frame.gpus)
            and b is not None
            and b.frame is not None
            and len(b.frame.gpus) == 2
            and b.frame.host is not None
            and b.frame.host.cpu_count > 0
            and c is not None
            and c.state == STATE_DEGRADED
            and c.frame is not None
            and c.frame.gpus
            and c.frame.gpus[0].mig_devices
            and "refused" in (c.reason or "")
            and d is not None
            and d.state == STATE_DOWN
            and "refused" in (d.reason or "")
        )
        return states if ok else None

    states = wait_for_sync(ready, what="every scenario in Prometheus", timeout=40)
    for _ in range(len(source.slow_parts)):  # one whole slow-tier cycle on top
        states = {s.name: s for s in source.refresh()}
    return states


def test_every_scenario_as_the_console_shows_it(cluster):
    prometheus, parts = cluster
    source = source_for(prometheus.url)
    states = settled(source)
    # One node per host, whatever the targets are called: no node is named by an address
    # (but 127.0.0.5, whose exporters have said no name yet).
    assert sorted(states) == ["127.0.0.5", "gpu-a", "gpu-b", "gpu-c", "gpu-d"]

    a = states["gpu-a"]  # targets by IP; dcgm-exporter 4.x's lowercase hostname label
    assert a.state == STATE_UP and a.reason is None
    assert [g.index for g in a.frame.gpus] == list(range(8))
    gpu0 = a.frame.gpus[0]
    assert (gpu0.utilization_gpu, gpu0.memory_used, gpu0.temperature, gpu0.power_draw_w) == (37, 1010 * MIB, 41, 120.5)
    assert gpu0.uuid == "GPU-6777fcb4-080d-bc07-9109-00000000a000" and gpu0.name == "NVIDIA H200"
    assert a.frame.host.hostname == "gpu-a" and a.frame.host.mem_total and a.frame.host.cpu_percent is not None
    assert a.frame.driver_version == "580.95.05"
    # dcgm-exporter's pod mapper labels: whose job each GPU runs.
    assert [(g.pod, g.namespace, g.container) for g in a.frame.gpus[:4]] == [("train-0", "ml", "trainer")] * 4
    assert all(g.pod is None for g in a.frame.gpus[4:])

    b = states["gpu-b"]  # targets by name; an older dcgm-exporter's `Hostname`
    assert b.state == STATE_UP and [g.utilization_gpu for g in b.frame.gpus] == [80, 5]
    assert b.frame.host.hostname == "gpu-b"

    c = states["gpu-c"]  # node_exporter down from the start; one GPU in MIG mode
    c_port = parts["dead"]["c-node"]
    assert c.state == STATE_DEGRADED and c.is_live
    assert (
        c.reason.startswith("node_exporter down (instance=127.0.0.3:%d: " % c_port) and "connection refused" in c.reason
    )
    (mig_gpu,) = c.frame.gpus
    assert mig_gpu.mig_mode is True
    assert [
        (m.gpu_instance_id, m.profile, m.memory_used, m.memory_total, m.utilization_gpu) for m in mig_gpu.mig_devices
    ] == [
        (1, "3g.40gb", 3000 * MIB, 42192 * MIB, 50.0),
        (2, "3g.40gb", 12000 * MIB, 42192 * MIB, 25.0),
    ]
    assert (mig_gpu.mig_devices[0].pod, mig_gpu.mig_devices[1].pod) == ("infer-7", None)
    assert mig_gpu.memory_used == 15000 * MIB and mig_gpu.memory_total == 2 * 42192 * MIB  # the instances', not max()
    assert c.frame.host is None  # nothing of the host is known: shown as such, not as zeros

    d = states["gpu-d"]  # both targets down from the start: a node, down, with Prometheus's words
    assert d.state == STATE_DOWN and not d.is_live
    assert "dcgm-exporter down (instance=127.0.0.4:%d: " % parts["dead"]["d-dcgm"] in d.reason
    assert "node_exporter down (instance=127.0.0.4:%d: " % parts["dead"]["d-node"] in d.reason
    assert d.reason.count("connection refused") == 2

    # gpu-a's node_exporter goes away: gpu-a is degraded and keeps its GPUs.
    parts["node_a"].stop()

    def a_degraded():
        state = {s.name: s for s in source.refresh()}["gpu-a"]
        return state if state.state == STATE_DEGRADED else None

    a = wait_for_sync(a_degraded, what="gpu-a degraded")
    assert a.reason.startswith("node_exporter down (instance=127.0.0.2:%d" % parts["node_a"].port)
    assert len(a.frame.gpus) == 8 and a.frame.gpus[0].pod == "train-0"


def test_without_the_join_the_names_say_what_was_wrong(cluster):
    """node_labels = instance only (a site whose dcgm-exporter series carry no host label it trusts):
    the join still makes one node per host from node_uname_info and the instance address."""
    prometheus, _ = cluster
    source = source_for(prometheus.url, node_labels=("instance",))
    states = wait_for_sync(
        lambda: (
            lambda s: (
                s if {"gpu-b", "gpu-d"} <= set(s) and s["gpu-b"].frame and len(s["gpu-b"].frame.gpus) == 2 else None
            )
        )({s.name: s for s in source.refresh()}),
        what="gpu-b joined by address",
    )
    assert "localhost" not in states and "127.0.0.4" not in states


def test_history_of_a_joined_node_asks_each_exporter_by_its_own_labels(cluster):
    prometheus, _ = cluster
    source = source_for(prometheus.url)
    wait_for_sync(
        lambda: (lambda s: s if "gpu-b" in s and s["gpu-b"].frame and s["gpu-b"].frame.host else None)(
            {s.name: s for s in source.refresh()}
        ),
        what="gpu-b joined",
    )
    gpu_expr, _ = source.history_query("gpu-b", 1, "utilization")
    assert 'Hostname="gpu-b"' in gpu_expr
    host_expr, _ = source.history_query("gpu-b", None, "memory_percent")
    assert 'instance=~"(localhost)(:[0-9]+)?"' in host_expr
    points = wait_for_sync(lambda: source.history_blocking("gpu-b", 1, "utilization", 30.0), what="gpu-b history")
    assert points[-1][1] == 5


async def test_a_node_named_by_its_address_is_renamed_when_its_node_exporter_says_its_name(cluster):
    import asyncio

    from opsconsole.config import DEFAULT_CONFIG
    from opsconsole.nodes.fleet import Fleet

    prometheus, parts = cluster
    source = source_for(prometheus.url)
    fleet = Fleet(replace(DEFAULT_CONFIG, nodes=()), links=[], sources=[source])
    seen: List[NodeState] = []
    await fleet.start(seen.append)
    try:

        async def until(predicate, what):
            for _ in range(400):
                if predicate(fleet.states()):
                    return fleet.states()
                await asyncio.sleep(0.1)
            raise AssertionError("gave up waiting for %s: %s" % (what, sorted(fleet.states())))

        states = await until(lambda s: "127.0.0.5" in s and s["127.0.0.5"].frame is not None, "the address node")
        assert states["127.0.0.5"].state == STATE_DEGRADED and len(states["127.0.0.5"].frame.gpus) == 1
        node_e = NodeExporter(parts["tmp"], "gpu-e", "127.0.0.5", port=parts["dead"]["e-node"])
        parts["stoppable"].append(node_e)
        states = await until(lambda s: "gpu-e" in s and s["gpu-e"].state == STATE_UP and "127.0.0.5" not in s, "gpu-e")
        assert len(states["gpu-e"].frame.gpus) == 1 and states["gpu-e"].frame.host.hostname == "gpu-e"
        gone = [s for s in seen if s.name == "127.0.0.5" and s.state == STATE_DOWN]
        assert gone and gone[-1].reason == "now shown as gpu-e (the same host)"
    finally:
        await fleet.stop()
