"""Shared pytest set-up: fixture paths, and a state directory of the test run's own."""

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# The fuzz tests of every decoder share one fixed budget (about 60 s in all on CI's 2 cores): a
# bounded number of examples each, no per-example deadline (the machine is shared and noisy), and
# no example database (CI's checkout is fresh; a found case becomes a regression test by hand).
settings.register_profile(
    "opsconsole",
    max_examples=150,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.filter_too_much),
)
settings.load_profile("opsconsole")

# Pilot.press waits twice after every key until the app has used under 5% of a CPU over one window of
# textual._wait.SLEEP_GRANULARITY (20 ms): 40 ms a key at the least, most of a TUI test's time (a
# 30-key test spent 1.2 s just waiting). A 5 ms window keeps the same idle criterion (CPU under 5%
# of the window) and checks it four times as often. Textual keeps the window in that private module,
# with no public setting: where a Textual release lacks it, Pilot keeps its own (slower, not wrong).
# Measured: tests/test_tui_app.py 28.4 s -> 18.6 s, tests/test_tui_panes.py 8.1 s -> 5.1 s; the 316
# tests that run the app passed with it.
try:
    import textual._wait as _textual_wait
except ImportError:  # pragma: no cover - textual is a dependency
    _textual_wait = None
if _textual_wait is not None and hasattr(_textual_wait, "SLEEP_GRANULARITY") and hasattr(_textual_wait, "SLEEP_IDLE"):
    _textual_wait.SLEEP_GRANULARITY = 0.005
    _textual_wait.SLEEP_IDLE = _textual_wait.SLEEP_GRANULARITY / 20.0

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE_H200 = FIXTURES / "h200"  # copied from shared/reference/h200: real captures


@pytest.fixture(autouse=True, scope="session")
def private_state_home():
    """Audit logs, recordings and caches that tests cause land in a temp dir, never in the user's home.

    Set in the environment so subprocesses of the tests (the CLI, the console under tmux) inherit it.
    """
    previous = {name: os.environ.get(name) for name in ("XDG_STATE_HOME", "XDG_CACHE_HOME")}
    with tempfile.TemporaryDirectory(prefix="opsconsole-test-state-") as state:
        os.environ["XDG_STATE_HOME"] = state
        os.environ["XDG_CACHE_HOME"] = os.path.join(state, "cache")  # kept checkpoint proofs (proofs.py)
        yield Path(state)
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


# Tests that train or launch with the real training libraries (Lightning, Hugging Face, accelerate, DCP,
# torchrun): marked `libraries`, so scripts/test runs and times them apart from the rest of the suite.
LIBRARY_FIXTURES = {
    "lightning_run",
    "hf_run",
    "accelerate_run",
    "dcp_run",
    "demo_run",
    "hung_job",
    "gloo_dumps",
    "hung_gloo_job",  # test_flight_recorder's live 2-rank torchrun job
}
LIBRARY_FILES = {"test_checkpoints_libraries.py", "test_diagnosis_torchrun.py", "test_diagnosis_multinode.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if LIBRARY_FIXTURES & set(getattr(item, "fixturenames", ())) or item.path.name in LIBRARY_FILES:
            item.add_marker(pytest.mark.libraries)
