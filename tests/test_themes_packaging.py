"""The shipped themes live in the top-level themes/ folder and install as opsconsole/themes/.

Built with setuptools' own PEP 517 hooks (what `pip install .` and `pip install -e .` call) from a
copy of the tree in a temp dir, so the checkout gets no build/ or egg-info.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(path.name for path in (ROOT / "themes").glob("*.toml"))


@pytest.fixture(scope="module")
def source_copy(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "opsconsole", copy / "opsconsole", ignore=ignore)
    shutil.copytree(ROOT / "themes", copy / "themes", ignore=ignore)
    return copy


def build(source: Path, hook: str, out: Path) -> Path:
    out.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta; print(build_meta.%s(sys.argv[1]))" % hook,
            str(out),
        ],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out / done.stdout.strip().splitlines()[-1]


def test_shipped_themes_are_the_top_level_folder():
    assert SHIPPED == ["opsconsole-dark.toml", "opsconsole-high-contrast.toml", "opsconsole-light.toml"]
    assert not (ROOT / "opsconsole" / "themes").exists()


def test_a_wheel_carries_the_themes_as_opsconsole_themes_and_the_console_finds_them(source_copy, tmp_path):
    wheel = build(source_copy, "build_wheel", tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    assert (
        sorted(n.split("/")[-1] for n in names if n.startswith("opsconsole/themes/") and n.endswith(".toml")) == SHIPPED
    )
    assert "opsconsole/tui/app.tcss" in names
    assert not any(n.startswith("themes/") for n in names)  # not a top-level package of its own
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    # The installed copy first on the path; Textual from this venv.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); from opsconsole.tui.themes import THEMES_DIR, load_themes; "
        "themes, problems = load_themes(); print(THEMES_DIR); print(sorted(t.name for t in themes), problems)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(installed)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    where, found = done.stdout.splitlines()
    assert Path(where) == installed / "opsconsole" / "themes"
    assert found == "['opsconsole-dark', 'opsconsole-high-contrast', 'opsconsole-light'] []"


def test_an_editable_install_maps_opsconsole_themes_to_the_folder(source_copy, tmp_path):
    wheel = build(source_copy, "build_editable", tmp_path / "dist")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # -S: only this editable install is on the path (its .pth installs the finder), not the venv's own.
    probe = (
        "import site, sys; site.addsitedir(sys.argv[1]); import importlib.util; "
        "spec = importlib.util.find_spec('opsconsole.themes'); print(list(spec.submodule_search_locations))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe, str(site)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr([str(source_copy / "themes")])
