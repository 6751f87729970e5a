"""What the console keeps beside the fleet's states: history, alerts, and the recording in progress.

No widgets here: the app calls `observe()` with every state the fleet publishes and
`announce` gets each new alert event (toast, bell, hook), so panes only read.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Callable, List, Optional

from opsconsole.alerts.engine import EVENT_FIRING, AlertEngine, AlertEvent
from opsconsole.alerts.rules import rules_from_config
from opsconsole.config import Config
from opsconsole.history import History
from opsconsole.model import NodeState

if TYPE_CHECKING:
    from opsconsole.alerts.hook import HookResult
    from opsconsole.checkpoints.filesystems import FileSystems

MAX_HOOKS_IN_FLIGHT = 4  # beyond this, alerts are still shown but the hook is skipped (and that is said)


def recordings_dir(config: Config, env=os.environ) -> str:
    if config.record.directory:
        return config.record.directory
    state_home = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state_home, "opsconsole", "recordings")


class ConsoleServices:
    def __init__(self, config: Config, now: Callable[[], float] = time.time) -> None:
        self.config = config
        self.now = now
        self.history = History(config.history.size)
        self.alerts = AlertEngine(rules_from_config(config))
        self.alerts.clock = now  # silences run out on the console's clock
        self.recorder = None  # opsconsole.recording.recorder.Recorder while recording
        self._filesystems: Optional[FileSystems] = None
        self.recording_path: Optional[str] = None
        self.hook_results: List[HookResult] = []  # newest last, bounded
        self.announce: Callable[[AlertEvent], None] = lambda event: None
        self.report_problem: Callable[[str], None] = lambda message: None
        self._hooks: set = set()

    @property
    def filesystems(self) -> FileSystems:
        """One file system per node for the Checkpoints pane and the cleanup action (made when first
        asked for: a console that never shows checkpoints does not load their modules)."""
        if self._filesystems is None:
            from opsconsole.checkpoints.filesystems import FileSystems

            self._filesystems = FileSystems(timeout=self.config.ssh.connect_timeout + 30.0)
        return self._filesystems

    # --- feeding -----------------------------------------------------------

    def observe(self, state: NodeState) -> None:
        self.history.observe(state)
        if self.recorder is not None:
            try:
                self.recorder.observe(state)
            except Exception as exc:  # a full disk stops the recording, never the console
                self.report_problem("recording stopped: %s" % exc)
                self.stop_recording()
        for event in self.alerts.observe(state, self.now()):
            self.fire(event)

    def observe_health(self, results) -> None:
        for event in self.alerts.observe_health(results, self.now()):
            self.fire(event)
        if self.recorder is not None:
            from opsconsole.model import to_wire

            for result in results:
                self.recorder.event("health", result.node, to_wire(result), t=self.now())

    def observe_finding(self, finding, node: str, earlier: bool = False) -> None:
        """A log finding; `earlier` when its line was written before the console started (listed, not fired)."""
        for event in self.alerts.observe_finding(finding, node, self.now(), earlier=earlier):
            self.fire(event)
        if self.recorder is not None:
            from opsconsole.model import to_wire

            self.recorder.event("finding", node, to_wire(finding), t=self.now())

    def withdraw_finding(self, finding, node: str) -> None:
        """A finding later shown handled (its rank went on training after the exception): its alert resolves."""
        for event in self.alerts.withdraw_finding(finding, node, self.now()):
            self.fire(event)

    def fire(self, event: AlertEvent) -> None:
        if self.recorder is not None:
            self.recorder.event("alert", event.node, event.to_json(), t=event.time)
        if not self.alerts.announces(event, self.now()):
            return  # earlier than the start, acknowledged or silenced: listed in the pane, not announced
        self.announce(event)
        hook = self.config.alerting.hook
        if hook and event.state == EVENT_FIRING:
            self._start_hook(list(hook), event)

    def _start_hook(self, argv: List[str], event: AlertEvent) -> None:
        if len(self._hooks) >= MAX_HOOKS_IN_FLIGHT:
            self.report_problem("alert hook skipped for %s: %d hooks still running" % (event.rule, len(self._hooks)))
            return
        try:
            from opsconsole.alerts.hook import deliver

            task = asyncio.ensure_future(deliver(argv, event.to_json(), self.config.alerting.hook_timeout_s))
        except RuntimeError:  # no event loop (headless use): nothing to run it on
            return
        self._hooks.add(task)
        task.add_done_callback(self._hook_done)

    def _hook_done(self, task: asyncio.Task) -> None:
        self._hooks.discard(task)
        if task.cancelled():
            return
        result = task.result()
        self.hook_results.append(result)
        del self.hook_results[:-50]
        if not result.ok:
            self.report_problem("alert hook failed: " + result.message)

    # --- recording ---------------------------------------------------------

    def start_recording(self, states, path: Optional[str] = None) -> str:
        from opsconsole.recording.recorder import Recorder

        if path is None:
            directory = recordings_dir(self.config)
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, time.strftime("opsconsole-%Y%m%d-%H%M%S.opsrec", time.localtime(self.now())))
        rec = self.config.record
        self.recorder = Recorder(
            path, chunk_s=rec.chunk_s, max_bytes=int(rec.max_mb * 1024 * 1024), max_age_s=rec.max_age_s
        )
        self.recording_path = path
        for state in states.values():  # the recording opens with what the console shows now
            self.recorder.observe(state)
        return path

    def stop_recording(self) -> Optional[str]:
        recorder, self.recorder = self.recorder, None
        if recorder is None:
            return None
        try:
            recorder.close()
        except Exception as exc:
            self.report_problem("recording: %s" % exc)
        return self.recording_path

    async def close(self) -> None:
        self.stop_recording()
        for task in list(self._hooks):
            task.cancel()
