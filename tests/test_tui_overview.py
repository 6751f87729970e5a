"""The node overview: snapshots of a replayed 8-GPU node at three terminal sizes, the drill from
Nodes with `enter`, the layout rules, and that an unchanged tick rewrites nothing.

Regenerate the snapshots after a deliberate change with
    .venv/bin/python -m pytest tests/test_tui_overview.py --snapshot-update
and read the SVGs (tests/__snapshots__/test_tui_overview/) before committing them.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable, Static
from tui_fakes import FROZEN_NOW, FakeFleet, cluster_states, single_node_states

from opsconsole.config import Config
from opsconsole.tui.app import PANES, OpsConsole
from opsconsole.tui.lines_view import LinesView, changed_runs
from opsconsole.tui.overview import gpu_layout, pack
from opsconsole.tui.replay import ReplayConsole
from tests.replayed_node import paused_replay, record_one_node
from tests.snapshot_clock import utc_clock  # noqa: F401 (autouse fixture: the clock prints UTC)
from tests.waiting import pane_shown, wait_for

TICKS = 90
SHOWN_AT_TICK = 75  # where the replay is paused for the snapshots: 75 s of history behind it


@pytest.fixture(scope="module")
def eight_gpu_recording(tmp_path_factory):
    """A recording of one 8-GPU node (frames derived from the real H200 capture), 90 s long."""
    return record_one_node(str(tmp_path_factory.mktemp("overview") / "node.opsrec"), TICKS)


def replay_console(path: str) -> ReplayConsole:
    """The replay console paused at SHOWN_AT_TICK, its history filled from the same recording."""
    return paused_replay(path, SHOWN_AT_TICK, history=True)


@pytest.mark.parametrize("size", [(80, 24), (140, 45), (200, 60)], ids=["80x24", "140x45", "200x60"])
def test_overview_of_a_replayed_8_gpu_node(snap_compare, eight_gpu_recording, size):
    assert snap_compare(replay_console(eight_gpu_recording), terminal_size=size, press=["o"])


def test_one_node_console_opens_on_its_overview(snap_compare):
    app = OpsConsole(Config(), FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)
    assert snap_compare(app, terminal_size=(140, 40))


async def test_enter_on_a_node_opens_its_overview():
    app = OpsConsole(Config(), FakeFleet(cluster_states()), now=lambda: FROZEN_NOW)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        assert app.visible_pane_id == "gpus"  # several nodes: every GPU first
        await pilot.press("4")
        # Each step waited for, not read after one pause: a pane is made on its first show, and the
        # drill, the pane switch and the redraw come as messages after the keys.
        await wait_for(lambda: pane_shown(app, "nodes"), "the Nodes pane", pilot=pilot)
        # And its rows: the pane can hold the focus before its first rows are drawn, and a `down` then
        # moves nothing (the fresh-clone CI run of 00fa31c drilled into gpu-a02).
        nodes = app.panes["nodes"].query_one(DataTable)
        await wait_for(lambda: nodes.row_count == len(cluster_states()), "the Nodes pane's rows", pilot=pilot)
        await pilot.press("down", "down", "enter")  # gpu-a03: down, its last frame kept
        await wait_for(lambda: app.node is not None and pane_shown(app, "overview"), "the drill", pilot=pilot)
        assert app.node == "gpu-a03" and app.visible_pane_id == "overview"
        pane = app.panes["overview"]
        gpus = str(pane.query_one("#overview-gpus", LinesView).render())
        assert "GPU 0" in gpus and "GPU 1" in gpus and "GPU 2" not in gpus  # its two GPUs, not gpu-a01's eight
        host = str(pane.query_one("#overview-host", LinesView).render())
        assert "host gpu-a03" in host and "down, frame 42s old" in host
        procs = pane.query_one("#overview-procs", DataTable)
        assert procs.row_count == 2  # the load process on each of its busy GPUs
        await pilot.press("escape")
        await wait_for(lambda: app.node is None and app.visible_pane_id == "nodes", "back to Nodes", pilot=pilot)
        assert app.node is None and app.visible_pane_id == "nodes"


async def test_an_unchanged_tick_rewrites_no_widget(monkeypatch):
    fleet = FakeFleet(single_node_states())
    app = OpsConsole(Config(), fleet, now=lambda: FROZEN_NOW)
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        pane = app.panes["overview"]
        assert app.visible_pane_id == "overview"
        updates = []
        original = Static.update
        monkeypatch.setattr(Static, "update", lambda self, *a, **k: (updates.append(self.id), original(self, *a, **k)))
        views = list(pane.query(LinesView)) + [app.header]
        repainted = [view.cells_repainted for view in views]
        cells_before = pane.cells_updated
        app.redraw()
        app.redraw()
        await pilot.pause()
        assert [i for i in updates if i and i.startswith("overview")] == []
        assert pane.cells_updated == cells_before
        assert [view.cells_repainted for view in views] == repainted


def test_a_changed_line_repaints_only_its_changed_cells():
    before = Text("  2026-12-02 12:34:03   newest frame 0.4s ago")
    after = Text("  2026-12-02 12:34:04   newest frame 0.4s ago")
    assert changed_runs(before, after) == [(20, 21)]
    assert changed_runs(before, before.copy()) == []
    shorter = Text("  2026-12-02 12:34:04")
    assert changed_runs(before, shorter) == [(20, len(before.plain))]  # the old tail is cleared
    restyled = before.copy()
    restyled.stylize("bold", 2, 6)
    assert changed_runs(before, restyled) == [(2, 6)]
    wide = Text("日本 12"), Text("日本 13")  # wide characters take two cells each
    assert changed_runs(*wide) == [(6, 7)]


def _screen_cells(text: str) -> list:
    cells: list = []
    for char in text:
        cells.extend([char] + [""] * (cell_len(char) - 1))  # a wide character's second cell
    return cells


def _cells_left_stale(before: str, after: str) -> list:
    """Cells that differ between the two lines on screen and that no changed run repaints."""
    runs = changed_runs(Text(before), Text(after))
    old, new = _screen_cells(before), _screen_cells(after)
    width = max(len(old), len(new))
    old += [" "] * (width - len(old))
    new += [" "] * (width - len(new))
    return [x for x in range(width) if old[x] != new[x] and not any(a <= x < b for a, b in runs)]


def test_a_change_that_moves_the_rest_of_the_line_repaints_the_rest():
    # Seen in the header: "mean util 5%" -> "100%" repainted only "100", leaving "%" and the
    # alert count where they were (the common tail had moved two cells right).
    assert _cells_left_stale("mean util 5%   alerts 0", "mean util 100%   alerts 0") == []
    assert changed_runs(Text("mean util 5%   alerts 0"), Text("mean util 100%   alerts 0")) == [(10, 25)]
    assert _cells_left_stale("mean util 100%   alerts 0", "mean util 5%   alerts 0") == []
    assert _cells_left_stale("node 日 up", "node 日日 up") == []


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet="ab 5%日", max_size=12),
    st.text(alphabet="ab 5%日", max_size=12),
    st.text(alphabet="ab 5%日", max_size=12),
)
def test_every_cell_that_differs_on_screen_is_repainted(prefix, middle, tail):
    before, after = prefix + middle + tail, prefix + middle[::-1] + "5" + tail
    assert _cells_left_stale(before, after) == []
    assert _cells_left_stale(after, before) == []


def test_layout_fits_the_height_with_the_fewest_columns():
    assert gpu_layout(8, 200, 44) == ("detailed", 1)  # 32 lines: one column, the longest history
    assert gpu_layout(8, 140, 28) == ("blocks", 1)
    assert gpu_layout(8, 200, 14) == ("blocks", 2)  # side by side only when it must
    assert gpu_layout(8, 80, 10) == ("lines", 1)  # 80x24: one line per GPU
    assert gpu_layout(8, 160, 5) == ("lines", 2)
    assert gpu_layout(1, 80, 10) == ("detailed", 1)
    assert gpu_layout(0, 80, 10) == ("lines", 1)


def test_pack_puts_items_side_by_side_and_wraps():
    items = [[("a" * 10, "")], [("b" * 10, "")], [("c" * 10, "")]]
    assert ["".join(t for t, _ in line) for line in pack(items, 25, 3, gap="  ")] == [
        "a" * 10 + "  " + "b" * 10,
        "c" * 10,
    ]
    assert len(pack(items, 25, 1, gap="  ")) == 1


def test_the_pane_registry_names_each_pane_as_its_class_does():
    for entry in PANES:
        cls = entry.load()
        assert (cls.pane_id, cls.title, cls.key) == (entry.pane_id, entry.title, entry.key)


def test_a_console_imports_only_the_pane_it_shows():
    # A fresh interpreter: the launch path of a one-node console loads the overview, not the rest.
    code = (
        "import sys; from opsconsole.tui.app import OpsConsole; "
        "print(sorted(m for m in sys.modules if m.startswith('opsconsole.tui.') and m != 'opsconsole.tui.app'))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for heavy in ("logs", "checkpoints", "health", "processes", "nodes", "cluster", "audit", "gpus"):
        assert "'opsconsole.tui.%s'" % heavy not in loaded, loaded
