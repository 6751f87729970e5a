"""Hostile bytes into every checkpoint reader: a value with a problem, never an exception, a hang or code run.

Property tests (hypothesis, a small budget each) over safetensors headers, mutated real torch
zips, crafted data.pkl pickles, plain pickles and JSON sidecars; then one concrete regression
input for each bug the fuzzers found.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
from typing import Any, List

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from opsconsole.checkpoints import formats, zipmeta
from opsconsole.checkpoints.metadata import metadata_from_tree
from opsconsole.checkpoints.records import INTEGRITIES, CheckpointMeta
from opsconsole.checkpoints.safe_unpickle import SAFE_GLOBALS, restricted_loads

# --- the canary: a global that a pickle names; calling it would be running the pickle's code ------

CANARY_CALLS: List[Any] = []


def canary(*args: Any, **kwargs: Any) -> str:
    """Referenced by GLOBAL in the fuzzed pickles: it must never be called."""
    CANARY_CALLS.append(args)
    return "ran"


CANARY_GLOBAL = ("%s\ncanary\n" % __name__).encode()


@pytest.fixture(autouse=True)
def no_canary_calls():
    CANARY_CALLS.clear()
    yield
    assert CANARY_CALLS == [], "a pickle's global was called"


# --- running readers on bytes in memory --------------------------------------------------------


def drive(reader, data: bytes):
    """Answer a reader generator's read requests from `data` (what pread on a file of it returns)."""
    try:
        request = next(reader)
        while True:
            offset, length = request
            assert offset >= 0 and length >= 0, "a reader asked for %r" % (request,)
            assert length <= len(data) + 64 * 1024 * 1024, "a reader asked for %d bytes of a %d-byte file" % (
                length,
                len(data),
            )
            request = reader.send(data[offset : offset + length])
    except StopIteration as stop:
        return stop.value


def check_result(result) -> None:
    assert isinstance(result, formats.ReadResult)
    assert result.integrity in INTEGRITIES
    assert result.problem is None or isinstance(result.problem, str)
    assert isinstance(result.meta, CheckpointMeta)
    # Everything shown must be cheap to show: short texts, no giant strings.
    for key, text in result.meta.details:
        assert isinstance(key, str) and isinstance(text, str) and len(text) <= 400 and len(key) <= 400
    assert all(isinstance(k, str) and len(k) <= 400 for k in result.meta.top_keys)
    if result.problem is not None:
        assert len(result.problem) <= 2000


def read_file(name: str, data: bytes, window: int = formats.HEAD_BYTES) -> formats.ReadResult:
    result = drive(formats.file_reader(name, len(data), window), data)
    check_result(result)
    return result


def torch_zip(pickled: bytes, extra: dict = {}) -> bytes:
    """data.pkl zipped the way torch.save lays it out (stored members under `archive/`)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickled)
        for name, data in extra.items():
            archive.writestr("archive/" + name, data)
        archive.writestr("archive/version", b"3\n")
    return buffer.getvalue()


def read_pickle_everywhere(pickled: bytes) -> None:
    """A data.pkl through the unpickler alone, inside a torch zip, and as a plain pickle file."""
    loaded = restricted_loads(pickled)
    assert loaded.error is None or isinstance(loaded.error, str)
    if loaded.error is None:
        metadata_from_tree(loaded.value, {}, loaded.unsafe_globals)
    read_file("epoch_1.pt", torch_zip(pickled))
    plain = read_file("plain.pt", pickled)
    assert plain.meta.epoch is None or plain.meta.epoch == 1


_REAL_CHECKPOINT: List[bytes] = []


def real_checkpoint() -> bytes:
    """A small real torch.save zip: a state dict, an epoch, a loss saved as a tensor."""
    if not _REAL_CHECKPOINT:
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "epoch": 3, "loss": torch.tensor(0.5)}, buffer)
        _REAL_CHECKPOINT.append(buffer.getvalue())
    return _REAL_CHECKPOINT[0]


def test_the_real_checkpoint_reads_correctly():
    result = read_file("ckpt.pt", real_checkpoint())
    assert result.problem is None and result.integrity == "ok"
    assert result.meta.epoch == 3 and result.meta.loss == 0.5 and result.meta.state_dict.keys == 2
    crc = drive(zipmeta.full_check_reader(len(real_checkpoint())), real_checkpoint())
    assert crc.integrity == "ok"


# --- (a) safetensors ------------------------------------------------------------------------------

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-(10**500), max_value=10**500),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
tensor_info = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.one_of(st.sampled_from(["F32", "BF16", "I64", "F8_E4M3", "X"]), json_value),
        "shape": st.one_of(st.lists(st.integers(min_value=-1, max_value=2**64), max_size=5), json_value),
        "data_offsets": st.one_of(
            st.lists(st.integers(min_value=-5, max_value=2**65), min_size=2, max_size=2), json_value
        ),
    },
)
safetensors_header = st.one_of(
    st.dictionaries(st.text(max_size=10), st.one_of(tensor_info, json_value), max_size=5),
    st.fixed_dictionaries(
        {"__metadata__": st.dictionaries(st.sampled_from(["epoch", "step", "loss", "global_step", "x"]), json_value)}
    ),
    json_value,
)


@settings(max_examples=80)
@given(
    header=safetensors_header,
    length_kind=st.sampled_from(["exact", "random", "huge", "past_end", "short"]),
    random_length=st.integers(min_value=0, max_value=2**64 - 1),
    raw_header=st.one_of(st.none(), st.binary(max_size=40)),
    trailing=st.binary(max_size=64),
)
def test_safetensors_on_hostile_headers(header, length_kind, random_length, raw_header, trailing):
    text = raw_header if raw_header is not None else json.dumps(header, allow_nan=True).encode()
    length = {
        "exact": len(text),
        "random": random_length,
        "huge": 2**64 - 1 - (random_length % 7),
        "past_end": len(text) + len(trailing) + 1 + random_length % 100,
        "short": max(0, len(text) - 1),
    }[length_kind]
    data = struct.pack("<Q", length) + text + trailing
    result = read_file("model.safetensors", data)
    direct = drive(formats.safetensors_reader(len(data)), data)
    check_result(direct)
    if data[8:9] == b"{":  # what file_reader sniffs as safetensors
        assert (result.integrity, result.problem) == (direct.integrity, direct.problem)


# --- (b) a real torch zip, mutated ---------------------------------------------------------------

mutation = st.tuples(
    st.sampled_from(["flip", "set", "truncate", "insert", "delete"]), st.floats(0, 1), st.binary(min_size=1, max_size=8)
)


def mutate(data: bytes, mutations) -> bytes:
    out = bytearray(data)
    for kind, where, chunk in mutations:
        if not out:
            break
        at = min(int(where * len(out)), len(out) - 1)
        if kind == "flip":
            out[at] ^= chunk[0] or 1
        elif kind == "set":
            out[at : at + len(chunk)] = chunk
        elif kind == "truncate":
            del out[at:]
        elif kind == "insert":
            out[at:at] = chunk
        else:
            del out[at : at + len(chunk)]
    return bytes(out)


@settings(max_examples=80)
@given(mutations=st.lists(mutation, min_size=1, max_size=4), near_end=st.booleans())
def test_a_mutated_real_checkpoint_reads_as_a_value(mutations, near_end):
    data = real_checkpoint()
    if near_end:  # the directory and data.pkl's header are where the parser's decisions are
        mutations = [(kind, 0.85 + where * 0.15, chunk) for kind, where, chunk in mutations]
    damaged = mutate(data, mutations)
    result = read_file("epoch=3-step=10.ckpt", damaged)
    small_window = read_file("epoch=3-step=10.ckpt", damaged, window=1024)
    assert small_window.integrity == result.integrity
    crc = drive(zipmeta.full_check_reader(len(damaged)), damaged)
    assert crc.integrity in INTEGRITIES and (crc.problem is None or isinstance(crc.problem, str))
    quick = drive(formats.zip_check_reader(len(damaged)), damaged)
    check_result(quick)
    # The listing's lean check of a unit's torch files (no entries built) agrees wherever the
    # directory reads whole, and is otherwise a value too.
    integrity, problem = drive(zipmeta.directory_check_reader(len(damaged)), damaged)
    assert integrity in INTEGRITIES and (problem is None or isinstance(problem, str))
    if quick.integrity in ("ok", "no_crc"):
        assert integrity == quick.integrity


# --- (b) crafted data.pkl pickles ------------------------------------------------------------------

GLOBALS = [
    CANARY_GLOBAL,
    b"os\nsystem\n",
    b"builtins\neval\n",
    b"builtins\ngetattr\n",
    b"posix\nsystem\n",
    b"torch._utils\n_rebuild_tensor_v2\n",
    b"torch._utils\n_rebuild_parameter\n",
    b"torch._tensor\n_rebuild_from_type_v2\n",
    b"collections\nOrderedDict\n",
    b"collections\nCounter\n",
    b"collections\ndefaultdict\n",
    b"builtins\nset\n",
    b"builtins\nstr\n",
    b"builtins\nint\n",
    b"builtins\nbytearray\n",
    b"builtins\nslice\n",
    b"_codecs\nencode\n",
    b"torch\nFloatStorage\n",
    b"torch\nfloat32\n",
    b"torch\nSize\n",
    b"torch\ndevice\n",
    b"builtins\ndict\n",
]


def _u32(n: int) -> bytes:
    return struct.pack("<I", n % 2**32)


opcode = st.one_of(
    st.sampled_from(
        [
            b"(",
            b"]",
            b"}",
            b")",
            b"t",
            b"\x85",
            b"\x86",
            b"\x87",
            b"l",
            b"d",
            b"a",
            b"e",
            b"s",
            b"u",
            b"0",
            b"1",
            b"2",
            b"b",
            b"R",
            b"\x81",
            b"\x92",
            b"\x93",
            b"\x94",
            b"\x91",
            b"\x8f",
            b"\x90",
            b"Q",
            b"N",
            b"\x88",
            b"\x89",
            b"\x97",
            b"\x98",
            b"o",
            b".",
        ]
    ),
    st.builds(lambda g: b"c" + g, st.sampled_from(GLOBALS)),
    st.builds(lambda g: b"i" + g, st.sampled_from(GLOBALS)),
    st.builds(
        lambda s: b"\x8c" + bytes([len(s)]) + s,
        st.sampled_from(
            [b"storage", b"0", b"cpu", b"epoch", b"os", b"system", b"builtins", b"eval", __name__.encode(), b"canary"]
        ),
    ),
    st.builds(lambda n: b"K" + bytes([n]), st.integers(0, 255)),
    st.builds(lambda n: b"J" + struct.pack("<i", n), st.integers(-(2**31), 2**31 - 1)),
    st.builds(
        lambda n, b: b"\x8a" + bytes([len(b)]) + b if n else b"\x8b" + _u32(2**32 - 1) + b,
        st.booleans(),
        st.binary(max_size=12),
    ),
    st.builds(lambda n, b: b"X" + _u32(n) + b, st.integers(0, 2**32 - 1), st.binary(max_size=8)),
    st.builds(lambda n, b: b"\x8d" + struct.pack("<Q", n) + b, st.integers(0, 2**64 - 1), st.binary(max_size=8)),
    st.builds(lambda n, b: b"\x8e" + struct.pack("<Q", n) + b, st.integers(0, 2**64 - 1), st.binary(max_size=8)),
    st.builds(lambda n, b: b"\x96" + struct.pack("<Q", n) + b, st.integers(0, 2**64 - 1), st.binary(max_size=8)),
    st.builds(lambda n: b"q" + bytes([n]), st.integers(0, 255)),
    st.builds(lambda n: b"h" + bytes([n]), st.integers(0, 255)),
    st.builds(
        lambda n: b"r" + _u32(n), st.one_of(st.integers(0, 300), st.integers(2**20, 2**27), st.integers(0, 2**32 - 1))
    ),
    st.builds(lambda n: b"j" + _u32(n), st.one_of(st.integers(0, 300), st.integers(0, 2**32 - 1))),
    st.builds(lambda n: b"\x95" + struct.pack("<Q", n), st.integers(0, 2**64 - 1)),
    st.builds(lambda n: b"\x80" + bytes([n]), st.integers(0, 6)),
    st.builds(lambda n: b"\x82" + bytes([n]), st.integers(0, 255)),
    st.builds(lambda d: b"I" + d + b"\n", st.sampled_from([b"1", b"01", b"-7", b"9" * 30, b"x"])),
    st.builds(lambda d: b"L" + d + b"L\n", st.sampled_from([b"1", b"9" * 5000, b"-"])),
    st.builds(lambda d: b"P" + d + b"\n", st.sampled_from([b"0", b"storage", b""])),
    st.builds(lambda d: b"G" + d, st.binary(min_size=8, max_size=8)),
)


@settings(max_examples=100)
@given(body=st.lists(opcode, max_size=40), proto=st.booleans(), stop=st.booleans())
def test_random_opcode_pickles_never_run_a_global_or_raise(body, proto, stop):
    pickled = (b"\x80\x02" if proto else b"") + b"".join(body) + (b"." if stop else b"")
    read_pickle_everywhere(pickled)


# Well-formed trees of hostile pieces: every global called through REDUCE, odd persistent ids.
def _reduce(global_line: bytes, args: List[bytes]) -> bytes:
    return b"c" + global_line + b"(" + b"".join(args) + b"tR"


def _text(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(raw)) + raw


def _int(n: int) -> bytes:
    raw = n.to_bytes((n.bit_length() + 8) // 8 or 1, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw if len(raw) < 256 else b"\x8b" + struct.pack("<I", len(raw)) + raw


def _storage(key: bytes, numel: bytes) -> bytes:
    return b"(" + _text("storage") + b"ctorch\nFloatStorage\n" + key + _text("cpu") + numel + b"tQ"


def _shared_nest(base: bytes, levels: int, close: bytes) -> bytes:
    """t1 = (t0, t0), t2 = (t1, t1) ... through the memo: a few bytes per level, 2**levels leaves."""
    return base + b"q\x00" + (b"h\x00h\x00" + close + b"q\x00") * levels


leaf = st.one_of(
    st.builds(_int, st.one_of(st.integers(-5, 5), st.integers(min_value=-(2**20000), max_value=2**20000))),
    st.builds(_text, st.text(max_size=10)),
    st.just(b"N"),
    st.just(b"\x88"),
    st.builds(lambda f: b"G" + struct.pack(">d", f), st.floats(allow_nan=True)),
    st.builds(lambda g: b"c" + g, st.sampled_from(GLOBALS)),
)
pickle_value = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.builds(lambda items: b"(" + b"".join(items) + b"t", st.lists(inner, max_size=4)),
        st.builds(lambda items: b"(" + b"".join(items) + b"l", st.lists(inner, max_size=4)),
        st.builds(
            lambda pairs: b"}(" + b"".join(k + v for k, v in pairs) + b"u",
            st.lists(st.tuples(inner, inner), max_size=3),
        ),
        st.builds(lambda g, args: _reduce(g, args), st.sampled_from(GLOBALS), st.lists(inner, max_size=6)),
        st.builds(lambda parts: b"(" + b"".join(parts) + b"tQ", st.lists(inner, max_size=6)),
        st.builds(lambda obj, state: obj + state + b"b", inner, inner),
        # A tensor whose storage, offset, size and stride are all hostile.
        st.builds(
            lambda key, numel, rest: _reduce(b"torch._utils\n_rebuild_tensor_v2\n", [_storage(key, numel)] + rest),
            inner,
            inner,
            st.lists(inner, max_size=4),
        ),
        st.builds(_shared_nest, inner, st.integers(0, 80), st.sampled_from([b"\x86", b"(\x91", b"]q\x01e"])),
    ),
    max_leaves=16,
)
hostile_key = st.sampled_from(
    ["epoch", "step", "loss", "best_loss", "timestamp", "metrics", "model", "callbacks", "payload"]
)


@settings(max_examples=100)
@given(
    entries=st.lists(st.tuples(hostile_key, pickle_value), min_size=1, max_size=3),
    key_value=st.one_of(st.none(), pickle_value),
)
def test_crafted_trees_of_hostile_pieces(entries, key_value):
    items = b"".join(_text(key) + value for key, value in entries)
    if key_value is not None:  # a hostile object as a dict key: it gets hashed
        items += key_value + b"K\x00"
    read_pickle_everywhere(b"\x80\x02}(" + items + b"u.")


# --- (d) JSON sidecars ------------------------------------------------------------------------------


@settings(max_examples=60)
@given(
    state=st.one_of(
        json_value,
        st.dictionaries(
            st.sampled_from(["epoch", "global_step", "best_metric", "best_model_checkpoint", "log_history", "x"]),
            st.one_of(
                json_value,
                st.lists(
                    st.dictionaries(st.sampled_from(["loss", "eval_loss", "eval_acc", "step"]), json_value), max_size=3
                ),
            ),
        ),
    ),
    junk=st.one_of(st.none(), st.binary(max_size=30)),
)
def test_trainer_state_json_with_junk(state, junk):
    text = junk if junk is not None else json.dumps(state, allow_nan=True).encode()
    meta, problem = formats.trainer_state_meta(text)
    assert isinstance(meta, CheckpointMeta) and (problem is None or isinstance(problem, str))
    assert meta.epoch is None or isinstance(meta.epoch, int)
    assert meta.loss is None or isinstance(meta.loss, float)


# --- one concrete input for each bug the fuzzers (and their review) found ---------------------------


def _tree(*entries: bytes) -> bytes:
    return b"\x80\x02}(" + b"".join(entries) + b"u."


def test_regression_a_huge_int_value_is_shown_by_its_size():
    # repr() of an int over 4300 digits raised ValueError out of the reader.
    result = read_file("a.pt", torch_zip(_tree(_text("epoch") + b"K\x02", _text("payload") + _int(10**5000))))
    assert result.problem is None and result.meta.epoch == 2
    assert dict(result.meta.details)["payload"] == "<int of 16610 bits>"


def test_regression_numbers_too_large_for_a_float():
    # epoch/loss/timestamp of 10**400: float() and "%g" raised OverflowError; a huge int key broke str().
    pickled = _tree(
        _text("epoch") + _int(10**400),
        _text("loss") + _int(10**400),
        _text("timestamp") + _int(10**400),
        _int(10**5000) + b"K\x01",
    )
    result = read_file("a.pt", torch_zip(pickled))
    assert result.problem is None and result.meta.epoch is None and result.meta.loss is None
    assert result.meta.timestamp == "<int of 1329 bits>" and "<int of 16610 bits>" in result.meta.top_keys


def test_regression_a_huge_memo_index_is_refused_before_unpickling():
    # LONG_BINPUT 50_000_000: the C unpickler allocated and cleared a 400 MB memo for 12 bytes.
    loaded = restricted_loads(b"\x80\x02Nr" + struct.pack("<I", 50_000_000) + b".")
    assert loaded.error == "data.pkl unreadable: memo index 50000000 out of range"


def test_regression_a_shared_tuple_as_a_dict_key_is_refused():
    # t1 = (t0, t0) ... t80 through the memo: 300 bytes whose hash as a key takes 2**80 steps.
    pickled = b"\x80\x02}(" + _shared_nest(b"K\x01", 80, b"\x86") + b"K\x00u."
    loaded = restricted_loads(pickled)
    assert loaded.over_limit and "to hash or compare" in loaded.error
    result = read_file("a.pt", torch_zip(pickled))
    assert result.integrity == "ok" and result.problem == loaded.error  # our bound, not damage
    # str() of a shared nested list (its repr) is refused the same way, or as a str() of a list.
    as_text = restricted_loads(b"\x80\x02cbuiltins\nstr\n" + _shared_nest(b"]", 80, b"\x86") + b"\x85R.")
    assert as_text.error and as_text.value is None


def test_regression_build_cannot_change_a_safe_global_for_the_process():
    # BUILD on the shared torch.float32 stub renamed it for every later checkpoint; on
    # collections.Counter (a Python class) it set attributes process-wide.
    import collections

    renamed = b"\x80\x02ctorch\nfloat32\n}(" + _text("name") + _text("int64") + b"ub."
    counter = b"\x80\x02ccollections\nCounter\nN}(" + _text("most_common") + b"Nu\x86b."
    rebuild = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nN}(" + _text("__defaults__") + b"Nu\x86b."
    for pickled in (renamed, counter, rebuild):
        restricted_loads(pickled)
    assert SAFE_GLOBALS[("torch", "float32")].name == "float32"
    assert callable(collections.Counter.most_common)
    assert restricted_loads(b"\x80\x02ctorch\nfloat32\n.").value.name == "float32"


def test_regression_a_tensor_shape_of_lists_is_not_multiplied_out():
    # size ([1], 2**40): numel was math.prod of a list: a list of 2**40 items.
    storage = _storage(_text("0"), b"K\x01")
    tensor = _reduce(b"torch._utils\n_rebuild_tensor_v2\n", [storage, b"K\x00", b"(]K\x01a" + _int(2**40) + b"t", b")"])
    result = read_file("a.pt", torch_zip(_tree(_text("loss") + tensor, _text("epoch") + b"K\x01")))
    assert result.meta.epoch == 1 and result.meta.loss is None
    assert dict(result.meta.details)["loss"] == "<tensor with a malformed shape: not loaded (outside the safe list)>"


def test_regression_many_distinct_globals_are_bounded():
    # Each GLOBAL built a class and was looked up in a list: 10k+ names, quadratic and unbounded.
    names = b"".join(b"cm%d\nn\n0" % i for i in range(12_000))
    loaded = restricted_loads(b"\x80\x02" + names + b"N.")
    assert loaded.error == "data.pkl unreadable: over 10000 distinct globals"
    assert len(loaded.unsafe_globals) == 100


def test_regression_an_error_message_does_not_carry_the_whole_input():
    # float('<1 MB>') quotes all of it in its message, which became the problem line.
    loaded = restricted_loads(b"\x80\x02cbuiltins\nfloat\n" + _text("x" * 10**6) + b"\x85R.")
    assert loaded.error.startswith("data.pkl unreadable: could not convert") and len(loaded.error) < 250


def _deflated_zip(payload: bytes, claimed_size: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", payload)
    data = bytearray(buffer.getvalue())
    # Patch the directory's uncompressed size: a small data.pkl on paper, a bomb in fact.
    central = data.rfind(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 24, claimed_size)
    return bytes(data)


def test_regression_a_deflate_bomb_is_not_inflated():
    bomb = _deflated_zip(b"\x80\x02N" + b"0" * 50_000_000 + b"N.", 100)
    result = read_file("a.pt", bomb)
    assert (
        result.integrity == "corrupt"
        and result.problem == "archive/data.pkl inflates to over 100 bytes, its directory says 100"
    )
    crc = drive(zipmeta.full_check_reader(len(bomb)), bomb)
    assert crc.integrity == "corrupt" and "inflates past" in crc.problem


def test_regression_a_stored_member_must_read_its_own_size():
    data = bytearray(torch_zip(_tree(_text("epoch") + b"K\x01")))
    central = data.find(b"PK\x01\x02")  # the first member: data.pkl
    compressed = struct.unpack_from("<I", data, central + 20)[0]
    struct.pack_into("<I", data, central + 20, compressed + 10)  # read 10 bytes more than its size
    result = read_file("a.pt", bytes(data))
    assert result.integrity == "corrupt" and "stored with" in result.problem


def test_regression_a_zip64_locator_pointing_past_the_file(tmp_path):
    # Its record offset of 2**64 - 1 went to os.pread, which raised OverflowError (not OSError).
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, 2**64 - 1, 1)
    path = tmp_path / "a.pt"
    path.write_bytes(b"PK\x03\x04" + b"\x00" * 100 + locator + eocd)
    result = zipmeta.read_local(str(path), lambda size: formats.file_reader("a.pt", size))
    assert result.integrity == "corrupt" and "past its locator" in result.problem


def test_regression_json_sidecars_nesting_infinity_and_huge_numbers():
    deep = b"[" * 100_000 + b"]" * 100_000
    assert formats.trainer_state_meta(deep)[1] == "trainer_state.json is not JSON: nested too deeply"
    deep_header = b'{"a": ' + deep + b"}"
    safetensors = struct.pack("<Q", len(deep_header)) + deep_header
    assert read_file("m.safetensors", safetensors).problem == "header is not JSON: nested too deeply"
    meta, problem = formats.trainer_state_meta(
        b'{"epoch": Infinity, "best_metric": 1%s, "log_history": [{"loss": NaN}, {"eval_loss": 1%s}]}'
        % (b"0" * 400, b"0" * 400)
    )
    assert problem is None and meta.epoch is None and meta.best_loss is None
    meta, _ = formats.trainer_state_meta(b'{"epoch": NaN}')
    assert meta.epoch is None
    header = json.dumps({"__metadata__": {"loss": 10**400, "epoch": [1] * 10}}).encode()
    result = read_file("m.safetensors", struct.pack("<Q", len(header)) + header)
    assert result.problem is None and result.meta.loss is None and result.meta.epoch is None


# --- (e) the same hostile bytes through the metadata worker -----------------------------------------


@pytest.fixture(scope="module")
def fuzz_workers():
    from opsconsole.checkpoints.worker import MetadataWorkers, WorkerLimits

    careful = MetadataWorkers(size=1, limits=WorkerLimits(optimistic=False))
    quick = MetadataWorkers(size=1)
    yield careful, quick
    careful.close()
    quick.close()


@settings(max_examples=30, deadline=None)
@given(mutations=st.lists(mutation, min_size=1, max_size=4), body=st.lists(opcode, max_size=30), as_zip=st.booleans())
def test_hostile_bytes_read_in_the_worker_give_the_in_process_value(fuzz_workers, mutations, body, as_zip):
    """The careful worker's result, after its trip through JSON, is the in-process reader's; none of these kills it.

    The quick first try (no opcode walk) may read more than the walk lets through (a memo index
    far past the operations so far is refused by the walk, not by pickle); where the file is
    fine it reads the same, and either way it gives a value.
    """
    import tempfile

    from opsconsole.checkpoints.access import LOCAL
    from opsconsole.checkpoints.worker import read_checkpoint_file, to_plain

    pickled = b"\x80\x02" + b"".join(body) + b"."
    data = torch_zip(pickled) if as_zip else mutate(real_checkpoint(), mutations)
    expected = read_file("epoch=3-step=10.ckpt", data, window=16 * 1024)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "epoch=3-step=10.ckpt")
        with open(path, "wb") as handle:
            handle.write(data)
        careful, quick = fuzz_workers
        got = read_checkpoint_file(LOCAL, path, "epoch=3-step=10.ckpt", 16 * 1024, careful)
        quickly = read_checkpoint_file(LOCAL, path, "epoch=3-step=10.ckpt", 16 * 1024, quick)
    check_result(got)
    check_result(quickly)
    # Through JSON text: NaN is not equal to itself, its JSON text is.
    assert json.dumps(to_plain(got), sort_keys=True) == json.dumps(to_plain(expected), sort_keys=True)
    if expected.problem is None or "data.pkl" not in expected.problem:
        assert json.dumps(to_plain(quickly), sort_keys=True) == json.dumps(to_plain(expected), sort_keys=True)
    assert careful.starts == 1
