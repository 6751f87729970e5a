"""A small client for Prometheus's HTTP API (/api/v1/query, /api/v1/query_range), stdlib only.

Blocking calls (urllib); the source runs them in a worker thread. TLS is always verified:
the only TLS option is a CA file to verify against. A bearer token is read from its file
when it changes, so a rotated token is picked up without a restart.
"""

from __future__ import annotations

import json
import math
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

Series = Tuple[Dict[str, str], float]  # (labels, value) of an instant vector
RangeSeries = Tuple[Dict[str, str], List[Tuple[float, float]]]


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
    ) -> None:
        self.url = url.rstrip("/")
        self.bearer_token_file = bearer_token_file
        self.timeout = timeout
        self._token: Optional[str] = None
        self._token_mtime: Optional[float] = None
        self._ssl: Optional[ssl.SSLContext] = None
        if self.url.startswith("https://"):
            # Verification stays on; a private CA is trusted by naming its file.
            self._ssl = ssl.create_default_context(cafile=ca_file)
        self.requests = 0  # HTTP requests made (the benchmark counts them)
        self.bytes_received = 0

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

    def fetch_raw(self, path: str, params: Dict[str, str]) -> bytes:
        """POST the form `params` to `path`; the response body (PrometheusError on any failure)."""
        body = urllib.parse.urlencode(params).encode("ascii")
        request = urllib.request.Request(self.url + path, data=body, method="POST")
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
        request.add_header("Accept", "application/json")
        token = self._bearer_token()
        if token:
            request.add_header("Authorization", "Bearer " + token)
        self.requests += 1
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self._ssl) as response:
                data = response.read()
        except urllib.error.HTTPError as exc:
            detail = ""
            try:
                detail = json.loads(exc.read().decode("utf-8", "replace")).get("error", "")
            except (ValueError, AttributeError, OSError):
                pass
            message = "HTTP %d %s" % (exc.code, exc.reason) + (": " + detail if detail else "")
            raise PrometheusError(_one_line(message), reachable=True, status=exc.code) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLCertVerificationError):
                text = "TLS certificate not trusted (%s); set ca_file" % (reason.verify_message or reason)
            elif isinstance(reason, OSError) and reason.strerror:
                text = reason.strerror
            else:
                text = str(reason)
            raise PrometheusError(_one_line("unreachable: " + text), reachable=False) from None
        except (OSError, ValueError) as exc:  # timeouts, resets, a malformed URL
            text = "timed out after %g s" % self.timeout if "timed out" in str(exc) else str(exc) or type(exc).__name__
            raise PrometheusError(_one_line("unreachable: " + text), reachable=False) from None
        self.bytes_received += len(data)
        return data

    def call(self, path: str, params: Dict[str, str]) -> Any:
        """The `data` member of an API answer (PrometheusError when status is not success)."""
        raw = self.fetch_raw(path, params)
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
