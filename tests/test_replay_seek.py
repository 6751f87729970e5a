"""The replay's "go to" text: every form it accepts, and clear errors for the rest."""

import time

import pytest

from opsconsole.recording.seek import SeekError, seek_target

START = time.mktime(time.strptime("2026-12-02 14:00:00", "%Y-%m-%d %H:%M:%S"))
END = START + 3600
POS = START + 600


@pytest.mark.parametrize(
    "text, expected",
    [
        ("+30s", POS + 30), ("-5m", POS - 300), ("+1h", END), ("-2h", START),
        ("90", START + 90), ("2m", START + 120), ("1.5m", START + 90),
        ("50%", START + 1800), ("0%", START), ("150%", END),
        ("14:05", START + 300), ("14:05:30", START + 330), ("2026-12-02 14:59:59", START + 3599),
        ("13:00", START), ("  +10  ", POS + 10),
    ],
)
def test_seek_target(text, expected):
    assert seek_target(text, START, END, POS) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "soon", "14:99", "x%", "2026-13-40 10:00", "nan%", "inf%", "-inf%", "1e999%"])
def test_seek_target_refuses_what_names_no_time(text):
    with pytest.raises(SeekError):
        seek_target(text, START, END, POS)


@pytest.mark.parametrize("text, expected", [("9" * 400, END), ("+" + "9" * 400, END), ("-" + "9" * 400, START)])
def test_seek_target_clamps_numbers_too_large_for_a_float(text, expected):
    """ "nan%" once became a NaN position; a huge number is inf, clamped like any far target."""
    assert seek_target(text, START, START, START) == START
    assert seek_target(text, START, END, POS) == expected
