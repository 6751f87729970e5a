"""Keyframe + delta wire form of the probe stream: the agent's encoder and the console's decoder.

A keyframe is a plain full frame line (what `frame_line` prints, floats rounded as below).
A delta line carries only what changed since the previous line the agent sent:

    {"delta": 1, "base": SEQ_OF_PREVIOUS,
     "f": {changed top-level scalar fields, seq and time included},
     "host": null | {full host} | {"@": 0, changed host fields},
     "gpus" / "processes" / "top_processes": [ITEM, ...]}

A list field is sent only when it changed, and then as the whole new list in order, each
ITEM being: an int (the previous list's item at that position, unchanged), {"@": i,
changed fields} (the previous item at position i with those fields changed) or a full item
(new). The encoder matches items by key (GPU index; pid and gpu_index for GPU processes;
pid for host processes) and diffs against exactly the item it refers to, so the decoded
frame is right whatever the keys are. Nested lists inside a host (disks, net) travel whole.

The decoder applies a delta to the last frame only when "base" is that frame's seq, and
rebuilds only the objects that changed: an unchanged GpuSample, HostSample or
ProcessSample is the same object as in the previous frame. A delta that does not fit is
dropped (an error value, not an exception) and the chain waits for the next keyframe,
which the agent sends first, every `keyframe_every` lines and after any encode problem.

Shipped to nodes with the probe: stdlib only, Python 3.8 syntax.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Tuple

from opsconsole.model import (
    GpuSample,
    HostSample,
    NodeFrame,
    ProcessSample,
    from_wire,
    replace_decoded,
    replace_from_wire,
    to_wire,
)

DELTA_FORMAT = 1
DEFAULT_KEYFRAME_EVERY = 30
CHANGED = "@"  # key of a changed item: the position of the item it changes in the previous list

_LISTS = (("gpus", GpuSample), ("processes", ProcessSample), ("top_processes", ProcessSample))
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
_PROCESS_DIGITS = {"cpu_percent": 1, "elapsed_s": 2, "gpu_sm_percent": 1}
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
        for proc in wire.get(name) or ():
            if type(proc) is dict:
                _round_fields(proc, _PROCESS_DIGITS)
    return wire


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


def _diff_list(old: List[Any], new: List[Any], key: Callable[[Dict[str, Any]], Any]) -> Optional[List[Any]]:
    """The delta items of list `new` against `old`; None when nothing changed (order included)."""
    if type(old) is not list or type(new) is not list:
        raise _EncodeProblem("not a list")
    position = {}  # type: Dict[Any, int]
    for i, item in enumerate(old):
        if type(item) is not dict:
            raise _EncodeProblem("list item is not an object")
        position.setdefault(key(item), i)
    changed = len(old) != len(new)
    out = []  # type: List[Any]
    for j, item in enumerate(new):
        if type(item) is not dict:
            raise _EncodeProblem("list item is not an object")
        i = position.get(key(item))
        diff = None if i is None else _diff_item(old[i], item)
        if diff is None:  # new, or not comparable: sent whole
            out.append(item)
            changed = True
        elif diff:
            diff[CHANGED] = i
            out.append(diff)
            changed = True
        else:
            out.append(i)
            changed = changed or i != j
    return out if changed else None


def delta_of(old: Dict[str, Any], new: Dict[str, Any]) -> Dict[str, Any]:
    """The delta dict that turns wire frame `old` into `new` (raises _EncodeProblem when it can't)."""
    seq = new.get("seq")
    base = old.get("seq")
    if type(seq) is not int or type(base) is not int or seq == base:
        raise _EncodeProblem("seq must be an int that changes")
    if old.keys() != new.keys():
        raise _EncodeProblem("frame fields changed")
    delta = {"delta": DELTA_FORMAT, "base": base}  # type: Dict[str, Any]
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


class DeltaEncoder(object):
    """Turns successive frames into stream lines: a keyframe first and every `keyframe_every` lines, deltas between.

    Any problem encoding a delta (a frame the diff does not understand) sends a keyframe
    instead. The encoder keeps the last wire dict it was given: don't change it afterwards.
    """

    def __init__(self, keyframe_every: int = DEFAULT_KEYFRAME_EVERY) -> None:
        self.keyframe_every = max(1, int(keyframe_every))
        self._last = None  # type: Optional[Dict[str, Any]]
        self._since_keyframe = 0
        self.keyframes = 0
        self.deltas = 0

    def force_keyframe(self) -> None:
        """Make the next line a keyframe."""
        self._last = None

    def encode(self, frame: NodeFrame) -> str:
        """The line (no newline) for `frame`, floats rounded."""
        return self.encode_wire(rounded_wire(frame))

    def encode_wire(self, wire: Dict[str, Any]) -> str:
        """The line (no newline) for a frame already in (rounded) wire form."""
        last, self._last = self._last, None  # stays None if encoding fails: the next line is a keyframe
        line = None  # type: Optional[str]
        if last is not None and self._since_keyframe < self.keyframe_every:
            try:
                line = _dumps(delta_of(last, wire))
            except (_EncodeProblem, TypeError, ValueError, AttributeError, KeyError):
                line = None
        if line is None:
            line = _dumps(wire)
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


def _apply_host(old: Optional[HostSample], change: Any) -> Optional[HostSample]:
    if change is None:
        return None
    if type(change) is not dict:
        raise DeltaError("host: expected an object")
    if change.pop(CHANGED, None) is None:
        return from_wire(HostSample, change)
    if old is None:
        raise DeltaError("host: changes to a host the last frame does not have")
    return replace_from_wire(old, change)


def _apply_list(old: Tuple[Any, ...], items: Any, cls: type, name: str) -> Tuple[Any, ...]:
    if type(items) is not list:
        raise DeltaError("%s: expected a list" % name)
    out = []
    append = out.append
    count = len(old)
    for item in items:
        kind = type(item)
        if kind is int:
            if not 0 <= item < count:
                raise DeltaError("%s: no item %d in the last frame (it has %d)" % (name, item, count))
            append(old[item])
        elif kind is dict:
            at = item.pop(CHANGED, None)  # popped: the rest are field names only (the fast path)
            if at is None:
                append(from_wire(cls, item))
            elif type(at) is int and 0 <= at < count:
                append(replace_from_wire(old[at], item))
            else:
                raise DeltaError("%s: no item %r in the last frame (it has %d)" % (name, at, count))
        else:
            raise DeltaError("%s: bad item %r" % (name, item))
    return tuple(out)


def apply_delta(base: Optional[NodeFrame], delta: Dict[str, Any]) -> NodeFrame:
    """The frame that `delta` makes of `base`, reusing every unchanged object; raises DeltaError."""
    if delta.get("delta") != DELTA_FORMAT:
        raise DeltaError("unknown delta format %r" % (delta.get("delta"),))
    if base is None:
        raise DeltaError("delta before any keyframe")
    if delta.get("base") != base.seq:
        raise DeltaError("delta on seq %r, the last frame is seq %r" % (delta.get("base"), base.seq))
    scalars = delta.get("f")
    if type(scalars) is not dict or _NESTED_FRAME_FIELDS.intersection(scalars):
        raise DeltaError("bad top-level fields")
    values = {}  # type: Dict[str, Any]
    try:
        if "host" in delta:
            values["host"] = _apply_host(base.host, delta["host"])
        for name, cls in _LISTS:
            if name in delta:
                values[name] = _apply_list(getattr(base, name), delta[name], cls, name)
        frame = replace_from_wire(base, scalars)
    except DeltaError:
        raise
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        raise DeltaError("bad delta: %s: %s" % (type(exc).__name__, exc)) from None
    return replace_decoded(frame, values) if values else frame


class StreamDecoder(object):
    """The console's end of one probe stream: turns lines into frames, keyframes and deltas alike."""

    def __init__(self) -> None:
        self.last = None  # type: Optional[NodeFrame]
        self.keyframes = 0
        self.deltas = 0
        self.dropped = 0

    def decode_line(self, line: str) -> Tuple[Optional[NodeFrame], Optional[str]]:
        """(frame, None) for a frame; (None, why) for a dropped delta; (None, None) for a line that is no frame."""
        if line[:1] != "{":
            line = line.strip()
            if line[:1] != "{":
                return None, None
        try:
            data = json.loads(line)
        except ValueError:
            return None, None
        if type(data) is not dict:
            return None, None
        if "delta" in data:
            try:
                frame = apply_delta(self.last, data)
            except DeltaError as exc:
                self.dropped += 1
                return None, "delta dropped (%s): waiting for a keyframe" % exc
            self.deltas += 1
        else:
            try:
                frame = from_wire(NodeFrame, data)
            except (ValueError, TypeError, AttributeError):
                return None, None
            self.keyframes += 1
        self.last = frame
        return frame, None


__all__ = [
    "DEFAULT_KEYFRAME_EVERY",
    "DELTA_FORMAT",
    "DeltaEncoder",
    "DeltaError",
    "StreamDecoder",
    "apply_delta",
    "delta_of",
    "round_wire",
    "rounded_wire",
]
