"""Slurm: the nodes a job runs on, asked of `scontrol` on the login node."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, List, Optional, Sequence, Tuple

Run = Callable[..., "subprocess.CompletedProcess[str]"]

SCONTROL_TIMEOUT_S = 15.0
# Plain job ids, array tasks (123_4) and heterogeneous components (123+1).
_JOB_ID = re.compile(r"^[0-9]+(?:_[0-9]+)?(?:\+[0-9]+)?$")
_NO_NODES = ("", "(null)", "None assigned")


class SlurmUnavailable(Exception):
    """Slurm cannot answer: no `scontrol`, an unknown job, or a job with no nodes yet (one line)."""


def _scontrol(args: Sequence[str], run: Run) -> str:
    argv = ["scontrol", *args]
    try:
        result = run(argv, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmUnavailable("Slurm is not available here: scontrol not found on PATH") from None
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable("scontrol %s: no answer within %g s" % (" ".join(args), SCONTROL_TIMEOUT_S)) from None
    except OSError as exc:
        raise SlurmUnavailable("scontrol could not be run: %s" % exc) from None
    if result.returncode != 0:
        message = (result.stderr or result.stdout or "").strip().splitlines()
        detail = message[-1] if message else "exit status %d" % result.returncode
        raise SlurmUnavailable("scontrol %s: %s" % (" ".join(args), detail))
    return result.stdout


def parse_job_fields(text: str) -> dict:
    """The `Key=Value` fields of `scontrol -o show job` output (first record; values have no spaces)."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    fields = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    return fields


def job_nodes(job_id: str, run: Run = subprocess.run) -> List[str]:
    """Hostnames of the nodes allocated to Slurm job `job_id`, in Slurm's order.

    Raises SlurmUnavailable when scontrol is missing, the job is unknown, or it has
    no nodes yet (pending).
    """
    job_id = str(job_id).strip()
    if not _JOB_ID.match(job_id):
        raise SlurmUnavailable("%r is not a Slurm job id (expected digits, e.g. 123456 or 123456_7)" % job_id)
    fields = parse_job_fields(_scontrol(["-o", "show", "job", job_id], run))
    if "JobId" not in fields:
        raise SlurmUnavailable("Slurm job %s: scontrol printed no job record" % job_id)
    nodelist = fields.get("NodeList", "")
    if nodelist in _NO_NODES:
        state = fields.get("JobState", "unknown")
        raise SlurmUnavailable("Slurm job %s has no nodes yet (state %s)" % (job_id, state))
    names = [ln.strip() for ln in _scontrol(["show", "hostnames", nodelist], run).splitlines() if ln.strip()]
    if not names:
        raise SlurmUnavailable("Slurm job %s: scontrol show hostnames %s printed nothing" % (job_id, nodelist))
    return names


# --- jobs, their state and their nodes, followed over time (issue 8) -------------------------

log = logging.getLogger(__name__)

SQUEUE_TEXT_FORMAT = "%i|%j|%T|%M|%N|%u|%r"
_USER = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]*\$?$")
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
DEFAULT_FOLLOW_INTERVAL_S = 30.0


@dataclass(frozen=True)
class SlurmJob:
    """One Slurm job as squeue or scontrol saw it."""

    job_id: str
    name: str = ""
    state: str = "UNKNOWN"  # RUNNING, PENDING, COMPLETING ...
    user: str = ""
    nodelist: str = ""  # as Slurm prints it, e.g. gpu-a[01-03]
    nodes: Tuple[str, ...] = ()
    elapsed_s: Optional[float] = None
    reason: str = ""  # why pending (Resources, Priority ...)


@dataclass(frozen=True)
class SlurmRun:
    """What the console follows: the jobs of `--slurm-job` or `--slurm-user`, and their nodes."""

    jobs: Tuple[SlurmJob, ...]
    label: str  # for the header, as of the query
    error: Optional[str] = None  # the last query failed: why (the jobs are the last known)
    asked_at: Optional[float] = None  # time.time() of the query the jobs come from
    user: Optional[str] = None  # --slurm-user's user (the label names it)

    def label_at(self, now: float) -> str:
        """The header's words at `now`: a running job's elapsed time moves on between queries (they
        come every 30 s). The last query's label while Slurm cannot answer."""
        if self.error is not None or self.asked_at is None or now <= self.asked_at:
            return self.label
        moved = now - self.asked_at
        jobs = [
            replace(job, elapsed_s=job.elapsed_s + moved)
            if job.state == "RUNNING" and job.elapsed_s is not None
            else job
            for job in self.jobs
        ]
        return describe_run(jobs, self.user)

    @property
    def nodes(self) -> Tuple[str, ...]:
        """Every node of every job, in job order, each once."""
        return tuple(dict.fromkeys(node for job in self.jobs for node in job.nodes))


def _expand(nodelist: str) -> Tuple[str, ...]:
    from opsconsole.hostlist import expand_hostlist

    if nodelist in _NO_NODES:
        return ()
    try:
        return tuple(dict.fromkeys(expand_hostlist(nodelist, allow_duplicates=True)))
    except ValueError as exc:
        raise SlurmUnavailable("Slurm printed a node list we cannot read: %s" % exc) from None


def parse_elapsed(text: str) -> Optional[float]:
    """Slurm's elapsed time (`MM:SS`, `HH:MM:SS`, `D-HH:MM:SS`) in seconds; None for INVALID/empty."""
    text = (text or "").strip()
    days = 0
    if "-" in text:
        head, _, text = text.partition("-")
        if not head.isdigit():
            return None
        days = int(head)
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return float(days * 86400 + seconds)


def format_elapsed(seconds: Optional[float]) -> str:
    """Seconds as Slurm prints elapsed time: `M:SS`, `H:MM:SS` or `D-HH:MM:SS`."""
    if seconds is None:
        return "?"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return "%d-%02d:%02d:%02d" % (days, hours, minutes, secs)
    if hours:
        return "%d:%02d:%02d" % (hours, minutes, secs)
    return "%d:%02d" % (minutes, secs)


def _job_matches(job: dict, wanted: str) -> bool:
    # 123 matches the job and every task of array 123; 123_4 one task; 123+1 one component.
    base, _, offset = wanted.partition("+")
    array_id, _, task = base.partition("_")
    if offset:
        return str(job.get("het_job_id")) == array_id and str(job.get("het_job_offset")) == offset
    if task:
        return str(job.get("array_job_id")) == array_id and str(job.get("array_task_id")) == task
    return str(job.get("job_id")) == array_id or str(job.get("array_job_id")) == array_id


def _json_job_id(job: dict) -> str:
    if job.get("array_task_id") is not None and job.get("array_job_id"):
        return "%s_%s" % (job["array_job_id"], job["array_task_id"])
    return str(job.get("job_id"))


def _json_state(job: dict) -> str:
    state = job.get("job_state", "UNKNOWN")
    if isinstance(state, list):  # Slurm 23.02+: a list of flags
        state = state[0] if state else "UNKNOWN"
    return str(state)


def _json_number(value: Any) -> Optional[float]:
    if isinstance(value, dict):  # Slurm 23.02+: {"set": true, "number": N}
        return float(value["number"]) if value.get("set") else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def parse_squeue_json(
    text: str, now: float, job_id: Optional[str] = None, user: Optional[str] = None
) -> List[SlurmJob]:
    """Jobs from `squeue --json`, filtered here too (22.05's --json ignores --jobs and --user)."""
    try:
        data = json.loads(text)
    except ValueError:
        raise SlurmUnavailable("squeue --json printed something that is not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), list):
        raise SlurmUnavailable("squeue --json printed no job list")
    jobs = []
    for job in data["jobs"]:
        if not isinstance(job, dict):
            continue
        if job_id is not None and not _job_matches(job, job_id):
            continue
        state = _json_state(job)
        if user is not None and (job.get("user_name") != user or state != "RUNNING"):
            continue
        nodelist = str(job.get("nodes") or "")
        start = _json_number(job.get("start_time"))
        elapsed = now - start if state in ("RUNNING", "COMPLETING", "SUSPENDED") and start else None
        jobs.append(
            SlurmJob(
                job_id=_json_job_id(job),
                name=str(job.get("name") or ""),
                state=state,
                user=str(job.get("user_name") or ""),
                nodelist=nodelist,
                nodes=_expand(nodelist),
                elapsed_s=None if elapsed is None else max(0.0, elapsed),
                reason="" if job.get("state_reason") in (None, "None") else str(job["state_reason"]),
            )
        )
    return jobs


def parse_squeue_text(text: str) -> List[SlurmJob]:
    """Jobs from `squeue -h -o '%i|%j|%T|%M|%N|%u|%r'` (the text fallback)."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) < 6:
            raise SlurmUnavailable("squeue printed a line we cannot read: %r" % line[:80])
        job_id, name, state, elapsed, nodelist, user = (f.strip() for f in fields[:6])
        reason = fields[6].strip() if len(fields) > 6 else ""
        jobs.append(
            SlurmJob(
                job_id=job_id,
                name=name,
                state=state,
                user=user,
                nodelist=nodelist,
                nodes=_expand(nodelist),
                elapsed_s=parse_elapsed(elapsed),
                reason=reason,
            )
        )
    return jobs


def job_from_scontrol(fields: dict) -> SlurmJob:
    """A SlurmJob from the fields of `scontrol -o show job` (see parse_job_fields)."""
    user = fields.get("UserId", "")
    nodelist = fields.get("NodeList", "")
    return SlurmJob(
        job_id=fields.get("JobId", ""),
        name=fields.get("JobName", ""),
        state=fields.get("JobState", "UNKNOWN"),
        user=user.split("(", 1)[0],
        nodelist="" if nodelist in _NO_NODES else nodelist,
        nodes=_expand(nodelist),
        elapsed_s=parse_elapsed(fields.get("RunTime", "")),
        reason=fields.get("Reason", "") if fields.get("Reason") not in (None, "None") else "",
    )


def _run_slurm(argv: Sequence[str], run: Run) -> "subprocess.CompletedProcess[str]":
    try:
        return run(list(argv), capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmUnavailable("Slurm is not available here: %s not found on PATH" % argv[0]) from None
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable("%s: no answer within %g s" % (argv[0], SCONTROL_TIMEOUT_S)) from None
    except OSError as exc:
        raise SlurmUnavailable("%s could not be run: %s" % (argv[0], exc)) from None


def _last_line(result: "subprocess.CompletedProcess[str]") -> str:
    message = (result.stderr or result.stdout or "").strip().splitlines()
    return message[-1] if message else "exit status %d" % result.returncode


def _error_line(result: "subprocess.CompletedProcess[str]") -> Optional[str]:
    # squeue exits 0 after "squeue: error: Invalid user: x" and prints every job: an error all the same.
    for line in (result.stderr or "").splitlines():
        if "error:" in line:
            return line.strip()
    return None


def _json_unsupported(result: "subprocess.CompletedProcess[str]") -> bool:
    text = (result.stderr or "") + (result.stdout or "")
    return result.returncode != 0 and (
        "unrecognized option" in text or "invalid option" in text or "json" in text.lower()
    )


def check_job_id(job_id: str) -> str:
    """`job_id` stripped, or SlurmUnavailable when it is not one."""
    job_id = str(job_id).strip()
    if not _JOB_ID.match(job_id):
        raise SlurmUnavailable("%r is not a Slurm job id (expected digits, e.g. 123456 or 123456_7)" % job_id)
    return job_id


def check_user(user: str) -> str:
    """`user` stripped, or SlurmUnavailable when it cannot be a user name."""
    user = str(user).strip()
    if not _USER.match(user):
        raise SlurmUnavailable("%r is not a user name" % user)
    return user


def query_job(job_id: str, run: Run = subprocess.run, now: Optional[float] = None) -> SlurmJob:
    """Job `job_id` now: `squeue --json` where it works, else `scontrol -o show job` text."""
    job_id = check_job_id(job_id)
    now = time.time() if now is None else now
    result = _run_slurm(["squeue", "--json", "--jobs", job_id], run)
    if result.returncode == 0 and not _error_line(result):
        jobs = parse_squeue_json(result.stdout, now, job_id=job_id)
        if jobs:
            return _merge_array(job_id, jobs)
        # squeue shows only jobs that are not finished; scontrol remembers finished ones a while.
    elif not _json_unsupported(result) and "Invalid job id" not in _last_line(result):
        raise SlurmUnavailable("squeue --jobs %s: %s" % (job_id, _last_line(result)))
    return job_from_scontrol(parse_job_fields(_scontrol(["-o", "show", "job", job_id], run)))


def _merge_array(job_id: str, jobs: List[SlurmJob]) -> SlurmJob:
    if len(jobs) == 1:
        return jobs[0]
    # An array job (or a heterogeneous one): one entry for all of its running parts.
    states = [job.state for job in jobs]
    state = "RUNNING" if "RUNNING" in states else states[0]
    elapsed = [job.elapsed_s for job in jobs if job.elapsed_s is not None]
    return SlurmJob(
        job_id=job_id,
        name=jobs[0].name,
        state=state,
        user=jobs[0].user,
        nodelist=",".join(job.nodelist for job in jobs if job.nodelist),
        nodes=tuple(dict.fromkeys(node for job in jobs for node in job.nodes)),
        elapsed_s=max(elapsed) if elapsed else None,
        reason=jobs[0].reason,
    )


def query_user_jobs(user: str, run: Run = subprocess.run, now: Optional[float] = None) -> List[SlurmJob]:
    """The running jobs of `user`: `squeue --json` where it works, else squeue's text output."""
    user = check_user(user)
    now = time.time() if now is None else now
    result = _run_slurm(["squeue", "--json", "--user", user, "--states", "RUNNING"], run)
    if result.returncode == 0 and _error_line(result):
        raise SlurmUnavailable("squeue --user %s: %s" % (user, _error_line(result)))
    if result.returncode == 0:
        return parse_squeue_json(result.stdout, now, user=user)
    if not _json_unsupported(result):
        raise SlurmUnavailable("squeue --user %s: %s" % (user, _last_line(result)))
    result = _run_slurm(["squeue", "-h", "--user", user, "--states", "RUNNING", "-o", SQUEUE_TEXT_FORMAT], run)
    if result.returncode != 0 or _error_line(result):
        raise SlurmUnavailable("squeue --user %s: %s" % (user, _last_line(result)))
    return parse_squeue_text(result.stdout)


def describe_run(jobs: Sequence[SlurmJob], user: Optional[str] = None) -> str:
    """The header's words for the followed jobs."""
    if user is not None:
        nodes = len(dict.fromkeys(n for job in jobs for n in job.nodes))
        if not jobs:
            return "user %s: no running jobs" % user
        if len(jobs) == 1:
            return "user %s: %s" % (user, describe_run(jobs))
        return "user %s: %d jobs, %d nodes" % (user, len(jobs), nodes)
    if not jobs:
        return "no job"
    job = jobs[0]
    text = "job %s %s %s" % (job.job_id, job.name or "?", job.state)
    if job.elapsed_s is not None:
        text += " " + format_elapsed(job.elapsed_s)
    if job.state == "PENDING" and job.reason:
        text += " (%s)" % job.reason
    else:
        text += " (%d node%s)" % (len(job.nodes), "" if len(job.nodes) == 1 else "s")
    return text


class SlurmFollower:
    """Follows `--slurm-job` or `--slurm-user`: re-asks Slurm every `interval` s.

    `on_change(run)` gets a SlurmRun after every query (the fleet applies the differences). A failing query keeps the last nodes and sets `run.error`.
    """

    def __init__(
        self,
        job_id: Optional[str] = None,
        user: Optional[str] = None,
        interval: float = DEFAULT_FOLLOW_INTERVAL_S,
        run: Run = subprocess.run,
    ) -> None:
        if (job_id is None) == (user is None):
            raise ValueError("follow either a job or a user")
        self.job_id = None if job_id is None else check_job_id(job_id)
        self.user = None if user is None else check_user(user)
        self.interval = interval
        self._run = run
        self.current: Optional[SlurmRun] = None

    def query(self) -> SlurmRun:
        """Ask Slurm now (blocking); SlurmUnavailable when it cannot answer."""
        asked_at = time.time()
        if self.job_id is not None:
            jobs = [query_job(self.job_id, self._run)]
        else:
            jobs = query_user_jobs(self.user, self._run)  # type: ignore[arg-type]
        return SlurmRun(jobs=tuple(jobs), label=describe_run(jobs, self.user), asked_at=asked_at, user=self.user)

    def poll(self) -> SlurmRun:
        """One query; on failure the last known jobs with the error."""
        try:
            self.current = self.query()
        except SlurmUnavailable as exc:
            last = self.current
            self.current = SlurmRun(
                jobs=last.jobs if last else (),
                label=(last.label if last else (("job " + self.job_id) if self.job_id else "user %s" % self.user)),
                error=str(exc),
            )
        return self.current

    async def follow(self, on_change: Callable[[SlurmRun], None]) -> None:
        """Poll every interval until cancelled; `on_change` on every difference."""
        from opsconsole.nodes.local import run_in_daemon_thread

        while True:
            run = await run_in_daemon_thread(self.poll)
            try:
                on_change(run)  # every poll: the elapsed time in the label moves too
            except Exception:
                log.exception("slurm follower: on_change failed")
            await asyncio.sleep(self.interval)


def slurm_nodes(run: Run = subprocess.run) -> List[dict]:
    """Every node `scontrol -o show node` lists, each as its `Key=Value` fields (NodeName, NodeHostName,
    NodeAddr, State ...; a Reason with spaces is cut at its first word, which nothing here reads)."""
    text = _scontrol(["-o", "show", "node"], run)
    return [parse_job_fields(line) for line in text.splitlines() if line.lstrip().startswith("NodeName=")]


def _host_forms(name: str) -> Tuple[str, ...]:
    """A host name as Slurm may spell it: as given and its short form, lower case."""
    name = name.strip().lower()
    short = name.split(".", 1)[0] if not name.replace(".", "").isdigit() else name  # not an IPv4 address
    return (name, short) if short != name else (name,)


def slurm_name_of(console_name: str, hostnames: Sequence[str], run: Run = subprocess.run) -> Tuple[str, str]:
    """(Slurm's NodeName, the host that matched) of the machine the console calls `console_name`, whose
    own host names are `hostnames` (what it reported of itself first, then how the console reaches it).

    The console's name for a node is a label (`[[nodes]] name`, `local`) and need not be Slurm's: a
    command aimed at Slurm goes to the node Slurm runs on that host (its NodeHostName, NodeAddr or
    NodeName). Where several Slurm nodes share the host, the one named as the console names it wins;
    otherwise SlurmUnavailable (one line) for none or several: a guess could drain another machine.
    """
    wanted = {form for host in hostnames if host for form in _host_forms(host)}
    if not wanted:
        raise SlurmUnavailable("the host name of %s is not known yet (no frame from it)" % console_name)
    nodes = slurm_nodes(run)
    matches = []
    for fields in nodes:
        name = fields.get("NodeName", "")
        own = {form for key in ("NodeHostName", "NodeAddr", "NodeName") for form in _host_forms(fields.get(key, ""))}
        hit = sorted(wanted & own)
        if name and _NODE_NAME.match(name) and hit:
            matches.append((name, hit[0]))
    exact = [match for match in matches if match[0] == console_name]
    if exact:
        return exact[0]
    if len(matches) == 1:
        return matches[0]
    hosts = ", ".join(sorted(wanted))
    if not matches:
        raise SlurmUnavailable("Slurm has no node on host %s (of the %d it lists)" % (hosts, len(nodes)))
    raise SlurmUnavailable(
        "%d Slurm nodes run on host %s (%s): none is named %s"
        % (len(matches), hosts, ", ".join(name for name, _ in matches), console_name)
    )


def node_state(name: str, run: Run = subprocess.run) -> dict:
    """The `scontrol -o show node NAME` fields (State, Reason ...) of node `name`."""
    if not _NODE_NAME.match(name or ""):
        raise SlurmUnavailable("%r is not a Slurm node name" % name)
    text = _scontrol(["-o", "show", "node", name], run)
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    fields = parse_job_fields(line)
    # Reason= holds spaces: take everything after it up to the next known key.
    match = re.search(r"\bReason=(.*?)(?: \w+=|$)", line)
    if match:
        fields["Reason"] = match.group(1).strip()
    return fields
