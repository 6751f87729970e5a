"""SVG snapshot of the Logs pane: two ranks merged, an OOM traceback marked, the findings list below.

Regenerate after a deliberate change with:
    .venv/bin/python -m pytest tests/test_tui_logs_snapshot.py --snapshot-update
and read the SVG (tests/__snapshots__/test_tui_logs_snapshot/) before committing it.
"""

from __future__ import annotations

import time

from test_tui_logs import OOM_TRACEBACK, console, needs_followers, pane_of, rank_file, record, write_lines  # noqa: E402

from tests.snapshot_clock import utc_clock  # noqa: F401 (autouse fixture: the clock prints UTC)

SIZE = (140, 40)


@needs_followers
def test_logs_pane_with_a_finding(snap_compare, tmp_path):
    rank0, rank1 = rank_file(tmp_path, "gpu01", 0), rank_file(tmp_path, "gpu02", 1)
    write_lines(
        rank0,
        [record(n, "INFO", "step %d loss %.2f" % (n, 3.0 - n / 100)) for n in range(0, 24, 2)]
        + [record(25, "WARNING", "step 25 took 4.1 s (median 1.0 s)")],
    )
    write_lines(
        rank1,
        [record(n, "INFO", "step %d loss %.2f" % (n, 3.0 - n / 100)) for n in range(1, 24, 2)]
        + [record(24, "ERROR", "step 24 failed on rank 1")]
        + OOM_TRACEBACK,
    )
    app = console(tmp_path)
    expected = 13 + 13 + len(OOM_TRACEBACK)

    async def run_before(pilot) -> None:
        await pilot.press("6")
        pane = pane_of(app)
        deadline = time.monotonic() + 15
        while (len(pane.view.entries) < expected or not pane.findings.table.row_count) and time.monotonic() < deadline:
            await pilot.pause(0.05)
        await pilot.pause(0.2)
        app.clear_notifications()  # the finding's alert toast: its timing is not what this snapshot is about
        await pilot.pause(0.1)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
