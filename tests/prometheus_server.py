"""A real Prometheus on 127.0.0.1 for the tests (Debian's /usr/bin/prometheus): a temp config and data
dir, scraping every 500 ms; and the helpers its tests share (a free port, an HTTP page that answers,
stopping a server process, a /metrics page served by a thread). Used by tests/test_prometheus.py,
tests/test_prometheus_cluster.py and tests/test_prometheus_hostile.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Dict, List, Optional

import pytest

from tests.sshd import free_port
from tests.waiting import wait_for_sync

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
needs_prometheus = pytest.mark.skipif(
    not os.access(PROMETHEUS, os.X_OK), reason="prometheus not installed (apt-get install prometheus)"
)


class MetricsPage:
    """One /metrics page (`text`, Prometheus' text format) served on (address, a free port) by a thread here."""

    def __init__(self, address: str, text: str) -> None:
        body = text.encode("utf-8")

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.address = address
        self.server = ThreadingHTTPServer((address, 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def answers(url: str) -> bool:
    """Whether `url` answers 200 within a second."""
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return answer.status == 200
    except OSError:
        return False


def stop_process(proc: subprocess.Popen, log: Optional[IO] = None, sig: int = signal.SIGTERM) -> None:
    """Stop a server process this test started (`sig`, then SIGKILL after 10 s) and close its log."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if log is not None:
        log.close()


class Prometheus:
    """Prometheus on 127.0.0.1:<free port> scraping `jobs` (job name -> its "host:port" targets)."""

    def __init__(self, tmp: Path, jobs: Dict[str, List[str]], scrape_timeout: Optional[str] = None) -> None:
        self.port = free_port("127.0.0.1")
        self.url = "http://127.0.0.1:%d" % self.port
        config = tmp / "prometheus.yml"
        timeout = ", scrape_timeout: %s" % scrape_timeout if scrape_timeout else ""
        lines = ["global: {scrape_interval: 500ms%s, evaluation_interval: 1s}" % timeout, "scrape_configs:"]
        for job, targets in jobs.items():
            lines += [
                "- job_name: %s" % job,
                "  static_configs: [{targets: [%s]}]" % ", ".join("'%s'" % t for t in targets),
            ]
        config.write_text("\n".join(lines) + "\n")
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                "--config.file=%s" % config,
                "--storage.tsdb.path=%s" % (tmp / "data"),
                "--web.listen-address=127.0.0.1:%d" % self.port,
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_for_sync(lambda: answers(self.url + "/-/ready"), what="prometheus /-/ready")

    def stop(self) -> None:
        stop_process(self.proc, self.log)


def source_config(tmp_path: Path, url: str) -> Path:
    """A config with one Prometheus [[sources]] entry at `url`."""
    path = tmp_path / "prom.toml"
    path.write_text('[[sources]]\nkind = "prometheus"\nurl = "%s"\n' % url)
    return path


def run_with_config(command: str, config: Path, *args: str) -> subprocess.CompletedProcess:
    """`opsconsole COMMAND --config CONFIG --timeout 5 ARGS` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "opsconsole", command, "--config", str(config), "--timeout", "5", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
