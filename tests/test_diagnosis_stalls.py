"""Hangs and stragglers from how the logs advance (opsconsole/diagnosis/stalls.py), table-driven."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from opsconsole.config import Config, LogsConfig
from opsconsole.diagnosis.knowledge import STALL_CATEGORY, STRAGGLER_CATEGORY
from opsconsole.diagnosis.stalls import (
    DEFAULT_STALL_AFTER,
    ProgressTracker,
    detect_stalls,
    detect_stragglers,
    parse_step,
    stall_after_from,
)
from opsconsole.logs.records import LogLine, LogSource
from opsconsole.units import format_duration  # the messages' durations

NOW = 100_000.0

STALL_CASES = [
    # (what, last advance per source, stall_after, processes alive, GPUs idle, stalled?)
    ("every rank quiet past stall_after", {"r0": NOW - 700, "r1": NOW - 650}, 600, True, True, True),
    ("exactly at stall_after", {"r0": NOW - 600}, 600, True, True, True),
    ("one rank still writing", {"r0": NOW - 700, "r1": NOW - 5}, 600, True, True, False),
    ("quiet, but not for long enough", {"r0": NOW - 599}, 600, True, True, False),
    ("processes gone: the run ended, not hung", {"r0": NOW - 7200}, 600, False, True, False),
    ("GPUs busy: a long step, not a hang", {"r0": NOW - 7200}, 600, True, False, False),
    ("no sources", {}, 600, True, True, False),
    ("stall detection off", {"r0": NOW - 7200}, 0, True, True, False),
]


@pytest.mark.parametrize(
    "progress,stall_after,alive,idle,stalled", [case[1:] for case in STALL_CASES], ids=[case[0] for case in STALL_CASES]
)
def test_detect_stalls(progress, stall_after, alive, idle, stalled):
    found = detect_stalls(progress, NOW, stall_after, processes_alive=alive, gpus_idle=idle)
    assert bool(found) == stalled
    if stalled:
        (stall,) = found
        assert (stall.category, stall.severity, stall.remedy) == (
            "stall",
            STALL_CATEGORY.severity,
            STALL_CATEGORY.remedy,
        )
        assert "py-spy dump" in stall.remedy and "NCCL_DEBUG=INFO" in stall.remedy
        assert stall.idle_s == pytest.approx(NOW - max(progress.values()))
        assert stall.time == max(progress.values())
        assert "%d source(s)" % len(progress) in stall.excerpt


STRAGGLER_CASES = [
    # (what, last advance, steps, lag_after, lag_steps, expected stragglers)
    (
        "one of four ranks far behind in time",
        {"r0": NOW - 1, "r1": NOW - 2, "r2": NOW - 400, "r3": NOW - 1},
        None,
        300,
        0,
        {"r2"},
    ),
    ("one of two ranks behind counts against the other", {"r0": NOW - 1, "r1": NOW - 400}, None, 300, 0, {"r1"}),
    ("all close together", {"r0": NOW - 1, "r1": NOW - 20, "r2": NOW - 40}, None, 300, 0, set()),
    ("everyone idle is a stall, not a straggler", {"r0": NOW - 900, "r1": NOW - 2000}, None, 300, 0, set()),
    ("a single source has no one to lag", {"r0": NOW - 900}, None, 300, 0, set()),
    (
        "behind by steps while still writing",
        {"r0": NOW - 1, "r1": NOW - 1, "r2": NOW - 1},
        {"r0": 1200, "r1": 1210, "r2": 900},
        300,
        100,
        {"r2"},
    ),
    ("steps within the allowed lag", {"r0": NOW - 1, "r1": NOW - 1}, {"r0": 1200, "r1": 1150}, 300, 100, set()),
    ("step lag off", {"r0": NOW - 1, "r1": NOW - 1}, {"r0": 1200, "r1": 10}, 300, 0, set()),
]


@pytest.mark.parametrize(
    "progress,steps,lag_after,lag_steps,expected",
    [case[1:] for case in STRAGGLER_CASES],
    ids=[case[0] for case in STRAGGLER_CASES],
)
def test_detect_stragglers(progress, steps, lag_after, lag_steps, expected):
    ranks = {key: int(key[1:]) for key in progress}
    found = detect_stragglers(progress, NOW, lag_after, steps=steps, lag_steps=lag_steps, ranks=ranks)
    assert {finding.source for finding in found} == expected
    for finding in found:
        assert finding.category == STRAGGLER_CATEGORY.id and finding.rank == ranks[finding.source]
        if steps and lag_steps:
            assert finding.lag_steps >= lag_steps and "steps behind" in finding.excerpt
        else:
            assert finding.lag_s >= lag_after and "behind the other ranks" in finding.excerpt


def test_a_rank_lagging_in_time_and_steps_gets_one_finding_saying_both():
    progress = {"r0": NOW - 1, "r1": NOW - 2, "r2": NOW - 500}
    (finding,) = detect_stragglers(progress, NOW, 300, steps={"r0": 900, "r1": 905, "r2": 100}, lag_steps=50)
    assert finding.source == "r2" and finding.lag_s == pytest.approx(498.5) and finding.lag_steps == 802
    assert "behind the other ranks" in finding.excerpt and "steps behind" in finding.excerpt


@pytest.mark.parametrize(
    "text,step",
    [
        ("2026-11-29 03:12:07,418 - INFO - epoch 1 step 1200 loss 2.3412", 1200),
        (" [2026-11-29 03:00:10] iteration     1200/   50000 | consumed samples: 1228800 | lm loss: 2.6E+00", 1200),
        ("[Rank 0] step=100, skipped=2, lr=[0.0001], mom=[(0.9, 0.999)]", 100),
        ("global_step=3400 train_loss=1.92", 3400),
        ("Epoch 3:  45%|████▌     | 450/1000 [02:13<02:43,  3.37it/s, loss=0.423]", 450),
        ("iter [1200/5000] loss 0.5", 1200),
        ("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768", None),
        ("number of skipped iterations:   0 | number of nan iterations:   0 |", None),
        ("Checkpoint saved: checkpoints/checkpoint_epoch_3.pt", None),
    ],
)
def test_parse_step(text, step):
    assert parse_step(text) == step


def test_progress_tracker_turns_quiet_logs_into_a_stall_then_a_straggler():
    tracker = ProgressTracker()
    for second in range(0, 60, 10):
        tracker.observe("gpu01:rank0", second, "step %d loss 1.0" % (second * 10), rank=0)
        tracker.observe("gpu02:rank1", second, "step %d loss 1.0" % (second * 10), rank=1)
    assert tracker.check(now=60.0, stall_after=600) == []
    (stall,) = tracker.check(now=50 + 600, stall_after=600)
    assert stall.category == "stall" and stall.idle_s == pytest.approx(600)
    assert tracker.check(now=50 + 600, stall_after=600, gpus_idle=False) == []
    # rank0 moves on; rank1 stays where it was, half of stall_after behind.
    for second in range(60, 400, 10):
        tracker.observe("gpu01:rank0", second, "step %d loss 1.0" % (second * 10))
    (straggler,) = tracker.check(now=400.0, stall_after=600)
    assert (straggler.category, straggler.source, straggler.rank) == ("straggler", "gpu02:rank1", 1)
    (by_steps,) = tracker.check(now=400.0, stall_after=6000, lag_steps=1000)
    assert by_steps.source == "gpu02:rank1" and by_steps.lag_steps == 3900 - 500


def test_progress_tracker_keeps_a_bounded_number_of_sources_and_never_goes_back_in_time():
    tracker = ProgressTracker(max_sources=3)
    for index in range(10):
        tracker.observe("src%d" % index, float(index), "step %d" % index, rank=index)
    assert set(tracker.last_advance) == {"src7", "src8", "src9"}
    assert set(tracker.steps) <= {"src7", "src8", "src9"} and set(tracker.ranks) <= {"src7", "src8", "src9"}
    tracker.observe("src9", 2.0)  # an out-of-order arrival does not move the clock back
    assert tracker.last_advance["src9"] == 9.0


def test_observe_line_takes_the_followers_records():
    source = LogSource("gpu01", "/logs/train_gpu01_rank3_20261202_120000.log", "gpu01", 3, "gpu01:rank3")
    tracker = ProgressTracker()
    tracker.observe_line(LogLine(source, 1, 0, "epoch 1 step 77 loss 2.0"), when=5.0)
    assert (tracker.last_advance[source.key], tracker.steps[source.key], tracker.ranks[source.key]) == (5.0, 77, 3)


@pytest.mark.parametrize(
    "config,expected",
    [
        (Config(), LogsConfig().stall_after),
        (SimpleNamespace(logs=SimpleNamespace(stall_after=90)), 90.0),
        (SimpleNamespace(logs=SimpleNamespace()), DEFAULT_STALL_AFTER),
        (SimpleNamespace(logs=SimpleNamespace(stall_after="soon")), DEFAULT_STALL_AFTER),
        (SimpleNamespace(), DEFAULT_STALL_AFTER),
    ],
)
def test_stall_after_from_config(config, expected):
    assert stall_after_from(config) == expected


@pytest.mark.parametrize(
    "seconds,text", [(0, "0s"), (45.9, "45s"), (60, "1m00s"), (725, "12m05s"), (7380, "2h03m"), (-5, "0s")]
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
