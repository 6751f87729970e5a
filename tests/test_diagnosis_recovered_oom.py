"""A CUDA OOM the run caught and recovered from is handled, not the root cause of a run that went on.

The logs are real output of torch on an H200 (tests/data/recovered_oom/README.md): fairseq's trainer messages
around a caught OOM, a loop that logs a torch.OutOfMemoryError with logging.exception and trains on, the same
OOM uncaught, and Lightning's batch size finder followed by an OOM that kills the process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opsconsole.diagnosis.engine import diagnose_lines

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "recovered_oom"


def lines_of(name: str):
    return (DATA / name).read_text(encoding="utf-8").splitlines()


def line_number(lines, text: str) -> int:
    return next(number for number, line in enumerate(lines, 1) if text in line)


def test_fairseqs_recovered_oom_is_handled_by_its_recovery_line():
    lines = lines_of("fairseq_oom.log")
    result = diagnose_lines(lines)
    assert result.root_cause is None and result.findings == ()
    (handled,) = result.handled
    assert handled.category == "cuda_oom"
    assert handled.line == line_number(lines, "OOM: Ran out of memory with exception: CUDA out of memory.")
    recovery = line_number(lines, "attempting to recover from OOM in forward/backward pass")
    assert handled.handled_by.startswith("line %d: " % recovery) and "attempting to recover" in handled.handled_by


def test_an_oom_logged_with_logging_exception_then_later_steps_is_handled():
    lines = lines_of("handled_oom.log")
    result = diagnose_lines(lines)
    assert result.root_cause is None and result.findings == ()
    (handled,) = result.handled
    assert handled.category == "cuda_oom" and "torch.OutOfMemoryError: CUDA out of memory" in handled.excerpt
    assert handled.handled_by == "line %d: %s" % (line_number(lines, "INFO step 3 loss"), lines[7])


def test_an_uncaught_oom_is_still_the_root_cause():
    result = diagnose_lines(lines_of("crash_oom.log"))
    assert result.root_cause == "cuda_oom" and result.handled == ()


def test_a_batch_size_finders_recovery_does_not_hide_a_later_oom_that_killed_the_run():
    """Lightning's 'Batch size 128 failed, trying batch size 64' comes before fit's own OOM, which ended the run."""
    lines = lines_of("lightning_bs.log")
    result = diagnose_lines(lines)
    assert result.root_cause == "cuda_oom" and result.handled == ()
    assert result.verdict.finding.line == line_number(lines, "torch.OutOfMemoryError: CUDA out of memory.")
    assert line_number(lines, "Batch size 128 failed, trying batch size 64") < result.verdict.finding.line


def test_lightnings_batch_size_finder_line_after_a_logged_oom_counts_as_its_recovery():
    """Lightning catches the finder's OOM without printing it; where the training code logs it (the real OOM text),
    the finder's next line says it was survived."""
    lightning = lines_of("lightning_bs.log")
    oom = next(line for line in lines_of("crash_oom.log") if "OutOfMemoryError" in line)
    failed = line_number(lightning, "Batch size 128 failed")
    lines = lightning[: failed - 1] + [oom] + lightning[failed - 1 : failed + 1]  # up to "Finished batch size finder"
    result = diagnose_lines(lines)
    assert result.root_cause is None
    (handled,) = result.handled
    assert handled.line == failed and handled.handled_by.startswith("line %d: Batch size 128 failed" % (failed + 1))


def test_a_recovery_line_without_an_oom_before_it_handles_nothing_else():
    """The recovery line speaks of an OOM: an earlier ValueError traceback of the same file stays a finding."""
    lines = [
        "2026-12-04 10:00:00,001 INFO step 1 loss 2.31",
        "Traceback (most recent call last):",
        '  File "/home/u/train.py", line 30, in main',
        "    out = model(x)",
        "ValueError: bad sample 17",
        "2026-12-04 10:00:05 | WARNING | fairseq.trainer | attempting to recover from OOM in forward/backward pass",
    ]
    result = diagnose_lines(lines)
    assert result.root_cause == "app_error" and result.handled == ()


@pytest.mark.parametrize(
    "line",
    [
        "2026-12-04 10:00:04,001 WARNING CUDA out of memory handling: enabled auto batch size finder",
        "2026-12-04 10:00:04,001 INFO CUDA out of memory retries are on (3 at most)",
    ],
)
def test_prose_naming_the_oom_feature_is_not_an_oom(line):
    """A line that names OOM handling is not one; torch's sentence ends "CUDA out of memory." (see the corpus)."""
    assert diagnose_lines([line]).root_cause is None


def test_torchs_own_oom_lines_still_match():
    for name in ("fairseq_oom.log", "handled_oom.log", "crash_oom.log", "lightning_bs.log"):
        real = [line for line in lines_of(name) if "CUDA out of memory." in line]
        assert real, name
        for line in real:
            assert diagnose_lines([line]).root_cause == "cuda_oom", line


def diagnose(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_diagnose_lists_the_recovered_oom_as_handled_with_its_evidence():
    done = diagnose("--json", str(DATA / "fairseq_oom.log"))
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["root_cause"] is None and document["findings"] == []
    (handled,) = document["handled"]
    assert handled["category"] == "cuda_oom" and "Tried to allocate 256.00 GiB" in handled["excerpt"]
    assert "attempting to recover from OOM" in handled["handled_by"]
    text = diagnose(str(DATA / "handled_oom.log")).stdout
    assert "Root cause" not in text and "No root cause found." in text
    assert "Handled? the rank went on after it: line 7: torch.OutOfMemoryError: CUDA out of memory." in text
    assert "; then line 8: " in text and "INFO step 3 loss" in text
    run = diagnose("--run", "--json", str(DATA / "handled_oom.log"), str(DATA / "fairseq_oom.log"))
    assert run.returncode == 0, run.stderr
    verdict = json.loads(run.stdout)
    assert verdict["root_cause"] is None
    assert sorted(entry["category"] for entry in verdict["handled"]) == ["cuda_oom", "cuda_oom"]
