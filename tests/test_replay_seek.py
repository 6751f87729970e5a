"""The replay's "go to" text: every form it accepts, and clear errors for the rest."""

import time

import pytest

from opsconsole.recording.seek import SeekError, offset_seconds, offset_text, seek_target

START = time.mktime(time.strptime("2026-12-02 14:00:00", "%Y-%m-%d %H:%M:%S"))
END = START + 3600
POS = START + 600


@pytest.mark.parametrize(
    "text, expected",
    [
        ("+30s", POS + 30),
        ("-5m", POS - 300),
        ("+1h", END),
        ("-2h", START),
        ("90", START + 90),
        ("2m", START + 120),
        ("1.5m", START + 90),
        ("50%", START + 1800),
        ("0%", START),
        ("150%", END),
        ("14:05", START + 300),
        ("14:05:30", START + 330),
        ("2026-12-02 14:59:59", START + 3599),
        ("  +10  ", POS + 10),
        # m:ss and h:mm:ss as the replay bar shows them (2:25 jumped to 0:00 as 02:25 at night).
        ("2:25", START + 145),
        ("0:05", START + 5),
        ("59:59", START + 3599),
        ("13:00", START + 780),
        ("+1:30", POS + 90),
        ("-0:30", POS - 30),
        ("+0:01:00", POS + 60),
        ("-1:00:00", START),
        ("1:02:03", START),  # past the end as an offset: the clock time 01:02:03, before the start
    ],
)
def test_seek_target(text, expected):
    assert seek_target(text, START, END, POS) == pytest.approx(expected)


def test_a_recording_longer_than_an_hour_reads_h_mm_ss_offsets():
    end = START + 3 * 3600
    assert seek_target("1:02:03", START, end, START) == START + 3723
    assert seek_target("14:30", START, end, START) == START + 1800  # inside the recording: the clock


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 90),
        ("2m", 120),
        ("1.5h", 5400),
        ("2:25", 145),
        ("1:02:03", 3723),
        ("0:00", 0),
        (" 10s ", 10),
    ],
)
def test_offset_seconds(text, seconds):
    assert offset_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "-5", "+5", "2:75", "1:60:00", "soon", "1e999", "9" * 400, "50%", "14:05:99"])
def test_offset_seconds_refuses(text):
    with pytest.raises(SeekError):
        offset_seconds(text)


def test_offset_text_is_the_bars_format():
    assert [offset_text(s) for s in (0, 145, 3599, 3723)] == ["0:00", "2:25", "59:59", "1:02:03"]
    assert all(offset_seconds(offset_text(s)) == s for s in (0, 59, 61, 3600, 86399))


@pytest.mark.parametrize("text", ["", "soon", "14:99", "x%", "2026-13-40 10:00", "nan%", "inf%", "-inf%", "1e999%"])
def test_seek_target_refuses_what_names_no_time(text):
    with pytest.raises(SeekError):
        seek_target(text, START, END, POS)


@pytest.mark.parametrize("text, expected", [("9" * 400, END), ("+" + "9" * 400, END), ("-" + "9" * 400, START)])
def test_seek_target_clamps_numbers_too_large_for_a_float(text, expected):
    """ "nan%" once became a NaN position; a huge number is inf, clamped like any far target."""
    assert seek_target(text, START, START, START) == START
    assert seek_target(text, START, END, POS) == expected
