"""A restricted unpickler for a checkpoint's data.pkl: structure and metadata, never tensors, never code.

torch.save pickles the object tree into `<stem>/data.pkl` and puts each storage in its own
zip member; tensors appear as calls of `torch._utils._rebuild_tensor_v2` on a persistent id.
Here those calls build `TensorStub`s (dtype, shape, which storage) without importing torch,
and only the globals in SAFE_GLOBALS resolve to anything. Every other global (a class of the
training code, `datetime.datetime`, `os.system` in a malicious file) becomes an inert
`Unresolved` placeholder: its name is reported, nothing of it is imported or run.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

MAX_PICKLE_BYTES = 512 * 1024 * 1024

# torch dtypes as pickled (`torch.float32`) and their item sizes.
DTYPE_SIZES: Dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8, "bool": 1,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
}
DTYPE_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64", "int": "int32",
                 "short": "int16", "cfloat": "complex64", "cdouble": "complex128"}
# Legacy typed storages named in persistent ids (`torch.FloatStorage`) and the dtype they hold.
STORAGE_DTYPES: Dict[str, str] = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool", "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64", "QInt8Storage": "qint8", "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32", "QUInt4x2Storage": "quint4x2", "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8",
}


@dataclass(frozen=True)
class DtypeStub:
    """A torch dtype, by name."""

    name: str

    @property
    def itemsize(self) -> int:
        return DTYPE_SIZES.get(self.name, 1)

    def __repr__(self) -> str:
        return "torch." + self.name


class StorageStub:
    """A storage named by data.pkl's persistent id: its zip key, dtype and element count."""

    __slots__ = ("key", "dtype", "numel", "location")

    def __init__(self, key: str, dtype: str, numel: int, location: str) -> None:
        self.key, self.dtype, self.numel, self.location = key, dtype, numel, location

    def __repr__(self) -> str:
        return "storage(%s, %s, %d)" % (self.key, self.dtype, self.numel)


@dataclass(frozen=True)
class DeviceStub:
    spec: str

    def __repr__(self) -> str:
        return "device(%r)" % self.spec


class TensorStub:
    """A tensor as data.pkl describes it; its data stays in the zip.

    A slotted class, not a frozen dataclass: a big state dict builds tens of thousands of
    these per checkpoint. Equality and hashing are by identity.
    """

    __slots__ = ("storage", "offset", "shape", "dtype")

    def __init__(self, storage: StorageStub, offset: int, shape: Tuple[int, ...], dtype: str) -> None:
        self.storage, self.offset, self.shape, self.dtype = storage, offset, shape, dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZES.get(self.dtype, 1)

    def __repr__(self) -> str:
        return "tensor(%s, shape=%s)" % (self.dtype, list(self.shape))


class Unresolved:
    """An object of a global outside the safe list: records what pickle handed it, runs nothing."""

    qualname = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.state: Any = None
        self.items: Dict[Any, Any] = {}
        self.values: List[Any] = []

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value

    def append(self, value: Any) -> None:
        self.values.append(value)

    def extend(self, values: Any) -> None:
        self.values.extend(values)

    def __repr__(self) -> str:
        return "<%s: not loaded>" % self.qualname


def _unresolved_class(qualname: str) -> type:
    return type("Unresolved", (Unresolved,), {"qualname": qualname})


def _size(*args: Any) -> Tuple[int, ...]:
    return tuple(args[0]) if args else ()


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any = None, *rest: Any) -> Any:
    if type(storage) is not StorageStub:
        return _unresolved_class("tensor without a storage")(storage)
    shape = tuple(size) if type(size) is tuple else (tuple(size) if isinstance(size, list) else ())
    return TensorStub(storage, storage_offset if type(storage_offset) is int else 0, shape, storage.dtype)


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    return data


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any = None) -> Any:
    # func is itself a resolved global (a stub) or an Unresolved class: calling either runs nothing.
    if callable(func) and isinstance(args, tuple):
        return func(*args)
    return _unresolved_class("tensor subclass")(args)


def _codecs_encode(text: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    # Protocol 2 pickles bytes as _codecs.encode(str, "latin1"): only str in, only text codecs.
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1", "utf-8", "utf8", "ascii"):
        raise pickle.UnpicklingError("_codecs.encode used on %s" % type(text).__name__)
    return text.encode(encoding, errors)


def _bytearray(value: Any = b"", *rest: Any) -> bytearray:
    # bytearray(10**12) would allocate: only copies of bytes the pickle itself holds.
    if isinstance(value, str):
        return bytearray(value, *rest)
    if not isinstance(value, (bytes, bytearray)):
        raise pickle.UnpicklingError("bytearray of %s" % type(value).__name__)
    return bytearray(value)


def _storage_class(name: str) -> Any:
    return DtypeStub(STORAGE_DTYPES[name])


def _safe_globals() -> Dict[Tuple[str, str], Any]:
    table: Dict[Tuple[str, str], Any] = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("collections", "defaultdict"): collections.defaultdict,
        ("collections", "Counter"): collections.Counter,
        ("builtins", "set"): set,
        ("builtins", "frozenset"): frozenset,
        ("builtins", "complex"): complex,
        ("builtins", "slice"): slice,
        ("builtins", "bytearray"): _bytearray,
        ("builtins", "list"): list,
        ("builtins", "dict"): dict,
        ("builtins", "tuple"): tuple,
        ("builtins", "int"): int,
        ("builtins", "float"): float,
        ("builtins", "str"): str,
        ("builtins", "bool"): bool,
        ("_codecs", "encode"): _codecs_encode,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
        ("torch._utils", "_rebuild_tensor"): _rebuild_tensor_v2,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
        ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
        ("torch", "Size"): _size,
        ("torch", "device"): DeviceStub,
        ("torch.nn.parameter", "Parameter"): _unresolved_class("torch.nn.parameter.Parameter"),
        ("torch", "Tensor"): _unresolved_class("torch.Tensor"),
    }
    for name in list(DTYPE_SIZES) + list(DTYPE_ALIASES):
        table[("torch", name)] = DtypeStub(DTYPE_ALIASES.get(name, name))
    for name in STORAGE_DTYPES:
        table[("torch", name)] = _storage_class(name)
        table[("torch.storage", name)] = _storage_class(name)
    return table


SAFE_GLOBALS = _safe_globals()


@dataclass
class UnpickleResult:
    """The object tree with stubs, the storages it named, and the globals it was refused."""

    value: Any = None
    storages: Dict[str, StorageStub] = field(default_factory=dict)
    unsafe_globals: List[str] = field(default_factory=list)
    error: Optional[str] = None


class RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler whose find_class knows only SAFE_GLOBALS and whose storages are stubs."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.storages: Dict[str, StorageStub] = {}
        self.unsafe: List[str] = []

    def find_class(self, module: str, name: str) -> Any:
        found = SAFE_GLOBALS.get((module, name))
        if found is not None:
            return found
        qualname = "%s.%s" % (module, name)
        if qualname not in self.unsafe:
            self.unsafe.append(qualname)
        return _unresolved_class(qualname)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            _, storage_type, key, location, numel = pid[:5]
            dtype = storage_type.name if isinstance(storage_type, DtypeStub) else "uint8"
            stub = StorageStub(str(key), dtype, int(numel) if isinstance(numel, int) else 0, str(location))
            self.storages[stub.key] = stub
            return stub
        return _unresolved_class("persistent id %r" % (pid[0] if isinstance(pid, tuple) and pid else pid,))()


def restricted_loads(data: bytes) -> UnpickleResult:
    """Unpickle `data` with stubs; a damaged pickle comes back as `error`, never as an exception."""
    if len(data) > MAX_PICKLE_BYTES:
        return UnpickleResult(error="data.pkl is %d bytes: too large to read" % len(data))
    unpickler = RestrictedUnpickler(data)
    result = UnpickleResult()
    try:
        result.value = unpickler.load()
    except RecursionError:
        result.error = "data.pkl nests too deeply to read"
    except Exception as exc:  # a damaged pickle can raise nearly anything; it is a value here
        result.error = "data.pkl unreadable: %s" % (str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    result.storages = unpickler.storages
    result.unsafe_globals = list(unpickler.unsafe)
    return result


def unsafe_message(names: List[str]) -> Optional[str]:
    """`uses types outside the safe list: datetime.datetime` (None when there are none)."""
    if not names:
        return None
    shown = names[:5]
    more = "" if len(names) <= 5 else " and %d more" % (len(names) - 5)
    return "uses types outside the safe list: %s%s" % (", ".join(shown), more)


ScalarReader = Callable[[TensorStub], Optional[float]]
