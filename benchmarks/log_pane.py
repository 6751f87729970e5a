"""What a live update of the Logs pane costs with 100k buffered lines, against the same with 1k.

The real console (App.run_test, 140x40) with the Logs pane visible; its view is filled with N lines
of 16 ranks, then K updates are timed: 100 new lines arrive (LogsPane.add_lines), are merged
(flush), and every row on screen is rendered (render_line, as the compositor asks); the app then
refreshes (not timed: Pilot's own wait dominates it). A virtual view renders only the rows on
screen, so the ratio 100k / 1k should stay near 1. Also timed: re-filtering the whole buffer
with a regex (`/`), which is linear in the buffer, against Python's own `re.search` loop over
the same texts (the floor for any filter).

    .venv/bin/python benchmarks/log_pane.py [--updates 40] [--big 100000] [--small 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states  # noqa: E402

from opsconsole.config import Config  # noqa: E402
from opsconsole.logs.records import LogLine, LogSource  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402

SOURCES = [
    LogSource(
        "gpu%02d" % (n // 8 + 1),
        "/scratch/run/train_gpu%02d_rank%d_1.log" % (n // 8 + 1, n),
        "gpu%02d" % (n // 8 + 1),
        n,
        "gpu%02d:rank%d" % (n // 8 + 1, n),
    )
    for n in range(16)
]


def make_lines(start: int, count: int) -> List[LogLine]:
    lines = []
    for n in range(start, start + count):
        source = SOURCES[n % len(SOURCES)]
        text = "2026-12-02 12:%02d:%02d,000 - INFO - step %d loss %.3f lr 3e-4 tokens/s 412345" % (
            n // 60 % 60,
            n % 60,
            n,
            3.0 - n / 1e6,
        )
        lines.append(
            LogLine(source, n // 16 + 1, n * 90, text, time=1796212800.0 + n / 100, level="INFO", rank=source.rank)
        )
    return lines


async def measure(buffered: int, updates: int) -> tuple:
    app = OpsConsole(Config(), FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)
    async with app.run_test(size=(140, 40)) as pilot:
        pane = app.panes["logs"]
        await pilot.pause()
        await pilot.press("6")
        await pilot.pause()
        assert app.visible_pane_id == "logs", app.visible_pane_id
        for start in range(0, buffered, 10000):
            pane.add_lines(make_lines(start, min(10000, buffered - start)), [])
            pane.flush()
        await pilot.pause()
        times = []
        rows = pane.lines.scrollable_content_region.height
        assert rows > 20, rows
        for update in range(updates):
            lines = make_lines(buffered + update * 100, 100)
            began = time.perf_counter()
            pane.add_lines(lines, [])
            pane.flush()
            for y in range(rows):  # what the compositor asks of the line view for one screen
                pane.lines.render_line(y)
            times.append(time.perf_counter() - began)
            await pilot.pause()
        texts = [entry.text for entry in pane.view.entries]
        began = time.perf_counter()
        pane._filter_text = r"loss 2\.99\d"
        pane._apply_filter_now()  # what apply_filter does once the typing pauses
        filter_s = time.perf_counter() - began
        pattern = re.compile(r"loss 2\.99\d", re.IGNORECASE)
        began = time.perf_counter()
        floor = sum(1 for text in texts if pattern.search(text))
        floor_s = time.perf_counter() - began
        assert floor == len(pane.view)
    return statistics.median(times), filter_s, floor_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--big", type=int, default=100_000)
    parser.add_argument("--small", type=int, default=1_000)
    args = parser.parse_args()
    small, small_filter, small_floor = asyncio.run(measure(args.small, args.updates))
    big, big_filter, big_floor = asyncio.run(measure(args.big, args.updates))
    print(
        "update (100 lines merged + one screen rendered), median: %d lines buffered %.2f ms, %d lines %.2f ms: ratio %.2f"
        % (args.small, small * 1e3, args.big, big * 1e3, big / small)
    )
    print(
        "regex filter over %d lines: pane %.1f ms, bare re.search loop %.1f ms: ratio %.2f"
        % (args.big, big_filter * 1e3, big_floor * 1e3, big_filter / big_floor)
    )


if __name__ == "__main__":
    main()
