"""RunProgress: hangs and stragglers judged from how the logs advance, with the fleet's telemetry."""

from __future__ import annotations

from opsconsole.diagnosis.progress import RunProgress, fleet_activity, straggler_after
from opsconsole.logs.records import LogLine, LogSource
from opsconsole.model import GpuSample, NodeFrame, NodeState, ProcessSample

T0 = 1_800_000_000.0


def line(rank: int, text: str, when=None, node: str = "gpu01") -> LogLine:
    source = LogSource(node=node, path="/logs/train_%s_rank%d_x.log" % (node, rank), host=node, rank=rank)
    return LogLine(source=source, number=1, offset=0, text=text, time=when, level="INFO", rank=rank)


def states(util: float, processes: int = 1) -> dict:
    frame = NodeFrame(
        node="gpu01",
        time=T0,
        gpus=(GpuSample(index=0, utilization_gpu=util),),
        processes=tuple(ProcessSample(pid=100 + n, gpu_index=0) for n in range(processes)),
    )
    return {"gpu01": NodeState(name="gpu01", state="up", frame=frame, received_at=T0)}


def started(progress: RunProgress, ranks=(0, 1), at: float = T0) -> None:
    progress.observe([line(rank, "step 10 loss 2.0", at) for rank in ranks], at)


def test_straggler_lag_follows_stall_after_within_bounds():
    assert straggler_after(600) == 120
    assert straggler_after(100) == 60
    assert straggler_after(5) == 5


def test_a_rank_that_stops_logging_while_the_others_go_on_is_a_straggler_until_it_catches_up():
    progress = RunProgress(stall_after=600)
    started(progress)
    for t in range(10, 200, 10):
        progress.observe([line(0, "step %d loss 1.9" % (10 + t))], T0 + t)
    new, changed = progress.check(states(90), T0 + 200)
    assert changed and [(f.category, f.rank, node) for f, node in new] == [("straggler", 1, "gpu01")]
    (row,) = progress.summaries()
    assert row.category == "straggler" and row.ranks == (1,) and row.count == 1
    assert "behind the other ranks" in row.first.excerpt
    new, _ = progress.check(states(90), T0 + 205)
    assert new == []  # still straggling: not new
    progress.observe([line(1, "step 210 loss 1.9")], T0 + 206)
    new, changed = progress.check(states(90), T0 + 207)
    assert new == [] and changed and progress.summaries() == []


def test_a_rank_many_steps_behind_is_a_straggler_by_steps():
    progress = RunProgress(stall_after=600)
    progress.observe([line(0, "step 500 loss 1.0"), line(1, "step 20 loss 2.0"), line(2, "step 498 loss 1.0")], T0)
    new, _ = progress.check(states(90), T0 + 1)
    assert [(f.category, f.rank) for f, _ in new] == [("straggler", 1)]
    assert "479 steps behind the other ranks (median 499)" in new[0][0].excerpt


def test_every_log_stopped_with_processes_alive_and_gpus_idle_is_a_possible_hang():
    progress = RunProgress(stall_after=600)
    started(progress)
    assert progress.check(states(0), T0 + 599)[0] == []
    new, _ = progress.check(states(0), T0 + 601)
    assert [(f.category, node) for f, node in new] == [("stall", "logs")]
    assert progress.summaries()[0].title.startswith("Possible hang")


def test_no_hang_while_the_gpus_work_or_no_process_is_left_or_nothing_is_known():
    for fleet in (states(80), states(0, processes=0), {}):
        progress = RunProgress(stall_after=600)
        started(progress)
        assert progress.check(fleet, T0 + 1000)[0] == []


def test_fleet_activity_reads_only_live_nodes():
    assert fleet_activity(states(2)) == (True, True)
    assert fleet_activity(states(50)) == (True, False)
    down = {"gpu01": NodeState(name="gpu01", state="down", frame=states(0)["gpu01"].frame)}
    assert fleet_activity(down) == (False, False)


def test_the_last_pages_read_at_start_count_at_their_own_times():
    """A file of a run that ended an hour ago is not a straggler of the run that goes on."""
    progress = RunProgress(stall_after=600)
    progress.observe([line(0, "step 1 loss 2.0", T0 - 2 * 86400), line(1, "step 9 loss 2.0", T0 - 5)], T0)
    progress.observe([line(1, "step 10 loss 2.0")], T0 + 30)
    progress.observe([line(1, "step 11 loss 2.0")], T0 + 300)
    new, _ = progress.check(states(90), T0 + 300)
    assert new == []  # rank 0's file last advanced two days ago: retired, not compared


def test_a_batch_is_taken_as_its_lines_one_by_one_would_be():
    # observe() works once per source of a batch (a first page has thousands of lines): same result.
    a0, b1 = line(0, "x", T0), line(1, "x", T0)
    batch = [
        LogLine(a0.source, 1, 0, "step 40 loss 1.0", time=T0 + 1, level="INFO", rank=0),
        LogLine(b1.source, 1, 0, "step 38 loss 1.1", time=T0 + 2, level="INFO", rank=1),
        LogLine(a0.source, 2, 10, "step 41 loss 1.0", time=T0 + 3, level="INFO", rank=0),
        LogLine(a0.source, 3, 20, "  a traceback line", time=None, level=None, rank=None),
        LogLine(b1.source, 2, 10, "NCCL INFO chatter", time=T0 + 1.5, level="INFO", rank=None),
    ]
    together, alone = RunProgress(stall_after=600), RunProgress(stall_after=600)
    together.observe(batch, T0 + 5)
    for one in batch:
        alone.observe([one], T0 + 5)
    for table in ("last_advance", "steps", "ranks"):
        assert getattr(together.tracker, table) == getattr(alone.tracker, table), table
    assert together.tracker.steps == {a0.source.key: 41, b1.source.key: 38}
    assert together.node_of == alone.node_of
