"""The console shows a straggling rank under the Logs pane and raises its alert (real files, real feed)."""

from __future__ import annotations

import time  # noqa: E402

from test_tui_logs import needs_followers, pane_of, rank_file, wait_for, write_lines  # noqa: E402
from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states  # noqa: E402

from opsconsole.config import Config, ConsoleConfig, LogsConfig  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402

STALL_AFTER = 5.0  # the straggler lag is then 5 s too
T0 = time.time()


def record(offset: float, message: str) -> str:
    """A seed-format line stamped `offset` seconds after the test began (local time, as logging writes)."""
    when = T0 + offset
    return "%s,%03d - INFO - %s" % (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)),
        int(when * 1000) % 1000,
        message,
    )


@needs_followers
async def test_a_rank_whose_log_stops_shows_as_a_straggler_and_alerts(tmp_path):
    rank0, rank1 = rank_file(tmp_path, "gpu01", 0), rank_file(tmp_path, "gpu01", 1)
    write_lines(rank0, [record(n - 3, "step %d loss 2.0" % n) for n in range(3)])
    write_lines(rank1, [record(n - 3, "step %d loss 2.0" % n) for n in range(3)])
    config = Config(
        logs=LogsConfig(paths=(str(tmp_path / "train_*_rank*_*.log"),), stall_after=STALL_AFTER),
        console=ConsoleConfig(),
    )
    app = OpsConsole(config, FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)
    clock = [T0]
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("6")
        pane = pane_of(app)
        await wait_for(lambda: app.log_feed is not None and len(pane.view.entries) >= 6, "the first pages", pilot=pilot)
        app.log_feed.now = lambda: clock[0]  # the feed's clock: arrival times the test controls
        app.check_log_progress()
        assert not pane.findings.table.row_count  # both ranks advanced together
        clock[0] += 30
        write_lines(rank0, [record(30, "step 3 loss 1.9")])  # rank 0 goes on, rank 1 does not
        await wait_for(lambda: len(pane.view.entries) >= 7, "rank 0's new line", pilot=pilot)
        app.check_log_progress()
        await wait_for(lambda: pane.findings.table.row_count == 1, "the straggler row", pilot=pilot)
        row = [str(cell) for cell in pane.findings.table.get_row_at(0)]
        assert row[2] == "straggler" and row[6] == "1"  # category, ranks
        firing = [event for event in app.services.alerts.firing() if event.rule == "finding.straggler"]
        assert [event.node for event in firing] == ["local"] and "rank 1" in firing[0].message
        clock[0] += 1
        write_lines(rank1, [record(31, "step 3 loss 1.9")])  # it catches up: the row goes
        await wait_for(lambda: len(pane.view.entries) >= 8, "rank 1's new line", pilot=pilot)
        app.check_log_progress()
        await wait_for(lambda: pane.findings.table.row_count == 0, "the straggler row gone", pilot=pilot)
