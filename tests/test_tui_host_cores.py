"""The Host pane's per-core grid on a real console screen: cells apart, nothing wrapped, every core shown."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import List

import pytest
from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states

from opsconsole.config import Config
from opsconsole.tui.app import OpsConsole
from tests.waiting import pane_shown, wait_for

# One cell: the core's number, an 8-cell bar, its percent ("  7 ▌·······   7%").
CELL = re.compile(r"(\d+) ([█▉▊▋▌▍▎▏·]{8}) +(\d+)%")


def node_with_cores(count: int):
    state = single_node_states()[0]
    per_core = tuple(float(index * 7 % 101) for index in range(count))
    host = replace(state.frame.host, cpu_per_core=per_core, cpu_count=count)
    return replace(state, frame=replace(state.frame, host=host)), per_core


def screen_lines(app: OpsConsole) -> List[str]:
    return ["".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips()]


def drawn_cores(app: OpsConsole) -> bool:
    """Whether the screen shows the core grid (from `cores` to the memory line)."""
    lines = [line.lstrip() for line in screen_lines(app)]
    return any(line.startswith("cores") for line in lines) and any(line.startswith("mem ") for line in lines)


def core_block(lines: List[str]) -> List[str]:
    """The lines from `cores` down to the memory line."""
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("cores"))
    end = next(i for i, line in enumerate(lines) if line.lstrip().startswith("mem "))
    return lines[start:end]


@pytest.mark.parametrize("width", [80, 100, 140, 200])
async def test_sixteen_cores_are_cells_apart_on_whole_lines(width):
    state, per_core = node_with_cores(16)
    app = OpsConsole(Config(), FakeFleet([state]), now=lambda: FROZEN_NOW)
    async with app.run_test(size=(width, 40)) as pilot:
        await pilot.press("3")
        # The Host pane is made on its first show, then drawn: waited for, not one pause.
        await wait_for(lambda: pane_shown(app, "host") and drawn_cores(app), "the Host pane's cores", pilot=pilot)
        block = core_block(screen_lines(app))
        seen = []
        for line in block:
            cells = list(CELL.finditer(line))
            assert cells, "a line of the core grid holds no whole cell (wrapped?): %r" % line
            # Between one percent and the next core's number there are spaces ("0%1" was the bug).
            for before, after in zip(cells, cells[1:]):
                gap = line[before.end() : after.start()]
                assert len(gap) >= 2 and not gap.strip(), repr(line)
            seen += [(int(c.group(1)), int(c.group(3))) for c in cells]
            assert len(line.rstrip()) <= width
        assert seen == [(index, round(value)) for index, value in enumerate(per_core)]
        assert len(block) == -(-16 // len(list(CELL.finditer(block[0]))))  # full lines but the last


@pytest.mark.parametrize("width", [80, 140])
async def test_many_cores_get_one_spark_cell_each(width):
    state, _ = node_with_cores(128)
    app = OpsConsole(Config(), FakeFleet([state]), now=lambda: FROZEN_NOW)
    async with app.run_test(size=(width, 40)) as pilot:
        await pilot.press("3")
        # The Host pane is made on its first show, then drawn: waited for, not one pause.
        await wait_for(lambda: pane_shown(app, "host") and drawn_cores(app), "the Host pane's cores", pilot=pilot)
        block = core_block(screen_lines(app))
        sparks = "".join(line.strip().removeprefix("cores").strip() for line in block)
        assert len(sparks) == 128 and set(sparks) <= set(" ▁▂▃▄▅▆▇█")
        assert all(len(line.rstrip()) <= width for line in block)
        assert "128 cores" in "\n".join(screen_lines(app))
