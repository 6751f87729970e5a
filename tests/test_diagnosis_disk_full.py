"""disk_full is the error itself, not prose about it.

A pre-flight check that says what it guards against ("No space left on device would abort; 120 GiB free") read as
disk_full. The real ENOSPC lines stay disk_full: those of real processes writing to /dev/full (which fails every
write with ENOSPC: Python's OSError, coreutils, bash, torch.save) and every line of the corpora that holds the
message.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from opsconsole.diagnosis.engine import diagnose_lines
from opsconsole.diagnosis.signatures import match_line

DATA = Path(__file__).resolve().parent / "data"
PROSE = (
    "No space left on device would abort; 120 GiB free",
    "preflight: checkpoint dir /scratch/run42 ok, No space left on device will not happen (120 GiB free)",
    "[2026-12-04 10:00:00] INFO disk check: a save of 40 GiB fits; No space left on device could only come from quota",
)


@pytest.mark.parametrize("line", PROSE)
def test_prose_about_a_full_disk_is_not_a_full_disk(line):
    result = diagnose_lines([line])
    assert result.root_cause is None and not result.findings, result.findings


def full_device_output(command: list) -> str:
    """stderr of a real process whose write went to /dev/full (ENOSPC)."""
    done = subprocess.run(command, capture_output=True, timeout=120)
    assert done.returncode != 0
    return done.stderr.decode(errors="replace")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-c", "import os; os.write(os.open('/dev/full', os.O_WRONLY), b'x')"],
        [sys.executable, "-c", "f = open('/dev/full', 'w'); f.write('x'); f.flush()"],
        ["cp", "/etc/hostname", "/dev/full"],
        ["bash", "-c", "echo x > /dev/full"],
    ],
)
def test_a_real_write_to_a_full_device_is_disk_full(command):
    output = full_device_output(command)
    assert "No space left on device" in output
    assert diagnose_lines(output.splitlines()).root_cause == "disk_full", output


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_torch_save_to_a_full_device_is_disk_full():
    pytest.importorskip("torch")
    output = full_device_output([sys.executable, "-c", "import torch; torch.save(torch.ones(1000), '/dev/full')"])
    assert diagnose_lines(output.splitlines()).root_cause == "disk_full", output


def test_every_corpus_line_with_the_message_still_matches_disk_full():
    lines = [
        line
        for path in sorted(DATA.glob("diagnosis*/*.log"))
        for line in path.read_bytes().decode("utf-8", errors="replace").splitlines()
        if "no space left on device" in line.lower() and "/dev/shm" not in line and "</torch_" not in line
    ]
    assert len(lines) >= 10
    for line in lines:
        assert "disk_full" in {category for category, _ in match_line(line)}, line
