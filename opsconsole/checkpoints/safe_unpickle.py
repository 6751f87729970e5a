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
import pickletools
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

MAX_PICKLE_BYTES = 512 * 1024 * 1024
MAX_GLOBALS = 10_000  # distinct names one pickle may look up
MAX_UNSAFE_LISTED = 100
MAX_GLOBAL_NAME = 200
# The work bounds of one data.pkl, checked by a walk of its opcodes before it is unpickled.
# A state dict costs about 20 operations and 20 units of hashing per tensor.
MAX_PICKLE_OPS = 10_000_000  # also bounds memory: at most one new object (~100 bytes) each
MAX_HASH_WORK = 200_000_000  # elements of keys, set members and call arguments hashed or compared
MEMO_SLACK = 1024  # pickles number their memo from 0; an index far past the operations so far is abuse

# torch dtypes as pickled (`torch.float32`) and their item sizes.
DTYPE_SIZES: Dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "complex128": 16,
    "complex64": 8,
    "complex32": 4,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
    "qint8": 1,
    "quint8": 1,
    "qint32": 4,
    "quint4x2": 1,
    "quint2x4": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
}
DTYPE_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
    "cfloat": "complex64",
    "cdouble": "complex128",
}
# Legacy typed storages named in persistent ids (`torch.FloatStorage`) and the dtype they hold.
STORAGE_DTYPES: Dict[str, str] = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64",
    "QInt8Storage": "qint8",
    "QUInt8Storage": "quint8",
    "QInt32Storage": "qint32",
    "QUInt4x2Storage": "quint4x2",
    "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8",
}


class DtypeStub:
    """A torch dtype, by name.

    Slotted and read-only: a pickle's BUILD on it (setattr, or an update of its __dict__)
    fails instead of renaming the dtype of every checkpoint read after it.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "name", name)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("DtypeStub is read-only")

    def __eq__(self, other: Any) -> bool:
        return type(other) is DtypeStub and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

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


MAX_DIMS = 64
MAX_EXTENT = 2**63  # no dimension, offset or element count of a real tensor reaches it


def _count(value: Any) -> Optional[int]:
    """`value` when it is a plausible element count or offset (a non-negative int below 2**63)."""
    return value if type(value) is int and 0 <= value < MAX_EXTENT else None


def _shape(size: Any) -> Optional[Tuple[int, ...]]:
    # A shape of lists or huge numbers would make numel a list product or a giant number.
    if type(size) not in (tuple, list) or len(size) > MAX_DIMS:
        return None
    dims = tuple(_count(dim) for dim in size)
    return None if None in dims else dims  # type: ignore[return-value]


def _size(*args: Any) -> Any:
    if not args:
        return ()
    shape = _shape(args[0])
    return shape if shape is not None else _unresolved_class("torch.Size of %s" % type(args[0]).__name__)(args)


def _rebuild_tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any = None, *rest: Any) -> Any:
    if type(storage) is not StorageStub:
        return _unresolved_class("tensor without a storage")(storage)
    shape = _shape(size)
    if shape is None:
        return _unresolved_class("tensor with a malformed shape")(storage)
    offset = _count(storage_offset)
    return TensorStub(storage, offset if offset is not None else 0, shape, storage.dtype)


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


TEXT_CODECS = ("latin1", "latin-1", "utf-8", "utf8", "ascii")


def _text_codec_args(rest: Tuple[Any, ...]) -> Tuple[Any, ...]:
    # Any other codec name is a codec lookup (an import) and some codecs are slow on purpose-made input.
    if (
        len(rest) > 2
        or (rest and rest[0] not in TEXT_CODECS)
        or (len(rest) == 2 and rest[1] not in ("strict", "replace", "ignore"))
    ):
        raise pickle.UnpicklingError("a codec outside %s" % (TEXT_CODECS,))
    return rest


def _str(value: Any = "", *rest: Any) -> str:
    # str() of a container is its repr: of a shared nested list, exponential.
    if rest:
        if not isinstance(value, (bytes, bytearray)):
            raise pickle.UnpicklingError("str() decoding %s" % type(value).__name__)
        return str(value, *_text_codec_args(rest))
    if not isinstance(value, (str, int, float, bool)):
        raise pickle.UnpicklingError("str() of %s" % type(value).__name__)
    return str(value)


def _bytearray(value: Any = b"", *rest: Any) -> bytearray:
    # bytearray(10**12) would allocate: only copies of bytes the pickle itself holds.
    if isinstance(value, str):
        return bytearray(value, *_text_codec_args(rest))
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
        ("builtins", "str"): _str,
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


def _fresh(found: Any) -> Any:
    """A safe global as this one pickle may use it: BUILD on it changes only this copy.

    Handing out the shared object itself let a pickle's BUILD setattr on it: on
    collections.Counter (a Python class) for the whole process, on our own functions'
    __defaults__. A wrapper function made per lookup, or a fresh placeholder class, is the
    pickle's own. DtypeStubs are read-only and are shared as they are.
    """
    if type(found) is DtypeStub:
        return found
    if isinstance(found, type) and issubclass(found, Unresolved):
        return _unresolved_class(found.qualname)

    def call(*args: Any, **kwargs: Any) -> Any:
        return found(*args, **kwargs)

    call.__qualname__ = call.__name__ = getattr(found, "__name__", "safe global")
    return call


def _id_text(value: Any) -> str:
    # A persistent id names storages by short text; a huge int or a container is not one.
    if type(value) is str:
        return value[:256]
    if type(value) is int and -(10**18) < value < 10**18:
        return str(value)
    return "<%s>" % type(value).__name__


@dataclass
class UnpickleResult:
    """The object tree with stubs, the storages it named, and the globals it was refused."""

    value: Any = None
    storages: Dict[str, StorageStub] = field(default_factory=dict)
    unsafe_globals: List[str] = field(default_factory=list)
    error: Optional[str] = None
    over_limit: bool = False  # the error is a work bound of ours, not damage: the file may well be fine


class PickleLimit(Exception):
    """The pickle needs more work than the bounds allow (not a sign of damage)."""


class PickleDamaged(Exception):
    """The opcode walk found what the unpickler would refuse."""


class _Box:
    """A mutable object on the simulated stack (list, dict, set, a call's result): its size grows."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


def _weight(value: Any) -> int:
    return value.size if type(value) is _Box else value


def _pop_mark(stack: List[Any], marks: List[List[Any]]) -> Tuple[List[Any], List[Any]]:
    if not marks:
        raise PickleDamaged("no MARK before a MARK-using opcode")
    items = stack
    return marks.pop(), items


def check_pickle_work(data: bytes) -> None:
    """Walk the opcodes of `data` with sizes instead of objects; raise PickleLimit or PickleDamaged.

    The C unpickler cannot be stopped once started, and a few bytes of pickle can ask it for
    unbounded work: LONG_BINPUT 50_000_000 makes it allocate and clear a memo of 400 MB; a
    tuple built as t1 = (t0, t0), t2 = (t1, t1) ... through the memo costs 2**levels to hash
    as a dict key. Here every value carries its expanded size (capped), and every place that
    hashes (keys, set members, a call's arguments) charges that size to one budget.
    """
    cap = MAX_HASH_WORK + 1
    stack: List[Any] = []
    marks: List[List[Any]] = []
    memo: Dict[int, Any] = {}
    work = 0
    ops = 0
    try:
        for op, arg, _ in pickletools.genops(data):
            ops += 1
            if ops > MAX_PICKLE_OPS:
                raise PickleLimit("over %d pickle operations" % MAX_PICKLE_OPS)
            code = op.code
            if code in "qrp\x94":  # BINPUT, LONG_BINPUT, PUT, MEMOIZE
                if not stack:
                    raise PickleDamaged("memo put on an empty stack")
                index = len(memo) if code == "\x94" else int(arg)
                if index > ops + MEMO_SLACK:
                    raise PickleDamaged("memo index %d out of range" % index)
                memo[index] = stack[-1]
            elif code in "hjg":  # BINGET, LONG_BINGET, GET
                if arg not in memo:
                    raise PickleDamaged("memo key %r missing" % (arg,))
                stack.append(memo[arg])
            elif code == "(":
                marks.append(stack)
                stack = []
            elif code in "]}\x8f":  # EMPTY_LIST, EMPTY_DICT, EMPTY_SET
                stack.append(_Box(1))
            elif code in "tld\x91":  # TUPLE, LIST, DICT, FROZENSET
                stack, items = _pop_mark(stack, marks)
                size = min(cap, 1 + sum(_weight(v) for v in items))
                if code == "d":
                    work += sum(_weight(v) for v in items[::2])
                elif code == "\x91":
                    work += size
                stack.append(_Box(size) if code in "ld" else size)
            elif code in "\x85\x86\x87":  # TUPLE1..3
                count = ord(code) - 0x84
                if len(stack) < count:
                    raise PickleDamaged("stack underflow")
                size = min(cap, 1 + sum(_weight(v) for v in stack[-count:]))
                del stack[-count:]
                stack.append(size)
            elif code in "aeus\x90":  # APPEND, APPENDS, SETITEMS, SETITEM, ADDITEMS
                if code in "eu\x90":
                    stack, items = _pop_mark(stack, marks)
                else:
                    take = 1 if code == "a" else 2
                    if len(stack) < take + 1:
                        raise PickleDamaged("stack underflow")
                    items = stack[-take:]
                    del stack[-take:]
                if not stack:
                    raise PickleDamaged("stack underflow")
                added = sum(_weight(v) for v in items)
                if code in "us":
                    work += sum(_weight(v) for v in items[::2])
                elif code == "\x90":
                    work += added
                target = stack[-1]
                if type(target) is _Box:
                    target.size = min(cap, target.size + added)
            elif code in "R\x81b":  # REDUCE, NEWOBJ, BUILD: (callable or object, argument)
                if len(stack) < 2:
                    raise PickleDamaged("stack underflow")
                argument = stack.pop()
                if code == "b":
                    target = stack[-1]
                    if type(target) is _Box:
                        target.size = min(cap, target.size + _weight(argument))
                    continue
                work += _weight(argument)
                stack[-1] = _Box(min(cap, 1 + _weight(argument)))
            elif code == "\x92":  # NEWOBJ_EX: cls, args, kwargs
                if len(stack) < 3:
                    raise PickleDamaged("stack underflow")
                size = min(cap, 1 + _weight(stack[-1]) + _weight(stack[-2]))
                work += size
                del stack[-2:]
                stack[-1] = _Box(size)
            elif code in "oi":  # OBJ, INST: everything since the mark
                stack, items = _pop_mark(stack, marks)
                size = min(cap, 1 + sum(_weight(v) for v in items))
                work += size
                stack.append(_Box(size))
            elif code == "Q":  # BINPERSID
                if not stack:
                    raise PickleDamaged("stack underflow")
                stack[-1] = _Box(min(cap, 1 + _weight(stack[-1])))
            elif code == "\x93":  # STACK_GLOBAL
                if len(stack) < 2:
                    raise PickleDamaged("stack underflow")
                del stack[-2:]
                stack.append(1)
            elif code == "0":  # POP (of the mark itself when the stack above it is empty)
                if stack:
                    stack.pop()
                else:
                    stack, _ = _pop_mark(stack, marks)
            elif code == "1":  # POP_MARK
                stack, _ = _pop_mark(stack, marks)
            elif code == "2":  # DUP
                if not stack:
                    raise PickleDamaged("stack underflow")
                stack.append(stack[-1])
            elif code in "\x80\x95.\x98":  # PROTO, FRAME, STOP, READONLY_BUFFER: no stack change here
                pass
            else:  # every other opcode pushes one scalar, global or reference
                stack.append(1)
            if work > MAX_HASH_WORK:
                raise PickleLimit("objects that take over %d steps to hash or compare" % MAX_HASH_WORK)
    except (ValueError, KeyError, TypeError, IndexError) as exc:  # genops on bytes that are no pickle
        raise PickleDamaged(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None


class RestrictedUnpickler(pickle.Unpickler):
    """pickle.Unpickler whose find_class knows only SAFE_GLOBALS and whose storages are stubs."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.storages: Dict[str, StorageStub] = {}
        self.unsafe: List[str] = []
        # One object per name and pickle: a fresh class per GLOBAL opcode let 10 MB of
        # GLOBALs build millions of classes; one per name is still the pickle's own copy.
        self.globals_seen: Dict[Tuple[str, str], Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        key = (module, name)
        found = self.globals_seen.get(key)
        if found is not None:
            return found
        if len(self.globals_seen) >= MAX_GLOBALS:
            raise pickle.UnpicklingError("over %d distinct globals" % MAX_GLOBALS)
        safe = SAFE_GLOBALS.get(key)
        if safe is not None:
            found = _fresh(safe)
        else:
            qualname = ("%s.%s" % (module, name))[:MAX_GLOBAL_NAME]
            if len(self.unsafe) < MAX_UNSAFE_LISTED and qualname not in self.unsafe:
                self.unsafe.append(qualname)
            found = _unresolved_class(qualname)
        self.globals_seen[key] = found
        return found

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is tuple and len(pid) >= 5 and pid[0] == "storage":
            _, storage_type, key, location, numel = pid[:5]
            dtype = storage_type.name if isinstance(storage_type, DtypeStub) else "uint8"
            stub = StorageStub(_id_text(key), dtype, _count(numel) or 0, _id_text(location))
            self.storages[stub.key] = stub
            return stub
        first = pid[0] if type(pid) is tuple and pid else pid
        return _unresolved_class("persistent id %s" % _id_text(first))()


def error_text(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, bounded (float('<100 MB>') quotes all of it)."""
    text = str(exc)
    line = text[: limit + 1].splitlines()[0] if text.strip() else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


# The opcode walk costs about 2.5 us an operation in pure Python, most of a warm listing's
# time. The metadata worker turns it off for a first try (its process limits bound that
# try: CPU, memory, a crash) and reads a file again with it on only when the try fails.
WALK_FIRST = True


def restricted_loads(data: bytes) -> UnpickleResult:
    """Unpickle `data` with stubs; a damaged pickle comes back as `error`, never as an exception."""
    if len(data) > MAX_PICKLE_BYTES:
        return UnpickleResult(error="data.pkl is %d bytes: too large to read" % len(data))
    if not WALK_FIRST:
        quick = _unpickle(data)
        if quick.error is None:
            return quick
        # Damaged: the walk's verdict is the one every reader gives (the same text in and out of the worker).
    try:
        check_pickle_work(data)
    except PickleLimit as limit:
        return UnpickleResult(error="data.pkl not read: %s" % limit, over_limit=True)
    except PickleDamaged as damage:
        return UnpickleResult(error="data.pkl unreadable: %s" % error_text(damage))
    return _unpickle(data)


def _unpickle(data: bytes) -> UnpickleResult:
    unpickler = RestrictedUnpickler(data)
    result = UnpickleResult()
    try:
        result.value = unpickler.load()
    except RecursionError:
        result.error = "data.pkl nests too deeply to read"
    except MemoryError:
        raise  # not damage: the memory limit of the process reading it (the metadata worker's), said as such there
    except Exception as exc:  # a damaged pickle can raise nearly anything; it is a value here
        result.error = "data.pkl unreadable: %s" % error_text(exc)
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
