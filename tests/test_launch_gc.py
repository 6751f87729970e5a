"""The console's launch without cyclic collections (opsconsole/launch_gc.py, issue 17): the collector is
back once the first frame with data is drawn, at once for every other command, and never switched on
where someone else had switched it off."""

from __future__ import annotations

import contextlib
import gc
import io
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states

from opsconsole import launch_gc
from opsconsole.cli import main
from opsconsole.config import Config
from opsconsole.tui.app import OpsConsole
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
SUBPROCESS_GUARD_S = 120  # only so a hang fails the test instead of blocking the run


@pytest.fixture
def collector():
    """The collector on (as pytest runs), and on again after the test whatever it did."""
    was = gc.isenabled()
    gc.enable()
    yield
    launch_gc._paused = False
    gc.unfreeze()
    if was:
        gc.enable()
    else:
        gc.disable()


def test_pause_then_resume(collector):
    launch_gc.pause()
    assert not gc.isenabled() and launch_gc.paused()
    launch_gc.resume()
    assert gc.isenabled() and not launch_gc.paused()
    assert gc.get_freeze_count() == 0  # frozen only when asked (the console's first frame)


def test_resume_with_freeze_moves_what_exists_out_of_later_collections(collector):
    launch_gc.pause()
    launch_gc.resume(freeze=True)
    assert gc.isenabled() and gc.get_freeze_count() > 0


def test_the_launchs_cycles_are_collected_before_the_freeze(collector):
    class Node:
        pass

    launch_gc.pause()
    cycle = Node()
    cycle.me = cycle  # type: ignore[attr-defined]
    gone = weakref.ref(cycle)
    del cycle
    assert gone() is not None  # no collection while paused
    launch_gc.resume(freeze=True)
    assert gone() is None  # freed, not frozen for good


def test_a_collector_switched_off_by_someone_else_stays_off(collector):
    gc.disable()
    launch_gc.pause()
    launch_gc.resume()
    assert not gc.isenabled()


def test_a_headless_command_runs_with_the_collector(collector, monkeypatch):
    seen = []
    monkeypatch.setattr("opsconsole.cli.command_snapshot", lambda args: seen.append(gc.isenabled()) or 0)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["snapshot"]) == 0
        assert main(["--version"]) == 0
    assert seen == [True]
    assert gc.isenabled()


async def test_the_console_resumes_collections_with_its_first_frame(collector):
    app = OpsConsole(Config(), FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)
    launch_gc.pause()
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_for(lambda: app._first_frame_drawn and gc.isenabled(), "collections back", pilot=pilot)
        assert not launch_gc.paused() and gc.get_freeze_count() > 0


def test_python_m_opsconsole_pauses_before_its_imports():
    # `python -m opsconsole` pauses before importing the cli; --version resumes like every command.
    code = (
        "import gc, runpy, sys\n"
        "sys.argv = ['opsconsole', '--version']\n"
        "try:\n"
        "    runpy.run_module('opsconsole', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "from opsconsole import launch_gc\n"
        "print(gc.isenabled(), launch_gc.paused())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=SUBPROCESS_GUARD_S, check=True
    ).stdout
    assert out.split()[-2:] == ["True", "False"]
