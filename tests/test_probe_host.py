"""HostReader and the /proc parsers: table-driven over captured /proc files, and live reads."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from opsconsole.model import HostSample
from opsconsole.probe.host import (
    CPU_FIELDS,
    HostReader,
    cpu_busy_percent,
    host_sample_from_snapshots,
    memory_from_meminfo,
    net_rates,
    parse_loadavg,
    parse_meminfo,
    parse_net_dev,
    parse_proc_stat,
    parse_uptime,
    read_proc_snapshot,
    snapshot_from_proc_texts,
)

PROC = Path(__file__).parent / "fixtures" / "proc"
T0, T1 = PROC / "t0", PROC / "t1"
PROC_FILES = ("stat", "meminfo", "loadavg", "uptime", "net/dev")


def text(root: Path, name: str) -> str:
    return (root / name).read_text()


def first_fields(root: Path, prefix: str):
    """The numbers of the /proc/stat line starting with `prefix`, split independently of the parser."""
    for line in text(root, "stat").splitlines():
        if line.split()[0] == prefix:
            return [int(v) for v in line.split()[1:]]
    raise AssertionError(prefix)


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            "cpu  10 1 5 100 7 0 2 0 0 0",
            dict(user=10, nice=1, system=5, idle=100, iowait=7, irq=0, softirq=2, steal=0, guest=0, guest_nice=0),
        ),
        # Kernels before 2.6.33 stop at guest, before 2.6.11 at irq/softirq.
        (
            "cpu3 4 0 3 50 1 0 0 0 9",
            dict(user=4, nice=0, system=3, idle=50, iowait=1, irq=0, softirq=0, steal=0, guest=9),
        ),
        ("cpu0 1 2 3 4", dict(user=1, nice=2, system=3, idle=4)),
    ],
)
def test_parse_proc_stat_line_shapes(line, expected):
    parsed = parse_proc_stat(line + "\nintr 1 2 3\nctxt 5\n")
    assert parsed == {line.split()[0]: expected}


@pytest.mark.parametrize("root", [T0, T1], ids=["t0", "t1"])
def test_parse_proc_stat_captured(root):
    parsed = parse_proc_stat(text(root, "stat"))
    cores = [name for name in parsed if name != "cpu"]
    assert cores and all(name[3:].isdigit() for name in cores)
    for name in ["cpu"] + cores:
        assert [parsed[name][f] for f in CPU_FIELDS] == first_fields(root, name)[: len(CPU_FIELDS)]
    # The total line is the sum of the cores (within a jiffy or two of rounding per core).
    for field in ("user", "system", "idle"):
        assert abs(parsed["cpu"][field] - sum(parsed[c][field] for c in cores)) <= len(cores) * 2


@pytest.mark.parametrize(
    "source, key, expected",
    [
        ("MemTotal:       24683584 kB\n", "MemTotal", 24683584 * 1024),
        ("HugePages_Total:       4\n", "HugePages_Total", 4),
        ("Active(anon):       1560 kB\n", "Active(anon)", 1560 * 1024),
    ],
)
def test_parse_meminfo_units(source, key, expected):
    assert parse_meminfo(source)[key] == expected


@pytest.mark.parametrize("root", [T0, T1], ids=["t0", "t1"])
def test_parse_meminfo_captured(root):
    info = parse_meminfo(text(root, "meminfo"))
    raw = {line.split(":")[0]: line.split()[1] for line in text(root, "meminfo").splitlines()}
    assert info["MemTotal"] == int(raw["MemTotal"]) * 1024
    assert 0 < info["MemAvailable"] <= info["MemTotal"]
    mem = memory_from_meminfo(info)
    assert mem["mem_used"] == info["MemTotal"] - info["MemAvailable"]
    assert mem["swap_used"] == info["SwapTotal"] - info["SwapFree"]


def test_memory_without_memavailable_falls_back_to_free_buffers_cached():
    mem = memory_from_meminfo(parse_meminfo("MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 20 kB\nCached: 300 kB\n"))
    assert mem["mem_available"] == 420 * 1024
    assert mem["mem_used"] == 580 * 1024
    assert mem["swap_total"] is None and mem["swap_used"] is None


@pytest.mark.parametrize("root", [T0, T1], ids=["t0", "t1"])
def test_parse_loadavg_and_uptime_captured(root):
    load = parse_loadavg(text(root, "loadavg"))
    assert load == tuple(float(v) for v in text(root, "loadavg").split()[:3])
    assert parse_uptime(text(root, "uptime")) == float(text(root, "uptime").split()[0])


def test_parse_net_dev_captured_skips_headers():
    counters = parse_net_dev(text(T0, "net/dev"))
    body = text(T0, "net/dev").splitlines()[2:]
    assert set(counters) == {line.split(":")[0].strip() for line in body}
    for line in body:
        name, rest = line.split(":")
        fields = rest.split()
        assert counters[name.strip()] == (int(fields[0]), int(fields[8]))


def test_parse_net_dev_name_glued_to_counters():
    # Big counters leave no space after the colon.
    sample = "Inter-|   Receive\n face |bytes\n  eth1:123456789012 5 0 0 0 0 0 0 987 6 0 0 0 0 0 0\n"
    assert parse_net_dev(sample) == {"eth1": (123456789012, 987)}


@pytest.mark.parametrize(
    "prev, cur, busy, iowait",
    [
        (dict(user=0, idle=0), dict(user=50, idle=50), 50.0, 0.0),
        (dict(user=0, idle=0, iowait=0), dict(user=10, idle=60, iowait=30), 10.0, 30.0),
        (dict(user=5, idle=5), dict(user=5, idle=5), None, None),  # no time passed
        # guest time is already inside user: counting it twice would overstate busy.
        (dict(user=0, idle=0, guest=0), dict(user=40, idle=60, guest=40), 40.0, 0.0),
    ],
)
def test_cpu_busy_percent(prev, cur, busy, iowait):
    assert cpu_busy_percent(prev, cur) == (busy, iowait)


def test_host_sample_from_captured_snapshots():
    prev = snapshot_from_proc_texts(*(text(T0, n) for n in PROC_FILES))
    cur = snapshot_from_proc_texts(*(text(T1, n) for n in PROC_FILES))
    sample = host_sample_from_snapshots(prev, cur, "node-a", cpu_count=2)
    # Expected figures computed from the raw lines, independently of the parser.
    t0, t1 = first_fields(T0, "cpu"), first_fields(T1, "cpu")
    delta = [b - a for a, b in zip(t0[:8], t1[:8])]
    assert sample.cpu_percent == pytest.approx(100.0 * (sum(delta) - delta[3] - delta[4]) / sum(delta), abs=0.01)
    assert sample.iowait_percent == pytest.approx(100.0 * delta[4] / sum(delta), abs=0.01)
    assert len(sample.cpu_per_core) == 2
    # The busy child spun on one core: one core near 100 %, the average in between.
    assert max(sample.cpu_per_core) > 90.0
    assert min(sample.cpu_per_core) <= sample.cpu_percent <= max(sample.cpu_per_core)
    seconds = parse_uptime(text(T1, "uptime")) - parse_uptime(text(T0, "uptime"))
    eth0 = {n.interface: n for n in sample.net}["eth0"]
    rx0, rx1 = parse_net_dev(text(T0, "net/dev"))["eth0"][0], parse_net_dev(text(T1, "net/dev"))["eth0"][0]
    assert eth0.rx_bytes_per_s == pytest.approx((rx1 - rx0) / seconds, rel=1e-3)
    assert "lo" not in {n.interface for n in sample.net}
    assert sample.mem_total == parse_meminfo(text(T1, "meminfo"))["MemTotal"]
    assert sample.uptime_s == parse_uptime(text(T1, "uptime"))
    assert sample.load_avg == parse_loadavg(text(T1, "loadavg"))


def test_first_snapshot_has_no_rates():
    cur = snapshot_from_proc_texts(*(text(T0, n) for n in PROC_FILES))
    sample = host_sample_from_snapshots(None, cur, "node-a")
    assert sample.cpu_percent is None and sample.iowait_percent is None
    assert sample.cpu_per_core == () and sample.net == ()
    assert sample.cpu_count == 2  # the core lines of the capture
    assert sample.mem_total is not None


def test_net_rates_skip_counter_reset_and_new_interfaces():
    rates = net_rates({"eth0": (1000, 1000), "lo": (0, 0)}, {"eth0": (10, 3000), "lo": (9, 9), "ib0": (5, 5)}, 2.0)
    assert rates == ()
    rates = net_rates({"eth0": (1000, 1000)}, {"eth0": (3000, 1500)}, 2.0)
    assert [(r.interface, r.rx_bytes_per_s, r.tx_bytes_per_s) for r in rates] == [("eth0", 1000.0, 250.0)]


def copy_proc(src: Path, dst: Path) -> None:
    for name in PROC_FILES:
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / name, dst / name)


def test_host_reader_over_captured_proc_root(tmp_path):
    copy_proc(T0, tmp_path)
    reader = HostReader(disk_paths=(str(tmp_path),), use_psutil=False, proc_root=str(tmp_path))
    first = reader.read()
    assert first.source == "proc" and first.cpu_percent is None and reader.last_errors == ()
    copy_proc(T1, tmp_path)
    second = reader.read()
    assert second.cpu_percent is not None and max(second.cpu_per_core) > 90.0
    assert {n.interface for n in second.net} == set(parse_net_dev(text(T1, "net/dev"))) - {"lo"}
    assert [d.path for d in second.disks] == [str(tmp_path)]
    usage = shutil.disk_usage(str(tmp_path))
    assert second.disks[0].total == usage.total


def test_missing_disk_and_proc_file_are_errors_not_crashes(tmp_path):
    copy_proc(T0, tmp_path)
    (tmp_path / "net" / "dev").unlink()
    missing = str(tmp_path / "no-such-mount")
    reader = HostReader(disk_paths=(missing, str(tmp_path)), use_psutil=False, proc_root=str(tmp_path))
    sample = reader.read()
    assert [d.path for d in sample.disks] == [str(tmp_path)]
    assert any(e.startswith("host.disk " + missing) and "FileNotFoundError" in e for e in reader.last_errors)
    assert any(e.startswith("host.net_dev:") for e in reader.last_errors)
    assert sample.mem_total is not None and sample.load_avg


def test_malformed_proc_file_loses_only_that_part(tmp_path):
    copy_proc(T0, tmp_path)
    (tmp_path / "loadavg").write_text("garbage\n")
    snapshot, errors = read_proc_snapshot(str(tmp_path))
    assert [e.split(":")[0] for e in errors] == ["host.loadavg"]
    assert snapshot.load_avg == () and snapshot.mem_total is not None and snapshot.cpu


def test_live_proc_reader_two_reads():
    reader = HostReader(use_psutil=False)
    reader.read()
    time.sleep(0.3)
    sample = reader.read()
    assert isinstance(sample, HostSample) and sample.source == "proc"
    assert 0.0 <= sample.cpu_percent <= 100.0
    assert len(sample.cpu_per_core) == len([n for n in parse_proc_stat(Path("/proc/stat").read_text()) if n != "cpu"])
    assert sample.cpu_count == os.cpu_count()
    assert sample.disks and sample.disks[0].path == "/"
    assert reader.last_errors == ()


def test_psutil_and_proc_paths_agree():
    pytest.importorskip("psutil")
    via_psutil = HostReader(use_psutil=True)
    via_proc = HostReader(use_psutil=False)
    for reader in (via_psutil, via_proc):
        reader.read()
    time.sleep(0.3)
    a, b = via_psutil.read(), via_proc.read()
    assert (a.source, b.source) == ("psutil", "proc")
    assert via_psutil.last_errors == () and via_proc.last_errors == ()
    assert a.mem_total == b.mem_total
    assert a.swap_total == b.swap_total
    assert abs(a.mem_available - b.mem_available) < 0.05 * a.mem_total
    assert a.cpu_count == b.cpu_count
    assert len(a.cpu_per_core) == len(b.cpu_per_core)
    assert {n.interface for n in a.net} == {n.interface for n in b.net}
    assert a.uptime_s == pytest.approx(b.uptime_s, abs=2.0)
    assert all(x == pytest.approx(y, abs=0.5) for x, y in zip(a.load_avg, b.load_avg))
    assert a.disks == b.disks or a.disks[0].total == b.disks[0].total
