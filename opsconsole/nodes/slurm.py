"""Slurm: the nodes a job runs on, asked of `scontrol` on the login node."""

from __future__ import annotations

import re
import subprocess
from typing import Callable, List, Sequence

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
