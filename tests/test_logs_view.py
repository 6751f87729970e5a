"""The Log pane's view model (opsconsole/logs/view.py): merge order, filters, follow, n/N, marks."""

from __future__ import annotations

from typing import List, Optional

import pytest

from opsconsole.diagnosis.finding import Finding
from opsconsole.logs.records import LogLine, LogSource
from opsconsole.logs.view import (
    LogView,
    colour_index,
    compile_search,
    display_text,
    effective_level,
    line_label,
)

A = LogSource("gpu01", "/logs/train_gpu01_rank0_20261202_120000.log", "gpu01", 0, "gpu01:rank0")
B = LogSource("gpu02", "/logs/train_gpu02_rank1_20261202_120000.log", "gpu02", 1, "gpu02:rank1")
PLAIN = LogSource("local", "/logs/launcher.log", None, None, "launcher.log")


def line(
    source: LogSource,
    number: int,
    text: str,
    time: Optional[float] = None,
    level: Optional[str] = None,
    rank: Optional[int] = None,
) -> LogLine:
    return LogLine(
        source,
        number,
        offset=number * 100,
        text=text,
        time=time,
        level=level,
        rank=rank if rank is not None else source.rank,
    )


def texts(view: LogView) -> List[str]:
    return [entry.text for entry in view.visible]


def oom_finding(at: LogLine) -> Finding:
    return Finding(
        line=at.number,
        category="cuda_oom",
        severity="critical",
        title="CUDA out of memory",
        cause="not enough GPU memory",
        remedy="smaller batch",
        excerpt=at.text,
        source=at.source.key,
        rank=at.rank,
        time=at.time,
    )


# --- merge order ---------------------------------------------------------------------------

MERGE_CASES = [
    pytest.param(
        [line(A, 1, "a1", 10.0), line(B, 1, "b1", 5.0), line(A, 2, "a2", 20.0), line(B, 2, "b2", 15.0)],
        ["b1", "a1", "b2", "a2"],
        id="by-time-across-sources",
    ),
    pytest.param(
        [line(A, 1, "a1", 10.0), line(B, 1, "b1", 10.0), line(A, 2, "a2", 10.0)],
        ["a1", "b1", "a2"],
        id="equal-times-keep-arrival-order",
    ),
    pytest.param(
        [line(A, 1, "a1", 10.0), line(A, 2, "traceback", None), line(B, 1, "b1", 12.0), line(A, 3, "a3", 15.0)],
        ["a1", "traceback", "b1", "a3"],
        id="no-time-takes-predecessors",
    ),
    pytest.param(
        [line(A, 1, "a1", 20.0), line(A, 2, "a2-clock-went-back", 5.0), line(B, 1, "b1", 10.0)],
        ["b1", "a1", "a2-clock-went-back"],
        id="a-source-keeps-file-order",
    ),
    pytest.param(
        [line(B, 1, "b1", 30.0), line(A, 1, "a1-late-arrival", 1.0)],
        ["a1-late-arrival", "b1"],
        id="late-arrival-inserted-in-place",
    ),
]


@pytest.mark.parametrize("lines, expected", MERGE_CASES)
def test_merged_view_is_in_time_order(lines, expected):
    view = LogView(now=lambda: 0.0)
    view.add(lines)
    assert texts(view) == expected


def test_lines_without_any_time_take_the_arrival_time():
    clock = iter([100.0, 200.0])
    view = LogView(now=lambda: next(clock))
    view.add([line(PLAIN, 1, "plain one")])
    view.add([line(A, 1, "timed", 150.0)])
    view.add([line(PLAIN, 2, "plain two")])  # takes plain one's time, not a new arrival time
    assert texts(view) == ["plain one", "plain two", "timed"]


def test_buffer_is_bounded_and_drops_the_oldest():
    view = LogView(max_lines=100, now=lambda: 0.0)
    total_dropped = 0
    for start in range(0, 1000, 50):
        result = view.add([line(A, n, "line %d" % n, float(n)) for n in range(start + 1, start + 51)])
        total_dropped += result.dropped
    assert len(view.entries) <= 105
    assert view.entries[-1].text == "line 1000"
    assert total_dropped == 1000 - len(view.entries)
    assert view.counts[A.key] == len(view.entries)
    assert [e.line.number for e in view.entries] == list(range(1001 - len(view.entries), 1001))


# --- per-source view, labels, colours --------------------------------------------------------


def test_per_source_view_and_back_to_merged():
    view = LogView(now=lambda: 0.0)
    view.add([line(A, 1, "a1", 1.0), line(B, 1, "b1", 2.0), line(A, 2, "a2", 3.0)])
    view.set_source(B.key)
    assert texts(view) == ["b1"]
    view.add([line(A, 3, "a3", 4.0), line(B, 2, "b2", 5.0)])
    assert texts(view) == ["b1", "b2"]
    view.set_source(None)
    assert texts(view) == ["a1", "b1", "a2", "a3", "b2"]


def test_node_drill_down_limits_the_merge():
    view = LogView(now=lambda: 0.0)
    view.add([line(A, 1, "a1", 1.0), line(B, 1, "b1", 2.0)])
    view.set_node("gpu02")
    assert texts(view) == ["b1"]
    view.set_node(None)
    assert texts(view) == ["a1", "b1"]


LABEL_CASES = [
    (line(A, 1, "x"), "gpu01:rank0"),
    (line(PLAIN, 1, "[rank3]: boom", rank=3), "launcher.log:rank3"),
    (line(LogSource("gpu05", "/l/train_gpu05_rank0_1.log", "gpu05", 0, "gpu05:rank0"), 1, "x", rank=4), "gpu05:rank4"),
    (line(LogSource("local", "/var/log/other.log"), 1, "x"), "other.log"),
]


@pytest.mark.parametrize("log_line, expected", LABEL_CASES)
def test_labels(log_line, expected):
    assert line_label(log_line) == expected


def test_label_colours_depend_on_the_label_not_on_arrival_order():
    labels = ["gpu%02d:rank%d" % (n, r) for n in range(1, 9) for r in range(8)]
    forward = {label: colour_index(label) for label in labels}
    backward = {label: colour_index(label) for label in reversed(labels)}
    assert forward == backward
    assert len(set(forward.values())) > 6  # spread over the palette, not one colour


# --- display text ---------------------------------------------------------------------------

DISPLAY_CASES = [
    ("plain text", "plain text"),
    ("\x1b[31mred\x1b[0m text", "red text"),
    ("epoch 1:  10%|#   \repoch 1:  50%|#####", "epoch 1:  50%|#####"),
    ("a\tb", "a       b"),
    ("bin\x00ary\x07", "bin\ufffdary\ufffd"),
    ("bad \ufffd\ufffd bytes", "bad \ufffd\ufffd bytes"),
]


@pytest.mark.parametrize("raw, shown", DISPLAY_CASES)
def test_display_text(raw, shown):
    assert display_text(raw) == shown


# --- levels and the level filter -------------------------------------------------------------

LEVEL_CASES = [
    ("INFO", "step 10 loss 2.1", None, None, "INFO"),
    (None, "Traceback (most recent call last):", None, None, "ERROR"),
    (None, "torch.OutOfMemoryError: CUDA out of memory.", None, None, "ERROR"),
    (None, '  File "train.py", line 3, in <module>', None, "ERROR", "ERROR"),
    (None, "step 11 loss 2.0", None, "ERROR", None),
    ("WARNING", "CUDA out of memory", "critical", None, "CRITICAL"),
    ("ERROR", "x", "warning", None, "ERROR"),
]


@pytest.mark.parametrize("level, text, severity, previous, expected", LEVEL_CASES)
def test_effective_level(level, text, severity, previous, expected):
    finding = None
    if severity:
        finding = Finding(1, "cuda_oom", severity, "t", "c", "r", text)
    assert effective_level(line(A, 1, text, level=level), finding, previous) == expected


def level_view() -> LogView:
    view = LogView(now=lambda: 0.0)
    view.add(
        [
            line(A, 1, "2026-12-02 12:00:00,000 - INFO - start", 1.0, "INFO"),
            line(A, 2, "2026-12-02 12:00:01,000 - WARNING - slow", 2.0, "WARNING"),
            line(A, 3, "2026-12-02 12:00:02,000 - ERROR - failed", 3.0, "ERROR"),
            line(A, 4, '  File "train.py", line 9', None, None),
            line(A, 5, "progress 50%", None, None),
            line(A, 6, "2026-12-02 12:00:03,000 - CRITICAL - dead", 4.0, "CRITICAL"),
        ]
    )
    return view


@pytest.mark.parametrize(
    "level, expected_numbers",
    [
        (None, [1, 2, 3, 4, 5, 6]),
        ("WARNING", [2, 3, 4, 6]),
        ("ERROR", [3, 4, 6]),
    ],
)
def test_level_filter(level, expected_numbers):
    view = level_view()
    view.set_level(level)
    assert [e.line.number for e in view.visible] == expected_numbers


def test_cycle_level_goes_round():
    view = level_view()
    assert [view.cycle_level() for _ in range(4)] == ["WARNING", "ERROR", None, "WARNING"]


# --- search ---------------------------------------------------------------------------------

SEARCH_CASES = [
    ("loss", ["step 1 loss 3.2", "step 2 Loss 3.1"], None),
    ("Loss", ["step 2 Loss 3.1"], None),  # a capital letter makes it case-sensitive
    (r"step \d loss", ["step 1 loss 3.2", "step 2 Loss 3.1"], None),
    ("[rank1", ["[rank1]: NCCL error"], "invalid regex"),
    ("", ["step 1 loss 3.2", "step 2 Loss 3.1", "[rank1]: NCCL error"], None),
]


@pytest.mark.parametrize("text, expected, problem", SEARCH_CASES)
def test_search_filters_lines(text, expected, problem):
    view = LogView(now=lambda: 0.0)
    view.add(
        [line(A, 1, "step 1 loss 3.2", 1.0), line(A, 2, "step 2 Loss 3.1", 2.0), line(A, 3, "[rank1]: NCCL error", 3.0)]
    )
    error = view.set_search(text)
    assert texts(view) == expected
    assert (error is None) == (problem is None)
    if problem:
        assert problem in error and "\n" not in error


def test_search_spans_mark_each_match():
    pattern = compile_search("o")
    assert pattern.spans("foo boo") == [(1, 2), (2, 3), (5, 6), (6, 7)]
    assert compile_search("x*").spans("abc") == []  # empty matches are not marks


def test_new_lines_respect_the_filter():
    view = LogView(now=lambda: 0.0)
    view.set_search("error")
    view.add([line(A, 1, "ok", 1.0), line(A, 2, "an error", 2.0)])
    view.add([line(A, 3, "another error", 3.0), line(A, 4, "fine", 4.0)])
    assert texts(view) == ["an error", "another error"]


# --- follow ---------------------------------------------------------------------------------


def test_follow_stops_and_counts_new_visible_lines():
    view = LogView(now=lambda: 0.0)
    view.add([line(A, n, "l%d" % n, float(n)) for n in range(1, 11)])
    assert view.following and view.new_lines == 0
    view.stop_following()
    view.set_search("keep")
    view.add([line(A, 11, "keep 1", 11.0), line(A, 12, "drop", 12.0), line(A, 13, "keep 2", 13.0)])
    assert view.new_lines == 2
    assert view.resume_following() is False
    assert view.following and view.new_lines == 0
    view.add([line(A, 14, "keep 3", 14.0)])
    assert view.new_lines == 0


def test_older_lines_go_in_front_and_drop_the_tail_when_full():
    view = LogView(max_lines=10, now=lambda: 0.0)
    view.add([line(A, n, "l%d" % n, float(n)) for n in range(11, 21)])
    assert view.sources_to_extend() == [(A.key, 1100)]
    older = [line(A, n, "l%d" % n, float(n) if n % 2 else None) for n in range(6, 11)]
    view.add_older(A.key, older)
    assert [e.line.number for e in view.visible] == list(range(6, 16))
    assert view.tail_dropped and not view.following
    # while the tail is gone, new lines are only counted; following asks for the tail again
    result = view.add([line(A, 21, "l21", 21.0)])
    assert result.counted == 1 and view.new_lines == 1
    assert view.resume_following() is True


def test_older_without_more_lines_marks_the_start():
    view = LogView(now=lambda: 0.0)
    view.add([line(A, 5, "l5", 5.0), line(B, 1, "b", 1.0)])
    view.add_older(A.key, [line(A, n, "l%d" % n, None) for n in range(1, 5)], complete=True)
    # untimed older lines take their successor's time (5.0): after b (1.0), before l5, in file order
    assert texts(view) == ["b", "l1", "l2", "l3", "l4", "l5"]
    assert all(key != A.key for key, _ in view.sources_to_extend())


# --- n / N and marks --------------------------------------------------------------------------


def error_view() -> LogView:
    view = LogView(now=lambda: 0.0)
    lines = [line(A, n, "ok %d" % n, float(n), "INFO") for n in range(1, 11)]
    lines[2] = line(A, 3, "ERROR - one", 3.0, "ERROR")
    lines[6] = line(A, 7, "CUDA out of memory", 7.0, None)
    findings: List[Optional[Finding]] = [None] * len(lines)
    findings[6] = oom_finding(lines[6])
    view.add(lines, findings)
    return view


@pytest.mark.parametrize(
    "start, forward, expected",
    [
        (-1, True, 2),
        (2, True, 6),
        (6, True, None),
        (10, False, 6),
        (6, False, 2),
        (2, False, None),
    ],
)
def test_next_and_previous_error(start, forward, expected):
    view = error_view()
    found = view.next_error(start) if forward else view.previous_error(start)
    assert found == expected


def test_marks_and_find_line():
    view = error_view()
    marked = view.marked("cuda_oom")
    assert [e.line.number for e in marked] == [7]
    assert view.find_line(A.key, 7) is marked[0]
    assert view.index_of(marked[0]) == 6
    view.set_search("ok")
    assert view.index_of(marked[0]) is None  # hidden by the filter
    assert view.find_line(B.key, 7) is None


def test_index_of_survives_trimming():
    view = LogView(max_lines=20, now=lambda: 0.0)
    view.add([line(A, n, "l%d" % n, float(n)) for n in range(1, 21)])
    keep = view.entry(15)
    result = view.add([line(A, n, "l%d" % n, float(n)) for n in range(21, 31)])
    assert result.dropped == 10 and result.dropped_shown == 10
    assert view.index_of(keep) == 5


def test_findings_that_come_after_their_lines_mark_them_and_raise_the_record_they_head():
    # The console hands a page to the view first and diagnoses it after (LogFeed.on_lines_in_loop).
    header = line(A, 1, "step 10 failed", 10.0, level="INFO")
    page = [
        line(A, 0, "step 9", 9.0, level="INFO"),
        header,
        line(A, 2, "  torch.OutOfMemoryError detail", None),  # continues the record above
        line(A, 3, "    more detail", None),
        line(B, 1, "b1", 10.5, level="INFO"),  # another rank's line in between
        line(A, 4, "step 11", 11.0, level="INFO"),
    ]
    view = LogView(now=lambda: 0.0)
    view.add(page)
    view.set_level("ERROR")
    assert texts(view) == []
    finding = oom_finding(header)
    assert view.mark(page, [None, finding, None, None, None, None]) == 1
    assert [(e.text, e.level) for e in view.entries] == [
        ("step 9", "INFO"),
        ("step 10 failed", "CRITICAL"),
        ("  torch.OutOfMemoryError detail", "CRITICAL"),
        ("    more detail", "CRITICAL"),
        ("b1", "INFO"),
        ("step 11", "INFO"),
    ]
    assert texts(view) == ["step 10 failed", "  torch.OutOfMemoryError detail", "    more detail"]  # the filter sees it
    assert view.entries[1].finding is finding and view.marked("cuda_oom") == [view.entries[1]]
    view.set_level(None)
    assert view.next_error(-1) == 1
    assert view.mark(page, [None] * len(page)) == 0  # nothing found: nothing changes


def test_a_finding_on_a_sources_newest_line_carries_to_the_lines_added_after_it():
    last = line(A, 1, "fatal thing", 10.0, level="INFO")
    view = LogView(now=lambda: 0.0)
    view.add([last])
    view.mark([last], [oom_finding(last)])
    view.add([line(A, 2, "  its detail", None)])
    assert [e.level for e in view.entries] == ["CRITICAL", "CRITICAL"]
