"""`opsconsole diagnose` as a user runs it: a real subprocess, real files, stdin, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opsconsole.diagnosis.knowledge import (
    CATEGORIES,
    HOST_OOM_SEEN_CAUSE,
    RANK_CRASH_REMEDIES,
    SIGKILL_CAUSE,
    SIGKILL_TITLE,
)

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "data" / "diagnosis"
LABELS = json.loads((CORPUS / "labels.json").read_text(encoding="utf-8"))
FINDING_KEYS = ["line", "category", "severity", "title", "cause", "remedy", "excerpt", "rank"]


def diagnose(*args: str, stdin=None, input_bytes: bytes = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", *args],
        cwd=cwd,
        input=input_bytes,
        stdin=stdin,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_json_is_one_object_per_file_in_the_issue_shape():
    files = [
        "cuda_oom_rank3_then_nccl.log",
        "healthy_torchrun_nccl_info.log",
        "rank_crashed_sigkill_elastic_peers_nccl.log",
    ]
    done = diagnose("--json", *[str(CORPUS / name) for name in files])
    assert done.returncode == 0, done.stderr
    documents = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert [doc["file"] for doc in documents] == [str(CORPUS / name) for name in files]
    assert [doc["root_cause"] for doc in documents] == [LABELS[name]["root_cause"] for name in files]
    assert all(list(doc)[:3] == ["file", "root_cause", "findings"] for doc in documents)
    # Beyond the issue's shape only where the input holds torchelastic's failure table: the rank it names, its rows;
    # and the headline where the verdict says more than its category's title (the rank killed by SIGKILL).
    assert [list(doc)[3:] for doc in documents] == [[], [], ["title", "rank", "launcher_failures"]]
    assert documents[2]["rank"] is not None and documents[2]["launcher_failures"]
    assert documents[2]["title"] == "Rank %d was killed by signal SIGKILL" % documents[2]["rank"]
    assert documents[1]["findings"] == []
    text_lines = (CORPUS / files[0]).read_text(encoding="utf-8").splitlines()
    for finding in documents[0]["findings"] + documents[2]["findings"]:
        assert list(finding) == FINDING_KEYS
        entry = CATEGORIES[finding["category"]]
        expected = (entry.severity, entry.title, entry.cause, entry.remedy)
        if finding["category"] == "rank_crashed":
            # SIGKILL without the OOM killer's line: a killed rank, with who may have sent it.
            expected = (entry.severity, SIGKILL_TITLE, SIGKILL_CAUSE, RANK_CRASH_REMEDIES["SIGKILL"])
        elif finding["category"] == "host_oom":
            expected = (entry.severity, entry.title, HOST_OOM_SEEN_CAUSE, entry.remedy)
        assert (finding["severity"], finding["title"], finding["cause"], finding["remedy"]) == expected
    oom = [f for f in documents[0]["findings"] if f["category"] == "cuda_oom"]
    assert len(oom) == 1 and oom[0]["excerpt"][:40] in text_lines[oom[0]["line"] - 1]


def test_standard_input_with_a_dash():
    text = (CORPUS / "nan_megatron.log").read_bytes()
    done = diagnose("--json", "-", input_bytes=text)
    assert done.returncode == 0, done.stderr
    (doc,) = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert (doc["file"], doc["root_cause"]) == ("-", "nan_inf")
    assert [f["line"] for f in doc["findings"]] == [7, 8]


@pytest.mark.parametrize(
    "path",
    [
        CORPUS / "app_error_torchrun_tee_assert.log",  # torchrun --tee: "[default1]:[rank1]: ..."
        CORPUS / "host_oom_memoryerror_torchrun_tee.log",  # "[default1]:" alone on the rank's own prints
        *(ROOT / "tests" / "data" / "torchrun_gloo_setup_peer_killed").glob("torchrun/*/attempt_0/0/stderr.log"),
    ],
    ids=lambda path: path.name if path.name != "stderr.log" else "attempt_0/0/stderr.log",
)
def test_a_single_files_json_findings_carry_the_ranks_diagnose_run_gives_them(path):
    # Real torchrun output, rank-prefixed. diagnose --run --json gives each finding the rank of its prefix; the
    # single-file --json of the same file gave its findings no rank at all.
    alone = diagnose("--json", str(path))
    run = diagnose("--run", "--json", str(path))
    assert alone.returncode == run.returncode == 0, alone.stderr + run.stderr
    (document,) = [json.loads(line) for line in alone.stdout.decode().splitlines()]
    findings = json.loads(run.stdout)["findings"]
    assert findings and [(f["line"], f["category"], f["rank"]) for f in document["findings"]] == [
        (f["line"], f["category"], f["rank"]) for f in findings
    ]
    assert any(f["rank"] is not None for f in findings)


def test_the_crash_row_counts_the_launchers_lines_about_the_crash_and_the_ranks_it_stopped_have_their_own_row():
    """Real torchrun output (tests/data/diagnosis/rank_crashed_torchrun_exit3_launcher.log, the launcher's own output
    of a gloo run): rank 1 exits with code 3, and the launcher stops rank 0 ("Sending process PID closing signal
    SIGTERM", its table row -15 SIGTERM). The crash's row counted those three lines about rank 0 as reports of the
    crash ("5 times", and listed only them); they are its consequences: a row of their own, with rank 0."""
    import re

    path = CORPUS / "rank_crashed_torchrun_exit3_launcher.log"
    lines = path.read_text().splitlines()
    document = json.loads(diagnose("--json", str(path)).stdout)
    assert (document["root_cause"], document["rank"]) == ("rank_crashed", 1)
    (crashed,) = [row for row in document["launcher_failures"] if row["rank"] == 1]
    (stopped,) = [row for row in document["launcher_failures"] if row["rank"] == 0]
    assert stopped["signal"] == "SIGTERM" and any(
        "Sending process %d closing signal SIGTERM" % stopped["pid"] in line for line in lines
    )

    def naming(pid: int) -> list:
        return [number for number, line in enumerate(lines, 1) if re.search(r"\b%d\b" % pid, line)]

    by_category: dict = {}
    for finding in document["findings"]:
        by_category.setdefault(finding["category"], []).append(finding)
    # The crash's own evidence: the launcher's lines naming rank 1's pid; the stopped rank's: those naming rank 0's.
    assert [f["line"] for f in by_category["rank_crashed"]] == naming(crashed["pid"])
    assert [f["line"] for f in by_category["rank_stopped"]] == naming(stopped["pid"])
    assert all(f["title"] == "Stopped by the launcher after another rank failed" for f in by_category["rank_stopped"])
    assert {f["rank"] for f in by_category["rank_stopped"]} == {0, None}  # "Sending process PID" names no rank
    # Nothing about rank 0 among the peers that failed (the ChildFailedError line stays).
    assert [f["rank"] for f in by_category["nccl_remote"]] == [None]
    text = diagnose(str(path)).stdout.decode()
    rows = {
        found.group(1): (int(found.group(2)), found.group(3))
        for found in re.finditer(r"^[* ] .*? \[(\w+)\] \w+, (\d+) times?, [^\n]*?(rank \d+|$)", text, re.MULTILINE)
    }
    assert rows["rank_crashed"] == (len(naming(crashed["pid"])), "rank 1"), text
    assert rows["rank_stopped"] == (len(naming(stopped["pid"])), "rank 0"), text
    assert rows["nccl_remote"][0] == 1, text


def test_missing_and_unreadable_files_exit_2_naming_them_while_the_others_are_diagnosed(tmp_path):
    missing = tmp_path / "no_such_train_rank0.log"
    directory = tmp_path / "logs_dir"
    directory.mkdir()
    good = CORPUS / "disk_full_quota.log"
    done = diagnose("--json", str(missing), str(good), str(directory))
    assert done.returncode == 2
    errors = done.stderr.decode().splitlines()
    assert errors == [
        "opsconsole: diagnose: %s: No such file or directory" % missing,
        "opsconsole: diagnose: %s: Is a directory" % directory,
    ]
    (doc,) = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert (doc["file"], doc["root_cause"]) == (str(good), "disk_full")


def test_the_oom_killers_pid_names_the_rank_not_the_launchers_first_observed_failure(tmp_path):
    """A real gloo run (tests/data/torchrun_sigkill_peer_first) where rank 0 exited on the lost connection
    before the launcher saw rank 1's SIGKILL, with the node's dmesg line for rank 1's pid beside it: the
    verdict is host_oom on rank 1, the pid the OOM killer named (it said rank 0, the launcher's first observed
    failure: the fresh-clone CI runs of eb2cd8e and 671b5d1)."""
    import re
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "data" / "torchrun_sigkill_peer_first", run)
    launcher = (run / "launcher.log").read_text()
    pid = int(re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s*\n\s*exitcode\s*:\s*-9 \(pid: (\d+)\)", launcher).group(1))
    assert re.search(r"Root Cause \(first observed failure\):\n\[0\]:\n(.*\n){2}\s*rank\s*:\s*0 ", launcher)
    (run / "dmesg.log").write_text(
        "[2059991.491542] Out of memory: Killed process %d (python) total-vm:533122440kB, anon-rss:314514560kB, "
        "file-rss:74816kB, shmem-rss:12296kB, UID:0 pgtables:690068kB oom_score_adj:0\n" % pid
    )
    done = diagnose("--run", str(run), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["root_cause"], result["rank"]) == ("host_oom", 1)


def test_bad_usage_exits_2_in_one_line():
    done = diagnose("--no-such-option")
    assert done.returncode == 2 and b"Traceback" not in done.stderr
    # No FILE and a terminal on stdin: say what to give instead of waiting for input.
    leader, follower = os.openpty()
    try:
        done = diagnose(stdin=follower)
    finally:
        os.close(leader)
        os.close(follower)
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        "opsconsole: diagnose: name the log FILE(s) to read, or - for standard input"
    ]


def test_readable_report_names_the_root_cause_its_remedy_and_the_lines():
    done = diagnose(str(CORPUS / "cuda_oom_rank3_then_nccl.log"), str(CORPUS / "healthy_lightning.log"))
    assert done.returncode == 0, done.stderr
    report = done.stdout.decode()
    first, second = report.split("== ")[1:]
    assert "Root cause: CUDA out of memory [cuda_oom, critical]" in first
    assert CATEGORIES["cuda_oom"].remedy in first and CATEGORIES["nccl_timeout"].title in first
    assert "* CUDA out of memory [cuda_oom] critical, 1 time, line 93, rank 3" in first
    assert "ranks 0-2" in first and "line 93 rank 3: torch.OutOfMemoryError: CUDA out of memory." in first
    assert "healthy_lightning.log (15 lines)" in second and "No failure signature found." in second


def test_invalid_utf8_binary_noise_and_a_10_mb_line(tmp_path):
    log = tmp_path / "train_gpu01_rank0_20261202_120000.log"
    with open(log, "wb") as handle:
        handle.write(b"step 1 loss 2.3\n\xff\xfe\x00\x9c garbage \xc3\x28\n")
        handle.write(b"x" * (10 * 1024 * 1024) + b"\n")
        handle.write(b"RuntimeError: CUDA error: an illegal memory access was encountered \xe2\x82\n")
        handle.write(b"no newline at the end: NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with status=12")
    done = diagnose("--json", str(log))
    assert done.returncode == 0, done.stderr
    (doc,) = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert doc["root_cause"] == "cuda_illegal_memory"
    assert [(f["line"], f["category"]) for f in doc["findings"]] == [(4, "cuda_illegal_memory"), (5, "nccl_network")]
    assert doc["findings"][0]["excerpt"].endswith("\ufffd")


@pytest.mark.parametrize("name", ["gpu_xid79_fallen_off_bus.log", "healthy_nvidia_smi.log"])
def test_exit_0_whether_or_not_a_failure_was_found(name):
    done = diagnose(str(CORPUS / name))
    assert done.returncode == 0 and done.stderr == b""


def test_rotated_logs_are_read_through_their_decompressor_and_damaged_ones_are_named(tmp_path):
    import bz2
    import gzip
    import lzma

    text = (CORPUS / "nccl_network_ib_completion.log").read_bytes()
    names = []
    for suffix, opener in ((".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)):
        path = tmp_path / ("train_gpu01_rank4_20261202_120000.log.1" + suffix)
        with opener(path, "wb") as handle:
            handle.write(text)
        names.append(str(path))
    damaged = tmp_path / "train_gpu01_rank4_20261202_110000.log.2.gz"
    damaged.write_bytes(gzip.compress(text)[: len(text) // 8])
    done = diagnose("--json", *names, str(damaged))
    assert done.returncode == 2
    assert [json.loads(line)["root_cause"] for line in done.stdout.decode().splitlines()] == ["nccl_network"] * 3
    (error,) = done.stderr.decode().splitlines()
    assert error.startswith("opsconsole: diagnose: %s: " % damaged) and "Traceback" not in error


# --- fuzzing the diagnosis on arbitrary log lines ------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from opsconsole.diagnosis.engine import EXCERPT_CHARS, MAX_SCAN_CHARS, Diagnoser, diagnose_lines  # noqa: E402

# Pieces of real log lines (rank prefixes, srun labels, traceback frames, signatures NCCL, CUDA, the
# OS and torch print), terminal escapes and undecodable bytes; joined in any order with arbitrary text,
# long digit runs (rank numbers) and long runs of one character (a huge line, bounded in size).
LOG_PIECES = [
    "[rank",
    "[default",
    "[trainer",
    "]: ",
    "[Rank ",
    "] ",
    "rank ",
    " (local_rank",
    "  3: ",
    "0: ",
    "Last error:",
    'File "train.py", line 3, in <module>',
    "    loss.backward()",
    "Traceback (most recent call last):",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "CUDA out of memory. Tried to allocate",
    "NCCL WARN Connection closed by remote peer",
    "ncclInternalError: Internal check failed.",
    "loss is nan",
    "OSError: [Errno 28] No space left on device",
    "ChildFailedError",
    "\x1b]52;c;cm0gLXJm\x07",
    "\x1b]0;t\x07",
    "\x1b[2J",
    "\x9b",
    "\u202e",
    "\udcff",
    "\ufffd",
    "\t",
    "\r",
    "\x00",
]
# Rank markers as torch, torchrun, srun and NCCL write them, with rank numbers of any length.
RANK_FORMS = ["[rank%s]: ", "[default%s]:", "gpu07: [trainer%s]: ", "%s: ", "[Rank %s] ", "rank %s (local_rank "]
rank_marker = st.tuples(st.sampled_from(RANK_FORMS), st.sampled_from([0, 1, 7, 8, 4300, 4301, 6000])).map(
    lambda pair: pair[0] % ("9" * pair[1])
)  # around int()'s 4300-digit limit
log_line = st.lists(
    st.one_of(
        rank_marker,
        st.sampled_from(LOG_PIECES),
        st.text(max_size=12),
        st.integers(1, 40).map(lambda n: "7" * n),
        st.tuples(st.sampled_from(" x]:["), st.integers(0, MAX_SCAN_CHARS + 5000)).map(lambda pair: pair[0] * pair[1]),
    ),
    max_size=8,
).map("".join)


@settings(max_examples=100)
@given(st.lists(log_line, max_size=6))
def test_fuzz_diagnosis_of_arbitrary_lines_never_raises(lines):
    result = diagnose_lines(lines, source="fuzz.log")
    assert result.lines == len(lines)
    assert all(1 <= f.line <= len(lines) and len(f.excerpt) <= EXCERPT_CHARS for f in result.findings)
    assert result.root_cause is None or result.root_cause in {f.category for f in result.findings}


@settings(max_examples=40)
@given(
    st.lists(
        st.tuples(log_line, st.sampled_from([None, "rank0.log", "rank1.log"]), st.none() | st.integers(0, 7)),
        max_size=6,
    )
)
def test_fuzz_interleaved_sources_and_ranks_never_raise(feed):
    diagnoser = Diagnoser(max_findings=4)
    for number, (text, source, rank) in enumerate(feed, 1):
        diagnoser.feed_text(text, number, source, rank=rank)
    assert len(diagnoser.findings()) <= 4
    assert sum(row.count for row in diagnoser.summary()) >= len(diagnoser.findings())


def test_rank_numbers_too_long_for_int_are_not_ranks():
    """Found by the fuzzer: a rank of 5000 digits made int() raise (Python's 4300-digit limit)."""
    lines = [
        "a]: [rank" + "9" * 5000 + "]: CUDA out of memory. Tried to allocate 2 GiB",
        "[Rank " + "9" * 5000 + "] CUDA out of memory. Tried to allocate 2 GiB",
    ]
    result = diagnose_lines(lines)
    assert result.root_cause == "cuda_oom" and [f.rank for f in result.findings] == [None, None]


# --- --run: the files of one run, one verdict ------------------------------------------------------

RANK0 = [
    "2026-12-03 10:00:00,100 - INFO - Training started on gpu07",
    "2026-12-03 10:00:09,500 - INFO - Epoch 1 step 4/8 loss 2.1011",
    "Traceback (most recent call last):",
    '  File "/w/train.py", line 40, in <module>',
    "    dist.all_reduce(loss)",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.7]:4242",
]
RANK1 = [
    "2026-12-03 10:00:00,120 - INFO - Training started on gpu08",
    "2026-12-03 10:00:09,100 - ERROR - Rank 1 failed",
    "Traceback (most recent call last):",
    '  File "/w/train.py", line 31, in <module>',
    "    logits = model(batch)",
    '  File "/usr/lib/python3/site-packages/torch/nn/modules/sparse.py", line 190, in forward',
    "    return F.embedding(",
    "IndexError: index out of range in self \x1b]52;c;ZWNobyBoaQ==\x07",
]


def write_run(directory: Path) -> Path:
    logs = directory / "logs"
    logs.mkdir(parents=True)
    (logs / "train_gpu07_rank0_20261203_100000.log").write_text("\n".join(RANK0) + "\n")
    (logs / "train_gpu08_rank1_20261203_100000.log").write_text("\n".join(RANK1) + "\n")
    (directory / "checkpoint.pt").write_bytes(b"\x80\x02PK\x03\x04 not a log")
    return logs


def test_run_json_is_one_verdict_naming_the_rank_and_file_it_started_in(tmp_path):
    logs = write_run(tmp_path)
    done = diagnose("--run", "--json", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (document,) = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert list(document) == ["root_cause", "rank", "file", "line", "findings"]
    assert (document["root_cause"], document["rank"], document["line"]) == ("app_error", 1, 8)
    assert document["file"] == str(logs / "train_gpu08_rank1_20261203_100000.log")
    root = next(f for f in document["findings"] if f["category"] == "app_error")
    assert root["frame"] == "/w/train.py:31 in <module>" and root["rank"] == 1
    assert "\x1b" not in done.stdout.decode()  # the log's escape arrives as visible text
    peer = next(f for f in document["findings"] if f["rank"] == 0)
    assert peer["category"] == "nccl_remote" and peer["file"].endswith("rank0_20261203_100000.log")
    # Each file alone: rank 0 only knows its peer went away.
    alone = json.loads(diagnose("--json", str(logs / "train_gpu07_rank0_20261203_100000.log")).stdout)
    assert alone["root_cause"] == "nccl_remote"


def test_run_text_names_the_root_cause_rank_and_file(tmp_path):
    logs = write_run(tmp_path)
    done = diagnose(
        "--run",
        str(logs / "train_gpu07_rank0_20261203_100000.log"),
        str(logs / "train_gpu08_rank1_20261203_100000.log"),
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout.decode()
    assert "Root cause: Python exception in the training code [app_error, error]" in text
    assert "Started on rank 1, in %s line 8" % (logs / "train_gpu08_rank1_20261203_100000.log") in text
    assert "\x1b" not in text and "label range" in text


def test_run_usage_and_unreadable_inputs(tmp_path):
    done = diagnose("--run")
    assert done.returncode == 2 and done.stdout == b""
    write_run(tmp_path)
    missing = tmp_path / "nope.log"
    done = diagnose("--run", "--json", str(tmp_path), str(missing))
    assert done.returncode == 2 and str(missing).encode() in done.stderr
    assert json.loads(done.stdout)["root_cause"] == "app_error"  # the readable files still got their verdict


@pytest.mark.parametrize("json_flag", [(), ("--json",)])
def test_run_over_a_directory_without_logs_or_a_missing_one_is_an_error_not_a_healthy_run(tmp_path, json_flag):
    """An empty directory printed "No failure signature found." and exit 0 (a typo'd path looked healthy); a
    missing one printed that on stdout as well as its error. Now: the error alone, exit 2, nothing on stdout."""
    empty = tmp_path / "run"
    empty.mkdir()
    (empty / "checkpoint.pt").write_bytes(b"\x80\x02PK\x03\x04 not a log")  # a file, but not a log
    done = diagnose("--run", *json_flag, str(empty))
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode().startswith("opsconsole: diagnose: no log files found in %s (looked for *.log" % empty)
    missing = tmp_path / "rnu"
    done = diagnose("--run", *json_flag, str(missing))
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode() == "opsconsole: diagnose: %s: No such file or directory\n" % missing
    # Beside a run's logs, an empty directory is still named, and the logs still get their verdict.
    logs = write_run(tmp_path / "real")
    done = diagnose("--run", *json_flag, str(logs), str(empty))
    assert done.returncode == 2 and b"no log files found in %s " % bytes(empty) in done.stderr
    assert b"app_error" in done.stdout
