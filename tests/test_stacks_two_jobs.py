"""Two jobs on one node: the stacks verdict compares ranks within a job, never across jobs.

An 8-GPU node often runs two 4-GPU jobs, each with its own rank 0. Job A is the real hung torchrun
job of test_stacks_torchrun (gloo: rank 1 stuck before the all_reduce rank 0 waits in). Job B is
two ranks of another job, started as a launcher without torchrun starts them (RANK, WORLD_SIZE and
its own MASTER_ADDR/MASTER_PORT in the environment), both waiting for data outside any collective.
Grouped together, job B's ranks stood outside the collective job A's rank 0 waits in, and the
verdict named them as odd beside job A's rank 1. Each rank now carries its job (its rendezvous
master, read from /proc/PID/environ on the node), and only job A's rank 1 is odd.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterator

import psutil
import pytest

from tests.test_stacks_torchrun import PY_SPY, hung_job, local_config  # noqa: F401
from tests.torchrun import free_port
from tests.waiting import wait_for, wait_for_sync

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]

OTHER_JOB = textwrap.dedent("""
    import os
    import sys
    import time


    def load_batch(ready):
        open(ready, "w").close()
        time.sleep(3600)


    load_batch(os.path.join(sys.argv[1], "rank%s" % os.environ["RANK"]))
""")


@pytest.fixture
def other_job(tmp_path) -> Iterator[Dict[str, object]]:
    """Job B: two ranks with their own master port, both in `load_batch`; killed after the test."""
    if not os.path.exists(PY_SPY):
        pytest.skip("py-spy is not installed: pip install py-spy (it is in the test extra)")
    script = tmp_path / "other.py"
    script.write_text(OTHER_JOB)
    port = free_port()
    procs = {}
    try:
        for rank in (0, 1):
            env = dict(
                os.environ,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            procs[rank] = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env)
        wait_for_sync(
            lambda: (tmp_path / "rank0").exists() and (tmp_path / "rank1").exists(), what="job B's ranks in load_batch"
        )
        yield {"ranks": {rank: proc.pid for rank, proc in procs.items()}, "job": "job at 127.0.0.1:%d" % port}
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGKILL)
            proc.wait()


def job_of_hung(hung_job) -> str:
    env = psutil.Process(hung_job["ranks"][1]).environ()
    return "job at %s:%s" % (env["MASTER_ADDR"], env["MASTER_PORT"])


def stacks(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opsconsole", "stacks", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_only_the_hung_jobs_rank_is_odd_not_another_jobs_ranks(hung_job, other_job, tmp_path):  # noqa: F811
    a, b = hung_job["ranks"], other_job["ranks"]
    job_a, job_b = job_of_hung(hung_job), other_job["job"]
    pids = ["--pid=%d" % pid for pid in (a[0], a[1], b[0], b[1])]
    done = stacks(local_config(tmp_path), "--json", *pids)
    assert done.returncode == 0, done.stderr + done.stdout
    result = json.loads(done.stdout)
    assert result["odd"] == [1]  # job A's rank 1 alone: job B's ranks 0 and 1 are not in job A
    assert [group["frames"][0]["function"] for group in result["groups"] if group["odd"]] == ["stuck_before_all_reduce"]
    jobs = {entry["pid"]: entry["job"] for entry in result["ranks"]}
    assert jobs == {a[0]: job_a, a[1]: job_a, b[0]: job_b, b[1]: job_b}
    odd = [group for group in result["groups"] if group["odd"]]
    assert [(group["job"], group["ranks"]) for group in odd] == [(job_a, [1])]
    assert odd[0]["frames"][0]["function"] == "stuck_before_all_reduce"
    others = {group["job"]: group["ranks"] for group in result["groups"] if not group["odd"]}
    assert others == {job_a: [0], job_b: [0, 1]}

    table = stacks(local_config(tmp_path), *pids)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "4 rank(s) on 1 node(s): 3 group(s) in 2 jobs"
    assert lines[1] == (
        "odd: [%s] rank 1 in `stuck_before_all_reduce` (job.py:12), while the others wait in a collective" % job_a
    )
    assert "     [%s] ranks 0-1 in `load_batch` (other.py:9)" % job_b in lines


async def test_the_console_marks_only_the_hung_jobs_rank(hung_job, other_job, tmp_path):  # noqa: F811
    from opsconsole.config import load_config
    from opsconsole.nodes.fleet import Fleet
    from opsconsole.tui.app import OpsConsole
    from opsconsole.tui.stacks import StacksScreen

    config = load_config(str(local_config(tmp_path, read_only=True)))
    app = OpsConsole(config, Fleet(config))
    a, b = hung_job["ranks"], other_job["ranks"]
    async with app.run_test(size=(160, 48)) as pilot:
        app.action_show_pane("logs")
        await pilot.pause()
        await pilot.press("S")  # every rank of this machine: other tests' jobs too, each in its own job
        screen = await wait_for(
            lambda: isinstance(app.screen, StacksScreen) and app.screen.report is not None and app.screen,
            "the stacks report",
            pilot=pilot,
        )
        table = screen.query_one("#stacks-table")
        for pid in (a[0], b[0], b[1]):
            assert str(table.get_row("local/%d" % pid)[0]) == ""
        assert "load_batch" not in screen.report.verdict
        row_a1 = table.get_row("local/%d" % a[1])
        assert str(row_a1[0]) == "ODD" and str(row_a1[5]).startswith("[%s] " % job_of_hung(hung_job))
        assert str(table.get_row("local/%d" % b[0])[5]) == "[%s] `load_batch` (other.py:9)" % other_job["job"]
        assert "[%s] rank 1 in `stuck_before_all_reduce`" % job_of_hung(hung_job) in screen.report.verdict
