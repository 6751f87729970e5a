"""Data shown in toasts is plain text: brackets in a log excerpt or a path are not Textual markup.

A gloo error line carries "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]",
which markup reads as a closing tag; drawn as markup it raised MarkupError and took the console down
(seen in `opsconsole demo`).
"""

from __future__ import annotations

import time

from test_tui_logs import console, needs_followers, pane_of, rank_file, record, shown_texts, write_lines  # noqa: E402
from textual.widgets._toast import Toast  # noqa: E402

from tests.waiting import wait_for

GLOO_LINE = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
    "Read error [127.0.0.1]:29500: Connection reset by peer [bold]"
)


async def test_a_toast_with_bracketed_text_is_drawn_as_it_is(tmp_path):
    app = console(tmp_path)
    async with app.run_test(size=(140, 40), notifications=True) as pilot:  # run_test draws no toasts unless told
        app.notify(GLOO_LINE, title="[/x] not markup either", severity="error")
        toasts = await wait_for(lambda: list(app.screen.query(Toast)), "the toast", pilot=pilot)
        assert any("pair.cc:553] Read error" in str(toast.render()) for toast in toasts)
        assert app.is_running


@needs_followers
async def test_a_finding_whose_excerpt_has_brackets_alerts_without_breaking_the_console(tmp_path):
    rank0 = rank_file(tmp_path, "gpu01", 0)
    write_lines(rank0, [record(1, "INFO", "step 1 loss 2.0")])
    app = console(tmp_path)
    async with app.run_test(size=(140, 40), notifications=True) as pilot:  # run_test draws no toasts unless told
        await pilot.press("6")
        pane = pane_of(app)
        # A finding in lines written before the console started is listed as earlier, not announced:
        # the error line comes once the console follows the file, stamped now, so it alerts with a toast.
        await wait_for(
            lambda: app.log_feed is not None and "step 1 loss 2.0" in " ".join(shown_texts(pane)),
            "the console following the log",
            pilot=pilot,
        )
        now = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        write_lines(rank0, ["%s,000 - ERROR - %s" % (now, GLOO_LINE)])
        await wait_for(lambda: pane.findings.table.row_count > 0, "the finding", pilot=pilot)
        await wait_for(
            lambda: (
                app.services.alerts.counts()
                and any("pair.cc:553]" in str(toast.render()) for toast in app.screen.query(Toast))
            ),
            "the alert's toast",
            pilot=pilot,
        )
        assert app.is_running
