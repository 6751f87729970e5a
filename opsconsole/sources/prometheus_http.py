"""A small client for Prometheus's HTTP API (/api/v1/query, /api/v1/query_range, /api/v1/targets).

Blocking calls through one urllib3 PoolManager per server, shared by the source's query
threads: a refresh's requests reuse kept-alive connections (urllib opened a new TCP, and
TLS, connection for each of a refresh's ~12 requests). urllib3 is imported when the first
client is made, so a console without a Prometheus source never loads it (import ~60 ms here,
httpx ~110 ms). TLS is always verified: the only TLS option is a CA file to verify against.
A bearer token is read from its file when it changes, so a rotated token is picked up
without a restart.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import ssl
import urllib.parse
from typing import Any, Dict, List, Optional, Tuple

from opsconsole.units import format_bytes

Series = Tuple[Dict[str, str], float]  # (labels, value) of an instant vector
RangeSeries = Tuple[Dict[str, str], List[Tuple[float, float]]]
# Connections kept per server: the source runs at most this many requests at once.
POOL_CONNECTIONS = 8
# An answer bigger than this is no Prometheus answer we asked for (1,024 nodes: ~12 MB the biggest).
MAX_ANSWER_BYTES = 256 * 1024 * 1024


class PrometheusError(Exception):
    """Prometheus could not answer; `reachable` is False when no HTTP answer came at all."""

    def __init__(self, message: str, reachable: bool = True, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.reachable = reachable
        self.status = status


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class PrometheusHttp:
    """Talks to one Prometheus server at `url` (http:// or https://, optionally with a path prefix)."""

    def __init__(
        self,
        url: str,
        bearer_token_file: Optional[str] = None,
        ca_file: Optional[str] = None,
        timeout: float = 10.0,
        connections: int = POOL_CONNECTIONS,
    ) -> None:
        import urllib3

        self.url = url.rstrip("/")
        self.bearer_token_file = bearer_token_file
        self.timeout = timeout
        self._token: Optional[str] = None
        self._token_mtime: Optional[float] = None
        tls: Dict[str, Any] = {}
        if self.url.startswith("https://"):
            # Verification stays on; a private CA is trusted by naming its file.
            tls["ssl_context"] = ssl.create_default_context(cafile=ca_file)
        self._urllib3 = urllib3
        # block=True: a thread waits for a free connection instead of opening an extra one.
        self._pool = urllib3.PoolManager(num_pools=2, maxsize=max(1, connections), block=True, retries=False, **tls)
        self.requests = 0  # HTTP requests made (the benchmark counts them)
        self.bytes_received = 0

    @property
    def connections_opened(self) -> int:
        """TCP connections opened so far (kept-alive ones are reused by later requests)."""
        total = 0
        for key in list(self._pool.pools.keys()):
            pool = self._pool.pools.get(key)
            if pool is not None:
                total += pool.num_connections
        return total

    def close(self) -> None:
        """Close the kept-alive connections."""
        self._pool.clear()

    def _bearer_token(self) -> Optional[str]:
        path = self.bearer_token_file
        if path is None:
            return None
        try:
            mtime = os.stat(path).st_mtime
            if mtime != self._token_mtime:
                with open(path, encoding="utf-8") as handle:
                    self._token = handle.read().strip()
                self._token_mtime = mtime
        except OSError as exc:
            raise PrometheusError("bearer token file %s: %s" % (path, exc.strerror or exc)) from None
        return self._token

    def fetch_raw(self, path: str, params: Dict[str, str], method: str = "POST") -> bytes:
        """POST the form `params` to `path` (or GET with them in the URL); the body (PrometheusError on any failure)."""
        exceptions = self._urllib3.exceptions
        headers = {"Accept": "application/json"}
        token = self._bearer_token()
        if token:
            headers["Authorization"] = "Bearer " + token
        url = self.url + path
        body = None
        if method == "POST":
            body = urllib.parse.urlencode(params).encode("ascii")
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif params:
            url += "?" + urllib.parse.urlencode(params)
        self.requests += 1
        try:
            response = self._pool.request(
                method,
                url,
                body=body,
                headers=headers,
                timeout=self._urllib3.Timeout(total=self.timeout),
                preload_content=False,
                redirect=False,
            )
            try:
                data = response.read(MAX_ANSWER_BYTES + 1)
            finally:
                response.release_conn()
        except exceptions.SSLError as exc:
            reason = exc.args[0] if exc.args else exc
            detail = getattr(reason, "verify_message", None) or str(reason)
            if "CERTIFICATE_VERIFY_FAILED" in str(reason) or isinstance(reason, ssl.SSLCertVerificationError):
                text = "TLS certificate not trusted (%s); set ca_file" % detail
            else:
                text = "TLS: %s" % detail
            raise PrometheusError(_one_line("unreachable: " + text), reachable=False) from None
        except exceptions.NewConnectionError as exc:
            cause = exc.__cause__ or exc.__context__
            text = getattr(cause, "strerror", None) or str(exc).rpartition(": ")[2] or type(exc).__name__
            raise PrometheusError(_one_line("unreachable: " + text), reachable=False) from None
        except (exceptions.TimeoutError, TimeoutError):  # after NewConnectionError: urllib3 derives it from a timeout
            raise PrometheusError(
                _one_line("unreachable: timed out after %g s" % self.timeout), reachable=False
            ) from None
        except exceptions.ProtocolError as exc:  # the server dropped the connection (a stopping or crashed server)
            cause = exc.args[1] if len(exc.args) > 1 else exc
            # http.client's RemoteDisconnected (a closed connection) derives from ConnectionResetError.
            if isinstance(cause, ConnectionResetError) and not isinstance(cause, http.client.RemoteDisconnected):
                text = "connection reset by the server"
            else:
                text = "connection closed without an answer"
            raise PrometheusError(_one_line("unreachable: " + text), reachable=False) from None
        except (exceptions.HTTPError, OSError, ValueError) as exc:  # other errors, a malformed URL
            text = str(exc) or type(exc).__name__
            raise PrometheusError(_one_line("unreachable: " + text), reachable=False) from None
        if len(data) > MAX_ANSWER_BYTES:
            raise PrometheusError("answer larger than %s" % format_bytes(MAX_ANSWER_BYTES))
        self.bytes_received += len(data)
        if response.status >= 400:
            detail = ""
            try:
                detail = json.loads(data.decode("utf-8", "replace")).get("error", "")
            except (ValueError, AttributeError):
                pass
            message = "HTTP %d %s" % (response.status, response.reason or "") + (": " + str(detail) if detail else "")
            raise PrometheusError(_one_line(message), reachable=True, status=response.status)
        if 300 <= response.status < 400:
            raise PrometheusError(
                "HTTP %d: redirected (is the url the server's own?)" % response.status, status=response.status
            )
        return data

    def call(self, path: str, params: Dict[str, str], method: str = "POST") -> Any:
        """The `data` member of an API answer (PrometheusError when status is not success)."""
        raw = self.fetch_raw(path, params, method)
        try:
            answer = json.loads(raw)
        except ValueError:
            raise PrometheusError("answer is not JSON (is %s a Prometheus server?)" % self.url) from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            error = answer.get("error") if isinstance(answer, dict) else None
            raise PrometheusError(_one_line("query failed: %s" % (error or "unexpected answer")))
        return answer.get("data")

    def query(self, expr: str, at: Optional[float] = None) -> List[Series]:
        """An instant query: (labels, value) per series; NaN values are left out."""
        params = {"query": expr}
        if at is not None:
            params["time"] = "%.3f" % at
        return parse_vector(self.call("/api/v1/query", params))

    def query_range(self, expr: str, start: float, end: float, step: float) -> List[RangeSeries]:
        """A range query: (labels, [(time, value), ...]) per series."""
        params = {"query": expr, "start": "%.3f" % start, "end": "%.3f" % end, "step": "%g" % max(step, 0.001)}
        data = self.call("/api/v1/query_range", params)
        out: List[RangeSeries] = []
        for item in (data or {}).get("result", ()):
            points = []
            for point in item.get("values", ()):
                value = _usable(point)
                if value is not None:
                    points.append(value)
            out.append((item.get("metric", {}), points))
        return out

    def targets(self) -> List[Dict[str, Any]]:
        """The active scrape targets (/api/v1/targets): labels, health, lastError, lastScrape of each."""
        data = self.call("/api/v1/targets", {"state": "active"}, method="GET")
        active = data.get("activeTargets") if isinstance(data, dict) else None
        return [t for t in active if isinstance(t, dict)] if isinstance(active, list) else []


def parse_vector(data: Any) -> List[Series]:
    """The series of an instant query's `data` (a vector; a scalar becomes one unlabelled series)."""
    if not isinstance(data, dict):
        raise PrometheusError("query answer has no data")
    kind = data.get("resultType")
    result = data.get("result") or []
    if kind == "scalar":
        point = _usable(result)
        return [] if point is None else [({}, point[1])]
    if kind != "vector":
        raise PrometheusError("expected an instant vector, got %s" % kind)
    out: List[Series] = []
    for item in result:
        point = _usable(item.get("value") if isinstance(item, dict) else None)
        labels = item.get("metric") if point is not None else None
        if isinstance(labels, dict):
            out.append((labels, point[1]))
    return out


# Beyond this a reading is no GPU's or host's: it would overflow the integer fields it fills.
_LARGEST_READING = 1e18


def _usable(point: Any) -> Any:
    """(time, value) of a sample `[time, "value"]`, None when it is malformed or not a finite, sane number.

    Prometheus answers NaN, +Inf and -Inf as values ("no usable value"); an exporter can put
    anything in a sample: a series without one is left out, as a missing field is.
    """
    try:
        stamp, value = float(point[0]), float(point[1])
    except (TypeError, ValueError, IndexError, KeyError):
        return None
    if not (math.isfinite(stamp) and math.isfinite(value)) or abs(value) > _LARGEST_READING:
        return None
    return stamp, value


__all__ = ["PrometheusHttp", "PrometheusError", "parse_vector"]
