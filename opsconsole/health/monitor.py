"""The console's health results: rules re-evaluated on each fleet change, reruns and GPU suites added.

One entry per (node, check, GPU), holding the latest result and the time it entered its
status, so "newest first" means newest change, not the tick that happened last. No
Textual here: the Health pane and the header only read it.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from opsconsole.health.result import STATUS_ERROR, STATUS_FAIL, HealthResult
from opsconsole.health.runner import evaluate_state, health_config
from opsconsole.model import STATE_CONNECTING, NodeState, frozen

Key = Tuple[str, str, Optional[int]]  # node, check, GPU

ORIGIN_RULES = "rules"  # evaluated from frames (replaced on each frame)
ORIGIN_RUN = "run"  # an on-demand run: GPU suite results stay until the next run


@frozen
class HealthEntry:
    """The latest result of one check, with when it entered its status and where it came from."""

    result: HealthResult
    since: float
    origin: str = ORIGIN_RULES

    @property
    def key(self) -> Key:
        return (self.result.node, self.result.check, self.result.gpu)


def result_key(result: HealthResult) -> Key:
    return (result.node, result.check, result.gpu)


class HealthMonitor:
    """Latest results per node and check; `observe` is cheap enough for every fleet change."""

    def __init__(self, config: Any = None, now: Callable[[], float] = time.time) -> None:
        self.config = health_config(config)
        self.now = now
        self._entries: Dict[Key, HealthEntry] = {}
        self._seen: Dict[str, Tuple[Any, str, Optional[str]]] = {}  # node -> (frame, state, reason) evaluated
        self.running: Dict[str, float] = {}  # node -> when its on-demand run started

    # --- feeding ---------------------------------------------------------------------

    def observe(self, state: NodeState) -> List[HealthResult]:
        """Re-evaluate the rules on a node's new state; returns the results whose status changed.

        Nothing is said about a node while it connects for the first time (connecting is not a
        health problem), but a node whose connects fail before any frame (down since the start)
        is a node_reachable error, as `opsconsole check` says at once; a retry (connecting again)
        keeps that result. The same frame in the same state is not evaluated twice.
        """
        if state.frame is None and state.state == STATE_CONNECTING:
            return []
        # Without a frame, a new reason (refused, then timed out) is news; with one, the frame is.
        mark = (state.frame, state.state, state.reason if state.frame is None else None)
        seen = self._seen.get(state.name)
        if seen is not None and seen[0] is mark[0] and seen[1:] == mark[1:]:
            return []
        self._seen[state.name] = mark
        results = evaluate_state(state, self.config, self.now())
        return self._replace_rules(state.name, results)

    def _replace_rules(self, node: str, results: Iterable[HealthResult]) -> List[HealthResult]:
        changed = []
        fresh = set()
        now = self.now()
        for result in results:
            key = result_key(result)
            fresh.add(key)
            old = self._entries.get(key)
            if old is not None and old.origin == ORIGIN_RUN and old.result.check.startswith("gpu_sanity"):
                continue  # never shadow a suite result (distinct check ids; kept for safety)
            if old is None or old.result.status != result.status:
                changed.append(result)
                self._entries[key] = HealthEntry(result, now, ORIGIN_RULES)
            else:
                self._entries[key] = HealthEntry(result, old.since, ORIGIN_RULES)
        for key in [
            k for k, e in self._entries.items() if k[0] == node and e.origin == ORIGIN_RULES and k not in fresh
        ]:
            del self._entries[key]  # a GPU or process that is gone takes its results along
        return changed

    def add_run(self, node: str, results: Iterable[HealthResult]) -> List[HealthResult]:
        """Results of an on-demand run of one node: rule results refresh, GPU suite results replace the last run's."""
        results = list(results)
        now = self.now()
        suite = [r for r in results if r.check.startswith("gpu_sanity")]
        rules = [r for r in results if not r.check.startswith("gpu_sanity")]
        changed = self._replace_rules(node, rules) if rules else []
        if suite:
            for key in [k for k, e in self._entries.items() if k[0] == node and e.origin == ORIGIN_RUN]:
                del self._entries[key]
            for result in suite:
                self._entries[result_key(result)] = HealthEntry(result, now, ORIGIN_RUN)
                changed.append(result)
        self.running.pop(node, None)
        return changed

    # --- reading ---------------------------------------------------------------------

    def entries(self, node: Optional[str] = None) -> List[HealthEntry]:
        """Entries of one node (None: all), newest change first; ties by node, GPU, check."""
        chosen = [e for e in self._entries.values() if node is None or e.result.node == node]
        chosen.sort(
            key=lambda e: (-e.since, e.result.node, -1 if e.result.gpu is None else e.result.gpu, e.result.check)
        )
        return chosen

    def latest(self) -> List[HealthResult]:
        """Every latest result (for incident reports)."""
        return [e.result for e in self.entries()]

    def failing(self) -> int:
        """How many checks fail now."""
        return sum(1 for e in self._entries.values() if e.result.status == STATUS_FAIL)

    def erroring(self) -> int:
        """How many checks could not judge now (a node down since the start, a suite that could not run):
        the header's badge counts them beside the failures, as the pane's status line does."""
        return sum(1 for e in self._entries.values() if e.result.status == STATUS_ERROR)

    def counts(self, node: Optional[str] = None) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for entry in self._entries.values():
            if node is None or entry.result.node == node:
                out[entry.result.status] = out.get(entry.result.status, 0) + 1
        return out
