"""Host readings of the node the probe runs on: CPU, load, memory, swap, disks, network, uptime.

Runs on compute nodes that have only python3 (3.6+): stdlib at import, /proc read directly
where it is mounted, psutil (imported lazily when present) elsewhere. The /proc parsers are
pure functions so the SSH fallback (which cats the same files over a plain exec) can reuse them.

Percentages and rates are deltas between two consecutive reads. The first read only
takes the baseline: CPU percentages are None and `net` is empty until the second read
(`HostReader.prime()` takes that baseline early, for one-shot callers).
"""

import os
import shutil
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from opsconsole.model import DiskUsage, HostSample, NetRate, frozen

# Field order of a `cpu` line in /proc/stat (proc(5)); older kernels stop early.
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")
# guest and guest_nice are already counted in user and nice: leave them out of the total.
_CPU_TOTAL_FIELDS = CPU_FIELDS[:8]
_CPU_IDLE_FIELDS = ("idle", "iowait")
# Loopback traffic is the node talking to itself, not network load.
SKIPPED_INTERFACES = ("lo",)


def describe_error(exc: BaseException) -> str:
    """One line for an exception: its type and the first line of its message."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return "%s: %s" % (type(exc).__name__, first) if first else type(exc).__name__


# --- pure /proc parsers ------------------------------------------------------


def parse_proc_stat(text: str) -> Dict[str, Dict[str, int]]:
    """Jiffies per CPU line of /proc/stat: {"cpu": {...}, "cpu0": {...}, ...}, fields as CPU_FIELDS."""
    cpus: Dict[str, Dict[str, int]] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        parts = line.split()
        values = [int(v) for v in parts[1 : 1 + len(CPU_FIELDS)]]
        cpus[parts[0]] = dict(zip(CPU_FIELDS, values))
    return cpus


def parse_meminfo(text: str) -> Dict[str, int]:
    """Values of /proc/meminfo by key; "kB" values converted to bytes, unitless counts kept."""
    info: Dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        if not sep:
            continue
        parts = rest.split()
        if not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        if len(parts) > 1 and parts[1] == "kB":
            value *= 1024
        info[key.strip()] = value
    return info


def parse_loadavg(text: str) -> Tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages from /proc/loadavg."""
    parts = text.split()
    return (float(parts[0]), float(parts[1]), float(parts[2]))


def parse_uptime(text: str) -> float:
    """Seconds since boot from /proc/uptime."""
    return float(text.split()[0])


def parse_net_dev(text: str) -> Dict[str, Tuple[int, int]]:
    """Cumulative (rx_bytes, tx_bytes) per interface from /proc/net/dev."""
    counters: Dict[str, Tuple[int, int]] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or "|" in line:
            continue  # the two header lines
        fields = rest.split()
        if len(fields) < 9:
            continue
        counters[name.strip()] = (int(fields[0]), int(fields[8]))
    return counters


# --- snapshots and the samples built from two of them ------------------------


@frozen
class HostSnapshot:
    """Cumulative counters and instant values at one moment; two of them make a HostSample."""

    taken_at: float  # seconds on a monotonic clock (the node's uptime serves for remote reads)
    cpu: Dict[str, Dict[str, int]]  # as parse_proc_stat; an empty dict when unreadable
    net: Dict[str, Tuple[int, int]]  # as parse_net_dev
    mem_total: Optional[int] = None
    mem_used: Optional[int] = None
    mem_available: Optional[int] = None
    swap_total: Optional[int] = None
    swap_used: Optional[int] = None
    load_avg: Tuple[float, ...] = ()
    uptime_s: Optional[float] = None


def memory_from_meminfo(info: Dict[str, int]) -> Dict[str, Optional[int]]:
    """Memory and swap totals as psutil computes them (used = total - available)."""
    total = info.get("MemTotal")
    available = info.get("MemAvailable")
    if available is None and total is not None:
        # Kernels before 3.14 have no MemAvailable: approximate as psutil's fallback does.
        available = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
    swap_total = info.get("SwapTotal")
    swap_free = info.get("SwapFree")
    return {
        "mem_total": total,
        "mem_available": available,
        "mem_used": total - available if total is not None and available is not None else None,
        "swap_total": swap_total,
        "swap_used": swap_total - swap_free if swap_total is not None and swap_free is not None else None,
    }


def snapshot_from_proc_texts(
    stat: Optional[str] = None,
    meminfo: Optional[str] = None,
    loadavg: Optional[str] = None,
    uptime: Optional[str] = None,
    net_dev: Optional[str] = None,
    taken_at: Optional[float] = None,
) -> HostSnapshot:
    """Build a HostSnapshot from the texts of /proc files; a file passed as None stays empty.

    `taken_at` defaults to the uptime in the text, so snapshots read over SSH have a clock
    of the node itself.
    """
    up = parse_uptime(uptime) if uptime else None
    if taken_at is None:
        taken_at = up if up is not None else time.monotonic()
    mem = memory_from_meminfo(parse_meminfo(meminfo)) if meminfo else {}
    return HostSnapshot(
        taken_at=taken_at,
        cpu=parse_proc_stat(stat) if stat else {},
        net=parse_net_dev(net_dev) if net_dev else {},
        load_avg=parse_loadavg(loadavg) if loadavg else (),
        uptime_s=up,
        **mem,
    )


def cpu_busy_percent(prev: Dict[str, int], cur: Dict[str, int]) -> Tuple[Optional[float], Optional[float]]:
    """(busy %, iowait %) of one CPU line between two readings; None when no time passed."""
    total = sum(cur.get(f, 0) - prev.get(f, 0) for f in _CPU_TOTAL_FIELDS)
    if total <= 0:
        return None, None
    idle = sum(cur.get(f, 0) - prev.get(f, 0) for f in _CPU_IDLE_FIELDS)
    iowait = cur.get("iowait", 0) - prev.get("iowait", 0)
    busy = 100.0 * (total - idle) / total
    return _clamp_percent(busy), _clamp_percent(100.0 * iowait / total)


def _clamp_percent(value: float) -> float:
    # Counters of an offlined-then-onlined CPU can step back: keep the figure in range.
    return round(min(100.0, max(0.0, value)), 2)


def _core_names(cpu: Dict[str, Dict[str, int]]) -> List[str]:
    return sorted((name for name in cpu if name != "cpu"), key=lambda name: int(name[3:]))


def net_rates(prev: Dict[str, Tuple[int, int]], cur: Dict[str, Tuple[int, int]], seconds: float) -> Tuple[NetRate, ...]:
    """Bytes per second per interface between two counter readings, loopback left out."""
    if seconds <= 0:
        return ()
    rates = []
    for name in sorted(cur):
        if name in SKIPPED_INTERFACES or name not in prev:
            continue
        rx = cur[name][0] - prev[name][0]
        tx = cur[name][1] - prev[name][1]
        if rx < 0 or tx < 0:
            continue  # counters reset (driver reload, interface recreated): no honest rate this tick
        rates.append(
            NetRate(interface=name, rx_bytes_per_s=round(rx / seconds, 1), tx_bytes_per_s=round(tx / seconds, 1))
        )
    return tuple(rates)


def host_sample_from_snapshots(
    prev: Optional[HostSnapshot],
    cur: HostSnapshot,
    hostname: str,
    disks: Sequence[DiskUsage] = (),
    cpu_count: Optional[int] = None,
    source: str = "proc",
) -> HostSample:
    """Turn two consecutive snapshots into a HostSample (prev None: rates and CPU % are None)."""
    cores = _core_names(cur.cpu)
    cpu_percent: Optional[float] = None
    iowait: Optional[float] = None
    per_core: Tuple[float, ...] = ()
    net: Tuple[NetRate, ...] = ()
    if prev is not None:
        if "cpu" in cur.cpu and "cpu" in prev.cpu:
            cpu_percent, iowait = cpu_busy_percent(prev.cpu["cpu"], cur.cpu["cpu"])
        if cores and all(name in prev.cpu for name in cores):
            busy = [cpu_busy_percent(prev.cpu[name], cur.cpu[name])[0] for name in cores]
            per_core = tuple(b if b is not None else 0.0 for b in busy)
        net = net_rates(prev.net, cur.net, cur.taken_at - prev.taken_at)
    return HostSample(
        hostname=hostname,
        cpu_count=cpu_count or len(cores),
        cpu_percent=cpu_percent,
        cpu_per_core=per_core,
        load_avg=cur.load_avg,
        iowait_percent=iowait,
        mem_total=cur.mem_total,
        mem_used=cur.mem_used,
        mem_available=cur.mem_available,
        swap_total=cur.swap_total,
        swap_used=cur.swap_used,
        disks=tuple(disks),
        net=net,
        uptime_s=cur.uptime_s,
        source=source,
    )


def read_disks(paths: Sequence[str]) -> Tuple[Tuple[DiskUsage, ...], List[str]]:
    """Usage of each path (shutil.disk_usage); a path that fails is an error string, not a crash."""
    disks = []
    errors = []
    for path in paths:
        try:
            usage = shutil.disk_usage(path)
        except OSError as exc:
            errors.append("host.disk %s: %s" % (path, describe_error(exc)))
            continue
        disks.append(DiskUsage(path=path, total=usage.total, used=usage.used, free=usage.free))
    return tuple(disks), errors


# --- the two readers behind HostReader ------------------------------------------


def _read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def read_proc_snapshot(
    proc_root: str = "/proc", clock: Callable[[], float] = time.monotonic
) -> Tuple[HostSnapshot, List[str]]:
    """Read the /proc files into a snapshot; each unreadable file is one error, the rest still count."""
    texts: Dict[str, Optional[str]] = {}
    errors = []
    files = (
        ("stat", "stat"),
        ("meminfo", "meminfo"),
        ("loadavg", "loadavg"),
        ("uptime", "uptime"),
        ("net_dev", "net/dev"),
    )
    for key, name in files:
        try:
            texts[key] = _read_text(os.path.join(proc_root, name))
        except OSError as exc:
            texts[key] = None
            errors.append("host.%s: %s" % (key, describe_error(exc)))
    taken_at = clock()
    try:
        return snapshot_from_proc_texts(taken_at=taken_at, **texts), errors
    except (ValueError, IndexError):
        # A malformed file: parse them one by one so only the broken one is lost.
        snapshot_parts = {}
        for key, text in texts.items():
            try:
                snapshot_from_proc_texts(taken_at=taken_at, **{key: text})
                snapshot_parts[key] = text
            except (ValueError, IndexError) as part_exc:
                errors.append("host.%s: unparsable: %s" % (key, describe_error(part_exc)))
        return snapshot_from_proc_texts(taken_at=taken_at, **snapshot_parts), errors


def read_psutil_snapshot(psutil: Any, clock: Callable[[], float] = time.monotonic) -> Tuple[HostSnapshot, List[str]]:
    """The same snapshot from psutil, one error per part that failed."""
    errors = []
    cpu: Dict[str, Dict[str, int]] = {}
    fields: Dict[str, Any] = {}
    try:
        # Seconds scaled to integer centiseconds so the delta arithmetic matches the /proc path.
        cpu["cpu"] = _psutil_cpu_times(psutil.cpu_times())
        for i, times in enumerate(psutil.cpu_times(percpu=True)):
            cpu["cpu%d" % i] = _psutil_cpu_times(times)
    except Exception as exc:
        errors.append("host.cpu: " + describe_error(exc))
    try:
        vm = psutil.virtual_memory()
        fields.update(mem_total=vm.total, mem_used=vm.used, mem_available=vm.available)
    except Exception as exc:
        errors.append("host.mem: " + describe_error(exc))
    try:
        sw = psutil.swap_memory()
        fields.update(swap_total=sw.total, swap_used=sw.used)
    except Exception as exc:
        errors.append("host.swap: " + describe_error(exc))
    try:
        fields["load_avg"] = tuple(round(float(v), 2) for v in psutil.getloadavg())
    except Exception as exc:
        errors.append("host.loadavg: " + describe_error(exc))
    try:
        fields["uptime_s"] = round(time.time() - psutil.boot_time(), 2)
    except Exception as exc:
        errors.append("host.uptime: " + describe_error(exc))
    net: Dict[str, Tuple[int, int]] = {}
    try:
        for name, counters in psutil.net_io_counters(pernic=True).items():
            net[name] = (counters.bytes_recv, counters.bytes_sent)
    except Exception as exc:
        errors.append("host.net: " + describe_error(exc))
    return HostSnapshot(taken_at=clock(), cpu=cpu, net=net, **fields), errors


def _psutil_cpu_times(times: Any) -> Dict[str, int]:
    return {name: int(round(getattr(times, name, 0.0) * 100)) for name in CPU_FIELDS}


def _import_psutil() -> Any:
    try:
        import psutil  # lazily: compute nodes may not have it
    except ImportError:
        return None
    return psutil


class HostReader:
    """Reads HostSamples, computing rates from the previous read.

    use_psutil: None reads /proc when it is mounted, psutil otherwise (as ProcessTable
    does: the same figures, tests/test_probe_host.py, and /proc is the cheaper of the two, at
    import (psutil's ~6 ms, in the console's first poll) and per read (0.15 against 0.25 ms
    on the VM)); True asks for psutil (falling back to /proc with an error when it is
    missing); False always reads `proc_root` (a directory of captured files works too).
    Errors of the last read are in `last_errors`; the parts that worked still report.
    """

    def __init__(
        self, disk_paths: Sequence[str] = ("/",), use_psutil: Optional[bool] = None, proc_root: str = "/proc"
    ) -> None:
        self.disk_paths = tuple(disk_paths)
        self.proc_root = proc_root
        self.hostname = socket.gethostname()
        self.last_errors: Tuple[str, ...] = ()
        self._setup_errors: List[str] = []
        self._psutil: Any = None
        if use_psutil or (use_psutil is None and not os.path.exists(os.path.join(proc_root, "stat"))):
            self._psutil = _import_psutil()
            if self._psutil is None and use_psutil:
                self._setup_errors.append("host: psutil requested but not importable; reading /proc")
        self._prev: Optional[HostSnapshot] = None

    @property
    def source(self) -> str:
        """ "psutil" or "proc": where readings come from."""
        return "psutil" if self._psutil is not None else "proc"

    def _snapshot(self) -> Tuple[HostSnapshot, List[str]]:
        if self._psutil is not None:
            return read_psutil_snapshot(self._psutil)
        return read_proc_snapshot(self.proc_root)

    def prime(self) -> None:
        """Take the baseline now, so the next read() has rates and CPU percentages."""
        self._prev, _ = self._snapshot()

    def read(self) -> HostSample:
        """One HostSample; never raises for a missing file, path or psutil failure."""
        cur, errors = self._snapshot()
        disks, disk_errors = read_disks(self.disk_paths)
        sample = host_sample_from_snapshots(
            self._prev, cur, self.hostname, disks=disks, cpu_count=os.cpu_count(), source=self.source
        )
        self._prev = cur
        self.last_errors = tuple(self._setup_errors + errors + disk_errors)
        return sample
