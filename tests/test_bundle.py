"""The probe bundle: one script on stdin to `python3 -` runs the real probe, and only the embedded copy."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opsconsole.model import NodeFrame, from_wire
from opsconsole.nodes.bundle import (
    UNSUPPORTED_EXIT,
    UNSUPPORTED_MARKER,
    build_probe_bundle,
    bundle_modules,
    probe_bundle,
)
from opsconsole.nodes.ssh import unusable_python_reason

PROBE_DIR = Path(__file__).resolve().parent.parent / "opsconsole" / "probe"


def run_bundle(args, cwd, isolated=True, source=None):
    argv = [sys.executable] + (["-I"] if isolated else []) + ["-"] + list(args)
    return subprocess.run(
        argv,
        input=source if source is not None else probe_bundle(),
        capture_output=True,
        text=True,
        cwd=str(cwd),
        timeout=60,
    )


def decode_frames(stdout: str):
    return [from_wire(NodeFrame, json.loads(line)) for line in stdout.splitlines() if line.strip()]


def test_bundle_carries_model_and_every_probe_module():
    names = [name for name, _, _ in bundle_modules()]
    expected = {
        "opsconsole.probe." + p.stem for p in PROBE_DIR.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    }
    assert "opsconsole.model" in names and "opsconsole.probe" in names
    assert expected <= set(names)
    text = probe_bundle()
    for name in expected | {"opsconsole.model", "opsconsole", "opsconsole.probe"}:
        assert repr(name) in text


def test_bundle_and_its_modules_parse_as_python_3_8():
    ast.parse(probe_bundle(), feature_version=(3, 8))
    for name, path, _ in bundle_modules():
        ast.parse(Path(path).read_text(), filename=path, feature_version=(3, 8))


def test_bundle_is_cached_and_matches_the_sources():
    assert probe_bundle() is probe_bundle()
    assert probe_bundle() == build_probe_bundle()


def test_bundle_on_stdin_prints_one_real_frame(tmp_path):
    # -I and a neutral cwd: nothing of the console's checkout is on sys.path except site-packages.
    result = run_bundle(["--once", "--node-name", "bundled", "--disk", "/", "--top", "3"], cwd="/tmp")
    assert result.returncode == 0, result.stderr
    frames = decode_frames(result.stdout)
    assert len(frames) == 1
    frame = frames[0]
    assert frame.node == "bundled" and frame.seq == 1
    assert frame.host is not None and frame.host.hostname == os.uname().nodename
    assert frame.host.cpu_count == os.cpu_count()
    assert [d.path for d in frame.host.disks] == ["/"]
    assert len(frame.top_processes) <= 3


def test_bundle_streams_frames_until_its_reader_goes(tmp_path):
    argv = [sys.executable, "-I", "-", "--interval", "0.2", "--top", "0"]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp"
    )
    try:
        proc.stdin.write(probe_bundle())
        proc.stdin.close()
        lines = [proc.stdout.readline() for _ in range(3)]
    finally:
        proc.stdout.close()  # the agent stops quietly on EPIPE
        proc.wait(timeout=10)
    frames = decode_frames("".join(lines))
    assert [f.seq for f in frames] == [1, 2, 3]


def test_bundle_ignores_an_opsconsole_package_in_the_working_directory(tmp_path):
    # A stale or hostile opsconsole on the node's sys.path (cwd comes first for `python -`) must not be used.
    fake = tmp_path / "opsconsole"
    (fake / "probe").mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('the installed opsconsole was imported')\n")
    (fake / "model.py").write_text("raise ImportError('the installed model was imported')\n")
    (fake / "probe" / "__init__.py").write_text("raise ImportError('the installed probe was imported')\n")
    result = run_bundle(["--once", "--top", "0"], cwd=tmp_path, isolated=False)
    assert result.returncode == 0, result.stderr
    assert len(decode_frames(result.stdout)) == 1
    # The same cwd without the bundle does pick the fake up, so the test would notice a leak.
    probe = subprocess.run(
        [sys.executable, "-c", "import opsconsole"], cwd=str(tmp_path), capture_output=True, text=True
    )
    assert "installed opsconsole was imported" in probe.stderr


def test_bundle_bad_arguments_exit_2_with_usage():
    result = run_bundle(["--interval", "-1"], cwd="/tmp")
    assert result.returncode == 2
    assert "usage" in result.stderr


def test_old_python_gets_a_marker_not_a_syntax_error():
    # Stand in for Python 3.5 by faking version_info before the bundle's own check runs.
    source = "import sys\nsys.version_info = (3, 5, 9)\n" + probe_bundle()
    result = run_bundle(["--once"], cwd="/tmp", source=source)
    assert result.returncode == UNSUPPORTED_EXIT
    assert result.stderr.startswith(UNSUPPORTED_MARKER)
    why = unusable_python_reason(result.returncode, result.stderr.splitlines())
    assert why is not None and "older than 3.6" in why


@pytest.mark.parametrize(
    "status, output, unusable",
    [
        (127, ["bash: line 1: python3: command not found"], "command not found"),
        (127, ["bash: line 1: /nonexistent/python3: No such file or directory"], "No such file"),
        (126, ["bash: /usr/bin/python3: Permission denied"], "Permission denied"),
        (1, ['  File "<stdin>", line 12', "SyntaxError: invalid syntax"], "python too old"),
        (1, ["env: 'python3': No such file or directory"], "No such file"),
        (1, ["Traceback (most recent call last):", "RuntimeError: boom"], None),
        (0, [], None),
        (None, [], None),
    ],
)
def test_unusable_python_reason_table(status, output, unusable):
    why = unusable_python_reason(status, output)
    if unusable is None:
        assert why is None
    else:
        assert why is not None and unusable in why
