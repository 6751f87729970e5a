"""One process's details, read on its node when the console asks (`enter` in the Processes pane).

What a frame does not carry, because it costs a read per process or is private: the whole
command line, the rank variables of its environment (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR ... only those), its cgroup and working directory. Shipped in a small bundle
(nodes/bundle.py: helper_bundle) and run as `python3 -I - PID [START_TIME]`; prints one JSON
object. Every read is bounded and a part that cannot be read (gone, another user's environment)
is an error string, not a failure.

With START_TIME (epoch seconds, what the console's frame said), a process that started at
another time is a later owner of the PID: `moved` is set and nothing of it is read.

Stdlib only, Python 3.6 syntax.
"""

import json
import os
import sys
from typing import Any, Dict, List, Optional

from opsconsole.probe.proc_read import START_SLACK_S, STAT_LIMIT, boot_time, read_prefix, split_stat, start_time_of

CMDLINE_LIMIT = 65536  # bytes of /proc/PID/cmdline read (the kernel's own page-sized cap is far above a real one)
ENVIRON_LIMIT = 1 << 20  # bytes of /proc/PID/environ read
CGROUP_LIMIT = 16384
MAX_ARGS = 256
ARG_CHARS = 4096
VALUE_CHARS = 256
MAX_CGROUP_LINES = 64
CGROUP_LINE_CHARS = 512
# The variables that place a process in a distributed job (torchrun, Slurm, MPI) and pick its GPUs.
RANK_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "CUDA_VISIBLE_DEVICES",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_JOB_USER",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
)


def _why(exc):
    # type: (BaseException) -> str
    return getattr(exc, "strerror", None) or type(exc).__name__


def _text(data, limit):
    # type: (bytes, int) -> str
    return data.decode("utf-8", "replace")[:limit]


def rank_variables(environ):
    # type: (bytes) -> dict
    """The RANK_VARIABLES set in a /proc/PID/environ image (NUL-separated NAME=value)."""
    found = {}
    wanted = set(RANK_VARIABLES)
    for entry in environ.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            key = name.decode("ascii", "replace")
            if key in wanted:
                found[key] = _text(value, VALUE_CHARS)
    return found


def read_details(
    pid: int, proc_root: str = "/proc", expected_start: Optional[float] = None, slack_s: float = START_SLACK_S
) -> Dict[str, Any]:
    """What /proc says of `pid`: {"pid", "starttime", "start_time", "state", "args", "args_cut", "rank_env",
    "cgroup", "cwd", "errors"}; with `expected_start`, only {"pid", "starttime", "start_time", "moved"} when
    the process started at another time, more than `slack_s` away (a later owner of the PID: none of its
    details are read)."""
    base = "%s/%d" % (proc_root.rstrip("/"), pid)
    out = {"pid": pid, "errors": {}}  # type: Dict[str, Any]
    errors = out["errors"]
    try:
        _, fields = split_stat(read_prefix(base + "/stat", STAT_LIMIT))
        out["starttime"] = int(fields[19])
        out["start_time"] = start_time_of(out["starttime"], boot_time(proc_root))
        out["state"] = fields[0].decode("ascii", "replace")[:2]
    except (OSError, ValueError, IndexError) as exc:
        errors["stat"] = _why(exc)
        return out  # gone (or never there): nothing else is this process's
    if expected_start is not None and abs(out["start_time"] - expected_start) > slack_s:
        out["moved"] = True
        del out["state"]
        return out
    try:
        raw = read_prefix(base + "/cmdline", CMDLINE_LIMIT + 1)
        args = raw[:CMDLINE_LIMIT].rstrip(b"\0").split(b"\0") if raw else []
        out["args"] = [_text(arg, ARG_CHARS) for arg in args[:MAX_ARGS]]
        out["args_cut"] = len(raw) > CMDLINE_LIMIT or len(args) > MAX_ARGS
    except OSError as exc:
        errors["cmdline"] = _why(exc)
    try:
        out["rank_env"] = rank_variables(read_prefix(base + "/environ", ENVIRON_LIMIT))
    except OSError as exc:
        errors["environ"] = _why(exc)  # another user's process: only its owner and root may read it
    try:
        lines = read_prefix(base + "/cgroup", CGROUP_LIMIT).decode("utf-8", "replace").splitlines()
        out["cgroup"] = [line[:CGROUP_LINE_CHARS] for line in lines[:MAX_CGROUP_LINES]]
    except OSError as exc:
        errors["cgroup"] = _why(exc)
    try:
        out["cwd"] = os.readlink(base + "/cwd")[:ARG_CHARS]
    except OSError as exc:
        errors["cwd"] = _why(exc)
    return out


def main(args: List[str]) -> int:
    """`PID [START_TIME [SLACK_S]]` (what follows `python3 -I -`): one JSON line on stdout."""
    try:
        pid = int(args[0])
        expected = float(args[1]) if len(args) > 1 else None
        slack = float(args[2]) if len(args) > 2 else START_SLACK_S
    except (IndexError, ValueError):
        sys.stdout.write(json.dumps({"errors": {"pid": "usage: PID [START_TIME [SLACK_S]]"}}) + "\n")
        return 2
    answer = read_details(pid, expected_start=expected, slack_s=slack)
    sys.stdout.write(json.dumps(answer, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
