"""A hostile exporter through a real Prometheus: its frames get the checks a node's frames get.

Two dcgm-exporter pages (tests/dcgm_pages.py's exact format) served by this process and scraped
by a real Prometheus on 127.0.0.1: gpu-h1's GPU model label carries terminal escapes and one GPU
reports a NaN temperature; gpu-h2's model label is longer than the wire allows. The source must
keep gpu-h1 (escapes kept as data, drawn as visible pictures; the NaN left out) and call gpu-h2's
frame bad, as it would a node's, while keeping the other node up.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Dict

import pytest

from opsconsole.config import SourceConfig
from opsconsole.model import BAD_FRAME, STATE_DOWN, STATE_UP, NodeState
from opsconsole.sanitize import printable_line
from opsconsole.sources.prometheus import PrometheusSource
from tests.dcgm_pages import Gpu, render_page
from tests.prometheus_server import MetricsPage, Prometheus, needs_prometheus
from tests.waiting import wait_for_sync

pytestmark = needs_prometheus

ESCAPES = "\x1b]52;c;aGk=\x07\x1b[31mH200"  # an OSC 52 clipboard write and a colour, in a label
TOO_LONG = "A" * 5000  # the wire's text limit is 4,096 characters


def hostile_page(hostname: str, model: str, nan_temperature: bool = False) -> str:
    page = render_page([Gpu(0), Gpu(1)], hostname).replace('modelName="NVIDIA H200"', 'modelName="%s"' % model)
    if nan_temperature:  # GPU 0's temperature sample as NaN (the exposition format allows it)
        lines = page.splitlines()
        for i, line in enumerate(lines):
            if line.startswith('DCGM_FI_DEV_GPU_TEMP{gpu="0",'):
                lines[i] = line.rsplit(" ", 1)[0] + " NaN"
        page = "\n".join(lines) + "\n"
    return page


def test_a_hostile_exporters_frame_is_checked_like_a_nodes(tmp_path):
    # Two addresses: targets on one address are taken for one host's exporters.
    pages = [
        MetricsPage("127.0.0.2", hostile_page("gpu-h1", ESCAPES, nan_temperature=True)),
        MetricsPage("127.0.0.3", hostile_page("gpu-h2", TOO_LONG)),
    ]
    prometheus = None
    try:
        prometheus = Prometheus(tmp_path, {"dcgm-exporter": ["%s:%d" % (page.address, page.port) for page in pages]})
        source = PrometheusSource(replace(SourceConfig(url=prometheus.url, rate_window="5s", stale_after=30.0)), 1.0)

        def both_read() -> Dict[str, NodeState]:
            states = {s.name: s for s in source.refresh()}
            h1, h2 = states.get("gpu-h1"), states.get("gpu-h2")
            ready = (
                h1 is not None
                and h1.frame is not None
                and len(h1.frame.gpus) == 2
                and all(g.memory_used is not None and g.name for g in h1.frame.gpus)  # the slow tier too
                and h2 is not None
                and (h2.reason or "").startswith(BAD_FRAME)
            )
            return states if ready else {}

        states = wait_for_sync(both_read, what="both hostile nodes read from Prometheus", timeout=40)
    finally:
        if prometheus is not None:
            prometheus.stop()
        for page in pages:
            page.stop()
    h1, h2 = states["gpu-h1"], states["gpu-h2"]
    assert h1.state == STATE_UP and h1.reason is None
    gpu0, gpu1 = h1.frame.gpus
    assert gpu0.name == gpu1.name == ESCAPES  # data as it came, within the bounds
    assert "\x1b" not in printable_line(gpu0.name) and "\x07" not in printable_line(gpu0.name)  # as drawn
    assert gpu0.temperature is None and gpu1.temperature == 41  # the NaN left out, the rest kept
    assert h2.state == STATE_DOWN and h2.frame is None  # never had a good frame
    assert h2.reason == BAD_FRAME + "gpus[0].name: text longer than 4096 characters"


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
