"""Stacks of every rank, the parts without a job: py-spy's JSON as hostile input, grouping and naming the
odd ranks, the node helper's answers checked line by line, and its real failures (py-spy missing,
ptrace refused for an unprivileged user)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opsconsole.hang.grouping import Member, group_stacks, odd_ranks, ranks_text, summary, verdict, where
from opsconsole.hang.pyspy import MAX_FRAMES, MAX_THREADS, Frame, main_thread, parse_dump
from opsconsole.hang.stacks import NodeAnswer, build_report, helper_argv, report_text
from opsconsole.probe import rank_stacks
from tests.waiting import wait_for_sync

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "pyspy"
SITE = "/venv/lib/python3.11/site-packages/"
PY_SPY = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")


# --- py-spy's JSON -----------------------------------------------------------------------------


def test_real_dumps_of_a_hung_torchrun_job_read_as_py_spy_printed_them():
    threads, problem = parse_dump((FIXTURES / "rank0_all_reduce.json").read_text())
    assert problem is None and len(threads) == 1
    main = main_thread(threads, json.loads((FIXTURES / "rank0_all_reduce.json").read_text())[0]["pid"])
    assert [f.function for f in main.frames] == [
        "all_reduce",
        "_exception_logger.<locals>.wrapper",
        "train_step",
        "main",
        "<module>",
    ]
    assert main.frames[0].file.endswith("torch/distributed/distributed_c10d.py") and main.frames[0].line > 0
    assert main.frames[2] == Frame("train_step", "/tmp/stk/job.py", 14)
    native, problem = parse_dump((FIXTURES / "rank1_sleep_native.json").read_text())
    assert problem is None
    names = [f.function for f in native[0].frames]
    assert names[:3] == ["clock_nanosleep", "time_sleep", "stuck_before_all_reduce"]
    # The innermost *Python* frame names where a native dump stands.
    assert where(native[0].frames) == "`stuck_before_all_reduce` (job.py:7)"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("", "py-spy printed nothing"),
        ("Error: Permission Denied", "py-spy output is not JSON"),
        ("[" * 200000 + "]" * 200000, None),  # deep nesting: never a RecursionError out of the parser
        ('{"frames": []}', "py-spy output is not a list of threads"),
        ("[]", "py-spy found no Python thread"),
        ('[{"frames": {"name": "x"}}]', "1 malformed thread(s) or frame(s) skipped"),
        ('[{"frames": [1, "x", null, {"line": 3}]}]', "4 malformed thread(s) or frame(s) skipped"),
        ("x" * (5 * 1024 * 1024), "py-spy output over"),
    ],
)
def test_hostile_dumps_give_a_problem_line_never_an_exception(text, problem):
    threads, said = parse_dump(text)
    assert said is not None
    if problem is not None:
        assert said.startswith(problem)
    assert all(isinstance(t.frames, tuple) for t in threads)


def test_wrong_types_are_left_out_field_by_field_and_escapes_are_made_visible():
    raw = [
        {
            "thread_name": "\x1b]52;c;ZXZpbA==\x07Main",
            "os_thread_id": "7",
            "frames": [
                {"name": "\x1b[2Jwipe\nsecond line", "filename": "/a\u202eb.py", "line": True},
                {"name": 42, "filename": "x.py", "line": -5},
                {"name": "ok", "short_filename": "s.py", "line": 10**12},
                {"name": "n" * 5000, "filename": "f" * 5000, "line": 3},
            ],
        }
    ]
    threads, problem = parse_dump(json.dumps(raw))
    assert problem is None
    thread = threads[0]
    assert thread.os_thread_id is None and "\x1b" not in thread.name and "␛" in thread.name
    first, second, third, fourth = thread.frames
    assert first.function == "␛[2Jwipe␤second line" and first.line == 0 and "\u202e" not in first.file
    assert (second.function, second.file, second.line) == ("?", "x.py", 0)
    assert (third.file, third.line) == ("s.py", 0)
    assert len(fourth.function) == 200 and len(fourth.file) == 400


def test_thread_and_frame_counts_are_bounded():
    frames = [{"name": "f%d" % i, "filename": "a.py", "line": i + 1} for i in range(MAX_FRAMES + 50)]
    threads, problem = parse_dump(json.dumps([{"frames": frames}] + [{"frames": []}] * (MAX_THREADS + 5)))
    assert len(threads) == MAX_THREADS and "left out" in problem
    assert len(threads[0].frames) == MAX_FRAMES and threads[0].frames_cut == 50
    assert threads[0].frames[0].function == "f0"  # the innermost kept


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(
            st.sampled_from(
                ["frames", "name", "filename", "short_filename", "line", "thread_name", "os_thread_id", "x"]
            ),
            inner,
            max_size=6,
        )
    ),
    max_leaves=40,
)


@given(json_values)
def test_any_json_value_reads_without_raising(value):
    threads, problem = parse_dump(json.dumps(value))
    for thread in threads:
        for frame in thread.frames:
            assert isinstance(frame.function, str) and isinstance(frame.file, str) and isinstance(frame.line, int)


@given(st.text(max_size=200))
def test_any_text_reads_without_raising(text):
    parse_dump(text)


# --- grouping and naming -----------------------------------------------------------------------

ALL_REDUCE = (
    Frame("all_reduce", SITE + "torch/distributed/distributed_c10d.py", 3252),
    Frame("wrapper", SITE + "torch/distributed/c10d_logger.py", 83),
    Frame("train", "/job/train.py", 120),
    Frame("<module>", "/job/train.py", 200),
)
DATALOADER = (
    Frame("__next__", SITE + "torch/utils/data/dataloader.py", 631),
    Frame("train", "/job/train.py", 88),
    Frame("<module>", "/job/train.py", 200),
)


def members(stacks):
    return [Member(rank, "n%d" % (rank // 8), 1000 + rank, frames) for rank, frames in stacks.items()]


def test_the_one_rank_outside_the_collective_is_named_as_the_issue_words_it():
    groups = group_stacks(members({rank: DATALOADER if rank == 5 else ALL_REDUCE for rank in range(16)}))
    assert summary(groups) == (
        "rank 5 in `__next__` (dataloader.py:631) via train.py:88; "
        "ranks 0-4, 6-15 in `all_reduce` (distributed_c10d.py:3252) via train.py:120"
    )
    assert odd_ranks(groups) == [5]
    assert (
        verdict(groups)
        == "rank 5 in `__next__` (dataloader.py:631) via train.py:88, while the others wait in a collective"
    )


def test_two_ranks_one_waiting_one_not_names_the_one_not_waiting():
    stuck = (Frame("stuck_before_all_reduce", "/job/job.py", 12), Frame("train_step", "/job/job.py", 18))
    groups = group_stacks(members({0: ALL_REDUCE, 1: stuck}))
    assert [g.ranks for g in groups] == [(1,), (0,)] and [g.odd for g in groups] == [True, False]


def test_without_collectives_the_minority_is_odd_and_a_tie_names_nobody():
    compute = (Frame("forward", "/job/model.py", 40),)
    save = (Frame("save", SITE + "torch/serialization.py", 900), Frame("checkpoint", "/job/train.py", 61))
    groups = group_stacks(members({r: save if r == 3 else compute for r in range(8)}))
    assert odd_ranks(groups) == [3] and verdict(groups).endswith("unlike the others")
    tie = group_stacks(members({0: compute, 1: compute, 2: save, 3: save}))
    assert odd_ranks(tie) == [] and "no group stands out" in verdict(tie)
    assert verdict(group_stacks(members({r: compute for r in range(4)}))) is None


def test_a_different_collective_among_collectives_is_odd_when_it_is_the_minority():
    barrier = (
        Frame("barrier", SITE + "torch/distributed/distributed_c10d.py", 4000),
        Frame("train", "/job/train.py", 130),
    )
    groups = group_stacks(members({r: barrier if r == 7 else ALL_REDUCE for r in range(8)}))
    assert odd_ranks(groups) == [7]


def test_ranks_text_and_processes_without_a_rank():
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([0, 1, 2, 4, 6, 7, 9]) == "ranks 0-2, 4, 6-7, 9"
    assert ranks_text([1, "gpu1:400"]) == "ranks 1, pid gpu1:400"
    report = build_report([], [])
    assert report.to_json() == {"ranks": [], "groups": [], "odd": [], "errors": []}


# --- the helper's answers, checked -----------------------------------------------------------


def answer_lines(*records):
    return [json.dumps(record) + "\n" for record in records]


HEAD = {
    "kind": "node",
    "source": "environ",
    "ranks": 2,
    "py_spy": "/x/py-spy",
    "looked_in": ["PATH"],
    "uid": 1000,
    "ptrace_scope": 1,
    "cap_sys_ptrace": False,
}
DUMP0 = (FIXTURES / "rank0_all_reduce.json").read_text()


def read(lines):
    answer = NodeAnswer("gpu1", 10.0)
    for line in lines:
        answer.on_line(line)
    return answer.finish()


def test_a_node_answer_with_a_good_rank_a_refused_one_and_garbage():
    answer = read(
        ["Warning: something on stdout\n"]
        + answer_lines(
            HEAD,
            {"kind": "rank", "pid": 11, "rank": 0, "status": "ok", "stdout": DUMP0, "seconds": 0.02},
            {
                "kind": "rank",
                "pid": 12,
                "rank": 1,
                "status": "failed",
                "exit": 1,
                "stderr": "Permission Denied: Try running again with elevated permissions\n",
            },
            {"kind": "rank", "pid": "13", "rank": 2, "status": "ok"},
            {"kind": "rank", "pid": 14, "rank": 3, "status": "exploded"},
            {"kind": "done", "seconds": 0.1},
        )
        + ["[1, 2]\n", "{not json\n"]
    )
    assert [(r.pid, r.rank) for r in answer.ranks] == [(11, 0)] and answer.ranks[0].dump_s == 0.02
    reasons = [(e.pid, e.reason) for e in answer.errors]
    assert reasons[0][0] == 12 and reasons[0][1].startswith(
        "ptrace refused (kernel.yama.ptrace_scope = 1, uid 1000, no CAP_SYS_PTRACE)"
    )
    assert "SYS_PTRACE" in reasons[0][1] and "kernel.yama.ptrace_scope=0" in reasons[0][1]
    assert reasons[1] == (None, "the node's helper sent a rank without a valid pid")
    assert reasons[2] == (14, "the node's helper sent an unknown status")


def test_a_process_sent_twice_is_one_rank():
    line = {"kind": "rank", "pid": 11, "rank": 0, "status": "ok", "stdout": DUMP0}
    answer = read(answer_lines(HEAD, line, dict(line, rank=5), {"kind": "done", "seconds": 0.1}))
    assert [(r.pid, r.rank) for r in answer.ranks] == [(11, 0)] and answer.errors == []
    assert rank_stacks.checked_pids([3, 3, True, "4", 0, 5]) == [3, 5]


def test_no_answer_no_ranks_no_py_spy_and_a_cut_answer_are_errors_that_say_so():
    assert read(["bash: python3: command not found\n"]).errors[0].reason == (
        "the stack helper did not answer: bash: python3: command not found"
    )
    none = read(answer_lines(dict(HEAD, ranks=0), {"kind": "done", "seconds": 0.01}))
    assert none.errors[0].reason.startswith("no training ranks found")
    missing = read(
        answer_lines(
            dict(HEAD, py_spy=None, looked_in=["PATH", "/opt/venv/bin"]),
            {"kind": "rank", "pid": 5, "rank": 0, "status": "no-py-spy"},
        )
    )
    assert missing.errors[0].reason == (
        "py-spy not found (looked in PATH, /opt/venv/bin): pip install py-spy on the "
        "node (into the training environment, or ~/.local/bin)"
    )
    assert missing.errors[1].reason == "the stack helper stopped before it was done"
    answer = NodeAnswer("gpu1", 10.0)
    answer.on_too_long(9 * 1024 * 1024)
    assert "dropped" in answer.finish().errors[0].reason


def test_the_table_prints_hostile_names_as_visible_characters():
    from opsconsole.hang.stacks import RankStack

    evil = (Frame("\x1b[31mred\x07", "/x/\x1b]0;title\x07.py", 1),)
    report = build_report([RankStack("n\x1b[1m1", 1, 0, evil), RankStack("n2", 2, 1, ALL_REDUCE)], [])
    text = report_text(report)
    assert "\x1b" not in text and "\x07" not in text and "␛[31mred" in text


# --- the node helper for real ----------------------------------------------------------------


@pytest.fixture
def sleeper():
    process = subprocess.Popen(
        [sys.executable, "-c", "import time\ndef waiting_here():\n    time.sleep(120)\nwaiting_here()"]
    )
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def traceable_sleeper(sleeper):
    """The sleeper once py-spy has seen it in its function; a skip saying why where py-spy cannot."""
    if not os.path.exists(PY_SPY):
        pytest.skip("py-spy is not installed: pip install py-spy (it is in the test extra)")
    for _ in range(200):
        done = subprocess.run([PY_SPY, "dump", "--pid", str(sleeper.pid)], capture_output=True, text=True, timeout=60)
        lowered = done.stderr.lower()
        if "permission" in lowered or "not permitted" in lowered:
            pytest.skip(
                "ptrace refused here (%s): kernel.yama.ptrace_scope or the container's SYS_PTRACE"
                % done.stderr.strip()[-200:]
            )
        if "waiting_here" in done.stdout:
            return sleeper
        time.sleep(0.05)
    pytest.fail("py-spy never saw the sleeper in its function: %s" % done.stderr[-500:])


def run_helper(request, prefix=()):
    done = subprocess.run(
        list(prefix) + helper_argv(sys.executable),
        input=json.dumps(request) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_py_spy_missing_is_said_with_where_it_was_looked_for(sleeper, tmp_path):
    lines = run_helper({"pids": [sleeper.pid], "py_spy": str(tmp_path / "no-py-spy")})
    answer = read([json.dumps(line) + "\n" for line in lines])
    assert answer.ranks == [] and answer.errors[0].pid == sleeper.pid
    assert answer.errors[0].reason.startswith("py-spy not found (looked in %s)" % (tmp_path / "no-py-spy"))
    assert "pip install py-spy" in answer.errors[0].reason


def test_ptrace_refused_for_an_unprivileged_user_is_said_with_the_fix(sleeper):
    setpriv = shutil.which("setpriv")
    if os.getuid() != 0 or setpriv is None or not os.path.exists(PY_SPY):
        pytest.skip("needs root, setpriv and py-spy to run the helper as nobody against our process")
    lines = run_helper(
        {"pids": [sleeper.pid], "py_spy": PY_SPY}, prefix=(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups")
    )
    answer = read([json.dumps(line) + "\n" for line in lines])
    assert answer.ranks == []
    assert answer.errors[0].reason.startswith("ptrace refused (") and "uid 65534" in answer.errors[0].reason
    assert "SYS_PTRACE" in answer.errors[0].reason


def test_the_helper_dumps_an_explicit_pid_and_reports_its_time(traceable_sleeper):
    sleeper = traceable_sleeper
    answer = read([json.dumps(line) + "\n" for line in run_helper({"pids": [sleeper.pid]})])
    assert answer.errors == [] and answer.ranks[0].frames[0] == Frame("waiting_here", "<string>", 3)
    assert answer.head["source"] == "pids" and answer.ranks[0].dump_s > 0


def test_the_helper_source_is_python_3_6_syntax():
    import ast

    ast.parse(Path(rank_stacks.__file__).read_text(), feature_version=(3, 6))


LAUNCHER = '''
import os, subprocess, sys, time
rank_env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", TORCHELASTIC_RUN_ID="job7")
forking_rank = """
import os, time
if os.fork() == 0:  # a data-loader worker: the rank's environment, inherited
    time.sleep(120)
else:
    time.sleep(120)
"""
children = [subprocess.Popen([sys.executable, "-c", forking_rank], env=rank_env)]
# Rank 1 behind a shell that does not exec it (as a wrapper script does).
wrapped = dict(rank_env, RANK="1", LOCAL_RANK="1")
children.append(subprocess.Popen(["/bin/sh", "-c", sys.executable + " -c 'import time; time.sleep(120)'; true"], env=wrapped))
print(" ".join(str(c.pid) for c in children), flush=True)
time.sleep(120)
'''


def test_ranks_are_found_by_environment_without_launcher_wrapper_or_forked_worker():
    import psutil

    # The launcher carries a RANK of its own (a node rank, as Kubeflow gives torchrun).
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, RANK="7", WORLD_SIZE="2"),
        start_new_session=True,
    )
    try:
        rank0, shell = (int(pid) for pid in launcher.stdout.readline().split())
        for _ in range(400):  # until the fork and the shell's python have started
            if psutil.Process(rank0).children() and psutil.Process(shell).children():
                break
            time.sleep(0.05)
        tree = {launcher.pid} | {p.pid for p in psutil.Process(launcher.pid).children(recursive=True)}
        rank1 = next(p.pid for p in psutil.Process(shell).children() if "python" in p.name())
        worker = psutil.Process(rank0).children()[0].pid
        found = {entry["pid"]: entry["rank"] for entry in rank_stacks.find_ranks() if entry["pid"] in tree}
        assert found == {rank0: 0, rank1: 1}, (found, launcher.pid, shell, worker)
    finally:
        os.killpg(launcher.pid, 9)
        launcher.wait()


def _state_of(pid: int) -> str:
    with open("/proc/%d/stat" % pid) as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def test_a_stopped_process_is_said_to_be_stopped_with_py_spys_own_error_in_one_line(traceable_sleeper):
    sleeper = traceable_sleeper
    os.kill(sleeper.pid, 19)  # SIGSTOP: what ctrl-z or a debugger leaves
    # The signal is delivered asynchronously: asked before the process is in state T, py-spy met a
    # running process that stopped under it (CI once read that as "ptrace refused").
    wait_for_sync(lambda: _state_of(sleeper.pid) == "T", "the sleeper stopped")
    try:
        answer = read([json.dumps(line) + "\n" for line in run_helper({"pids": [sleeper.pid]})])
    finally:
        os.kill(sleeper.pid, 18)
    reason = answer.errors[0].reason
    assert reason.startswith("the process is stopped (state T") and "kill -CONT" in reason
    said = reason.split("(py-spy said: ", 1)[1]
    assert said.startswith("Failed to") and "backtrace" not in said and "␤" not in said  # its Error line and causes


def old_pythons():
    root = Path(os.path.expanduser("~/.pyenv/versions"))
    found = sorted(root.glob("3.[678].*/bin/python3")) if root.is_dir() else []
    return [str(path) for path in found]


@pytest.mark.parametrize("python", old_pythons() or [None])
def test_the_helper_runs_on_an_old_node_python(python, traceable_sleeper):
    if python is None:
        pytest.skip("no Python 3.6-3.8 under ~/.pyenv here")
    done = subprocess.run(
        helper_argv(python),
        input=json.dumps({"pids": [traceable_sleeper.pid], "py_spy": PY_SPY}) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    answer = read(done.stdout.splitlines(keepends=True))
    assert answer.errors == [] and answer.ranks[0].frames[0].function == "waiting_here", done.stderr


def test_an_mpi_launched_rank_is_found_by_its_launchers_variables():
    env = dict(os.environ, OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_LOCAL_RANK="1", OMPI_COMM_WORLD_SIZE="4")
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(name, None)
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        found = [entry for entry in rank_stacks.find_ranks() if entry["pid"] == process.pid]
        assert [(e["rank"], e["local_rank"], e["world_size"]) for e in found] == [(3, 1, 4)]
    finally:
        process.kill()
        process.wait()


def test_without_ranks_the_gpu_processes_the_console_saw_are_dumped(traceable_sleeper):
    unshare = shutil.which("unshare")
    if os.getuid() != 0 or unshare is None or not os.path.exists(PY_SPY):
        pytest.skip("needs root, unshare and py-spy: a PID namespace where no process has a RANK")
    # In a fresh PID namespace only this script's processes exist: no rank by environment, so the
    # GPU compute process the console's frame listed (here: the sleeper) is what gets dumped.
    helper = " ".join(shlex.quote(word) for word in helper_argv(sys.executable))
    script = (
        "env -u RANK -u LOCAL_RANK %s -c 'import time\ndef on_the_gpu():\n    time.sleep(60)\non_the_gpu()' &\n"
        "for try in $(seq 200); do\n"  # until the sleeper is in its function
        "  out=$(echo '{\"gpu_pids\": ['$!'], \"py_spy\": %s}' | %s)\n"
        # py-spy's JSON frame name, escaped in the answer (\"on_the_gpu\"), not the command line the
        # answer also carries (on_the_gpu(): it broke the loop at once, before the sleeper was in it)
        r'  case "$out" in *"on_the_gpu\\"*) break;; esac'
        "\n"
        "  sleep 0.05\n"
        "done\n"
        "printf '%%s\\n' \"$out\"\n"  # dash's echo would turn the JSON's \\n escapes into newlines
        "kill $!\n" % (shlex.quote(sys.executable), json.dumps(PY_SPY), helper)
    )
    done = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", "sh", "-c", script], capture_output=True, text=True, timeout=60
    )
    answer = read(done.stdout.splitlines(keepends=True))
    assert answer.head["source"] == "gpu", done.stdout + done.stderr
    assert answer.errors == [] and answer.ranks[0].frames[0].function == "on_the_gpu"
    assert answer.ranks[0].rank is None and answer.ranks[0].rank_id == "gpu1:%d" % answer.ranks[0].pid


def test_the_local_helper_is_reaped_by_asyncio_alone():
    """Its output ended, the helper is let exit: killed at once, Popen.kill's poll could reap it
    before asyncio's child watcher did, which printed "Unknown child process pid N, will report
    returncode 255" after about a third of the `opsconsole stacks --pid P` runs here."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that names no process now: the helper answers at once and exits
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "opsconsole", "stacks", "--pid", str(gone.pid)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(12)
    ]
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 1, out + err
        assert (
            out == "error local pid %d: the process exited before its stack was read\n" % gone.pid
        )  # no blank line first
        assert "Unknown child process" not in err, err
