"""Whose job a GPU process is: /proc/PID/cgroup of real Slurm (v1, v2), Docker and Kubernetes nodes
(captured files, tests/fixtures/cgroup/SOURCES.md says where each came from), a real process with
SLURM_JOB_ID in its environment, and a real slurmd running a job under proctrack/cgroup.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsconsole.model import NodeFrame, ProcessSample, checked
from opsconsole.probe.jobs import JobInfo, parse_cgroup, parse_slurm_environ, read_job
from opsconsole.probe.procs import ProcessTable
from tests.waiting import wait_for_sync

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cgroup"

CAPTURED = [
    ("slurm_v1_interactive.txt", JobInfo(job_id="280678", job_step="interactive", job_uid=2101171)),
    ("slurm_v1_multi_slurmd_batch.txt", JobInfo(job_id="1", job_step="batch", job_uid=0)),
    ("slurm_v2_step0.txt", JobInfo(job_id="1392969", job_step="0")),
    ("docker_v1.txt", JobInfo(container="docker/2403ccfe427f")),
    ("k8s_crio_systemd_v1.txt", JobInfo(container="k8s/a5c1f8d5-1919-434d-add7-4afaafdaef89/5eed91756358")),
    ("k8s_docker_systemd_v1.txt", JobInfo(container="k8s/7d4424e6-bb13-42f4-a47a-45a4828bf54d/d0b3604b67ac")),
    ("k8s_containerd_colons_v1.txt", JobInfo(container="k8s/b96a7488-3ee1-4bdc-9c98-155cc887b417/6ef14b5a76df")),
    ("this_vm_no_job.txt", JobInfo()),
]


@pytest.mark.parametrize("name,expected", CAPTURED, ids=[name for name, _ in CAPTURED])
def test_captured_cgroup_files(name, expected):
    assert parse_cgroup((FIXTURES / name).read_text()) == expected


def test_every_fixture_is_in_the_table_and_named_in_sources():
    sources = (FIXTURES / "SOURCES.md").read_text()
    files = sorted(p.name for p in FIXTURES.glob("*.txt"))
    assert files == sorted(name for name, _ in CAPTURED)
    assert all(name in sources for name in files)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage without colons",
        "4:memory:/slurm/uid_1/job_/step_0",  # no job id
        "0::/system.slice/slurmstepd.scope/job_12abc/step_0",  # a job id that is no number
        "0::/system.slice/slurmstepd.scope/job_%s/step_0" % ("9" * 40),  # too long for a job id
        "0::/user.slice/job_77/step_0",  # job_ outside any slurm cgroup: not Slurm's
        "4:memory:/docker/not-hex-at-all",
        "4:memory:/docker/\x1b]52;c;aGk=\x07",
        "\x00" * 1000,
    ],
)
def test_hostile_or_foreign_cgroup_text_names_no_job(text):
    assert parse_cgroup(text) == JobInfo()


def test_slurm_step_names_are_short_words_and_a_bad_one_is_left_out():
    assert parse_cgroup("0::/system.slice/slurmstepd.scope/job_5/step_extern/user").job_step == "extern"
    info = parse_cgroup("0::/system.slice/slurmstepd.scope/job_5/step_%s/user" % ("x" * 100))
    assert (info.job_id, info.job_step) == ("5", None)


def test_environ_gives_the_job_and_rejects_bad_values():
    env = b"PATH=/bin\0SLURM_JOB_ID=812\0SLURM_STEP_ID=3\0SLURM_JOB_USER=alice\0"
    assert parse_slurm_environ(env) == JobInfo(job_id="812", job_step="3", job_user="alice")
    assert parse_slurm_environ(b"SLURM_JOBID=9_2\0") == JobInfo(job_id="9_2")  # older name, an array task
    assert parse_slurm_environ(b"SLURM_JOB_ID=$(reboot)\0") == JobInfo()
    bad_user = parse_slurm_environ(b"SLURM_JOB_ID=4\0SLURM_JOB_USER=\x1b[2J\0")
    assert (bad_user.job_id, bad_user.job_user) == ("4", None)


def test_reads_are_bounded_a_huge_cgroup_file_is_cut_not_read_whole(tmp_path):
    pid_dir = tmp_path / "77"
    pid_dir.mkdir()
    # 8 MiB of lines, with the Slurm line past the read limit: not found, and not read whole.
    (pid_dir / "cgroup").write_bytes(b"1:cpu:/\n" * (1 << 20) + b"4:memory:/slurm/uid_1/job_3/step_0\n")
    assert read_job(77, str(tmp_path) + "/") == JobInfo()
    (pid_dir / "cgroup").write_bytes(b"4:memory:/slurm/uid_1/job_3/step_0\n")
    assert read_job(77, str(tmp_path) + "/") == JobInfo(job_id="3", job_step="0", job_uid=1)
    assert read_job(78, str(tmp_path) + "/") == JobInfo()  # gone


def test_a_real_process_with_slurm_job_id_in_its_environment_is_joined_with_its_job():
    env = dict(os.environ, SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_JOB_USER="alice")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        # Until the child has exec'd, /proc shows the environment it forked with (this test's, with
        # no job), and the table reads a process's job once per (pid, start time). A real GPU process
        # is listed only once it holds a CUDA context, long after its exec.
        wait_for_sync(lambda: b"time.sleep" in Path("/proc/%d/cmdline" % child.pid).read_bytes(), "the child's exec")
        table = ProcessTable(use_psutil=False)
        (joined,) = table.join([ProcessSample(pid=child.pid, gpu_index=0, gpu_memory_bytes=1 << 30)])
        assert (joined.job_id, joined.job_step, joined.job_user, joined.container) == ("4242", "0", "alice", None)
        checked(NodeFrame(node="n", time=time.time(), processes=(joined,)))  # the frame check takes the new fields
        (mine,) = table.join([ProcessSample(pid=os.getpid(), gpu_index=0)])
        assert mine.job_id == os.environ.get("SLURM_JOB_ID")  # this test run is in no job (or in its own)
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait()


# --- a real slurmd with proctrack/cgroup -----------------------------------------------------

NEEDED = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "sinfo")
FREEZER = Path("/sys/fs/cgroup/freezer")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cgroup_v1_writable() -> bool:
    probe = FREEZER / ("opsconsole-test-%d" % os.getpid())
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def test_a_job_of_a_real_slurmd_under_proctrack_cgroup_is_attributed(tmp_path):
    missing = [n for n in NEEDED if shutil.which(n) is None and not os.path.exists("/usr/sbin/" + n)]
    if missing:
        pytest.skip("Slurm not installed: missing " + ", ".join(missing))
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root")
    if not FREEZER.is_dir() or not _cgroup_v1_writable():
        pytest.skip("proctrack/cgroup needs a writable cgroup v1 freezer hierarchy (%s)" % FREEZER)
    node = "ocjob%d" % os.getpid()
    slurm_root = FREEZER / ("slurm_" + node)
    if slurm_root.exists():
        pytest.skip("%s exists already: not ours to use" % slurm_root)
    key = tmp_path / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(stat.S_IRUSR | stat.S_IWUSR)
    host = socket.gethostname()
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=opsconsole-cgroup",
                "SlurmctldHost=%s(127.0.0.1)" % host,
                "SlurmctldPort=%d" % _free_port(),
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "AuthInfo=socket=%s" % (tmp_path / "munge.sock"),
                "StateSaveLocation=%s" % (tmp_path / "state"),
                "SlurmdSpoolDir=%s" % (tmp_path / "spool"),
                "SlurmctldPidFile=%s/slurmctld.pid" % tmp_path,
                "SlurmdPidFile=%s/slurmd.pid" % tmp_path,
                "ProctrackType=proctrack/cgroup",
                "TaskPlugin=task/none",
                "ReturnToService=2",
                "SelectType=select/cons_tres",
                "SlurmctldLogFile=%s/slurmctld.log" % tmp_path,
                "SlurmdLogFile=%s/slurmd.log" % tmp_path,
                "JobCompType=jobcomp/none",
                "AccountingStorageType=accounting_storage/none",
                "MpiDefault=none",
                "NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 Port=%d"
                % (node, host, _free_port()),
                "PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP" % node,
                "",
            ]
        )
    )
    (tmp_path / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "spool").mkdir()
    env = dict(os.environ, SLURM_CONF=str(conf))
    log = open(tmp_path / "daemons.log", "w")
    procs = []

    def start(*argv):
        procs.append(
            subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path, env=env
            )
        )

    pid_file = tmp_path / "task.pid"
    try:
        start(
            "munged",
            "-F",
            "--force",
            "-S",
            str(tmp_path / "munge.sock"),
            "--key-file",
            str(key),
            "--pid-file",
            str(tmp_path / "munged.pid"),
            "--log-file",
            str(tmp_path / "munged.log"),
            "--seed-file",
            str(tmp_path / "munge.seed"),
        )
        wait_for_sync(lambda: (tmp_path / "munge.sock").exists(), "munged")
        start("slurmctld", "-D", "-c", "-f", str(conf))
        start("slurmd", "-D", "-N", node, "-f", str(conf))

        def idle():
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=env, timeout=10)
            return out.returncode == 0 and out.stdout.split() == ["idle"]

        wait_for_sync(idle, "slurmd idle")
        job = (
            subprocess.run(
                [
                    "sbatch",
                    "--parsable",
                    "-o",
                    "/dev/null",
                    "--wrap",
                    "echo $$ > %s.tmp; mv %s.tmp %s; exec sleep 120" % ((pid_file,) * 3),
                ],
                capture_output=True,
                text=True,
                env=env,
                timeout=30,
                check=True,
            )
            .stdout.strip()
            .split(";")[0]
        )
        pid = int(wait_for_sync(lambda: pid_file.exists() and pid_file.read_text().strip(), "the job's task to start"))
        (joined,) = ProcessTable(use_psutil=False).join([ProcessSample(pid=pid, gpu_index=0)])
        assert (joined.job_id, joined.job_step, joined.job_user) == (job, "batch", "root")
        assert "/slurm_%s/uid_0/job_%s/step_batch" % (node, job) in Path("/proc/%d/cgroup" % pid).read_text()
        subprocess.run(["scancel", job], env=env, timeout=30)
        wait_for_sync(lambda: not Path("/proc/%d" % pid).exists(), "the job to end")
    finally:
        # One at a time, slurmd first: slurmd's shutdown sends the job's epilog-complete message,
        # retried for 9 s when slurmctld is stopped alongside it.
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        # slurmd leaves its empty per-node root: remove the empty cgroups under the one it made for us.
        if slurm_root.exists():
            for path in sorted(slurm_root.rglob("*"), key=lambda p: -len(p.parts)):
                if path.is_dir():
                    try:
                        path.rmdir()
                    except OSError:
                        pass
            try:
                slurm_root.rmdir()
            except OSError:
                pass


def test_a_frame_recorded_before_job_attribution_still_decodes_with_no_job():
    """Old frames and recordings carry none of the new fields: they read as 'not known', not as errors."""
    import json

    from opsconsole.model import from_wire

    fixture = Path(__file__).resolve().parent / "fixtures" / "h200_frame.json"
    wire = json.loads(fixture.read_text())
    assert "job_id" not in json.dumps(wire) and "mig_devices" not in json.dumps(wire)
    frame = checked(from_wire(NodeFrame, wire))
    assert frame.gpus and all(g.mig_devices == () and g.pod is None for g in frame.gpus)
    assert all(p.job_id is None and p.container is None and p.mig_instance is None for p in frame.processes)
