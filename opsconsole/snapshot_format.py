"""The two ways `opsconsole snapshot` prints node states: a JSON document and a gpustat-like table.

The table's readings are spelled as the console's panes spell them (opsconsole.units): GPU memory
`21.0/140.4 GiB` as on the GPUs pane, not nvidia-smi's MiB, so a number read in one place is
found in the other.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence

from opsconsole.model import BAD_FRAME, STATE_UP, GpuSample, NodeFrame, NodeState, ProcessSample, to_wire
from opsconsole.sanitize import printable_line
from opsconsole.units import (
    format_bytes,
    format_duration,
    format_memory_pair,
    format_percent,
    format_power_pair,
    format_temperature,
)

MISSING = "?"  # a reading the GPU does not report (gpustat prints "??")
NAME_WIDTH_MAX = 40  # a node's 4 KiB GPU name must not pad every other line to its width


# --- JSON --------------------------------------------------------------------


def node_document(state: NodeState, now: float) -> Dict[str, Any]:
    """One node of `snapshot --json`: connection state plus the last frame's contents."""
    frame = state.frame
    age = state.age(now)
    return {
        "name": state.name,
        "state": state.state,
        "reason": state.reason,
        "address": state.address,
        "age_s": round(age, 3) if age is not None else None,
        "rtt_ms": state.rtt_ms,
        "since": state.since,
        "fingerprint": state.fingerprint,
        "time": frame.time if frame else None,
        "seq": frame.seq if frame else None,
        "host": to_wire(frame.host) if frame else None,
        "gpus": to_wire(frame.gpus) if frame else [],
        "processes": to_wire(frame.processes) if frame else [],
        "top_processes": to_wire(frame.top_processes) if frame else [],
        "gpu_source": frame.gpu_source if frame else None,
        "gpu_note": frame.gpu_note if frame else None,
        "driver_version": frame.driver_version if frame else None,
        "probe_ms": frame.probe_ms if frame else None,
        "errors": list(frame.errors) if frame else [],
    }


def snapshot_document(
    states: Iterable[NodeState], now: Optional[float] = None, sources: Sequence[Any] = ()
) -> Dict[str, Any]:
    """The whole `snapshot --json` document: `{"nodes": [...]}` in the order given, NaN and infinities as None;
    with `"sources": [{"name", "url", "state", "reason", "nodes"}]` when the config has [[sources]]."""
    now = time.time() if now is None else now
    document: Dict[str, Any] = {"nodes": [node_document(state, now) for state in states]}
    if sources:
        document["sources"] = [source_document(source) for source in sources]
    return json_safe(document)


def source_document(status: Any) -> Dict[str, Any]:
    """A source's status (sources.prometheus.SourceStatus) as `snapshot --json` gives it."""
    return {
        "name": status.name,
        "url": status.url,
        "state": status.state,
        "reason": status.reason,
        "nodes": status.nodes,
    }


def source_line(status: Any) -> str:
    """`source up: prometheus (http://prom:9090), 12 nodes`, or with the reason it gives (naming itself):
    `source down: prometheus http://prom:9090: unreachable: Connection refused`."""
    if status.reason:
        return printable_line("source %s: %s" % (status.state, status.reason))
    return printable_line(
        "source %s: %s (%s), %d node%s"
        % (status.state, status.name, status.url, status.nodes, "" if status.nodes == 1 else "s")
    )


def json_safe(value: Any) -> Any:
    """`value` with every float that standard JSON cannot hold (NaN, +-inf) replaced by None, lists and dicts copied.

    Frames from nodes are checked where they are decoded, but a source or a link's own
    figures (an RTT, an age) could still hold one, and `json.dumps` would print `NaN`.
    """
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is dict:
        return {key: json_safe(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [json_safe(item) for item in value]
    return value


def snapshot_json(states: Iterable[NodeState], now: Optional[float] = None, sources: Sequence[Any] = ()) -> str:
    """`snapshot --json`'s text: standard JSON (no NaN), one document, a newline at the end."""
    return json.dumps(snapshot_document(states, now, sources), indent=2, allow_nan=False) + "\n"


# --- text table ----------------------------------------------------------------


def format_process(proc: ProcessSample) -> str:
    """`user(pid) 21 GiB`, as gpustat lists a GPU's processes (sizes as opsconsole.units spells them)."""
    who = printable_line(proc.user or proc.name or MISSING)
    memory = "" if proc.gpu_memory_bytes is None else " " + format_bytes(proc.gpu_memory_bytes)
    job = proc.job_id or proc.container  # whose job (read on the node)
    return "%s(%d)%s%s" % (who, proc.pid, memory, " job " + printable_line(job) if job else "")


def processes_on(frame: NodeFrame, gpu: GpuSample) -> List[ProcessSample]:
    """The compute processes of `frame` that run on `gpu` (matched by index, else by UUID)."""
    return [
        p
        for p in frame.processes
        if (p.gpu_index is not None and p.gpu_index == gpu.index)
        or (p.gpu_index is None and gpu.uuid is not None and p.gpu_uuid == gpu.uuid)
    ]


def format_gpu_line(frame: NodeFrame, gpu: GpuSample, name_width: int = 0) -> str:
    """`[0] NVIDIA H200 | 39°C,   0% |  0.0/140.4 GiB | 109/700 W | user(pid) 21 GiB`."""
    name = printable_line(gpu.name or MISSING).ljust(name_width)
    if gpu.lost:
        return "[%d] %s | lost: the GPU fell off the bus or NVML lost it" % (gpu.index, name)
    parts = [
        "[%d] %s" % (gpu.index, name),
        "%s, %s"
        % (
            format_temperature(gpu.temperature, missing=MISSING).rjust(4),
            format_percent(gpu.utilization_gpu, missing=MISSING).rjust(4),
        ),
        format_memory_pair(gpu.memory_used, gpu.memory_total, missing=MISSING).rjust(14),
        format_power_pair(gpu.power_draw_w, gpu.power_limit_w, missing=MISSING).rjust(9),
    ]
    line = " | ".join(parts) + " |"
    procs = processes_on(frame, gpu)
    if procs:
        line += " " + " ".join(format_process(p) for p in procs)
    return line


def _frame_time(frame: NodeFrame) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(frame.time))
    except (ValueError, OverflowError, OSError):  # a node clock far outside what the C library takes
        return MISSING


def format_node_header(state: NodeState, now: float, name_width: int = 0) -> str:
    """`name  state  hostname  time  driver`, plus the age of a frame that is not fresh."""
    frame = state.frame
    fields = [printable_line(state.name).ljust(name_width), printable_line(state.state).ljust(10)]
    if frame is None:
        fields.append("-")
        return "  ".join(fields).rstrip()
    hostname = frame.host.hostname if frame.host else frame.node
    fields += [printable_line(hostname), _frame_time(frame)]
    if frame.driver_version or frame.gpus:
        fields.append("driver " + printable_line(frame.driver_version or MISSING))
    line = "  ".join(fields)
    age = state.age(now)
    if state.state != STATE_UP and age is not None:
        line += "  (last frame %s ago)" % format_duration(age)
    return line


def format_node(state: NodeState, now: float, name_width: int = 0, gpu_name_width: int = 0) -> List[str]:
    """The header line of a node, a line per GPU, and why it is not up (when it is not)."""
    lines = [format_node_header(state, now, name_width)]
    frame = state.frame
    if state.reason and (state.state != STATE_UP or state.reason.startswith(BAD_FRAME)):
        lines.append("  %s: %s" % (printable_line(state.state), printable_line(state.reason)))
    if frame is not None:
        for gpu in frame.gpus:
            lines.append(format_gpu_line(frame, gpu, gpu_name_width))
        if not frame.gpus:
            lines.append("  no GPUs" + (": " + printable_line(frame.gpu_note) if frame.gpu_note else ""))
        for error in frame.errors:
            if frame.gpus or not frame.gpu_note or frame.gpu_note not in error:  # said once above
                lines.append("  error: " + printable_line(error))
    return lines


def snapshot_table(states: Sequence[NodeState], now: Optional[float] = None, sources: Sequence[Any] = ()) -> str:
    """All nodes as gpustat prints one machine: aligned names, one line per GPU; then each source's state."""
    now = time.time() if now is None else now
    name_width = min(NAME_WIDTH_MAX, max((len(s.name) for s in states), default=0))
    gpu_name_width = min(
        NAME_WIDTH_MAX, max((len(g.name or MISSING) for s in states if s.frame for g in s.frame.gpus), default=0)
    )
    lines: List[str] = []
    for state in states:
        lines.extend(format_node(state, now, name_width, gpu_name_width))
    lines.extend(source_line(source) for source in sources)
    return "\n".join(lines) + ("\n" if lines else "")
