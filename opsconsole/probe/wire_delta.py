"""Keyframe + delta wire form of the probe stream: the agent's encoder and the console's decoder.

A keyframe is a plain full frame line (what `frame_line` prints, floats rounded as below).
A delta line carries only what changed since the previous line the agent sent:

    {"delta": 1, "base": SEQ_OF_PREVIOUS,
     "f": {changed top-level scalar fields, seq and time included},
     "host": null | {full host} | {"@": 0, changed host fields},
     "gpus" / "processes" / "top_processes": [ITEM, ...]}

A list field is sent only when it changed, and then as the whole new list in order, each
ITEM being: an int (the previous list's item at that position, unchanged), [i, n] (the n
previous items from position i on, unchanged: a node's hundreds of idle processes in pid
order are a few runs), {"@": i, changed fields} (the previous item at position i with
those fields changed) or a full item (new). Process items leave out their null fields
(null is every process field's default), which halves a process list's bytes. The encoder matches items by key (GPU index; pid and gpu_index for GPU processes;
pid for host processes) and diffs against exactly the item it refers to, so the decoded
frame is right whatever the keys are. Nested lists inside a host (disks, net) travel whole.

The two process lists ("processes", "top_processes": full lists in a keyframe, delta
items in a delta) and the host's per-core CPU list (whole, when the host carries it)
travel after a TAB on the same line, as a second JSON object {"cpu_per_core": ...,
"processes": ..., "top_processes": ...} holding those that are sent, cpu_per_core first
(JSON text never holds a raw TAB, so the split is exact). The console parses the first
part at once and the second only when something reads a frame's processes
(LazyListsFrame) or its host's cores (LazyCoresHost): the header, the Nodes pane,
history and alerts read GPUs and the host's totals; only the Host and Processes panes,
for the one node shown, read these. They are 70 % of every delta line's bytes, and the
192 numbers of a big node's cores were 60 % of the JSON parsing of the rest. A line
without a TAB is a whole frame or delta, as before.

The decoder applies a delta to the last frame only when "base" is that frame's seq, and
rebuilds only the objects that changed: an unchanged GpuSample, HostSample or
ProcessSample is the same object as in the previous frame. A delta that does not fit is
dropped (an error value, not an exception) and the chain waits for the next keyframe,
which the agent sends first, every `keyframe_every` lines and after any encode problem.

Shipped to nodes with the probe: stdlib only, Python 3.6+.
"""

import dataclasses
import json
from typing import Any, Callable, Dict, List, Optional, Tuple

from opsconsole.model import (
    BAD_FRAME,
    FrameError,
    GpuSample,
    HostSample,
    NodeFrame,
    ProcessSample,
    field_from_wire,
    from_wire,
    list_limit,
    replace_from_wire,
    to_wire,
)

DELTA_FORMAT = 1
DEFAULT_KEYFRAME_EVERY = 30
CHANGED = "@"  # key of a changed item: the position of the item it changes in the previous list

_LISTS = (("gpus", GpuSample), ("processes", ProcessSample), ("top_processes", ProcessSample))
LAZY_LISTS = ("processes", "top_processes")  # sent after the TAB, decoded when first read
LAZY_CORES = "cpu_per_core"  # the host's field sent after the TAB (first, so a prefix test finds it)
LAZY_SEPARATOR = "\t"
_LAZY_CORES_PREFIX = '{"%s":' % LAZY_CORES
_NESTED_FRAME_FIELDS = frozenset(("host", "gpus", "processes", "top_processes"))

# Digits kept per float field, so readings that did not really change compare equal (and
# lines get shorter): percent 0.1, W 0.01, J 0.001, seconds 0.01, bytes/s 1.
_GPU_DIGITS = {
    "utilization_gpu": 1,
    "utilization_memory": 1,
    "temperature": 1,
    "temperature_slowdown": 1,
    "temperature_shutdown": 1,
    "power_draw_w": 2,
    "power_limit_w": 2,
    "energy_j": 3,
    "fan_percent": 1,
}
_HOST_DIGITS = {"cpu_percent": 1, "iowait_percent": 1, "uptime_s": 2}
_HOST_LIST_DIGITS = {"cpu_per_core": 1, "load_avg": 2}
_PROCESS_DIGITS = {"cpu_percent": 1, "elapsed_s": 2, "gpu_sm_percent": 1, "start_time": 2}
# Process fields whose default is None: left out of the wire when null, and decoded back as None.
_PROCESS_NULLABLE = frozenset(
    f.name for f in dataclasses.fields(ProcessSample) if f.default is None and f.default_factory is dataclasses.MISSING
)
MIN_RUN = 3  # unchanged items in a row sent as one [i, n] run
_NET_DIGITS = {"rx_bytes_per_s": 0, "tx_bytes_per_s": 0}
_FRAME_DIGITS = {"probe_ms": 2}


# --- rounding (agent side) ------------------------------------------------------------


def _round_fields(item: Dict[str, Any], digits: Dict[str, int]) -> None:
    for name, places in digits.items():
        value = item.get(name)
        if type(value) is float:
            item[name] = round(value, places)


def round_wire(wire: Dict[str, Any]) -> Dict[str, Any]:
    """Round a frame's wire dict in place to the precision above; returns it."""
    _round_fields(wire, _FRAME_DIGITS)
    host = wire.get("host")
    if type(host) is dict:
        _round_fields(host, _HOST_DIGITS)
        for name, places in _HOST_LIST_DIGITS.items():
            values = host.get(name)
            if type(values) is list:
                host[name] = [round(v, places) if type(v) is float else v for v in values]
        for rate in host.get("net") or ():
            if type(rate) is dict:
                _round_fields(rate, _NET_DIGITS)
    for gpu in wire.get("gpus") or ():
        if type(gpu) is dict:
            _round_fields(gpu, _GPU_DIGITS)
    for name in ("processes", "top_processes"):
        procs = wire.get(name)
        if type(procs) is not list:
            continue
        for index, proc in enumerate(procs):
            if type(proc) is dict:
                procs[index] = rounded_process(proc)
    return wire


def rounded_process(proc: Dict[str, Any]) -> Dict[str, Any]:
    """A process's wire dict rounded, its null fields left out (a new dict)."""
    _round_fields(proc, _PROCESS_DIGITS)
    return {key: value for key, value in proc.items() if value is not None or key not in _PROCESS_NULLABLE}


def rounded_wire(frame: NodeFrame) -> Dict[str, Any]:
    """The wire dict of `frame`, floats rounded: what a keyframe carries."""
    return round_wire(to_wire(frame))


# --- encoding (agent side) ------------------------------------------------------------


class _EncodeProblem(Exception):
    """The frame cannot be sent as a delta of the previous one: send a keyframe."""


def _same(a: Any, b: Any) -> bool:
    # Equal and of the same type all the way down: 1 == 1.0 == True, but the console must see the change.
    if a.__class__ is not b.__class__ or a != b:
        return False
    if a.__class__ is list:
        return all(map(_same, a, b))
    if a.__class__ is dict:
        return all(_same(value, b[key]) for key, value in a.items())
    return True


def _diff_item(old: Dict[str, Any], new: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The fields of `new` that differ from `old`; None when they don't have the same fields."""
    if old is new:
        return {}  # the encoder's cached wire form of an unchanged process
    if old.keys() != new.keys():
        return None
    return {key: value for key, value in new.items() if not _same(old[key], value)}


def _gpu_key(item: Dict[str, Any]) -> Any:
    return item.get("index")


def _gpu_process_key(item: Dict[str, Any]) -> Any:
    return (item.get("pid"), item.get("gpu_index"))


def _process_key(item: Dict[str, Any]) -> Any:
    return item.get("pid")


_LIST_KEYS = {"gpus": _gpu_key, "processes": _gpu_process_key, "top_processes": _process_key}


def _diff_list(old: Any, new: Any, key: Callable[[Dict[str, Any]], Any]) -> Optional[List[Any]]:
    """The delta items of list `new` against `old`; None when nothing changed (order included)."""
    if type(old) is not list or type(new) is not list:
        raise _EncodeProblem("not a list")
    position: Dict[Any, int] = {}
    for i, item in enumerate(old):
        if type(item) is not dict:
            raise _EncodeProblem("list item is not an object")
        position.setdefault(key(item), i)
    changed = len(old) != len(new)
    out: List[Any] = []
    for j, item in enumerate(new):
        if type(item) is not dict:
            raise _EncodeProblem("list item is not an object")
        at = position.get(key(item))
        diff = None if at is None else _diff_item(old[at], item)
        if diff is None:  # new, or not comparable: sent whole
            out.append(item)
            changed = True
        elif diff:
            diff[CHANGED] = at
            out.append(diff)
            changed = True
        else:
            out.append(at)
            changed = changed or at != j
    return _runs(out) if changed else None


def _runs(items: List[Any]) -> List[Any]:
    """`items` with each stretch of MIN_RUN or more consecutive unchanged positions as one [i, n]."""
    out: List[Any] = []
    run_start, run_length = -1, 0

    def close() -> None:
        if run_length >= MIN_RUN:
            out.append([run_start, run_length])
        else:
            out.extend(range(run_start, run_start + run_length))

    for item in items:
        if type(item) is int:
            if run_length and item == run_start + run_length:
                run_length += 1
                continue
            if run_length:
                close()
            run_start, run_length = item, 1
            continue
        if run_length:
            close()
            run_length = 0
        out.append(item)
    if run_length:
        close()
    return out


def delta_of(old: Dict[str, Any], new: Dict[str, Any]) -> Dict[str, Any]:
    """The delta dict that turns wire frame `old` into `new` (raises _EncodeProblem when it can't)."""
    seq = new.get("seq")
    base = old.get("seq")
    if type(seq) is not int or type(base) is not int or seq == base:
        raise _EncodeProblem("seq must be an int that changes")
    if old.keys() != new.keys():
        raise _EncodeProblem("frame fields changed")
    delta: Dict[str, Any] = {"delta": DELTA_FORMAT, "base": base}
    scalars = {}
    for name, value in new.items():
        if name not in _NESTED_FRAME_FIELDS and not _same(old[name], value):
            scalars[name] = value
    delta["f"] = scalars
    old_host, host = old.get("host"), new.get("host")
    if host is None:
        if old_host is not None:
            delta["host"] = None
    elif type(host) is not dict:
        raise _EncodeProblem("host is not an object")
    elif type(old_host) is not dict:
        delta["host"] = host
    else:
        diff = _diff_item(old_host, host)
        if diff is None:
            delta["host"] = host
        elif diff:
            diff[CHANGED] = 0
            delta["host"] = diff
    for name, key in _LIST_KEYS.items():
        items = _diff_list(old.get(name), new.get(name), key)
        if items is not None:
            delta[name] = items
    return delta


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def split_line(obj: Dict[str, Any]) -> str:
    """The stream line of a frame or delta dict: the process lists and host cores it carries go after a TAB."""
    lazy: Dict[str, Any] = {}
    main = obj
    host = obj.get("host")
    if type(host) is dict and LAZY_CORES in host:
        lazy[LAZY_CORES] = host[LAZY_CORES]
        main = dict(obj)  # `obj` stays whole: the encoder keeps it
        main["host"] = {key: value for key, value in host.items() if key != LAZY_CORES}
    for name in LAZY_LISTS:
        if name in obj:
            lazy[name] = obj[name]
    if not lazy:
        return _dumps(obj)
    main = {key: value for key, value in main.items() if key not in LAZY_LISTS}
    return _dumps(main) + LAZY_SEPARATOR + _dumps(lazy)


class DeltaEncoder(object):
    """Turns successive frames into stream lines: a keyframe first and every `keyframe_every` lines, deltas between.

    Any problem encoding a delta (a frame the diff does not understand) sends a keyframe
    instead. The encoder keeps the last wire dict it was given: don't change it afterwards.
    With split (the default) the process lists go after a TAB (see the module docstring).
    """

    def __init__(self, keyframe_every: int = DEFAULT_KEYFRAME_EVERY, split: bool = True) -> None:
        self.keyframe_every = max(1, int(keyframe_every))
        self._line = split_line if split else _dumps
        self._last: Optional[Dict[str, Any]] = None
        # id(sample) -> (sample, its rounded wire dict): a process that is the same object as in
        # the last frame (the probe reuses an idle one's) is neither converted nor diffed again.
        self._process_wire: Dict[int, Tuple[Any, Dict[str, Any]]] = {}
        self._since_keyframe = 0
        self.keyframes = 0
        self.deltas = 0

    def force_keyframe(self) -> None:
        """Make the next line a keyframe."""
        self._last = None

    def encode(self, frame: NodeFrame) -> str:
        """The line (no newline) for `frame`, floats rounded."""
        return self.encode_wire(self._rounded_wire(frame))

    def _rounded_wire(self, frame: NodeFrame) -> Dict[str, Any]:
        """rounded_wire(frame), the process lists through the per-object cache."""
        wire = round_wire(to_wire(dataclasses.replace(frame, processes=(), top_processes=())))
        cache = self._process_wire
        kept: Dict[int, Tuple[Any, Dict[str, Any]]] = {}
        for name in LAZY_LISTS:
            items = []
            for proc in getattr(frame, name):
                hit = cache.get(id(proc))
                if hit is None or hit[0] is not proc:
                    hit = (proc, rounded_process(to_wire(proc)))
                kept[id(proc)] = hit
                items.append(hit[1])
            wire[name] = items
        self._process_wire = kept  # only this frame's: bounded, and no id of a freed object is trusted
        return wire

    def encode_wire(self, wire: Dict[str, Any]) -> str:
        """The line (no newline) for a frame already in (rounded) wire form."""
        last, self._last = self._last, None  # stays None if encoding fails: the next line is a keyframe
        line: Optional[str] = None
        if last is not None and self._since_keyframe < self.keyframe_every:
            try:
                line = self._line(delta_of(last, wire))
            except (_EncodeProblem, TypeError, ValueError, AttributeError, KeyError):
                line = None
        if line is None:
            line = self._line(wire)
            self._since_keyframe = 1
            self.keyframes += 1
        else:
            self._since_keyframe += 1
            self.deltas += 1
        self._last = wire
        return line


# --- decoding (console side) -----------------------------------------------------------


class DeltaError(ValueError):
    """A delta that does not apply to the last frame (wrong base, bad shape): drop it, wait for a keyframe."""


class BadDelta(DeltaError, FrameError):
    """A delta that is malformed in itself (a bad field, list or item), not merely on another base: a bad frame."""


def _apply_host(old: Optional[HostSample], change: Any) -> Optional[HostSample]:
    if change is None:
        return None
    if type(change) is not dict:
        raise BadDelta("host: expected an object")
    try:
        if change.pop(CHANGED, None) is None:
            return from_wire(HostSample, change)
        if old is None:
            raise BadDelta("host: changes to a host the last frame does not have")
        return replace_from_wire(old, change)
    except BadDelta:
        raise
    except FrameError as exc:
        raise BadDelta("host.%s" % exc) from None


def _apply_list(old: Tuple[Any, ...], items: Any, cls: type, name: str) -> Tuple[Any, ...]:
    """The list that delta `items` make of `old`; raises BadDelta (a FrameError) naming the item that fails."""
    if type(items) is not list:
        raise BadDelta("%s: expected a list" % name)
    if len(items) > list_limit(name):
        raise BadDelta("%s: %d items, at most %d" % (name, len(items), list_limit(name)))
    out: List[Any] = []
    append = out.append
    count = len(old)
    try:
        for item in items:
            kind = type(item)
            if kind is int:
                if not 0 <= item < count:
                    raise BadDelta("%s: no item %d in the last frame (it has %d)" % (name, item, count))
                append(old[item])
            elif kind is list:
                if (
                    len(item) != 2
                    or type(item[0]) is not int
                    or type(item[1]) is not int
                    or item[1] < 1
                    or not 0 <= item[0] <= count - item[1]
                ):
                    raise BadDelta("%s: bad run %s of the last frame's %d items" % (name, _short(item), count))
                out.extend(old[item[0] : item[0] + item[1]])
            elif kind is dict:
                at = item.pop(CHANGED, None)  # popped: the rest are field names only (the fast path)
                if at is None:
                    append(from_wire(cls, item))
                elif type(at) is int and 0 <= at < count:
                    append(replace_from_wire(old[at], item))
                else:
                    raise BadDelta("%s: no item %s in the last frame (it has %d)" % (name, _short(at), count))
            else:
                raise BadDelta("%s: bad item %s" % (name, _short(item)))
    except BadDelta:
        raise
    except FrameError as exc:
        raise BadDelta("%s[%d].%s" % (name, len(out), exc)) from None
    if len(out) > list_limit(name):  # runs can make a short delta a long list
        raise BadDelta("%s: %d items, at most %d" % (name, len(out), list_limit(name)))
    return tuple(out)


def _short(value: Any) -> str:
    """A bounded repr of a value from the wire, for a reason (the value may be megabytes)."""
    text = repr(value) if type(value) in (int, bool, type(None)) and len(str(value)) <= 20 else type(value).__name__
    return text


def apply_delta(base: Optional[NodeFrame], delta: Dict[str, Any]) -> NodeFrame:
    """The frame that `delta` makes of `base`, reusing every unchanged object; raises DeltaError."""
    if delta.get("delta") != DELTA_FORMAT:
        raise DeltaError("unknown delta format %s" % _short(delta.get("delta")))
    if base is None:
        raise DeltaError("delta before any keyframe")
    if delta.get("base") != base.seq:
        raise DeltaError("delta on seq %s, the last frame is seq %r" % (_short(delta.get("base")), base.seq))
    scalars = delta.get("f")
    if type(scalars) is not dict or _NESTED_FRAME_FIELDS.intersection(scalars):
        raise BadDelta("bad top-level fields")
    values: Dict[str, Any] = {}
    try:
        if "host" in delta:
            values["host"] = _apply_host(base.host, delta["host"])
        for name, cls in _LISTS:
            if name in delta:
                values[name] = _apply_list(getattr(base, name), delta[name], cls, name)
        frame = replace_from_wire(base, scalars)
    except DeltaError:
        raise
    except FrameError as exc:
        raise BadDelta(str(exc)) from None
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise BadDelta("bad delta: %s: %s" % (type(exc).__name__, exc)) from None
    if values:  # `frame` is a new object of ours: fill it in place rather than copy it again (replace_decoded)
        frame.__dict__.update(values)
    return frame


# --- lazy process lists (console side) ----------------------------------------------------


class _Chain(object):
    """What the lazy lists of one stream share: the first error met applying one (None while all applied)."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: Optional[str] = None


class _LazyPart(object):
    """The text after a line's TAB, parsed when the first of its lists is read."""

    __slots__ = ("text", "data")

    def __init__(self, text: str) -> None:
        self.text = text
        self.data: Optional[Dict[str, Any]] = None

    def fields(self) -> Dict[str, Any]:
        if self.data is None:
            data = parse_json(self.text)
            if type(data) is not dict:
                raise DeltaError("process lists: expected an object")
            self.data, self.text = data, ""
        return self.data


class _LazyList(object):
    """One process list of one frame: its base (the previous frame's list) and the items that change it.

    resolve() applies them once and keeps the tuple, and lets go of the base and the text,
    so a chain of frames nobody read is at most one keyframe interval long.
    """

    __slots__ = ("base", "part", "name", "chain", "value")

    def __init__(self, base: Any, part: _LazyPart, name: str, chain: _Chain) -> None:
        self.base = base  # a tuple, or the previous frame's _LazyList
        self.part: Optional[_LazyPart] = part
        self.name = name
        self.chain = chain
        self.value: Tuple[Any, ...] = ()

    def resolve(self) -> Tuple[Any, ...]:
        part = self.part
        if part is None:
            return self.value
        base = self.base
        try:
            if type(base) is _LazyList:
                base = base.resolve()
            value = self._value(base, part.fields())
        except (DeltaError, ValueError, TypeError, AttributeError, KeyError, RecursionError) as exc:
            # Too late to drop the frame: its list is empty, and the stream waits for a keyframe.
            if self.chain.error is None:
                self.chain.error = "%s did not apply: %s" % (self.name, exc)
            value = ()
        self.value, self.base, self.part = value, None, None
        return value

    def _value(self, base: Tuple[Any, ...], data: Dict[str, Any]) -> Tuple[Any, ...]:
        return _apply_list(base, data[self.name], ProcessSample, self.name) if self.name in data else base


_LAZY_KEYS = {name: "_lazy_" + name for name in LAZY_LISTS}


def _compare_as(base: type) -> Tuple[Any, Any, Any]:
    """__eq__, __hash__ and __repr__ for a lazy subclass of the dataclass `base`: field by field
    through the properties (so pending parts are compared decoded), equal to a plain `base`."""
    names = tuple(f.name for f in dataclasses.fields(base))

    def __eq__(self: Any, other: Any) -> Any:
        if not isinstance(other, base):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in names)

    def __repr__(self: Any) -> str:
        return "%s(%s)" % (base.__name__, ", ".join("%s=%r" % (name, getattr(self, name)) for name in names))

    return __eq__, base.__hash__, __repr__


def _lazy_field(name: str) -> property:
    """A field read from `_lazy_<name>` (its resolve()) the first time it is read, then kept."""
    key = "_lazy_" + name

    def read(self: Any) -> Tuple[Any, ...]:
        values = self.__dict__
        try:
            return values[name]
        except KeyError:
            pass
        value = values[name] = values[key].resolve()
        return value

    def write(self: Any, value: Any) -> None:  # dataclasses.replace and __init__ set fields
        self.__dict__[name] = value

    return property(read, write, doc="%s, decoded when first read" % name)


class LazyListsFrame(NodeFrame):
    """A NodeFrame whose `processes` and `top_processes` are decoded when first read.

    Everything else is decoded already. It compares, hashes, prints and goes to the wire
    as the NodeFrame it stands for; dataclasses.replace() gives a fully decoded copy.
    """

    processes = _lazy_field("processes")
    top_processes = _lazy_field("top_processes")

    __eq__, __hash__, __repr__ = _compare_as(NodeFrame)


class _LazyCores(_LazyList):
    """One host's per-core list, parsed from its line's list part when first read (no base: sent whole)."""

    __slots__ = ()

    def __init__(self, part: _LazyPart, chain: _Chain) -> None:
        super().__init__((), part, LAZY_CORES, chain)

    def _value(self, base: Tuple[Any, ...], data: Dict[str, Any]) -> Tuple[Any, ...]:
        cores = data[LAZY_CORES]
        if type(cores) is not list:
            raise DeltaError("expected a list")
        return field_from_wire(HostSample, LAZY_CORES, cores)


_LAZY_CORES_KEY = "_lazy_" + LAZY_CORES


class LazyCoresHost(HostSample):
    """A HostSample whose `cpu_per_core` is parsed when first read (see LazyListsFrame for the rest).

    A later delta that changes other host fields copies it with the same pending list,
    which is parsed at most once for all the copies.
    """

    cpu_per_core = _lazy_field(LAZY_CORES)

    __eq__, __hash__, __repr__ = _compare_as(HostSample)


def _with_lazy_cores(host: HostSample, part: _LazyPart, chain: _Chain, own: bool = False) -> HostSample:
    """A copy of `host` whose cores come from `part`; `host` itself when `own` (a new object nobody else holds)."""
    if own and type(host) is LazyCoresHost:
        new = host  # made by this line's delta: no copy needed
        values = new.__dict__
    else:
        new = object.__new__(LazyCoresHost)
        values = new.__dict__
        values.update(host.__dict__)
    values.pop(LAZY_CORES, None)
    values[_LAZY_CORES_KEY] = _LazyCores(part, chain)
    return new


def _list_source(frame: NodeFrame, name: str) -> Any:
    """A frame's list as the base of the next one: the tuple when decoded, else its _LazyList (not resolved)."""
    values = frame.__dict__
    if name in values:
        return values[name]
    return values[_LAZY_KEYS[name]]


def _with_lazy_lists(frame: NodeFrame, base: Optional[NodeFrame], text: str, chain: _Chain) -> NodeFrame:
    """`frame` with its process lists (and its host's cores, when sent) to come from `text` over `base`'s.

    base None: a keyframe, over empty lists. `frame` is new (made from this line) and not
    yet seen by anyone, so when it is a LazyListsFrame already (a delta over one) it is
    filled in place, as is its host when this line's delta made it: no copies per line.
    """
    part = _LazyPart(text)
    if type(frame) is LazyListsFrame:
        new = frame
        values = new.__dict__
    else:
        new = object.__new__(LazyListsFrame)
        values = new.__dict__
        values.update(frame.__dict__)
    host = values.get("host")
    if text.startswith(_LAZY_CORES_PREFIX) and host is not None:
        values["host"] = _with_lazy_cores(host, part, chain, own=base is not None and host is not base.host)
    for name in LAZY_LISTS:
        values.pop(name, None)
        source = () if base is None else _list_source(base, name)
        values[_LAZY_KEYS[name]] = _LazyList(source, part, name, chain)
    return new


def _refuse_constant(name: str) -> Any:
    raise ValueError("%s is not a number JSON allows" % name)


# NaN and Infinity are no JSON, though Python's json reads them: a frame holding one is bad.
# (A number too big for a float, 1e999, still reads as inf: the field checks refuse it.)
_STRICT_JSON = json.JSONDecoder(parse_constant=_refuse_constant)


def parse_json(text: str) -> Any:
    """json.loads without NaN/Infinity; raises ValueError (deep nesting included) for what is not one JSON value."""
    try:
        return _STRICT_JSON.decode(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


# json.loads without its Python wrapper (two regex matches and a few calls per line): the
# main part starts with "{" (checked) and json.loads allows only this whitespace after it.
_scan_once = _STRICT_JSON.scan_once  # type: ignore[attr-defined]
_JSON_WHITESPACE = " \t\n\r"


def _json_problem(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    if isinstance(exc, json.JSONDecodeError):
        return "not JSON (%s at character %d)" % (exc.msg, exc.pos)
    if isinstance(exc, StopIteration):
        return "not JSON"
    return "not JSON (%s)" % exc


class StreamDecoder(object):
    """The console's end of one probe stream: turns lines into frames, keyframes and deltas alike.

    Every field is checked where it is decoded (model.from_wire / replace_from_wire): a line
    that starts as a frame ("{") but is no valid one is a bad frame, reported as
    "bad frame: <reason>", and the last good frame stays `last`. Process lists sent after a
    TAB are decoded (and checked) when first read (LazyListsFrame). If one of those fails
    (a bad line the probe should never send), that frame's list is empty and the deltas
    after it are dropped until a keyframe, as for any bad delta.
    """

    def __init__(self) -> None:
        self.last: Optional[NodeFrame] = None
        self.keyframes = 0
        self.deltas = 0
        self.dropped = 0
        self.bad = 0  # lines that started as a frame and failed its checks
        self._chain = _Chain()

    def decode_line(self, line: str) -> Tuple[Optional[NodeFrame], Optional[str]]:
        """(frame, None) for a frame; (None, why) for a bad frame ("bad frame: ...") or a dropped
        delta; (None, None) for a line that is no frame (text that does not start with "{")."""
        if line[:1] != "{":
            line = line.strip()
            if line[:1] != "{":
                return None, None
        main, _, lazy = line.partition(LAZY_SEPARATOR)
        lazy = lazy.rstrip()
        if lazy and not lazy.endswith("]}"):
            return self._bad("cut short")  # lists of flat objects end so, and only at the end
        try:
            data, end = _scan_once(main, 0)
        except (ValueError, StopIteration, RecursionError) as exc:
            return self._bad(_json_problem(exc))
        if type(data) is not dict or (end != len(main) and main[end:].strip(_JSON_WHITESPACE)):
            return self._bad("not one JSON object")  # as json.loads: one JSON value, then only JSON whitespace
        if self._chain.error is not None:  # an earlier frame's lists did not apply: that chain is over
            broken, self._chain = self._chain.error, _Chain()
            self.last = None
            if "delta" in data:
                self.dropped += 1
                return None, "delta dropped (%s): waiting for a keyframe" % broken
        base = self.last
        if "delta" in data:
            try:
                frame = apply_delta(base, data)
            except FrameError as exc:  # BadDelta: malformed in itself
                return self._bad(str(exc))
            except DeltaError as exc:
                self.dropped += 1
                return None, "delta dropped (%s): waiting for a keyframe" % exc
            self.deltas += 1
        else:
            try:
                frame = from_wire(NodeFrame, data)
            except FrameError as exc:
                return self._bad(str(exc))
            self.keyframes += 1
            base = None
        if lazy:
            frame = _with_lazy_lists(frame, base, lazy, self._chain)
        self.last = frame
        return frame, None

    def _bad(self, why: str) -> Tuple[None, str]:
        # The last good frame stays `last`: the deltas built on the bad line are dropped until a keyframe.
        self.bad += 1
        return None, BAD_FRAME + why


__all__ = [
    "BAD_FRAME",
    "BadDelta",
    "DEFAULT_KEYFRAME_EVERY",
    "DELTA_FORMAT",
    "LAZY_CORES",
    "LAZY_LISTS",
    "DeltaEncoder",
    "DeltaError",
    "LazyCoresHost",
    "LazyListsFrame",
    "StreamDecoder",
    "apply_delta",
    "delta_of",
    "parse_json",
    "round_wire",
    "rounded_wire",
    "split_line",
]
