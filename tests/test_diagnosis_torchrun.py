"""Real torchrun runs (2 ranks, gloo, CPU) that fail as training runs fail; one verdict per run.

Each run writes what a real one leaves behind: torchrun's --log-dir (attempt_0/{rank}/stderr.log with
"[rankN]:" prefixes), a seed-style log per rank (train_local_rank{N}_x.log) and the launcher's own
output with its failure table (launcher.log). `opsconsole diagnose --run DIR --json` must name the
root cause and the rank that failed first, never its peer's consequences. The runs start together
(tiny tensors: each is mostly torch's import) in one module fixture; the demo's training is one more.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opsconsole.commands.diagnose import _decoded_lines
from opsconsole.diagnosis.run import diagnose_run
from tests.torchrun import diagnose_json, torchrun_command, torchrun_env

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 240

WORKER = textwrap.dedent("""
    import ctypes, logging, os, sys, time
    import torch
    import torch.distributed as dist

    mode, log_dir = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    from datetime import timedelta
    logging.basicConfig(filename=os.path.join(log_dir, "train_local_rank%d_x.log" % rank), level=logging.INFO,
                        format="%(asctime)s - %(levelname)s - %(message)s")
    log = logging.getLogger("train")
    if mode == "missing" and rank == 1:
        open(os.path.join(log_dir, "no", "config.yaml"))  # before the process group: rank 0 waits in it
    dist.init_process_group("gloo", timeout=timedelta(seconds=5 if mode == "timeout" else 600))
    log.info("rank %d of %d started", rank, dist.get_world_size())
    for step in range(3):
        x = torch.ones(4) * (step + 1)
        if step == 1 and rank == 1:
            if mode == "index":
                labels = torch.arange(10)
                picked = labels[torch.tensor(12)]
            elif mode == "embedding":
                torch.nn.Embedding(10, 4)(torch.tensor([3, 12]))
            elif mode == "nan":
                loss = torch.log(torch.tensor(-1.0))
                log.info("step %d loss: %s", step, loss.item())
                if not torch.isfinite(loss):
                    raise FloatingPointError("loss is %s at step %d" % (loss.item(), step))
            elif mode == "exit3":
                log.error("config invalid, exiting")
                sys.exit(3)
            elif mode == "sigterm":
                os.kill(os.getpid(), 15)  # as a preemption or scancel ends one process
            elif mode == "segv":
                ctypes.string_at(0)
            elif mode == "timeout":
                time.sleep(60)  # rank 0 times out in the all_reduce below; the launcher then stops this rank
            elif mode == "memory":
                buffer = bytearray(1 << 50)  # a petabyte: refused at once, MemoryError
            elif mode == "mismatch":
                x = torch.ones(7)  # rank 0 reduces 4 floats: gloo aborts it on the size it receives
        if mode == "sigkill" and step == 1:
            dist.barrier()
            if rank == 1:
                os.kill(os.getpid(), 9)
        dist.all_reduce(x)
        log.info("step %d loss: %.4f", step, float(x.sum()) / 100)
    dist.destroy_process_group()
    log.info("done")
""")

MODES = (
    "index",
    "embedding",
    "sigkill",
    "nan",
    "exit3",
    "segv",
    "sigterm",
    "mismatch",
    "memory",
    "timeout",
    "missing",
    "healthy",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every mode's run directory (and the demo's), run side by side; {mode: (dir, exit status)}."""
    base = tmp_path_factory.mktemp("torchrun")
    script = base / "worker.py"
    script.write_text(WORKER)
    env = torchrun_env(pythonpath=[ROOT])
    started = {}
    for mode in MODES:
        directory = base / mode
        directory.mkdir()
        launcher = open(directory / "launcher.log", "wb")
        # Rank 0 must live long enough to write the lost connection it saw (see tests/torchrun.py).
        command = torchrun_command(script, mode, str(directory), log_dir=directory / "torchrun", monitor_interval_s=5)
        started[mode] = (
            directory,
            subprocess.Popen(command, stdout=launcher, stderr=subprocess.STDOUT, env=env),
            launcher,
        )
    # The same IndexError run with --tee 3 as well: each rank's output lands in launcher.log ("[default1]:") and in
    # its own attempt_0/1/stderr.log.
    tee = base / "index_tee"
    tee.mkdir()
    tee_log = open(tee / "launcher.log", "wb")
    command = torchrun_command(script, "index", str(tee), log_dir=tee / "torchrun", monitor_interval_s=5)
    command[command.index("--redirects") : command.index("--redirects")] = ["--tee", "3"]
    started["index_tee"] = (tee, subprocess.Popen(command, stdout=tee_log, stderr=subprocess.STDOUT, env=env), tee_log)
    demo = base / "demo"
    started["demo"] = (
        demo,
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "opsconsole.demo.train",
                "--dir",
                str(demo),
                "--ranks",
                "2",
                "--epochs",
                "3",
                "--steps",
                "8",
                "--step-sleep",
                "0",
                "--fail-at-epoch",
                "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        ),
        None,
    )
    finished = {}
    for mode, (directory, process, launcher) in started.items():
        try:
            status = process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            status = process.wait()
        if launcher is not None:
            launcher.close()
        finished[mode] = (directory, status)
    return finished


def verdict(*directories: Path) -> dict:
    """`opsconsole diagnose --run DIR... --json` of the run's directories."""
    return diagnose_json("--run", *map(str, directories))


def rank_of_file(path: str) -> str:
    return Path(path).parent.name


def test_an_index_error_on_rank_1_is_its_app_error_not_the_peer_it_disconnected(runs):
    directory, status = runs["index"]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("app_error", 1)
    assert result["file"].endswith("stderr.log") and rank_of_file(result["file"]) == "1"
    root = next(f for f in result["findings"] if f["category"] == "app_error")
    assert root["exception"] == "IndexError: index 12 is out of bounds for dimension 0 with size 10"
    assert root["frame"].startswith(str(directory.parent / "worker.py") + ":")
    assert "label range" in root["remedy"]  # the device-assert remedy's data checks
    # Rank 0's lost connection is read as what it is: a consequence.
    peer = [f for f in result["findings"] if f["rank"] == 0 and f["file"].endswith("stderr.log")]
    assert peer and {f["category"] for f in peer} == {"nccl_remote"}


def test_an_embedding_index_out_of_range_is_app_error_on_rank_1(runs):
    directory, status = runs["embedding"]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("app_error", 1)
    root = next(f for f in result["findings"] if f["category"] == "app_error")
    assert root["exception"] == "IndexError: index out of range in self"
    assert root["line"] == result["line"] and "label range" in root["remedy"]


def test_a_sigkilled_rank_without_an_oom_killer_line_is_a_killed_rank_not_host_oom(runs):
    # Rank 1 kills itself with SIGKILL (as a kill -9 would): nothing in the run says the OOM killer sent it, so the
    # verdict is the killed rank, with every sender to check; it was "Host out of memory (OOM killer)".
    directory, status = runs["sigkill"]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("rank_crashed", 1)
    assert result["file"] == str(directory / "launcher.log")
    assert result["title"] == "Rank 1 was killed by signal SIGKILL"
    # Who may have sent it, and how to tell: the OOM killer (dmesg, the cgroup's memory.events oom_kill count),
    # a scheduler's time or memory limit (sacct), a user's kill -9.
    for word in ("dmesg", "memory.events", "oom_kill", "sacct", "Timelimit", "kill -9"):
        assert word in result["remedy"], word
    assert not [f for f in result["findings"] if f["category"] == "host_oom"]
    killed = [f for f in result["findings"] if f["category"] == "rank_crashed"]
    assert killed and {f["rank"] for f in killed} == {1}
    assert all("kill -9" in f["cause"] and "scheduler" in f["cause"] for f in killed)
    text = report(directory)
    assert "\nRoot cause: Rank 1 was killed by signal SIGKILL [rank_crashed, critical]\n" in text
    assert "no OOM-killer line is in these logs" in text and "OOM killer)" not in text


def test_a_sigkilled_rank_with_the_oom_killers_line_in_the_logs_given_is_host_oom(runs, tmp_path):
    # The same real run, with the node's kernel log beside it: the OOM killer's own line (dmesg's format) for the
    # pid the launcher's table names. That is evidence of the OOM killer: host_oom, seen.
    directory, status = runs["sigkill"]
    assert status != 0
    run = tmp_path / "sigkill"
    shutil.copytree(directory, run)
    # Rank 1's row of the launcher's table: under load the launcher may SIGKILL rank 0 too, when it does
    # not stop within the grace period after its SIGTERM, and its row can come first.
    table_row = r"rank\s*:\s*1 \(local_rank: 1\)\s*\n\s*exitcode\s*:\s*-9 \(pid: (\d+)\)"
    pid = int(re.search(table_row, (run / "launcher.log").read_text()).group(1))
    (run / "dmesg.log").write_text(
        "[2059991.488102] python invoked oom-killer: gfp_mask=0x140dca(GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO), "
        "order=0, oom_score_adj=0\n"
        "[2059991.491542] Out of memory: Killed process %d (python) total-vm:533122440kB, anon-rss:314514560kB, "
        "file-rss:74816kB, shmem-rss:12296kB, UID:0 pgtables:690068kB oom_score_adj:0\n" % pid
    )
    result = verdict(run)
    assert (result["root_cause"], result["rank"]) == ("host_oom", 1)
    assert result["file"] == str(run / "dmesg.log")
    oom = [f for f in result["findings"] if f["category"] == "host_oom"]
    assert oom and all(f["evidence"] == "seen" and f["severity"] == "critical" for f in oom)
    text = report(run)
    assert "\nRoot cause: Host out of memory (OOM killer) [host_oom, critical]\n" in text
    assert "no OOM-killer line" not in text.split("\n\n")[0]


def test_a_nan_loss_is_nan_inf_on_the_rank_that_logged_it(runs):
    directory, status = runs["nan"]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("nan_inf", 1)
    # The first sign in time: the loss logged with its time stamp, before the exception it raised.
    assert result["file"] == str(directory / "train_local_rank1_x.log")
    assert "loss: nan" in (directory / "train_local_rank1_x.log").read_text().splitlines()[result["line"] - 1]
    assert not [f for f in result["findings"] if f["category"] == "app_error"]


def report(*directories: Path) -> str:
    """`opsconsole diagnose --run DIR...`'s readable report."""
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", "--run", *map(str, directories)],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def launcher_line(directory: Path, result: dict) -> str:
    return (directory / "launcher.log").read_text().splitlines()[result["line"] - 1]


def test_a_rank_that_exits_with_a_code_of_its_own_is_blamed_not_the_peer_torchelastic_saw_first(runs):
    # Rank 1's sys.exit(3) leaves no traceback; rank 0 then loses its connection, exits 1 and is what
    # torchelastic's table calls the "first observed failure". The failing rank is 1.
    directory, status = runs["exit3"]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("rank_crashed", 1)
    assert result["file"] == str(directory / "launcher.log")
    # The table's row ("exitcode  : 3 (pid: P)") or, first under load, the launcher's own line about that
    # child ("failed (exitcode: 3) local_rank: 1 (pid: P)"): either names rank 1's exit.
    line = launcher_line(directory, result)
    assert re.search(r"exitcode\W*3\b", line) and "(pid: %d)" % result["failed_child"]["pid"] in line, line
    assert (result["failed_child"]["rank"], result["failed_child"]["exitcode"]) == (1, 3)
    text = report(directory)
    assert "Rank 1 ended with exit code 3 and reported no lost connection of its own" in text
    # The headline says what happened, with a remedy that fits an exit code; the peer's loss stays a consequence.
    assert "\nRoot cause: Rank 1 exited with code 3 [rank_crashed, critical]\n" in text
    assert "rank's own log" in result["remedy"]
    assert "nccl_remote" in {f["category"] for f in result["findings"]}


def test_a_segfaulted_rank_is_blamed_not_the_peer_that_lost_its_connection(runs):
    directory, status = runs["segv"]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("rank_crashed", 1)
    assert result["title"] == "Rank 1 crashed (signal SIGSEGV)"
    assert "\nRoot cause: Rank 1 crashed (signal SIGSEGV) [rank_crashed, critical]\n" in report(directory)
    assert all(word in result["remedy"] for word in ("core dump", "PYTHONFAULTHANDLER", "TORCH_SHOW_CPP_STACKTRACES"))
    assert "SIGSEGV" in launcher_line(directory, result) or "-11" in launcher_line(directory, result)
    assert (result["failed_child"]["rank"], result["failed_child"]["signal"]) == (1, "SIGSEGV")
    assert "Rank 1 ended with signal SIGSEGV" in report(directory) and "PYTHONFAULTHANDLER=1" in report(directory)
    # The remedy no longer sends the reader to torchelastic's "first observed failure" (rank 0 here, the peer).
    remedies = {f["remedy"] for f in result["findings"] if f["category"] == "nccl_remote"}
    assert remedies and all("often a peer" in remedy and "PYTHONFAULTHANDLER" in remedy for remedy in remedies)


def test_a_rank_terminated_from_outside_is_blamed_not_the_peer_the_launcher_saw_first(runs):
    # Rank 1 gets SIGTERM from outside (not the launcher's "Sending process PID closing signal SIGTERM",
    # which stops the survivors after a failure): rank 0 only lost its connection.
    directory, status = runs["sigterm"]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("rank_crashed", 1)
    assert "SIGTERM" in launcher_line(directory, result) or "-15" in launcher_line(directory, result)
    assert (result["failed_child"]["rank"], result["failed_child"]["signal"]) == (1, "SIGTERM")
    text = report(directory)
    assert "stopped from outside the launcher" in text
    assert "\nRoot cause: Rank 1 was killed by signal SIGTERM [rank_crashed, critical]\n" in text
    assert "time limit" in result["remedy"] and "preemption" in result["remedy"]
    assert "nccl_remote" in {f["category"] for f in result["findings"]}


def rows_of(text: str) -> dict:
    """The readable report's category rows: {category: the row's lines}."""
    rows: dict = {}
    for block in text.split("\n\n")[1:]:
        found = re.match(r"[* ] .*? \[(\w+)\] ", block)
        if found:
            rows[found.group(1)] = block.splitlines()
    return rows


@pytest.mark.parametrize("mode", ["segv", "sigterm", "exit3"])
def test_the_crashed_ranks_line_is_printed_once_and_not_among_the_peers_consequences(runs, mode):
    # The launcher's line about the crashed child is where the verdict starts ("Started on rank 1, in
    # launcher.log line N: ..."); it was printed a second time as an example of "A peer rank failed".
    directory, status = runs[mode]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("rank_crashed", 1)
    text = report(directory)
    crash_line = " ".join(launcher_line(directory, result).split())[:120]
    assert text.count(crash_line) == 1, text
    rows = rows_of(text)
    # The peers' row lists their lost connections and the launcher's report of them, nothing of rank 1.
    assert rows["nccl_remote"] and not any(" rank 1: " in line for line in rows["nccl_remote"]), text
    assert "rank 1" not in rows["nccl_remote"][0]
    # The launcher's other lines about rank 1 (its table row, its signal) are listed under the crash's own row.
    examples = [line for line in rows["rank_crashed"] if line.startswith("    /")]
    assert all(" rank 1: " in line for line in examples), text
    assert examples or mode == "exit3", text  # exit 3: the table's row is the start, and no signal line


def single(path: Path, *options: str) -> str:
    """`opsconsole diagnose [OPTIONS] FILE` of one file, its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", *options, str(path)],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def row_counts(text: str) -> dict:
    """The readable report's rows: {category: the count the row says}."""
    return {
        found.group(1): int(found.group(2))
        for found in re.finditer(r"^[* ] .*? \[(\w+)\] \w+, (\d+) times?\b", text, re.MULTILINE)
    }


def json_counts(findings: list) -> dict:
    counts: dict = {}
    for finding in findings:
        counts[finding["category"]] = counts.get(finding["category"], 0) + 1
    return counts


@pytest.mark.parametrize("mode", ["segv", "sigterm", "exit3"])
def test_the_json_counts_the_crashed_ranks_launcher_lines_under_the_crash_as_the_report_does(runs, mode):
    # The text report moves the launcher's lines about the crashed rank 1 (its "failed (exitcode: -11) local_rank:
    # 1", its table row) under the crash's row; --json listed them as nccl_remote, "a peer rank failed".
    directory, status = runs[mode]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("rank_crashed", 1)
    assert json_counts(result["findings"]) == row_counts(report(directory)), report(directory)
    assert not [f for f in result["findings"] if f["category"] == "nccl_remote" and f["rank"] == 1]
    crash = [f for f in result["findings"] if f["category"] == "rank_crashed"]
    assert crash and all(f["rank"] == 1 and f["title"] == result["title"] for f in crash)
    # The launcher's output alone, diagnosed as one file, agrees with its own report too.
    launcher = directory / "launcher.log"
    alone = json.loads(single(launcher, "--json"))
    assert alone["root_cause"] == "rank_crashed"
    assert json_counts(alone["findings"]) == row_counts(single(launcher)), single(launcher)


@pytest.mark.parametrize(
    "mode, signal, exitcode", [("segv", "SIGSEGV", -11), ("sigterm", "SIGTERM", -15), ("exit3", None, 3)]
)
def test_the_launchers_output_alone_names_the_failing_rank_from_its_failure_table(runs, mode, signal, exitcode):
    # `opsconsole diagnose FILE` on torchrun's own stdout/stderr: its "Failures:" table names rank 1 and how it
    # ended; the report names it as --run does.
    directory, status = runs[mode]
    assert status != 0
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", "--json", str(directory / "launcher.log")],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["root_cause"], result["rank"]) == ("rank_crashed", 1)
    row = next(row for row in result["launcher_failures"] if row["rank"] == 1)
    assert (row["signal"], row["exitcode"], row["host"]) == (signal, exitcode, "localhost")
    text = subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", str(directory / "launcher.log")],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout.decode()
    assert "Started on rank 1," in text and "Launcher's failed ranks: " in text


def test_a_missing_config_file_is_io_error_whose_remedy_starts_with_the_path_not_the_disks(runs):
    directory, status = runs["missing"]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("io_error", 1)
    root = next(f for f in result["findings"] if f["category"] == "io_error")
    assert root["excerpt"].startswith("FileNotFoundError") and root["remedy"].startswith("A path does not exist")


def test_a_gloo_timeout_names_the_rank_that_never_reached_the_collective(runs):
    # Rank 1 sleeps before the all_reduce; rank 0 times out waiting for it and the launcher stops rank 1
    # (SIGTERM). The first line is rank 0's timeout; the rank the run waited for is 1.
    directory, status = runs["timeout"]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("nccl_timeout", 1)
    first = next(f for f in result["findings"] if f["category"] == "nccl_timeout")
    assert first["rank"] == 0 and "Timed out waiting" in first["excerpt"]
    # gloo's own timeout: titled with the backend it came from, a remedy without NCCL's variables first.
    assert first["title"] == "gloo collective timeout" and "NCCL" not in first["remedy"]
    text = report(directory)
    assert "\nRoot cause: gloo collective timeout [nccl_timeout, critical]\n" in text and "NCCL" not in text
    assert "failed_child" not in result
    assert "Started on rank 1 (it never reached the collective the others waited in); first seen on rank 0" in text


@pytest.mark.parametrize(
    "mode, why",
    [
        ("exit3", "rank 0 only lost its connection to rank 1"),
        ("index", "rank 0 only lost its connection to rank 1"),
        ("timeout", "rank 0 timed out waiting for rank 1"),
    ],
)
def test_torchelastics_first_observed_rank_0_is_explained_beside_a_verdict_naming_rank_1(runs, mode, why):
    # torchelastic's table says "Root Cause (first observed failure)": rank 0, which exited first only because it
    # lost rank 1 (or timed out waiting for it). The report keeps that fact and says why rank 1 is named.
    directory, status = runs[mode]
    assert status != 0
    result = verdict(directory)
    assert result["rank"] == 1
    text = report(directory)
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("Launcher's first observed failure: rank "))
    if mode != "timeout" and lines[first].startswith("Launcher's first observed failure: rank 1,"):
        # Under load torchelastic may notice rank 1's own exit first (rank 0 times out only after 5 s, so never
        # there): then the two agree and nothing is explained.
        assert not any(line.startswith("torchelastic observed") for line in lines), text
        return
    assert lines[first].startswith("Launcher's first observed failure: rank 0,"), text
    assert lines[first + 1].startswith("torchelastic observed rank 0's exit first, but rank 1 is "), text
    assert why in lines[first + 1], text
    if mode == "exit3":  # the launcher's output alone: no rank's own lines, so no claim of a lost connection
        alone = report(directory / "launcher.log")
        note = next(line for line in alone.splitlines() if line.startswith("torchelastic observed"))
        assert "rank 0's exit was a consequence of rank 1's failure" in note, alone


def test_a_tee_copy_of_a_ranks_exception_is_counted_and_printed_once(runs):
    # torchrun --tee 3 --log-dir: rank 1's IndexError is in launcher.log ("[default1]:[rank1]: IndexError: ...")
    # and in attempt_0/1/stderr.log. It was listed twice under its row, "2 times".
    directory, status = runs["index_tee"]
    assert status != 0
    assert "[default1]:[rank1]: IndexError" in (directory / "launcher.log").read_text()
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("app_error", 1)
    assert result["file"].endswith("stderr.log") and rank_of_file(result["file"]) == "1"
    errors = [f for f in result["findings"] if f["category"] == "app_error"]
    assert len(errors) == 1 and errors[0]["exception"].startswith("IndexError: index 12 is out of bounds")
    text = report(directory)
    assert "\n* Python exception in the training code [app_error] error, 1 time, rank 1\n" in text
    assert [line for line in text.splitlines() if line.startswith("    /")].count(
        next(line for line in text.splitlines() if line.startswith("    /") and "IndexError" in line)
    ) == 1
    assert sum("IndexError: index 12" in line for line in rows_of(text)["app_error"]) == 1
    # The launcher's output alone still has it, once.
    alone = verdict(directory / "launcher.log")
    assert (alone["root_cause"], alone["rank"]) == ("app_error", 1)


def test_a_gloo_timeout_seen_only_in_the_launchers_output_names_what_the_table_shows_and_no_nccl(runs):
    # torchrun without --tee: its own output holds the failure table only (rank 0 exit code 1, first observed;
    # rank 1 SIGTERM, which the launcher sent it), no line of gloo's. It was "A peer rank failed (remote error)
    # [nccl_remote]", with "Rank 0 ... an exit without a traceback is sys.exit" beside it.
    directory, status = runs["timeout"]
    assert status != 0
    launcher = directory / "launcher.log"
    assert "Timed out waiting" not in launcher.read_text()
    result = verdict(launcher)
    assert (result["root_cause"], result["rank"]) == ("rank_crashed", 0)
    assert (result["failed_child"]["rank"], result["failed_child"]["exitcode"]) == (0, 1)
    assert result["title"] == "Rank 0 exited with code 1"
    # Where its traceback is, and what a timeout would mean: the rank the launcher stopped after it.
    assert "own output" in result["remedy"] and "Timed out waiting" in result["remedy"]
    text = report(launcher)
    assert "\nRoot cause: Rank 0 exited with code 1 [rank_crashed, critical]\n" in text
    assert "The launcher stopped rank 1 after it." in text and "sys.exit" not in text
    assert "NCCL" not in text and not result["root_cause"].startswith("nccl")
    # The single-file report says the same.
    alone = subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", "--json", str(launcher)],
        capture_output=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert (json.loads(alone.stdout)["root_cause"], json.loads(alone.stdout)["rank"]) == ("rank_crashed", 0)


def test_the_rank_the_launcher_stopped_is_not_listed_among_the_peers_that_failed(runs):
    # The launcher's output alone of the gloo timeout: rank 0 exited with code 1, and the launcher stopped rank 1
    # after it ("Sending process PID closing signal SIGTERM", its table row "-15 (SIGTERM)"). The peers' row said
    # "A peer rank failed ..., rank 1"; rank 1 failed nothing, it was stopped. Its lines are the crash's
    # consequences: a row of their own (rank_stopped), not counted as reports of the crash either.
    directory, status = runs["timeout"]
    assert status != 0
    launcher = directory / "launcher.log"
    stopped = next(row for row in json.loads(single(launcher, "--json"))["launcher_failures"] if row["rank"] == 1)
    assert stopped["signal"] == "SIGTERM" and "Sending process %d closing signal SIGTERM" % stopped["pid"] in (
        launcher.read_text()
    )
    for text in (report(launcher), single(launcher)):
        rows = rows_of(text)
        assert "rank 1" not in rows["nccl_remote"][0] and "ranks" not in rows["nccl_remote"][0], text
        assert not any(" rank 1: " in line or "(pid: %d)" % stopped["pid"] in line for line in rows["nccl_remote"])
        assert rows["rank_crashed"][0].endswith("rank 0"), text  # the crash's row names the crashed rank only
        assert not any(str(stopped["pid"]) in line for line in rows["rank_crashed"]), text
        assert rows["rank_stopped"][0].endswith(", rank 1"), text
        assert any("(pid: %d)" % stopped["pid"] in line for line in rows["rank_stopped"]), text
    for result in (verdict(launcher), json.loads(single(launcher, "--json"))):
        peers = [f for f in result["findings"] if f["category"] == "nccl_remote"]
        assert not [f for f in peers if f.get("rank") == 1 or str(stopped["pid"]) in f["excerpt"]], peers
        crash = [f for f in result["findings"] if f["category"] == "rank_crashed"]
        assert crash and not [f for f in crash if f.get("rank") == 1 or str(stopped["pid"]) in f["excerpt"]], crash


def test_a_gloo_lost_connection_is_the_peer_lost_category_in_gloos_words_in_reports_and_alerts(runs):
    # Rank 1's IndexError ends its process; rank 0's gloo pair says "Connection closed by peer" (or "Read error ...
    # Connection reset by peer"). The category stays nccl_remote (JSON, alert rules and recordings name it), but
    # its finding, row and alert said nothing of gloo; now they say the connection lost was gloo's.
    from opsconsole.alerts.engine import AlertEngine

    directory, status = runs["index"]
    assert status != 0
    result = verdict(directory)
    lost = [f for f in result["findings"] if f["category"] == "nccl_remote" and "gloo" in f["excerpt"]]
    assert lost and all(f["rank"] == 0 for f in lost), result["findings"]
    assert all(f["title"] == "A peer rank failed (gloo connection lost)" and "gloo" in f["cause"] for f in lost)
    rows = rows_of(report(directory))
    assert rows["nccl_remote"][0].startswith("  A peer rank failed (gloo connection lost) [nccl_remote] ")
    assert "gloo's connection to another rank" in rows["nccl_remote"][1]
    # The alert the console raises for it (the same Finding the Logs pane feeds the alert engine).
    run = diagnose_run([str(directory)], _decoded_lines)
    finding = next(f for f in run.diagnosis.findings if f.category == "nccl_remote" and "gloo" in f.excerpt)
    (event,) = AlertEngine([]).observe_finding(finding, "local", 0.0)
    assert event.rule == "finding.nccl_remote"  # the id users' hooks and silences know
    assert event.message.startswith("A peer rank failed (gloo connection lost) (rank 0): RuntimeError: ")


def test_a_collective_size_mismatch_is_the_codes_error_with_a_remedy_that_fits(runs):
    # gloo aborts the rank that received more than it expected (SIGABRT, no Python traceback); its peer only
    # saw the connection reset. Not "a peer rank failed", and not "reproduce on one process".
    directory, status = runs["mismatch"]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("app_error", 0)
    root = next(f for f in result["findings"] if f["category"] == "app_error")
    assert "collective mismatch" in root["excerpt"] and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in root["remedy"]


def test_a_refused_allocation_is_host_memory_without_claiming_the_oom_killer(runs):
    # MemoryError is raised in the process; nobody killed it and no OOM-killer line exists to be "seen".
    directory, status = runs["memory"]
    assert status != 0
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("host_oom", 1)
    root = next(f for f in result["findings"] if f["category"] == "host_oom")
    assert root["excerpt"].startswith("MemoryError")
    assert "refused inside the process" in root["cause"] and "OOM killer's own report" not in root["cause"]
    assert "ulimit -v" in root["remedy"]
    # The headline says what happened too: it said "Host out of memory (OOM killer)".
    assert "\nRoot cause: Host memory allocation refused [host_oom, critical]\n" in report(directory)


def test_a_healthy_run_has_no_verdict(runs):
    directory, status = runs["healthy"]
    assert status == 0
    assert verdict(directory) == {"root_cause": None, "rank": None, "file": None, "line": None, "findings": []}


def test_the_demos_ranks_read_together_say_nan_inf_as_the_console_does(runs):
    directory, status = runs["demo"]
    assert status != 0
    logs = sorted((directory / "logs").glob("train_*_rank*.log"))
    assert len(logs) == 2
    result = verdict(directory)
    assert (result["root_cause"], result["rank"]) == ("nan_inf", 0)
    assert result["file"] == str(logs[0]) and "rank0" in logs[0].name
    # Alone, rank 1's file only knows that its peer went away; the run knows why.
    alone = subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", "--json", str(logs[1])],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert json.loads(alone.stdout)["root_cause"] == "nccl_remote"
