"""hf_runs: which checkpoint-N/ a trainer_state.json's best_model_checkpoint makes best, by what the named
unit's own trainer_state.json says (a table of the cases; the real Trainer's output is in
test_checkpoints_libraries.py)."""

from __future__ import annotations

import dataclasses

import pytest

from opsconsole.checkpoints.hf_runs import recorded_bests, resume_warnings, written_last
from opsconsole.checkpoints.records import FORMAT_HF, FORMAT_UNKNOWN, CheckpointEntry, CheckpointMeta

STATE_KEYS = ("best_metric", "best_model_checkpoint", "epoch", "global_step", "log_history")


def unit(step, names, metric, written, fmt=FORMAT_HF, read=True):
    """checkpoint-<step>/ whose trainer_state.json (written at `written`, s) names `names` best at `metric`."""
    name = "checkpoint-%d" % step
    meta = CheckpointMeta(
        step=step,
        best_loss=metric,
        best_checkpoint=None if names is None else "/out/checkpoint-%d" % names,
        top_keys=STATE_KEYS if read else (),
    )
    judged = ((name + "/trainer_state.json", 1, step, 100, int(written * 1e9), int(written * 1e9)),)
    return CheckpointEntry(
        path="/out/" + name,
        name=name,
        format=fmt,
        size_bytes=100,
        mtime=written + 5,  # a file added later (a note) is no save: the state's time counts
        is_dir=True,
        meta=meta,
        judged=judged if read else (),
    )


def bests(*entries):
    claims = recorded_bests({e.name: e for e in entries})
    return {(c.name, c.best) for c in claims}, [c.why for c in claims]


@pytest.mark.parametrize(
    "entries, want",
    [
        # One run: the newest names an older checkpoint that named itself at the same metric.
        ((unit(4, 4, 0.9, 10), unit(10, 4, 0.9, 20), unit(12, 4, 0.9, 30)), {("checkpoint-4", True)}),
        # checkpoint-4 written again by a later run (its own state names checkpoint-2): kept, not best.
        (
            (unit(2, 2, 0.95, 40), unit(4, 2, 0.95, 50), unit(12, 4, 0.9, 30)),
            {("checkpoint-2", True), ("checkpoint-4", False)},
        ),
        # Written again, naming itself at another metric (the later run's own best): best by that run only.
        ((unit(4, 4, 0.97, 50), unit(12, 4, 0.9, 30)), {("checkpoint-4", True)}),
        # Its own state records no best (a run without metric_for_best_model): kept, not best.
        ((unit(4, None, None, 50), unit(12, 4, 0.9, 30)), {("checkpoint-4", False)}),
        # Its own state was not read (a directory that cannot be listed): the claim stands.
        ((unit(4, None, None, 10, fmt=FORMAT_UNKNOWN, read=False), unit(12, 4, 0.9, 30)), {("checkpoint-4", True)}),
    ],
)
def test_a_claim_stands_when_the_named_units_own_state_agrees(entries, want):
    got, why = bests(*entries)
    assert got == want, why
    for text in why:
        if text.startswith("recorded best, in doubt"):
            assert "not called best" in text and "checkpoint-12" in text


def test_the_state_written_last_is_told_by_its_own_time_not_a_later_file():
    older_run = unit(12, 12, 0.9, 30)
    later_run = unit(6, 6, 0.5, 40)
    assert written_last([older_run, later_run]) is later_run
    # A note added to checkpoint-10/ at 45: its newest file is after checkpoint-12's state, its state is not.
    noted = dataclasses.replace(unit(10, 10, 0.9, 20), mtime=45.0)
    assert written_last([older_run, noted]) is older_run


def test_two_states_naming_one_unit_give_it_one_reason():
    """A later run's state written last (checkpoint-6) and the newest by step (checkpoint-12) naming the
    same checkpoint-4 that agrees with both: best once, not two reasons for one unit."""
    got, why = bests(unit(4, 4, 0.9, 10), unit(12, 4, 0.9, 30), unit(6, 4, 0.9, 40))
    assert got == {("checkpoint-4", True)} and len(why) == 1, why


def test_resume_true_is_named_only_when_another_run_saved_last():
    """get_last_checkpoint takes the highest checkpoint-N whatever its state: named as it is (the real
    Trainer's two runs are in test_checkpoints_libraries.py)."""
    one_run = (unit(4, 4, 0.9, 10), unit(12, 4, 0.9, 30))
    assert resume_warnings(one_run) == ()
    # One run whose highest save is damaged: the listing's latest is checkpoint-12, a resume takes 14.
    damaged = dataclasses.replace(unit(14, 4, 0.9, 40), integrity="corrupt")
    (said,) = resume_warnings(one_run + (damaged,))
    assert said.startswith("resume_from_checkpoint=True resumes checkpoint-14, the highest step (14), which is corrupt")
    assert "checkpoint-12 (step 12) is the newest sound checkpoint" in said
    older_damaged = dataclasses.replace(unit(2, 2, 0.9, 5), integrity="truncated")
    assert resume_warnings(one_run + (older_damaged,)) == ()  # not the one a resume takes
    two_runs = (unit(12, 12, 0.9, 30), unit(6, 6, 0.5, 40))
    (said,) = resume_warnings(two_runs)
    assert "resumes checkpoint-12, the highest step (12), saved by the earlier run" in said
    assert "stopped at checkpoint-6 (step 6)" in said
    cut = dataclasses.replace(unit(14, 14, 0.9, 35), integrity="truncated")
    (said,) = resume_warnings(two_runs + (cut,))
    assert "resumes checkpoint-14, the highest step (14), which is truncated" in said
    twin = dataclasses.replace(unit(12, 12, 0.9, 30), name="checkpoint-012", path="/out/checkpoint-012")
    (said,) = resume_warnings(two_runs + (twin,))
    assert "resumes one of checkpoint-012, checkpoint-12 (all step 12" in said
