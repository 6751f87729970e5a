"""Every pane spells each quantity through opsconsole.units: the guard against a pane formatting one on its own.

Two checks. The source: no string in the panes (opsconsole/tui) or in what the commands print pairs a
printf number with a unit ('%dW', '%.1f%%', '%d MiB', '%dMHz'); a quantity is spelled by
opsconsole.units alone. The screen: the replayed 8-GPU node drawn in the real console at 80x24,
140x45 and 200x60, every pane visited; each table cell that holds a quantity matches the units
module's spelling of it, the same column has the same header in every pane, the overview's free
text has no unit glued to its number ('633W', '1.0/140.4G', '1980MHz'), and each GPU's power,
temperature and memory read the same in every pane that shows them (the GPUs pane once said 581 W
where Cluster GPUs said 582).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List

import pytest
from textual.widgets import DataTable

from opsconsole import units
from opsconsole.tui.replay import ReplayConsole
from tests.replayed_node import paused_replay, record_one_node
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent / "opsconsole"
# What prints quantities to a person: the panes, and the commands' text.
SPELLERS = (
    sorted(ROOT.glob("tui/*.py"))
    + sorted(ROOT.glob("commands/*.py"))
    + [
        ROOT / "snapshot_format.py",
        ROOT / "report" / "builder.py",
        ROOT / "health" / "rules.py",
        ROOT / "health" / "telemetry.py",
        ROOT / "alerts" / "engine.py",
        ROOT / "actions" / "registry.py",
    ]
)
# A printf conversion with a unit after it: '%d%%', '%.1f GiB', '%dW', '%d °C', '%sMHz'.
PRINTF_WITH_UNIT = re.compile(r"%[-+ 0#]*\d*(?:\.\d+)?[dfgis](?:%%| ?(?:°C|k?W\b|MHz|[KMGTP]i?B\b|[KMGTP]i?B/s))")


def test_no_pane_or_command_spells_a_quantity_itself():
    found = []
    for path in SPELLERS:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and PRINTF_WITH_UNIT.search(node.value):
                found.append("%s:%d: %r" % (path.relative_to(ROOT.parent), node.lineno, node.value))
    assert not found, "format these with opsconsole.units:\n" + "\n".join(found)


def test_the_source_check_finds_what_it_is_for():
    for text in ("%dW", "%d W", "%.1f%%", "%d MiB", "%dMHz", "%s°C", "%d GB"):
        assert PRINTF_WITH_UNIT.search(text), text
    for text in ("%d of %d", "%s (%d chunks, %s)", "GPU %d at %s", "within %g s"):
        assert not PRINTF_WITH_UNIT.search(text), text


# --- the screen ------------------------------------------------------------------------------------

BAR = "".join(chr(c) for c in range(0x2581, 0x2590)) + "·▏ "  # bars and sparklines before a reading
NA = re.escape(units.NA)
PERCENT = r"\d+%|\d\.\d%"
SIZE = r"\d+ B|\d\.\d [KMGTP]iB|\d+ [KMGTP]iB"
MEMORY_PAIR = r"\d+\.\d/\d+\.\d GiB|\d+/\d+ MiB"
POWER = r"\d+ W|\d+\.\d kW"
TEMPERATURE = r"\d+°C"
DURATION = r"\d+s|\d+m\d\ds|\d+h\d\dm|\d+d\d\dh"
SPELLINGS = {  # column key -> what opsconsole.units writes there (N/A or "-" for a missing reading)
    "util": PERCENT,
    "util_mean": PERCENT,
    "util_max": PERCENT,
    "mem_percent": PERCENT,
    "sm": PERCENT,  # a process's share of the SMs
    "sm_clock": r"\d+ MHz",
    "cpu": PERCENT,
    "fan": PERCENT,
    "memory": MEMORY_PAIR,
    "gpu_memory": SIZE,
    "rss": SIZE,
    "power": POWER + r"|\d+/\d+ W",
    "temp": TEMPERATURE + r"|\d+/\d+°C!?|\d+°C #\d+",  # a GPU's over its slowdown point; a node's hottest
    "elapsed": DURATION,
    "age": r"\d+[smhd]",
    "rtt": r"\d+\.\d ms|\d+ ms|\d+\.\d s",
    "pcie": r"gen\d+ x\d+",
}
# The same reading under the same header in every pane (the Nodes pane's temp is its hottest GPU, "Hottest",
# and its state the node's, "State"; a process's is "S").
SAME_HEADER = ("pid", "user", "gpu", "gpu_memory", "sm", "cpu", "rss", "elapsed", "command", "memory", "power", "util")
# A number with its unit glued on, or a decimal unit name: what the panes wrote before opsconsole.units.
GLUED = re.compile(r"\d(?:W|kW|MHz|[KMGTP]i?B|[KMGT])\b|\d ?(?:[KMGT]B)\b|\d\.\d+ ?°C|\d %")
PANES = (("o", "overview"), ("1", "gpus"), ("2", "processes"), ("3", "host"), ("4", "nodes"), ("5", "cluster"))
TICKS, SHOWN_AT = 40, 30


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> str:
    """One 8-GPU node, frames derived from the real H200 capture (as the overview's snapshots use)."""
    return record_one_node(str(tmp_path_factory.mktemp("units") / "node.opsrec"), TICKS)


def replay_console(path: str) -> ReplayConsole:
    return paused_replay(path, SHOWN_AT)


def cell_text(cell) -> str:
    return str(getattr(cell, "plain", cell)).strip(BAR)


def tables_of(app, pane_id: str) -> List[DataTable]:
    return list(app.panes[pane_id].query(DataTable))


def spelled(pattern: str) -> re.Pattern:
    return re.compile(r"(?:%s|%s|-)" % (pattern, NA))


@pytest.mark.parametrize("size", [(80, 24), (140, 45), (200, 60)], ids=["80x24", "140x45", "200x60"])
async def test_every_pane_spells_each_quantity_through_units(recording, size):
    app = replay_console(recording)
    cells: Dict[str, Dict[str, List[str]]] = {}  # pane -> column key -> cell texts
    headers: Dict[str, Dict[str, str]] = {}  # column key -> pane -> header
    free_text: Dict[str, str] = {}
    async with app.run_test(size=size) as pilot:
        await wait_for(lambda: app.fleet.states(), "the replayed frame", pilot=pilot)
        for key, pane_id in PANES:
            await pilot.press(key)
            await wait_for(
                lambda: app.visible_pane_id == pane_id and all(t.row_count for t in tables_of(app, pane_id)[:1]),
                "the %s pane's rows" % pane_id,
                pilot=pilot,
            )
            await pilot.pause()
            for table in tables_of(app, pane_id):
                for column_key, column in table.columns.items():
                    name = column_key.value or ""
                    headers.setdefault(name, {})[pane_id] = str(column.label).rstrip("▲▼ ")
                    column_cells = cells.setdefault(pane_id, {}).setdefault(name, [])
                    column_cells += [cell_text(table.get_cell(row, column_key)) for row in table.rows]
        pane = app.panes["overview"]
        free_text["overview"] = "\n".join(
            str(pane.query_one("#" + view).render()) for view in ("overview-gpus", "overview-host")
        )
        free_text["host"] = str(app.panes["host"].query_one("#host-summary").render())
        frame = next(iter(app.fleet.states().values())).frame

    bad = []
    for pane_id, columns in cells.items():
        for name, texts in columns.items():
            if name not in SPELLINGS:
                continue
            pattern = spelled(SPELLINGS[name])
            bad += ["%s %s: %r" % (pane_id, name, text) for text in texts if not pattern.fullmatch(text)]
    assert not bad, "cells not spelled by opsconsole.units:\n" + "\n".join(bad)
    assert sum(len(texts) for columns in cells.values() for name, texts in columns.items() if name in SPELLINGS) > 100

    for name in SAME_HEADER:
        assert len(set(headers.get(name, {}).values())) <= 1, "%s is headed %s" % (name, headers[name])

    for pane_id, text in free_text.items():
        assert not GLUED.findall(text), "%s: %s in\n%s" % (pane_id, GLUED.findall(text), text)

    # Each GPU's readings, as units spells them, in every pane that shows them.
    assert frame is not None and len(frame.gpus) == 8
    gpus = {g.index: g for g in frame.gpus}
    for index, gpu in gpus.items():
        power = units.format_power_pair(gpu.power_draw_w, gpu.power_limit_w)
        memory = units.format_memory_pair(gpu.memory_used, gpu.memory_total)
        assert cells["gpus"]["power"][index] == power == cells["cluster"]["power"][index]
        assert cells["gpus"]["memory"][index] == memory == cells["cluster"]["memory"][index]
        assert cells["cluster"]["temp"][index] == units.format_temperature(gpu.temperature)
        assert cells["gpus"]["temp"][index].startswith(units.format_temperature(gpu.temperature)[:-2] + "/")
        line = free_text["overview"]
        assert units.format_power(gpu.power_draw_w) in line or power in line
        assert memory in line
