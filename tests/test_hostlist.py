"""Hostlist expansion and compression through python-hostlist, with the console's checks and messages."""

import pytest

from opsconsole.hostlist import collect_hostlist, expand_hostlist

EXPANSIONS = [
    ("gpu01", ["gpu01"]),
    ("gpu[001-003,020]", ["gpu001", "gpu002", "gpu003", "gpu020"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("n1,n2,gpu[01-02]", ["n1", "n2", "gpu01", "gpu02"]),
    ("x[9-11]y", ["x9y", "x10y", "x11y"]),  # no padding when the start has one digit
    ("x[08-10]", ["x08", "x09", "x10"]),  # padding comes from the start's width
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("[1-3]", ["1", "2", "3"]),
    ("n[5]", ["n5"]),
    ("a,,b", ["a", "b"]),
    ("  gpu[1-2]  ", ["gpu1", "gpu2"]),  # surrounding blanks are ignored
]

BAD_PATTERNS = [
    ("gpu[01-", "unbalanced brackets"),
    ("gpu]", "unbalanced brackets"),
    ("gpu[[1]]", "nested brackets"),
    ("gpu[]", "bad range"),
    ("gpu[a-b]", "bad range"),
    ("gpu[1-]", "bad range"),
    ("gpu[5-1]", "start > stop"),
    ("gpu[1-1000000]", "range too large"),
]


@pytest.mark.parametrize("pattern, hosts", EXPANSIONS)
def test_expand_hostlist(pattern, hosts):
    assert expand_hostlist(pattern) == hosts


@pytest.mark.parametrize("pattern, reason", BAD_PATTERNS)
def test_bad_pattern_raises_value_error(pattern, reason):
    with pytest.raises(ValueError) as info:
        expand_hostlist(pattern)
    assert str(info.value) == f'bad hostlist "{pattern}": {reason}'


@pytest.mark.parametrize(
    "pattern, message",
    [
        ("", 'bad hostlist "": names no hosts'),
        (",", 'bad hostlist ",": names no hosts'),
        ("gpu[1-2], n1", 'bad hostlist "gpu[1-2], n1": host names cannot contain whitespace'),
        ("a\nb", 'bad hostlist "a\\nb": host names cannot contain whitespace'),
    ],
)
def test_empty_and_spaced_patterns(pattern, message):
    with pytest.raises(ValueError) as info:
        expand_hostlist(pattern)
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_product_too_large_is_refused():
    with pytest.raises(ValueError, match="too large"):
        expand_hostlist("a[1-1000]b[1-1000]")


def test_duplicates_dropped_unless_asked_for():
    assert expand_hostlist("n[1-2],n1") == ["n1", "n2"]
    assert expand_hostlist("n[1-2],n1", allow_duplicates=True) == ["n1", "n2", "n1"]


def test_non_string_pattern_is_a_value_error():
    with pytest.raises(ValueError, match="must be a string"):
        expand_hostlist(12)


COLLECT = [
    ["gpu001", "gpu002", "gpu003", "gpu020"],
    ["n1", "n2", "n10", "login"],
    ["a1b3", "a1b4", "a2b3"],
    ["x08", "x09", "x10", "y1"],
    ["solo"],
]


@pytest.mark.parametrize("hosts", COLLECT)
def test_collect_round_trips(hosts):
    pattern = collect_hostlist(hosts)
    assert sorted(expand_hostlist(pattern)) == sorted(hosts)


def test_collect_compresses_runs():
    assert collect_hostlist(["gpu001", "gpu002", "gpu003", "gpu020"]) == "gpu[001-003,020]"


def test_collect_refuses_hostlist_characters():
    with pytest.raises(ValueError, match="contains one of"):
        collect_hostlist(["gpu[1]"])
