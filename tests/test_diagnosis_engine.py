"""The root-cause engine: precedence, tracebacks, rank prefixes, bounded memory, hostile input."""

from __future__ import annotations

import itertools
import json
import random
import time as _time
from pathlib import Path

import pytest

from opsconsole.diagnosis.engine import (
    EXCERPT_CHARS,
    MAX_SCAN_CHARS,
    MAX_SOURCES,
    PEER_GONE_WINDOW,
    ROOT_CAUSE_ORDER,
    Diagnoser,
    diagnose_lines,
    precedence,
)
from opsconsole.diagnosis.knowledge import CATEGORIES
from opsconsole.diagnosis.launcher import parse_error_file, parse_failure_table
from opsconsole.diagnosis.run import diagnose_run, run_files
from opsconsole.diagnosis.signatures import match_line
from opsconsole.diagnosis.timestamps import line_time, may_carry_time
from opsconsole.logs.names import label_source
from opsconsole.logs.records import LogLine, LogSource

# One line per (category, weak) as the tools print it.
EXAMPLES = {
    (
        "gpu_hardware",
        False,
    ): "[ 1843.308145] NVRM: Xid (PCI:0000:3b:00): 79, pid=48812, name=python, GPU has fallen off the bus.",
    (
        "host_oom",
        False,
    ): "[2059991.491542] Out of memory: Killed process 25315 (python) total-vm:53312244kB, anon-rss:31451456kB, file-rss:74816kB",
    (
        "cuda_oom",
        False,
    ): "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is free.",
    ("disk_full", False): "OSError: [Errno 28] No space left on device",
    ("cuda_driver", False): "RuntimeError: The NVIDIA driver on your system is too old (found version 11040).",
    ("cuda_invalid_device", False): "RuntimeError: CUDA error: invalid device ordinal",
    ("cuda_peer_access", False): "RuntimeError: CUDA error: peer access is not supported between these two devices",
    ("cuda_illegal_memory", False): "RuntimeError: CUDA error: an illegal memory access was encountered",
    ("cuda_device_assert", False): "RuntimeError: CUDA error: device-side assert triggered",
    (
        "cuda_illegal_memory",
        True,
    ): "NVRM: Xid (PCI:0000:cb:00): 31, pid=1797828, name=pt_main_thread, Ch 00000008, intr 00000000. MMU Fault",
    ("io_error", False): "OSError: [Errno 116] Stale file handle: '/mnt/nfs/cache/shard-0007.arrow'",
    (
        "checkpoint_corrupt",
        False,
    ): "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
    ("data_corrupt", False): "PIL.UnidentifiedImageError: cannot identify image file '/data/train/n01440764/x.JPEG'",
    ("nan_inf", False): "{'loss': nan, 'grad_norm': nan, 'learning_rate': 9.77e-06, 'epoch': 0.53}",
    (
        "dataloader_worker",
        False,
    ): "RuntimeError: DataLoader worker (pid 325) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory.",
    (
        "nccl_unhandled_cuda",
        False,
    ): "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
    ("dataloader_worker", True): "RuntimeError: Caught KeyError in DataLoader worker process 3.",
    ("rank_crashed", True): "  exitcode  : -9 (pid: 2630)",
    (
        "nccl_network",
        False,
    ): "ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 10.216.210.236<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
    (
        "nccl_timeout",
        False,
    ): "[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600020 milliseconds before timing out.",
    (
        "nccl_remote",
        True,
    ): "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
}
# app_error is read from a traceback, not from one line: its example is the whole traceback.
APP_ERROR_TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/work/train.py", line 41, in <module>',
    "    labels = table[batch]",
    "IndexError: index 12 is out of bounds for dimension 0 with size 10",
]


def example_lines(key):
    return APP_ERROR_TRACEBACK if key == ("app_error", False) else [EXAMPLES[key]]


def test_every_precedence_level_has_an_example_that_matches_it():
    assert set(EXAMPLES) | {("app_error", False)} == set(ROOT_CAUSE_ORDER)
    for key, line in EXAMPLES.items():
        assert key in match_line(line.split("]:", 1)[-1] if line.startswith("[rank") else line), key
    # A builtin exception quoted alone is an app error too (excerpts that kept only that line); with its traceback
    # the finding names the innermost frame outside site-packages.
    assert match_line(APP_ERROR_TRACEBACK[-1]) == [("app_error", False)]
    assert diagnose_lines(APP_ERROR_TRACEBACK).root_cause == "app_error"
    assert diagnose_lines(APP_ERROR_TRACEBACK).findings[0].frame == "/work/train.py:41 in <module>"
    # Every category has its place; rank_crashed's as a line is a SIGKILL's (weak: who sent it is not known), as
    # a verdict also a launcher's row read with the peers' reports.
    assert {category for category, _ in ROOT_CAUSE_ORDER} == set(CATEGORIES)
    assert [weak for category, weak in ROOT_CAUSE_ORDER if category == "rank_crashed"] == [True]


PAIRS = [(cause, symptom) for cause, symptom in itertools.combinations(ROOT_CAUSE_ORDER, 2)]


@pytest.mark.parametrize(
    "cause,symptom", PAIRS, ids=["%s%s>%s%s" % (c[0], "~" if c[1] else "", s[0], "~" if s[1] else "") for c, s in PAIRS]
)
def test_the_more_fundamental_category_is_the_root_cause_in_either_order(cause, symptom):
    for lines in (example_lines(symptom) + example_lines(cause), example_lines(cause) + example_lines(symptom)):
        assert diagnose_lines(["step 10 loss 2.31"] + lines).root_cause == cause[0]


MIXED_CASES = [
    (
        "nccl errors after one rank's CUDA OOM",
        [
            "[rank3]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB.",
            "[rank0]:[E1129 03:22:08.408271257 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1581, OpType=ALLREDUCE) ran for 600060 milliseconds before timing out.",
            "[rank1]:ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
        ],
        "cuda_oom",
    ),
    (
        "the OOM reported after the symptoms it caused",
        [
            "[rank0]:[E ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5) ran for 600013 milliseconds before timing out.",
            "[rank3]:RuntimeError: CUDA out of memory. Tried to allocate 392.00 MiB (GPU 3; 39.59 GiB total capacity)",
        ],
        "cuda_oom",
    ),
    (
        "a watchdog reporting an illegal memory access",
        [
            "[rank2]:[E1129 04:02:11.318311870 ProcessGroupNCCL.cpp:1895] [PG ID 2 PG GUID 3 Rank 2] Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was encountered",
        ],
        "cuda_illegal_memory",
    ),
    (
        "peers reporting a rank's SIGKILL",
        [
            "[rank1]:socketProgress: Connection closed by remote peer gpu-e01<40122>",
            "[rank2]:NCCL WARN socketStartConnect: Connect to 10.0.0.2<45763> failed : Connection refused",
            "E1129 03:25:27.620000 2606 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: -9) local_rank: 0 (pid: 2630) of binary: /usr/bin/python",
            "  traceback : Signal 9 (SIGKILL) received by PID 2630",
        ],
        "rank_crashed",
    ),
    (
        "the launcher's report alone names a failed peer",
        [
            "E1129 03:13:44.002000 7710 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 1 (pid: 7712) of binary: /opt/conda/bin/python",
        ],
        "nccl_remote",
    ),
    (
        "a GPU that fell off the bus makes CUDA calls fail",
        [
            "RuntimeError: CUDA error: unspecified launch failure",
            "Nov 29 03:50:12 gpu-g04 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=48812, name=python, GPU has fallen off the bus.",
        ],
        "gpu_hardware",
    ),
    (
        "a truncated image inside a DataLoader worker",
        [
            "OSError: Caught OSError in DataLoader worker process 0.",
            "Original Traceback (most recent call last):",
            '  File "/opt/conda/lib/python3.11/site-packages/PIL/ImageFile.py", line 247, in load',
            '    raise OSError("image file is truncated")',
            "OSError: image file is truncated (1 bytes not processed)",
        ],
        "data_corrupt",
    ),
    (
        "shared memory full is the loader's, not the disk's",
        [
            "RuntimeError: unable to write to file </torch_1190_2781334811_0>: No space left on device (28)",
            "RuntimeError: DataLoader worker (pid(s) 1201) exited unexpectedly",
        ],
        "dataloader_worker",
    ),
    (
        "an IB completion error under a remote error",
        [
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
            "Last error:",
            "NET/IB : Got completion from peer 10.216.210.236<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
        ],
        "nccl_network",
    ),
    (
        "the full disk that left a checkpoint truncated",
        [
            "RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 1093632 vs 1093520",
            "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory",
        ],
        "disk_full",
    ),
]


@pytest.mark.parametrize("lines,expected", [case[1:] for case in MIXED_CASES], ids=[case[0] for case in MIXED_CASES])
def test_mixed_failures_name_the_cause(lines, expected):
    assert diagnose_lines(lines).root_cause == expected


def test_equal_precedence_goes_to_the_earliest_and_precedence_is_ordered():
    twice = diagnose_lines(
        ["RuntimeError: CUDA error: invalid device ordinal", "RuntimeError: CUDA error: invalid device ordinal"]
    )
    assert twice.root_cause == "cuda_invalid_device"
    assert (
        precedence("gpu_hardware")
        < precedence("cuda_oom")
        < precedence("nccl_timeout")
        < precedence("nccl_remote", True)
    )
    assert precedence("no_such_category") == len(ROOT_CAUSE_ORDER)
    assert diagnose_lines(["all good", "step 2 loss 1.9"]).root_cause is None


HEALTHY_LINES = [
    "tj5-h800-01:531:531 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.12.4.17<0>",
    "ws-01:7711:7844 [0] NCCL INFO Call to connect returned Connection refused, retrying",
    "ws-01:7711:7711 [0] misc/ibvwrap.cc:66 NCCL WARN Failed to open libibverbs.so[.1]",
    "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 32768.0",
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768",
    "{'loss': 0.2051, 'grad_norm': nan, 'learning_rate': 9.774074342405685e-06, 'epoch': 0.53}",
    "Corrupt JPEG data: 240 extraneous bytes before marker 0xd9",
    "cudaDeviceEnablePeerAccess returned cudaErrorPeerAccessAlreadyEnabled, ignoring",
    "_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do so you have two options",
    "[Sat Nov 29 03:41:09 2026] NVRM: Xid (PCI:0000:cb:00): 43, pid=1797828, name=pt_main_thread, Ch 00000008",
    " iteration     1200/   50000 | lm loss: 2.61E+00 | grad norm: 0.912 | number of skipped iterations:   0 | number of nan iterations:   0 |",
    "You should probably TRAIN this model on a down-stream task to be able to use it for predictions and inference.",
    "%s - INFO - init_process_group(backend=nccl, timeout=0:30:00) NCCL_TIMEOUT=1800" % "2026-11-29 03:12:07,418",
    "|            CUDA OOMs: 0            |        cudaMalloc retries: 0         |",
    "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
]


@pytest.mark.parametrize("line", HEALTHY_LINES)
def test_healthy_lines_that_look_alarming_are_not_flagged(line):
    assert diagnose_lines([line]).findings == ()


def test_traceback_frames_and_quoted_source_are_not_errors():
    lines = [
        "Traceback (most recent call last):",
        '  File "/workspace/oom_retry.py", line 12, in safe_cuda_operation',
        '    if "CUDA out of memory" in str(e):',
        '  File "/workspace/oom_retry.py", line 20, in handle_oom',
        '    raise RuntimeError("NCCL error: unhandled system error")',
        "KeyError: 'labels'",
    ]
    # Neither the frames nor the quoted source match; the exception the traceback ends in is the app's own.
    found = diagnose_lines(lines).findings
    assert [(f.line, f.category, f.exception, f.frame) for f in found] == [
        (6, "app_error", "KeyError: 'labels'", "/workspace/oom_retry.py:20 in handle_oom")
    ]
    # The exception line itself is what counts, even indented under torchelastic's report.
    elastic = [
        "  traceback : Traceback (most recent call last):",
        '    File "/opt/conda/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 355, in wrapper',
        "      return f(*args, **kwargs)",
        "  RuntimeError: CUDA error: an illegal memory access was encountered",
    ]
    found = diagnose_lines(elastic).findings
    assert [(f.line, f.category) for f in found] == [(4, "cuda_illegal_memory")]


def test_prefixed_tracebacks_skip_their_source_lines_too():
    lines = [
        "ERROR 11-29 03:31:11 worker_base.py:574] Traceback (most recent call last):",
        'ERROR 11-29 03:31:11 worker_base.py:574]   File "/srv/retry.py", line 9, in run',
        "ERROR 11-29 03:31:11 worker_base.py:574]     except torch.OutOfMemoryError:  # CUDA out of memory",
        "ERROR 11-29 03:31:11 worker_base.py:574] RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered",
    ]
    assert [(f.line, f.category) for f in diagnose_lines(lines).findings] == [(4, "cuda_illegal_memory")]


def test_interleaved_ranks_keep_their_own_traceback_state():
    lines = [
        '[rank0]:  File "/workspace/train.py", line 231, in train_epoch',
        "[rank1]:  torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB.",
        '[rank0]:    if "illegal memory access" in msg:',
        "[rank0]:RuntimeError: CUDA error: device-side assert triggered",
    ]
    found = diagnose_lines(lines).findings
    assert [(f.line, f.category, f.rank) for f in found] == [(2, "cuda_oom", 1), (4, "cuda_device_assert", 0)]


@pytest.mark.parametrize(
    "line,rank",
    [
        ("[rank3]:RuntimeError: CUDA error: invalid device ordinal", 3),
        ("[default5]:RuntimeError: CUDA error: invalid device ordinal", 5),
        (
            "[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580) ran for 600060 milliseconds before timing out.",
            0,
        ),
        ("12: RuntimeError: CUDA error: invalid device ordinal", 12),
        (
            "[E ProcessGroupNCCL.cpp:737] [Rank 7] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508) ran for 1802220 milliseconds",
            7,
        ),
        ("RuntimeError: CUDA error: invalid device ordinal", None),
    ],
)
def test_rank_prefixes_and_rank_mentions_label_findings(line, rank):
    (finding,) = diagnose_lines([line]).findings
    assert finding.rank == rank
    assert not finding.excerpt.startswith("[rank") and not finding.excerpt.startswith("[default")


def test_nccl_last_error_detail_keeps_its_label_in_the_excerpt():
    found = diagnose_lines(
        [
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled cuda error",
            "ncclUnhandledCudaError: Call to CUDA function failed.",
            "Last error:",
            "Cuda failure 'out of memory'",
        ]
    ).findings
    assert [(f.line, f.category) for f in found] == [
        (1, "nccl_unhandled_cuda"),
        (2, "nccl_unhandled_cuda"),
        (4, "cuda_oom"),
    ]
    assert found[-1].excerpt == "Last error: Cuda failure 'out of memory'"


def test_findings_are_bounded_but_counts_stay_exact():
    diagnoser = Diagnoser(max_findings=100)
    for number in range(1, 5001):
        diagnoser.feed_text(
            "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB",
            number,
            "gpu01:rank%d" % (number % 8),
            time=1000.0 + number,
            rank=number % 8,
        )
    assert len(diagnoser.findings()) == 100
    assert diagnoser.dropped == 4900
    (row,) = diagnoser.summary()
    assert (row.category, row.count, row.first_line, row.last_line) == ("cuda_oom", 5000, 1, 5000)
    assert (row.first_seen, row.last_seen) == (1001.0, 6000.0)
    assert row.ranks == tuple(range(8)) and len(row.sources) == 8
    result = diagnose_lines(["OSError: [Errno 28] No space left on device"] * 50, max_findings=10)
    assert (len(result.findings), result.dropped, result.summary[0].count, result.lines) == (10, 40, 50, 50)


def test_per_source_state_is_bounded():
    diagnoser = Diagnoser()
    for number in range(MAX_SOURCES + 500):
        diagnoser.feed_text("step %d loss 1.0" % number, 1, "node%05d:/logs/train.log" % number)
    assert len(diagnoser._sources) <= MAX_SOURCES


def test_invalid_and_binary_bytes_do_not_break_it():
    noise = random.Random(4).randbytes(256 * 1024)
    blob = (
        noise
        + b"\n\xff\xfe\x00RuntimeError: CUDA error: an illegal memory access was encountered\x00\xc3\x28\n"
        + noise
    )
    lines = blob.decode("utf-8", errors="replace").splitlines()
    result = diagnose_lines(lines)
    assert result.root_cause == "cuda_illegal_memory"
    assert "\ufffd" in result.findings[0].excerpt or "\x00" in result.findings[0].excerpt


def test_a_10_mb_line_is_scanned_on_its_first_64_kib():
    error = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB "
    (finding,) = diagnose_lines([error + "x" * (10 * 1024 * 1024)]).findings
    assert finding.category == "cuda_oom" and len(finding.excerpt) <= EXCERPT_CHARS
    assert diagnose_lines(["y" * (10 * 1024 * 1024)]).findings == ()
    assert diagnose_lines(["z" * MAX_SCAN_CHARS + error]).findings == ()  # beyond the scanned part


def test_feed_takes_the_followers_log_lines():
    source = LogSource("gpu01", "/logs/train_gpu01_rank3_20261202_120000.log", "gpu01", 3, "gpu01:rank3")
    other = LogSource("gpu02", "/logs/launcher.log", None, None, "launcher.log")
    diagnoser = Diagnoser()
    assert diagnoser.feed(LogLine(source, 1, 0, "step 10 loss 2.3", time=10.0)) is None
    oom = diagnoser.feed(LogLine(source, 2, 20, "torch.OutOfMemoryError: CUDA out of memory.", time=11.0, rank=3))
    remote = diagnoser.feed(
        LogLine(other, 7, 300, "[rank5]:ncclRemoteError: A call failed possibly due to a network error", time=12.0)
    )
    assert (oom.source, oom.rank, oom.time, oom.line) == (source.key, 3, 11.0, 2)
    assert (remote.source, remote.rank) == (other.key, 5)
    assert diagnoser.root_cause() == "cuda_oom"
    rows = diagnoser.summary()
    assert [row.category for row in rows] == ["cuda_oom", "nccl_remote"]  # the root cause first
    assert rows[0].first_finding is oom and rows[0].cause == CATEGORIES["cuda_oom"].cause
    diagnoser.reset()
    assert (diagnoser.findings(), diagnoser.root_cause(), diagnoser.summary()) == ([], None, [])


PEER_GONE = "host:1:2 [1] misc/socket.cc:538 NCCL WARN Net : Connection closed by remote peer node-b<47861>"
GENERIC = "ncclInternalError: Internal check failed."


@pytest.mark.parametrize(
    "lines,expected",
    [
        ([PEER_GONE, "host:1:2 [1] NCCL INFO proxy.cc:1132 -> 3", GENERIC], "nccl_remote"),
        ([GENERIC], "nccl_network"),
        ([PEER_GONE] + ["step %d" % n for n in range(PEER_GONE_WINDOW + 1)] + [GENERIC], "nccl_network"),
        (
            [PEER_GONE, "NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with status=12 opcode=0"],
            "nccl_network",
        ),
        (["[rank1]:" + PEER_GONE, "[rank0]:" + GENERIC], "nccl_network"),  # another rank's peer is not this rank's
    ],
    ids=["generic-after-peer-gone", "generic-alone", "outside-the-window", "specific-network-error", "other-rank"],
)
def test_nccl_generic_errors_read_in_context_of_a_vanished_peer(lines, expected):
    assert diagnose_lines(lines).root_cause == expected


@pytest.mark.parametrize(
    "lowered, expected",
    [
        ("loss=nan at step 12", True),  # "nan" as a word
        ("nan", True),
        ("grad norm: inf", True),
        ("[inf]", True),
        ("info - inference took 12 nanoseconds", False),  # inside words only
        ("epoch 3 step 1200 loss=2.31 lr=3e-4", False),
        ("runtimeerror: cuda out of memory. tried to allocate 2.00 gib", True),
        ("nanny: infinite wait; nccl watchdog got stuck for 600 s", True),  # a later needle counts
        ("", False),
    ],
)
def test_the_prefilter_finds_needles_and_counts_nan_and_inf_only_as_words(lowered, expected):
    from opsconsole.diagnosis.signatures import candidates

    assert bool(candidates(lowered)) is expected


# --- time stamps, launcher tables, app_error, evidence, verdicts (issue 14) ---------------------------


def text_lines(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


def local_epoch(year, month, day, hour, minute, second, fraction=0.0):
    return _time.mktime((year, month, day, hour, minute, second, 0, 0, -1)) + fraction


STAMPED = [
    ("2026-12-03 10:10:09,123 - training - INFO - step 5", local_epoch(2026, 12, 3, 10, 10, 9, 0.123)),
    (
        "[2026-12-03 10:10:09,123] torch.distributed.elastic.agent.server.api: [WARNING] Received Signals.SIGTERM",
        local_epoch(2026, 12, 3, 10, 10, 9, 0.123),
    ),
    ("2026-12-03T10:10:09.5Z worker started", 1796292609.5),
    ("2026-12-03T11:10:09.25+01:00 worker started", 1796292609.25),
    ("2026-12-03T05:10:09-05:00 worker started", 1796292609.0),
    (
        "E1203 10:10:09.123456 12345 ProcessGroupNCCL.cpp:42] [Rank 1] Watchdog caught collective operation timeout",
        local_epoch(2026, 12, 3, 10, 10, 9, 0.123456),
    ),
    (
        "[E1203 10:10:09.123456 12345 ProcessGroupNCCL.cpp:42] [Rank 1] Watchdog caught",
        local_epoch(2026, 12, 3, 10, 10, 9, 0.123456),
    ),
    ("(pid=4242, ip=10.0.0.7) 2026-12-03 10:10:09,123 - INFO - step 5", local_epoch(2026, 12, 3, 10, 10, 9, 0.123)),
    (
        "(RayTrainWorker pid=4242, ip=10.0.0.7) [E1203 10:10:09.123456 4242 x.cpp:1] boom",
        local_epoch(2026, 12, 3, 10, 10, 9, 0.123456),
    ),
]


@pytest.mark.parametrize("line,expected", STAMPED, ids=[line[:24] for line, _ in STAMPED])
def test_every_common_time_prefix_is_read(line, expected):
    assert may_carry_time(line)
    assert line_time(line, 2026)[0] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(
    "line",
    [
        "gpu07:4242:4300 [0] NCCL INFO Channel 00/02 :    0   1",  # NCCL's prefix names no time
        "IndexError: index out of range in self",
        "Epoch 3: 100%|██████████| 50/50",
        '  File "x.py", line 3',
        "12345 tokens/s",
        "[rank1]: something",
        "(pid=12) no time here",
        "",
    ],
)
def test_lines_without_a_time_prefix_have_none(line):
    assert line_time(line, 2026) == (None, None) or not may_carry_time(line)


def test_a_glog_stamp_takes_the_year_of_the_runs_full_stamps():
    assert line_time("2025-01-02 03:04:05,000 - INFO - x")[1] == 2025
    assert line_time("I0102 03:04:05.000000 1 a.cc:1] x", 2025)[0] == local_epoch(2025, 1, 2, 3, 4, 5)
    assert line_time("I0102 03:04:05.000000 1 a.cc:1] x")[0] <= _time.time() + 86400  # never in the future


def test_glog_lines_keep_their_own_time_and_show_the_gap_between_an_oom_and_its_timeout():
    lines = [
        "2026-12-03 10:00:00,000 - INFO - step 100",
        "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "2026-12-03 10:00:01,000 - INFO - rank 0 waiting",
        "[E1203 10:10:09.123456 12345 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5) ran for 600013 milliseconds before timing out.",
        "[rank0]: RuntimeError: still waiting",
    ]
    result = diagnose_lines(lines)
    rows = {row.category: row for row in result.summary}
    assert result.root_cause == "cuda_oom"
    assert rows["cuda_oom"].first_seen == local_epoch(2026, 12, 3, 10, 0, 0)
    assert rows["nccl_timeout"].first_seen - rows["cuda_oom"].first_seen == pytest.approx(609.123456)


TABLE = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-03_10:10:09
  host      : gpu07
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 4241)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4241
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_10:10:08
  host      : gpu07
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 4242)
  error_file: /tmp/torchelastic_x/none_y/attempt_0/1/error.json
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================""".splitlines()


def test_the_torchelastic_failure_table_is_parsed():
    other, root = parse_failure_table(TABLE)
    assert (other.rank, other.local_rank, other.exitcode, other.pid, other.signal, other.first) == (
        2,
        0,
        -15,
        4241,
        "SIGTERM",
        False,
    )
    assert (root.rank, root.local_rank, root.exitcode, root.pid, root.signal, root.host, root.first) == (
        3,
        1,
        -9,
        4242,
        "SIGKILL",
        "gpu07",
        True,
    )
    assert root.error_file == "/tmp/torchelastic_x/none_y/attempt_0/1/error.json" and other.error_file is None
    assert root.time == local_epoch(2026, 12, 3, 10, 10, 8) and root.killed and not other.killed


def test_sigkill_alone_is_a_killed_rank_on_the_tables_rank_and_the_oom_killer_line_makes_it_host_oom():
    diagnoser = Diagnoser()
    for number, line in enumerate(TABLE, 1):
        diagnoser.feed_text(line, number, "launcher.log")
    verdict = diagnoser.verdict()
    # Who sent the SIGKILL is not in the table: the OOM killer, a scheduler's limit, a kill -9.
    assert (verdict.category, verdict.rank, verdict.launcher.rank) == ("rank_crashed", 3, 3)
    assert verdict.finding.title == "Rank 3 was killed by signal SIGKILL" and verdict.finding.weak
    assert all(word in verdict.finding.remedy for word in ("dmesg", "memory.events", "oom_kill", "sacct", "kill -9"))
    assert "kill -9" in verdict.finding.cause and "scheduler" in verdict.finding.cause
    row = next(row for row in diagnoser.summary() if row.category == "rank_crashed")
    assert row.title == "Killed by SIGKILL (no OOM-killer line seen)"
    assert not [row for row in diagnoser.summary() if row.category == "host_oom"]
    # The kernel's own line: the OOM killer it was, host_oom, seen.
    diagnoser.feed_text("[2059991.491542] Out of memory: Killed process 4242 (python) total-vm:53312244kB", 1, "dmesg")
    verdict = diagnoser.verdict()
    assert (verdict.category, verdict.finding.evidence, verdict.rank) == ("host_oom", "seen", 3)
    row = next(row for row in diagnoser.summary() if row.category == "host_oom")
    assert row.severity == "critical"
    for line in (
        "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4242.0. Some of your processes may have been killed by the cgroup out-of-memory handler.",
        "[12.3] Memory cgroup out of memory: Killed process 4242 (python) total-vm:1kB",
    ):
        assert diagnose_lines([line]).findings[0].evidence == "seen"


def test_a_traceback_is_app_error_unless_a_line_of_it_names_a_specific_category():
    plain = [
        "Traceback (most recent call last):",
        '  File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1736, in _call_impl',
        "    return forward_call(*args, **kwargs)",
        '  File "/work/model.py", line 88, in forward',
        "    return self.proj(x)",
        '  File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/linear.py", line 125, in forward',
        "    return F.linear(input, self.weight, self.bias)",
        "RuntimeError: shape '[4, 12]' is invalid for input of size 40",
    ]
    (finding,) = diagnose_lines(plain).findings
    assert (finding.category, finding.line, finding.frame) == ("app_error", 8, "/work/model.py:88 in forward")
    assert finding.exception == "RuntimeError: shape '[4, 12]' is invalid for input of size 40"
    assert "label range" not in finding.remedy  # the index remedy is for index errors only
    specific = plain[:-1] + ["RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert [f.category for f in diagnose_lines(specific).findings] == ["cuda_illegal_memory"]
    # Chained: the specific error of the first traceback explains the second.
    chained = specific + ["", "The above exception was the direct cause of the following exception:", ""] + plain
    assert [f.category for f in diagnose_lines(chained).findings] == ["cuda_illegal_memory"]
    # A stop the process was told to make is no error of its own.
    stopped = plain[:-1] + ["KeyboardInterrupt"]
    assert diagnose_lines(stopped).findings == ()


def test_the_rank_that_failed_first_in_time_is_the_root_across_files():
    diagnoser = Diagnoser()
    # Fed rank 0's file first, but rank 1 failed a second earlier: rank 1 is the root.
    rank0 = [
        "2026-12-03 10:00:05,000 - ERROR - crashed",
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 9, in step',
        "    x = batch[k]",
        "KeyError: 'k'",
    ]
    rank1 = [
        "2026-12-03 10:00:04,000 - ERROR - crashed",
        "Traceback (most recent call last):",
        '  File "/w/train.py", line 12, in step',
        "    y = table[i]",
        "IndexError: list index out of range",
    ]
    peer = [
        "2026-12-03 10:00:03,000 - INFO - rank 2 up",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1234",
    ]
    for name, rank, lines in (("r0.log", 0, rank0), ("r2.log", 2, peer), ("r1.log", 1, rank1)):
        for number, line in enumerate(lines, 1):
            diagnoser.feed_text(line, number, name, rank=rank)
    verdict = diagnoser.verdict()
    assert (verdict.category, verdict.rank, verdict.finding.source, verdict.finding.line) == (
        "app_error",
        1,
        "r1.log",
        5,
    )
    assert "label range" in verdict.finding.remedy


def test_rank_labelled_lines_keep_their_files_clock():
    lines = [
        "0: 2026-12-03 10:00:00,000 - INFO - step 1",
        "1: 2026-12-03 10:00:02,000 - INFO - step 1",
        "1: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        "[rank0]: [E1203 10:10:00.000000 7 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout",
    ]
    found = {finding.category: finding for finding in diagnose_lines(lines).findings}
    assert (found["cuda_oom"].rank, found["cuda_oom"].time) == (1, local_epoch(2026, 12, 3, 10, 0, 2))
    assert (found["nccl_timeout"].rank, found["nccl_timeout"].time) == (0, local_epoch(2026, 12, 3, 10, 10, 0))


def test_the_console_feed_reads_a_glog_lines_own_time():
    source = LogSource(node="local", path="/logs/train_gpu07_rank1_x.log", host="gpu07", rank=1, label="gpu07:rank1")
    diagnoser = Diagnoser()
    line = LogLine(
        source=source,
        number=4,
        offset=0,
        time=123.0,
        rank=1,
        text="[E1203 10:10:09.500000 77 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout",
    )
    finding = diagnoser.feed(line)
    assert finding.category == "nccl_timeout" and finding.time == local_epoch(2026, 12, 3, 10, 10, 9, 0.5)


def test_an_error_file_gives_its_traceback():
    data = json.dumps(
        {
            "message": {
                "message": "IndexError: index out of range in self",
                "extraInfo": {
                    "py_callstack": 'Traceback (most recent call last):\n  File "/w/t.py", line 3, in f\n    e(x)\nIndexError: index out of range in self\n',
                    "timestamp": "1796292609",
                },
            }
        }
    ).encode()
    error = parse_error_file(data)
    assert error.timestamp == 1796292609.0 and error.traceback.endswith("in self\n")
    assert diagnose_lines(error.traceback.splitlines()).findings[0].frame == "/w/t.py:3 in f"
    assert parse_error_file(b'{"x": 1}') is None and parse_error_file(b"not json") is None


@pytest.mark.parametrize(
    "lines,rank",
    [
        (
            [
                "E1203 10:10:09.480000 8770 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 8774) of binary: /usr/bin/python"
            ],
            1,
        ),
        (
            [
                "slurmstepd: error: Detected 2 oom_kill events in StepId=42.13. Some of the step tasks have been OOM Killed.",
                "srun: error: node07: task 4: Out Of Memory",
            ],
            4,
        ),
        (
            [
                "torch.multiprocessing.spawn.ProcessRaisedException: ",
                "",
                "-- Process 1 terminated with the following error:",
                "Traceback (most recent call last):",
                '  File "/w/train.py", line 5, in run',
                "    step()",
                "FloatingPointError: Loss became infinite or NaN at iteration=12!",
            ],
            1,
        ),
    ],
)
def test_launchers_name_the_failed_process(lines, rank):
    diagnoser = Diagnoser()
    for number, line in enumerate(lines, 1):
        diagnoser.feed_text(line, number, "launcher.log")
    assert diagnoser.verdict().rank == rank


def test_run_sources_take_ranks_from_torchruns_layout_and_names_and_read_error_files(tmp_path):
    assert label_source("local", "/x/tr/none_ab/attempt_0/3/stderr.log").rank == 3
    assert label_source("local", "/x/train_gpu07_rank5_20261203_101010.log").rank == 5
    assert (
        label_source("local", "/x/worker-rank_2.out").rank == 2
        and label_source("local", "/x/launcher.log").rank is None
    )
    rank_dir = tmp_path / "tr" / "none_ab" / "attempt_0" / "1"
    rank_dir.mkdir(parents=True)
    (rank_dir / "error.json").write_text(
        json.dumps(
            {
                "message": {
                    "message": "IndexError: index out of range in self",
                    "extraInfo": {
                        "py_callstack": 'Traceback (most recent call last):\n  File "/w/t.py", line 3, in f\n    e(x)\n'
                        "IndexError: index out of range in self\n",
                        "timestamp": "1796292609",
                    },
                }
            }
        )
    )
    (tmp_path / "model.pt").write_bytes(b"PK\x03\x04")
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    assert run_files([str(tmp_path)]) == [str(tmp_path / "config.json"), str(rank_dir / "error.json")]
    result = diagnose_run([str(tmp_path)], text_lines)
    assert (result.root_cause, result.verdict.rank, result.file_of(result.verdict.finding)) == (
        "app_error",
        1,
        str(rank_dir / "error.json"),
    )
    assert result.verdict.finding.frame == "/w/t.py:3 in f"


def test_a_run_reads_the_error_file_the_launchers_table_names(tmp_path):
    error_file = tmp_path / "elsewhere" / "error.json"
    error_file.parent.mkdir()
    error_file.write_text(
        json.dumps(
            {
                "message": {
                    "message": "ValueError: bad lr",
                    "extraInfo": {
                        "py_callstack": 'Traceback (most recent call last):\n  File "/w/t.py", line 9, in main\n    check(lr)\n'
                        "ValueError: bad lr\n"
                    },
                }
            }
        )
    )
    run = tmp_path / "run"
    run.mkdir()
    table = [
        line.replace("/tmp/torchelastic_x/none_y/attempt_0/1/error.json", str(error_file))
        .replace("exitcode  : -9 (pid: 4242)", "exitcode  : 1 (pid: 4242)")
        .replace("Signal 9 (SIGKILL) received by PID 4242", "")
        for line in TABLE
    ]
    (run / "launcher.log").write_text("\n".join(table) + "\n")
    result = diagnose_run([str(run)], text_lines)
    assert (result.root_cause, result.verdict.rank) == ("app_error", 3)
    assert result.file_of(result.verdict.finding) == str(error_file) and result.files[-1] == str(error_file)


# --- a peer gone while NCCL sets up its communicator is the network (issue 14's test-part misses by kind) ----

_SETUP = ["node0:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>", "node0:1:1 [0] NCCL INFO Using network Socket"]
_CLOSED = "node0:1:9 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer node1<5123>"
_COMPLETE = "node0:1:9 [0] NCCL INFO comm 0x55 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE"


@pytest.mark.parametrize(
    "lines, expected",
    [
        (_SETUP + [_CLOSED], "nccl_network"),  # nobody ran a step yet: the peers could not reach each other
        (_SETUP + [_COMPLETE, _CLOSED], "nccl_remote"),  # mid-run: a peer went away, its own log holds why
        ([_CLOSED], "nccl_remote"),  # no sign of a setup in progress: as before
    ],
    ids=["during-setup", "after-init-complete", "no-setup-seen"],
)
def test_a_connection_closed_during_nccl_setup_is_the_network(lines, expected):
    assert diagnose_lines(lines).root_cause == expected


def test_a_frame_with_more_after_it_is_read_as_a_line():
    # A pasted traceback whose line breaks were lost (awsome-distributed-ai#192): the error after the frame counts.
    flattened = (
        'File "/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 1906, '
        "in broadcast 10: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1331, "
        "unhandled system error 10: Last error: 10: socketStartConnect: Connect to 127.0.0.1<45069> failed"
    )
    assert diagnose_lines([flattened]).root_cause == "nccl_network"
    frame = '  File "/x/train.py", line 12, in <module>'
    assert diagnose_lines(["Traceback (most recent call last):", frame, "    loss = NaN_guard()"]).findings == ()


# --- torchrun --tee's "[default1]:" in front of torch's own "[rank1]:" (a real run's merged output) ----------


def test_a_tee_prefixed_rank_traceback_is_read_with_its_rank_by_the_diagnosis_and_the_logs_pane():
    # Both prefixes used to be read as one: the traceback behind "[default1]:[rank1]:" was never parsed (the
    # run's verdict was its peer's lost connection, nccl_remote) and the Logs pane gave such lines no rank.
    from opsconsole.logs.names import parse_line

    path = Path(__file__).parent / "data" / "diagnosis" / "app_error_torchrun_tee_assert.log"
    lines = path.read_text(encoding="utf-8").splitlines()
    diagnosis = diagnose_lines(lines, source=path.name)
    assert diagnosis.root_cause == "app_error"
    root = next(f for f in diagnosis.findings if f.category == "app_error")
    assert (root.rank, root.exception) == (1, "AssertionError: expected 8 features, got 4")
    assert root.frame == "/tmp/vdiag/worker.py:39 in <module>"
    assert [parse_line(line)[2] for line in lines if line.startswith("[default1]:[rank1]:")] == [1] * 5
    assert parse_line("[default0]:step 0 loss: 0.1600")[2] == 0
    assert parse_line("[default3]:[rank11]: boom")[2] == 11  # the global rank, not torchrun's local one
