"""`opsconsole check` says how each Prometheus source answered.

A source that cannot be reached reports no node, and `check` printed `0 checks on 0 node(s): 0 fail,
0 error, 0 warn, 0 pass` with exit 2 and no word of why. Each [[sources]] entry is now a
`source_reachable` result: error with the source's reason when it did not answer, warn when it
answered with no node; exit 2 while no node was checked. Real parts: a port with nothing
listening, and a real Prometheus that scrapes nothing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.prometheus_server import Prometheus, needs_prometheus, run_with_config, source_config
from tests.sshd import free_port

ROOT = Path(__file__).resolve().parents[1]


def check(config: Path, *args: str) -> subprocess.CompletedProcess:
    return run_with_config("check", config, *args)


def test_an_unreachable_prometheus_is_an_error_with_its_reason(tmp_path):
    url = "http://127.0.0.1:%d" % free_port("127.0.0.1")  # nothing listens there
    config = source_config(tmp_path, url)
    done = check(config)
    assert done.returncode == 2, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["ERROR", "prometheus", "source_reachable"]
    assert lines[0].endswith("down: prometheus %s: unreachable: Connection refused" % url)
    assert lines[1].startswith("      remedy: check the source's url")
    assert lines[-1] == "1 checks on 0 node(s): 0 fail, 1 error, 0 warn, 0 pass"
    result = json.loads(check(config, "--json").stdout)["results"]
    assert [(r["check"], r["node"], r["status"]) for r in result] == [("source_reachable", "prometheus", "error")]
    assert result[0]["evidence"] == {"url": url, "state": "down", "nodes": 0}


@needs_prometheus
def test_a_prometheus_with_no_target_is_a_warning_and_no_node_passes(tmp_path):
    prometheus = Prometheus(tmp_path, {})
    try:
        done = check(source_config(tmp_path, prometheus.url))
        assert done.returncode == 2, done.stdout + done.stderr  # nothing was checked
        assert done.stdout.splitlines()[0].endswith("up at %s, but reports no node (no scrape target)" % prometheus.url)
    finally:
        prometheus.stop()
