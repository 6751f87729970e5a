"""The probe as a Prometheus exporter: poll every interval, serve the latest frame on /metrics."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable, List, Optional, Tuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from opsconsole.exporter.collector import FrameCollector
from opsconsole.model import NodeFrame

log = logging.getLogger(__name__)

DEFAULT_BIND = "127.0.0.1"
DEFAULT_INTERVAL_S = 5.0


class ExporterError(Exception):
    """The exporter cannot start (bad address, port taken): one line for the user."""


def check_bind_address(address: str) -> str:
    """`address` if it is an IP address to listen on; ExporterError otherwise."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise ExporterError("--bind %r is not an IP address (e.g. 127.0.0.1)" % address) from None
    return address


METRICS_PATH = "/metrics"
# What `/` answers, as node_exporter's landing page does: where the metrics are.
LANDING_PAGE = (
    b"<html><head><title>opsconsole exporter</title></head><body><h1>opsconsole exporter</h1>"
    b'<p><a href="/metrics">Metrics</a></p></body></html>\n'
)
NOT_FOUND = b"404 page not found\n"  # node_exporter's (Go's) words for a path it does not serve


def routed_app(metrics_app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """A WSGI app that serves `metrics_app` on /metrics, a pointer to it on /, and 404 elsewhere.

    prometheus_client's own app answers every path with the metrics (for backwards compatibility), so a
    typo (`/metric`) or a crawler got them; node_exporter and dcgm-exporter answer /metrics only."""

    def app(environ: dict, start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == METRICS_PATH:
            return metrics_app(environ, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [LANDING_PAGE]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [NOT_FOUND]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged to stderr (prometheus_client's server does not either)."""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight does not hold the exit


def start_server(port: int, bind: str, registry: CollectorRegistry) -> Tuple[WSGIServer, threading.Thread]:
    """Listen on (bind, port) in a daemon thread; routed_app over the registry's metrics."""

    class Server(_ThreadingServer):
        address_family = socket.AF_INET6 if ipaddress.ip_address(bind).version == 6 else socket.AF_INET

    server = make_server(bind, port, routed_app(make_wsgi_app(registry)), Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="opsconsole-exporter", daemon=True)
    thread.start()
    return server, thread


class Exporter:
    """Serves `collector` over HTTP on (bind, port); `poll()` gives it fresh frames.

    The HTTP server is a threaded WSGI server over prometheus_client's app (on /metrics only): scrapes
    read the latest frame under a lock, never the probe itself.
    """

    def __init__(self, poll: Callable[[], NodeFrame], port: int, bind: str = DEFAULT_BIND) -> None:
        self.poll = poll
        self.bind = check_bind_address(bind)
        self.collector = FrameCollector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.requested_port = port
        self._server: Any = None
        self._thread: Optional[threading.Thread] = None
        self.last_error: Optional[str] = None

    @property
    def port(self) -> int:
        """The port listened on (the real one when 0 was asked for)."""
        return self._server.server_port if self._server is not None else self.requested_port

    def start(self) -> None:
        """Take the first frame, then listen (so the first scrape already has data)."""
        self.poll_once()
        try:
            self._server, self._thread = start_server(self.requested_port, self.bind, self.registry)
        except OSError as exc:
            raise ExporterError(
                "cannot listen on %s:%d: %s" % (self.bind, self.requested_port, exc.strerror or exc)
            ) from None

    def poll_once(self) -> None:
        """One probe poll into the collector; a failing poll keeps the previous frame and logs why."""
        try:
            frame = self.poll()
        except Exception as exc:
            self.last_error = "%s: %s" % (type(exc).__name__, exc)
            log.warning("probe poll failed: %s", self.last_error)
            return
        self.collector.update(frame)

    def run(self, interval: float, stop: threading.Event) -> None:
        """Poll every `interval` seconds until `stop` is set (ticks on a fixed grid; an overrun skips)."""
        from opsconsole.probe.agent import next_deadline

        deadline = time.monotonic()
        while not stop.is_set():
            deadline = next_deadline(deadline, time.monotonic(), interval)
            if stop.wait(max(0.0, deadline - time.monotonic())):
                break
            self.poll_once()

    def close(self) -> None:
        """Stop listening. Safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


def _install_stop(stop: threading.Event) -> List[Tuple[int, Any]]:
    previous = []
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is not None:
            previous.append((signum, signal.signal(signum, lambda *_: stop.set())))
    return previous


def serve_probe(
    port: int,
    bind: str = DEFAULT_BIND,
    interval: float = DEFAULT_INTERVAL_S,
    probe: Any = None,
    announce: Callable[[str], None] = print,
) -> int:
    """Run the exporter over `probe` (default: this node's Probe) until SIGTERM/SIGINT; exit status."""
    if probe is None:
        from opsconsole.probe.agent import Probe

        probe = Probe(top=0)  # the host process list is not exported
    stop = threading.Event()
    previous = _install_stop(stop)
    exporter = Exporter(probe.poll, port, bind)
    try:
        if hasattr(probe, "prime"):
            probe.prime()
        exporter.start()
        announce(
            "opsconsole exporter: serving %s on http://%s:%d/metrics every %g s"
            % (getattr(probe, "node_name", "this node"), exporter.bind, exporter.port, interval)
        )
        exporter.run(interval, stop)
        return 0
    finally:
        exporter.close()
        close = getattr(probe, "close", None)
        if close is not None:
            close()
        for signum, handler in previous:
            signal.signal(signum, handler)


__all__ = ["Exporter", "ExporterError", "serve_probe", "check_bind_address", "DEFAULT_BIND"]
