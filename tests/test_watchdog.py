"""NCCL watchdog lines across ranks: real excerpts from public reports, and the rank they name.

Lines marked "real" are verbatim from the reports named beside them. Where a report described the
numbers of a rank without quoting its line, the line is written in torch's own format for it
(ProcessGroupNCCL's getNCCLWatchdogTimeoutErrorMsg: "Received a dump signal due to a collective
timeout from ... Last enqueued NCCL work: X, last completed NCCL work: Y.").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opsconsole.diagnosis.engine import Diagnoser
from opsconsole.hang.watchdog import WatchdogLines, parse_watchdog_line, watchdog_verdict

ROOT = Path(__file__).resolve().parents[1]

# Real: XPixelGroup/BasicSR#737 (torch 2.6 era), ranks 0-2 of the default group waiting in 808.
BASICSR = [
    "[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.",
    "[rank1]:[E626 06:24:44.906457629 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, last completed NCCL work: 807.",
    "[rank0]:[E626 06:24:44.159932949 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600030 milliseconds before timing out.",
    "[rank0]:[E626 06:24:44.160366013 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 0] Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, last completed NCCL work: 807.",
    "[rank2]:[E626 06:24:44.173078629 ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600061 milliseconds before timing out.",
    "[rank2]:[E626 06:24:44.173689731 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 2] Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, last completed NCCL work: 807.",
]
# Rank 3 of that job, stopped before collective 808 (the reporter's fourth GPU), in torch's format.
BASICSR_RANK3 = (
    "[rank3]:[E626 06:24:45.011002233 ProcessGroupNCCL.cpp:1858] [PG ID 0 PG GUID 0(default_pg) Rank 3] Received a "
    "dump signal due to a collective timeout from rank 0 and we will try our best to dump the debug info. Last "
    "enqueued NCCL work: 807, last completed NCCL work: 807.This is most likely caused by incorrect usages of "
    "collectives, e.g., wrong sizes used across ranks, the order of collectives is not same for all ranks or the "
    "scheduled collective, for some reason, didn't run."
)
# Real: hiyouga/LlamaFactory#6269, group 1, three ranks at the same place.
LLAMAFACTORY = [
    "[rank0]:[E1206 18:44:16.994932383 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 0] Timeout at NCCL work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752.",
    "[rank2]:[E1206 18:44:16.994961143 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 2] Timeout at NCCL work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752.",
    "[rank6]:[E1206 18:44:16.995042142 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 6] Timeout at NCCL work: 7753, last enqueued NCCL work: 7755, last completed NCCL work: 7752.",
]
# Real: NVIDIA/nccl#1504 (group rank from "PG ID 0"), and NVIDIA/nccl#1730 (newer wording).
NCCL_1504 = (
    "[rank1]:[E1103 07:34:57.460801783 ProcessGroupNCCL.cpp:1834] [PG ID 0 PG GUID 0(default_pg) Rank 1] Timeout at "
    "NCCL work: 1, last enqueued NCCL work: 1, last completed NCCL work: -1."
)
NCCL_1730 = (
    "[rank118]:[E603 17:48:01.005538748 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank 118]  failure "
    "detected by watchdog at work sequence id: 2398459 PG status: last enqueued work: 2398578, last completed work: 2398458"
)
# Real (a Ray worker's prefix before torch's): a rank whose heartbeat monitor dumped.
MEGATRON = (
    "(MegatronPolicyWorker[rank=8] pid=3098870) [rank8]:[E129 16:38:47.801786726 ProcessGroupNCCL.cpp:1858] [PG ID 0 PG "
    "GUID 0(default_pg) Rank 8] Received a dump signal due to a collective timeout from this local rank and we will "
    "try our best to dump the debug info. Last enqueued NCCL work: 62, last completed NCCL work: 62.This is most likely "
    "caused by incorrect usages of collectives"
)


def frozen_line(rank: int) -> str:
    # A file-system stall froze every rank before any collective: all say -1 (torch's format).
    return (
        "[rank%d]:[E1201 03:12:09.000000000 ProcessGroupNCCL.cpp:1858] [PG ID 0 PG GUID 0(default_pg) Rank %d] Received a "
        "dump signal due to a collective timeout from this local rank and we will try our best to dump the debug info. "
        "Last enqueued NCCL work: -1, last completed NCCL work: -1." % (rank, rank)
    )


@pytest.mark.parametrize(
    "line, expected",
    [
        (BASICSR[1], (1, "0", 1, 808, 811, 807)),
        (LLAMAFACTORY[2], (6, "1", 6, 7753, 7755, 7752)),
        (NCCL_1504, (1, "0", 1, 1, 1, -1)),
        (NCCL_1730, (118, "0", 118, 2398459, 2398578, 2398458)),
        (MEGATRON, (8, "0", 8, None, 62, 62)),
        (BASICSR_RANK3, (3, "0", 3, None, 807, 807)),
    ],
)
def test_progress_lines_parse(line, expected):
    report = parse_watchdog_line(line)
    assert (
        report.rank,
        report.group,
        report.group_rank,
        report.timed_out,
        report.last_enqueued,
        report.last_completed,
    ) == expected


def test_other_lines_are_not_progress():
    assert parse_watchdog_line(BASICSR[0]) is None  # WorkNCCL(...) names the op, not the progress
    assert parse_watchdog_line("NCCL INFO comm 0x5598 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE") is None


def test_the_rank_with_the_lowest_last_enqueued_never_reached_the_collective():
    lines = WatchdogLines()
    for text in BASICSR + [BASICSR_RANK3]:
        lines.feed(text)
    verdict = lines.verdict()
    assert verdict.kind == "never_reached" and verdict.culprit_ranks == (3,)
    assert (verdict.seq, verdict.op, verdict.culprit_enqueued, verdict.others_enqueued) == (808, "ALLREDUCE", 807, 811)
    assert verdict.text == (
        "NCCL watchdog: rank 3 never reached collective 808 (ALLREDUCE) of group 0: last enqueued 807 there, "
        "the other ranks 811"
    )


def test_ranks_at_the_same_place_name_nobody():
    verdict = watchdog_verdict([parse_watchdog_line(text) for text in LLAMAFACTORY])
    assert verdict.kind == "all_waiting" and verdict.culprit_ranks == () and verdict.seq == 7753
    assert verdict.reporting_ranks == (0, 2, 6) and "printed no watchdog line" in verdict.text


def test_all_minus_one_means_the_processes_froze():
    verdict = watchdog_verdict([parse_watchdog_line(frozen_line(rank)) for rank in range(4)])
    assert verdict.kind == "frozen" and verdict.culprit_ranks == () and verdict.reporting_ranks == (0, 1, 2, 3)
    assert "froze" in verdict.text and "file-system stall" in verdict.text


def test_the_run_verdict_names_the_rank_that_never_got_there():
    diagnoser = Diagnoser()
    for number, text in enumerate(BASICSR + [BASICSR_RANK3], 1):
        diagnoser.feed_text(text, number, "train.log")
    verdict = diagnoser.verdict()
    assert verdict.category == "nccl_timeout"
    assert verdict.finding.rank == 1  # the first line that timed out was rank 1's: only a waiting rank
    assert verdict.rank == 3 and verdict.watchdog.culprit_ranks == (3,)
    row = next(row for row in diagnoser.summary() if row.category == "nccl_timeout")
    assert row.cause.startswith("NCCL watchdog: rank 3 never reached collective 808")


def write_rank_logs(directory: Path, lines) -> None:
    """One log per rank, as torchrun --log-dir lays them out (attempt_0/<rank>/stderr.log)."""
    for text in lines:
        rank = parse_watchdog_line(text) or None
        number = rank.rank if rank else int(text.split("[rank", 1)[1].split("]", 1)[0])
        folder = directory / "attempt_0" / str(number)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "stderr.log", "a") as log:
            log.write(text + "\n")


def diagnose_run(directory: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", "--run", str(directory), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_diagnose_run_names_the_rank_across_rank_logs(tmp_path):
    write_rank_logs(tmp_path, BASICSR + [BASICSR_RANK3])
    document = diagnose_run(tmp_path)
    assert document["root_cause"] == "nccl_timeout" and document["rank"] == 3
    assert document["watchdog"]["kind"] == "never_reached" and document["watchdog"]["culprit_ranks"] == [3]
    assert document["watchdog"]["seq"] == 808 and document["watchdog"]["op"] == "ALLREDUCE"
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", "--run", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert "Started on rank 3" in done.stdout
    assert "NCCL watchdog: rank 3 never reached collective 808 (ALLREDUCE) of group 0" in done.stdout


def test_diagnose_run_says_frozen_when_every_rank_says_minus_one(tmp_path):
    timeouts = [
        line.replace("[rank1]", "[rank%d]" % rank).replace("[Rank 1]", "[Rank %d]" % rank)
        for rank in range(2)
        for line in BASICSR[:1]
    ]
    write_rank_logs(tmp_path, timeouts + [frozen_line(rank) for rank in range(2)])
    document = diagnose_run(tmp_path)
    assert document["watchdog"]["kind"] == "frozen" and document["rank"] in (0, 1)
    assert "froze" in document["watchdog"]["text"]


async def test_the_console_findings_name_the_rank_that_never_got_there(tmp_path):
    from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states

    from opsconsole.config import Config, LogsConfig
    from opsconsole.tui.app import OpsConsole
    from opsconsole.tui.findings import COLUMNS
    from tests.waiting import wait_for

    for text in BASICSR + [BASICSR_RANK3]:
        rank = (
            parse_watchdog_line(text).rank
            if parse_watchdog_line(text)
            else int(text.split("[rank", 1)[1].split("]", 1)[0])
        )
        with open(tmp_path / ("train_gpu0%d_rank%d_20261202_120000.log" % (rank // 2, rank)), "a") as log:
            log.write(text + "\n")
    config = Config(logs=LogsConfig(paths=(str(tmp_path / "train_*_rank*_*.log"),)))
    app = OpsConsole(config, FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        await pilot.press("6")
        pane = app.panes["logs"]
        await wait_for(
            lambda: "nccl_timeout" in [s.category for s in pane.findings.summaries], "the timeout finding", pilot=pilot
        )
        row = {key: cell.plain for (key, _, _), cell in zip(COLUMNS, pane.findings.table.get_row("nccl_timeout"))}
        assert row["ranks"] == "0-2"  # the ranks that timed out waiting
        summary = next(s for s in pane.findings.summaries if s.category == "nccl_timeout")
        assert summary.cause.startswith("NCCL watchdog: rank 3 never reached collective 808 (ALLREDUCE) of group 0")
