"""Flight recorder: real dumps (NCCL on an H200, gloo from a real 2-rank torchrun), matched across ranks.

The NCCL fixtures in tests/data/flight_recorder/ were taken on the accelerator machine (README there).
Multi-rank sets are built from them by rewriting the real dump's entries for other ranks, then
saving each as the pickle torch writes; hostile files sit beside them and end as "unreadable".
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from opsconsole.checkpoints.worker import MetadataWorkers
from opsconsole.hang import flight_recorder as fr
from opsconsole.hang.flight_recorder import (
    KIND_DTYPE,
    KIND_NOT_JOINED,
    KIND_OP,
    KIND_SIZE,
    KIND_STUCK,
    analyse_dir,
    analysis_json,
    dump_files,
    dump_locations,
    summary_text,
)
from tests.sshd import ssh_client, sshd_factory  # noqa: F401  (pytest fixtures)
from tests.torchrun import torchrun_command, torchrun_env

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "flight_recorder"
PIPE_DUMP = DATA / "nccl_trace_rank_0"
JSON_DUMP = DATA / "direct_dump_nccl_trace_rank_0.json"


def real_trace() -> dict:
    """The real NCCL dump as torch wrote it (trusted here: our own fixture, loaded by plain pickle)."""
    return pickle.loads(PIPE_DUMP.read_bytes())


def world(ranks: int) -> list:
    """The real trace as each of `ranks` ranks of one group would have written it."""
    traces = []
    for rank in range(ranks):
        trace = real_trace()
        trace["pg_config"]["0"]["ranks"] = str(list(range(ranks)))
        traces.append(trace)
    return traces


def write_set(directory: Path, traces: dict, name: str = "nccl_trace_rank_") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for rank, trace in traces.items():
        (directory / ("%s%d" % (name, rank))).write_bytes(pickle.dumps(trace, protocol=2))
    return directory


def by_seq(trace: dict, seq: int) -> dict:
    return next(entry for entry in trace["entries"] if entry["collective_seq_id"] == seq)


def test_the_real_nccl_dump_reads_as_torch_wrote_it():
    analysis = analyse_dir(str(DATA), prefix="nccl_trace_rank_")
    dump = next(d for d in analysis.dumps if d.path.endswith("/nccl_trace_rank_0"))
    assert dump.unreadable is None and dump.rank == 0 and dump.host is None
    assert dump.version == "2.10" and dump.comm_lib_version == "2.28.9"
    ops = [(e.collective_seq_id, e.op, e.input_dtypes) for e in dump.entries]
    assert ops[:3] == [(1, "broadcast", ("Float",)), (2, "all_reduce", ("BFloat16",)), (3, "all_reduce", ("Float",))]
    assert dump.entries[1].input_sizes == ((1024, 256),) and dump.entries[0].backend == "nccl"
    assert {e.state for e in dump.entries} == {"completed"}
    assert dump.entries[0].frames[2].function == "main" and dump.entries[0].frames[2].file.endswith(
        "make_nccl_dumps.py"
    )
    assert dump.status[0].last_enqueued == 10 and dump.groups[0].ranks == (0,)
    assert analysis.mismatch is None


def test_the_dump_the_collector_brought_back_from_a_live_nccl_rank(tmp_path):
    # tests/data/flight_recorder/check_pipe_collect.py on the H200: asked through the FIFO by collect_dumps.
    shutil.copy(DATA / "collected_h200_nccl_trace_rank_0", tmp_path / "nccl_trace_rank_0")
    (dump,) = analyse_dir(str(tmp_path)).dumps
    assert dump.unreadable is None and dump.comm_lib_version == "2.28.9"
    assert [(e.collective_seq_id, e.op, e.state) for e in dump.entries] == [
        (1, "all_reduce", "completed"),
        (2, "all_reduce", "completed"),
        (3, "all_reduce", "completed"),
        (4, "all_reduce", "completed"),
        (5, "broadcast", "completed"),
    ]
    assert dump.entries[0].input_sizes == ((256, 256),) and dump.entries[0].input_dtypes == ("BFloat16",)


def test_the_json_dump_agrees_with_the_pickle(tmp_path):
    shutil.copy(JSON_DUMP, tmp_path / "trace_rank_0.json")
    shutil.copy(PIPE_DUMP, tmp_path / "trace_rank_1")
    analysis = analyse_dir(str(tmp_path))
    json_dump, pickle_dump = analysis.dumps
    assert json_dump.unreadable is None and json_dump.rank == 0 and pickle_dump.rank == 1
    assert [(e.op, e.input_sizes, e.input_dtypes) for e in json_dump.entries] == [
        (e.op, e.input_sizes, e.input_dtypes) for e in pickle_dump.entries
    ]
    assert json_dump.status[0].last_completed == 10  # written as text "10" in the JSON form


def test_a_rank_that_never_joined_is_named_with_its_last_line(tmp_path):
    traces = dict(enumerate(world(4)))
    # Rank 2 stopped after collective 6: collectives 7-10 never enqueued there.
    traces[2]["entries"] = [e for e in traces[2]["entries"] if e["collective_seq_id"] <= 6]
    traces[2]["pg_status"]["0"]["last_enqueued_collective"] = 6
    for rank in (0, 1, 3):
        by_seq(traces[rank], 7)["state"] = "started"
    analysis = analyse_dir(str(write_set(tmp_path, traces)))
    found = analysis.mismatch
    assert found.kind == KIND_NOT_JOINED and found.seq == 7 and found.op == "all_reduce"
    assert found.culprit_ranks == (2,) and found.agreeing == (0, 1, 3)
    assert found.culprits[0].last.collective_seq_id == 6
    text = summary_text(analysis)
    assert text.startswith(
        "rank 2 never joined collective 7 (all_reduce [1] Float) of group 0 (default_pg); ranks 0-1, 3 wait in it"
    )
    assert "rank 2 last enqueued collective 6 (all_reduce) at train_step (" in text and "make_nccl_dumps.py:" in text


@pytest.mark.parametrize(
    "change, kind, detail",
    [
        (lambda e: e.update(input_sizes=[[1024, 128]], output_sizes=[[1024, 128]]), KIND_SIZE, "[1024, 128]"),
        (lambda e: e.update(profiling_name="nccl:broadcast"), KIND_OP, "called broadcast"),
        (lambda e: e.update(input_dtypes=["Float"], output_dtypes=["Float"]), KIND_DTYPE, "[1024, 256] Float"),
    ],
)
def test_a_rank_that_joined_differently_is_named(tmp_path, change, kind, detail):
    traces = dict(enumerate(world(3)))
    change(by_seq(traces[1], 4))  # collective 4 is the second bf16 all_reduce of the gradients
    analysis = analyse_dir(str(write_set(tmp_path, traces)))
    found = analysis.mismatch
    assert (found.kind, found.seq, found.culprit_ranks, found.agreeing) == (kind, 4, (1,), (0, 2))
    assert found.op == "all_reduce" and found.sizes == ((1024, 256),) and found.dtypes == ("BFloat16",)
    text = summary_text(analysis)
    assert text.startswith("rank 1 joined collective 4 (all_reduce [1024, 256] BFloat16) of group 0")
    assert detail in text


def test_missing_ranks_and_host_names_are_tolerated(tmp_path):
    traces = world(4)
    (tmp_path / "gpu07_nccl_trace_rank_0").write_bytes(pickle.dumps(traces[0], protocol=2))
    (tmp_path / "gpu07_nccl_trace_rank_1").write_bytes(pickle.dumps(traces[1], protocol=2))
    (tmp_path / "gpu08_nccl_trace_rank_3").write_bytes(pickle.dumps(traces[3], protocol=2))
    files, _ = dump_files(str(tmp_path))
    assert [(os.path.basename(p), r, h) for p, r, h in files] == [
        ("gpu07_nccl_trace_rank_0", 0, "gpu07"),
        ("gpu07_nccl_trace_rank_1", 1, "gpu07"),
        ("gpu08_nccl_trace_rank_3", 3, "gpu08"),
    ]
    analysis = analyse_dir(str(tmp_path))
    assert analysis.missing_ranks == (2,) and analysis.mismatch is None
    document = analysis_json(analysis)
    assert document["missing_ranks"] == [2] and [d["host"] for d in document["dumps"]] == ["gpu07", "gpu07", "gpu08"]


def test_one_host_before_torchs_own_file_name(tmp_path):
    for rank, trace in enumerate(world(2)):
        (tmp_path / ("gpu07_nccl_trace_rank_%d" % rank)).write_bytes(pickle.dumps(trace, protocol=2))
    files, _ = dump_files(str(tmp_path))
    assert [(r, h) for _, r, h in files] == [(0, "gpu07"), (1, "gpu07")]


def test_an_unfinished_collective_that_everyone_joined_is_stuck(tmp_path):
    traces = dict(enumerate(world(2)))
    for rank in (0, 1):
        by_seq(traces[rank], 10)["state"] = "started"
    found = analyse_dir(str(write_set(tmp_path, traces))).mismatch
    assert found.kind == KIND_STUCK and found.seq == 10 and found.culprit_ranks == (0, 1)


class Bomb:
    def __reduce__(self):
        return (os.system, ("touch /tmp/opsconsole-fr-pwned",))


HOSTILE = {
    "code": pickle.dumps({"version": "2.10", "entries": [Bomb()]}, protocol=2),
    "wrong_top": pickle.dumps(["entries"], protocol=2),
    "entries_not_list": pickle.dumps({"entries": {"a": 1}}, protocol=2),
    "random": os.urandom(4096),
    "truncated": PIPE_DUMP.read_bytes()[:900],
    # A tuple doubled through the memo 60 times, then used as a dict key: 2**60 elements to hash.
    "memo_bomb": (
        b"\x80\x02}K\x01q\x00"
        + b"0"[:0]
        + b"".join(b"h%sh%s\x86q%s0" % (bytes([i]), bytes([i]), bytes([i + 1])) for i in range(60))
        + b"0h<K\x00s."
    ),
    "deep": b"\x80\x02" + b"]" * 100_000 + b"a" * 99_999 + b".",
    "empty": b"",
}


def test_hostile_dumps_end_as_unreadable_and_the_rest_is_matched(tmp_path):
    traces = dict(enumerate(world(2)))
    traces[1]["entries"] = [e for e in traces[1]["entries"] if e["collective_seq_id"] <= 8]
    traces[1]["pg_status"]["0"]["last_enqueued_collective"] = 8
    write_set(tmp_path, traces)
    for number, (name, data) in enumerate(HOSTILE.items(), 10):
        (tmp_path / ("nccl_trace_rank_%d" % number)).write_bytes(data)
    bad_entry = real_trace()
    bad_entry["entries"][3]["input_sizes"] = "not sizes"
    (tmp_path / "nccl_trace_rank_30").write_bytes(pickle.dumps(bad_entry, protocol=2))
    # The product's dump limits, but a 1 s optimistic first try (15 s in the product): the memo bomb
    # ends its first try at that CPU limit, then the careful read's opcode walk refuses it, as it would
    # after 15 s. The limits' mechanism is what is tested, not the product's 15 s.
    limits = replace(fr.dump_workers().limits, first_try_cpu_seconds=1)
    workers = MetadataWorkers(size=2, limits=limits)
    started = time.monotonic()
    try:
        analysis = analyse_dir(str(tmp_path), workers=workers)
    finally:
        workers.close()
    assert time.monotonic() - started < 120  # bounded, not a timing claim: the worker's limits end each bad file
    unreadable = {d.rank: d.unreadable for d in analysis.dumps if d.unreadable}
    assert set(unreadable) == set(range(10, 10 + len(HOSTILE))), unreadable
    names = dict(zip(range(10, 10 + len(HOSTILE)), HOSTILE))
    assert "not a dict" in unreadable[[r for r, n in names.items() if n == "wrong_top"][0]]
    assert "no list of entries" in unreadable[[r for r, n in names.items() if n == "entries_not_list"][0]]
    assert unreadable[[r for r, n in names.items() if n == "empty"][0]] == "empty file"
    assert not os.path.exists("/tmp/opsconsole-fr-pwned")
    assert (
        "names posix.system, which no flight-recorder dump holds"
        in unreadable[[r for r, n in names.items() if n == "code"][0]]
    )
    memo_bomb = unreadable[[r for r, n in names.items() if n == "memo_bomb"][0]]
    assert "steps to hash or compare" in memo_bomb, memo_bomb  # the careful read's walk, after the first try
    partly = next(d for d in analysis.dumps if d.rank == 30)
    assert partly.unreadable is None and partly.dropped == 1 and len(partly.entries) == 9
    found = analysis.mismatch
    assert found.kind == KIND_NOT_JOINED and found.seq == 9 and found.culprit_ranks == (1,)


def test_dump_locations_from_a_ranks_environment():
    assert dump_locations({"RANK": "3"}, 3) is None
    assert dump_locations({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, 3) is None
    old = dump_locations({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/tmp/p_"}, 3)
    assert (old.dump_file, old.pipe_file, old.buffer_size) == ("/tmp/nccl_trace_rank_3", "/tmp/p_3.pipe", 2000)
    new = dump_locations(
        {
            "TORCH_FR_BUFFER_SIZE": "20",
            "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/old/",
        },
        12,
    )
    assert (new.dump_file, new.pipe_file) == ("/scratch/fr_12", None)


def test_fr_command_text_and_json(tmp_path):
    traces = dict(enumerate(world(2)))
    by_seq(traces[1], 5)["profiling_name"] = "nccl:all_gather"
    write_set(tmp_path, traces)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "fr", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "rank 1 joined collective 5 (all_reduce [1] Float) of group 0 (default_pg) with another op"
    )
    assert "rank 1 stack (innermost first):" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "fr", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    document = json.loads(done.stdout)
    assert document["mismatch"]["kind"] == "op" and document["mismatch"]["culprit_ranks"] == [1]
    assert document["mismatch"]["culprits"][0]["entry"]["op"] == "all_gather"
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "fr", str(empty)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 2 and "no readable flight-recorder dump" in done.stderr


# --- a real gloo run: torch 2.13 records gloo collectives too -----------------------------------

GLOO_JOB = r"""
import datetime, os, sys, time
import torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d

rank = int(os.environ["RANK"])
dump_file = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank)
done_file = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + "done"

def dump():
    with open(dump_file + ".tmp", "wb") as out:
        out.write(c10d._dump_fr_trace())
    os.rename(dump_file + ".tmp", dump_file)

def train_step(step):
    grads = torch.ones(64, 8)
    dist.all_reduce(grads)
    if step == 1:
        dist.broadcast(torch.zeros(4, dtype=torch.int64), src=0)

def evaluate():
    dist.all_reduce(torch.ones(3))

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
for step in range(3):
    train_step(step)
if rank == 1:
    dump()  # rank 1 skips the evaluation's collective: it goes on to save, and waits there
    for _ in range(600):
        if os.path.exists(done_file):
            break
        time.sleep(0.05)
    os._exit(0)
work = dist.all_reduce(torch.ones(3), async_op=True)  # collective 5: rank 0 waits in it
dump()
open(done_file, "w").close()
os._exit(0)
"""


@pytest.fixture(scope="module")
def gloo_dumps(tmp_path_factory):
    """A real 2-rank torchrun job on gloo where rank 1 skips collective 5; its dumps' directory."""
    base = tmp_path_factory.mktemp("fr_gloo")
    script = base / "job.py"
    script.write_text(GLOO_JOB)
    dumps = base / "dumps"
    dumps.mkdir()
    env = torchrun_env({"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "gloo_trace_rank_")})
    command = torchrun_command(script)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        out, _ = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    assert process.returncode == 0, out.decode(errors="replace")[-2000:]
    (dumps / "gloo_trace_rank_done").unlink()
    return dumps, env


def test_a_real_gloo_run_where_rank_1_skips_a_collective(gloo_dumps):
    dumps, _ = gloo_dumps
    analysis = analyse_dir(str(dumps))
    assert [d.rank for d in analysis.dumps] == [0, 1] and all(d.unreadable is None for d in analysis.dumps)
    assert analysis.dumps[0].entries[0].backend == "gloo"
    found = analysis.mismatch
    assert found.kind == KIND_NOT_JOINED and found.seq == 5 and found.op == "all_reduce"
    assert found.culprit_ranks == (1,) and found.agreeing == (0,)
    text = summary_text(analysis)
    assert text.startswith(
        "rank 1 never joined collective 5 (all_reduce [3] Float) of group 0 (default_pg); rank 0 waits in it"
    )
    assert "rank 1 last enqueued collective 4 (all_reduce) at train_step (" in text and "job.py:" in text


async def test_collect_dumps_locally_and_over_ssh(gloo_dumps, tmp_path, sshd_factory):
    from opsconsole.config import NodeConfig, SshConfig
    from opsconsole.nodes.ssh import SshLink

    dumps, env = gloo_dumps
    locations = [dump_locations(env, rank) for rank in (0, 1, 2)]  # rank 2 left no dump
    local = tmp_path / "local"
    local.mkdir()
    collected = await fr.collect_dumps(None, locations, str(local), host="gpu01", trigger=True, wait_s=0.5)
    assert sorted(os.path.relpath(p, local) for p in collected.saved) == [
        "gpu01/gloo_trace_rank_0",
        "gpu01/gloo_trace_rank_1",
    ]
    assert [rank for rank, _ in collected.problems] == [2]
    server = sshd_factory.start()
    link = SshLink(
        NodeConfig(name="gpu02", host=server.address, port=server.port),
        SshConfig(connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2),
        0.3,
    )
    remote = tmp_path / "remote"
    remote.mkdir()
    try:
        collected = await fr.collect_dumps(link, locations[:2], str(remote), host="gpu02", wait_s=0.5)
        small = await fr.collect_dumps(link, locations[:1], str(tmp_path), host="gpu03", wait_s=0.1, max_bytes=100)
    finally:
        await link.close()
    assert len(collected.saved) == 2 and collected.problems == ()
    for path in collected.saved:
        assert Path(path).read_bytes() == (dumps / os.path.basename(path)).read_bytes()
    found = analyse_dir(str(remote)).mismatch
    assert found.culprit_ranks == (1,) and found.culprits[0].host == "gpu02"
    assert small.saved == () and "over the collection limit" in small.problems[0][1]


async def test_a_pipe_with_no_reader_is_said_so(tmp_path):
    pipe = tmp_path / "fr_pipe_0.pipe"
    os.mkfifo(pipe)
    location = dump_locations(
        {
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "10",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "t_"),
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(tmp_path / "fr_pipe_"),
        },
        0,
    )
    collected = await fr.collect_dumps(None, [location], str(tmp_path), host="n", wait_s=0.2)
    assert collected.saved == ()
    whys = [why for _, why in collected.problems]
    assert any("no reader on the pipe" in why for why in whys) and any("No such file" in why for why in whys)


def test_collect_options_without_collect_are_refused_not_ignored(capsys):
    from opsconsole.cli import main

    fixtures = os.path.join(ROOT, "tests", "data", "flight_recorder")
    for option in (["--no-ask"], ["--wait", "3"], ["--node", "gpu07"]):
        assert main(["fr", fixtures] + option) == 2
        assert capsys.readouterr().err.strip() == (
            "opsconsole: fr: --node, --no-ask and --wait go with --collect, e.g. fr --collect --node gpu07"
        )


async def test_a_node_with_no_training_ranks_says_so(tmp_path):
    """`fr --collect` where no rank runs: the reason and where to look, not only an empty directory."""
    from opsconsole.probe.rank_stacks import find_ranks

    if find_ranks():
        pytest.skip("training ranks of another test run on this machine: the node is not rank-free")
    collected = await fr.collect_dumps(None, [], str(tmp_path), host="n", trigger=False, wait_s=0, discover=True)
    if collected.saved or any(rank >= 0 for rank, _ in collected.problems):
        pytest.skip("a training rank started on this machine meanwhile")
    assert collected.saved == () and collected.problems == ((-1, fr.NO_RANKS_FOUND),)
    assert "no training ranks found" in fr.NO_RANKS_FOUND and "--nodes" in fr.NO_RANKS_FOUND


async def test_collect_by_rank_pids_reads_each_ranks_own_environment(tmp_path, sshd_factory):
    from opsconsole.config import NodeConfig, SshConfig
    from opsconsole.nodes.ssh import SshLink

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    shutil.copy(PIPE_DUMP, dumps / "trace_rank_3")
    env = {
        **os.environ,
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(dumps / "trace_rank_"),
    }
    plain = {key: value for key, value in os.environ.items() if not key.startswith("TORCH_")}
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=e) for e in (env, plain)]
    try:
        here = tmp_path / "here"
        collected = await fr.collect_dumps(
            None, [], str(here), host="gpu01", wait_s=0.2, rank_pids=[(ranks[0].pid, 3), (ranks[1].pid, 4)]
        )
        assert [os.path.relpath(p, here) for p in collected.saved] == ["gpu01/trace_rank_3"]
        assert [(rank, "keeps no flight recorder" in why) for rank, why in collected.problems] == [(4, True)]
        server = sshd_factory.start()
        link = SshLink(
            NodeConfig(name="gpu02", host=server.address, port=server.port),
            SshConfig(connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2),
            0.3,
        )
        try:
            remote = await fr.collect_dumps(
                link, [], str(tmp_path / "remote"), host="gpu02", wait_s=0.2, rank_pids=[(ranks[0].pid, 3)]
            )
        finally:
            await link.close()
        assert remote.problems == () and Path(remote.saved[0]).read_bytes() == PIPE_DUMP.read_bytes()
        assert analyse_dir(str(tmp_path / "remote")).dumps[0].host == "gpu02"
    finally:
        for process in ranks:
            process.kill()
            process.wait()


async def test_the_node_finds_its_ranks_itself(tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    shutil.copy(PIPE_DUMP, dumps / "trace_rank_5")
    plain = {key: value for key, value in os.environ.items() if not key.startswith("TORCH_") and "RANK" not in key}
    env = dict(
        plain,
        RANK="5",
        LOCAL_RANK="1",
        WORLD_SIZE="8",
        TORCH_FR_BUFFER_SIZE="2000",
        TORCH_FR_DUMP_TEMP_FILE=str(dumps / "trace_rank_"),
    )
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        collected = await fr.collect_dumps(None, [], str(tmp_path / "got"), host="gpu05", wait_s=0.2, discover=True)
    finally:
        rank.kill()
        rank.wait()
    # Other ranks of this machine (another test's torchrun) may be found too: ours is among what came back.
    assert str(tmp_path / "got" / "gpu05" / "trace_rank_5") in collected.saved


HUNG_GLOO_JOB = r"""
import datetime, os, time
import torch, torch.distributed as dist
import torch._C._distributed_c10d as c10d

rank = int(os.environ["RANK"])

def dump():  # gloo has no dump FIFO: the job writes its own, as torch's NCCL watchdog would on a timeout
    path = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank)
    with open(path + ".tmp", "wb") as out:
        out.write(c10d._dump_fr_trace())
    os.rename(path + ".tmp", path)

def train_step():
    dist.all_reduce(torch.ones(64, 8))

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
for step in range(3):
    train_step()
if rank == 0:
    work = dist.all_reduce(torch.ones(3), async_op=True)  # rank 0 waits in collective 4; rank 1 never calls it
dump()
time.sleep(300)
"""


@pytest.fixture
def hung_gloo_job(tmp_path):
    """A live 2-rank torchrun job on gloo, hung: rank 0 in collective 4, rank 1 elsewhere; both dumped."""
    script = tmp_path / "job.py"
    script.write_text(HUNG_GLOO_JOB)
    dumps = tmp_path / "on_node"
    dumps.mkdir()
    env = torchrun_env({"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": str(dumps / "gloo_trace_rank_")})
    job = subprocess.Popen(
        torchrun_command(script),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not all((dumps / ("gloo_trace_rank_%d" % rank)).exists() for rank in (0, 1)):
            assert job.poll() is None and time.monotonic() < deadline, "the job ended or took too long"
            time.sleep(0.2)
        yield dumps
    finally:
        # torchrun starts each rank in a session of its own: killing torchrun's session alone left both
        # ranks running (hung, for up to 300 s) after the test. Its children are the ranks we started.
        ranks = psutil.Process(job.pid).children(recursive=True) if job.poll() is None else []
        os.killpg(job.pid, 9)  # torchrun, in the session the test started
        for rank in ranks:
            try:
                rank.kill()
            except psutil.NoSuchProcess:
                pass
        job.wait()
        psutil.wait_procs(ranks, timeout=10)


def test_fr_collect_over_ssh_from_a_live_hung_job(hung_gloo_job, sshd_factory, tmp_path):
    server = sshd_factory.start()
    config = tmp_path / "ssh.toml"
    config.write_text(
        '[[nodes]]\nname = "n1"\nhost = "%s"\nport = %d\npython = "%s"\n'
        % (server.address, server.port, sys.executable)
    )
    into = tmp_path / "collected"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "opsconsole",
            "fr",
            "--collect",
            "--config",
            str(config),
            "--wait",
            "1",
            str(into),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    assert "dumps in %s" % into in done.stderr
    document = json.loads(done.stdout)
    ours = [d for d in document["dumps"] if "gloo_trace_rank_" in d["path"]]
    assert sorted((d["rank"], d["host"]) for d in ours) == [(0, "n1"), (1, "n1")]
    mismatch = document["mismatch"]
    assert (mismatch["kind"], mismatch["seq"], mismatch["culprit_ranks"]) == ("not_joined", 4, [1])
    assert mismatch["culprits"][0]["last"]["frames"][2]["function"] == "train_step"


async def test_the_console_key_shows_the_rank_that_never_joined(hung_gloo_job, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the screen's folder of dumps, inside this test's
    from opsconsole.config import ActionsConfig, Config, ConsoleConfig, NodeConfig
    from opsconsole.nodes.fleet import Fleet
    from opsconsole.tui.app import OpsConsole
    from opsconsole.tui.flight_recorder import FlightRecorderScreen

    config = Config(
        console=ConsoleConfig(interval=0.5),
        nodes=(NodeConfig(name="local", local=True),),
        actions=ActionsConfig(audit_log=str(tmp_path / "audit.log")),
    )
    app = OpsConsole(config, Fleet(config))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.pause()
        await pilot.press("6")  # the Logs pane, where a hang is found
        await pilot.press("T")
        deadline = time.monotonic() + 120
        while not (isinstance(app.screen, FlightRecorderScreen) and app.screen.analysis is not None):
            assert time.monotonic() < deadline, "no flight-recorder answer"
            await pilot.pause(0.1)
        screen = app.screen
        ours = [d for d in screen.analysis.dumps if os.path.basename(d.path).startswith("gloo_trace_rank_")]
        assert sorted((d.rank, d.host) for d in ours) == [(0, "local"), (1, "local")]
        assert screen.analysis.mismatch.culprit_ranks == (1,) and screen.analysis.mismatch.seq == 4
        verdict = str(screen.query_one("#fr-verdict").render())
        assert verdict.startswith("rank 1 never joined collective 4 (all_reduce [3] Float) of group 0 (default_pg)")
        assert "at train_step (" in verdict
    records = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    ours = [record for record in records if record["action"] == "flight_recorder"]
    assert [record["outcome"] for record in ours] == ["attempt", "ok"]  # audited before anything ran, then the result
    assert ours[0]["command"][:3] == ["opsconsole", "fr", "--collect"]
    assert ours[0]["command"][3].startswith(str(tmp_path))  # the dumps came into the console's temp folder
