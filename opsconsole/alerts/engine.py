"""Turns readings, health results and log findings into alert events, once per change.

Each (rule, node, GPU) is a small state machine: ok -> pending (condition true since t) ->
firing (held for `for_s`) -> ok again only once the value is past the clear level. A node
that stops reporting keeps its alerts as they are: no reading is not a recovery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from opsconsole.alerts.rules import AlertRule, readings
from opsconsole.model import NodeState

EVENT_FIRING = "firing"
EVENT_RESOLVED = "resolved"

_HEALTH_SEVERITY = {"fail": "critical", "error": "warning"}


@dataclass(frozen=True)
class AlertEvent:
    time: float
    rule: str  # rule name, "health.<check>" or "finding.<category>"
    node: str
    state: str  # EVENT_FIRING or EVENT_RESOLVED
    severity: str
    message: str
    gpu: Optional[int] = None
    value: Optional[float] = None
    threshold: Optional[float] = None

    def to_json(self) -> dict:
        return {
            "time": self.time, "rule": self.rule, "node": self.node, "gpu": self.gpu, "state": self.state,
            "severity": self.severity, "message": self.message, "value": self.value, "threshold": self.threshold,
        }


@dataclass
class _Track:
    pending_since: Optional[float] = None
    firing: bool = False


def _subject(node: str, gpu: Optional[int]) -> str:
    return node if gpu is None else "%s GPU %d" % (node, gpu)


def _number(value: float) -> str:
    return ("%.1f" % value).rstrip("0").rstrip(".")


class AlertEngine:
    """Evaluates the rules on every observed state; keeps the firing set and a bounded history."""

    def __init__(self, rules: Sequence[AlertRule], history_size: int = 500) -> None:
        self.rules = tuple(rules)
        self.history_size = history_size
        self.history: List[AlertEvent] = []  # newest last
        self._tracks: Dict[Tuple[str, str, Optional[int]], _Track] = {}
        self._health: Dict[Tuple[str, str, Optional[int]], str] = {}
        self._findings: Dict[Tuple[str, str, Optional[str]], int] = {}

    # --- inputs ---------------------------------------------------------------

    def observe(self, state: NodeState, now: float) -> List[AlertEvent]:
        """New events from one node's state."""
        events: List[AlertEvent] = []
        for rule in self.rules:
            for gpu, value in readings(rule, state):
                if value is None:
                    continue
                event = self._step(rule, state.name, gpu, value, now)
                if event is not None:
                    events.append(event)
        return self._record(events)

    def _step(self, rule: AlertRule, node: str, gpu: Optional[int], value: float, now: float) -> Optional[AlertEvent]:
        key = (rule.name, node, gpu)
        track = self._tracks.setdefault(key, _Track())
        if track.firing:
            if rule.cleared(value):
                track.firing = False
                track.pending_since = None
                return AlertEvent(now, rule.name, node, EVENT_RESOLVED, rule.severity,
                                  "%s: %s %s, back past %s" % (_subject(node, gpu), rule.metric, _number(value),
                                                               _number(rule.clear_level())),
                                  gpu, value, rule.threshold)
            return None
        if not rule.holds(value):
            track.pending_since = None
            return None
        if track.pending_since is None:
            track.pending_since = now
        if now - track.pending_since < rule.for_s:
            return None
        track.firing = True
        held = " for %ds" % round(now - track.pending_since) if rule.for_s else ""
        return AlertEvent(now, rule.name, node, EVENT_FIRING, rule.severity,
                          "%s: %s %s %s %s%s" % (_subject(node, gpu), rule.metric, _number(value), rule.comparison,
                                                 _number(rule.threshold), held),
                          gpu, value, rule.threshold)

    def observe_health(self, results: Iterable, now: float) -> List[AlertEvent]:
        """Health results (opsconsole.health.result.HealthResult): fail/error fire, pass resolves."""
        events = []
        for result in results:
            key = (result.check, result.node, result.gpu)
            was = self._health.get(key)
            bad = result.status in _HEALTH_SEVERITY
            if bad and was != result.status:
                events.append(AlertEvent(now, "health." + result.check, result.node, EVENT_FIRING,
                                         _HEALTH_SEVERITY[result.status], result.message, result.gpu))
            elif not bad and was in _HEALTH_SEVERITY:
                events.append(AlertEvent(now, "health." + result.check, result.node, EVENT_RESOLVED,
                                         _HEALTH_SEVERITY[was], result.message, result.gpu))
            self._health[key] = result.status if bad else "pass"
        return self._record(events)

    def observe_finding(self, finding, node: str, now: float) -> List[AlertEvent]:
        """A log finding (opsconsole.diagnosis.finding.Finding): the first of its category per source fires."""
        key = (node, finding.category, finding.source)
        seen = self._findings.get(key, 0)
        self._findings[key] = seen + 1
        if seen:
            return []
        where = "" if finding.rank is None else " (rank %d)" % finding.rank
        return self._record([AlertEvent(now, "finding." + finding.category, node, EVENT_FIRING,
                                        finding.severity, "%s%s: %s" % (finding.title, where, finding.excerpt[:200]))])

    # --- outputs --------------------------------------------------------------

    def _record(self, events: List[AlertEvent]) -> List[AlertEvent]:
        if events:
            self.history.extend(events)
            del self.history[:-self.history_size]
        return events

    def firing(self) -> List[AlertEvent]:
        """The alerts firing now (the latest firing event of each), newest first."""
        latest: Dict[Tuple[str, str, Optional[int]], AlertEvent] = {}
        for event in self.history:
            latest[(event.rule, event.node, event.gpu)] = event
        live = [e for e in latest.values() if e.state == EVENT_FIRING and not e.rule.startswith("finding.")]
        live += [e for e in latest.values() if e.rule.startswith("finding.")]
        return sorted(live, key=lambda e: e.time, reverse=True)

    def counts(self) -> Dict[str, int]:
        """Firing alerts by severity, for the header badge."""
        out: Dict[str, int] = {}
        for event in self.firing():
            out[event.severity] = out.get(event.severity, 0) + 1
        return out
