"""nvidia-smi CSV: the query command lines and pure parsers into GpuSample / ProcessSample.

Used where NVML cannot be loaded in-process (the probe's fallback) and by the SSH fallback
that runs nvidia-smi on a node without the probe. The parsers accept both
`--format=csv,noheader,nounits` (what we ask for) and plain `--format=csv` output, with a
header and units ("21491 MiB", "692.06 W", "100 %"), as older captures and users have it.
"""

import os
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from opsconsole.model import GpuSample, ProcessSample
from opsconsole.probe.nvml_decode import parse_clock_event_mask

# Everything GpuSample can take from --query-gpu, in the order we ask for it.
QUERY_GPU_FIELD_LIST = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "utilization.gpu",
    "utilization.memory",
    "memory.total",
    "memory.used",
    "memory.free",
    "memory.reserved",
    "temperature.gpu",
    "power.draw",
    "enforced.power.limit",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "clocks_event_reasons.active",
    "pstate",
    "fan.speed",
    "ecc.mode.current",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total",
    "ecc.errors.uncorrected.aggregate.total",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "retired_pages.pending",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "persistence_mode",
    "compute_mode",
    "mig.mode.current",
)
QUERY_GPU_FIELDS = ",".join(QUERY_GPU_FIELD_LIST)
# Fields every nvidia-smi since the R450 drivers knows: the retry when a field is refused.
BASIC_GPU_FIELD_LIST = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "utilization.gpu",
    "utilization.memory",
    "memory.total",
    "memory.used",
    "memory.free",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "clocks.max.mem",
    "pstate",
    "fan.speed",
    "ecc.mode.current",
    "persistence_mode",
    "compute_mode",
)
BASIC_GPU_FIELDS = ",".join(BASIC_GPU_FIELD_LIST)
QUERY_APPS_FIELD_LIST = ("pid", "process_name", "used_gpu_memory", "gpu_uuid")
QUERY_APPS_FIELDS = ",".join(QUERY_APPS_FIELD_LIST)

_MIB = 1024 * 1024
# Cells that mean "this GPU has no such value": None, no error.
_ABSENT = frozenset(("[n/a]", "n/a", "[not supported]", "not supported", "", "-"))
_NUMBER = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)")
_UNIT = re.compile(r"\s*\[[^\]]*\]\s*$")


def query_gpu_argv(fields: str = QUERY_GPU_FIELDS) -> List[str]:
    """The nvidia-smi command line for one row per GPU, no header, no units."""
    return ["nvidia-smi", "--query-gpu=" + fields, "--format=csv,noheader,nounits"]


def query_apps_argv() -> List[str]:
    """The nvidia-smi command line for one row per compute process, no header, no units."""
    return ["nvidia-smi", "--query-compute-apps=" + QUERY_APPS_FIELDS, "--format=csv,noheader,nounits"]


def is_invalid_field_error(text: str) -> bool:
    """Whether nvidia-smi refused a field name ('Field "x" is not a valid field to query.')."""
    return "not a valid field" in text


# --- cell converters -----------------------------------------------------------------


def _number(cell: str) -> float:
    match = _NUMBER.match(cell)
    if not match:
        raise ValueError("not a number: %r" % cell)
    return float(match.group(1))


def _int(cell: str) -> int:
    return int(round(_number(cell)))


def _mib_bytes(cell: str) -> int:
    # nvidia-smi reports memory in MiB; with units the cell reads "21491 MiB".
    value = _number(cell)
    lowered = cell.lower()
    if "gib" in lowered:
        return int(value * 1024 * _MIB)
    if "kib" in lowered:
        return int(value * 1024)
    return int(value * _MIB)


def _bool(cell: str) -> bool:
    lowered = cell.strip().lower()
    if lowered in ("enabled", "yes", "on", "1", "true"):
        return True
    if lowered in ("disabled", "no", "off", "0", "false"):
        return False
    raise ValueError("not a yes/no: %r" % cell)


def _pstate(cell: str) -> int:
    text = cell.strip().upper()
    return int(text[1:]) if text.startswith("P") else int(text)


def _text(cell: str) -> str:
    return cell.strip()


# nvidia-smi field (or alias) -> (GpuSample attribute, converter)
_GPU_FIELDS: Dict[str, Tuple[str, Callable[[str], Any]]] = {
    "index": ("index", _int),
    "uuid": ("uuid", _text),
    "gpu_uuid": ("uuid", _text),
    "name": ("name", _text),
    "gpu_name": ("name", _text),
    "pci.bus_id": ("pci_bus_id", _text),
    "gpu_bus_id": ("pci_bus_id", _text),
    "driver_version": ("driver_version", _text),
    "utilization.gpu": ("utilization_gpu", _number),
    "utilization.memory": ("utilization_memory", _number),
    "memory.total": ("memory_total", _mib_bytes),
    "memory.used": ("memory_used", _mib_bytes),
    "memory.free": ("memory_free", _mib_bytes),
    "memory.reserved": ("memory_reserved", _mib_bytes),
    "temperature.gpu": ("temperature", _number),
    "power.draw": ("power_draw_w", _number),
    "power.draw.instant": ("power_draw_w", _number),
    "power.limit": ("power_limit_w", _number),
    "enforced.power.limit": ("power_limit_w", _number),
    "clocks.sm": ("clock_sm_mhz", _int),
    "clocks.current.sm": ("clock_sm_mhz", _int),
    "clocks.mem": ("clock_mem_mhz", _int),
    "clocks.memory": ("clock_mem_mhz", _int),
    "clocks.current.memory": ("clock_mem_mhz", _int),
    "clocks.max.sm": ("clock_sm_max_mhz", _int),
    "clocks.max.mem": ("clock_mem_max_mhz", _int),
    "clocks.max.memory": ("clock_mem_max_mhz", _int),
    "clocks_event_reasons.active": ("clock_event_reasons", parse_clock_event_mask),
    "clocks_throttle_reasons.active": ("clock_event_reasons", parse_clock_event_mask),
    "pstate": ("pstate", _pstate),
    "fan.speed": ("fan_percent", _number),
    "ecc.mode.current": ("ecc_enabled", _bool),
    "ecc.errors.corrected.volatile.total": ("ecc_volatile_corrected", _int),
    "ecc.errors.uncorrected.volatile.total": ("ecc_volatile_uncorrected", _int),
    "ecc.errors.corrected.aggregate.total": ("ecc_aggregate_corrected", _int),
    "ecc.errors.uncorrected.aggregate.total": ("ecc_aggregate_uncorrected", _int),
    "remapped_rows.correctable": ("remapped_rows_corrected", _int),
    "remapped_rows.uncorrectable": ("remapped_rows_uncorrected", _int),
    "remapped_rows.pending": ("remapped_rows_pending", _bool),
    "remapped_rows.failure": ("remapped_rows_failure", _bool),
    "retired_pages.pending": ("retired_pages_pending", _bool),
    "pcie.link.gen.current": ("pcie_gen", _int),
    "pcie.link.gen.gpucurrent": ("pcie_gen", _int),
    "pcie.link.gen.max": ("pcie_gen_max", _int),
    "pcie.link.gen.gpumax": ("pcie_gen_max", _int),
    "pcie.link.width.current": ("pcie_width", _int),
    "pcie.link.width.max": ("pcie_width_max", _int),
    "persistence_mode": ("persistence_mode", _bool),
    "compute_mode": ("compute_mode", _text),
    "mig.mode.current": ("mig_mode", _bool),
}
_SAMPLE_FIELDS = frozenset(GpuSample.__dataclass_fields__)


def _split_row(line: str) -> List[str]:
    # GPU names and process names hold no commas; nvidia-smi never quotes.
    return [cell.strip() for cell in line.split(",")]


def _field_name(header_cell: str) -> str:
    """'memory.used [MiB]' -> 'memory.used'."""
    return _UNIT.sub("", header_cell).strip().lower()


def _rows(text: str, fields: Sequence[str], known: Any) -> Tuple[List[str], List[List[str]]]:
    """Data rows and the field order, taken from a header line when the text has one."""
    lines = [line for line in text.splitlines() if line.strip()]
    order = list(fields)
    if lines:
        first = [_field_name(cell) for cell in _split_row(lines[0])]
        if first and all(name in known for name in first) and not _NUMBER.match(lines[0]):
            order = first
            lines = lines[1:]
    return order, [_split_row(line) for line in lines]


def _absent(cell: str) -> bool:
    return cell.strip().lower() in _ABSENT


def parse_query_gpu_row(cells: Sequence[str], fields: Sequence[str]) -> Tuple[GpuSample, Optional[str]]:
    """One --query-gpu row as a GpuSample, and the row's driver_version if it has one."""
    values: Dict[str, Any] = {}
    errors: List[str] = []
    lost = False
    driver: Optional[str] = None
    for name, cell in zip(fields, cells):
        target = _GPU_FIELDS.get(name)
        if target is None or _absent(cell):
            continue
        attr, convert = target
        if cell.startswith("["):  # "[Unknown Error]", "[GPU is lost]", "[Insufficient Permissions]"
            message = cell.strip("[]")
            if "lost" in message.lower():
                lost = True
            errors.append("%s: %s" % (name, message))
            continue
        try:
            value = convert(cell)
        except (ValueError, IndexError) as exc:
            errors.append("%s: %s" % (name, exc))
            continue
        if attr == "driver_version":
            driver = value
        elif attr in _SAMPLE_FIELDS:
            values.setdefault(attr, value)
    if "index" not in values:
        raise ValueError("row without a GPU index: %r" % ",".join(cells))
    return GpuSample(lost=lost, errors=tuple(errors), **values), driver


def parse_query_gpu_csv_with_driver(
    text: str, fields: Sequence[str] = QUERY_GPU_FIELD_LIST
) -> Tuple[Tuple[GpuSample, ...], Optional[str]]:
    """GPUs from `nvidia-smi --query-gpu` CSV, with or without header and units, and the driver version
    (when driver_version was asked).

    Without a header the columns are taken to be `fields` (default: QUERY_GPU_FIELDS).
    "[N/A]" and "[Not Supported]" become None; other bracketed cells ("[Unknown Error]")
    become None plus an entry in that GPU's errors, and "[GPU is lost]" sets lost.
    """
    order, rows = _rows(text, fields, _GPU_FIELDS)
    gpus = []
    driver: Optional[str] = None
    for cells in rows:
        try:
            gpu, row_driver = parse_query_gpu_row(cells, order)
        except ValueError:
            continue  # a stray line ("No devices were found") is not a GPU
        gpus.append(gpu)
        driver = driver or row_driver
    return tuple(gpus), driver


_APP_FIELDS = {
    "pid": "pid",
    "process_name": "name",
    "name": "name",
    "used_gpu_memory": "gpu_memory_bytes",
    "used_memory": "gpu_memory_bytes",
    "gpu_uuid": "gpu_uuid",
    "gpu_bus_id": "gpu_bus_id",
}


def parse_query_apps_csv(
    text: str, gpus: Sequence[GpuSample], fields: Sequence[str] = QUERY_APPS_FIELD_LIST
) -> Tuple[ProcessSample, ...]:
    """GPU compute processes from `--query-compute-apps` CSV, gpu_uuid mapped to the GPU index."""
    by_uuid = {gpu.uuid: gpu.index for gpu in gpus if gpu.uuid}
    by_bus = {gpu.pci_bus_id: gpu.index for gpu in gpus if gpu.pci_bus_id}
    order, rows = _rows(text, fields, _APP_FIELDS)
    procs = []
    for cells in rows:
        row: Dict[str, str] = {}
        for name, cell in zip(order, cells):
            key = _APP_FIELDS.get(name)
            if key is not None:
                row[key] = cell
        try:
            pid = _int(row.get("pid", ""))
        except ValueError:
            continue  # "No running processes found"
        memory: Optional[int] = None
        cell = row.get("gpu_memory_bytes", "")
        if cell and not _absent(cell) and not cell.startswith("["):
            try:
                memory = _mib_bytes(cell)
            except ValueError:
                memory = None
        uuid = row.get("gpu_uuid") or None
        index = by_uuid.get(uuid) if uuid else None
        if index is None and row.get("gpu_bus_id"):
            index = by_bus.get(row["gpu_bus_id"])
        full_name = row.get("name", "")
        procs.append(
            ProcessSample(
                pid=pid,
                name=os.path.basename(full_name) if not _absent(full_name) else "",
                command=full_name if "/" in full_name else "",
                gpu_index=index,
                gpu_uuid=uuid,
                gpu_memory_bytes=memory,
            )
        )
    return tuple(procs)
