"""Readings that depend on a line's context, from the real-failure corpus's weak kinds (issue 14).

A peer's lost connection is the network's story while NCCL's communicator is being set up (NCCL's
init/bootstrap return-code trace, process-group or DDP setup frames; gloo's is its peer's loss there too) and a download's under an HTTP
client's frames; a traceback whose header was cut off still ends in its exception; a script's own NaN
check is a NaN, not an app error. Each case beside the same lines in the other context.
"""

from __future__ import annotations

from opsconsole.diagnosis.engine import diagnose_lines

CLOSED = "ws-01:7711:7844 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer ws-02<40318>"
INIT_TRACE = [
    "ws-01:7711:7844 [0] NCCL INFO misc/socket.cc:58 -> 6",
    "ws-01:7711:7844 [0] NCCL INFO bootstrap.cc:75 -> 6",
    "ws-01:7711:7844 [0] NCCL INFO init.cc:1396 -> 6",
]
RUNTIME_TRACE = [
    "ws-01:7711:7844 [0] NCCL INFO misc/socket.cc:58 -> 6",
    "ws-01:7711:7844 [0] NCCL INFO proxy.cc:1132 -> 6",
]


def test_a_peer_closed_while_ncclcomminitrank_was_connecting_is_the_network():
    assert diagnose_lines([CLOSED] + INIT_TRACE).root_cause == "nccl_network"
    assert diagnose_lines(INIT_TRACE + [CLOSED]).root_cause == "nccl_network"  # another process's trace first
    assert diagnose_lines([CLOSED] + RUNTIME_TRACE).root_cause == "nccl_remote"  # mid-run: the peer's own log says why


def _traceback(frames, exception):
    lines = ["Traceback (most recent call last):"]
    for path, function in frames:
        lines += ['  File "%s", line 10, in %s' % (path, function), "    call()"]
    return lines + [exception]


RESET = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer [10.0.0.2]:1234"
TORCH = "/opt/conda/lib/python3.10/site-packages/torch"


NCCL_LOST = (
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
    "remote process exited or there was a network error, NCCL version 2.19.3"
)


def test_a_peer_lost_by_nccl_in_process_group_or_ddp_setup_is_the_network_and_in_a_step_a_remote_failure():
    setup = [("train.py", "main"), (TORCH + "/nn/parallel/distributed.py", "__init__")]
    setup.append((TORCH + "/distributed/utils.py", "_verify_param_shape_across_processes"))
    assert diagnose_lines(_traceback(setup, NCCL_LOST)).root_cause == "nccl_network"
    step = [("train.py", "main"), (TORCH + "/distributed/distributed_c10d.py", "all_reduce")]
    assert diagnose_lines(_traceback(step, NCCL_LOST)).root_cause == "nccl_remote"
    # gloo's pair closes or resets only a connection it had made: in setup too, its peer's process went away (a real
    # run: tests/data/torchrun_gloo_setup_peer_killed), the lost peer in gloo's words, never NCCL's network.
    for frames in (setup, step):
        diagnosis = diagnose_lines(_traceback(frames, RESET))
        assert diagnosis.root_cause == "nccl_remote"
        assert diagnosis.findings[-1].title == "A peer rank failed (gloo connection lost)"


def test_a_connection_reset_under_http_client_frames_is_a_download_that_failed():
    http = [("fetch.py", "<module>"), ("/usr/lib/python3/site-packages/urllib3/connectionpool.py", "urlopen")]
    http.append(("/usr/lib/python3.10/ssl.py", "do_handshake"))
    reset = "ConnectionResetError: [Errno 104] Connection reset by peer"
    assert diagnose_lines(_traceback(http, reset)).root_cause == "io_error"
    ipython = [
        "File ~/env/lib/python3.11/ssl.py:1346, in SSLSocket.do_handshake(self, block)",
        "-> 1346     self._sslobj.do_handshake()",
        "",
        reset,
    ]
    header = "ConnectionResetError                      Traceback (most recent call last)"
    assert diagnose_lines([header] + ipython).root_cause == "io_error"


def test_frames_without_their_header_still_end_in_the_exception_they_raise():
    lines = [
        '  File "/work/train.py", line 41, in <module>',
        "    main()",
        '  File "/work/train.py", line 30, in main',
        "    model = build(cfg,",
        "                  strict=True)",
        "KeyError: 'backbone'",
    ]
    diagnosis = diagnose_lines(lines)
    assert diagnosis.root_cause == "app_error"
    assert diagnosis.findings[0].frame == "/work/train.py:30 in main"
    # The headerless traceback ends at the first line that is neither its continuation nor its exception.
    after = ['  File "/work/train.py", line 41, in <module>', "    main()", "epoch 3 done", "summary: 3 epochs"]
    assert diagnose_lines(after).findings == ()


def test_rich_and_hydra_hide_the_header_but_not_the_error():
    rich = [
        "╭──────────────── Traceback (most recent call last) ────────────────╮",
        "│ /work/train.py:130 in <module>                                    │",
        "│ ❱ 130 │   trainer = build(config)                                   │",
        "╰────────────────────────────────────────────────────────────────────╯",
        "ValueError: tokenizer has no pad token",
    ]
    assert [(f.category, f.exception) for f in diagnose_lines(rich).findings] == [
        ("app_error", "ValueError: tokenizer has no pad token")
    ]
    hydra = [
        "Error executing job with overrides: []",
        "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
    ]
    assert diagnose_lines(hydra).root_cause == "app_error"


def test_a_scripts_own_nan_check_is_a_nan_and_other_asserts_stay_app_errors():
    nan_assert = [
        "Traceback (most recent call last):",
        '  File "/work/train.py", line 88, in step',
        "    assert not torch.isnan(loss).any(), loss",
        "AssertionError: tensor(nan)",
    ]
    assert diagnose_lines(nan_assert).root_cause == "nan_inf"
    shape_assert = nan_assert[:2] + ["    assert x.shape == y.shape", "AssertionError"]
    assert diagnose_lines(shape_assert).root_cause == "app_error"


def test_a_builtin_exception_quoted_alone_is_an_app_error_unless_something_else_reads_it():
    assert diagnose_lines(["`IndexError: list index out of range`"]).root_cause == "app_error"
    assert diagnose_lines([RESET]).root_cause == "nccl_remote"
    assert diagnose_lines(["RuntimeError: Caught RuntimeError in DataLoader worker process 0."]).root_cause == (
        "dataloader_worker"
    )
    assert diagnose_lines(["INFO retrying: ValueError: bad gateway, retrying in 2s"]).findings == ()
