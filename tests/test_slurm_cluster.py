"""Slurm against a real cluster on localhost (munged, slurmctld and two slurmd from Debian's slurm-wlm,
all in a temp dir, ports on 127.0.0.1), plus the parsers over output captured from that cluster.

The cluster starts in about 2 s here, so the job, user, following and drain paths run against
real `squeue --json`, `scontrol` and `sbatch`. Slurm 22.05's `squeue --json` ignores --jobs and
--user (it prints every job): the parser filters, and the tests check it does.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsconsole.nodes.slurm import (
    SlurmFollower,
    SlurmUnavailable,
    describe_run,
    format_elapsed,
    node_state,
    parse_elapsed,
    parse_squeue_json,
    parse_squeue_text,
    query_job,
    query_user_jobs,
)
from tests.waiting import wait_for_sync

ROOT = Path(__file__).resolve().parents[1]

# Captured from the cluster below (Slurm 22.05.8): `squeue --json` (fields trimmed to those read)
# while job 1 ran on node[1-2] and jobs 2 and 3 waited; and the text fallback's format.
CAPTURED_SQUEUE_JSON = json.dumps(
    {
        "meta": {
            "plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
            "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"},
        },
        "errors": [],
        "jobs": [
            {
                "job_id": 1,
                "name": "train-llm",
                "job_state": "RUNNING",
                "nodes": "node[1-2]",
                "start_time": 1796236687,
                "user_name": "root",
                "state_reason": "None",
                "array_job_id": 0,
                "array_task_id": None,
                "het_job_id": 0,
                "het_job_offset": 0,
                "partition": "debug",
                "node_count": 2,
            },
            {
                "job_id": 2,
                "name": "small",
                "job_state": "PENDING",
                "nodes": "",
                "start_time": 0,
                "user_name": "root",
                "state_reason": "Resources",
                "array_job_id": 0,
                "array_task_id": None,
                "het_job_id": 0,
                "het_job_offset": 0,
                "partition": "debug",
                "node_count": 1,
            },
            {
                "job_id": 3,
                "name": "queued",
                "job_state": "PENDING",
                "nodes": "",
                "start_time": 0,
                "user_name": "root",
                "state_reason": "Priority",
                "array_job_id": 0,
                "array_task_id": None,
                "het_job_id": 0,
                "het_job_offset": 0,
                "partition": "debug",
                "node_count": 2,
            },
        ],
    }
)
CAPTURED_SQUEUE_TEXT = "3|queued|PENDING|0:00||root|Resources\n2|small|RUNNING|2:13|node1|root|None\n"
CAPTURED_SHOW_NODE = (
    "NodeName=node2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=0.99 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=vm Port=16819 "
    "Version=22.05.8 RealMemory=500 AllocMem=0 FreeMem=22939 Sockets=1 Boards=1 State=IDLE+DRAIN "
    "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=debug "
    "CfgTRES=cpu=1,mem=500M,billing=1 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 "
    "ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s Reason=xid 79 on gpu 3 [root@2026-12-02T18:45:21]"
)


# --- parsers over captured output (run everywhere) -----------------------------------------------


def test_squeue_json_is_filtered_here_because_22_05_ignores_the_filters():
    now = 1796236687 + 125
    job = parse_squeue_json(CAPTURED_SQUEUE_JSON, now, job_id="1")
    assert [(j.job_id, j.name, j.state, j.nodes, j.elapsed_s, j.reason) for j in job] == [
        ("1", "train-llm", "RUNNING", ("node1", "node2"), 125.0, "")
    ]
    pending = parse_squeue_json(CAPTURED_SQUEUE_JSON, now, job_id="2")[0]
    assert (pending.state, pending.nodes, pending.elapsed_s, pending.reason) == ("PENDING", (), None, "Resources")
    running = parse_squeue_json(CAPTURED_SQUEUE_JSON, now, user="root")
    assert [j.job_id for j in running] == ["1"]  # a user's running jobs only
    assert parse_squeue_json(CAPTURED_SQUEUE_JSON, now, user="alice") == []
    assert describe_run(job) == "job 1 train-llm RUNNING 2:05 (2 nodes)"
    assert describe_run([pending]) == "job 2 small PENDING (Resources)"
    assert describe_run(running, user="root") == "user root: job 1 train-llm RUNNING 2:05 (2 nodes)"


def test_the_header_label_moves_a_running_jobs_elapsed_time_on_between_queries():
    """Slurm is asked every 30 s; the header showed 'RUNNING 0:07' for all of them."""
    from opsconsole.config import DEFAULT_CONFIG
    from opsconsole.nodes.fleet import Fleet
    from opsconsole.nodes.slurm import SlurmRun

    running, pending = parse_squeue_text(CAPTURED_SQUEUE_TEXT)[1], parse_squeue_text(CAPTURED_SQUEUE_TEXT)[0]
    run = SlurmRun(jobs=(running,), label=describe_run([running]), asked_at=1000.0)
    assert run.label_at(1000.0) == run.label and "RUNNING 2:13" in run.label
    assert "RUNNING 2:25" in run.label_at(1012.0)  # 133 s at the query, 12 s since
    waiting = SlurmRun(jobs=(pending,), label=describe_run([pending]), asked_at=1000.0)
    assert waiting.label_at(1012.0) == waiting.label  # a pending job's time does not run
    failed = SlurmRun(jobs=(running,), label=run.label, error="scontrol: no answer", asked_at=1000.0)
    assert failed.label_at(1012.0) == run.label  # Slurm not answering: the last query's words
    several = SlurmRun(jobs=(running,), label=describe_run([running], "alice"), asked_at=1000.0, user="alice")
    assert several.label_at(1012.0).startswith("user alice: ") and "2:25" in several.label_at(1012.0)

    async def header_job() -> str:
        fleet = Fleet(DEFAULT_CONFIG)
        fleet.apply_slurm_run(run)  # the local node is not in the job: its removal is a task of this loop
        await asyncio.sleep(0.05)
        try:
            return fleet.totals(1012.0).job
        finally:
            await fleet.stop()

    assert "RUNNING 2:25" in asyncio.run(header_job())  # what the header shows


def test_squeue_text_fallback_and_elapsed_formats():
    jobs = parse_squeue_text(CAPTURED_SQUEUE_TEXT)
    assert [(j.job_id, j.state, j.nodes, j.elapsed_s) for j in jobs] == [
        ("3", "PENDING", (), 0.0),
        ("2", "RUNNING", ("node1",), 133.0),
    ]
    assert parse_elapsed("1-02:03:04") == 93784.0 and parse_elapsed("02:03:04") == 7384.0
    assert parse_elapsed("INVALID") is None and parse_elapsed("") is None
    assert format_elapsed(93784) == "1-02:03:04" and format_elapsed(7384) == "2:03:04" and format_elapsed(5) == "0:05"
    with pytest.raises(SlurmUnavailable, match="cannot read"):
        parse_squeue_text("garbage without separators")
    with pytest.raises(SlurmUnavailable, match="not JSON"):
        parse_squeue_json("squeue: error: something", 0.0)


# --- a real cluster ---------------------------------------------------------------------------------

NEEDED = ("munged", "slurmctld", "slurmd", "squeue", "scontrol", "sbatch", "scancel")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def slurm(*argv: str) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = [name for name in NEEDED if shutil.which(name) is None and not os.path.exists("/usr/sbin/" + name)]
    if missing:
        pytest.skip("Slurm not installed (apt-get install slurm-wlm munge): missing " + ", ".join(missing))
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root")
    tmp = tmp_path_factory.mktemp("slurm")
    key = tmp / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(stat.S_IRUSR | stat.S_IWUSR)
    host = socket.gethostname()
    ports = [free_port() for _ in range(3)]
    conf = tmp / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=opsconsole-test",
                "SlurmctldHost=%s(127.0.0.1)" % host,
                "SlurmctldPort=%d" % ports[0],
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "AuthInfo=socket=%s" % (tmp / "munge.sock"),
                "StateSaveLocation=%s" % (tmp / "state"),
                "SlurmdSpoolDir=%s/spool/%%n" % tmp,
                "SlurmctldPidFile=%s/slurmctld.pid" % tmp,
                "SlurmdPidFile=%s/slurmd-%%n.pid" % tmp,
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "ReturnToService=2",
                "SchedulerType=sched/backfill",
                "SelectType=select/cons_tres",
                "SlurmctldLogFile=%s/slurmctld.log" % tmp,
                "SlurmdLogFile=%s/slurmd-%%n.log" % tmp,
                "JobCompType=jobcomp/none",
                "AccountingStorageType=accounting_storage/none",
                "MpiDefault=none",
                "NodeName=node1 NodeHostname=%s NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 Port=%d" % (host, ports[1]),
                "NodeName=node2 NodeHostname=%s NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 Port=%d" % (host, ports[2]),
                "PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    (tmp / "state").mkdir()
    (tmp / "spool").mkdir()
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    procs = []
    log = open(tmp / "daemons.log", "w")

    def start(*argv):
        procs.append(subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=tmp))

    try:
        start(
            "munged",
            "-F",
            "--force",
            "-S",
            str(tmp / "munge.sock"),
            "--key-file",
            str(key),
            "--pid-file",
            str(tmp / "munged.pid"),
            "--log-file",
            str(tmp / "munged.log"),
            "--seed-file",
            str(tmp / "munge.seed"),
        )
        wait_for_sync(lambda: (tmp / "munge.sock").exists(), what="munged")
        start("slurmctld", "-D", "-c", "-f", str(conf))
        start("slurmd", "-D", "-N", "node1", "-f", str(conf))
        start("slurmd", "-D", "-N", "node2", "-f", str(conf))

        def idle():
            result = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=10)
            return result.returncode == 0 and result.stdout.split() == ["node1", "idle", "node2", "idle"]

        wait_for_sync(idle, timeout=60, what="both slurmd idle")
        yield tmp
    finally:
        subprocess.run(["scancel", "--full", "--partition", "debug"], capture_output=True, timeout=30)
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous


def submit(nodes: int, name: str) -> str:
    out = slurm("sbatch", "--parsable", "-N", str(nodes), "-J", name, "-o", "/dev/null", "--wrap", "sleep 120")
    return out.strip().split(";")[0]


def cancel(*job_ids: str) -> None:
    slurm("scancel", *job_ids)
    wait_for_sync(
        lambda: all(query_job(j).state not in ("RUNNING", "PENDING", "COMPLETING") for j in job_ids), what="jobs to end"
    )


def test_a_real_job_its_nodes_and_a_pending_one(cluster):
    running = submit(2, "train-llm")
    waiting = submit(2, "queued")
    try:
        job = wait_for_sync(
            lambda: (lambda j: j if j.state == "RUNNING" else None)(query_job(running)), what="job to run"
        )
        assert (job.job_id, job.name, job.nodes, job.user) == (running, "train-llm", ("node1", "node2"), "root")
        assert job.elapsed_s is not None and job.elapsed_s >= 0
        pending = query_job(waiting)
        assert pending.state == "PENDING" and pending.nodes == () and pending.reason in ("Resources", "Priority")
        # --json ignores --user on 22.05: only the running job of the user comes back.
        assert [j.job_id for j in query_user_jobs("root")] == [running]
        with pytest.raises(SlurmUnavailable, match="Invalid job id specified"):
            query_job("999999")
        with pytest.raises(SlurmUnavailable, match="Invalid user"):
            query_user_jobs("no-such-user-here")
    finally:
        cancel(running, waiting)


def test_the_text_fallback_runs_real_squeue_when_json_is_not_supported(cluster, tmp_path, monkeypatch):
    # An older squeue: refuses --json as 20.x did, otherwise the real one answers.
    real = shutil.which("squeue")
    fake = tmp_path / "bin" / "squeue"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\ncase " $* " in *" --json "*) echo "squeue: unrecognized option \'--json\'" >&2; '
        'exit 1;; esac\nexec %s "$@"\n' % real
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s%s%s" % (fake.parent, os.pathsep, os.environ["PATH"]))
    job_id = submit(1, "text-path")
    try:
        wait_for_sync(lambda: query_job(job_id).state == "RUNNING", what="job to run")
        jobs = query_user_jobs("root")
        assert [(j.job_id, j.name, j.state, len(j.nodes)) for j in jobs] == [(job_id, "text-path", "RUNNING", 1)]
        assert jobs[0].elapsed_s is not None
        # query_job falls back to `scontrol -o show job` text.
        job = query_job(job_id)
        assert (job.name, job.state, job.nodes) == ("text-path", "RUNNING", jobs[0].nodes)
    finally:
        cancel(job_id)


async def test_fleet_follows_nodes_joining_and_leaving_a_users_jobs(cluster):
    from opsconsole.config import DEFAULT_CONFIG, NodeConfig
    from opsconsole.nodes.fleet import Fleet
    from opsconsole.nodes.local import LocalLink

    first = submit(1, "first")
    second = None
    try:
        await asyncio.to_thread(
            lambda: wait_for_sync(lambda: query_job(first).state == "RUNNING", "first job", timeout=30.0)
        )
        follower = SlurmFollower(user="root", interval=0.2)
        initial = follower.poll()
        node_of_first = initial.jobs[0].nodes[0]
        links = [LocalLink(NodeConfig(name=node_of_first, local=True), interval=0.5)]
        fleet = Fleet(DEFAULT_CONFIG, links=links, sources=[])
        fleet.follow_slurm(
            follower, link_factory=lambda name: LocalLink(NodeConfig(name=name, local=True), interval=0.5)
        )
        await fleet.start(lambda state: None)
        try:
            assert list(fleet.states()) == [node_of_first]
            # The header's elapsed time moves on between queries (label_at): from the query's to now's.
            now = time.time()
            label = fleet.totals(now).job
            low, high = initial.jobs[0].elapsed_s, initial.jobs[0].elapsed_s + (now - initial.asked_at) + 1
            assert label in [
                "user root: job %s first RUNNING %s (1 node)" % (first, format_elapsed(seconds))
                for seconds in range(int(low), int(high) + 1)
            ], label
            second = await asyncio.to_thread(submit, 1, "second")

            async def until(predicate, what):
                deadline = time.monotonic() + 30
                while not predicate():
                    assert time.monotonic() < deadline, what
                    await asyncio.sleep(0.1)

            await until(lambda: set(fleet.states()) == {"node1", "node2"}, "the second job's node to join")
            other = ({"node1", "node2"} - {node_of_first}).pop()
            assert fleet.link(other).name == other  # the joiner got a link and runs
            await until(lambda: fleet.states()[other].state == "up", "the joiner to report")
            assert fleet.totals(time.time()).job == "user root: 2 jobs, 2 nodes"
            await asyncio.to_thread(slurm, "scancel", first)
            await until(lambda: list(fleet.states()) == [other], "the first job's node to leave")
            with pytest.raises(KeyError):
                fleet.link(node_of_first)
        finally:
            await fleet.stop()
    finally:
        await asyncio.to_thread(cancel, *[j for j in (first, second) if j])


def test_the_drain_action_drains_a_real_node_with_the_reason(cluster, tmp_path):
    """The registered drain action (actions/drain.py, the one path a key, the palette and a command take)."""
    import asyncio

    from opsconsole.actions.audit import AuditLog
    from opsconsole.actions.registry import TARGET_NODE, ActionContext, Refused, Target, plan_action, run_plan
    from opsconsole.actions.runner import ActionRunner
    from opsconsole.config import ActionsConfig, Config
    from opsconsole.model import STATE_UP, HostSample, NodeFrame, NodeState

    audit = str(tmp_path / "audit.log")

    def context(name: str) -> ActionContext:
        # Both slurmd of this cluster run on this machine: the frame's hostname is this host's.
        now = time.time()
        frame = NodeFrame(node=name, time=now, host=HostSample(hostname=socket.gethostname()))
        state = NodeState(name=name, state=STATE_UP, frame=frame, received_at=now)
        return ActionContext(
            config=Config(actions=ActionsConfig(audit_log=audit)),
            get_state=lambda: state,
            link=None,
            runner=ActionRunner(AuditLog(audit)),
        )

    async def drain(node: str, reason: str):
        ctx = context(node)
        plan = await plan_action("drain_node", Target(TARGET_NODE, node), ctx, {"reason": reason})
        return plan, await run_plan(plan, ctx)

    try:
        plan, report = asyncio.run(drain("node2", "xid 79 on gpu 3"))
        assert plan.argv[-1] == "Reason=xid 79 on gpu 3" and report.ok, report.lines
        fields = node_state("node2")
        assert "DRAIN" in fields["State"]
        assert fields["Reason"].startswith("xid 79 on gpu 3")
    finally:
        slurm("scontrol", "update", "NodeName=node2", "State=RESUME")
    # The console's own label for this machine (`local`) is no Slurm node: two run on its host, and
    # neither is called so. Refused when planned (before, scontrol was asked to drain `local`).
    for label in ("local", "node9"):
        with pytest.raises(Refused, match=r"2 Slurm nodes run on host .*\(node1, node2\): none is named " + label):
            asyncio.run(drain(label, "not this one"))
    for name in ("node1", "node2"):
        assert "DRAIN" not in node_state(name)["State"]


def test_captured_show_node_reason_keeps_its_spaces():
    from opsconsole.nodes import slurm as module

    def run(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 0, stdout=CAPTURED_SHOW_NODE + "\n", stderr="")

    fields = module.node_state("node2", run=run)
    assert fields["State"] == "IDLE+DRAIN"
    assert fields["Reason"] == "xid 79 on gpu 3 [root@2026-12-02T18:45:21]"


def test_cli_slurm_user_with_no_such_user_exits_2_with_one_line(cluster, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "opsconsole", "snapshot", "--slurm-user", "no-such-user-here"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env=dict(os.environ, HOME=str(tmp_path)),
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "opsconsole: --slurm-user no-such-user-here: squeue --user no-such-user-here: squeue: error: Invalid user: no-such-user-here"
    ]
