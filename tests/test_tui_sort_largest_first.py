"""The Nodes and Cluster GPUs panes sort a busy-ness column largest first, as the Processes pane does.

The real console app over a fleet of frames from the real H200 captures (tests/h200_fleet.py: gpu01
with GPU 0 under load, gpu02 idle with one NVML error, gpu03 down): `s` reaches each column in turn, and a column of GPU
utilisation, memory, temperature, power or errors starts with its largest value (before: its smallest,
the loaded GPU last). One rule for every table pane (table_pane.LARGEST_FIRST); the other columns still
start smallest first.
"""

from __future__ import annotations

from dataclasses import replace

from h200_fleet import NOW, idle_gpu, three_nodes
from tui_fakes import FakeFleet

from opsconsole.config import Config
from opsconsole.fleet_view import GPU_SORT_KEYS, NODE_SORT_KEYS, cluster_gpu_rows, node_rows
from opsconsole.tui.app import OpsConsole
from opsconsole.tui.table_diff import row_keys_in_order
from tests.waiting import wait_for

SIZE = (200, 40)
# What a user wants largest first in each pane (the busiest, fullest, hottest, hungriest, failing first).
NODES_LARGEST_FIRST = ("util_mean", "util_max", "memory", "temp", "power", "errors")
CLUSTER_LARGEST_FIRST = ("util", "memory", "mem_percent", "temp", "power")


def non_increasing(values) -> bool:
    present = [v for v in values if v is not None]
    # A row without the value (a down node's GPU) comes last whichever way the table is sorted.
    return present == sorted(present, reverse=True) and values[: len(present)] == present


async def cycle_through(pilot, app, key: str, pane_id: str, rows_by_key, sort_keys, largest_first) -> None:
    await pilot.press(key)
    pane = app.panes[pane_id]
    table = pane.tables[0]
    await wait_for(lambda: table.table.row_count == len(rows_by_key), "the %s pane's rows" % pane_id, pilot=pilot)
    # And the pane holding the focus (a pane is focused a message after its first show): `s` is its key.
    await wait_for(
        lambda: app.focused is not None and pane in app.focused.ancestors_with_self,
        "the %s pane focused" % pane_id,
        pilot=pilot,
    )
    seen = set()
    for _ in range(len(table.sort.keys)):
        await pilot.press("s")
        column = table.sort.column
        seen.add(column)
        label = next(c.label for c in table.columns if c.key == column)
        order = row_keys_in_order(table.table)
        values = [sort_keys[column](rows_by_key[k]) for k in order]
        if column in largest_first:
            # The first press: largest first, the header and the status line's sort: say so.
            assert table.sort_label() == label + "▼", column
            assert "sort: %s▼" % label in str(pane.status.render()), column
            assert non_increasing(values), (column, order, values)
            assert values[0] is not None and values[0] > min(v for v in values if v is not None), (column, values)
        else:
            assert table.sort_label() == label + "▲", column
    assert set(largest_first) <= seen


async def test_nodes_and_cluster_sort_busy_columns_largest_first_on_the_first_press():
    states = three_nodes()
    # gpu02's GPU with one NVML error (the probe's "field: message"), so the Errors column has a largest.
    failing = replace(idle_gpu(0), errors=("power_draw_w: Unknown Error",))
    states["gpu02"] = replace(states["gpu02"], frame=replace(states["gpu02"].frame, gpus=(failing,)))
    app = OpsConsole(Config(), FakeFleet(list(states.values())), now=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        nodes = {row.key: row for row in node_rows(states, NOW)}
        await cycle_through(pilot, app, "4", "nodes", nodes, NODE_SORT_KEYS, NODES_LARGEST_FIRST)
        gpus = {row.key: row for row in cluster_gpu_rows(states)}
        await cycle_through(pilot, app, "5", "cluster", gpus, GPU_SORT_KEYS, CLUSTER_LARGEST_FIRST)
