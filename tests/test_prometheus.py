"""Prometheus as a source, end to end: a real Prometheus (Debian's /usr/bin/prometheus) on 127.0.0.1
scraping two of our exporters (separate processes, the probe over the H200 NVML replay), read back
by PrometheusSource; scrape failures and an unreachable Prometheus as node states; the fleet
merging a link's node with Prometheus's; the console showing Prometheus's GPUs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

import pytest

from opsconsole.config import DEFAULT_CONFIG, NodeConfig, SourceConfig, parse_config
from opsconsole.model import STATE_DOWN, STATE_UP, NodeFrame, from_wire
from opsconsole.sources import metric_names as names
from opsconsole.sources.prometheus import PrometheusSource
from tests.prometheus_server import Prometheus, needs_prometheus, stop_process
from tests.waiting import wait_for, wait_for_sync

ROOT = Path(__file__).resolve().parents[1]
pytestmark = needs_prometheus

# Our exporter over the H200 NVML replay, run as its own process; it also writes the frame it
# serves to FRAME_FILE after every poll, so the test knows exactly what it reported.
EXPORTER = textwrap.dedent(
    """
    import json, os, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from nvml_replay import ReplayNvml
    from opsconsole.exporter.serve import serve_probe
    from opsconsole.model import to_wire
    from opsconsole.probe.agent import Probe
    from opsconsole.probe.gpu import GpuReader

    name, gpus, frame_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    probe = Probe(node_name=name, top=0, gpu_reader=GpuReader(nvml=ReplayNvml(gpus=gpus, load=True).module))
    poll = probe.poll

    def poll_and_record():
        frame = poll()
        with open(frame_file + ".tmp", "w") as out:
            json.dump(to_wire(frame), out)
        os.replace(frame_file + ".tmp", frame_file)
        return frame

    probe.poll = poll_and_record
    serve_probe(0, interval=0.5, probe=probe, announce=lambda line: print(line, flush=True))
    """
)
STARTUP_S = 20.0  # generous: only reached when something is broken


class Exporter:
    """One exporter process serving node `name` with `gpus` replayed H200s."""

    def __init__(self, tmp: Path, name: str, gpus: int) -> None:
        self.name = name
        self.frame_file = tmp / ("%s-frame.json" % name)
        script = tmp / "exporter.py"
        script.write_text(EXPORTER.format(root=str(ROOT), tests=str(ROOT / "tests")))
        self.proc = subprocess.Popen(
            [sys.executable, str(script), name, str(gpus), str(self.frame_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        line = self.proc.stdout.readline()
        assert "serving" in line, line
        self.port = int(line.rsplit(":", 1)[1].split("/")[0])
        assert "http://127.0.0.1:%d/metrics" % self.port in line

    def frame(self) -> NodeFrame:
        return from_wire(NodeFrame, json.loads(self.frame_file.read_text()))

    def stop(self) -> None:
        stop_process(self.proc, self.proc.stdout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One Prometheus for the module (each start costs ~5 s: its discovery applies targets every 5 s)
    scraping three exporters: node-a (8 GPUs, one under load), node-b (2 GPUs) and node-c (1 GPU,
    stopped by the scrape-failure test). The last test stops Prometheus itself."""
    tmp = tmp_path_factory.mktemp("prometheus")
    exporters = []
    prometheus = None
    try:
        exporters = [Exporter(tmp, "node-a", 8), Exporter(tmp, "node-b", 2), Exporter(tmp, "node-c", 1)]
        prometheus = Prometheus(tmp, {"opsconsole": ["127.0.0.1:%d" % e.port for e in exporters]})
        yield prometheus, {e.name: e for e in exporters}
    finally:
        if prometheus is not None:
            prometheus.stop()
        for exporter in exporters:
            exporter.stop()


AB = ("node-a", "node-b")  # the nodes that stay up until Prometheus stops


def source_for(url: str, **changes) -> PrometheusSource:
    config = replace(SourceConfig(url=url, rate_window="5s", stale_after=30.0, nodes=AB), **changes)
    return PrometheusSource(config, interval=1.0)


def refresh_until_complete(source: PrometheusSource, expected: Dict[str, int]) -> Dict[str, object]:
    """Refresh until every expected node is up with its GPUs (Prometheus needs a scrape or two first)."""

    def complete():
        states = {s.name: s for s in source.refresh()}
        ok = all(
            name in states
            and states[name].state == STATE_UP
            and states[name].frame is not None
            and len(states[name].frame.gpus) == gpus
            # Prometheus's first scrape of a target may land between our parallel queries: wait for all of it.
            and all(
                g.uuid and g.utilization_gpu is not None and g.memory_used is not None and g.clock_sm_mhz is not None
                for g in states[name].frame.gpus
            )
            for name, gpus in expected.items()
        )
        return states if ok else None

    states = wait_for_sync(complete, what="both nodes up in Prometheus")
    for _ in range(max(source.slow_every, len(source.slow_parts))):  # one whole slow-tier cycle on top
        states = {s.name: s for s in source.refresh()}
    return states


# The GpuSample fields a dcgm-exporter style series carries (the rest are None in a replay or unexported).
def exported_fields() -> List[str]:
    return [attr for _, attr, _ in names.GPU_METRICS]


def test_the_source_reads_back_exactly_what_both_exporters_reported(cluster):
    prometheus, exporters = cluster
    source = source_for(prometheus.url, slow_every=1)
    states = refresh_until_complete(source, {"node-a": 8, "node-b": 2})
    for name in AB:
        reported = exporters[name].frame()
        seen = states[name].frame
        assert seen.gpu_source == "prometheus" and reported.gpu_source == "nvml"
        assert len(seen.gpus) == len(reported.gpus)
        for mine, theirs in zip(seen.gpus, reported.gpus):
            for attr in exported_fields() + [
                "index",
                "uuid",
                "name",
                "pci_bus_id",
                "clock_event_reasons",
                "compute_mode",
            ]:
                assert getattr(mine, attr) == getattr(theirs, attr), (name, mine.index, attr)
        assert seen.driver_version == reported.driver_version
        # Host fields that hold still between polls are equal too; the node's name is the Hostname label.
        assert seen.host.mem_total == reported.host.mem_total
        assert seen.host.cpu_count == reported.host.cpu_count
        assert [(d.path, d.total) for d in seen.host.disks] == [(d.path, d.total) for d in reported.host.disks]
        assert seen.host.source == "prometheus"
    # The replayed load: one process on node-a's GPU 0, with its GPU memory and SM share.
    reported_procs = exporters["node-a"].frame().processes
    seen_procs = states["node-a"].frame.processes
    assert [(p.pid, p.gpu_index, p.gpu_memory_bytes, p.gpu_sm_percent) for p in seen_procs] == [
        (p.pid, p.gpu_index, p.gpu_memory_bytes, p.gpu_sm_percent) for p in reported_procs
    ]
    assert seen_procs and seen_procs[0].gpu_uuid == states["node-a"].frame.gpus[0].uuid


def test_requests_per_refresh_do_not_depend_on_the_node_count(cluster):
    prometheus, _ = cluster
    source = source_for(prometheus.url, slow_every=6)
    refresh_until_complete(source, {"node-a": 8, "node-b": 2})

    def cycle(source):
        counts = []
        for _ in range(6):
            source.refresh()
            counts.append(source.status.requests)
        return counts

    counts = cycle(source)
    # Every refresh: up, the fast gauges (a few queries over disjoint names) and the rates; the slow
    # tier's queries are spread one per refresh over the cycle. Never a query per node or per GPU.
    every = 1 + len(source.queries_fast) + 1
    assert set(counts) <= {every, every + 1} and sum(counts) == 6 * every + len(source.slow_parts)
    limited = source_for(prometheus.url, nodes=("node-b",), slow_every=6)  # published: 1 node of 3 scraped
    states = refresh_until_complete(limited, {"node-b": 2})
    assert set(states) == {"node-b"}  # `nodes` limits what is published, not what is asked
    assert sorted(cycle(limited)) == sorted(counts)  # any six refreshes in a row hold one whole cycle


def test_history_comes_from_query_range(cluster):
    prometheus, exporters = cluster
    source = source_for(prometheus.url)
    refresh_until_complete(source, {"node-a": 8, "node-b": 2})
    power = exporters["node-a"].frame().gpus[3].power_draw_w
    points = wait_for_sync(lambda: source.history_blocking("node-a", 3, "power_w", 30) or None, what="power history")
    times = [t for t, _ in points]
    assert times == sorted(times) and all(v == power for _, v in points)
    memory = wait_for_sync(
        lambda: source.history_blocking("node-b", 1, "memory_used", 30) or None, what="memory history"
    )
    assert {v for _, v in memory} == {exporters["node-b"].frame().gpus[1].memory_used}
    util = asyncio.run(source.history("node-a", None, "gpu_utilization", 30))
    expected = sum(g.utilization_gpu for g in exporters["node-a"].frame().gpus) / 8
    assert util and all(v == pytest.approx(expected) for _, v in util)


def test_a_stopped_exporter_is_a_scrape_failure(cluster):
    prometheus, exporters = cluster
    source = source_for(prometheus.url, nodes=("node-a", "node-c"))
    before = refresh_until_complete(source, {"node-a": 8, "node-c": 1})
    exporters["node-c"].stop()

    def node_c_down():
        states = {s.name: s for s in source.refresh()}
        return states if states["node-c"].state == STATE_DOWN else None

    states = wait_for_sync(node_c_down, what="node-c's scrape to fail")
    port = exporters["node-c"].port
    # What the target was (its series said) and Prometheus's own scrape error (/api/v1/targets).
    reason = states["node-c"].reason
    assert reason.startswith("opsconsole exporter down (instance=127.0.0.1:%d: " % port), reason
    assert "127.0.0.1:%d/metrics" % port in reason, reason
    assert states["node-c"].frame == before["node-c"].frame  # the last good frame is kept
    assert states["node-a"].state == STATE_UP
    assert source.status.state == STATE_UP


async def test_fleet_mixes_a_link_node_and_prometheus_nodes_into_one_node_each(cluster):
    from opsconsole.nodes.local import LocalLink
    from opsconsole.sources import fleet_with_sources

    prometheus, exporters = cluster
    for telemetry in ("prometheus", "ssh"):
        config = replace(
            DEFAULT_CONFIG, sources=(SourceConfig(url=prometheus.url, telemetry=telemetry, stale_after=30.0, nodes=AB),)
        )
        link = LocalLink(NodeConfig(name="node-a", local=True), interval=0.5)  # the link of node-a
        fleet = fleet_with_sources(config, links=[link])  # the sources of its [[sources]], beside the link
        seen = []
        await fleet.start(seen.append)
        try:

            def ready(states):
                a, b = states.get("node-a"), states.get("node-b")
                if not (a and b and a.frame and b.frame and b.state == STATE_UP and a.state == STATE_UP):
                    return False
                return (a.frame.gpu_source == "prometheus") == (telemetry == "prometheus")

            deadline = time.monotonic() + STARTUP_S
            while not ready(fleet.states()) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            states = fleet.states()
            assert list(states) == ["node-a", "node-b"]  # one node-a, whoever reports it
            assert states["node-b"].frame.gpu_source == "prometheus"
            assert len(states["node-b"].frame.gpus) == 2
            if telemetry == "prometheus":
                assert states["node-a"].frame.gpu_source == "prometheus"
                assert len(states["node-a"].frame.gpus) == 8
            else:
                assert states["node-a"].frame.gpu_source != "prometheus"  # the link's own probe
            assert fleet.link("node-a") is link  # actions still go through the link
            totals = fleet.totals(time.time())
            assert totals.nodes == 2 and totals.sources == (("prometheus", STATE_UP, None),)
        finally:
            await fleet.stop()


async def test_console_shows_prometheus_gpus_then_prometheus_stopped_is_an_unreachable_source(cluster):
    """Last in the module: it stops the module's Prometheus."""
    from textual.widgets import DataTable

    from opsconsole.sources import fleet_with_sources
    from opsconsole.tui.app import OpsConsole

    prometheus, _ = cluster
    config = parse_config(
        '[console]\ninterval = 0.5\n[[sources]]\nurl = "%s"\nstale_after = 30.0\nnodes = ["node-a", "node-b"]\n'
        % prometheus.url,
        "test.toml",
    )
    assert config.nodes == ()  # sources and no [[nodes]]: no implicit local node
    assert config.sources[0].nodes == AB
    fleet = fleet_with_sources(config)
    app = OpsConsole(config, fleet)
    async with app.run_test(size=(160, 45)) as pilot:
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            states = fleet.states()
            if len(states) == 2 and all(
                s.state == STATE_UP and s.frame and len(s.frame.gpus) in (8, 2) for s in states.values()
            ):
                break
            await pilot.pause(0.1)
        await pilot.press("1")  # the GPUs pane
        # Made on its first show, drawn once mounted: its rows are waited for, not a fixed 0.3 s.
        tables = await wait_for(
            lambda: [t for t in app.query("#gpus-table").results(DataTable) if t.row_count == 10],
            "the GPUs pane's 10 rows",
            pilot=pilot,
        )
        table = tables[0]
        assert table.row_count == 10  # node-a's 8 GPUs and node-b's 2, all from Prometheus
        header = app.header._shown.plain
        assert "nodes 2" in header and "up 2" in header and "GPUs 10" in header

        prometheus.stop()
        source = fleet.sources[0]
        deadline = time.monotonic() + STARTUP_S
        # A stopping Prometheus may first answer 503 or drop the kept-alive connection, then refuses connections.
        seen_reasons = []
        while time.monotonic() < deadline and not (
            source.status.state == STATE_DOWN and "refused" in (source.status.reason or "").lower()
        ):
            if source.status.reason and source.status.reason not in seen_reasons:
                seen_reasons.append(source.status.reason)
            await pilot.pause(0.1)
        await pilot.pause(0.3)
        assert source.status.reason.startswith("prometheus %s: unreachable: " % prometheus.url), seen_reasons
        assert "refused" in source.status.reason.lower(), seen_reasons
        for reason in seen_reasons:  # what came before the refusal is said in words too, never a repr
            assert "RemoteDisconnected(" not in reason and "('Connection aborted." not in reason
        states = fleet.states()
        for name in AB:
            assert states[name].state == STATE_DOWN and states[name].reason == source.status.reason
            assert states[name].frame is not None and states[name].frame.gpus  # the last frame is kept
        header = app.header._shown.plain
        assert "prometheus down: prometheus %s: unreachable" % prometheus.url in header
        assert "down 2" in header


def test_a_refresh_pauses_the_cyclic_gc_and_restores_it_even_when_refreshes_overlap():
    import gc
    import threading

    from opsconsole.sources.prometheus import _gc_paused

    inside, release = threading.Event(), threading.Event()

    def long_refresh():
        with _gc_paused():
            inside.set()
            release.wait(10)

    assert gc.isenabled()
    other = threading.Thread(target=long_refresh)
    other.start()
    inside.wait(10)
    with _gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other refresh still runs
    release.set()
    other.join(10)
    assert gc.isenabled()
    gc.disable()  # someone else's choice is kept
    try:
        with _gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_hostile_sample_values_are_left_out_not_raised():
    """Prometheus answers NaN and ±Inf as values, and an exporter can put anything in a sample."""
    from opsconsole.sources.prometheus_http import parse_vector

    good = {"metric": {"instance": "gpu-a01:9400"}, "value": [1700000000.0, "42"]}
    hostile = [
        {"metric": {"instance": "nan"}, "value": [1700000000.0, "NaN"]},
        {"metric": {"instance": "inf"}, "value": [1700000000.0, "+Inf"]},
        {"metric": {"instance": "-inf"}, "value": [1700000000.0, "-Inf"]},
        {"metric": {"instance": "huge"}, "value": [1700000000.0, "1e400"]},
        {"metric": {"instance": "big"}, "value": [1700000000.0, "1e300"]},
        {"metric": {"instance": "text"}, "value": [1700000000.0, "hot"]},
        {"metric": {"instance": "short"}, "value": [1700000000.0]},
        {"metric": "not a dict", "value": [1700000000.0, "1"]},
        {"value": [1700000000.0, "1"]},
        "not an object",
    ]
    series = parse_vector({"resultType": "vector", "result": hostile + [good]})
    assert series == [({"instance": "gpu-a01:9400"}, 42.0)]
    assert parse_vector({"resultType": "scalar", "result": [1700000000.0, "+Inf"]}) == []


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_server_that_drops_the_connection_is_unreachable_in_words(how):
    """A stopping or crashed Prometheus reads the request and drops the connection; the reason
    says so in words, not as urllib3's exception repr."""
    import socket
    import struct
    import threading

    from opsconsole.sources.prometheus_http import PrometheusError, PrometheusHttp

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def drop_one():
        connection, _ = server.accept()
        # The whole request first: a reset while the client still sends its body is taken by its
        # send, and its read then sees a plain end of stream.
        request = b""
        while b"\r\n\r\n" not in request:
            request += connection.recv(65536)
        head, _, body = request.partition(b"\r\n\r\n")
        length = int(
            dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line).get(b"Content-Length", b"0")
        )
        while len(body) < length:
            body += connection.recv(65536)
        if how == "reset":  # SO_LINGER 0: close sends RST
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:  # FIN first: closing with unread bytes would send RST
            connection.shutdown(socket.SHUT_WR)
            connection.settimeout(5)
            while connection.recv(65536):
                pass
        connection.close()

    dropper = threading.Thread(target=drop_one)
    dropper.start()
    client = PrometheusHttp("http://127.0.0.1:%d" % server.getsockname()[1], timeout=5.0)
    try:
        with pytest.raises(PrometheusError) as raised:
            client.fetch_raw("/api/v1/query", {"query": "up"})
    finally:
        dropper.join(10)
        server.close()
        client.close()
    expected = {
        "close": "unreachable: connection closed without an answer",
        "reset": "unreachable: connection reset by the server",
    }[how]
    assert str(raised.value) == expected
    assert raised.value.reachable is False
