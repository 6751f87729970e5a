"""SVG snapshots of the panes tests/test_tui_snapshots.py does not draw: Checkpoints, Health, Alerts and
Audit, each at one size, on fixed data (captured frames, files written with fixed contents and times)
and a frozen clock. With test_tui_snapshots.py, test_tui_overview.py and test_tui_logs_snapshot.py every
pane of the registry (opsconsole.tui.app.PANES) has one.

Regenerate after a deliberate change with:
    .venv/bin/python -m pytest tests/test_tui_pane_snapshots.py --snapshot-update
and read the SVGs (tests/__snapshots__/test_tui_pane_snapshots/) before committing them.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from tui_fakes import FROZEN_NOW, FakeFleet, ThisMachineFleet, single_node_states  # noqa: E402

from opsconsole.config import ActionsConfig, CheckpointDirConfig, Config, ConsoleConfig  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402
from tests.snapshot_clock import utc_clock  # noqa: F401 (autouse fixture: the clock prints UTC)
from tests.waiting import wait_for  # noqa: E402

SIZE = (140, 40)


def hot(states, gpu_index: int = 1, temperature: float = 91.0):
    """The captured node with GPU `gpu_index` over the 85 °C limit: a health failure and a firing alert."""
    first = states[0]
    gpus = tuple(replace(g, temperature=temperature) if g.index == gpu_index else g for g in first.frame.gpus)
    return [replace(first, frame=replace(first.frame, gpus=gpus, seq=first.frame.seq + 1))] + list(states[1:])


def console(states, config: Config = Config(), fleet_class=FakeFleet) -> OpsConsole:
    return OpsConsole(config, fleet_class(states), now=lambda: FROZEN_NOW)


def test_health_pane(snap_compare):
    async def run_before(pilot) -> None:
        await pilot.press("8")
        await wait_for(lambda: pilot.app.health.failing() == 1, "the hot GPU's health failure", pilot=pilot)
        pilot.app.clear_notifications()  # the failure's alert toast: its timing is not what this snapshot is about
        await pilot.pause()

    assert snap_compare(console(hot(single_node_states())), terminal_size=SIZE, run_before=run_before)


def test_alerts_pane(snap_compare):
    async def run_before(pilot) -> None:
        await pilot.press("9")
        await wait_for(lambda: pilot.app.services.alerts.history, "the temperature alert to fire", pilot=pilot)
        pilot.app.clear_notifications()  # the alert's toast: its timing is not what this snapshot is about
        await pilot.pause()

    assert snap_compare(console(hot(single_node_states())), terminal_size=SIZE, run_before=run_before)


# Two actions as the audit log keeps them (one record shape, actions/audit.py), with fixed user and host.
AUDIT_RECORDS = [
    {
        "time": "2026-12-02T09:10:00.000+00:00",
        "user": "alice",
        "host": "login-1",
        "action": "signal",
        "node": "gpu-a01",
        "detail": "SIGTERM to pid 4242 (python train.py)",
        "outcome": "attempt",
        "target": "pid 4242",
        "command": ["kill", "-TERM", "4242"],
        "id": "a1",
    },
    {
        "time": "2026-12-02T09:10:01.250+00:00",
        "user": "alice",
        "host": "login-1",
        "action": "signal",
        "node": "gpu-a01",
        "detail": "SIGTERM to pid 4242 (python train.py)",
        "outcome": "ok",
        "target": "pid 4242",
        "command": ["kill", "-TERM", "4242"],
        "id": "a1",
        "result": {"exit_status": 0, "duration_s": 0.08},
    },
    {
        "time": "2026-12-02T09:12:30.000+00:00",
        "user": "bob",
        "host": "login-1",
        "action": "gpu_reset",
        "node": "gpu-a02",
        "detail": "reset GPU 3: refused, processes still on it",
        "outcome": "refused",
        "target": "GPU 3",
        "command": [],
        "id": "b2",
    },
]


def test_audit_pane(snap_compare, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the pane's status line shows the log's path: a relative one is the same every run
    Path("audit.log").write_text("".join(json.dumps(record) + "\n" for record in AUDIT_RECORDS))
    config = Config(actions=ActionsConfig(audit_log="audit.log"))
    assert snap_compare(console(single_node_states(), config), terminal_size=SIZE, press=["0"])


def test_checkpoints_pane(snap_compare, tmp_path, monkeypatch):
    from opsconsole.checkpoints.access import LocalFileSystem
    from tests.checkpoint_writers import set_mtime, write_seed_layout

    # The free space of this machine's disk changes from run to run: the snapshot's disk is 2 TiB, 1.5 free.
    monkeypatch.setattr(LocalFileSystem, "statvfs", lambda self, path: (3 << 39, 1 << 41))
    monkeypatch.chdir(tmp_path)  # the pane shows the directory as configured: relative, the same every run
    paths = write_seed_layout(Path("ckpts"))  # real torch checkpoints; losses 0.9 0.5 0.7 0.6 0.65
    newest = FROZEN_NOW - 3600
    for epoch, path in paths.items():
        set_mtime(path, newest - 60 * (len(paths) - 1 - epoch))
    set_mtime(Path("ckpts/checkpoint_best.pt"), newest - 60 * 3)  # a copy of epoch 1's
    config = Config(
        console=ConsoleConfig(read_only=True),
        checkpoints=(CheckpointDirConfig(path="ckpts", keep=2, min_age=600),),
        actions=ActionsConfig(audit_log="audit.log"),
    )
    app = console(single_node_states(), config, fleet_class=ThisMachineFleet)

    async def run_before(pilot) -> None:
        await pilot.press("7")
        pane = app.panes["checkpoints"]
        await wait_for(
            lambda: pane.checkpoint_table.table.row_count == 6, "the scan to list 6 checkpoints", pilot=pilot
        )
        await pilot.pause()

    assert snap_compare(app, terminal_size=(170, 40), run_before=run_before)
