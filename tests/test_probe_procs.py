"""ProcessTable: parsers over captured /proc/PID files, live processes, fake /proc trees, the GPU join."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsconsole.model import ProcessSample
from opsconsole.probe import procs
from opsconsole.probe.procs import (
    ProcessTable,
    parse_cmdline,
    parse_pid_stat,
    parse_pid_status,
    top_by_cpu,
    top_processes,
)
from tests.waiting import wait_for_sync

PROC = Path(__file__).parent / "fixtures" / "proc"
BUSY_PID = 5756  # the spinning child captured in fixtures/proc
# A spinning process is R, or briefly D on a loaded machine (a page fault waiting for IO).
BUSY_STATES = ("R", "D")


def spawn(code: str) -> subprocess.Popen:
    """A child running `code` once its interpreter has started: start-up CPU is not its own work."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdout.write('ready\\n'); sys.stdout.flush()\n" + code],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout.readline() == b"ready\n"
    return proc


@pytest.fixture
def busy():
    proc = spawn("import time\nmarker = 'opsconsole-busy-marker'\nt = time.time()\nwhile time.time() - t < 30: pass")
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def sleeper():
    proc = spawn("import time; time.sleep(30)  # opsconsole-sleeper-marker")
    yield proc
    proc.kill()
    proc.wait()


def absent_pid() -> int:
    # Above pid_max no process can exist, so the pid is certainly gone.
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


@pytest.mark.parametrize("snap", ["t0", "t1"])
def test_parse_pid_stat_captured(snap):
    raw = (PROC / snap / str(BUSY_PID) / "stat").read_text()
    stat = parse_pid_stat(raw)
    fields = raw.split()  # comm "python3" has no spaces, so a plain split lines up with proc(5)
    assert stat["pid"] == BUSY_PID == int(fields[0])
    assert stat["comm"] == fields[1].strip("()")
    assert stat["state"] == fields[2] == "R"
    assert (stat["utime"], stat["stime"]) == (int(fields[13]), int(fields[14]))
    assert stat["threads"] == int(fields[19])
    assert stat["starttime"] == int(fields[21])
    assert stat["rss_pages"] == int(fields[23])


@pytest.mark.parametrize(
    "comm",
    ["tmux: server", "a) (b", "kworker/0:1-events", ") ", "(sd-pam)"],
)
def test_parse_pid_stat_comm_with_spaces_and_parens(comm):
    raw = "4242 (%s) D 1 4242 4242 0 -1 4194560 0 0 0 0 17 3 0 0 20 0 8 0 12345 1000 77 18446744073709551615" % comm
    stat = parse_pid_stat(raw)
    assert (stat["pid"], stat["comm"], stat["state"]) == (4242, comm, "D")
    assert (stat["utime"], stat["stime"], stat["threads"], stat["starttime"], stat["rss_pages"]) == (
        17,
        3,
        8,
        12345,
        77,
    )


def test_parse_pid_status_and_cmdline_captured():
    base = PROC / "t0" / str(BUSY_PID)
    status = parse_pid_status((base / "status").read_text())
    lines = {l.split(":")[0]: l.split(":", 1)[1].split() for l in (base / "status").read_text().splitlines()}
    assert status["name"] == lines["Name"][0]
    assert status["state"] == lines["State"][0]
    assert status["uid"] == int(lines["Uid"][0])
    assert status["threads"] == int(lines["Threads"][0])
    assert status["rss_bytes"] == int(lines["VmRSS"][0]) * 1024
    command = parse_cmdline((base / "cmdline").read_bytes())
    assert command.split(" ")[0].endswith("/" + lines["Name"][0]) and " -c import time" in command
    assert "\0" not in command


@pytest.mark.parametrize(
    "data, expected",
    [
        (b"python\0train.py\0--lr\0" + b"3e-4\0", "python train.py --lr 3e-4"),
        (b"", ""),  # kernel thread
        (b"nginx: worker process", "nginx: worker process"),  # setproctitle rewrote it without NULs
        (b"caf\xc3\xa9\0\xff\0", "caf\u00e9 \ufffd"),
    ],
)
def test_parse_cmdline(data, expected):
    assert parse_cmdline(data) == expected


def test_parse_cmdline_is_capped():
    assert len(parse_cmdline(b"x" * 5000)) == procs.MAX_COMMAND_CHARS


def test_top_by_cpu_ranks_none_as_zero_then_rss():
    rows = [
        ProcessSample(pid=1, cpu_percent=None, rss_bytes=10),
        ProcessSample(pid=2, cpu_percent=50.0, rss_bytes=1),
        ProcessSample(pid=3, cpu_percent=None, rss_bytes=99),
        ProcessSample(pid=4, cpu_percent=120.0, rss_bytes=1),
    ]
    assert [r.pid for r in top_by_cpu(rows, 3)] == [4, 2, 3]
    assert top_by_cpu(rows, 0) == ()


def test_live_sample_finds_busy_child(busy, sleeper):
    table = ProcessTable(use_psutil=False)
    first = table.sample(1000)
    assert all(r.cpu_percent is None for r in first)  # no baseline yet

    def busy_seen():
        # CPU % is a rate between two samples: sample again until the busy child got CPU (a loaded
        # machine may give it none for a while).
        time.sleep(0.3)
        rows = {r.pid: r for r in table.sample(1000)}
        return rows if (rows[busy.pid].cpu_percent or 0) > 10.0 else None

    rows = wait_for_sync(busy_seen, "the busy child seen busy", interval=0)
    hot = rows[busy.pid]
    assert hot.state in BUSY_STATES
    assert "opsconsole-busy-marker" in hot.command
    assert hot.user == pwd.getpwuid(os.getuid()).pw_name
    # A host process carries its start time, not an elapsed time that changes every frame.
    assert hot.threads == 1 and hot.rss_bytes > 1 << 20 and hot.elapsed_s is None
    assert hot.elapsed_at(time.time()) >= 0.25 and hot.kernel_thread is False  # it ran through one 0.3 s sample
    cold = rows[sleeper.pid]
    assert cold.state == "S" and cold.cpu_percent < 5.0
    # Every process, in pid order; kernel threads flagged, not left out (this VM has kthreadd).
    assert list(rows) == sorted(rows) and len(rows) > 3
    assert rows[1].kernel_thread is False and (2 not in rows or rows[2].kernel_thread is True)
    top = table.sample(3)
    assert len(top) == 3 and [r.pid for r in top] == sorted(r.pid for r in top)


def test_join_fills_host_fields_and_keeps_gpu_fields(busy):
    table = ProcessTable(use_psutil=False)
    table.sample(5)
    time.sleep(0.4)
    table.sample(5)
    gone = absent_pid()
    gpu = (
        ProcessSample(pid=busy.pid, gpu_index=0, gpu_uuid="GPU-aaaa", gpu_memory_bytes=123 << 20),
        ProcessSample(pid=busy.pid, gpu_index=1, gpu_uuid="GPU-bbbb", gpu_memory_bytes=7 << 20),
        ProcessSample(pid=gone, gpu_index=2, gpu_uuid="GPU-cccc", gpu_memory_bytes=1, name="from-nvml"),
    )
    joined = table.join(gpu)
    assert [(p.pid, p.gpu_index, p.gpu_uuid, p.gpu_memory_bytes) for p in joined] == [
        (p.pid, p.gpu_index, p.gpu_uuid, p.gpu_memory_bytes) for p in gpu
    ]
    live = joined[0]
    assert live.state in BUSY_STATES and live.cpu_percent > 10.0 and "opsconsole-busy-marker" in live.command
    assert live.user == pwd.getpwuid(os.getuid()).pw_name and live.name == Path(sys.executable).name[:15]
    assert joined[1].state in BUSY_STATES
    vanished = joined[2]
    assert vanished.state is None and vanished.name == "from-nvml" and vanished.user is None


def test_join_without_sample_computes_its_own_delta(busy):
    table = ProcessTable(use_psutil=False)
    gpu = (ProcessSample(pid=busy.pid, gpu_index=0),)
    assert table.join(gpu)[0].state in BUSY_STATES

    def joined_busy():
        time.sleep(0.3)
        again = table.join(gpu)[0]
        return again if (again.cpu_percent or 0) > 10.0 else None

    wait_for_sync(joined_busy, "the joined process seen busy", interval=0)
    table.join(())
    assert table._counters == {}  # join-only use forgets processes that left the GPU list


def write_proc_pid(
    root: Path, pid: int, state: str, starttime: int, ticks: int, command: bytes, uid: int, flags: int = 0x400100
) -> None:
    base = root / str(pid)
    base.mkdir(parents=True, exist_ok=True)
    (base / "stat").write_text(
        "%d (pt_data_worker) %s 1 %d %d 0 -1 %d 0 0 0 0 %d 0 0 0 20 0 1 0 %d 1000 250 0\n"
        % (pid, state, pid, pid, flags, ticks, starttime)
    )
    (base / "status").write_text(
        "Name:\tpt_data_worker\nState:\t%s\nUid:\t%d\t%d\t%d\t%d\nThreads:\t1\n" % (state, uid, uid, uid, uid)
    )
    (base / "cmdline").write_bytes(command)


def fake_proc_root(tmp_path: Path, uptime: float) -> Path:
    root = tmp_path / "proc"
    (root / "self").mkdir(parents=True, exist_ok=True)
    (root / "uptime").write_text("%.2f 0.00\n" % uptime)
    return root


def test_hung_d_state_worker_shows_in_top(tmp_path):
    root = fake_proc_root(tmp_path, 1000.0)
    uid = os.getuid()
    write_proc_pid(root, 300, "D", starttime=50000, ticks=100, command=b"python\0-c\0dataloader worker 3\0", uid=uid)
    write_proc_pid(root, 301, "S", starttime=50000, ticks=10, command=b"python\0train.py\0", uid=uid)
    clock = iter([10.0, 11.0]).__next__
    table = ProcessTable(use_psutil=False, proc_root=str(root), clock=clock)
    table.sample(10)
    write_proc_pid(root, 300, "D", starttime=50000, ticks=150, command=b"python\0-c\0dataloader worker 3\0", uid=uid)
    (root / "uptime").write_text("1001.00 0.00\n")
    rows = table.sample(10)
    assert [r.pid for r in rows] == [300, 301]
    worker = rows[0]
    ticks = os.sysconf("SC_CLK_TCK")
    assert worker.state == "D" and worker.cpu_percent == pytest.approx(100.0 * 50 / ticks, abs=0.1)
    assert worker.command == "python -c dataloader worker 3"
    assert worker.elapsed_s is None  # a host process: its start time instead
    assert worker.elapsed_at(time.time()) == pytest.approx(1000.0 - 50000 / ticks, abs=1.0)
    assert worker.rss_bytes == 250 * os.sysconf("SC_PAGE_SIZE")


def test_reused_pid_gets_fresh_identity_and_cpu(tmp_path):
    root = fake_proc_root(tmp_path, 1000.0)
    uid = os.getuid()
    ticks = os.sysconf("SC_CLK_TCK")
    write_proc_pid(root, 400, "S", starttime=10 * ticks, ticks=5000, command=b"old\0job\0", uid=uid)
    clock = iter([10.0, 11.0]).__next__
    table = ProcessTable(use_psutil=False, proc_root=str(root), clock=clock)
    assert table.sample(5)[0].command == "old job"
    # Same pid, a new process started 0.5 s ago that has used 0.25 s of CPU.
    write_proc_pid(root, 400, "R", starttime=int(999.5 * ticks), ticks=ticks // 4, command=b"new\0job\0", uid=uid)
    row = table.sample(5)[0]
    assert row.command == "new job" and row.state == "R"
    assert row.cpu_percent == pytest.approx(50.0, abs=2.0)  # lifetime average, not a negative delta


def test_vanished_mid_sample_and_kernel_threads(tmp_path):
    root = fake_proc_root(tmp_path, 1000.0)
    write_proc_pid(root, 2, "S", starttime=0, ticks=0, command=b"", uid=0, flags=procs.PF_KTHREAD | 0x8040)
    write_proc_pid(root, 3, "S", starttime=0, ticks=0, command=b"init\0", uid=0)
    (root / "77").mkdir()  # a pid that exited between listdir and open: no files
    (root / "net").mkdir()
    table = ProcessTable(use_psutil=False, proc_root=str(root))
    rows = table.sample(5)
    assert [r.pid for r in rows] == [2, 3]
    assert rows[0].command == "[pt_data_worker]"  # no cmdline: shown as ps does
    assert [r.kernel_thread for r in rows] == [True, False]  # PF_KTHREAD in the stat flags
    assert table.last_errors == ()


def test_unreadable_proc_root_is_an_error_value(tmp_path):
    table = ProcessTable(use_psutil=False, proc_root=str(tmp_path / "missing"))
    assert table.sample(5) == ()
    assert table.last_errors and table.last_errors[0].startswith("procs:")
    assert table.join((ProcessSample(pid=1, gpu_index=0),))[0].state is None


def test_psutil_path_agrees_with_proc_path(busy):
    pytest.importorskip("psutil")
    via_psutil, via_proc = ProcessTable(use_psutil=True), ProcessTable(use_psutil=False)
    assert (via_psutil.source, via_proc.source) == ("psutil", "proc")
    for table in (via_psutil, via_proc):
        table.sample(0)
    time.sleep(0.5)
    a = {r.pid: r for r in via_psutil.sample(10000)}[busy.pid]
    b = {r.pid: r for r in via_proc.sample(10000)}[busy.pid]
    assert a.state in BUSY_STATES and b.state in BUSY_STATES
    assert (a.name, a.user, a.command, a.threads) == (b.name, b.user, b.command, b.threads)
    assert a.cpu_percent > 10.0 and b.cpu_percent > 10.0
    assert abs(a.rss_bytes - b.rss_bytes) < 8 << 20
    joined = via_psutil.join((ProcessSample(pid=busy.pid, gpu_index=0), ProcessSample(pid=absent_pid(), gpu_index=1)))
    assert joined[0].state in BUSY_STATES and joined[1].state is None


def test_the_module_function_keeps_one_table_between_calls(busy):
    top_processes(5)
    time.sleep(0.3)
    rows = top_processes(5)
    assert busy.pid in [r.pid for r in rows]


def test_idle_process_is_held_then_reread_with_a_correct_delta(tmp_path):
    root = fake_proc_root(tmp_path, 1000.0)
    uid = os.getuid()
    hz = os.sysconf("SC_CLK_TCK")
    pid = 500
    write_proc_pid(root, pid, "S", starttime=100, ticks=10, command=b"idle\0", uid=uid)
    times = iter([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).__next__
    table = ProcessTable(use_psutil=False, proc_root=str(root), clock=times, idle_every=3)
    table.sample(5)  # baseline
    assert table.sample(5)[0].cpu_percent == 0.0  # read: used no CPU, so now held
    # It wakes and turns D, using 2 s of CPU ... the held row may lag, but within 3 ticks:
    write_proc_pid(root, pid, "D", starttime=100, ticks=10 + 2 * hz, command=b"idle\0", uid=uid)
    seen = [table.sample(5)[0] for _ in range(3)]
    woke = [row for row in seen if row.state == "D"]
    assert woke, seen
    # The delta spans the held ticks: 2 s of CPU over the gap since the last real read.
    gap = (2.0 + seen.index(woke[0])) - 1.0  # samples at t=2, 3, 4; last real read at t=1
    assert woke[0].cpu_percent == pytest.approx(100.0 * 2 / gap, abs=0.5)
    # A GPU process is never answered from a held row.
    write_proc_pid(root, pid, "S", starttime=100, ticks=10 + 2 * hz, command=b"idle\0", uid=uid)
    table.sample(5)
    table.sample(5)
    assert table.join((ProcessSample(pid=pid, gpu_index=0),))[0].state == "S"


def test_idle_every_one_reads_every_process_every_tick(tmp_path):
    root = fake_proc_root(tmp_path, 1000.0)
    write_proc_pid(root, 600, "S", starttime=100, ticks=10, command=b"idle\0", uid=os.getuid())
    table = ProcessTable(use_psutil=False, proc_root=str(root), clock=iter([0.0, 1.0, 2.0]).__next__, idle_every=1)
    table.sample(5)
    table.sample(5)
    write_proc_pid(root, 600, "D", starttime=100, ticks=10, command=b"idle\0", uid=os.getuid())
    assert table.sample(5)[0].state == "D"


def test_sleeping_and_d_state_idle_processes_stay_listed_across_frames(tmp_path, sleeper):
    """Every frame lists an idle process: no top-N by CPU that drops it while it sleeps (the
    issue saw a hung worker flicker `0111111111111111111111110000111100011111`)."""
    # A real sleeping process, through the live /proc with idle processes held between reads.
    # A fresh interpreter runs (R) while it starts: the frames are read once it sleeps.
    wait_for_sync(
        lambda: Path("/proc/%d/stat" % sleeper.pid).read_text().rsplit(")", 1)[1].split()[0] == "S",
        "the sleeper asleep",
    )
    live = ProcessTable(use_psutil=False, idle_every=3)
    presence = []
    for _ in range(12):
        presence.append(any(row.pid == sleeper.pid and row.state == "S" for row in live.sample()))
    assert all(presence), presence
    # A D-state worker that uses no CPU, among more busy processes than a frame carries:
    # D-state processes go first, so it is in every frame all the same.
    root = fake_proc_root(tmp_path, 1000.0)
    uid = os.getuid()
    write_proc_pid(root, 900, "D", starttime=100, ticks=10, command=b"python\0dataloader worker 0\0", uid=uid)
    clock = iter(float(t) for t in range(100)).__next__
    table = ProcessTable(use_psutil=False, proc_root=str(root), clock=clock, idle_every=3)
    for frame in range(12):
        for pid in range(1000, 1030):  # busy ones, each using more CPU every tick
            write_proc_pid(root, pid, "R", starttime=100, ticks=100 * (frame + 1) + pid, command=b"busy\0", uid=uid)
        rows = table.sample(10)
        assert len(rows) == 10 and rows[0].pid == 900 and rows[0].state == "D", (frame, [r.pid for r in rows])


def test_an_unchanged_idle_process_is_the_same_sample_object(tmp_path):
    """What the delta stream relies on: an idle process that was not re-read is the same object, same fields."""
    root = fake_proc_root(tmp_path, 1000.0)
    write_proc_pid(root, 700, "S", starttime=100, ticks=10, command=b"idle\0", uid=os.getuid())
    table = ProcessTable(
        use_psutil=False, proc_root=str(root), clock=iter([0.0, 1.0, 2.0, 3.0, 4.0]).__next__, idle_every=3
    )
    samples = [table.sample()[0] for _ in range(5)]
    assert len({(s.start_time, s.cpu_percent, s.state, s.rss_bytes) for s in samples[1:]}) == 1
    assert any(a is b for a, b in zip(samples[1:], samples[2:]))


def test_start_times_follow_a_stepped_wall_clock_as_the_signal_check_reckons_them(tmp_path):
    """A signal is sent only while /proc's start time, reckoned on the node at that moment (now less
    the uptime), is within 1.5 s of the frame's. The probe reckoned its boot time once: after the node's
    clock was stepped (NTP at boot, a VM resumed) every start time it reported was off by the step,
    and every signal to that node was refused. Here the step is the uptime file moving against the
    clock, which is what the reckoning sees."""
    from opsconsole.probe.checked_signal import identity_of
    from opsconsole.probe.proc_read import START_SLACK_S

    ticks = os.sysconf("SC_CLK_TCK")
    root = fake_proc_root(tmp_path, 1000.0)
    write_proc_pid(root, 300, "S", starttime=500 * ticks, ticks=10, command=b"python\0train.py\0", uid=os.getuid())
    began = time.monotonic()
    table = ProcessTable(use_psutil=False, proc_root=str(root))

    def reported_start() -> float:
        return next(r for r in table.sample(5) if r.pid == 300).start_time

    def uptime_now(step: float) -> None:  # the node's uptime as time passes; `step`: the clock moved that far
        (root / "uptime").write_text("%.2f 0.00\n" % (1000.0 + time.monotonic() - began - step))

    before = reported_start()
    uptime_now(0.0)
    assert reported_start() == before  # no step: start times stay put between ticks
    assert abs(before - identity_of(300, str(root))["start_time"]) <= START_SLACK_S
    uptime_now(30.0)
    after = reported_start()
    assert abs(after - identity_of(300, str(root))["start_time"]) <= START_SLACK_S
    assert after == pytest.approx(before + 30.0, abs=0.5)


def test_the_table_holds_each_process_in_a_few_hundred_bytes_between_polls(tmp_path):
    """Every process of a node is held between polls (CPU % is a delta): each row keeps its stat line,
    not the line split into its ~50 fields (~2.5 kB a process; 1-2 MB on a node of 1,000)."""
    import tracemalloc

    root = fake_proc_root(tmp_path, 1000.0)
    uid = os.getuid()
    count = 400
    for pid in range(1000, 1000 + count):
        write_proc_pid(root, pid, "S", starttime=50000, ticks=pid, command=b"python\0worker.py\0", uid=uid)
    table = ProcessTable(use_psutil=False, proc_root=str(root), clock=iter([10.0, 11.0, 12.0]).__next__)
    table.sample(10)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        rows = table.sample(10)  # the second sample replaces the first's rows
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # What the second sample allocated and still holds (tracing started after the first).
    held = sum(stat.size for stat in after.statistics("filename")) - sum(
        stat.size for stat in before.statistics("filename")
    )
    per_process = held / count
    assert len(rows) == 10 and rows[0].state == "S" and rows[0].command == "python worker.py"
    assert per_process < 1000, "%.0f bytes held a process" % per_process
