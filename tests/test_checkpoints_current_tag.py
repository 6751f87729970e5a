"""The tag DeepSpeed's `latest` file (or Megatron's tracker file) names is the `current tag` everywhere.

The Checkpoints pane and cleanup's reasons said "current tag" while `opsconsole checkpoints` marked
the same unit `latest` (and Megatron's reason said "current"): one word now, in the listing, the
plan and the pane. Layouts from the libraries' documented file names (tests/checkpoint_libraries.py),
with a newer tag beside the current one, where "latest" would mislead.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from opsconsole import cli
from tests.checkpoint_libraries import write_deepspeed_layout, write_megatron_layout


def aged(root: Path) -> None:
    old = time.time() - 7200
    for path in root.rglob("*"):
        os.utime(path, (old, old), follow_symlinks=False)


def marks_of(out: str) -> dict:
    """NAME -> MARKS cell of `opsconsole checkpoints`'s table (by the header's column positions)."""
    lines = out.splitlines()
    header = lines[0]
    start, end = header.index("MARKS"), header.index("SERIES")
    return {line.split()[0]: line[start:end].strip() for line in lines[1:] if line and not line[0].isdigit()}


@pytest.mark.parametrize(
    "write, current, newer",
    [
        (lambda root: write_deepspeed_layout(root, latest_tag="global_step200"), "global_step200", "global_step300"),
        (lambda root: write_megatron_layout(root, tracked=200), "iter_0000200", "iter_0000300"),
    ],
    ids=["deepspeed", "megatron"],
)
def test_the_tag_a_tracker_file_names_is_the_current_tag_in_listing_and_plan(tmp_path, capsys, write, current, newer):
    root = tmp_path / "run"
    write(root)
    aged(root)
    assert cli.main(["checkpoints", str(root)]) == 0
    marks = marks_of(capsys.readouterr().out)
    assert marks[current] == "current tag"  # was "latest" (DeepSpeed and Megatron alike)
    assert marks[newer] == ""

    assert cli.main(["cleanup", str(root), "--keep", "1", "--min-age", "0", "--dry-run", "--json"]) == 0
    plan = {Path(i["path"]).name: i for i in json.loads(capsys.readouterr().out)["plan"]["plan"]}
    assert plan[current]["action"] == "keep"
    assert plan[current]["reasons"][0].startswith("current tag (")  # Megatron's said "current (" before


def listed_json(root: Path, capsys) -> dict:
    """NAME -> entry of `opsconsole checkpoints DIR --json`."""
    assert cli.main(["checkpoints", str(root), "--json"]) == 0
    return {Path(c["path"]).name: c for c in json.loads(capsys.readouterr().out)["checkpoints"]}


@pytest.mark.parametrize(
    "write, current, newer",
    [
        (lambda root: write_deepspeed_layout(root, latest_tag="global_step200"), "global_step200", "global_step300"),
        (lambda root: write_megatron_layout(root, tracked=200), "iter_0000200", "iter_0000300"),
    ],
    ids=["deepspeed", "megatron"],
)
def test_json_keeps_latest_for_the_current_tag_and_says_current_tag(tmp_path, capsys, write, current, newer):
    root = tmp_path / "run"
    write(root)
    aged(root)
    listed = listed_json(root, capsys)
    # `latest` stays true (the unit a resume loads: readers depend on it); `current_tag` says that a
    # tracker file names it, so a newer tag may stand beside it (before: no current_tag key).
    assert (listed[current]["latest"], listed[current]["current_tag"]) == (True, True)
    assert (listed[newer]["latest"], listed[newer]["current_tag"]) == (False, False)


def test_json_current_tag_is_false_for_a_latest_that_no_tracker_file_names(tmp_path, capsys):
    from tests.checkpoint_writers import write_seed_layout

    root = tmp_path / "run"
    paths = write_seed_layout(root)  # CheckpointManager: checkpoint_latest.pt links to the newest epoch
    listed = listed_json(root, capsys)
    newest = paths[max(paths)].name
    assert (listed[newest]["latest"], listed[newest]["current_tag"]) == (True, False)
    assert not any(entry["current_tag"] for entry in listed.values())
