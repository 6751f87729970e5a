"""Shared pytest set-up: fixture paths, and a state directory of the test run's own."""

import os
import tempfile
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE_H200 = FIXTURES / "h200"  # copied from shared/reference/h200: real captures


@pytest.fixture(autouse=True, scope="session")
def private_state_home():
    """Audit logs and recordings that tests cause land in a temp dir, never in the user's ~/.local/state.

    Set in the environment so subprocesses of the tests (the CLI, the console under tmux) inherit it.
    """
    previous = os.environ.get("XDG_STATE_HOME")
    with tempfile.TemporaryDirectory(prefix="opsconsole-test-state-") as state:
        os.environ["XDG_STATE_HOME"] = state
        yield Path(state)
    if previous is None:
        os.environ.pop("XDG_STATE_HOME", None)
    else:
        os.environ["XDG_STATE_HOME"] = previous


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
