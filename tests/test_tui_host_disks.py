"""The Host pane's disks on a real console screen: each disk's free space in sight at any width,
long mount paths cut in the middle rather than the free space cut off at the edge."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import List

import pytest
from rich.cells import cell_len
from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states

from opsconsole.config import Config
from opsconsole.model import DiskUsage
from opsconsole.tui.app import OpsConsole
from opsconsole.tui.host import cut_middle
from tests.waiting import wait_for

GIB = 1024**3
# "60 GiB free of 100 GiB (60%)": the free space as the overview says it, then of what.
FREE = re.compile(r"(\d+) GiB free of 100 GiB \(\1%\)")


def node_with_disks(paths):
    state = single_node_states()[0]
    disks = tuple(
        DiskUsage(path=path, total=100 * GIB, used=(40 + 10 * i) * GIB, free=(60 - 10 * i) * GIB)
        for i, path in enumerate(paths)
    )
    host = replace(state.frame.host, disks=disks)
    return replace(state, frame=replace(state.frame, host=host))


def screen_lines(app: OpsConsole) -> List[str]:
    return ["".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips()]


async def disk_lines(paths, width: int) -> List[str]:
    app = OpsConsole(Config(), FakeFleet([node_with_disks(paths)]), now=lambda: FROZEN_NOW)
    async with app.run_test(size=(width, 40)) as pilot:
        await pilot.press("3")
        await wait_for(lambda: any("disks" in line for line in screen_lines(app)), "the Host summary", pilot=pilot)
        lines = screen_lines(app)
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("disks"))
    end = next(i for i, line in enumerate(lines) if line.lstrip().startswith("net "))
    return lines[start:end]


@pytest.mark.parametrize("width", [80, 120, 200])
async def test_every_disk_shows_its_free_space_with_long_paths(width):
    paths = ["/", "/mnt/lustre/projects/llm-pretraining/checkpoints/run-2026-12-03", "/scratch/日本語/データ"]
    lines = await disk_lines(paths, width)
    free = [int(match.group(1)) for line in lines for match in FREE.finditer(line)]
    assert free == [60, 50, 40], "\n".join(lines)
    for line in lines:
        assert cell_len(line.rstrip()) <= width and "…" not in line[-3:], line  # not cut at the edge
    assert len(lines) == 3  # too long for one line: one a line
    assert "/mnt/lust" in lines[1] and "-03 " in lines[1]  # both ends of the long path


async def test_short_paths_stay_on_one_line():
    lines = await disk_lines(["/", "/home"], 140)
    assert len(lines) == 1
    assert [int(m.group(1)) for m in FREE.finditer(lines[0])] == [60, 50]
    assert "  / " in lines[0] and "  /home " in lines[0]


def test_cut_middle_keeps_both_ends_within_the_cells():
    assert cut_middle("/mnt/very/long/path/data", 11) == "/mnt/…/data"
    assert cut_middle("/short", 11) == "/short"
    assert cut_middle("日本語のパス/data", 10) == "日本…/data"
    for width in range(0, 30):
        assert cell_len(cut_middle("/mnt/日本語/long/path/data", width)) <= width
