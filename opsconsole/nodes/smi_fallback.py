"""Frames from a node without a usable python3: /proc files and nvidia-smi CSV over one exec a tick.

Each tick runs one `/bin/sh -c SCRIPT` whose output is the /proc files, the disk usage
of each path and the two nvidia-smi queries, each after a `@@opsconsole NAME` line.
The texts are parsed here, on the console, by the probe's own pure parsers
(probe.host and probe.smi), so both paths agree on every number. Host processes
by CPU are not collected here (it would mean one read per PID): top_processes is empty.
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Dict, List, Optional, Sequence, Tuple

from opsconsole.model import DiskUsage, GpuSample, NodeFrame, ProcessSample
from opsconsole.probe.host import HostSnapshot, describe_error, host_sample_from_snapshots, snapshot_from_proc_texts
from opsconsole.probe.smi import (
    BASIC_GPU_FIELD_LIST,
    QUERY_GPU_FIELD_LIST,
    is_invalid_field_error,
    parse_query_apps_csv,
    parse_query_gpu_csv_with_driver,
    query_apps_argv,
    query_gpu_argv,
)

SECTION_MARK = "@@opsconsole "
_SECTION_LINE = re.compile(r"^@@opsconsole (\S+)$")
_PROC_FILES = (
    ("stat", "/proc/stat"),
    ("meminfo", "/proc/meminfo"),
    ("loadavg", "/proc/loadavg"),
    ("uptime", "/proc/uptime"),
    ("net_dev", "/proc/net/dev"),
    ("hostname", "/proc/sys/kernel/hostname"),
)
# `df -P -k` line: filesystem (may hold spaces), 1K-blocks, used, available, capacity, mount point.
_DF_LINE = re.compile(r"^(.*?)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)%\s+(.*)$")
EXIT_NOT_FOUND = 127


def fallback_script(disk_paths: Sequence[str], gpu_fields: Sequence[str] = QUERY_GPU_FIELD_LIST) -> str:
    """The POSIX sh script of one tick; every path and argument in it is quoted."""
    lines = [
        # Where PATH is odd (the reason python3 was not found, often), still find cat, df and nvidia-smi.
        'PATH="${PATH:+$PATH:}/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"; export PATH',
        "s() { printf '\\n%s%%s\\n' \"$1\"; }" % SECTION_MARK,
        "s time; date +%s",
    ]
    for name, path in _PROC_FILES:
        lines.append("s %s; cat %s 2>/dev/null" % (name, shlex.quote(path)))
    for index, path in enumerate(disk_paths):
        lines.append("s df:%d; df -P -k -- %s 2>/dev/null" % (index, shlex.quote(path)))
    gpu_argv = query_gpu_argv(",".join(gpu_fields))
    lines.append("s smi_gpu; %s 2>&1; rc=$?; s smi_gpu_rc; echo $rc" % shlex.join(gpu_argv))
    lines.append("s smi_apps; %s 2>&1; rc=$?; s smi_apps_rc; echo $rc" % shlex.join(query_apps_argv()))
    lines.append("s end")
    return "\n".join(lines) + "\n"


def fallback_command(disk_paths: Sequence[str], gpu_fields: Sequence[str] = QUERY_GPU_FIELD_LIST) -> str:
    """The exec command line: the script quoted for /bin/sh (absolute: PATH may be odd there)."""
    return "/bin/sh -c " + shlex.quote(fallback_script(disk_paths, gpu_fields))


def split_sections(text: str) -> Dict[str, str]:
    """The script's output as {section name: text}; a section with no output is ""."""
    sections = {}  # type: Dict[str, str]
    name = None  # type: Optional[str]
    body = []  # type: List[str]
    for line in text.splitlines():
        match = _SECTION_LINE.match(line)
        if match:
            if name is not None:
                sections[name] = "\n".join(body).strip("\n")
            name, body = match.group(1), []
        elif name is not None:
            body.append(line)
    if name is not None:
        sections[name] = "\n".join(body).strip("\n")
    return sections


def parse_df(text: str, path: str) -> Optional[DiskUsage]:
    """Usage of `path` from `df -P -k PATH` output; None when df failed."""
    for line in text.splitlines()[1:]:
        match = _DF_LINE.match(line.strip())
        if match:
            total, used, free = (int(match.group(i)) * 1024 for i in (2, 3, 4))
            return DiskUsage(path=path, total=total, used=used, free=free)
    return None


def _exit_code(sections: Dict[str, str], name: str) -> Optional[int]:
    try:
        return int(sections.get(name, "").strip())
    except ValueError:
        return None


class FallbackPoller:
    """Turns one tick's script output into a NodeFrame; keeps the previous /proc snapshot for rates."""

    def __init__(self, node_name: str, disk_paths: Sequence[str] = ("/",)) -> None:
        self.node_name = node_name
        self.disk_paths = tuple(disk_paths)
        self.gpu_fields: Sequence[str] = QUERY_GPU_FIELD_LIST
        self.seq = 0
        self._prev: Optional[HostSnapshot] = None
        self._driver: Optional[str] = None

    def command(self) -> str:
        """The exec command line for the next tick."""
        return fallback_command(self.disk_paths, self.gpu_fields)

    def frame_from_output(self, text: str, probe_ms: Optional[float] = None) -> NodeFrame:
        """Parse one tick's output (never raises: a broken part is an entry in frame.errors)."""
        sections = split_sections(text)
        errors = []  # type: List[str]
        if "end" not in sections:
            errors.append("fallback: output cut short")
        host = None
        try:
            texts = {}
            for name, path in _PROC_FILES[:5]:
                texts[name] = sections.get(name) or None
                if texts[name] is None:
                    errors.append("host.%s: %s unreadable" % (name, path))
            snapshot = snapshot_from_proc_texts(**texts)
            disks = []
            for index, path in enumerate(self.disk_paths):
                usage = parse_df(sections.get("df:%d" % index, ""), path)
                if usage is None:
                    errors.append("host.disk %s: df failed" % path)
                else:
                    disks.append(usage)
            hostname = sections.get("hostname", "").strip() or self.node_name
            host = host_sample_from_snapshots(self._prev, snapshot, hostname, disks=disks, source="proc")
            self._prev = snapshot
        except (ValueError, IndexError, KeyError) as exc:
            errors.append("host: " + describe_error(exc))
        gpus, procs, gpu_source, gpu_note, gpu_errors = self._gpus(sections)
        errors.extend(gpu_errors)
        try:
            node_time = float(sections.get("time", "").strip())
        except ValueError:
            node_time = time.time()
        self.seq += 1
        return NodeFrame(
            node=self.node_name,
            time=node_time,
            seq=self.seq,
            host=host,
            gpus=gpus,
            processes=procs,
            gpu_source=gpu_source,
            gpu_note=gpu_note,
            driver_version=self._driver,
            errors=tuple(errors),
            probe_ms=probe_ms,
        )

    def _gpus(
        self, sections: Dict[str, str]
    ) -> Tuple[Tuple[GpuSample, ...], Tuple[ProcessSample, ...], str, Optional[str], List[str]]:
        rc = _exit_code(sections, "smi_gpu_rc")
        text = sections.get("smi_gpu", "")
        if rc == EXIT_NOT_FOUND:
            return (), (), "none", "nvidia-smi not found on node", []
        if rc != 0:
            if is_invalid_field_error(text) and self.gpu_fields is not BASIC_GPU_FIELD_LIST:
                self.gpu_fields = BASIC_GPU_FIELD_LIST  # an older nvidia-smi: the next tick asks what it knows
            first = text.strip().splitlines()[0] if text.strip() else "exit status %s" % rc
            return (), (), "none", "nvidia-smi failed: " + first, ["nvidia-smi: " + first]
        try:
            gpus, driver = parse_query_gpu_csv_with_driver(text, self.gpu_fields)
        except ValueError as exc:
            return (), (), "none", "nvidia-smi output unparsable", ["nvidia-smi: " + describe_error(exc)]
        if driver:
            self._driver = driver
        errors = []  # type: List[str]
        procs = ()  # type: Tuple[ProcessSample, ...]
        if _exit_code(sections, "smi_apps_rc") == 0:
            try:
                procs = parse_query_apps_csv(sections.get("smi_apps", ""), gpus)
            except ValueError as exc:
                errors.append("nvidia-smi apps: " + describe_error(exc))
        else:
            errors.append("nvidia-smi apps: " + (sections.get("smi_apps", "").strip() or "failed"))
        note = None if gpus else "nvidia-smi listed no GPUs"
        return gpus, procs, "nvidia-smi", note, errors
