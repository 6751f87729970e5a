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
