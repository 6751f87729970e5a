"""Host processes: all of them (kernel threads flagged), and GPU compute processes joined with their host info.

Every process is reported, not a top few by CPU: an idle or D-state process (a hung data
loader worker) must stay listed, not flicker in and out with its CPU. Beyond `limit`
processes (a bound on the frame), D-state ones go first, then the busiest.

Per-tick cost matters (every second on every node), so the /proc path reads one file per
process per tick (/proc/PID/stat: state, flags, CPU ticks, threads, RSS, start time) and
reads status and cmdline once per (pid, start time), so a reused pid never inherits another
process's identity; a sleeping process is re-read every idle_every ticks and its sample
object reused in between. Host processes carry their start time, not their elapsed time,
so an unchanged process is an unchanged item in the delta stream (probe/wire_delta.py).
psutil is the path where /proc is not mounted (or when asked for); it costs more per process.
"""

import dataclasses
import heapq
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from opsconsole.model import ProcessSample
from opsconsole.probe.jobs import JobInfo, read_job

try:
    _CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
except (AttributeError, ValueError, OSError):  # not on Linux
    _CLOCK_TICKS = 100
try:
    _PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
except (AttributeError, ValueError, OSError):
    _PAGE_SIZE = 4096
# A command line longer than this is cut: the console shows one line, and frames stay small.
MAX_COMMAND_CHARS = 512
# Host processes one frame carries at most (model.LIST_LIMITS allows 10000): a node with more
# sends its D-state processes and then the busiest.
MAX_HOST_PROCESSES = 5000
PF_KTHREAD = 0x00200000  # /proc/PID/stat flags: a kernel thread
BOOT_STEP_S = 1.0  # a change in (now - uptime) past this is the wall clock stepped, not jitter


# --- pure parsers --------------------------------------------------------------


def parse_pid_stat(text: str) -> Dict[str, Any]:
    """The fields of /proc/PID/stat the probe uses (comm may hold spaces and parentheses)."""
    head, _, tail = text.rpartition(")")
    comm = head.partition("(")[2]
    fields = tail.split()
    # Indices into `fields`, which starts at field 3 (state) of proc(5).
    return {
        "pid": int(head.split(None, 1)[0]),
        "comm": comm,
        "state": fields[0],
        "ppid": int(fields[1]),
        "flags": int(fields[6]),
        "utime": int(fields[11]),
        "stime": int(fields[12]),
        "threads": int(fields[17]),
        "starttime": int(fields[19]),
        "rss_pages": int(fields[21]),
    }


def parse_pid_status(text: str) -> Dict[str, Any]:
    """Name, state letter, real uid, thread count and RSS bytes from /proc/PID/status."""
    values: Dict[str, Any] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        rest = rest.strip()
        if key == "Name":
            values["name"] = rest
        elif key == "State":
            values["state"] = rest[:1]
        elif key == "Uid":
            values["uid"] = int(rest.split()[0])
        elif key == "Threads":
            values["threads"] = int(rest)
        elif key == "VmRSS":
            values["rss_bytes"] = int(rest.split()[0]) * 1024
    return values


# Variables of a training process's environment worth a finding when set (see health.telemetry).
WATCHED_ENV = ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "CUDA_VISIBLE_DEVICES")


def read_watched_env(data: bytes) -> Tuple[str, ...]:
    """The "NAME=value" entries of WATCHED_ENV in a /proc/PID/environ image (NUL-separated)."""
    found = []
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name.decode("ascii", "replace") in WATCHED_ENV:
            found.append("%s=%s" % (name.decode("ascii", "replace"), value.decode("utf-8", "replace")[:200]))
    return tuple(found)


def parse_cmdline(data: bytes) -> str:
    """The command line from /proc/PID/cmdline (NUL-separated arguments) as one string."""
    args = data.rstrip(b"\0").split(b"\0")
    return " ".join(a.decode("utf-8", "replace") for a in args if a)[:MAX_COMMAND_CHARS]


def is_kernel_thread(flags: int) -> bool:
    """Whether the flags field of /proc/PID/stat marks a kernel thread."""
    return bool(flags & PF_KTHREAD)


def looks_like_kernel_thread(sample: ProcessSample) -> bool:
    """Whether a sample sent without the kernel-thread flag (a probe from before 2026-12-03) is one.

    The /proc reader reads PF_KTHREAD; the psutil reader takes kthreadd (pid 2) and its children.
    Here a kernel thread must also have no command line ("" or ps's "[name]"), so pid 2 in a
    container's pid namespace, a user process, is not one. Probes older still sent no ppid: then
    no command line, no memory of its own (RSS 0) and not a zombie (which has neither either).
    """
    if sample.command not in ("", "[%s]" % sample.name):
        return False
    if sample.pid == 2 or sample.ppid == 2:
        return True
    if sample.ppid is not None:
        return False
    return sample.rss_bytes == 0 and sample.state not in ("Z", "X")


def top_by_cpu(rows: Sequence[ProcessSample], limit: int) -> Tuple[ProcessSample, ...]:
    """The `limit` rows with the most CPU %, ties broken by RSS then pid (None counts as 0)."""
    ranked = sorted(rows, key=lambda r: (-(r.cpu_percent or 0.0), -(r.rss_bytes or 0), r.pid))
    return tuple(ranked[: max(0, limit)])


def _first(item: Tuple[int, Any]) -> int:
    return item[0]


def _report_rank(item: Tuple[int, Tuple[Optional[float], int, Any, bool]]) -> Tuple[bool, float, int, int]:
    """Which processes a frame keeps when there are more than it carries: D state, then CPU, RSS, pid."""
    pid, (cpu, rss, payload, _) = item
    if isinstance(payload, ProcessSample):
        state = payload.state
        stuck = state == "D"
    else:
        data, rparen = payload
        stuck = data[rparen + 2 : rparen + 3] == b"D"
    return (not stuck, -(cpu or 0.0), -rss, pid)


# --- reading one process ---------------------------------------------------------


def _read_bytes(path: str) -> bytes:
    # os.read on a raw fd: no buffered-file object per process, which shows at 1000 processes.
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks: List[bytes] = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _user_name(uid: int, cache: Dict[int, str]) -> str:
    name = cache.get(uid)
    if name is None:
        try:
            import pwd  # not on every platform; cached because LDAP lookups can be slow

            name = pwd.getpwuid(uid).pw_name
        except (ImportError, KeyError):
            name = str(uid)
        cache[uid] = name
    return name


# Per-process CPU counters kept between samples: pid -> (starttime, cpu ticks, monotonic time).
_Counters = Dict[int, Tuple[int, int, float]]


def _cpu_since(
    prev: Optional[Tuple[int, int, float]], starttime: int, ticks: int, now: float, elapsed: float, first: bool
) -> Optional[float]:
    """CPU % of one core since the previous reading; a process new since then: over its lifetime."""
    if prev is not None and prev[0] == starttime and now > prev[2]:
        return max(0.0, 100.0 * (ticks - prev[1]) / _CLOCK_TICKS / (now - prev[2]))
    if first or elapsed <= 0:
        return None  # no baseline yet
    # Started since the last sample (or a reused pid): its whole life is inside this interval.
    return min(100.0 * ticks / _CLOCK_TICKS / elapsed, 100.0 * 1024)


class ProcessTable:
    """Keeps per-process CPU counters between calls so CPU % is a delta, not a lifetime average.

    sample(limit) ranks every process by CPU % since the previous sample (first call: CPU %
    None, ranked by RSS); join(gpu_procs) fills host fields of GPU compute processes, reusing
    the rows of the sample taken this tick when there is one. Neither raises: an unreadable
    process is left out of the top list, and a GPU process that cannot be seen keeps its GPU
    fields with state None.

    use_psutil: None reads /proc when it is mounted (cheapest), psutil otherwise; True
    prefers psutil; False always reads `proc_root` (a directory of files works too).
    idle_every: on the /proc path, a process that used no CPU in its last reading is
    re-read only every idle_every-th sample (1: every sample), which cuts the per-tick
    cost about that much on a node of mostly sleeping processes; it shows up within
    idle_every ticks when it wakes (or turns D).
    """

    def __init__(
        self,
        use_psutil: Optional[bool] = None,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
        idle_every: int = 3,
    ) -> None:
        self.proc_root = proc_root
        self._prefix = proc_root.rstrip("/") + "/"
        self._clock = clock
        self._psutil: Any = None
        if use_psutil or (use_psutil is None and not os.path.isdir(os.path.join(proc_root, "self"))):
            try:
                import psutil  # lazily: compute nodes may not have it
            except ImportError:
                psutil = None
            self._psutil = psutil
        self._counters: _Counters = {}
        self._identity: Dict[Tuple[int, int], Tuple[Optional[str], str]] = {}
        self._users: Dict[int, str] = {}
        self._envs: Dict[Tuple[int, int], Optional[Tuple[str, ...]]] = {}
        self._jobs: Dict[Tuple[int, int], JobInfo] = {}
        # pid -> (cpu %, rss bytes, payload to build the ProcessSample from, read this tick).
        self._rows: Dict[int, Tuple[Optional[float], int, Any, bool]] = {}
        self.idle_every = max(1, int(idle_every))
        self._tick = 0
        self._sample_uptime = 0.0
        self._booted_at: Optional[float] = None
        self._built: Dict[int, Tuple[Any, ProcessSample]] = {}  # pid -> (payload, sample) of the last sample
        self._rows_unjoined = False
        self._sampled_once = False
        self.last_errors: Tuple[str, ...] = ()

    @property
    def source(self) -> str:
        """ "psutil" or "proc"."""
        return "psutil" if self._psutil is not None else "proc"

    # -- public ---------------------------------------------------------------

    def sample(self, limit: int = MAX_HOST_PROCESSES) -> Tuple[ProcessSample, ...]:
        """The host's processes in pid order (at most `limit`: D state first, then by CPU %); CPU % None on the first call.

        CPU % is since the previous sample. A process not re-read this tick (idle, see
        idle_every) is the same ProcessSample object as last time.
        """
        try:
            rows = self._sample_psutil() if self._psutil is not None else self._sample_proc()
            self.last_errors = ()
        except Exception as exc:  # e.g. /proc unreadable: an empty list, reported
            rows = {}
            self.last_errors = ("procs: %s: %s" % (type(exc).__name__, exc),)
        self._rows = rows
        self._rows_unjoined = True
        self._sampled_once = True
        limit = max(0, limit)
        chosen: Any = rows.items()
        if len(rows) > limit:
            chosen = heapq.nsmallest(limit, chosen, key=_report_rank)
        built, self._built = self._built, {}
        out = []
        for pid, row in sorted(chosen, key=_first):  # pid order: unchanged runs stay runs in the delta
            payload = row[2]
            kept = built.get(pid)
            if kept is not None and kept[0] is payload:
                sample = kept[1]  # not re-read this tick: the same object (and the same delta item)
            else:
                try:
                    sample = self._build(pid, row, identity=True)
                except Exception:
                    continue  # a malformed line for one process: leave it out
            self._built[pid] = (payload, sample)
            out.append(sample)
        return tuple(out)

    def prime(self) -> None:
        """Take the CPU baseline now, so the next sample() has percentages."""
        self.sample(0)

    def join(self, gpu_procs: Sequence[ProcessSample]) -> Tuple[ProcessSample, ...]:
        """GPU compute processes with user, name, command, CPU %, RSS, elapsed, state and threads filled."""
        rows = self._rows if self._rows_unjoined else {}
        self._rows_unjoined = False  # a second join this tick reads afresh, with its own delta
        if not self._sampled_once:
            # Join-only use: the counters hold just GPU processes; forget those that left.
            self._forget_except({proc.pid: True for proc in gpu_procs})
        joined = []
        for proc in gpu_procs:
            try:
                raw = rows.get(proc.pid)
                # A held idle row is up to idle_every ticks old: read that process again.
                row = (
                    self._build(proc.pid, raw, elapsed=True) if raw is not None and raw[3] else self._read_one(proc.pid)
                )
                if row is None:
                    joined.append(dataclasses.replace(proc, state=None))
                    continue
                row = self._with_identity(row)
                job = self._job(proc.pid)
                joined.append(
                    dataclasses.replace(
                        proc,
                        job_id=job.job_id,
                        job_step=job.job_step,
                        job_user=job.job_user if job.job_uid is None else _user_name(job.job_uid, self._users),
                        container=job.container,
                        name=row.name or proc.name,
                        user=row.user,
                        command=row.command or proc.command,
                        cpu_percent=row.cpu_percent,
                        rss_bytes=row.rss_bytes,
                        elapsed_s=row.elapsed_s,
                        state=row.state,
                        threads=row.threads,
                        ppid=row.ppid,
                        watched_env=self._watched_env(proc.pid),
                    )
                )
            except Exception:  # a process changing under us: keep what NVML said
                joined.append(dataclasses.replace(proc, state=None))
        return tuple(joined)

    def _job(self, pid: int) -> JobInfo:
        """The Slurm job and container of a GPU process, read once per (pid, start time)."""
        counters = self._counters.get(pid)
        key = (pid, counters[0] if counters is not None else 0)
        job = self._jobs.get(key)
        if job is None:
            job = read_job(pid, self._prefix)
            if len(self._jobs) > 256:  # bounded: GPU processes come and go
                self._jobs.clear()
            self._jobs[key] = job
        return job

    def _watched_env(self, pid: int) -> Optional[Tuple[str, ...]]:
        """WATCHED_ENV of a GPU process, read once per (pid, start time); None when not permitted."""
        counters = self._counters.get(pid)
        key = (pid, counters[0] if counters is not None else 0)
        if key in self._envs:
            return self._envs[key]
        try:
            env: Optional[Tuple[str, ...]] = read_watched_env(_read_bytes(self._prefix + "%d/environ" % pid))
        except OSError:  # another user's process, or gone
            env = None
        if len(self._envs) > 256:  # bounded: GPU processes come and go
            self._envs.clear()
        self._envs[key] = env
        return env

    def _build(
        self, pid: int, row: Tuple[Optional[float], int, Any, bool], elapsed: bool = False, identity: bool = False
    ) -> ProcessSample:
        """The ProcessSample of a sampled row; with `elapsed`, elapsed_s too (GPU processes keep it);
        with `identity`, user and command line too (one object built, not two)."""
        cpu, rss, payload, _ = row
        if isinstance(payload, ProcessSample):
            sample = payload if elapsed else dataclasses.replace(payload, elapsed_s=None)
            return self._with_identity(sample) if identity else sample
        data, rparen = payload
        fields = data[rparen + 2 :].split()  # again: rows keep the line, not its ~50 split fields
        started = int(fields[19]) / float(_CLOCK_TICKS)
        name = data[data.index(b"(") + 1 : rparen].decode("utf-8", "replace")
        user, command = self._identity_of(pid, name) if identity else (None, "")
        return ProcessSample(
            pid=pid,
            name=name,
            user=user,
            command=command,
            cpu_percent=round(cpu, 1) if cpu is not None else None,
            rss_bytes=rss,
            elapsed_s=round(max(0.0, self._sample_uptime - started), 1) if elapsed else None,
            state=fields[0].decode("ascii", "replace"),
            threads=int(fields[17]),
            ppid=int(fields[1]),
            start_time=round(self._boot_time(self._sample_uptime) + started, 2),
            kernel_thread=is_kernel_thread(int(fields[6])),
        )

    def _boot_time(self, uptime: float) -> float:
        """Epoch seconds of the node's boot, kept between ticks: start times computed from it stay put."""
        if self._booted_at is None:
            self._booted_at = round(time.time() - uptime, 2)
        return self._booted_at

    # -- /proc path ---------------------------------------------------------------

    def _uptime(self) -> float:
        uptime = float(_read_bytes(self._prefix + "uptime").split()[0])
        # Reckoned again when the wall clock was stepped (NTP at boot, a VM resumed): the signal check
        # (checked_signal.py) reckons start times with the clock of the moment and refuses a frame's
        # that are off by more than START_SLACK_S. Jitter (well under BOOT_STEP_S) keeps the old one.
        reckoned = time.time() - uptime
        if self._booted_at is None or abs(reckoned - self._booted_at) > BOOT_STEP_S:
            self._booted_at = round(reckoned, 2)
        return uptime

    def _sample_proc(self) -> Dict[int, Tuple[Optional[float], int, Any, bool]]:
        # The hot loop of the probe (every process, every tick): one open and one read per
        # process, bytes parsed only as far as ranking needs; the rest waits for _build.
        now = self._clock()
        uptime = self._uptime()
        first = not self._sampled_once
        prefix = self._prefix
        prev_counters = self._counters
        prev_rows = self._rows
        counters: _Counters = {}
        rows: Dict[int, Tuple[Optional[float], int, Any, bool]] = {}
        hz = float(_CLOCK_TICKS)
        page = _PAGE_SIZE
        scale = 100.0 / hz
        self._tick += 1
        tick, idle_every = self._tick, self.idle_every
        self._sample_uptime = uptime
        for entry in os.listdir(self.proc_root):
            if not entry.isdigit():
                continue
            if idle_every > 1:
                # Most processes sleep: one that used no CPU last time is re-read only every
                # idle_every-th tick (staggered by pid); its next delta spans the gap, so stays right.
                pid = int(entry)
                held = prev_rows.get(pid)
                if held is not None and held[0] == 0.0 and (pid + tick) % idle_every and pid in prev_counters:
                    counters[pid] = prev_counters[pid]
                    rows[pid] = (0.0, held[1], held[2], False)
                    continue
            try:
                fd = os.open(prefix + entry + "/stat", os.O_RDONLY)
                try:
                    data = os.read(fd, 4096)  # a stat line is well under 1 KiB
                finally:
                    os.close(fd)
                rparen = data.rindex(b")")
                fields = data[rparen + 2 :].split()
                ticks = int(fields[11]) + int(fields[12])
                starttime = int(fields[19])
                rss = int(fields[21]) * page
            except (OSError, ValueError, IndexError):
                continue  # gone since listdir, or not ours to read
            pid = int(entry)
            prev = prev_counters.get(pid)
            cpu: Optional[float]
            if prev is not None and prev[0] == starttime and now > prev[2]:
                cpu = (ticks - prev[1]) * scale / (now - prev[2])  # the common case, inlined
            else:
                cpu = _cpu_since(prev, starttime, ticks, now, uptime - starttime / hz, first)
            counters[pid] = (starttime, ticks, now)
            # The line kept between polls, not its split fields: ~0.3 kB a process instead of ~2.5 kB
            # (a node's every process is held); the few built into rows split it again.
            rows[pid] = (cpu, rss, (data, rparen), True)
        self._counters = counters  # processes that exited are forgotten here
        self._forget_identities(counters)
        return rows

    def _forget_except(self, live: Dict[int, Any]) -> None:
        for pid in [p for p in self._counters if p not in live]:
            del self._counters[pid]
        self._forget_identities(live)

    def _forget_identities(self, live: Dict[int, Any]) -> None:
        # Bounded memory: drop identities of processes that are gone.
        if len(self._identity) > len(live):
            for key in [k for k in self._identity if k[0] not in live]:
                del self._identity[key]

    def _read_one(self, pid: int) -> Optional[ProcessSample]:
        """One process read afresh (a GPU process the last sample did not include)."""
        if self._psutil is not None:
            return self._psutil_row(pid, self._clock(), first=False)
        try:
            text = _read_bytes(self._prefix + "%d/stat" % pid).decode("utf-8", "replace")
            stat = parse_pid_stat(text)
            uptime = self._uptime()
        except (OSError, ValueError, IndexError):
            return None  # gone, or not visible in this PID namespace
        now = self._clock()
        ticks = stat["utime"] + stat["stime"]
        elapsed = max(0.0, uptime - stat["starttime"] / float(_CLOCK_TICKS))
        cpu = _cpu_since(self._counters.get(pid), stat["starttime"], ticks, now, elapsed, first=False)
        self._counters[pid] = (stat["starttime"], ticks, now)
        return ProcessSample(
            pid=pid,
            name=stat["comm"],
            cpu_percent=round(cpu, 1) if cpu is not None else None,
            rss_bytes=stat["rss_pages"] * _PAGE_SIZE,
            elapsed_s=round(elapsed, 1),
            state=stat["state"],
            threads=stat["threads"],
            ppid=stat["ppid"],
            start_time=round(self._boot_time(uptime) + stat["starttime"] / float(_CLOCK_TICKS), 2),
            kernel_thread=is_kernel_thread(stat["flags"]),
        )

    def _identity_proc(self, pid: int) -> Tuple[Optional[str], str]:
        user: Optional[str] = None
        command = ""
        base = self._prefix + str(pid)
        try:
            status = parse_pid_status(_read_bytes(base + "/status").decode("utf-8", "replace"))
            if "uid" in status:
                user = _user_name(status["uid"], self._users)
        except (OSError, ValueError, IndexError):
            pass
        try:
            command = parse_cmdline(_read_bytes(base + "/cmdline"))
        except OSError:
            pass
        return user, command

    def _with_identity(self, row: ProcessSample) -> ProcessSample:
        """The row with user and command line, read once per (pid, start time)."""
        user, command = self._identity_of(row.pid, row.name)
        return dataclasses.replace(row, user=user, command=command)

    def _identity_of(self, pid: int, name: str) -> Tuple[Optional[str], str]:
        """(user, command line) of `pid`, read once per (pid, start time)."""
        counters = self._counters.get(pid)
        key = (pid, counters[0] if counters is not None else 0)
        identity = self._identity.get(key)
        if identity is None:
            identity = self._identity_psutil(pid) if self._psutil is not None else self._identity_proc(pid)
            if identity[0] is not None or identity[1]:
                self._identity[key] = identity
        user, command = identity
        # Kernel threads have no command line: show [name] as ps does.
        return user, command or "[%s]" % name

    # -- psutil path -------------------------------------------------------------

    def _sample_psutil(self) -> Dict[int, Tuple[Optional[float], int, Any, bool]]:
        now = self._clock()
        first = not self._sampled_once
        rows = {}
        for pid in self._psutil.pids():
            row = self._psutil_row(pid, now, first)
            if row is not None:
                rows[pid] = (row.cpu_percent, row.rss_bytes or 0, row, True)
        self._forget_except(rows)
        return rows

    def _psutil_row(self, pid: int, now: float, first: bool) -> Optional[ProcessSample]:
        psutil = self._psutil
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                times = proc.cpu_times()
                created = proc.create_time()
                name = proc.name()
                status = proc.status()
                rss = proc.memory_info().rss
                threads = proc.num_threads()
                ppid = proc.ppid()
        except Exception:  # NoSuchProcess, AccessDenied, ZombieProcess
            return None
        ticks = int(round((times.user + times.system) * _CLOCK_TICKS))
        starttime = int(round(created * 100))
        elapsed = max(0.0, time.time() - created)
        cpu = _cpu_since(self._counters.get(pid), starttime, ticks, now, elapsed, first)
        self._counters[pid] = (starttime, ticks, now)
        return ProcessSample(
            pid=pid,
            name=name,
            cpu_percent=round(cpu, 1) if cpu is not None else None,
            rss_bytes=rss,
            elapsed_s=round(elapsed, 1),
            state=_PSUTIL_STATES.get(status, status[:1].upper() if status else None),
            threads=threads,
            ppid=ppid,
            start_time=round(created, 2),
            kernel_thread=pid == 2 or ppid == 2,  # kthreadd and its children (Linux)
        )

    def _identity_psutil(self, pid: int) -> Tuple[Optional[str], str]:
        try:
            proc = self._psutil.Process(pid)
            user = proc.username()
        except Exception:
            user = None
        try:
            command = " ".join(self._psutil.Process(pid).cmdline())[:MAX_COMMAND_CHARS]
        except Exception:
            command = ""
        return user, command


# psutil status names back to the letters of /proc/PID/stat, so both paths read alike.
_PSUTIL_STATES = {
    "running": "R",
    "sleeping": "S",
    "disk-sleep": "D",
    "stopped": "T",
    "tracing-stop": "t",
    "zombie": "Z",
    "dead": "X",
    "wake-kill": "K",
    "waking": "W",
    "parked": "P",
    "idle": "I",
    "locked": "L",
    "waiting": "W",
}


# --- module-level conveniences (one shared table, so consecutive calls give deltas) -----

_DEFAULT_TABLE: Optional[ProcessTable] = None
_DEFAULT_LOCK = threading.Lock()


def _default_table() -> ProcessTable:
    global _DEFAULT_TABLE
    if _DEFAULT_TABLE is None:
        _DEFAULT_TABLE = ProcessTable()
    return _DEFAULT_TABLE


def top_processes(limit: int = MAX_HOST_PROCESSES) -> Tuple[ProcessSample, ...]:
    """The host's processes (see ProcessTable.sample) with CPU % since the previous call (first call: None)."""
    with _DEFAULT_LOCK:
        return _default_table().sample(limit)
