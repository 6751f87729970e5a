"""The package's metadata as setuptools builds it: the license is an SPDX expression, and no build warns.

Built with setuptools' own PEP 517 hook (what `pip install .` and `pip install -e .` call first)
from a copy of the tree in a temp dir, so the checkout gets no build/ or egg-info.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_the_license_is_an_spdx_expression_and_setuptools_warns_of_nothing(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "opsconsole", source / "opsconsole", ignore=ignore)
    shutil.copytree(ROOT / "themes", source / "themes", ignore=ignore)
    out = tmp_path / "meta"
    out.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "always",  # every warning printed, however often seen
            "-c",
            "import sys; from setuptools import build_meta; print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))",
            str(out),
        ],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # setuptools said "`project.license` as a TOML table is deprecated" at every install.
    assert "license" not in done.stderr.lower(), done.stderr[-2000:]
    metadata = (out / done.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: MIT" in metadata.splitlines()
    # The expression form needs setuptools 77 (PEP 639): the build requirement says so.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "MIT"
    assert "setuptools>=77" in project["build-system"]["requires"]
