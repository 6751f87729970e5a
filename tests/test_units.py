"""opsconsole.units: one spelling of every quantity (IEC binary units for sizes)."""

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


@pytest.mark.parametrize(
    "func, value, text",
    [
        (units.format_percent, 100.0, "100%"),
        (units.format_percent, 100.6, "101%"),  # a process on more than one core: Host once said 100.6, Processes 101%
        (units.format_percent, 7.0, "7%"),
        (units.format_percent, 0.5, "0.5%"),
        (units.format_percent, 7.02, "7%"),  # not "7.0%"
        (units.format_percent, None, "N/A"),
        (units.format_percent, math.nan, "N/A"),
        (units.format_temperature, 61.6, "62°C"),
        (units.format_temperature, None, "N/A"),
        (units.format_power, 692.4, "692 W"),
        (units.format_power, 581.5, "582 W"),  # rounded as the pair rounds it (the GPUs pane once truncated: 581)
        (units.format_power, 12345.0, "12.3 kW"),
        (units.format_power, math.inf, "N/A"),
        (units.format_clock, 1980, "1980 MHz"),
        (units.format_clock, None, "N/A"),
        (units.format_ms, 0.8, "0.8 ms"),
        (units.format_ms, 12.4, "12 ms"),
        (units.format_ms, 1500, "1.5 s"),
    ],
)
def test_readings(func, value, text):
    assert func(value) == text


def test_a_reading_over_its_ceiling_names_the_unit_once():
    assert units.format_power_pair(692.4, 700.0) == "692/700 W"
    assert units.format_power_pair(581.5, 700.0) == "582/700 W"  # the same number format_power says
    assert units.format_power_pair(692.4, None) == "692 W"
    assert units.format_power_pair(None, 700.0) == "N/A/700 W"
    assert units.format_power_pair(None, None, missing="?") == "?"
    assert units.format_temperature_pair(61.6, 89.0) == "62/89°C"
    assert units.format_temperature_pair(61.6, None) == "62°C"


def test_pcie_link():
    assert units.format_pcie_link(5, 16) == "gen5 x16"
    assert units.format_pcie_link(4, None) == "gen4 xN/A"
    assert units.format_pcie_link(None, 16) == "N/A"


def test_a_reading_beside_its_limit_keeps_the_decimals_that_tell_them_apart():
    # "/: 10% free (minimum 10%)" for a failing 9.96 % would read as a pass; a health message and an
    # alert compare a reading with a limit, and say it with the limit's spelling.
    assert units.format_percent(9.96, limit=10) == "9.96%"
    assert units.format_percent(90.4, limit=90) == "90.4%"
    assert units.format_percent(89.99, limit=90) == "89.99%"
    assert units.format_percent(50.4, limit=90) == "50%"  # far from it: whole, as everywhere
    assert units.format_percent(10.0, limit=10) == "10%"
    assert units.format_temperature(85.4, limit=85) == "85.4°C"
    assert units.format_temperature(91.0, limit=85) == "91°C"
    assert units.format_power(700.4, limit=700) == "700.4 W"
    assert units.format_power(650.4, limit=700) == "650 W"


@pytest.mark.parametrize(
    "value, text",
    [
        (0.0099, "0.009900"),  # beside 0.01: four significant digits each, the zeros among them kept
        (0.01, "0.01000"),
        (0.012345, "0.01235"),
        (2.3456789, "2.346"),
        (0.5, "0.5000"),
        (1234.5, "1234"),  # no bare point
        (12345.6, "1.235e+04"),
        (3e-5, "3.000e-05"),
        (-0.5, "-0.5000"),
        (100, "100"),  # a whole-number metric (eval_samples) as it is
        (float("nan"), "nan"),
        (float("inf"), "inf"),
        (None, "N/A"),
        (True, "N/A"),
    ],
)
def test_losses_and_metrics(value, text):
    assert units.format_metric(value) == text
