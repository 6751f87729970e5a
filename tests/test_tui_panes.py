"""The Processes, Nodes and Cluster GPUs panes, each mounted alone in a tiny real Textual app."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import replace
from typing import AsyncIterator, Dict, List, Optional

import pytest
from h200_fleet import NOW, connecting_node, hung_worker, idle_gpu, load_process, loaded_gpu, three_nodes
from rich.text import Text
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widgets import DataTable

from opsconsole.config import Config, ConsoleConfig, NodeConfig
from opsconsole.model import STATE_STALE
from opsconsole.nodes.fleet import Fleet
from opsconsole.tui import formatting as fmt
from opsconsole.tui.app import OpsConsole
from opsconsole.tui.cluster import ClusterGpusPane
from opsconsole.tui.nodes import NodesPane
from opsconsole.tui.processes import ProcessesPane
from opsconsole.tui.table_diff import TableRow, apply_rows, row_keys_in_order
from tests.waiting import wait_for

SIZE = (200, 40)


class PaneApp(App):
    """Mounts one pane and records the Drill messages it posts."""

    def __init__(self, pane) -> None:
        super().__init__()
        self.pane = pane
        self.drills: List[str] = []

    def compose(self) -> ComposeResult:
        yield self.pane

    def on_nodes_pane_drill(self, message: NodesPane.Drill) -> None:
        self.drills.append(message.node)


@asynccontextmanager
async def showing(pane, filter_text: Optional[str] = None) -> AsyncIterator[Pilot]:
    """`pane` alone in an app, showing the three nodes (through the `/` filter `filter_text` when given)."""
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        pane.show(three_nodes(), None, NOW)
        if filter_text is not None:
            pane.apply_filter(filter_text)
        await pilot.pause()
        yield pilot


def keys(table: DataTable) -> List[str]:
    return row_keys_in_order(table)


def cells(table: DataTable, key: str) -> Dict[str, str]:
    """A row's cells as plain text, by column key."""
    return {column.key.value: cell.plain for column, cell in zip(table.ordered_columns, table.get_row(key))}


def styles(table: DataTable, key: str) -> Dict[str, str]:
    return {column.key.value: str(cell.style) for column, cell in zip(table.ordered_columns, table.get_row(key))}


def status_text(pane) -> str:
    return str(pane.status.render())


class Spy:
    """Counts calls to a table method (and their kwargs) while still calling it."""

    def __init__(self, monkeypatch, table: DataTable, name: str) -> None:
        self.calls: List[dict] = []
        original = getattr(table, name)

        def wrapper(*args, **kwargs):
            self.calls.append(kwargs)
            return original(*args, **kwargs)

        monkeypatch.setattr(table, name, wrapper)


async def click_header(pilot, table: DataTable, column_key: str) -> None:
    """Click the header cell of a column, as a user does, and wait for the table to be sorted by it.

    The pane sorts on the table's HeaderSelected message, a message after the click: waited for (the
    sorted column's label changes its arrow), not one pause."""

    def labels() -> List[str]:
        return [str(column.label) for column in table.ordered_columns]

    before = labels()
    x = 0
    for column in table.ordered_columns:
        if column.key.value == column_key:
            break
        x += column.get_render_width(table)
    await pilot.click(table, offset=(x + 1, 0))
    await wait_for(lambda: labels() != before, "sorted by " + column_key, pilot=pilot)


# --- formatting ---------------------------------------------------------------------------------

MIB = 1024 * 1024


@pytest.mark.parametrize(
    "func, value, expected",
    [
        (fmt.format_bytes, load_process().gpu_memory_bytes, "21 GiB"),  # 22525509632 B (opsconsole.units)
        (fmt.format_bytes, 900 * MIB, "900 MiB"),
        (fmt.format_bytes, 4096, "4.0 KiB"),
        (fmt.format_bytes, None, "N/A"),
        (fmt.format_percent, 100.0, "100%"),
        (fmt.format_percent, 0.5, "0.5%"),
        (fmt.format_percent, None, "N/A"),
        (fmt.format_temperature, idle_gpu().temperature, "39°C"),
        (fmt.format_power, loaded_gpu().power_draw_w, "692 W"),
        (fmt.format_power, 12345.0, "12.3 kW"),
        (fmt.format_age, 3.7, "3s"),
        (fmt.format_age, 150, "2m"),
        (fmt.format_age, 7200, "2h"),
        (fmt.format_age, 3 * 86400, "3d"),
        (fmt.format_age, None, "N/A"),
        (fmt.format_duration, 125, "2m05s"),
        (fmt.format_duration, 4000, "1h06m"),
        (fmt.format_ms, 0.8, "0.8 ms"),
        (fmt.format_ms, 1500, "1.5 s"),
    ],
)
def test_formatting(func, value, expected):
    assert func(value) == expected


def test_memory_pair_uses_the_unit_of_the_total():
    gpu = loaded_gpu()  # 21491 MiB of 150754820096 B
    assert fmt.format_memory_pair(gpu.memory_used, gpu.memory_total) == "21.0/140.4 GiB"
    assert fmt.format_memory_pair(512 * MIB, 800 * MIB) == "512/800 MiB"
    assert fmt.format_memory_pair(None, None) == "N/A"


# --- table_diff on its own -------------------------------------------------------------------------


class TableApp(App):
    def compose(self) -> ComposeResult:
        table: DataTable = DataTable(cursor_type="row")
        table.add_column("A", key="a")
        table.add_column("B", key="b")
        yield table


async def test_apply_rows_adds_updates_removes_reorders_and_keeps_cursor(monkeypatch):
    app = TableApp()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(DataTable)
        first = apply_rows(table, [TableRow("x", ("1", "[b]")), TableRow("y", ("2", "b")), TableRow("z", ("3", "c"))])
        assert (first.added, first.removed) == (3, 0)
        assert table.get_cell("x", "b").plain == "[b]"  # a string is never read as markup
        table.move_cursor(row=1)  # on "y"
        clear = Spy(monkeypatch, table, "clear")
        update = Spy(monkeypatch, table, "update_cell")
        second = apply_rows(table, [TableRow("z", ("3", "C")), TableRow("y", ("2", "b")), TableRow("w", ("4", "d"))])
        await pilot.pause()
        assert keys(table) == ["z", "y", "w"]
        assert (second.added, second.removed, second.updated_cells, second.reordered) == (1, 1, 1, True)
        assert table.get_cell("z", "b").plain == "C"
        assert update.calls == [{"update_width": False}]
        assert clear.calls == []
        assert table.ordered_rows[table.cursor_row].key.value == "y"
        third = apply_rows(table, [TableRow("z", ("3", "C")), TableRow("y", ("2", "b")), TableRow("w", ("4", "d"))])
        assert not third.changed


async def test_a_changed_cell_repaints_its_row_not_the_header_and_the_other_rows(monkeypatch):
    # DataTable.update_cell repaints the whole table: the overview sent its process table's header
    # (and every unchanged row) to the terminal each second, ~430 B/s of the one-GPU screen's ~2 kB.
    app = TableApp()
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one(DataTable)
        apply_rows(table, [TableRow(k, (k, "0")) for k in "xyz"])
        await pilot.pause()
        painted: list = []
        original = DataTable.refresh

        def spy(self, *regions, **options):
            if self is table:
                painted.append(regions)
            return original(self, *regions, **options)

        monkeypatch.setattr(DataTable, "refresh", spy)
        diff = apply_rows(table, [TableRow("x", ("x", "0")), TableRow("y", ("y", "1")), TableRow("z", ("z", "0"))])
        assert diff.updated_cells == 1
        assert painted and all(regions for regions in painted)  # never the whole table
        rows_painted = {(region.y, region.height) for regions in painted for region in regions}
        assert rows_painted == {(table.header_height + 1, 1)}  # y's line, below the header and x
        await pilot.pause()
        assert table.get_cell("y", "b").plain == "1" and "refresh" not in vars(table)
        # Rows added, removed or moved, or many rows changed: the whole table, as before.
        painted.clear()
        apply_rows(table, [TableRow("z", ("z", "0")), TableRow("y", ("y", "2"))])
        assert () in painted


async def test_apply_rows_sees_a_style_only_change():
    app = TableApp()
    async with app.run_test(size=SIZE):
        table = app.query_one(DataTable)
        apply_rows(table, [TableRow("x", (Text("1"), Text("up")))])
        diff = apply_rows(table, [TableRow("x", (Text("1"), Text("up", style="dim")))])
        assert diff.updated_cells == 1
        assert str(table.get_cell("x", "b").style) == "dim"


# --- Nodes pane ---------------------------------------------------------------------------------


async def test_nodes_pane_rows_and_cells():
    pane = NodesPane()
    app = PaneApp(pane)
    async with app.run_test(size=SIZE) as pilot:
        pane.show(three_nodes(), None, NOW)
        await pilot.pause()
        table = pane.tables[0].table
        assert keys(table) == ["gpu01", "gpu02", "gpu03"]
        row = cells(table, "gpu01")
        assert row["state"] == "up"
        assert row["gpus"] == "2"
        assert row["util_mean"] == "50%" and row["util_max"] == "100%"
        assert row["memory"] == "21.0/280.8 GiB"  # 21491 MiB used of 2 x 140.4 GiB
        assert row["temp"] == "59°C #0"
        assert row["power"] == "801 W"  # 692.06 + 109.19
        assert row["age"] == "1s" and row["rtt"] == "0.8 ms"
        down = cells(table, "gpu03")
        assert down["state"] == "down" and down["reason"] == "connection refused"
        assert down["temp"] == "39°C #0"  # the kept frame's values ...
        assert down["age"] == "2m" and down["rtt"] == "N/A"
        down_styles = styles(table, "gpu03")
        assert down_styles["temp"] == "dim" and down_styles["age"] == "dim"  # ... dimmed
        assert "red" in down_styles["state"]
        assert styles(table, "gpu01")["state"] == "green"
        assert styles(table, "gpu01")["temp"] == ""
        assert "3 nodes" in status_text(pane) and "2 live" in status_text(pane)


async def test_nodes_pane_state_colours():
    states = three_nodes()
    states["gpu02"] = replace(states["gpu02"], state=STATE_STALE)
    states["gpu04"] = connecting_node()
    pane = NodesPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        pane.show(states, None, NOW)
        await pilot.pause()
        table = pane.tables[0].table
        assert styles(table, "gpu02")["state"] == "yellow"
        assert styles(table, "gpu04")["state"] == "dim"
        assert cells(table, "gpu04")["gpus"] == "N/A" and cells(table, "gpu04")["age"] == "N/A"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", ["gpu01", "gpu02", "gpu03"]),
        ("state:down", ["gpu03"]),
        ("refused", ["gpu03"]),
        ("gpu02", ["gpu02"]),
        ("node:gpu0[12]", ["gpu01", "gpu02"]),
        ("util>20", ["gpu01"]),
    ],
)
async def test_nodes_pane_filter(text, expected):
    pane = NodesPane()
    async with showing(pane, text):
        assert keys(pane.tables[0].table) == expected


async def test_nodes_pane_bad_filter_term_is_shown_not_raised():
    pane = NodesPane()
    async with showing(pane, "util<abc state:up") as pilot:
        assert keys(pane.tables[0].table) == ["gpu01", "gpu02"]
        assert "'abc' is not a number" in status_text(pane)
        pane.apply_filter("")
        await pilot.pause()
        assert keys(pane.tables[0].table) == ["gpu01", "gpu02", "gpu03"]
        assert "abc" not in status_text(pane)


async def test_nodes_pane_sort_cycle_reverse_and_header_click():
    pane = NodesPane()
    async with showing(pane) as pilot:
        table = pane.tables[0].table
        await pilot.press("s")  # by name
        assert pane.tables[0].sort.column == "name"
        assert keys(table) == ["gpu01", "gpu02", "gpu03"]
        await pilot.press("r")
        assert keys(table) == ["gpu03", "gpu02", "gpu01"]
        assert "▼" in table.columns["name"].label.plain
        await pilot.press("s")  # by state: down < up
        assert pane.tables[0].sort.column == "state"
        assert keys(table) == ["gpu03", "gpu01", "gpu02"]
        await click_header(pilot, table, "age")
        assert pane.tables[0].sort.column == "age"
        assert keys(table) == ["gpu01", "gpu02", "gpu03"]  # 1s, 2s, 2m
        await click_header(pilot, table, "age")  # again: reversed
        assert keys(table) == ["gpu03", "gpu02", "gpu01"]
        await click_header(pilot, table, "rtt")  # gpu03 has no RTT: last both ways
        assert keys(table) == ["gpu01", "gpu02", "gpu03"]
        await pilot.press("r")
        assert keys(table) == ["gpu02", "gpu01", "gpu03"]
        assert "sort: RTT▼" in status_text(pane)  # the header as drawn


async def test_nodes_pane_sort_cycles_back_to_config_order():
    pane = NodesPane()
    async with showing(pane) as pilot:
        seen = []
        for _ in range(sum(1 for c in pane.tables[0].columns if c.sortable) + 1):
            await pilot.press("s")
            seen.append(pane.tables[0].sort.column)
        assert seen[:-1] == [c.key for c in pane.tables[0].columns if c.sortable]
        assert seen[-1] is None


async def test_nodes_pane_enter_posts_drill():
    pane = NodesPane()
    app = PaneApp(pane)
    async with app.run_test(size=SIZE) as pilot:
        pane.show(three_nodes(), None, NOW)
        await pilot.pause()
        await pilot.press("down", "enter")
        # The table's RowSelected, then the pane's Drill: messages after the key, waited for.
        await wait_for(lambda: app.drills, "the drill", pilot=pilot)
        assert app.drills == ["gpu02"]
        pane.apply_filter("state:down")
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(lambda: len(app.drills) > 1, "the second drill", pilot=pilot)
        assert app.drills == ["gpu02", "gpu03"]


async def test_nodes_pane_updates_in_place(monkeypatch):
    pane = NodesPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        states = three_nodes()
        pane.show(states, None, NOW)
        await pilot.pause()
        table = pane.tables[0].table
        clear = Spy(monkeypatch, table, "clear")
        update = Spy(monkeypatch, table, "update_cell")
        before = keys(table)
        # gpu01's load ends: its GPU 0 now reads as the idle capture.
        frame = replace(states["gpu01"].frame, gpus=(idle_gpu(0), idle_gpu(1)), processes=())
        states = dict(states, gpu01=replace(states["gpu01"], frame=frame, received_at=NOW))
        pane.show(states, None, NOW + 1)
        await pilot.pause()
        assert keys(table) == before
        assert cells(table, "gpu01")["util_max"] == "0%"
        assert cells(table, "gpu01")["temp"] == "39°C #0"
        assert clear.calls == []
        assert update.calls and all(call == {"update_width": False} for call in update.calls)
        assert pane.tables[0].last_diff.added == 0 and pane.tables[0].last_diff.removed == 0


async def test_nodes_pane_node_added_and_removed(monkeypatch):
    pane = NodesPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        states = three_nodes()
        pane.show(states, None, NOW)
        await pilot.pause()
        table = pane.tables[0].table
        clear = Spy(monkeypatch, table, "clear")
        table.move_cursor(row=table.get_row_index("gpu03"))
        state_width = table.columns["state"].width
        # A node joins as `connecting`, the widest state: the State column widens in place.
        states = dict(states, gpu04=connecting_node())
        del states["gpu02"]
        pane.show(states, None, NOW)
        await pilot.pause()
        assert keys(table) == ["gpu01", "gpu03", "gpu04"]
        assert clear.calls == []
        assert table.columns["state"].width > state_width and cells(table, "gpu04")["state"] == "connecting"
        assert pane.highlighted_node() == "gpu03"  # the cursor stays on its node (D and T act on it)


# --- Cluster GPUs pane -------------------------------------------------------------------------


async def test_cluster_pane_rows_and_cells():
    pane = ClusterGpusPane()
    async with showing(pane):
        table = pane.tables[0].table
        assert keys(table) == ["gpu01/0", "gpu01/1", "gpu02/0", "gpu03/0"]
        loaded = cells(table, "gpu01/0")
        assert loaded == {
            "node": "gpu01",
            "index": "0",
            "name": "NVIDIA H200",
            "util": "100%",
            "memory": "21.0/140.4 GiB",
            "mem_percent": "15%",
            "temp": "59°C",
            "power": "692/700 W",
            "users": "alice",
            "jobs": "-",
            "node_state": "up",
        }
        assert cells(table, "gpu01/1")["users"] == "-"
        assert cells(table, "gpu03/0")["node_state"] == "down 2m"
        assert styles(table, "gpu03/0")["util"] == "dim"
        assert styles(table, "gpu01/0")["util"] == ""
        assert "4 GPUs" in status_text(pane)


async def test_cluster_pane_drill_down_shows_one_node():
    pane = ClusterGpusPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        pane.show(three_nodes(), "gpu01", NOW)
        await pilot.pause()
        assert keys(pane.tables[0].table) == ["gpu01/0", "gpu01/1"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("node:gpu01", ["gpu01/0", "gpu01/1"]),
        ("user:alice", ["gpu01/0"]),
        ("util<10", ["gpu01/1", "gpu02/0", "gpu03/0"]),
        ("util>90", ["gpu01/0"]),
        ("mem>10", ["gpu01/0"]),
        ("temp>50", ["gpu01/0"]),
        ("util<10 node:gpu01", ["gpu01/1"]),
        ("gpu02", ["gpu02/0"]),
        ("down", ["gpu03/0"]),
    ],
)
async def test_cluster_pane_filter(text, expected):
    pane = ClusterGpusPane()
    async with showing(pane, text):
        assert keys(pane.tables[0].table) == expected
        assert text in status_text(pane)


async def test_cluster_pane_bad_term_message():
    pane = ClusterGpusPane()
    async with showing(pane, "util<abc"):
        assert "util<abc: 'abc' is not a number" in status_text(pane)
        assert len(keys(pane.tables[0].table)) == 4


async def test_cluster_pane_sort_and_cursor_follow_the_row():
    pane = ClusterGpusPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        states = three_nodes()
        pane.show(states, None, NOW)
        await pilot.pause()
        table = pane.tables[0].table
        await click_header(pilot, table, "util")
        assert pane.tables[0].sort.column == "util"
        assert keys(table)[0] == "gpu01/0"  # 100 % first: utilisation sorts largest first (table_pane.LARGEST_FIRST)
        await pilot.press("r")
        assert keys(table)[-1] == "gpu01/0"  # reversed: 100 % last
        await pilot.press("r")
        assert keys(table)[0] == "gpu01/0"
        await pilot.press("down")  # cursor on the second row
        under_cursor = keys(table)[table.cursor_row]
        # gpu02 takes the load: it moves to the top, the cursor stays on its row.
        frame = replace(states["gpu02"].frame, gpus=(loaded_gpu(0),))
        states = dict(states, gpu02=replace(states["gpu02"], frame=frame))
        frame1 = replace(states["gpu01"].frame, gpus=(idle_gpu(0), idle_gpu(1)))
        states["gpu01"] = replace(states["gpu01"], frame=frame1)
        pane.show(states, None, NOW)
        await pilot.pause()
        assert keys(table)[0] == "gpu02/0"
        assert keys(table)[table.cursor_row] == under_cursor


async def test_cluster_pane_updates_in_place_and_follows_nodes(monkeypatch):
    pane = ClusterGpusPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        states = three_nodes()
        pane.show(states, None, NOW)
        await pilot.pause()
        table = pane.tables[0].table
        clear = Spy(monkeypatch, table, "clear")
        update = Spy(monkeypatch, table, "update_cell")
        before = keys(table)
        frame = replace(states["gpu02"].frame, gpus=(loaded_gpu(0),))
        states = dict(states, gpu02=replace(states["gpu02"], frame=frame))
        pane.show(states, None, NOW)
        await pilot.pause()
        assert keys(table) == before
        assert cells(table, "gpu02/0")["util"] == "100%" and cells(table, "gpu02/0")["temp"] == "59°C"
        # Only the cells that changed were written: util, memory, mem%, temp, power.
        assert len(update.calls) == 5
        assert all(call == {"update_width": False} for call in update.calls)
        # A node with two GPUs joins, one leaves.
        states["gpu05"] = replace(states["gpu01"], name="gpu05", frame=replace(states["gpu01"].frame, node="gpu05"))
        del states["gpu03"]
        pane.show(states, None, NOW)
        await pilot.pause()
        assert keys(table) == ["gpu01/0", "gpu01/1", "gpu02/0", "gpu05/0", "gpu05/1"]
        assert clear.calls == []


# --- Processes pane ------------------------------------------------------------------------------


async def test_processes_pane_gpu_and_host_rows():
    pane = ProcessesPane()
    async with showing(pane):
        gpu, host = pane.gpu_table.table, pane.host_table.table
        assert keys(gpu) == ["gpu01/421@0"]
        assert cells(gpu, "gpu01/421@0") == {
            "node": "gpu01",
            "pid": "421",
            "user": "alice",
            "gpu": "0",
            "gpu_memory": "21 GiB",  # 22525509632 bytes
            "sm": "96%",
            "cpu": "99%",
            "rss": "2.0 GiB",
            "elapsed": "2m05s",
            "state": "R",
            "job": "-",  # no Slurm job, no container: the Job column says so
            "command": "python3 train.py --bf16-matmul",
        }
        assert keys(host) == ["gpu01/421", "gpu02/7001", "gpu01/501"]  # busiest first: 99 %, 87.5 %, 0 %
        assert cells(host, "gpu01/501")["command"] == "python3 train.py [dataloader worker 0]"
        assert "gpu" not in cells(host, "gpu01/501")


async def test_processes_pane_highlights_d_state():
    pane = ProcessesPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        states = three_nodes()
        pane.show(states, None, NOW)
        await pilot.pause()
        host = pane.host_table.table
        assert set(styles(host, "gpu01/501").values()) == {"bold red"}
        assert set(styles(host, "gpu01/421").values()) == {""}
        assert "1 in D/Z state" in status_text(pane)
        # The worker wakes up: the highlight goes, in place.
        frame = states["gpu01"].frame
        awake = replace(hung_worker(), state="S")
        states = dict(states, gpu01=replace(states["gpu01"], frame=replace(frame, top_processes=(awake,))))
        pane.show(states, None, NOW)
        await pilot.pause()
        assert set(styles(host, "gpu01/501").values()) == {""}


async def test_processes_pane_node_column_only_for_several_nodes():
    pane = ProcessesPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        pane.show(three_nodes(), "gpu01", NOW)
        await pilot.pause()
        gpu = pane.gpu_table.table
        assert "node" not in cells(gpu, "gpu01/421@0")
        assert keys(pane.host_table.table) == ["gpu01/421", "gpu01/501"]
        pane.show(three_nodes(), None, NOW)
        await pilot.pause()
        assert cells(gpu, "gpu01/421@0")["node"] == "gpu01"


@pytest.mark.parametrize(
    "text, gpu_keys, host_keys",
    [
        ("user:alice", ["gpu01/421@0"], ["gpu01/421", "gpu01/501"]),
        ("user:bob", [], ["gpu02/7001"]),
        ("gpu:0", ["gpu01/421@0"], []),
        ("421", ["gpu01/421@0"], ["gpu01/421"]),
        ("pid:501", [], ["gpu01/501"]),
        ("node:gpu02", [], ["gpu02/7001"]),
        ("TAR", [], ["gpu02/7001"]),
        ("state:D", [], ["gpu01/501"]),
        ("user:alice cpu>50", ["gpu01/421@0"], ["gpu01/421"]),
    ],
)
async def test_processes_pane_filter(text, gpu_keys, host_keys):
    pane = ProcessesPane()
    async with showing(pane, text):
        assert keys(pane.gpu_table.table) == gpu_keys
        assert keys(pane.host_table.table) == host_keys


async def test_processes_pane_toggle_and_sort_the_focused_table():
    pane = ProcessesPane()
    async with showing(pane) as pilot:
        gpu, host = pane.gpu_table.table, pane.host_table.table
        assert gpu.display and host.display
        await pilot.press("v")
        assert gpu.display and not host.display
        await pilot.press("v")
        assert host.display and not gpu.display
        assert pane.screen.focused is host
        assert pane.host_table.sort_label() == "CPU▼"  # busiest first until asked otherwise
        # The click lands where the layout puts the header: wait until the hidden table's space is
        # gone (under load a click right after the toggle hit the old layout, a row not the header).
        await wait_for(lambda: gpu.region.height == 0 and host.region.height > 0, "the host table alone", pilot=pilot)
        await click_header(pilot, host, "cpu")  # the sorted column again: the other way round
        assert keys(host) == ["gpu01/501", "gpu02/7001", "gpu01/421"]  # 0 %, 87.5 %, 99 %
        await pilot.press("r")
        assert keys(host) == ["gpu01/421", "gpu02/7001", "gpu01/501"]
        assert pane.gpu_table.sort.column == "gpu_memory"  # the other table keeps its own sort
        await pilot.press("s")  # next column after CPU: RSS, the largest first as CPU
        assert pane.host_table.sort.column == "rss" and pane.host_table.sort_label() == "RSS▼"
        assert keys(host) == ["gpu01/421", "gpu01/501", "gpu02/7001"]  # 2 GiB, 900 MiB, 12 MiB
        await pilot.press("v")
        assert gpu.display and host.display


async def test_processes_pane_updates_in_place(monkeypatch):
    pane = ProcessesPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        states = three_nodes()
        pane.show(states, None, NOW)
        await pilot.pause()
        gpu, host = pane.gpu_table.table, pane.host_table.table
        clears = [Spy(monkeypatch, gpu, "clear"), Spy(monkeypatch, host, "clear")]
        frame = states["gpu01"].frame
        grown = replace(frame.processes[0], gpu_memory_bytes=frame.processes[0].gpu_memory_bytes * 2)
        states = dict(states, gpu01=replace(states["gpu01"], frame=replace(frame, processes=(grown,))))
        pane.show(states, None, NOW)
        await pilot.pause()
        assert keys(gpu) == ["gpu01/421@0"]
        assert cells(gpu, "gpu01/421@0")["gpu_memory"] == "42 GiB"
        assert pane.gpu_table.last_diff.updated_cells == 1
        # gpu02 goes away: its host process row goes with it.
        del states["gpu02"]
        pane.show(states, None, NOW)
        await pilot.pause()
        assert keys(host) == ["gpu01/421", "gpu01/501"]
        assert [c.calls for c in clears] == [[], []]


async def test_processes_pane_dims_a_down_node():
    states = three_nodes()
    frame = replace(states["gpu03"].frame, processes=(load_process(),))
    states["gpu03"] = replace(states["gpu03"], frame=frame)
    pane = ProcessesPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        pane.show(states, None, NOW)
        await pilot.pause()
        assert set(styles(pane.gpu_table.table, "gpu03/421@0").values()) == {"dim"}
        assert "last frame of gpu03" in status_text(pane)


def test_pane_registry_attributes():
    assert (ProcessesPane.pane_id, ProcessesPane.title, ProcessesPane.key) == ("processes", "Processes", "2")
    assert (NodesPane.pane_id, NodesPane.title, NodesPane.key) == ("nodes", "Nodes", "4")
    assert (ClusterGpusPane.pane_id, ClusterGpusPane.title, ClusterGpusPane.key) == ("cluster", "Cluster GPUs", "5")


def test_host_process_rows_have_no_name_column_yet_the_filter_finds_the_name():
    """The Host pane's table lost its name column (the command starts with it; at 80 columns the command
    kept 6 cells): a process whose command line does not say its name is still found by it."""
    from opsconsole.model import ProcessSample
    from opsconsole.tui.bars import Palette
    from opsconsole.tui.host import PROCESS_COLUMNS, process_rows

    worker = ProcessSample(pid=4242, name="pt_data_worker", user="alice", command="python train.py", cpu_percent=0.4)
    assert [key for key, _, _ in PROCESS_COLUMNS] == [
        "pid",
        "user",
        "cpu",
        "rss",
        "threads",
        "elapsed",
        "state",
        "command",
    ]
    [row] = process_rows([worker], Palette(), False, "pt_data")
    assert [cell.plain for cell in row.cells][2] == "0.4%"  # CPU as every pane spells it (was "0.4" under "cpu%")
    assert process_rows([worker], Palette(), False, "no-such-name") == []


async def test_cluster_pane_counts_the_nodes_without_gpus():
    """A node up without a GPU is a node: `0 GPUs · 1 node without GPUs`, not `0 nodes` (it counted GPU rows)."""
    gpu02 = three_nodes()["gpu02"]
    no_gpu = replace(gpu02, frame=replace(gpu02.frame, gpus=(), processes=()))
    pane = ClusterGpusPane()
    async with PaneApp(pane).run_test(size=SIZE) as pilot:
        pane.show({"gpu02": no_gpu}, None, NOW)
        await pilot.pause()
        assert status_text(pane).startswith("0 GPUs · 1 node without GPUs · "), status_text(pane)
        pane.show(dict(three_nodes(), gpu02=no_gpu), None, NOW)
        await pilot.pause()
        assert status_text(pane).startswith("3 GPUs · 3 nodes (1 without GPUs) · "), status_text(pane)
        pane.show(dict(three_nodes(), gpu02=no_gpu), "gpu01", NOW)  # drilled into a node with GPUs
        await pilot.pause()
        assert status_text(pane).startswith("2 GPUs · 1 node · "), status_text(pane)


async def test_cluster_pane_counts_the_real_local_node(tmp_path, monkeypatch):
    """The console on this machine (its real probe): one node up, whatever its GPUs, is `1 node`."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = Config(console=ConsoleConfig(interval=0.5), nodes=(NodeConfig(name="local", local=True),))
    app = OpsConsole(config, Fleet(config))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            lambda: app.fleet.states()["local"].frame is not None, "the local node's first frame", pilot=pilot
        )
        await pilot.press("5")
        pane = app.panes["cluster"]
        gpus = len(app.fleet.states()["local"].frame.gpus)
        expected = "%s · 1 node%s · " % (fmt.counted(gpus, "GPUs"), "" if gpus else " without GPUs")
        await wait_for(lambda: status_text(pane).startswith(expected), expected, pilot=pilot)
