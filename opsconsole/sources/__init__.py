"""Telemetry sources other than SSH links (Prometheus), configured by [[sources]]."""

from __future__ import annotations

from typing import Any, List


def build_sources(config: Any) -> List[Any]:
    """One source object per [[sources]] entry of `config` (opsconsole.config.Config)."""
    sources: List[Any] = []
    for entry in getattr(config, "sources", ()):
        if entry.kind == "prometheus":
            from opsconsole.sources.prometheus import PrometheusSource

            sources.append(
                PrometheusSource(entry, interval=config.console.interval, disk_paths=config.health.disk_paths)
            )
    return sources
