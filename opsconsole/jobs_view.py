"""Whose job each GPU runs, from what the nodes said: the labels the panes show, filter and count.

A job label is the Slurm job id ("812") of a GPU process (read on the node from its cgroup or
environment), else the Kubernetes pod dcgm-exporter named for the GPU ("ml/train-0"), else
dcgm-exporter's HPC job ("hpc_job"), else the container a process runs in ("docker/3f2a...").
Pure and Textual-free, like fleet_view.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Set, Tuple

from opsconsole.model import GpuSample, MigDevice, NodeFrame, NodeState, ProcessSample


def process_job(proc: ProcessSample) -> Optional[str]:
    """The job label of one process: its Slurm job id, else its container; None when in neither."""
    return proc.job_id or proc.container


def _exporter_jobs(device: "GpuSample | MigDevice") -> List[str]:
    out = []
    if device.pod:
        out.append("%s/%s" % (device.namespace, device.pod) if device.namespace else device.pod)
    if device.job_id:
        out.extend(part for part in device.job_id.split(",") if part)
    return out


def device_jobs(device: "GpuSample | MigDevice", procs: Sequence[ProcessSample]) -> Tuple[str, ...]:
    """The job labels of a GPU or MIG instance: its processes' jobs and the exporter's labels, sorted."""
    found: Set[str] = set(_exporter_jobs(device))
    for proc in procs:
        job = process_job(proc)
        if job:
            found.add(job)
    return tuple(sorted(found))


def job_users(procs: Sequence[ProcessSample]) -> Tuple[str, ...]:
    """The users of the jobs of `procs` (a Slurm job's user, else the process's own), sorted."""
    users = {p.job_user or p.user for p in procs if process_job(p)}
    return tuple(sorted(user for user in users if user))


def frame_jobs(frame: Optional[NodeFrame]) -> Tuple[str, ...]:
    """Every job label on a node's frame: its GPU processes', its GPUs' and MIG instances' exporter labels."""
    if frame is None:
        return ()
    found: Set[str] = set()
    for gpu in frame.gpus:
        found.update(_exporter_jobs(gpu))
        for mig in gpu.mig_devices:
            found.update(_exporter_jobs(mig))
    for proc in frame.processes:
        job = process_job(proc)
        if job:
            found.add(job)
    return tuple(sorted(found))


def count_jobs(states: Iterable[NodeState]) -> int:
    """Distinct jobs over `states`' frames: Slurm ids and pods count once across nodes, containers per node."""
    seen: Set[str] = set()
    for state in states:
        frame = state.frame
        if frame is None:
            continue
        containers = {p.container for p in frame.processes if p.container and not p.job_id}
        for job in frame_jobs(frame):
            seen.add("%s@%s" % (job, state.name) if job in containers else job)
    return len(seen)


def marks(jobs: Sequence[str], job: Optional[str]) -> bool:
    """Whether a row running `jobs` belongs to the followed job `job` (--slurm-job)."""
    return bool(job) and job in jobs
