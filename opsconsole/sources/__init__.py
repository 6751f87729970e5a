"""Telemetry sources other than SSH links (Prometheus), configured by [[sources]]."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Sequence

if TYPE_CHECKING:
    from opsconsole.nodes.fleet import Fleet


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


def fleet_with_sources(config: Any, links: Optional[Sequence[Any]] = None) -> "Fleet":
    """The Fleet of `config` (its nodes' links, or `links`) with the sources of its [[sources]]: how the
    commands, the report and the console build their fleet (the fleet itself imports no source)."""
    from opsconsole.nodes.fleet import Fleet

    return Fleet(config, links=links, sources=build_sources(config))
