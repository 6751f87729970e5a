"""Hostile config files: special files, huge files, deep nesting, absurd numbers: one line naming the file, exit 2."""

import dataclasses
import datetime
import json
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsconsole.cli import main
from opsconsole.config import SECTIONS, Config, ConfigError, load_config, parse_config
from tests.cli_errors import assert_one_line_exit_2


def cli_with_config(capsys, path):
    """`opsconsole snapshot --config PATH`: a config error exits before any node is polled."""
    code = main(["snapshot", "--config", str(path)])
    return code, capsys.readouterr().err


# --- what the file is -----------------------------------------------------------


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, capsys):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    assert_one_line_exit_2(*cli_with_config(capsys, fifo), str(fifo), "not a regular file (a FIFO)")


def test_dev_zero_is_refused_before_reading(capsys):
    assert_one_line_exit_2(*cli_with_config(capsys, "/dev/zero"), "/dev/zero", "not a regular file (a device)")


def test_a_huge_file_is_refused_after_reading_at_most_the_cap(tmp_path, capsys):
    big = tmp_path / "big.toml"
    big.write_bytes(b"# comment\n" * 200_000)  # 2 MB
    assert_one_line_exit_2(*cli_with_config(capsys, big), str(big), "larger than 1024 KiB")
    exactly = tmp_path / "cap.toml"
    exactly.write_bytes(b"#" * (1024 * 1024 - 1) + b"\n")
    assert load_config(str(exactly), {}).source == str(exactly)


def test_a_symlink_to_a_device_is_refused(tmp_path):
    link = tmp_path / "config.toml"
    link.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="a device"):
        load_config(str(link), {})


# --- nesting ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "x = " + "[" * 5000,  # the report: a 3,000-line traceback
        "x = " + "[" * 990 + "]" * 990,  # valid TOML that tomllib cannot recurse into
        "x = " + "{a = " * 990 + "1" + "}" * 990,
        "[console]\ntheme = " + "[" * 5000,
    ],
)
def test_deep_nesting_is_one_line_naming_the_file(tmp_path, capsys, text):
    path = tmp_path / "deep.toml"
    path.write_text(text)
    assert_one_line_exit_2(*cli_with_config(capsys, path), str(path))


def test_nesting_the_key_locator_cannot_follow_keeps_the_lines_it_found():
    deep = "[" * 400 + "]" * 400  # tomllib reads it; the locator's recursion gives up, quietly
    with pytest.raises(ConfigError) as info:
        parse_config("[console]\ninterval = 2\n\n[ssh]\nknown_hosts = %s\n" % deep, "c.toml")
    assert str(info.value) == "c.toml:5: ssh.known_hosts: expected a string, got an array"


# --- numbers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ("[console]\ninterval = 1e-300\n", "c.toml:2: console.interval: must be at least 0.1, got 1e-300"),
        ("[console]\ninterval = 0.05\n", "c.toml:2: console.interval: must be at least 0.1, got 0.05"),
        ("[console]\ninterval = nan\n", "c.toml:2: console.interval: expected a finite number, got nan"),
        ("[console]\ninterval = 1e400\n", "c.toml:2: console.interval: expected a finite number, got inf"),
        ("[console]\ninterval = 1e9\n", "c.toml:2: console.interval: must be at most 3600.0, got 1000000000.0"),
        (
            "[console]\ninterval = %s\n" % ("9" * 400),
            "c.toml:2: console.interval: expected a finite number, got an integer of 400 digits",
        ),
        ("[console]\ninterval = %s\n" % ("9" * 5000), "c.toml: syntax: invalid value: a number too long to read"),
        ("[ssh]\nkeepalive_interval = 1e-9\n", "c.toml:2: ssh.keepalive_interval: must be at least 0.1, got 1e-09"),
        ("[ssh]\nconnect_timeout = 1e300\n", "c.toml:2: ssh.connect_timeout: must be at most 86400.0, got 1e+300"),
        ("[ssh]\nbackoff_initial = 1e-300\n", "c.toml:2: ssh.backoff_initial: must be at least 0.05, got 1e-300"),
        ("[ssh]\nmax_logins = 100000\n", "c.toml:2: ssh.max_logins: must be at most 256, got 100000"),
        (
            "[ssh]\nkeepalive_count_max = 1000000\n",
            "c.toml:2: ssh.keepalive_count_max: must be at most 100, got 1000000",
        ),
        ("[logs]\npoll_interval = 0\n", "c.toml:2: logs.poll_interval: must be at least 0.05, got 0"),
        ("[logs]\nrescan_interval = 1e-300\n", "c.toml:2: logs.rescan_interval: must be at least 0.1, got 1e-300"),
        ("[logs]\nmax_lines = 10000000000\n", "c.toml:2: logs.max_lines: must be at most 10000000, got 10000000000"),
        ("[record]\nchunk_s = 1e9\n", "c.toml:2: record.chunk_s: must be at most 60.0, got 1000000000.0"),
        ("[record]\nchunk_s = 0.001\n", "c.toml:2: record.chunk_s: must be at least 1.0, got 0.001"),
        ("[record]\nmax_mb = 1e300\n", "c.toml:2: record.max_mb: must be at most 1000000.0, got 1e+300"),
        (
            "[actions]\ncommand_timeout_s = 1e12\n",
            "c.toml:2: actions.command_timeout_s: must be at most 86400.0, got 1000000000000.0",
        ),
        (
            "[alerting]\nhook_timeout_s = 1e12\n",
            "c.toml:2: alerting.hook_timeout_s: must be at most 3600.0, got 1000000000000.0",
        ),
        (
            '[[sources]]\nurl = "http://p:9090"\ninterval = 0.001\n',
            "c.toml:3: sources[0].interval: must be at least 0.1, got 0.001",
        ),
        (
            '[[sources]]\nurl = "http://p:9090"\nslow_every = 10000000\n',
            "c.toml:3: sources[0].slow_every: must be at most 10000, got 10000000",
        ),
        (
            '[[nodes]]\nhost = "a"\nport = %s\n' % ("9" * 40),
            "c.toml:3: nodes[0].port: must be between 1 and 65535, got an integer of 40 digits",
        ),
        (
            '[[checkpoints]]\npath = "/c"\nkeep = 1000000000000\n',
            "c.toml:3: checkpoints[0].keep: must be at most 1000000, got 1000000000000",
        ),
    ],
)
def test_numbers_need_a_floor_a_ceiling_and_finiteness(text, message):
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.toml")
    assert str(info.value) == message


def test_the_floors_themselves_are_accepted():
    cfg = parse_config(
        "[console]\ninterval = 0.1\n[ssh]\nkeepalive_interval = 0.1\n"
        "[logs]\npoll_interval = 0.05\n[record]\nchunk_s = 60\n",
        "c.toml",
    )
    assert (cfg.console.interval, cfg.ssh.keepalive_interval, cfg.logs.poll_interval, cfg.record.chunk_s) == (
        0.1,
        0.1,
        0.05,
        60.0,
    )


def test_cli_interval_has_the_same_floor(capsys):
    assert main(["--interval", "1e-300", "snapshot"]) == 2
    assert "--interval" in capsys.readouterr().err
    assert main(["--interval", "inf", "snapshot"]) == 2


# --- fuzz ----------------------------------------------------------------------------

# Budgets are small (conftest: derandomized, no deadline): both tests together take about a second.


def numbers_in(value):
    """Every int and float inside a Config (dataclasses, tuples)."""
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            yield from numbers_in(getattr(value, f.name))
    elif isinstance(value, tuple):
        for item in value:
            yield from numbers_in(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def parsed_or_clean_error(text):
    try:
        config = parse_config(text, "f.toml")
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("f.toml")
        return None
    assert isinstance(config, Config)
    for number in numbers_in(config):
        assert math.isfinite(number)
    return config


TOML_PIECES = st.sampled_from(
    [
        "[",
        "]",
        "[[",
        "]]",
        "{",
        "}",
        "=",
        ",",
        ".",
        '"',
        "'",
        '"""',
        "\n",
        " ",
        "#",
        "\\",
        "x",
        "1",
        "1e400",
        "nan",
        "inf",
        "-",
        "+",
        "_",
        "0x",
        "true",
        "1979-05-27",
        "T07:32:00",
        "console",
        "nodes",
        "interval",
        "host",
        "ssh",
        "port",
        "keys",
        "\x00",
        "\r",
        "\u2028",
        "é",
    ]
)


@settings(max_examples=150)
@given(pieces=st.lists(TOML_PIECES, max_size=40))
def test_fuzz_toml_ish_text_is_a_config_or_a_config_error(pieces):
    parsed_or_clean_error("".join(pieces))


def toml_value(value):
    """A TOML spelling of a parsed value (tomllib's types), for the generator below."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join("%s = %s" % (toml_string(k), toml_value(v)) for k, v in value.items()) + "}"


def toml_string(text):
    # JSON's escapes are TOML's (\uXXXX for controls); DEL is the one control JSON leaves raw.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007F")


SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.integers(min_value=10**300, max_value=10**400),  # beyond a float: once an OverflowError
    st.floats(),
    st.floats(min_value=-1e-300, max_value=1e-300),
    st.text(max_size=12),
    st.sampled_from(["strict", "accept-new", "gpu[01-04]", "http://p:9090", "{index}", "~/x", "", " "]),
    st.dates(),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)
ARRAY_SECTIONS = ("nodes", "checkpoints", "alerts", "sources")


@st.composite
def documents(draw):
    """A valid TOML document: known sections and keys with values of any type."""
    lines = []
    for section in draw(st.lists(st.sampled_from(sorted(SECTIONS)), max_size=4, unique=True)):
        keys = draw(st.lists(st.sampled_from(SECTIONS[section]), max_size=5, unique=True))
        entries = draw(st.integers(1, 2)) if section in ARRAY_SECTIONS else 1
        for _ in range(entries):
            lines.append("[[%s]]" % section if section in ARRAY_SECTIONS else "[%s]" % section)
            for key in keys:
                lines.append("%s = %s" % (key, toml_value(draw(VALUES))))
    return "\n".join(lines) + "\n"


@settings(max_examples=120)
@given(text=documents())
def test_fuzz_valid_toml_with_any_value_at_known_keys_is_a_config_or_a_config_error(text):
    parsed_or_clean_error(text)
