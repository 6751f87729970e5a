"""Whose job a process is: the Slurm job, step and user, and the container, read on the node.

From /proc/PID/cgroup first (one short file, readable for every process), where slurmd's
cgroup plugins and container runtimes leave their names:

    Slurm, cgroup v1       4:memory:/slurm/uid_1000/job_1234/step_0/task_0
                           (a multi-slurmd node: /slurm_NODENAME/uid_.../job_...)
    Slurm, cgroup v2       0::/system.slice/slurmstepd.scope/job_1234/step_batch/user/task_0
                           (no uid in the path: the job's user is the process's own user)
    Docker                 .../docker/<64 hex>  or  .../docker-<64 hex>.scope
    Kubernetes             .../kubepods/burstable/pod<UID>/<64 hex>
                           .../kubepods-burstable-pod<UID_with_underscores>.slice/cri-containerd-<64 hex>.scope
                           .../kubepods-besteffort-pod<UID>.slice:cri-containerd:<64 hex>
    containerd, CRI-O, podman   cri-containerd-<id>.scope, crio-<id>.scope, libpod-<id>.scope

then, for a Slurm job the cgroup does not name (proctrack/linuxproc or pgid), SLURM_JOB_ID,
SLURM_STEP_ID and SLURM_JOB_USER from the process's environment, which only its owner and
root may read. Everything read is bounded and checked: a job id is digits (an array task
"123_4" too), a step a short word, a container id hex; anything else is left out.

Stdlib only, Python 3.6 syntax: shipped to nodes with the probe.
"""

import re
from typing import Dict, List, Optional, Tuple

from opsconsole.probe.proc_read import read_prefix

# /proc/PID/cgroup is a line per hierarchy (13 on a cgroup v1 node): 64 KiB is far beyond it.
CGROUP_READ_LIMIT = 65536
# /proc/PID/environ can be as big as the argument space (MBs): the SLURM_ variables of a job
# sit among the first few KiB of a task's environment, but read generously.
ENVIRON_READ_LIMIT = 1 << 20

_SLURM_V1 = re.compile(r"/slurm(?:_[^/]{1,64})?/uid_([0-9]{1,10})/job_([0-9]{1,20})(?:/step_([A-Za-z0-9_]{1,32}))?")
_SLURM_V2 = re.compile(r"/job_([0-9]{1,20})(?:/step_([A-Za-z0-9_]{1,32}))?(?:/|$)")
_HEX_ID = r"([0-9a-f]{12,64})"
# containerd's systemd driver writes "...-pod<UID>.slice:cri-containerd:<ID>" (colons inside the path).
_K8S_POD = re.compile(
    r"kubepods.*?[/-]pod([0-9a-fA-F_-]{8,64})(?:\.slice)?[/:](?:(?:cri-containerd|crio|docker)[-:])?"
    + _HEX_ID
    + r"(?:\.scope)?(?:/|$)"
)
_RUNTIMES = (
    ("docker", re.compile(r"/docker[-/]" + _HEX_ID + r"(?:\.scope)?(?:/|$)")),
    ("containerd", re.compile(r"/cri-containerd-" + _HEX_ID + r"\.scope(?:/|$)")),
    ("crio", re.compile(r"/crio-(?:conmon-)?" + _HEX_ID + r"\.scope(?:/|$)")),
    ("podman", re.compile(r"/libpod-(?:conmon-)?" + _HEX_ID + r"\.scope(?:/|$)")),
)
_JOB_ID = re.compile(r"^[0-9]{1,20}(?:_[0-9]{1,10})?$")
_STEP = re.compile(r"^[A-Za-z0-9_]{1,32}$")
_USER = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
SHORT_ID = 12  # characters of a container id shown, as `docker ps` does


class JobInfo(object):
    """What one process's cgroup and environment say: Slurm job id, step, uid or user, container."""

    __slots__ = ("job_id", "job_step", "job_uid", "job_user", "container")

    def __init__(
        self,
        job_id: Optional[str] = None,
        job_step: Optional[str] = None,
        job_uid: Optional[int] = None,
        job_user: Optional[str] = None,
        container: Optional[str] = None,
    ) -> None:
        self.job_id = job_id
        self.job_step = job_step
        self.job_uid = job_uid
        self.job_user = job_user
        self.container = container

    def as_dict(self) -> Dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobInfo) and self.as_dict() == other.as_dict()

    def __repr__(self) -> str:
        return "JobInfo(%s)" % ", ".join("%s=%r" % kv for kv in sorted(self.as_dict().items()) if kv[1] is not None)


def _cgroup_paths(text: str) -> Tuple[str, ...]:
    """The cgroup paths of a /proc/PID/cgroup text ("ID:controllers:path" lines), v2's first."""
    paths: List[Tuple[bool, str]] = []
    for line in text.splitlines()[:64]:
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            paths.append((parts[0] != "0", parts[2][:4096]))
    paths.sort(key=lambda pair: pair[0])
    return tuple(path for _, path in paths)


def parse_cgroup(text: str) -> "JobInfo":
    """The Slurm job and container named by a /proc/PID/cgroup text (fields None when it names none)."""
    info = JobInfo()
    for path in _cgroup_paths(text):
        if info.job_id is None:
            v1 = _SLURM_V1.search(path)
            if v1 is not None:
                info.job_uid = int(v1.group(1))
                info.job_id = v1.group(2)
                info.job_step = v1.group(3)
            elif "slurm" in path:  # v2: slurmstepd.scope/job_N/step_S (or a site's own slurm prefix)
                v2 = _SLURM_V2.search(path)
                if v2 is not None:
                    info.job_id = v2.group(1)
                    info.job_step = v2.group(2)
        if info.container is None:
            info.container = _container(path)
        if info.job_id is not None and info.container is not None:
            break
    return info


def _container(path: str) -> Optional[str]:
    if "kubepods" in path:
        pod = _K8S_POD.search(path)
        if pod is not None:
            return "k8s/%s/%s" % (pod.group(1).replace("_", "-"), pod.group(2)[:SHORT_ID])
    for runtime, pattern in _RUNTIMES:
        found = pattern.search(path)
        if found is not None:
            return "%s/%s" % (runtime, found.group(1)[:SHORT_ID])
    return None


def parse_slurm_environ(data: bytes) -> "JobInfo":
    """SLURM_JOB_ID (or the older SLURM_JOBID), SLURM_STEP_ID and SLURM_JOB_USER of a /proc/PID/environ image."""
    found: Dict[str, str] = {}
    for entry in data.split(b"\0"):
        if not entry.startswith(b"SLURM_"):
            continue
        name, sep, value = entry.partition(b"=")
        if sep and name in (b"SLURM_JOB_ID", b"SLURM_JOBID", b"SLURM_STEP_ID", b"SLURM_STEPID", b"SLURM_JOB_USER"):
            found.setdefault(
                name.decode("ascii").replace("JOBID", "JOB_ID").replace("STEPID", "STEP_ID"),
                value[:128].decode("utf-8", "replace"),
            )
    job_id = found.get("SLURM_JOB_ID")
    step = found.get("SLURM_STEP_ID")
    user = found.get("SLURM_JOB_USER")
    if job_id is None or not _JOB_ID.match(job_id):
        return JobInfo()
    return JobInfo(
        job_id=job_id,
        job_step=step if step is not None and _STEP.match(step) else None,
        job_user=user if user is not None and _USER.match(user) else None,
    )


def read_job(pid: int, proc_prefix: str = "/proc/") -> "JobInfo":
    """The job of process `pid`: its cgroup, then its environment for a Slurm job the cgroup does not name."""
    base = "%s%d/" % (proc_prefix, pid)
    try:
        info = parse_cgroup(read_prefix(base + "cgroup", CGROUP_READ_LIMIT).decode("utf-8", "replace"))
    except OSError:
        info = JobInfo()
    if info.job_id is None or info.job_user is None:
        try:
            env = parse_slurm_environ(read_prefix(base + "environ", ENVIRON_READ_LIMIT))
        except OSError:  # another user's process, or gone
            env = JobInfo()
        if info.job_id is None and env.job_id is not None:
            info.job_id, info.job_step = env.job_id, env.job_step
        if env.job_id == info.job_id:
            info.job_user = info.job_user or env.job_user
    return info
