"""Layer rules, checked over the source tree so new files are covered without editing this test."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "opsconsole"
PROBE = PACKAGE / "probe"
SHIPPED = sorted(PROBE.rglob("*.py")) + [PACKAGE / "model.py"]  # what runs on nodes
ALLOWED_PROBE_PREFIXES = ("opsconsole.model", "opsconsole.probe")


def rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def imported_names(node: ast.AST, module_name: str):
    """Absolute module names imported by one Import/ImportFrom node (relative ones resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module_name.split(".")[: -node.level]
            return [".".join(base + ([node.module] if node.module else []))]
        return [node.module]
    return []


def module_name_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts)  # __init__ kept: one level up resolves to the package itself


def module_level_imports(tree: ast.Module):
    """Imports that run at import time: top-level, also inside if/try/with at top level, not in functions."""
    found = []

    def walk(nodes):
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            elif isinstance(node, ast.ClassDef):
                walk(node.body)
            else:
                for name in ("body", "orelse", "finalbody", "handlers"):
                    walk(getattr(node, name, []) or [])

    walk(tree.body)
    return found


def all_imports(tree: ast.Module):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_tree_has_probe_files():
    assert PROBE / "agent.py" in SHIPPED and PACKAGE / "model.py" in SHIPPED


@pytest.mark.parametrize("path", SHIPPED, ids=rel)
def test_shipped_files_parse_as_python_38(path):
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


@pytest.mark.parametrize("path", sorted(PROBE.rglob("*.py")), ids=rel)
def test_probe_imports_only_stdlib_at_module_level(path):
    name = module_name_of(path)
    bad = []
    for node in module_level_imports(parse(path)):
        for module in imported_names(node, name):
            top = module.split(".")[0]
            if module.startswith(ALLOWED_PROBE_PREFIXES) or top == "__future__" or top in sys.stdlib_module_names:
                continue
            bad.append("%s:%d imports %s" % (rel(path), node.lineno, module))
    assert bad == []


@pytest.mark.parametrize("path", sorted(PROBE.rglob("*.py")), ids=rel)
def test_probe_never_imports_asyncssh(path):
    name = module_name_of(path)
    hits = [
        n.lineno for n in all_imports(parse(path)) for m in imported_names(n, name) if m.split(".")[0] == "asyncssh"
    ]
    assert hits == []


NON_TUI = sorted(p for p in PACKAGE.rglob("*.py") if (PACKAGE / "tui") not in p.parents)


@pytest.mark.parametrize("path", NON_TUI, ids=rel)
def test_only_tui_imports_textual(path):
    name = module_name_of(path)
    hits = [n.lineno for n in all_imports(parse(path)) for m in imported_names(n, name) if m.split(".")[0] == "textual"]
    assert hits == []


def test_checks_catch_violations(tmp_path):
    """The AST helpers see the imports they must forbid (so a passing run means something)."""
    tree = ast.parse(
        "import os\nimport psutil\ntry:\n    import pynvml\nexcept ImportError:\n    pass\n"
        "def f():\n    import torch\n    from textual.app import App\n"
    )
    top = [m for n in module_level_imports(tree) for m in imported_names(n, "opsconsole.probe.x")]
    assert top == ["os", "psutil", "pynvml"]
    everywhere = [m for n in all_imports(tree) for m in imported_names(n, "opsconsole.probe.x")]
    assert "textual.app" in everywhere and "torch" in everywhere
    with pytest.raises(SyntaxError):
        ast.parse("match x:\n    case 1:\n        pass\n", feature_version=(3, 8))
    rel_import = ast.parse("from ..model import NodeFrame\n").body[0]
    assert imported_names(rel_import, "opsconsole.probe.agent") == ["opsconsole.model"]
