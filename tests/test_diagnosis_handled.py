"""A real torchrun run (2 ranks, gloo, CPU) that finished although rank 1 logged a handled exception.

Rank 1 catches a KeyError, logs it with logging.exception (a traceback in its output) and keeps training;
both ranks exit 0. `opsconsole diagnose --run` must not name that traceback the root cause: the run
finished, and the exception is listed as seen on the way ("handled? the rank went on after it"); a file
alone says the same from rank 1's later steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.torchrun import torchrun_command, torchrun_env

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 240

WORKER = textwrap.dedent("""
    import logging, os
    from datetime import timedelta
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(levelname)s - %(message)s")
    log = logging.getLogger("train")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    for step in range(4):
        x = torch.ones(4)
        if step == 1 and rank == 1:
            try:
                {"a": 1}["input_ids"]
            except KeyError:
                log.exception("sample 17 has no input_ids, skipped")
        dist.all_reduce(x)
        log.info("step %d loss: %.4f", step, float(x.sum()) / 100)
    dist.destroy_process_group()
    log.info("training finished")
""")


@pytest.fixture(scope="module")
def handled_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("handled")
    script = base / "worker.py"
    script.write_text(WORKER)
    command = torchrun_command(script, log_dir=base / "torchrun")
    command[command.index("--redirects") : command.index("--redirects")] = ["--tee", "3"]
    with open(base / "launcher.log", "wb") as launcher:
        status = subprocess.run(
            command,
            stdout=launcher,
            stderr=subprocess.STDOUT,
            env=torchrun_env(pythonpath=[ROOT]),
            timeout=RUN_TIMEOUT_S,
        ).returncode
    return base, status


def diagnose(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_the_run_really_logged_a_traceback_and_finished(handled_run):
    directory, status = handled_run
    assert status == 0
    launcher = (directory / "launcher.log").read_text()
    assert "[default1]:Traceback (most recent call last):" in launcher
    assert "[default1]:KeyError: 'input_ids'" in launcher
    assert launcher.count("training finished") == 2


def test_a_finished_run_with_a_handled_exception_has_no_root_cause(handled_run):
    directory, _ = handled_run
    done = diagnose("--run", str(directory), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["root_cause"], result["rank"]) == (None, None)
    assert result["outcome"] == "finished"
    assert "no failed rank" in result["outcome_evidence"]
    handled = result["handled"]
    assert {entry["rank"] for entry in handled} == {1}
    assert {entry["exception"] for entry in handled} == {"KeyError: 'input_ids'"}
    assert any(entry["file"] == str(directory / "launcher.log") for entry in handled)
    assert result["findings"] == []  # listed as handled, not as a failure


def test_one_file_alone_says_handled_not_root_cause(handled_run):
    """Without the run's other files: the traceback is followed by rank 1's own later, stamped steps."""
    directory, _ = handled_run
    done = diagnose("--json", str(directory / "launcher.log"))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["root_cause"], result["findings"]) == (None, [])
    assert [(entry["rank"], entry["exception"]) for entry in result["handled"]] == [(1, "KeyError: 'input_ids'")]
    text = diagnose(str(directory / "launcher.log")).stdout
    assert "No root cause found." in text and "Handled? the rank went on after it:" in text and "rank 1" in text


def test_the_report_says_the_run_finished_and_lists_the_exception_as_seen(handled_run):
    directory, _ = handled_run
    for target in (directory, directory / "launcher.log"):
        done = diagnose("--run", str(target))
        assert done.returncode == 0, done.stderr
        assert "Root cause" not in done.stdout
        assert "The run finished (" in done.stdout
        assert "KeyError: 'input_ids' on rank 1" in done.stdout
        assert "(handled? the rank went on after it)" in done.stdout


def test_an_unhandled_exception_in_the_same_layout_is_still_the_root_cause(handled_run, tmp_path):
    """The same launcher output cut after the traceback (the rank logged nothing after it): a root cause."""
    directory, _ = handled_run
    lines = (directory / "launcher.log").read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if line.startswith("[default1]:KeyError"))
    kept = lines[: cut + 1] + [line for line in lines[cut + 1 :] if not line.startswith("[default1]:")]
    (tmp_path / "launcher.log").write_text("".join(kept))
    result = json.loads(diagnose("--run", str(tmp_path / "launcher.log"), "--json").stdout)
    assert (result["root_cause"], result["rank"]) == ("app_error", 1)
    assert "outcome" not in result and "handled" not in result


REAL_LOG = ROOT / "tests" / "data" / "diagnosis" / "healthy_torchrun_tee_handled_keyerror.log"


def test_the_real_logs_step_after_the_traceback_is_what_makes_it_handled():
    """The corpus's real output (this test's run, kept): handled; without rank 1's later steps, or with them
    unstamped (a dying child's buffered stdout lands after its traceback), or far later, it is the root cause."""
    from opsconsole.diagnosis.engine import HANDLED_WITHIN_LINES, diagnose_lines

    lines = REAL_LOG.read_text().splitlines()
    handled = diagnose_lines(lines)
    assert (handled.root_cause, handled.findings) == (None, ())
    assert [(finding.rank, finding.exception) for finding in handled.handled] == [(1, "KeyError: 'input_ids'")]

    cut = next(i for i, line in enumerate(lines) if line.startswith("[default1]:KeyError"))
    later = lines[cut + 1 :]
    rank1_steps = [line for line in later if line.startswith("[default1]:") and " step " in line]
    assert rank1_steps, "the real run logged rank 1's steps after its traceback"
    others = [line for line in later if line not in rank1_steps]
    unstamped = ["[default1]:" + line.split(" - INFO - ", 1)[1] for line in rank1_steps]
    far = ["[default1]:waiting"] * (HANDLED_WITHIN_LINES + 1) + rank1_steps
    for tail in (others, unstamped + others, far + others):
        result = diagnose_lines(lines[: cut + 1] + tail)
        assert result.root_cause == "app_error" and result.handled == ()
        assert [finding.rank for finding in result.findings] == [1]
