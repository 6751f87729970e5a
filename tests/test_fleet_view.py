"""Table-driven tests of the pure fleet rows: node summaries, GPU and process rows, filter, sort."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest
from h200_fleet import NOW, connecting_node, idle_gpu, load_process, loaded_gpu, three_nodes

from opsconsole import fleet_view
from opsconsole.fleet_view import (
    GPU_FILTER,
    GPU_PROCESSES,
    HOST_PROCESSES,
    NODE_FILTER,
    NODE_SORT_KEYS,
    PROCESS_FILTER,
    FilterTerm,
    cluster_gpu_rows,
    filter_rows,
    frame_error_count,
    node_row,
    node_rows,
    parse_filter,
    process_rows,
    sort_rows,
)
from opsconsole.model import STATE_DOWN, STATE_UP, NodeState

IDLE = idle_gpu()
LOADED = loaded_gpu()


# --- node summary rows ------------------------------------------------------------------------

NODE_CASES = [
    # node, field, expected (derived from the captured GPUs the fixture puts on that node)
    ("gpu01", "state", STATE_UP),
    ("gpu01", "live", True),
    ("gpu01", "gpu_count", 2),
    ("gpu01", "util_mean", (LOADED.utilization_gpu + IDLE.utilization_gpu) / 2),
    ("gpu01", "util_max", LOADED.utilization_gpu),
    ("gpu01", "mem_used", LOADED.memory_used + IDLE.memory_used),
    ("gpu01", "mem_total", LOADED.memory_total + IDLE.memory_total),
    ("gpu01", "hottest_temp", LOADED.temperature),
    ("gpu01", "hottest_gpu", 0),
    ("gpu01", "power_sum", LOADED.power_draw_w + IDLE.power_draw_w),
    ("gpu01", "errors", 0),
    ("gpu01", "age", 1.0),
    ("gpu01", "rtt_ms", 0.8),
    ("gpu02", "hottest_temp", IDLE.temperature),
    ("gpu02", "util_mean", IDLE.utilization_gpu),
    ("gpu03", "state", STATE_DOWN),
    ("gpu03", "live", False),
    ("gpu03", "reason", "connection refused"),
    ("gpu03", "has_frame", True),  # the last frame is kept ...
    ("gpu03", "gpu_count", 1),  # ... and summarised
    ("gpu03", "age", 120.0),
    ("gpu03", "rtt_ms", None),
]


@pytest.mark.parametrize("node, field, expected", NODE_CASES)
def test_node_row_summarises_the_last_frame(node, field, expected):
    value = getattr(node_row(three_nodes()[node], NOW), field)
    if isinstance(expected, float):
        assert value == pytest.approx(expected)
    else:
        assert value == expected


def test_node_row_without_a_frame_is_all_missing():
    row = node_row(connecting_node(), NOW)
    values = [row.gpu_count, row.util_mean, row.util_max, row.mem_used, row.hottest_temp, row.power_sum]
    assert values == [None] * 6
    assert (row.errors, row.age, row.has_frame, row.live) == (None, None, False, False)


def test_a_node_that_went_down_shows_no_round_trip_time():
    """The link keeps the last connection's RTT in its state; a down (or stale, auth) node has none now."""
    up = three_nodes()["gpu01"]
    assert node_row(up, NOW).rtt_ms == up.rtt_ms and up.rtt_ms is not None
    for state in (STATE_DOWN, "stale", "auth"):
        assert node_row(replace(up, state=state, reason="connection lost"), NOW).rtt_ms is None


def test_node_row_mem_percent_uses_the_sums():
    row = node_row(three_nodes()["gpu01"], NOW)
    assert row.mem_percent == pytest.approx(100.0 * LOADED.memory_used / (2 * LOADED.memory_total))


def test_node_rows_keep_config_order_and_drill_down():
    states = three_nodes()
    assert [r.name for r in node_rows(states, NOW)] == list(states)
    assert [r.name for r in node_rows(states, NOW, node="gpu02")] == ["gpu02"]
    assert node_rows(states, NOW, node="nope") == []


@pytest.mark.parametrize(
    "gpu_changes, frame_errors, expected",
    [
        ({}, (), 0),
        ({"errors": ("power: Unknown Error",)}, (), 1),
        ({"xid_events": (79,)}, ("procs: timeout",), 2),
        ({"lost": True, "errors": ("a: x", "b: y")}, (), 3),
    ],
)
def test_frame_error_count(gpu_changes, frame_errors, expected):
    frame = three_nodes()["gpu02"].frame
    frame = replace(frame, gpus=(replace(IDLE, **gpu_changes),), errors=frame_errors)
    assert frame_error_count(frame) == expected


def test_node_summary_skips_missing_readings():
    # A GPU that does not report utilisation or power must not drag the mean down to 0.
    frame = replace(
        three_nodes()["gpu01"].frame, gpus=(LOADED, replace(IDLE, index=1, utilization_gpu=None, power_draw_w=None))
    )
    row = node_row(NodeState("gpu01", STATE_UP, frame=frame, received_at=NOW), NOW)
    assert row.util_mean == LOADED.utilization_gpu
    assert row.power_sum == LOADED.power_draw_w


# --- cluster GPU rows and process rows ---------------------------------------------------------


def test_cluster_gpu_rows_cover_every_gpu_with_users():
    rows = cluster_gpu_rows(three_nodes())
    assert [r.key for r in rows] == ["gpu01/0", "gpu01/1", "gpu02/0", "gpu03/0"]
    by_key = {r.key: r for r in rows}
    assert by_key["gpu01/0"].users == ("alice",)
    assert by_key["gpu01/0"].util == LOADED.utilization_gpu
    assert by_key["gpu01/1"].users == ()
    assert by_key["gpu03/0"].live is False and by_key["gpu03/0"].node_state == STATE_DOWN
    assert [r.key for r in cluster_gpu_rows(three_nodes(), node="gpu01")] == ["gpu01/0", "gpu01/1"]


def test_cluster_gpu_rows_match_processes_by_uuid_when_index_missing():
    states = three_nodes()
    frame = states["gpu01"].frame
    by_uuid = replace(load_process(), gpu_index=None, gpu_uuid=LOADED.uuid)
    states["gpu01"] = replace(states["gpu01"], frame=replace(frame, gpus=(LOADED,), processes=(by_uuid,)))
    assert cluster_gpu_rows(states, node="gpu01")[0].users == ("alice",)


def test_process_rows_split_gpu_and_host_processes():
    states = three_nodes()
    gpu = process_rows(states, None, GPU_PROCESSES)
    host = process_rows(states, None, HOST_PROCESSES)
    assert [r.key for r in gpu] == ["gpu01/421@0"]
    assert gpu[0].gpu_memory == load_process().gpu_memory_bytes
    assert [r.key for r in host] == ["gpu01/421", "gpu01/501", "gpu02/7001"]
    assert [r.stuck for r in host] == [False, True, False]
    assert process_rows(states, "gpu02", GPU_PROCESSES) == []


def test_process_rows_drop_duplicate_keys():
    states = three_nodes()
    frame = states["gpu01"].frame
    states["gpu01"] = replace(states["gpu01"], frame=replace(frame, processes=frame.processes * 2))
    assert len(process_rows(states, "gpu01", GPU_PROCESSES)) == 1


# --- filter parsing ---------------------------------------------------------------------------

PARSE_CASES = [
    # text, fields, expected terms, expected error fragments
    ("", GPU_FILTER, (), ()),
    ("alice", GPU_FILTER, (FilterTerm(None, "~", "alice"),), ()),
    ("node:GPU01", GPU_FILTER, (FilterTerm("node", ":", "gpu01"),), ()),
    ("util<10", GPU_FILTER, (FilterTerm("util", "<", 10.0),), ()),
    ("util>90%", GPU_FILTER, (FilterTerm("util", ">", 90.0),), ()),
    ("temp>=80C mem<=50", GPU_FILTER, (FilterTerm("temp", ">=", 80.0), FilterTerm("mem", "<=", 50.0)), ()),
    ("util:100", GPU_FILTER, (FilterTerm("util", "=", 100.0),), ()),
    ("util<abc", GPU_FILTER, (), ("util<abc", "'abc' is not a number")),
    ("util<", GPU_FILTER, (), ("needs a number",)),
    ("user:", GPU_FILTER, (), ("needs a value",)),
    ("foo>3", GPU_FILTER, (), ("no number field 'foo'", "util")),
    ("util<abc user:alice", GPU_FILTER, (FilterTerm("user", ":", "alice"),), ("'abc' is not a number",)),
    # Unknown `word:` and `word=` are free text: command lines are full of them.
    ("host:29500", PROCESS_FILTER, (FilterTerm(None, "~", "host:29500"),), ()),
    ("lr=0.1", PROCESS_FILTER, (FilterTerm(None, "~", "lr=0.1"),), ()),
    ("gpu:0 pid:421", PROCESS_FILTER, (FilterTerm("gpu", ":", "0"), FilterTerm("pid", ":", "421")), ()),
    ('"data loader', PROCESS_FILTER, (FilterTerm(None, "~", '"data'), FilterTerm(None, "~", "loader")), ("quotation",)),
    ("state:down", NODE_FILTER, (FilterTerm("state", ":", "down"),), ()),
]


@pytest.mark.parametrize("text, fields, terms, error_parts", PARSE_CASES)
def test_parse_filter(text, fields, terms, error_parts):
    parsed = parse_filter(text, fields)
    assert parsed.terms == terms
    if error_parts:
        assert parsed.error is not None
        for part in error_parts:
            assert part in parsed.error
    else:
        assert parsed.error is None


# --- filter matching --------------------------------------------------------------------------

GPU_MATCH_CASES = [
    ("", ["gpu01/0", "gpu01/1", "gpu02/0", "gpu03/0"]),
    ("node:gpu01", ["gpu01/0", "gpu01/1"]),
    ("node:gpu0*", ["gpu01/0", "gpu01/1", "gpu02/0", "gpu03/0"]),
    ("user:alice", ["gpu01/0"]),
    ("user:ALICE", ["gpu01/0"]),
    ("user:ali", []),  # field terms are exact, or globs
    ("util<10", ["gpu01/1", "gpu02/0", "gpu03/0"]),
    ("util>90", ["gpu01/0"]),
    ("mem>10", ["gpu01/0"]),
    ("temp>50", ["gpu01/0"]),
    ("util<10 node:gpu01", ["gpu01/1"]),  # AND
    ("down", ["gpu03/0"]),  # free text on the node state
    ("h200 gpu02", ["gpu02/0"]),
    ("util<abc node:gpu02", ["gpu02/0"]),  # the bad term is ignored, the good one applies
]


@pytest.mark.parametrize("text, keys", GPU_MATCH_CASES)
def test_gpu_filter_matches(text, keys):
    rows = cluster_gpu_rows(three_nodes())
    assert [r.key for r in filter_rows(rows, parse_filter(text, GPU_FILTER), GPU_FILTER)] == keys


def test_numeric_terms_never_match_missing_readings():
    states = three_nodes()
    frame = states["gpu02"].frame
    states["gpu02"] = replace(states["gpu02"], frame=replace(frame, gpus=(replace(IDLE, utilization_gpu=None),)))
    rows = cluster_gpu_rows(states, node="gpu02")
    for text in ("util<10", "util>10", "util:0"):
        assert filter_rows(rows, parse_filter(text, GPU_FILTER), GPU_FILTER) == []


NODE_MATCH_CASES = [
    ("state:down", ["gpu03"]),
    ("state:up", ["gpu01", "gpu02"]),
    ("refused", ["gpu03"]),
    ("GPU02", ["gpu02"]),
    ("util>20", ["gpu01"]),
    ("age>60", ["gpu03"]),
    ("gpus>1", ["gpu01"]),
]


@pytest.mark.parametrize("text, names", NODE_MATCH_CASES)
def test_node_filter_matches(text, names):
    rows = node_rows(three_nodes(), NOW)
    assert [r.name for r in filter_rows(rows, parse_filter(text, NODE_FILTER), NODE_FILTER)] == names


PROCESS_MATCH_CASES = [
    ("user:alice", ["gpu01/421", "gpu01/501"]),
    ("user:bob", ["gpu02/7001"]),
    ("421", ["gpu01/421"]),
    ("pid:501", ["gpu01/501"]),
    ("TAR", ["gpu02/7001"]),
    ("node:gpu02", ["gpu02/7001"]),
    ("state:d", ["gpu01/501"]),
    ("cpu>50", ["gpu01/421", "gpu02/7001"]),
    ("gpu:0", []),  # host processes have no GPU
    ("dataloader", ["gpu01/501"]),
]


@pytest.mark.parametrize("text, keys", PROCESS_MATCH_CASES)
def test_process_filter_matches(text, keys):
    rows = process_rows(three_nodes(), None, HOST_PROCESSES)
    assert [r.key for r in filter_rows(rows, parse_filter(text, PROCESS_FILTER), PROCESS_FILTER)] == keys


def test_gpu_prefix_matches_gpu_processes():
    rows = process_rows(three_nodes(), None, GPU_PROCESSES)
    matched = filter_rows(rows, parse_filter("gpu:0", PROCESS_FILTER), PROCESS_FILTER)
    assert [r.pid for r in matched] == [load_process().pid]


# --- sorting ----------------------------------------------------------------------------------

SORT_CASES = [
    # values, reverse, expected order of the values (None last in both directions, stable)
    ([3, None, 1, 2], False, [1, 2, 3, None]),
    ([3, None, 1, 2], True, [3, 2, 1, None]),
    ([None, None], False, [None, None]),
    ([], True, []),
    ([2.5, 0.0, None, 100.0], False, [0.0, 2.5, 100.0, None]),
]


@pytest.mark.parametrize("values, reverse, expected", SORT_CASES)
def test_sort_rows_puts_none_last(values, reverse, expected):
    rows = [{"v": v} for v in values]
    assert [r["v"] for r in sort_rows(rows, lambda r: r["v"], reverse)] == expected


def test_sort_rows_is_stable_and_natural_order_reverses():
    rows = [("a", 1), ("b", 1), ("c", 0)]
    assert sort_rows(rows, lambda r: r[1]) == [("c", 0), ("a", 1), ("b", 1)]
    assert sort_rows(rows, lambda r: r[1], reverse=True) == [("a", 1), ("b", 1), ("c", 0)]
    assert sort_rows(rows, None) == rows
    assert sort_rows(rows, None, reverse=True) == rows[::-1]


def test_sorting_by_state_puts_failures_first():
    states = ["up", "stale", "connecting", "down", "fallback", "auth", "hostkey"]
    rows = [node_row(NodeState("n%d" % i, state), NOW) for i, state in enumerate(states)]
    ordered = sort_rows(rows, NODE_SORT_KEYS["state"])
    assert [r.state for r in ordered] == ["down", "auth", "hostkey", "stale", "connecting", "fallback", "up"]


def test_fleet_view_imports_no_ui():
    # The headless snapshot and the panes share these rows: they must not need Textual or Rich.
    tree = ast.parse(Path(fleet_view.__file__).read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not imported & {"textual", "rich"}
