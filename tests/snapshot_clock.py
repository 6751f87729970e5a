"""The snapshot tests' clock zone: consoles print local time, so each snapshot test module imports
`utc_clock` (an autouse fixture) and draws in UTC, the same on every machine."""

from __future__ import annotations

import time

import pytest


@pytest.fixture(autouse=True)
def utc_clock(monkeypatch):
    """Local time is UTC for the test, then what it was."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
