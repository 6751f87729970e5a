"""A file named .safetensors whose first bytes are no safetensors header: corrupt, said why, never deleted.

The files are real (written here, and by the safetensors library itself for the one cut short); the
safetensors library's own safe_open refuses each damaged one, so the listing's `corrupt` is the
library's verdict too, not a guess.
"""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from opsconsole import cli
from opsconsole.checkpoints.cache import ResultCache
from opsconsole.checkpoints.scan import scan_directory

GARBAGE = bytes(range(100, 164))  # 64 bytes: its first 8, read as a header length, are far over the limit


def damaged_files():
    """(name, bytes, words of the problem) of files the safetensors library refuses."""
    return [
        ("x.safetensors", GARBAGE, "over the 100 MB limit"),
        # A length that fits under the limit but points past the end, and no `{` where the header starts.
        ("past.safetensors", struct.pack("<Q", 1000) + b"garbage!" * 7, "points past the end of the file"),
        # A length inside the file, over bytes that are no JSON.
        ("notjson.safetensors", struct.pack("<Q", 10) + b"not json!!" + b"\x01" * 46, "header is not JSON"),
    ]


def listing(root: Path):
    return {e.name: e for e in scan_directory(str(root), cache=ResultCache(), crc_cache=ResultCache()).entries}


def refused_by_safetensors(path: Path) -> bool:
    try:
        with safe_open(str(path), "pt") as handle:
            list(handle.keys())
    except SafetensorError:
        return True
    return False


@pytest.mark.parametrize("name, data, words", damaged_files(), ids=["over-limit", "past-end", "not-json"])
def test_a_lone_garbage_safetensors_file_is_corrupt_and_not_managed(tmp_path, capsys, name, data, words):
    path = tmp_path / name
    path.write_bytes(data)
    assert refused_by_safetensors(path)  # the library itself says it is damaged
    entry = listing(tmp_path)[name]
    assert (entry.format, entry.integrity) == ("safetensors", "corrupt")  # was ("unknown", "unchecked")
    assert words in entry.problem
    assert entry.series is None and entry.unmanaged

    assert cli.main(["checkpoints", str(tmp_path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(name))
    assert " corrupt " in row and "not managed" in row and words in row


def test_a_cut_short_safetensors_file_is_still_truncated(tmp_path):
    # Written by the library, then cut inside its header: what there is starts as a header does.
    save_file({"w": torch.zeros(4)}, str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:20])
    assert refused_by_safetensors(tmp_path / "cut.safetensors")
    entries = listing(tmp_path)
    assert entries["model.safetensors"].integrity == "ok"
    assert entries["cut.safetensors"].integrity == "truncated"


def test_garbage_named_as_a_series_member_is_never_a_deletion_candidate(tmp_path, capsys):
    # A numbered name makes a series of it; before, its content made it "format not recognised" and
    # never a candidate. Corrupt now, it must not become one.
    old = time.time() - 7 * 86400
    for number, (_, data, _) in enumerate(damaged_files()):
        path = tmp_path / ("model_step_%d.safetensors" % number)
        path.write_bytes(data)
        os.utime(path, (old, old))
    assert cli.main(["cleanup", str(tmp_path), "--keep", "0", "--min-age", "0", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]["plan"]
    assert len(plan) == 3 and all(item["action"] == "keep" and not item["managed"] for item in plan)
    entries = listing(tmp_path)
    assert {e.integrity for e in entries.values()} == {"corrupt"}
