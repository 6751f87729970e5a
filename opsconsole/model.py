"""Plain frozen dataclasses that cross layers, and their JSON wire form.

This module is shipped to nodes with the probe, so it must stay stdlib-only
and parse as Python 3.8 (no `match`, no runtime `X | Y`, no dataclass slots).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

# Bump when a field changes meaning or is removed; adding a field is compatible.
FRAME_VERSION = 1

# Node connection states, as shown in the console and in `snapshot --json`.
STATE_CONNECTING = "connecting"
STATE_UP = "up"
STATE_STALE = "stale"
STATE_DOWN = "down"
STATE_AUTH = "auth"
STATE_HOSTKEY = "hostkey"
STATE_FALLBACK = "fallback"
NODE_STATES = (
    STATE_CONNECTING,
    STATE_UP,
    STATE_STALE,
    STATE_DOWN,
    STATE_AUTH,
    STATE_HOSTKEY,
    STATE_FALLBACK,
)
# States in which the node is delivering fresh frames.
LIVE_STATES = (STATE_UP, STATE_FALLBACK)


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant. A field is None when the GPU does not support it."""

    index: int
    uuid: Optional[str] = None
    name: Optional[str] = None
    pci_bus_id: Optional[str] = None
    utilization_gpu: Optional[float] = None  # percent
    utilization_memory: Optional[float] = None  # percent (memory controller busy)
    memory_total: Optional[int] = None  # bytes
    memory_used: Optional[int] = None
    memory_free: Optional[int] = None
    memory_reserved: Optional[int] = None
    temperature: Optional[float] = None  # degrees C
    temperature_slowdown: Optional[float] = None
    temperature_shutdown: Optional[float] = None
    power_draw_w: Optional[float] = None
    power_limit_w: Optional[float] = None
    energy_j: Optional[float] = None  # since driver load
    clock_sm_mhz: Optional[int] = None
    clock_mem_mhz: Optional[int] = None
    clock_sm_max_mhz: Optional[int] = None
    clock_mem_max_mhz: Optional[int] = None
    clock_event_reasons: Optional[Tuple[str, ...]] = None  # decoded names, () = none active
    pstate: Optional[int] = None
    fan_percent: Optional[float] = None
    ecc_enabled: Optional[bool] = None
    ecc_volatile_corrected: Optional[int] = None
    ecc_volatile_uncorrected: Optional[int] = None
    ecc_aggregate_corrected: Optional[int] = None
    ecc_aggregate_uncorrected: Optional[int] = None
    remapped_rows_corrected: Optional[int] = None
    remapped_rows_uncorrected: Optional[int] = None
    remapped_rows_pending: Optional[bool] = None
    remapped_rows_failure: Optional[bool] = None
    retired_pages_pending: Optional[bool] = None
    pcie_gen: Optional[int] = None
    pcie_gen_max: Optional[int] = None
    pcie_width: Optional[int] = None
    pcie_width_max: Optional[int] = None
    pcie_tx_kbs: Optional[int] = None
    pcie_rx_kbs: Optional[int] = None
    pcie_replay_count: Optional[int] = None  # PCIe replays (link retries) since driver load
    persistence_mode: Optional[bool] = None
    compute_mode: Optional[str] = None  # "Default", "Exclusive_Process", "Prohibited"
    mig_mode: Optional[bool] = None
    xid_events: Tuple[int, ...] = ()  # critical XID codes seen since the last frame
    lost: bool = False  # the GPU fell off the bus or NVML lost it
    errors: Tuple[str, ...] = ()  # "field: message" for NVML errors other than NotSupported

    @property
    def memory_percent(self) -> Optional[float]:
        if not self.memory_total or self.memory_used is None:
            return None
        return 100.0 * self.memory_used / self.memory_total


@dataclass(frozen=True)
class ProcessSample:
    """A process: a GPU compute process (gpu_index set) or a host process."""

    pid: int
    name: str = ""
    user: Optional[str] = None
    command: str = ""
    cpu_percent: Optional[float] = None
    rss_bytes: Optional[int] = None
    elapsed_s: Optional[float] = None
    state: Optional[str] = None  # R, S, D, Z, T ... as in /proc/PID/stat
    threads: Optional[int] = None
    gpu_index: Optional[int] = None
    gpu_uuid: Optional[str] = None
    gpu_memory_bytes: Optional[int] = None
    gpu_sm_percent: Optional[float] = None
    ppid: Optional[int] = None  # parent pid: a training job's data-loader workers are its children
    # GPU processes only: "NAME=value" of the NCCL/CUDA variables that change a job's behaviour,
    # read from /proc/PID/environ; None when not read (not permitted, or not a GPU process).
    watched_env: Optional[Tuple[str, ...]] = None


@dataclass(frozen=True)
class DiskUsage:
    path: str
    total: int
    used: int
    free: int

    @property
    def free_percent(self) -> float:
        return 100.0 * self.free / self.total if self.total else 0.0


@dataclass(frozen=True)
class NetRate:
    interface: str
    rx_bytes_per_s: float
    tx_bytes_per_s: float


@dataclass(frozen=True)
class HostSample:
    """Host-level readings of one node."""

    hostname: str
    cpu_count: int = 0
    cpu_percent: Optional[float] = None
    cpu_per_core: Tuple[float, ...] = ()
    load_avg: Tuple[float, ...] = ()  # 1, 5, 15 minutes
    iowait_percent: Optional[float] = None
    mem_total: Optional[int] = None  # bytes
    mem_used: Optional[int] = None
    mem_available: Optional[int] = None
    swap_total: Optional[int] = None
    swap_used: Optional[int] = None
    disks: Tuple[DiskUsage, ...] = ()
    net: Tuple[NetRate, ...] = ()
    uptime_s: Optional[float] = None
    source: str = "proc"  # "psutil" or "proc"

    @property
    def mem_percent(self) -> Optional[float]:
        if not self.mem_total or self.mem_available is None:
            return None
        return 100.0 * (self.mem_total - self.mem_available) / self.mem_total


@dataclass(frozen=True)
class NodeFrame:
    """Everything one probe poll of one node saw."""

    node: str
    time: float  # epoch seconds on the node
    version: int = FRAME_VERSION
    seq: int = 0
    host: Optional[HostSample] = None
    gpus: Tuple[GpuSample, ...] = ()
    processes: Tuple[ProcessSample, ...] = ()  # GPU compute processes
    top_processes: Tuple[ProcessSample, ...] = ()  # host processes by CPU
    gpu_source: str = "none"  # "nvml", "nvidia-smi" or "none"
    gpu_note: Optional[str] = None  # why there are no GPUs, when there are none
    driver_version: Optional[str] = None
    errors: Tuple[str, ...] = ()
    probe_ms: Optional[float] = None  # what this poll cost on the node


@dataclass(frozen=True)
class NodeState:
    """What the console knows of one node: connection state and last good frame."""

    name: str
    state: str = STATE_CONNECTING
    reason: Optional[str] = None  # why down/auth/hostkey/fallback
    address: Optional[str] = None  # host[:port] as connected
    frame: Optional[NodeFrame] = None  # last good frame, kept when the node goes away
    received_at: Optional[float] = None  # epoch seconds when `frame` arrived
    rtt_ms: Optional[float] = None
    fingerprint: Optional[str] = None  # host key fingerprint, for state hostkey
    since: Optional[float] = None  # epoch seconds when `state` was entered

    def age(self, now: float) -> Optional[float]:
        """Seconds since the last good frame arrived, None if none ever did."""
        if self.received_at is None:
            return None
        return max(0.0, now - self.received_at)

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_STATES


# --- wire form -------------------------------------------------------------

# Nested dataclass fields: name -> (class, is_tuple)
_NESTED: Dict[type, Dict[str, Tuple[type, bool]]] = {
    HostSample: {"disks": (DiskUsage, True), "net": (NetRate, True)},
    NodeFrame: {
        "host": (HostSample, False),
        "gpus": (GpuSample, True),
        "processes": (ProcessSample, True),
        "top_processes": (ProcessSample, True),
    },
    NodeState: {"frame": (NodeFrame, False)},
}


_SCALARS = frozenset((int, float, str, bool, type(None)))
_FIELD_NAMES: Dict[type, Tuple[str, ...]] = {}


def _field_names(cls: type) -> Optional[Tuple[str, ...]]:
    names = _FIELD_NAMES.get(cls)
    if names is None and dataclasses.is_dataclass(cls):
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def to_wire(obj: Any) -> Any:
    """Turn a dataclass (or a tuple of them) into JSON-ready dicts and lists.

    Field names are looked up once per class and scalars are passed through without a
    call: the console records and the probe encodes dozens of frames a second.
    """
    cls = type(obj)
    if cls in _SCALARS:
        return obj
    if cls is tuple or cls is list:
        return [item if type(item) in _SCALARS else to_wire(item) for item in obj]
    names = _field_names(cls)
    if names is None:
        return obj
    values = obj.__dict__
    out = {}
    for name in names:
        try:
            value = values[name]
        except KeyError:  # a field decoded when first read (opsconsole.probe.wire_delta.LazyListsFrame)
            value = getattr(obj, name)
        out[name] = value if type(value) in _SCALARS else to_wire(value)
    return out


class _Decoder:
    """Builds one dataclass from its wire dict without calling its __init__.

    A frozen dataclass's __init__ costs one object.__setattr__ per field; a frame is
    ~50 objects of up to 45 fields, and the console decodes hundreds of frames a
    second, so filling __dict__ directly is several times cheaper. The dataclasses
    have no __post_init__ or validation, so the result is the same object.
    """

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.defaults: Dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                self.defaults[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                self.defaults[f.name] = None  # filled per object below
        self.factories = {
            f.name: f.default_factory
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING  # type: ignore[misc]
        }
        self.required = tuple(
            f.name for f in dataclasses.fields(cls) if f.name not in self.defaults
        )
        self.names = frozenset(f.name for f in dataclasses.fields(cls))
        # A subclass (a lazily decoded frame or host) decodes its nested fields as its dataclass does.
        self.nested = next((_NESTED[base] for base in cls.__mro__ if base in _NESTED), {})
        self.plain_names = self.names - frozenset(self.nested)  # fields decoded as they are (lists aside)

    def decode(self, data: Any) -> Any:
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ValueError("%s: expected an object, got %s" % (self.cls.__name__, type(data).__name__))
        values = dict(self.defaults)
        for name, factory in self.factories.items():
            values[name] = factory()
        names = self.names
        nested = self.nested
        for key, value in data.items():
            if key not in names:
                continue  # a newer probe's field
            if key in nested:
                inner, is_tuple = nested[key]
                decode = _decoder(inner).decode
                value = tuple(decode(item) for item in (value or ())) if is_tuple else decode(value)
            elif type(value) is list:
                value = tuple(value)
            values[key] = value
        for name in self.required:
            if name not in data:
                raise ValueError("%s: missing field %r" % (self.cls.__name__, name))
        obj = object.__new__(self.cls)
        obj.__dict__.update(values)
        return obj


_DECODERS: Dict[type, _Decoder] = {}


def _decoder(cls: type) -> _Decoder:
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _DECODERS[cls] = _Decoder(cls)
    return decoder


def from_wire(cls: type, data: Any) -> Any:
    """Build `cls` from its wire dict, ignoring unknown keys (newer probes add fields)."""
    return _decoder(cls).decode(data)


def replace_from_wire(obj: Any, changes: Dict[str, Any]) -> Any:
    """A copy of dataclass `obj` with the wire-form `changes` applied, each decoded as from_wire decodes it.

    Unknown keys are ignored, as in from_wire; `obj` itself is left as it is. Used to apply
    a stream delta to the previous frame without decoding the unchanged fields again.
    """
    cls = type(obj)
    decoder = _DECODERS.get(cls) or _decoder(cls)
    new = object.__new__(cls)
    values = new.__dict__
    values.update(obj.__dict__)
    if changes.keys() <= decoder.plain_names and list not in map(type, changes.values()):
        values.update(changes)  # the usual delta: a few scalar fields, nothing to convert
        return new
    names = decoder.names
    nested = decoder.nested
    for key, value in changes.items():
        if key not in names:
            continue
        if key in nested:
            inner, is_tuple = nested[key]
            decode = _decoder(inner).decode
            value = tuple(decode(item) for item in (value or ())) if is_tuple else decode(value)
        elif type(value) is list:
            value = tuple(value)
        values[key] = value
    return new


def replace_decoded(obj: Any, values: Dict[str, Any]) -> Any:
    """dataclasses.replace for already-decoded field values, without the __init__ (see _Decoder).

    The caller passes only field names of `obj`'s class; `obj` itself is left as it is.
    """
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(values)
    return new
