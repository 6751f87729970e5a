"""Turns readings, health results and log findings into alert events, once per change.

Each (rule, node, GPU) is a small state machine: ok -> pending (condition true since t) ->
firing (held for `for_s`) -> ok again only once the value is past the clear level. A node
that stops reporting keeps its alerts as they are: no reading is not a recovery.

An alert (rule, node, GPU) can be acknowledged (until it is un-acknowledged) or silenced until a
time: its events are still kept and listed, but are not announced (toast, bell, hook) and do not
count in the header. Findings from log lines written before the console started ("earlier") are
listed the same way: an old log file does not re-fire its alerts at every start. A finding's alert resolves when
the exception it reported is later shown handled (its rank went on training after it: withdraw_finding).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from opsconsole.alerts.rules import AlertRule, readings
from opsconsole.model import NodeState, frozen
from opsconsole.units import format_percent, format_power, format_temperature

EVENT_FIRING = "firing"
EVENT_RESOLVED = "resolved"

_HEALTH_SEVERITY = {"fail": "critical", "error": "warning"}
MAX_STANDING_FINDINGS = 10_000  # findings of one category on one node followed for withdrawal, one by one


@frozen
class AlertEvent:
    """An alert firing or resolving on a node, at a time, with what was seen."""

    time: float
    rule: str  # rule name, "health.<check>" or "finding.<category>"
    node: str
    state: str  # EVENT_FIRING or EVENT_RESOLVED
    severity: str
    message: str
    gpu: Optional[int] = None
    value: Optional[float] = None
    threshold: Optional[float] = None
    earlier: bool = False  # from a log line written before the console started: listed, never announced
    # An earlier line without a time stamp: `time` is when it was read, not when it was written.
    unstamped: bool = False

    @property
    def key(self) -> "AlertKey":
        return (self.rule, self.node, self.gpu)

    def to_json(self) -> dict:
        return {
            "time": self.time,
            "rule": self.rule,
            "node": self.node,
            "gpu": self.gpu,
            "state": self.state,
            "severity": self.severity,
            "message": self.message,
            "value": self.value,
            "threshold": self.threshold,
            "earlier": self.earlier,
            "unstamped": self.unstamped,
        }


AlertKey = Tuple[str, str, Optional[int]]  # (rule, node, GPU): what acknowledging and silencing act on


@dataclass
class _Track:
    pending_since: Optional[float] = None
    firing: bool = False


def _subject(node: str, gpu: Optional[int]) -> str:
    return node if gpu is None else "%s GPU %d" % (node, gpu)


def _number(value: float) -> str:
    return ("%.1f" % value).rstrip("0").rstrip(".")


def _reading(metric: str, value: float, limit: Optional[float] = None) -> str:
    """A metric's value as the panes spell it (opsconsole.units), with the decimals that tell it from `limit`;
    counts and flags (ECC errors, an XID, lost, unreachable) as plain numbers."""
    if metric.endswith("_percent") or metric == "gpu.utilization":
        return format_percent(value, limit=limit)
    if metric.startswith("gpu.temperature"):
        return format_temperature(value, limit=limit)
    if metric == "gpu.power_w":
        return format_power(value, limit=limit)
    return _number(value)


class AlertEngine:
    """Evaluates the rules on every observed state; keeps the firing set and a bounded history."""

    def __init__(self, rules: Sequence[AlertRule], history_size: int = 500) -> None:
        self.rules = tuple(rules)
        self.history_size = history_size
        self.history: List[AlertEvent] = []  # newest last
        self._tracks: Dict[Tuple[str, str, Optional[int]], _Track] = {}
        self._health: Dict[Tuple[str, str, Optional[int]], str] = {}
        self._findings: Dict[Tuple[str, str, Optional[str]], int] = {}
        self._earlier_findings: Set[Tuple[str, str, Optional[str]]] = set()
        # (node, category) -> the (source, line) of its findings fired on and not shown handled since: its alert is
        # withdrawn when the last of them is (withdraw_finding)
        self._standing: Dict[Tuple[str, str], Set[Tuple[Optional[str], int]]] = {}
        self.acknowledged: Set[AlertKey] = set()
        self.silenced: Dict[AlertKey, float] = {}  # key -> silenced until (epoch seconds)
        self.clock: Callable[[], float] = time.time  # the console sets its own (a replay's clock)

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
                return AlertEvent(
                    now,
                    rule.name,
                    node,
                    EVENT_RESOLVED,
                    rule.severity,
                    "%s: %s %s, back past %s"
                    % (
                        _subject(node, gpu),
                        rule.metric,
                        _reading(rule.metric, value, rule.clear_level()),
                        _reading(rule.metric, rule.clear_level()),
                    ),
                    gpu,
                    value,
                    rule.threshold,
                )
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
        return AlertEvent(
            now,
            rule.name,
            node,
            EVENT_FIRING,
            rule.severity,
            "%s: %s %s %s %s%s"
            % (
                _subject(node, gpu),
                rule.metric,
                _reading(rule.metric, value, rule.threshold),
                rule.comparison,
                _reading(rule.metric, rule.threshold),
                held,
            ),
            gpu,
            value,
            rule.threshold,
        )

    def observe_health(self, results: Iterable, now: float) -> List[AlertEvent]:
        """Health results (opsconsole.health.result.HealthResult): fail/error fire, pass resolves."""
        events = []
        for result in results:
            key = (result.check, result.node, result.gpu)
            was = self._health.get(key)
            bad = result.status in _HEALTH_SEVERITY
            if bad and was != result.status:
                events.append(
                    AlertEvent(
                        now,
                        "health." + result.check,
                        result.node,
                        EVENT_FIRING,
                        _HEALTH_SEVERITY[result.status],
                        result.message,
                        result.gpu,
                    )
                )
            elif not bad and was in _HEALTH_SEVERITY:
                events.append(
                    AlertEvent(
                        now,
                        "health." + result.check,
                        result.node,
                        EVENT_RESOLVED,
                        _HEALTH_SEVERITY[was],
                        result.message,
                        result.gpu,
                    )
                )
            self._health[key] = result.status if bad else "pass"
        return self._record(events)

    def observe_finding(self, finding, node: str, now: float, earlier: bool = False) -> List[AlertEvent]:
        """A log finding (opsconsole.diagnosis.finding.Finding): the first of its category per source fires.

        `earlier`: the line was written before the console started; it is listed once per category and
        source as an earlier event, and a new line of the same kind after the start still fires.
        """
        key = (node, finding.category, finding.source)
        where = "" if finding.rank is None else " (rank %d)" % finding.rank
        if earlier:
            if key in self._earlier_findings or key in self._findings:
                return []
            self._earlier_findings.add(key)
            return self._record(
                [
                    AlertEvent(
                        finding.time or now,
                        "finding." + finding.category,
                        node,
                        EVENT_FIRING,
                        finding.severity,
                        "%s%s: %s" % (finding.title, where, finding.excerpt[:200]),
                        earlier=True,
                        unstamped=finding.time is None,
                    )
                ]
            )
        seen = self._findings.get(key, 0)
        self._findings[key] = seen + 1
        standing = self._standing.setdefault((node, finding.category), set())
        if len(standing) < MAX_STANDING_FINDINGS:
            standing.add((finding.source, finding.line))
        else:
            standing.add((None, -1))  # too many to follow one by one: never withdrawn
        if seen:
            return []
        return self._record(
            [
                AlertEvent(
                    now,
                    "finding." + finding.category,
                    node,
                    EVENT_FIRING,
                    finding.severity,
                    "%s%s: %s" % (finding.title, where, finding.excerpt[:200]),
                )
            ]
        )

    def withdraw_finding(self, finding, node: str, now: float) -> List[AlertEvent]:
        """A finding shown handled after it fired (its rank logged further training steps, or a library said it
        recovered: Diagnoser.handled()): once no other finding of its category on `node` stands, its alert
        resolves ("handled"), and a later finding of the category fires again. A finding listed as earlier, or one
        never fired on, withdraws nothing."""
        category = finding.category
        standing = self._standing.get((node, category))
        if not standing or (finding.source, finding.line) not in standing:
            return []
        standing.discard((finding.source, finding.line))
        if standing:
            return []
        del self._standing[(node, category)]
        for key in [key for key in self._findings if key[0] == node and key[1] == category]:
            del self._findings[key]
        rule = "finding." + category
        latest = next(
            (event for event in reversed(self.history) if event.key == (rule, node, None) and not event.earlier), None
        )
        if latest is None or latest.state != EVENT_FIRING:
            return []
        where = "" if finding.rank is None else " (rank %d)" % finding.rank
        told = " (%s)" % finding.handled_by[:200] if finding.handled_by else ""
        return self._record(
            [
                AlertEvent(
                    now,
                    rule,
                    node,
                    EVENT_RESOLVED,
                    finding.severity,
                    "%s%s: handled, the rank went on after it%s" % (finding.title, where, told),
                )
            ]
        )

    # --- outputs --------------------------------------------------------------

    def _record(self, events: List[AlertEvent]) -> List[AlertEvent]:
        if events:
            self.history.extend(events)
            del self.history[: -self.history_size]
        return events

    def firing(self) -> List[AlertEvent]:
        """The alerts firing now (the latest firing event of each), newest first; earlier ones left out."""
        latest: Dict[AlertKey, AlertEvent] = {}
        for event in self.history:
            if not event.earlier:
                latest[event.key] = event
        live = [e for e in latest.values() if e.state == EVENT_FIRING]  # a finding's resolves once shown handled
        return sorted(live, key=lambda e: e.time, reverse=True)

    def counts(self) -> Dict[str, int]:
        """Firing alerts by severity that nobody acknowledged or silenced, for the header badge."""
        out: Dict[str, int] = {}
        now = self.clock()
        for event in self.firing():
            if not self.quiet_reason(event.key, now):
                out[event.severity] = out.get(event.severity, 0) + 1
        return out

    # --- acknowledging and silencing -------------------------------------------

    def acknowledge(self, key: AlertKey) -> bool:
        """Acknowledge the alert `key`, or take the acknowledgement back; True when it is acknowledged now."""
        if key in self.acknowledged:
            self.acknowledged.discard(key)
            return False
        self.acknowledged.add(key)
        return True

    def silence(self, key: AlertKey, until: Optional[float]) -> None:
        """Silence the alert `key` until `until` (epoch seconds); None lifts the silence."""
        if until is None:
            self.silenced.pop(key, None)
        else:
            self.silenced[key] = until

    def silenced_until(self, key: AlertKey, now: float) -> Optional[float]:
        until = self.silenced.get(key)
        if until is not None and until <= now:
            del self.silenced[key]  # ran out: the alert speaks again
            return None
        return until

    def quiet_reason(self, key: AlertKey, now: float) -> str:
        """Why the alert `key` is not announced: "acknowledged", "silenced", or "" when it is."""
        if key in self.acknowledged:
            return "acknowledged"
        if self.silenced_until(key, now) is not None:
            return "silenced"
        return ""

    def announces(self, event: AlertEvent, now: float) -> bool:
        """Whether `event` is announced (toast, bell, hook): not earlier, acknowledged or silenced."""
        return not event.earlier and not self.quiet_reason(event.key, now)
