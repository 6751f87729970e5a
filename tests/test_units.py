"""opsconsole.units: one spelling of sizes, rates and durations (IEC binary units)."""

from __future__ import annotations

import math

import pytest

from opsconsole import units
from opsconsole.units import GIB, KIB, MIB, TIB

BYTES = [
    (0, "0 B"),
    (512, "512 B"),
    (1023, "1023 B"),
    (1024, "1.0 KiB"),
    (1536, "1.5 KiB"),
    (537 * KIB + 400, "537 KiB"),  # the Host pane once said 536.9K for this
    (1023.7 * KIB, "1.0 MiB"),  # rounding never reads 1024 KiB
    (97 * MIB, "97 MiB"),
    (9.96 * MIB, "10 MiB"),  # not "10.0 MiB"
    (int(1.5 * GIB), "1.5 GiB"),
    (22525509632, "21 GiB"),  # a GPU process of the H200 fixture: 20.98 GiB
    (150754820096, "140 GiB"),
    (int(1.2 * TIB), "1.2 TiB"),
    (5000 * TIB, "4.9 PiB"),
    (-2048, "-2.0 KiB"),
    (None, "N/A"),
    (math.nan, "N/A"),
    (math.inf, "N/A"),
]


@pytest.mark.parametrize("value, text", BYTES)
def test_bytes(value, text):
    assert units.format_bytes(value) == text


def test_every_size_is_a_number_and_an_iec_unit():
    for exponent in range(0, 60):
        for value in (2**exponent - 1, 2**exponent, 3 * 2**exponent // 2):
            number, unit = units.format_bytes(value).split(" ")
            assert unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
            assert float(number) < 1024 and (unit == "B" or "." not in number or float(number) < 10)


def test_missing_placeholder_is_the_callers():
    assert units.format_bytes(None, missing="-") == "-"
    assert units.format_rate(None, missing="?") == "?"


@pytest.mark.parametrize(
    "value, text", [(12 * MIB, "12 MiB/s"), (0, "0 B/s"), (300.4 * KIB, "300 KiB/s"), (None, "N/A")]
)
def test_rates(value, text):
    assert units.format_rate(value) == text


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (45.9, "45s"),
        (60, "1m00s"),
        (725, "12m05s"),
        (7920, "2h12m"),
        (2 * 86400 + 4 * 3600, "2d04h"),
        (-5, "0s"),
        (None, "N/A"),
        (math.nan, "N/A"),
    ],
)
def test_durations(seconds, text):
    assert units.format_duration(seconds) == text


@pytest.mark.parametrize("seconds, text", [(3.7, "3s"), (150, "2m"), (7200, "2h"), (3 * 86400, "3d"), (None, "N/A")])
def test_ages(seconds, text):
    assert units.format_age(seconds) == text


@pytest.mark.parametrize("seconds, text", [(0.42, "0.4s"), (12, "12s"), (303, "5m03s"), (None, "never")])
def test_frame_ages(seconds, text):
    assert units.format_frame_age(seconds) == text


def test_memory_pair_uses_the_unit_of_the_total():
    assert units.format_memory_pair(21491 * MIB, 150754820096) == "21.0/140.4 GiB"
    assert units.format_memory_pair(512 * MIB, 800 * MIB) == "512/800 MiB"
    assert units.format_memory_pair(None, 800 * MIB) == "N/A/800 MiB"
    assert units.format_memory_pair(None, None) == "N/A"


def test_gib_and_mib_for_labelled_columns():
    assert units.format_gib(21491 * MIB) == "21.0"
    assert units.format_mib(150754820096) == "143771"
    assert units.format_mib(None, missing="?") == "?"
