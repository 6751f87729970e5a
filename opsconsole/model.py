"""Plain frozen dataclasses that cross layers, and their JSON wire form.

This module is shipped to nodes with the probe, so it must stay stdlib-only
and run on Python 3.6+ (no `from __future__ import annotations`, no walrus, no f-string `=`, no
runtime `X | Y`, no dataclass slots; on 3.6 the bundle supplies the dataclasses backport).
"""

import dataclasses
import operator
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple, Union

if TYPE_CHECKING:  # Literal and Final are Python 3.8+: for the type checker only (annotations below are text)
    from typing import Final, Literal, Type, TypeVar, dataclass_transform

    NodeStateName = Literal["connecting", "up", "stale", "down", "auth", "hostkey", "fallback", "degraded"]
    _Class = TypeVar("_Class")

    @dataclass_transform(frozen_default=True)
    def frozen(cls: "Type[_Class]") -> "Type[_Class]":
        """@dataclass(frozen=True), as the type checker sees it (the runtime one is below)."""

else:

    def frozen(cls):
        """@dataclass(frozen=True): the same fields, __init__, guards, equality, hash and repr, with one
        compile instead of three.

        dataclasses compiles each method it writes from source text (an exec of its own): about 1 ms
        a frozen class on the accelerator machine, where the ~40 classes the console imports before
        its first frame spent some 40 ms of its launch on it. Here dataclasses only gathers the
        fields (init=False, nothing compiled); __init__ is compiled from a shorter text of the same
        meaning (each field set with object.__setattr__, defaults and factories as dataclasses give
        them, __post_init__ called), and the rest are closures: __setattr__ and __delattr__ raise
        FrozenInstanceError as dataclasses' do; __eq__ (the same class and equal compared fields),
        __hash__ (of those fields' tuple) and __repr__ (`Class(field=value, ...)`, "..." for a repr
        that recurses). A class that defines one of these keeps it. `__dataclass_params__` says
        frozen=False (a subclass is made by frozen too, which dataclasses would otherwise refuse);
        nothing in the console reads it.
        """
        own = dict(cls.__dict__)
        cls = dataclass(init=False, eq=False, repr=False)(cls)
        fields = dataclasses.fields(cls)
        if "__init__" not in own:
            cls.__init__ = _init_of(cls, fields)
        names = frozenset(f.name for f in fields)
        if "__setattr__" not in own:
            cls.__setattr__ = _frozen_setattr_of(cls, names)
        if "__delattr__" not in own:
            cls.__delattr__ = _frozen_delattr_of(cls, names)
        if "__eq__" not in own:
            cls.__eq__ = _eq_of(_tuple_of([f.name for f in fields if f.compare]))
            if "__hash__" not in own:
                cls.__hash__ = _hash_of(
                    _tuple_of([f.name for f in fields if (f.compare if f.hash is None else f.hash)])
                )
        if "__repr__" not in own:
            cls.__repr__ = _repr_of(tuple(f.name for f in fields if f.repr))
        return cls


def _init_of(cls: Any, fields: Any) -> Callable[..., None]:
    """The __init__ dataclasses writes for a frozen class, compiled from one short text."""
    namespace: Dict[str, Any] = {"__frozen_set__": object.__setattr__, "__frozen_factory__": _FACTORY}
    params, body = ["__frozen_self__"], []
    for index, f in enumerate(fields):
        value = f.name
        if f.default is not dataclasses.MISSING:
            namespace["__frozen_default_%d__" % index] = f.default
            default = "=__frozen_default_%d__" % index
        elif f.default_factory is not dataclasses.MISSING:
            namespace["__frozen_make_%d__" % index] = f.default_factory
            default = "=__frozen_factory__"
            value = "__frozen_make_%d__() if %s is __frozen_factory__ else %s" % (index, f.name, f.name)
        else:
            default = ""
        if not f.init:  # not a parameter: its default, or its factory's value
            if default == "":
                continue  # dataclasses leaves such a field unset too
            value = (
                "__frozen_make_%d__()" % index
                if f.default_factory is not dataclasses.MISSING
                else "__frozen_default_%d__" % index
            )
        else:
            params.append(f.name + default)
        body.append("    __frozen_set__(__frozen_self__, %r, %s)" % (f.name, value))
    if hasattr(cls, "__post_init__"):
        body.append("    __frozen_self__.__post_init__()")
    source = "def __init__(%s):\n%s\n" % (", ".join(params), "\n".join(body) or "    pass")
    exec(source, namespace)
    init: Callable[..., None] = namespace["__init__"]
    init.__qualname__ = "%s.__init__" % cls.__qualname__
    init.__module__ = cls.__module__
    return init


class _FactoryMarker:
    """The default of a parameter whose field has a default_factory (dataclasses' _HAS_DEFAULT_FACTORY)."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _FactoryMarker()


def _frozen_setattr_of(cls: Any, names: "frozenset[str]") -> Callable[[Any, str, Any], None]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError("cannot assign to field %r" % (name,))
        super(cls, self).__setattr__(name, value)

    return __setattr__


def _frozen_delattr_of(cls: Any, names: "frozenset[str]") -> Callable[[Any, str], None]:
    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError("cannot delete field %r" % (name,))
        super(cls, self).__delattr__(name)

    return __delattr__


def _tuple_of(names: List[str]) -> Callable[[Any], Tuple[Any, ...]]:
    """A function giving the tuple of an object's attributes `names`, as (obj.a, obj.b, ...) would."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        name = names[0]
        return lambda obj: (getattr(obj, name),)
    return operator.attrgetter(*names)  # a tuple for two names or more


def _eq_of(values: Callable[[Any], Tuple[Any, ...]]) -> Callable[[Any, Any], Any]:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return values(self) == values(other)
        return NotImplemented

    return __eq__


def _hash_of(values: Callable[[Any], Tuple[Any, ...]]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(values(self))

    return __hash__


def _repr_of(names: Tuple[str, ...]) -> Callable[[Any], str]:
    running: Set[Tuple[int, int]] = set()  # (id, thread) of the reprs under way: one of itself inside is "..."

    def __repr__(self: Any) -> str:
        key = (id(self), threading.get_ident())
        if key in running:
            return "..."
        running.add(key)
        try:
            return "%s(%s)" % (
                self.__class__.__qualname__,
                ", ".join(["%s=%r" % (name, getattr(self, name)) for name in names]),
            )
        finally:
            running.discard(key)

    return __repr__


# Bump when a field changes meaning or is removed; adding a field is compatible.
FRAME_VERSION = 1

# Node connection states, as shown in the console and in `snapshot --json`.
# (NodeStateName is their type: NodeState.state takes no other text.)
STATE_CONNECTING: "Final" = "connecting"
STATE_UP: "Final" = "up"
STATE_STALE: "Final" = "stale"
STATE_DOWN: "Final" = "down"
STATE_AUTH: "Final" = "auth"
STATE_HOSTKEY: "Final" = "hostkey"
STATE_FALLBACK: "Final" = "fallback"
# Live, but part of what it reports is missing: one of its exporters is down ("node_exporter down").
STATE_DEGRADED: "Final" = "degraded"
NODE_STATES = (
    STATE_CONNECTING,
    STATE_UP,
    STATE_STALE,
    STATE_DOWN,
    STATE_AUTH,
    STATE_HOSTKEY,
    STATE_FALLBACK,
    STATE_DEGRADED,
)
# How a node's reason starts when what it sent should have been a frame but failed the checks.
BAD_FRAME = "bad frame: "
# States in which the node is delivering fresh frames.
LIVE_STATES = (STATE_UP, STATE_FALLBACK, STATE_DEGRADED)


@frozen
class MigDevice:
    """One MIG instance of a GPU in MIG mode: its own memory, and whose work it runs."""

    gpu_instance_id: int  # GPU_I_ID: what dcgm-exporter and nvidia-smi call the instance
    compute_instance_id: Optional[int] = None
    profile: Optional[str] = None  # "3g.40gb"
    uuid: Optional[str] = None  # MIG-...
    memory_total: Optional[int] = None  # bytes
    memory_used: Optional[int] = None
    memory_free: Optional[int] = None
    utilization_gpu: Optional[float] = None  # percent of its engines busy, where known
    # Who runs on it, as the exporter says (dcgm-exporter's Kubernetes and HPC job mapping).
    job_id: Optional[str] = None
    pod: Optional[str] = None
    namespace: Optional[str] = None
    container: Optional[str] = None

    @property
    def memory_percent(self) -> Optional[float]:
        if not self.memory_total or self.memory_used is None:
            return None
        return 100.0 * self.memory_used / self.memory_total


@frozen
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
    mig_devices: Tuple[MigDevice, ...] = ()  # its MIG instances, when in MIG mode
    # Who runs on it, as the exporter says (dcgm-exporter's pod/namespace/container labels, hpc_job).
    job_id: Optional[str] = None
    pod: Optional[str] = None
    namespace: Optional[str] = None
    container: Optional[str] = None

    @property
    def memory_percent(self) -> Optional[float]:
        if not self.memory_total or self.memory_used is None:
            return None
        return 100.0 * self.memory_used / self.memory_total


@frozen
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
    # Whose job it is, read on the node (/proc/PID/cgroup, else SLURM_JOB_ID in its environment):
    # the Slurm job id, step ("0", "batch", "extern") and the job's user; the container it runs in
    # ("docker/ID", "containerd/ID", "k8s/POD_UID/ID", "podman/ID"). None: not in one / not known.
    job_id: Optional[str] = None
    job_step: Optional[str] = None
    job_user: Optional[str] = None
    container: Optional[str] = None
    mig_instance: Optional[int] = None  # GPU instance id of the MIG device it runs on
    # When it started, epoch seconds on the node's clock: host processes carry this instead of
    # elapsed_s, which changes every frame and would make every idle process a delta item.
    start_time: Optional[float] = None
    kernel_thread: Optional[bool] = None  # a kernel thread (PF_KTHREAD): hidden by default, as htop does

    def elapsed_at(self, now: float) -> Optional[float]:
        """Seconds it has run at `now` (its frame's time): elapsed_s, else from start_time."""
        if self.elapsed_s is not None:
            return self.elapsed_s
        if self.start_time is None:
            return None
        return max(0.0, now - self.start_time)


@frozen
class DiskUsage:
    """One mounted file system's size and use, in bytes."""

    path: str
    total: int
    used: int
    free: int

    @property
    def free_percent(self) -> float:
        return 100.0 * self.free / self.total if self.total else 0.0


@frozen
class NetRate:
    """One network interface's receive and send rates, in bytes per second."""

    interface: str
    rx_bytes_per_s: float
    tx_bytes_per_s: float


@frozen
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


@frozen
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


@frozen
class NodeState:
    """What the console knows of one node: connection state and last good frame."""

    name: str
    state: "NodeStateName" = STATE_CONNECTING
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
    GpuSample: {"mig_devices": (MigDevice, True)},
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


class FrameError(ValueError):
    """A frame (or part of one) that fails validation; str() is a short reason naming the field.

    "gpus[0].temperature: expected a number, got str": what a node that sent it shows.
    """


# Bounds on what one frame may hold. A real 8-GPU node sends ~20 KB keyframes; these leave
# room for the biggest machines while keeping a hostile frame from costing seconds or GBs.
INT_LIMIT = 2**63  # |int| below this: what NVML and /proc counters fit in
TEXT_LIMIT = 4096  # characters of one text field or list item
COMMAND_LIMIT = 16384  # characters of a process command line (the probe sends at most 512)
LIST_LIMIT = 256  # items of a list field not named in LIST_LIMITS
LIST_LIMITS = {
    "gpus": 256,
    "processes": 10000,
    "top_processes": 10000,
    "cpu_per_core": 4096,
    "disks": 512,
    "net": 512,
    "errors": 1024,
    "mig_devices": 7,  # an A100/H100/H200 splits into at most 7 instances
}
_TEXT_LIMITS = {"command": COMMAND_LIMIT}
_INF = float("inf")
_NONE = type(None)

# Field annotations (as _annotation_text writes them) -> allowed wire types and what to call them.
_SCALAR_KINDS = {
    "int": ((int,), "an integer"),
    "float": ((float, int), "a number"),  # 55 is a temperature as much as 55.0
    "str": ((str,), "text"),
    "NodeStateName": ((str,), "text"),  # a state this console does not know is shown as it came
    "bool": ((bool,), "true or false"),
}
_JSON_NAMES = {"NoneType": "null", "dict": "object", "list": "list", "str": "str"}


def _type_name(value: Any) -> str:
    name = type(value).__name__
    return _JSON_NAMES.get(name, name)


def _check_scalar(value: Any, types: Tuple[type, ...], what: str, limit: int, where: str) -> None:
    """Raise FrameError unless `value` is one of `types`, finite and in range (ints, floats) or short enough (text)."""
    kind = type(value)
    if kind not in types:
        raise FrameError("%s: expected %s, got %s" % (where, what, _type_name(value)))
    if kind is float:
        if not -_INF < value < _INF:
            raise FrameError("%s: not a finite number" % where)
    elif kind is int:
        if not -INT_LIMIT < value < INT_LIMIT:
            raise FrameError("%s: integer out of range" % where)
    elif kind is str and len(value) > limit:
        raise FrameError("%s: text longer than %d characters" % (where, limit))


def _list_checker(name: str, element: str) -> Callable[[Any], Tuple[Any, ...]]:
    """The converter of a Tuple[X, ...] field from its wire list: count and every item checked."""
    types, what = _SCALAR_KINDS[element]
    limit = LIST_LIMITS.get(name, LIST_LIMIT)
    text_limit = _TEXT_LIMITS.get(name, TEXT_LIMIT)

    def convert(items: Any) -> Tuple[Any, ...]:
        if not items:
            return ()
        if len(items) > limit:
            raise FrameError("%s: %d items, at most %d" % (name, len(items), limit))
        for i, item in enumerate(items):
            kind = type(item)
            # The usual items pass on the first test; anything else gets the full check and its reason.
            if kind is float:
                if -_INF < item < _INF and kind in types:
                    continue
            elif kind is str:
                if len(item) <= text_limit and kind in types:
                    continue
            _check_scalar(item, types, what, text_limit, "%s[%d]" % (name, i))
        return tuple(items)

    return convert


def _nested_checker(name: str, cls: type, is_tuple: bool) -> Callable[[Any], Any]:
    """The converter of a nested dataclass field (or a tuple of them), errors prefixed with the path."""
    limit = LIST_LIMITS.get(name, LIST_LIMIT)

    if not is_tuple:

        def convert_one(value: Any) -> Any:
            try:
                return _decoder(cls).decode(value)
            except FrameError as exc:
                raise FrameError("%s.%s" % (name, exc)) from None

        return convert_one

    def convert(items: Any) -> Tuple[Any, ...]:
        if not items:
            return ()
        if len(items) > limit:
            raise FrameError("%s: %d items, at most %d" % (name, len(items), limit))
        decode = _decoder(cls).decode
        out: List[Any] = []
        try:
            for item in items:
                if type(item) is not dict:
                    raise FrameError("expected an object, got %s" % _type_name(item))
                out.append(decode(item))
        except FrameError as exc:
            raise FrameError("%s[%d].%s" % (name, len(out), exc)) from None
        return tuple(out)

    return convert


class _FieldSpec(object):
    """What one field accepts: its wire types, what to call them, a length limit and a converter for lists and objects."""

    __slots__ = ("types", "what", "limit", "convert")

    def __init__(self, types: Tuple[type, ...], what: str, limit: int, convert: Optional[Callable[[Any], Any]]) -> None:
        self.types = frozenset(types)
        self.what = what
        self.limit = limit
        self.convert = convert


def _annotation_text(annotation: Any) -> str:
    """A field's annotation as the source writes it ("Optional[int]", "Tuple[str, ...]"), whether the
    interpreter keeps it as that text or as a typing object (no `from __future__ import annotations`:
    the module runs on 3.6)."""
    if isinstance(annotation, str):
        return annotation
    args: Tuple[Any, ...] = tuple(getattr(annotation, "__args__", None) or ())
    origin = getattr(annotation, "__origin__", None)
    if origin is Union and len(args) == 2 and _NONE in args:
        return "Optional[%s]" % _annotation_text(args[0] if args[1] is _NONE else args[1])
    if origin in (tuple, Tuple) and len(args) == 2 and args[1] is Ellipsis:
        return "Tuple[%s, ...]" % _annotation_text(args[0])
    return getattr(annotation, "__name__", str(annotation))


def _field_spec(cls: type, f: Any, nested: Dict[str, Tuple[type, bool]]) -> _FieldSpec:
    annotation = _annotation_text(f.type)
    nullable = annotation.startswith("Optional[")
    if nullable:
        annotation = annotation[len("Optional[") : -1]
    extra = (_NONE,) if nullable else ()
    suffix = " or null" if nullable else ""
    if f.name in nested:
        inner, is_tuple = nested[f.name]
        if is_tuple:
            return _FieldSpec((list, tuple) + extra, "a list" + suffix, 0, _nested_checker(f.name, inner, True))
        return _FieldSpec((dict,) + extra, "an object" + suffix, 0, _nested_checker(f.name, inner, False))
    if annotation.startswith("Tuple[") and annotation.endswith(", ...]"):
        element = annotation[len("Tuple[") : -len(", ...]")]
        return _FieldSpec((list, tuple) + extra, "a list" + suffix, 0, _list_checker(f.name, element))
    if annotation not in _SCALAR_KINDS:
        raise TypeError("%s.%s: no wire check for %r" % (cls.__name__, f.name, f.type))
    types, what = _SCALAR_KINDS[annotation]
    return _FieldSpec(types + extra, what + suffix, _TEXT_LIMITS.get(f.name, TEXT_LIMIT), None)


def _getter(keys: List[str]) -> Optional[Callable[[Dict[str, Any]], Tuple[Any, ...]]]:
    """operator.itemgetter of `keys` that always returns a tuple (None for no keys)."""
    if not keys:
        return None
    return operator.itemgetter(*(keys + keys[:1]))  # one key more: a tuple even for one key


def _shape_of(
    specs: Dict[str, "_FieldSpec"], required: Tuple[str, ...], keys: Tuple[str, ...], types: Tuple[type, ...]
) -> Optional[Tuple[Any, ...]]:
    """How to check a wire dict of one layout (its keys in order, the type of each value) in bulk; None
    when a key is no field or a type is not one the field accepts (the field-by-field check says which).

    A probe sends every object of a class with the same keys in the same order and, reading
    by reading, mostly the same types: the types are checked once per layout, and then only
    the ranges (a sum of the floats is finite only when each is; max and min of the ints; the
    longest text), at C speed. What fails that is checked field by field, which gives the reason.
    (floats, ints, ((texts, limit), ...), ((key, convert), ...), missing required fields)
    """
    floats: List[str] = []
    ints: List[str] = []
    texts: Dict[int, List[str]] = {}
    converts: List[Tuple[str, Callable[[Any], Any]]] = []
    for key, kind in zip(keys, types):
        spec = specs.get(key)
        if spec is None or kind not in spec.types:
            return None
        if kind is float:
            floats.append(key)
        elif kind is int:
            ints.append(key)
        elif kind is str:
            texts.setdefault(spec.limit, []).append(key)
        elif spec.convert is not None and kind is not _NONE:
            converts.append((key, spec.convert))
    missing = tuple(name for name in required if name not in keys)
    text_getters = tuple((_getter(names), limit) for limit, names in texts.items())
    return _getter(floats), _getter(ints), text_getters, tuple(converts), missing


SHAPES_KEPT = 64  # layouts remembered per class: a node sending ever new ones gets the field-by-field check
_BULK_FIELDS = 8  # dicts with at least this many fields are checked by layout (_shape_of)


class _Decoder:
    """Builds one dataclass from its wire dict without calling its __init__, checking every field.

    A frozen dataclass's __init__ costs one object.__setattr__ per field; a frame is
    ~50 objects of up to 45 fields, and the console decodes hundreds of frames a
    second, so filling __dict__ directly is several times cheaper. The dataclasses
    have no __post_init__ or validation, so the result is the same object.

    Every field is checked against its annotation (compiled once per class into a
    _FieldSpec): the type, finite floats, ints within INT_LIMIT, text within TEXT_LIMIT,
    lists within LIST_LIMITS, nested objects likewise. What fails raises FrameError.
    """

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.defaults: Dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                self.defaults[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                self.defaults[f.name] = None  # filled per object below
        self.factories = {
            f.name: f.default_factory
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING
        }
        self.required = tuple(f.name for f in dataclasses.fields(cls) if f.name not in self.defaults)
        self.names = frozenset(f.name for f in dataclasses.fields(cls))
        # A subclass (a lazily decoded frame or host) decodes its nested fields as its dataclass does.
        self.nested = next((_NESTED[base] for base in cls.__mro__ if base in _NESTED), {})
        self.plain_names = self.names - frozenset(self.nested)  # fields decoded as they are (lists aside)
        self.specs = {f.name: _field_spec(cls, f, self.nested) for f in dataclasses.fields(cls)}
        self.shapes: Dict[Tuple[Tuple[str, ...], Tuple[type, ...]], Optional[Tuple[Any, ...]]] = {}
        self.last_shape: Tuple[Tuple[str, ...], Tuple[type, ...], Any] = ((), (), None)
        self.takes_float = frozenset(name for name, spec in self.specs.items() if float in spec.types)
        self.takes_int = frozenset(name for name, spec in self.specs.items() if int in spec.types)

    def _bulk(self, values: Dict[str, Any], data: Dict[str, Any]) -> bool:
        """Check and put `data` into `values` by its layout; False when the layout or a value needs fill_each."""
        keys = tuple(data)
        types = tuple(map(type, data.values()))
        last_keys, last_types, shape = self.last_shape
        # The GPUs of one frame share their key strings (the JSON scanner reuses them): compared, not hashed.
        if types != last_types or keys != last_keys:
            shape = self.shapes.get((keys, types))
            if shape is None:
                shape = _shape_of(self.specs, self.required, keys, types)
                if shape is None:
                    return False  # not kept: a hostile node's ever new layouts must not grow the table
                if len(self.shapes) >= SHAPES_KEPT:
                    self.shapes.clear()
                self.shapes[keys, types] = shape
            self.last_shape = (keys, types, shape)
        floats, ints, texts, converts, missing = shape
        if floats is not None:
            total = sum(floats(data))
            if total - total:  # NaN for an inf or a NaN (or a sum that overflowed: fill_each tells)
                return False
        if ints is not None:
            numbers = ints(data)
            if not (max(numbers) < INT_LIMIT and min(numbers) > -INT_LIMIT):
                return False
        for getter, limit in texts:
            if max(map(len, getter(data))) > limit:
                return False
        if missing:
            return False  # fill_each, and the caller says which
        values.update(data)
        for key, convert in converts:
            values[key] = convert(data[key])
        return True

    def fill(self, values: Dict[str, Any], data: Dict[str, Any]) -> None:
        """Check each known field of wire dict `data` and put it, converted, into `values`; raises FrameError."""
        if len(data) < _BULK_FIELDS or not self._bulk(values, data):
            self.fill_each(values, data)

    def fill_each(self, values: Dict[str, Any], data: Dict[str, Any]) -> None:
        """fill, field by field: for a few changed fields (a delta), and to find what is wrong."""
        specs = self.specs
        takes_float = self.takes_float
        takes_int = self.takes_int
        for key, value in data.items():
            kind = type(value)
            # A delta's changes are mostly readings: a number for a field that takes one, in one test.
            if kind is float:
                if key in takes_float and -_INF < value < _INF:
                    values[key] = value
                    continue
            elif kind is int:
                if key in takes_int and -INT_LIMIT < value < INT_LIMIT:
                    values[key] = value
                    continue
            spec = specs.get(key)
            if spec is None:
                continue  # a newer probe's field
            if kind not in spec.types:
                raise FrameError("%s: expected %s, got %s" % (key, spec.what, _type_name(value)))
            if kind is float:
                if not -_INF < value < _INF:
                    raise FrameError("%s: not a finite number" % key)
            elif kind is int:
                if not -INT_LIMIT < value < INT_LIMIT:
                    raise FrameError("%s: integer out of range" % key)
            elif kind is str:
                if len(value) > spec.limit:
                    raise FrameError("%s: text longer than %d characters" % (key, spec.limit))
            elif kind is list or kind is tuple or kind is dict:
                value = spec.convert(value)  # type: ignore[misc]
            values[key] = value

    def decode(self, data: Any) -> Any:
        if data is None:
            return None
        if type(data) is not dict:
            raise FrameError("%s: expected an object, got %s" % (self.cls.__name__, _type_name(data)))
        obj: Any = object.__new__(self.cls)
        values = obj.__dict__
        values.update(self.defaults)
        for name, factory in self.factories.items():
            values[name] = factory()
        if len(data) < _BULK_FIELDS or not self._bulk(values, data):
            self.fill_each(values, data)
            for name in self.required:
                if name not in data:
                    raise FrameError("%s: missing field %r" % (self.cls.__name__, name))
        return obj


_DECODERS: Dict[type, _Decoder] = {}


def _decoder(cls: type) -> _Decoder:
    decoder = _DECODERS.get(cls)
    if decoder is None:
        decoder = _DECODERS[cls] = _Decoder(cls)
    return decoder


def list_limit(name: str) -> int:
    """How many items list field `name` may hold in a frame."""
    return LIST_LIMITS.get(name, LIST_LIMIT)


def from_wire(cls: type, data: Any) -> Any:
    """Build `cls` from its wire dict, ignoring unknown keys (newer probes add fields); raises FrameError."""
    return _decoder(cls).decode(data)


def field_from_wire(cls: type, name: str, value: Any) -> Any:
    """Field `name` of `cls` from its wire value, checked and converted as from_wire does; raises FrameError."""
    values: Dict[str, Any] = {}
    _decoder(cls).fill(values, {name: value})
    return values[name]


def checked(obj: Any) -> Any:
    """`obj` (a frame or any wire dataclass built in this process) if every field holds what its
    annotation says, within the wire bounds; raises FrameError otherwise. For frames that did not
    come through from_wire (the in-process probe, the fallback, sources)."""
    _decoder(type(obj)).decode(to_wire(obj))
    return obj


def checked_after(frame: Any, previous: Any) -> Any:
    """checked(frame), except the host process rows that are the very objects of `previous`, a frame
    checked before in this process and still held: the in-process probe hands back an idle
    process's row as the same frozen object, and a row that passed once passes again. A failure is
    checked again whole, so its message names the row by its place in the frame."""
    procs = getattr(frame, "top_processes", None)
    if previous is None or type(procs) is not tuple or not procs or len(procs) > LIST_LIMITS["top_processes"]:
        return checked(frame)
    seen = {id(row) for row in previous.top_processes}  # `previous` holds them: no id is reused meanwhile
    fresh = tuple(row for row in procs if id(row) not in seen)
    if len(fresh) == len(procs):
        return checked(frame)
    try:
        checked(replace_decoded(frame, {"top_processes": fresh}))
    except FrameError:
        checked(frame)
        raise
    return frame


def replace_from_wire(obj: Any, changes: Dict[str, Any]) -> Any:
    """A copy of dataclass `obj` with the wire-form `changes` applied, each checked and decoded as from_wire does.

    Unknown keys are ignored, as in from_wire; `obj` itself is left as it is. Used to apply
    a stream delta to the previous frame without decoding the unchanged fields again.
    Raises FrameError for a change that fails the field's check.
    """
    cls = type(obj)
    decoder = _DECODERS.get(cls) or _decoder(cls)
    new = object.__new__(cls)
    values = new.__dict__
    values.update(obj.__dict__)
    decoder.fill(values, changes)
    return new


def replace_decoded(obj: Any, values: Dict[str, Any]) -> Any:
    """dataclasses.replace for already-decoded field values, without the __init__ (see _Decoder).

    The caller passes only field names of `obj`'s class; `obj` itself is left as it is.
    """
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(values)
    return new
