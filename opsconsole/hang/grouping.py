"""Ranks grouped by identical stack, and the odd ones out named: pure functions.

Which ranks are odd: at a hang, the ranks waiting inside a collective wait for the ones that never
reached it. So when some groups stand in a collective (a torch.distributed call) and others do not,
the ones that do not are odd. Otherwise (all in collectives, or none) the odd ones are those
outside the one largest group; with no single largest group nobody is named.

A group is described by its innermost Python frame and the innermost frame of the user's own code
below it: "rank 5 in `__next__` (dataloader.py:631) via train.py:88".

Ranks are compared within their job only (a node may run several: two 4-GPU jobs on one 8-GPU
node, each with its own rank 0). Each member carries its job (the node helper reads it from the
rank's environment: its rendezvous master, torchelastic run, Slurm job); a group never mixes jobs,
the odd ones are judged per job, and where several jobs are seen each line names its job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

from opsconsole.hang.pyspy import Frame

# Functions of torch.distributed (and the libraries that wrap it) in which a rank waits for its peers.
COLLECTIVES = frozenset(
    (
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "all_to_all",
        "all_to_all_single",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "barrier",
        "monitored_barrier",
        "send",
        "recv",
        "isend",
        "irecv",
        "batch_isend_irecv",
        "_all_gather_base",
        "_reduce_scatter_base",
        "wait",
        "synchronize",
    )
)
DISTRIBUTED_FILES = ("torch/distributed/", "deepspeed/comm/", "megatron/core/parallel_state")
LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python", "<frozen", "/lib64/python")

RankId = Union[int, str]  # the global rank, or "node:pid" for a process without RANK


@dataclass(frozen=True)
class Member:
    """One rank's place in the grouping: its id, node, pid and main-thread frames (innermost first)."""

    rank: RankId
    node: str
    pid: int
    frames: Tuple[Frame, ...]
    job: Optional[str] = None  # "job at 10.0.0.5:29500"; None where the rank's environment does not say


@dataclass(frozen=True)
class Group:
    """Ranks of one job with one identical stack."""

    members: Tuple[Member, ...]
    frames: Tuple[Frame, ...]
    in_collective: bool
    odd: bool = False
    job: Optional[str] = None

    @property
    def ranks(self) -> Tuple[RankId, ...]:
        return tuple(member.rank for member in self.members)


def is_library(path: str) -> bool:
    return any(part in path for part in LIBRARY_PARTS) or path.startswith("<")


def is_python_frame(frame: Frame) -> bool:
    return frame.file.endswith((".py", ".pyw", ".pyx")) or frame.file.startswith("<")  # native: .so, .c


def in_collective(frames: Sequence[Frame]) -> bool:
    """Whether a stack waits in a collective: a torch.distributed (or DeepSpeed, Megatron) frame."""
    for frame in frames:
        path = frame.file.replace("\\", "/")
        if any(part in path for part in DISTRIBUTED_FILES):
            return True
        if frame.function.rsplit(".", 1)[-1] in COLLECTIVES and "distributed" in path:
            return True
    return False


def where(frames: Sequence[Frame]) -> str:
    """`__next__` (dataloader.py:631) via train.py:88: the innermost Python frame and the user's own below it."""
    if not frames:
        return "no Python frame"
    inner_index = next((i for i, frame in enumerate(frames) if is_python_frame(frame)), 0)
    inner = frames[inner_index]
    text = "`%s` (%s)" % (inner.function, place(inner))
    if is_library(inner.file):
        user = next(
            (frame for frame in frames[inner_index + 1 :] if is_python_frame(frame) and not is_library(frame.file)),
            None,
        )
        if user is not None:
            text += " via %s" % place(user)
    return text


def place(frame: Frame) -> str:
    name = os.path.basename(frame.file) or frame.file
    return "%s:%d" % (name, frame.line) if frame.line else name


def _sort_key(rank: RankId) -> Tuple[int, int, str]:
    return (0, rank, "") if isinstance(rank, int) else (1, 0, str(rank))


def ranks_text(ranks: Sequence[RankId]) -> str:
    """`rank 5`, `ranks 0-4, 6-15`, with unranked processes (`node:pid`) after the numbers."""
    numbers = sorted({rank for rank in ranks if isinstance(rank, int)})
    others = sorted({str(rank) for rank in ranks if not isinstance(rank, int)})
    runs: List[str] = []
    index = 0
    while index < len(numbers):
        end = index
        while end + 1 < len(numbers) and numbers[end + 1] == numbers[end] + 1:
            end += 1
        runs.append(str(numbers[index]) if end == index else "%d-%d" % (numbers[index], numbers[end]))
        index = end + 1
    words = runs + ["pid " + other for other in others]
    count = len(numbers) + len(others)
    return ("rank " if count == 1 else "ranks ") + ", ".join(words)


def group_stacks(members: Sequence[Member]) -> List[Group]:
    """Groups of identical main-thread stacks within each job, odd ones first, then the largest first."""
    jobs: Dict[Optional[str], Dict[Tuple[Frame, ...], List[Member]]] = {}
    for member in members:
        jobs.setdefault(member.job, {}).setdefault(member.frames, []).append(member)
    marked: List[Group] = []
    for job, by_stack in jobs.items():
        groups = [
            Group(tuple(sorted(found, key=lambda m: _sort_key(m.rank))), frames, in_collective(frames), job=job)
            for frames, found in by_stack.items()
        ]
        odd = odd_groups(groups)
        marked += [Group(g.members, g.frames, g.in_collective, odd=id(g) in odd, job=job) for g in groups]
    # Odd ones first; then each job's groups together (None, no job id, first), the largest first.
    marked.sort(
        key=lambda g: (not g.odd, g.job is not None, g.job or "", -len(g.members), _sort_key(g.members[0].rank))
    )
    return marked


def several_jobs(groups: Sequence[Group]) -> bool:
    """Whether the groups come from more than one job (then each line names its job)."""
    return len({g.job for g in groups}) > 1


def job_name(job: Optional[str]) -> str:
    return job or "no job id"


def _by_job(groups: Sequence[Group]) -> List[Tuple[Optional[str], List[Group]]]:
    """The groups of each job, jobs in the order their first group comes."""
    jobs: Dict[Optional[str], List[Group]] = {}
    for group in groups:
        jobs.setdefault(group.job, []).append(group)
    return list(jobs.items())


def odd_groups(groups: Sequence[Group]) -> set:
    """ids of the odd groups (see the module docstring)."""
    if len(groups) < 2:
        return set()
    waiting = [g for g in groups if g.in_collective]
    if waiting and len(waiting) < len(groups):
        return {id(g) for g in groups if not g.in_collective}
    sizes = sorted((len(g.members) for g in groups), reverse=True)
    if sizes[0] == sizes[1]:
        return set()  # no majority to stand out from
    largest = max(groups, key=lambda g: len(g.members))
    return {id(g) for g in groups if g is not largest}


def odd_ranks(groups: Sequence[Group]) -> List[RankId]:
    return sorted((m.rank for g in groups if g.odd for m in g.members), key=_sort_key)


def group_line(group: Group, with_job: bool = False) -> str:
    """`rank 5 in `__next__` (dataloader.py:631) via train.py:88`; `[job at h:29500] rank 5 in ...` with its job."""
    line = "%s in %s" % (ranks_text(group.ranks), where(group.frames))
    return "[%s] %s" % (job_name(group.job), line) if with_job else line


def summary(groups: Sequence[Group]) -> str:
    """One line for the whole run: the groups, odd ones first, separated by `; `."""
    if not groups:
        return "no stacks"
    with_job = several_jobs(groups)
    return "; ".join(group_line(g, with_job) for g in groups)


def verdict(groups: Sequence[Group]) -> Optional[str]:
    """The sentence naming the odd ones out (of each job, where there are several), None when none stands out."""
    jobs = _by_job(groups)
    if len(jobs) <= 1:
        return _job_verdict(groups)
    sentences = [
        "[%s] %s" % (job_name(job), _job_verdict(members)) for job, members in jobs if any(g.odd for g in members)
    ]
    if sentences:
        return " · ".join(sentences)
    if any(len(members) > 1 for _job, members in jobs):
        return "the ranks differ, but no group stands out in any job (no single majority, no rank outside a collective)"
    return None


def _job_verdict(groups: Sequence[Group]) -> Optional[str]:
    """The verdict over the groups of one job."""
    odd = [g for g in groups if g.odd]
    if not odd:
        if len(groups) > 1:
            return "the ranks differ, but no group stands out (no single majority, no rank outside a collective)"
        return None
    waiting = [g for g in groups if g.in_collective and not g.odd]
    names = "; ".join(group_line(g) for g in odd)
    if waiting:
        return "%s, while the others wait in a collective" % names
    return "%s, unlike the others" % names
