"""`opsconsole snapshot` says what each Prometheus source did, beside the nodes.

A source that cannot be reached reports no node at all: `snapshot` printed nothing (and
`--json` `{"nodes": []}`) with exit 0, as if the cluster were empty. It now prints the source's
state and reason, and `--json` gains `"sources"` when the config has [[sources]]. Real parts: a
port with nothing listening, and a real Prometheus that scrapes nothing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.prometheus_server import Prometheus, needs_prometheus, run_with_config, source_config
from tests.sshd import free_port

ROOT = Path(__file__).resolve().parents[1]


def snapshot(config: Path, *args: str) -> subprocess.CompletedProcess:
    return run_with_config("snapshot", config, *args)


def test_an_unreachable_prometheus_is_said_not_an_empty_cluster(tmp_path):
    url = "http://127.0.0.1:%d" % free_port("127.0.0.1")  # nothing listens there: connection refused
    config = source_config(tmp_path, url)
    table = snapshot(config)
    assert table.returncode == 0, table.stderr
    assert table.stdout == "source down: prometheus %s: unreachable: Connection refused\n" % url
    document = json.loads(snapshot(config, "--json").stdout)
    assert document["nodes"] == []
    assert document["sources"] == [
        {
            "name": "prometheus",
            "url": url,
            "state": "down",
            "reason": "prometheus %s: unreachable: Connection refused" % url,
            "nodes": 0,
        }
    ]


@needs_prometheus
def test_a_prometheus_that_scrapes_nothing_is_up_with_no_node(tmp_path):
    prometheus = Prometheus(tmp_path, {})
    try:
        config = source_config(tmp_path, prometheus.url)
        table = snapshot(config)
        assert table.returncode == 0, table.stderr
        assert table.stdout == "source up: prometheus (%s), 0 nodes\n" % prometheus.url
        document = json.loads(snapshot(config, "--json").stdout)
        assert document["sources"][0]["state"] == "up" and document["sources"][0]["nodes"] == 0
    finally:
        prometheus.stop()


def test_without_sources_the_document_is_unchanged(tmp_path):
    config = tmp_path / "local.toml"
    config.write_text('[[nodes]]\nname = "local"\nlocal = true\n')
    document = json.loads(snapshot(config, "--json").stdout)
    assert list(document) == ["nodes"] and document["nodes"][0]["name"] == "local"
