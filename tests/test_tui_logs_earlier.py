"""A failure already in a log file when the console starts is "earlier": it is not stamped with the console's
start time, and it does not take the root cause from what fails now (Pilot, real LogHub and Diagnoser).

The old failure is real torch output: the traceback of an uncaught torch.OutOfMemoryError on an H200
(tests/data/recovered_oom/crash_oom.log), unstamped as torch prints it. What fails after the start is
torch's CUDA error text and the NCCL watchdog's timeout lines, stamped as written.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from tui_fakes import FakeFleet, single_node_states

from opsconsole.config import Config, LogsConfig
from opsconsole.tui.app import OpsConsole
from opsconsole.tui.findings import BEFORE_START, COLUMNS, ROOT_MARK
from opsconsole.tui.logs import LogsPane
from tests.waiting import wait_for

SIZE = (160, 40)
DATA = Path(__file__).resolve().parent / "data" / "recovered_oom"
# torch's traceback of the OOM, as it printed it (no timestamp on any of its lines).
OLD_OOM = [line for line in (DATA / "crash_oom.log").read_text().splitlines() if not line[:4].isdigit()]


def asctime(when: float) -> str:
    """logging's default asctime ("2026-12-04 15:45:08,272")."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) + ",%03d" % int(when % 1 * 1000)


def console(log: Path) -> OpsConsole:
    return OpsConsole(Config(logs=LogsConfig(paths=(str(log),))), FakeFleet(single_node_states()))


def rows(pane: LogsPane) -> Dict[str, Dict[str, str]]:
    table = pane.findings.table
    out = {}
    for index in range(table.row_count):
        cells = {key: cell.plain for (key, _, _), cell in zip(COLUMNS, table.get_row_at(index))}
        out[cells["category"]] = cells
    return out


async def open_findings(pilot, app: OpsConsole) -> LogsPane:
    pane = app.panes["logs"]
    assert isinstance(pane, LogsPane)
    await pilot.pause()
    await pilot.press("6")
    await wait_for(lambda: app.visible_pane_id == "logs", "the Logs pane", pilot=pilot)
    await wait_for(lambda: pane.findings.table.row_count > 0, "the old OOM listed", pilot=pilot)
    pane.lines.focus()
    await pilot.press("F")
    await wait_for(lambda: pane.findings.table.has_focus, "the findings table focused", pilot=pilot)
    return pane


def write(path: Path, lines: List[str]) -> None:
    """Append lines from another process, as a training rank would."""
    subprocess.run(
        [sys.executable, "-c", "import sys\nwith open(sys.argv[1], 'ab') as f:\n    f.write(sys.stdin.buffer.read())\n"]
        + [str(path)],
        input="".join(line + "\n" for line in lines).encode(),
        check=True,
    )


def alert_rules(app: OpsConsole, earlier: bool) -> List[str]:
    return [event.rule for event in app.services.alerts.history if event.earlier == earlier]


async def test_an_old_unstamped_failure_is_before_start_and_does_not_outrank_a_live_one(tmp_path):
    """The trial: an OOM traceback already in the file was starred as the root cause with First seen = the
    console's start; an illegal memory access written after the start was listed below it."""
    log = tmp_path / "train.log"
    write(log, OLD_OOM)
    app = console(log)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_findings(pilot, app)
        assert pane.findings.table.has_focus
        old = rows(pane)["cuda_oom"]
        assert old["first"] == BEFORE_START and old["mark"] == ROOT_MARK  # alone, it is still the root cause
        write(log, [asctime(time.time()) + " ERROR RuntimeError: CUDA error: an illegal memory access was encountered"])
        await wait_for(lambda: "cuda_illegal_memory" in rows(pane), "the live finding", pilot=pilot)
        await pilot.pause()
        shown = rows(pane)
        assert pane.findings.root == "cuda_illegal_memory"
        assert shown["cuda_illegal_memory"]["mark"] == ROOT_MARK and shown["cuda_oom"]["mark"] == ""
        assert shown["cuda_oom"]["first"] == BEFORE_START
        assert re.fullmatch(r"\d\d:\d\d:\d\d", shown["cuda_illegal_memory"]["first"])  # its own time
        assert [s.category for s in pane.findings.summaries][0] == "cuda_illegal_memory"
        pane.findings.highlight("cuda_oom")
        assert "only in lines written before the console started" in str(pane.findings.detail.render())
        # The Alerts pane agreed already: the old OOM is listed as earlier, the live error fires.
        assert "finding.cuda_oom" in alert_rules(app, earlier=True)
        assert "finding.cuda_illegal_memory" in alert_rules(app, earlier=False)


async def test_an_earlier_failure_stamped_minutes_before_what_fails_now_stays_the_root_cause(tmp_path):
    """A rank's OOM five minutes before the start, its peers' NCCL watchdog timing out after it: the OOM,
    written before the start, is still what caused the timeouts."""
    log = tmp_path / "train.log"
    oom_time = time.time() - 300
    write(log, [asctime(oom_time) + " INFO step 1 loss 1027.8710"] + OLD_OOM)
    app = console(log)
    async with app.run_test(size=SIZE) as pilot:
        pane = await open_findings(pilot, app)
        assert rows(pane)["cuda_oom"]["first"] == time.strftime("%H:%M:%S", time.localtime(int(oom_time)))
        now = time.time()
        glog = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + ".%06d" % int(now % 1 * 1e6)
        write(
            log,
            [
                "[rank1]:[E%s 1234 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 "
                "milliseconds before timing out." % glog
            ],
        )
        await wait_for(lambda: "nccl_timeout" in rows(pane), "the live timeout", pilot=pilot)
        await pilot.pause()
        assert pane.findings.root == "cuda_oom" and rows(pane)["cuda_oom"]["mark"] == ROOT_MARK
