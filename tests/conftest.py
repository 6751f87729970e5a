"""Shared pytest set-up: fixture paths."""

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE_H200 = FIXTURES / "h200"  # copied from shared/reference/h200: real captures


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
