"""Finding a node's training ranks and dumping each one's Python stack with py-spy, on the node.

The console ships this file over a node's SSH connection as source (`python3 -I -S -u -c SOURCE`, as
delete_units.py travels) and runs the same source in a subprocess for its own machine, so both
take one code path.

Ranks: processes whose /proc/PID/environ holds RANK or LOCAL_RANK (or an MPI launcher's
OMPI_COMM_WORLD_RANK, PMI_RANK; read bounded, values checked as small integers). A data-loader worker forked from a rank inherits its environment: of processes
with the same rank identity (RANK, LOCAL_RANK, WORLD_SIZE, run id, master port) only the outermost
Python one counts, a non-Python wrapper (a shell) gives way to the Python rank below it, and a
launcher with a RANK of its own (torchrun under Kubeflow gets the node's) is not a rank. With no
such process, the GPU compute processes stand in: those the console's frame listed, else
`nvidia-smi --query-compute-apps=pid`. Explicit
PIDs in the request replace the search. Each rank says which job it is in (job_of: its rendezvous
master, torchelastic run, Slurm job or MPI namespace), so the console compares ranks within a job.

Each rank gets `py-spy dump --pid P --json` (`--native` on request), several at once, each with its
own timeout. py-spy's output travels as text, cut at MAX_DUMP_CHARS: the console parses and checks
it (it is input from a node). What the console needs to explain a failure comes along: where py-spy
was looked for, kernel.yama.ptrace_scope, the uid and whether CAP_SYS_PTRACE is held.

Protocol: one JSON request line on stdin
    {"pids": [P, ...] or null, "native": bool, "timeout": seconds, "py_spy": path or null,
     "gpu_pids": [P, ...] or null (the GPU compute processes the console saw, for when no rank is found)}
and JSON lines on stdout: {"kind": "node", ...} first, one {"kind": "rank", ...} per process as
its dump ends, {"kind": "done", "seconds": s} last.
Stdlib only, Python 3.6+ syntax (probe/ rules).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

MAX_REQUEST_BYTES = 64 * 1024
MAX_ENVIRON_BYTES = 256 * 1024  # of one process's /proc/PID/environ
MAX_CMD_CHARS = 512
MAX_DUMP_CHARS = 2 * 1024 * 1024  # py-spy's JSON for one process (deep stacks, many threads)
MAX_STDERR_CHARS = 2000
MAX_PIDS = 4096
MAX_RANK = 10**7
MAX_PARALLEL_DUMPS = 16
DEFAULT_TIMEOUT_S = 10.0
MAX_TIMEOUT_S = 300.0
ANCESTOR_DEPTH = 64
CAP_SYS_PTRACE = 19
# torch.distributed's launchers set RANK/LOCAL_RANK/WORLD_SIZE per process; MPI launchers (mpirun,
# DeepSpeed's MPI mode) set their own per process, read when RANK is absent.
RANK_NAMES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_NAMES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_SIZE_NAMES = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
RANK_KEYS = RANK_NAMES + LOCAL_RANK_NAMES + WORLD_SIZE_NAMES + ("GROUP_RANK", "TORCHELASTIC_RUN_ID", "MASTER_PORT")
# Which job a rank belongs to (a node may run several: two 4-GPU jobs on an 8-GPU node): its rendezvous
# master (every launcher of torch.distributed sets MASTER_ADDR/MASTER_PORT, the same on every node of a
# job), else torchelastic's run id, Slurm's job and step, PMIx's namespace (one per MPI job).
JOB_KEYS = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "PMIX_NAMESPACE")
MAX_JOB_CHARS = 120
_PYTHON_NAME = re.compile(r"^(python|pypy)[0-9.]*[dmu]*$")


def read_bounded(path, limit):
    """The first `limit` bytes of a file, None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError:
        return None


def small_int(text):
    """`text` as an integer in 0..MAX_RANK, None for anything else."""
    if text is None or not re.match(r"^[0-9]{1,8}$", text):
        return None
    value = int(text)
    return value if value <= MAX_RANK else None


def environ_of(pid):
    """The variables of RANK_KEYS and PATH of a process ({} when unreadable)."""
    data = read_bounded("/proc/%d/environ" % pid, MAX_ENVIRON_BYTES)
    found = {}
    if not data:
        return found
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if not sep:
            continue
        name = name.decode("ascii", "replace")
        if name in RANK_KEYS or name in JOB_KEYS or name == "PATH":
            found[name] = value[:4096].decode("utf-8", "replace")
    return found


def stat_fields(pid):
    """/proc/PID/stat after the name: [state, ppid, ...] ([] when unreadable)."""
    data = read_bounded("/proc/%d/stat" % pid, 4096)
    if not data:
        return []
    return data[data.rfind(b")") + 2 :].split()  # the name in (...) may hold spaces and parentheses


def parent_of(pid):
    fields = stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def state_of(pid):
    """The process state letter (R, S, D, T, Z, ...), None when unreadable."""
    fields = stat_fields(pid)
    return fields[0].decode("ascii", "replace")[:1] if fields else None


def cmdline_of(pid):
    data = read_bounded("/proc/%d/cmdline" % pid, MAX_CMD_CHARS * 4)
    if not data:
        return []
    return [word.decode("utf-8", "replace") for word in data.split(b"\0") if word][:64]


def is_python(pid, argv):
    try:
        exe = os.path.basename(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        exe = os.path.basename(argv[0]) if argv else ""
    return bool(_PYTHON_NAME.match(exe))


def ancestors_of(pid):
    chain = []
    current = pid
    for _ in range(ANCESTOR_DEPTH):
        current = parent_of(current)
        if current is None or current <= 1:
            break
        chain.append(current)
    return chain


def all_pids():
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return sorted(int(name) for name in names if name.isdigit())


def rank_identity(env):
    return tuple(env.get(key) for key in RANK_KEYS if key != "PATH")


def first_int(env, names):
    """The first of `names` set to a small integer in `env`, None when none is."""
    for name in names:
        value = small_int(env.get(name))
        if value is not None:
            return value
    return None


def job_of(env):
    """Which job the process belongs to, in words ("job at 10.0.0.5:29500"), None when its environment
    does not say: ranks of different jobs are grouped apart, and their numbers compared only within one."""
    port = small_int(env.get("MASTER_PORT"))
    run = env.get("TORCHELASTIC_RUN_ID")
    slurm_job = env.get("SLURM_JOB_ID") or ""
    if port is not None:
        job = "job at %s:%d" % (env.get("MASTER_ADDR") or "?", port)
    elif run and run != "none":  # torchrun's default --rdzv-id is "none": no job of its own
        job = "torchelastic run %s" % run
    elif re.match(r"^[0-9]{1,12}$", slurm_job):
        step = small_int(env.get("SLURM_STEP_ID"))
        job = "Slurm job %s%s" % (slurm_job, "" if step is None else ".%d" % step)
    elif env.get("PMIX_NAMESPACE"):
        job = "MPI job %s" % env["PMIX_NAMESPACE"]
    else:
        return None
    return job[:MAX_JOB_CHARS]


def describe(pid, env, argv):
    return {
        "pid": pid,
        "rank": first_int(env, RANK_NAMES),
        "local_rank": first_int(env, LOCAL_RANK_NAMES),
        "world_size": first_int(env, WORLD_SIZE_NAMES),
        "job": job_of(env),
        "cmd": " ".join(argv)[:MAX_CMD_CHARS],
    }


def find_ranks():
    """The training ranks of this machine by their environment (see the module docstring)."""
    own = set([os.getpid()] + ancestors_of(os.getpid()))
    candidates = {}
    for pid in all_pids():
        if pid in own:
            continue
        env = environ_of(pid)
        if first_int(env, RANK_NAMES) is None and first_int(env, LOCAL_RANK_NAMES) is None:
            continue
        argv = cmdline_of(pid)
        if not argv:  # a kernel thread or a process that just exited
            continue
        candidates[pid] = (env, argv, is_python(pid, argv), ancestors_of(pid))
    kept = []
    for pid, (env, _argv, _python, ancestors) in candidates.items():
        identity = rank_identity(env)
        inside_python_rank = any(
            a in candidates and candidates[a][2] and rank_identity(candidates[a][0]) == identity for a in ancestors
        )
        if not inside_python_rank:
            kept.append(pid)
    ranks = []
    for pid in kept:
        env, argv, python, _ = candidates[pid]
        below = [other for other in kept if other != pid and pid in candidates[other][3]]
        # A shell that execs the rank's Python passes its identity down: the Python one is the rank.
        wraps_a_rank = not python and any(rank_identity(candidates[o][0]) == rank_identity(env) for o in below)
        # A launcher that carries a RANK of its own (a node rank, as Kubeflow sets for torchrun) starts
        # ranks with other identities: it is not one of them.
        launches_ranks = any(rank_identity(candidates[o][0]) != rank_identity(env) for o in below)
        if not wraps_a_rank and not launches_ranks:
            ranks.append(describe(pid, env, argv))
    return ranks


def gpu_compute_pids(timeout):
    """PIDs of the GPU compute processes, from nvidia-smi ([] when there is none or it fails)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run(
            [smi, "--query-compute-apps=pid", "--format=csv,noheader,nounits"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    pids = []
    for line in done.stdout.decode("ascii", "replace").splitlines()[:MAX_PIDS]:
        value = small_int(line.strip())
        if value and value not in pids:
            pids.append(value)
    return pids


def executable(path):
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def find_py_spy(explicit, ranks, envs):
    """py-spy: the requested path, else PATH, beside this Python, beside each rank's Python, its PATH."""
    places = []
    if explicit:
        return (explicit if executable(explicit) else None), [explicit]
    found = shutil.which("py-spy")
    places.append("PATH")
    if found:
        return found, places
    dirs = [os.path.dirname(sys.executable), os.path.expanduser("~/.local/bin"), "/usr/local/bin"]
    for rank in ranks:
        argv0 = rank["cmd"].split(" ")[0] if rank["cmd"] else ""
        if os.path.isabs(argv0):
            dirs.append(os.path.dirname(argv0))
        dirs.extend((envs.get(rank["pid"], {}).get("PATH") or "").split(os.pathsep))
    for directory in dirs:
        if not directory or not os.path.isabs(directory):
            continue
        if directory not in places:
            places.append(directory)
        candidate = os.path.join(directory, "py-spy")
        if executable(candidate):
            return candidate, places
    return None, places


def ptrace_facts():
    facts = {"uid": os.getuid(), "ptrace_scope": None, "cap_sys_ptrace": None}
    scope = read_bounded("/proc/sys/kernel/yama/ptrace_scope", 16)
    if scope is not None:
        facts["ptrace_scope"] = small_int(scope.decode("ascii", "replace").strip())
    status = read_bounded("/proc/self/status", 16384)
    if status:
        for line in status.decode("ascii", "replace").splitlines():
            if line.startswith("CapEff:"):
                try:
                    facts["cap_sys_ptrace"] = bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
                except (IndexError, ValueError):
                    pass
    return facts


def dump_one(py_spy, rank, native, timeout):
    """py-spy's JSON for one rank, with how it went (status ok, timeout, failed, gone)."""
    pid = rank["pid"]
    answer = dict(rank, kind="rank", status="failed", exit=None, stdout="", stderr="", seconds=0.0)
    if not os.path.exists("/proc/%d" % pid):
        answer.update(status="gone", stderr="no process %d" % pid)
        return answer
    argv = [py_spy, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
    before = state_of(pid)  # py-spy's attach and detach can wake a stopped process: its state after may not say
    started = time.monotonic()
    try:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        answer.update(stderr="cannot run %s: %s" % (py_spy, exc))
        return answer
    try:
        out, err = process.communicate(timeout=timeout)
        status = "ok" if process.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        status = "timeout"
    answer.update(
        status=status,
        exit=process.returncode,
        stdout=out[:MAX_DUMP_CHARS].decode("utf-8", "replace"),
        truncated=len(out) > MAX_DUMP_CHARS,
        stderr=err.decode("utf-8", "replace")[-MAX_STDERR_CHARS:],
        seconds=round(time.monotonic() - started, 4),
    )
    if status == "ok" and not os.path.exists("/proc/%d" % pid):
        answer["status"] = "gone"
    if status != "ok":
        # D (uninterruptible I/O) or T (stopped) explain a failed dump: as it is now, else as py-spy found it
        state = state_of(pid)
        if state not in ("D", "T", "t", "Z", None) and before in ("D", "T", "t"):
            state = before
        answer["state"] = state
    return answer


def read_request(stdin):
    line = stdin.readline(MAX_REQUEST_BYTES + 1)
    try:
        request = json.loads(line.decode("utf-8")) if line else {}
    except ValueError:
        request = {}
    return request if isinstance(request, dict) else {}


def checked_pids(value):
    if not isinstance(value, list):
        return None
    pids = []
    for item in value[:MAX_PIDS]:
        if isinstance(item, int) and not isinstance(item, bool) and 0 < item <= 2**31 and item not in pids:
            pids.append(item)
    return pids


def collect(request, emit):
    """Find the ranks, dump each, and hand every answer line (a dict) to `emit`."""
    started = time.monotonic()
    timeout = request.get("timeout")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= MAX_TIMEOUT_S:
        timeout = DEFAULT_TIMEOUT_S
    native = request.get("native") is True
    pids = checked_pids(request.get("pids"))
    envs = {}
    if pids:
        source = "pids"
        ranks = []
        for pid in pids:
            envs[pid] = environ_of(pid)
            ranks.append(describe(pid, envs[pid], cmdline_of(pid)))
    else:
        source = "environ"
        ranks = find_ranks()
        for rank in ranks:
            envs[rank["pid"]] = environ_of(rank["pid"])
        if not ranks:
            # The console's frame already lists the GPU compute processes (NVML); nvidia-smi without it.
            source = "gpu"
            gpu_pids = checked_pids(request.get("gpu_pids")) or gpu_compute_pids(timeout)
            ranks = [
                describe(pid, environ_of(pid), cmdline_of(pid)) for pid in gpu_pids if os.path.exists("/proc/%d" % pid)
            ]
    explicit = request.get("py_spy") if isinstance(request.get("py_spy"), str) else None
    py_spy, looked = find_py_spy(explicit, ranks, envs)
    head = {
        "kind": "node",
        "source": source,
        "ranks": len(ranks),
        "py_spy": py_spy,
        "looked_in": looked[:20],
        "python": sys.version.split()[0],
    }
    head.update(ptrace_facts())
    emit(head)
    if py_spy is not None and ranks:
        lock = threading.Lock()
        todo = list(ranks)

        def work():
            while True:
                with lock:
                    if not todo:
                        return
                    rank = todo.pop(0)
                answer = dump_one(py_spy, rank, native, timeout)
                with lock:
                    emit(answer)

        # More dumps at once than the node has cores only queue behind each other (each one stops its rank).
        # Plain threads: concurrent.futures costs the helper's start 20 ms more.
        workers = [
            threading.Thread(target=work)
            for _ in range(max(1, min(MAX_PARALLEL_DUMPS, os.cpu_count() or 1, len(ranks))))
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    elif ranks:
        for rank in ranks:
            emit(dict(rank, kind="rank", status="no-py-spy", exit=None, stdout="", stderr="", seconds=0.0))
    emit({"kind": "done", "seconds": round(time.monotonic() - started, 4)})


def main(stdin=None, stdout=None):
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout
    request = read_request(stdin)

    def emit(answer):
        stdout.write(json.dumps(answer) + "\n")
        stdout.flush()

    collect(request, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
