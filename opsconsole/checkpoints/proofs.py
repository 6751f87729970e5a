"""What a listing proved about each file of a unit, kept on disk and trusted only for that same file.

A listing proves each member of a checkpoint unit sound (a safetensors header and the size it
implies, a torch zip's end and directory) before the unit may count as a good one. The proof
is a read of each file; done again by every new process it is most of a listing's cost
(benchmarks/checkpoint_hf_units.py). So a proof is kept in $XDG_CACHE_HOME/opsconsole/proofs/,
one small JSON file per listed directory, keyed by the file's identity: device, inode, size,
mtime and ctime in nanoseconds. A file truncated, rewritten, replaced or touched has another
identity (a user can set the mtime back but never the ctime, which git's index relies on too),
so it is read and proved again.

Trust is bounded by that identity only:
- a proof is stored only for a file whose ctime is RACY_S older than the read that proved it
  (git's "racy clean" rule): a file changed twice within one timestamp tick, or one still being
  written, keeps being read until it is old enough that a change would show;
- a store file that is unreadable, not JSON, of another format, over its size bound, or not
  the user's own (or writable by others) is ignored, and each record is type-checked at lookup;
  a record that fails is a miss, never a result;
- only the local node has identities (SFTP gives none): remote files are always read.
Writes are atomic (a temporary file renamed over the old one) and go only to a real directory of
the user's own that nobody else may write (a symlink planted there, or a shared one, gets nothing);
the number of store files and of records in one are bounded, the oldest store files (only names
this module gives) going first.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import stat as stat_module
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import orjson

from opsconsole.checkpoints.records import INTEGRITIES, INTEGRITY_UNCHECKED, CheckpointMeta, StateDictSummary

# Bumped whenever what a check proves changes: older stores are then ignored whole.
# 2: every weight and state file of a unit checked (not the first 64); a zip-less file of zeros corrupt.
FORMAT = 2
RACY_S = 3.0  # a file's ctime must be this much older than its proof (coarse timestamps: FAT 2 s, ext3 1 s)
MAX_STORE_BYTES = 16 * 1024 * 1024
MAX_RECORDS = 50_000  # files in one store (one listed directory)
MAX_STORES = 256  # listed directories remembered
MAX_PROBLEM = 500

Identity = Tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns


class Proof:
    """What one check of one file found: integrity, a problem, and a safetensors summary if it has one."""

    __slots__ = ("integrity", "problem", "summary")

    def __init__(self, integrity: str, problem: Optional[str], summary: Optional[StateDictSummary] = None) -> None:
        self.integrity, self.problem, self.summary = integrity, problem, summary


def cache_home(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """$XDG_CACHE_HOME/opsconsole/proofs, or ~/.cache/...; None when neither can be named."""
    source: Mapping[str, str] = os.environ if env is None else env
    base = source.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):  # the XDG spec: a relative value is ignored
        home = source.get("HOME")
        if not home:
            return None
        base = os.path.join(home, ".cache")
    return os.path.join(base, "opsconsole", "proofs")


class ProofStore:
    """The proofs kept for one listed directory; loaded at the first lookup, written by flush()."""

    def __init__(self, node: str, root: str, directory: Optional[str], racy_s: float = RACY_S) -> None:
        self.directory = directory
        self.racy_s = racy_s
        key = hashlib.sha256(("%s\0%s" % (node, os.path.abspath(root))).encode("utf-8", "surrogateescape"))
        self.path = os.path.join(directory, key.hexdigest()[:32] + ".json") if directory else None
        self._records: Optional[Dict[str, list]] = None
        self._units: Dict[str, list] = {}
        self._used: Dict[str, list] = {}
        self._used_units: Dict[str, list] = {}
        self._dirty = False
        self.hits = 0  # files whose kept proof was used
        self.stored = 0  # files whose proof was kept
        self.unit_hits = 0  # units whose kept result was used
        self.units_stored = 0

    @classmethod
    def for_listing(cls, node: str, root: str) -> "ProofStore":
        return cls(node, root, cache_home())

    # --- lookup --------------------------------------------------------------------------------

    def lookup(self, path: str, kind: str, identity: Optional[Identity]) -> Optional[Proof]:
        """The proof of `kind` kept for this very file (same identity), else None."""
        if identity is None or self.path is None:
            return None
        if self._records is None:
            self._records, self._units = self._load()
        record = self._records.get(path)
        proof = _proof_from(record, kind, identity)
        if proof is not None:
            self._used[path] = record  # type: ignore[assignment]
            self.hits += 1
        return proof

    def store(self, path: str, kind: str, identity: Optional[Identity], proof: Proof, started: float) -> None:
        """Keep `proof` for the file of `identity` (its fstat when the check opened it), if old enough."""
        if identity is None or self.path is None or proof.integrity == INTEGRITY_UNCHECKED:
            return
        if identity[4] > (started - self.racy_s) * 1e9:
            return  # changed too recently: a second change in the same tick would not show
        summary = proof.summary
        self._used[path] = list(identity) + [
            kind,
            proof.integrity,
            proof.problem[:MAX_PROBLEM] if proof.problem else None,
            None if summary is None else [summary.keys, [list(d) for d in summary.dtypes], summary.bytes],
        ]
        self._dirty = True
        self.stored += 1

    # --- the file ------------------------------------------------------------------------------

    def _load(self) -> Tuple[Dict[str, list], Dict[str, list]]:
        assert self.path is not None
        nothing: Tuple[Dict[str, list], Dict[str, list]] = ({}, {})
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return nothing
        try:
            st = os.fstat(fd)
            # Only a regular file of our own that nobody else may write is read at all.
            if (
                not stat_module.S_ISREG(st.st_mode)
                or st.st_uid != os.getuid()
                or st.st_mode & 0o022
                or st.st_size > MAX_STORE_BYTES
            ):
                return nothing
            data = os.read(fd, MAX_STORE_BYTES + 1)
        except OSError:
            return nothing
        finally:
            os.close(fd)
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            return nothing
        if type(document) is not dict or document.get("format") != FORMAT:
            return nothing
        files, units = document.get("files"), document.get("units")
        return (files if type(files) is dict else {}), (units if type(units) is dict else {})

    def flush(self) -> None:
        """Write the proofs this listing made, with those kept before (bounded); errors are ignored."""
        if not self._dirty or self.path is None or self.directory is None:
            return
        self._dirty = False
        if self._records is None:
            self._records, self._units = self._load()
        # What this listing used or made first, then what the store held (units this listing found
        # in memory, or that are gone: a gone file's identity never comes back), up to the bound.
        records = _merged(self._used, self._records)
        units = _merged(self._used_units, self._units)
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            # Written and pruned through a descriptor of the directory, and only when it is a real
            # directory of ours that nobody else may write: a symlink planted in a shared cache
            # directory would otherwise take the writes, and the prune, elsewhere.
            dir_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return
        try:
            st = os.fstat(dir_fd)
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                return
            document = orjson.dumps({"format": FORMAT, "files": records, "units": units})
            name = os.path.basename(self.path)
            temporary = ".proofs-%s.tmp" % os.urandom(8).hex()
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(document)
                os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                try:
                    os.unlink(temporary, dir_fd=dir_fd)
                except OSError:
                    pass
                raise
            _prune(dir_fd, keep=name)
        except (OSError, TypeError):  # TypeError: orjson refused a value (each record is checked before)
            pass
        finally:
            os.close(dir_fd)

    # --- whole units ---------------------------------------------------------------------------

    def lookup_unit(self, path: str, key: Optional[list]) -> Optional[Tuple[str, str, Optional[str], Any]]:
        """(format, integrity, problem, CheckpointMeta) kept for this unit with exactly these members."""
        if key is None or self.path is None:
            return None
        if self._records is None:
            self._records, self._units = self._load()
        record = self._units.get(path)
        if type(record) is not list or len(record) != 5 or record[0] != key:
            return None
        fmt, integrity, problem, fields = record[1], record[2], record[3], record[4]
        if type(fmt) is not str or len(fmt) > 64 or integrity not in INTEGRITIES or integrity == INTEGRITY_UNCHECKED:
            return None
        if problem is not None and (type(problem) is not str or len(problem) > MAX_UNIT_PROBLEM):
            return None
        meta = meta_from_record(fields)
        if meta is None:
            return None
        self._used_units[path] = record
        self.unit_hits += 1
        return fmt, integrity, problem, meta

    def store_unit(self, path: str, key: Optional[list], result: Any, started: float) -> None:
        """Keep a unit's read result for exactly these members (`key`), when every one is old enough."""
        if key is None or self.path is None or result.integrity == INTEGRITY_UNCHECKED or result.unreadable:
            return
        newest_ctime = max(key[UNIT_KEY_HEAD + 4 :: 5] or [0])
        if newest_ctime > (started - self.racy_s) * 1e9:
            return
        fields = record_of_meta(result.meta)
        if fields is None or (result.problem is not None and len(result.problem) > MAX_UNIT_PROBLEM):
            return
        self._used_units[path] = [key, result.format, result.integrity, result.problem, fields]
        self._dirty = True
        self.units_stored += 1


def _merged(first: Dict[str, list], then: Dict[str, list]) -> Dict[str, list]:
    merged = dict(first)
    for path, record in then.items():
        if len(merged) >= MAX_RECORDS:
            break
        merged.setdefault(path, record)
    return merged


# format, layout, series, number, unit, cut; then (name, dev, ino, size, ctime_ns) a file. No mtime:
# any change of it (a write, or utime setting it back) sets the ctime to the time of the change.
UNIT_KEY_HEAD = 6
MAX_KEYED_FILES = 1024
MAX_UNIT_PROBLEM = 4096


def unit_key(kind: Any, cut: bool, walked: Sequence[Tuple[str, Any]]) -> Optional[list]:
    """What a kept unit result is for: the unit's kind and each member's name and identity (None: no identity)."""
    if cut or len(walked) > MAX_KEYED_FILES:
        return None  # a unit of thousands of files (a big DCP save) would make the store too big to keep
    key = [kind.format, kind.layout, kind.series, kind.number, kind.unit, cut]
    extend = key.extend
    for rel, st in walked:
        raw = st.raw
        if raw is None:
            return None
        extend((rel, raw.st_dev, raw.st_ino, raw.st_size, raw.st_ctime_ns))
    return key


_INT_FIELDS = ("epoch", "step", "tensor_count", "tensor_bytes")
_FLOAT_FIELDS = ("loss", "best_loss", "epoch_float")
_BOOL_FIELDS = ("has_optimizer", "has_scheduler")
_RECORD_FIELDS = 14  # the 9 above, best_checkpoint, metrics, top_keys, details, state_dict
_UNKEPT_DEFAULTS = (("timestamp", None), ("unsafe_globals", ()), ("callbacks", ()), ("crc_recorded", None))
INT_BOUND = 2**63


def _int_ok(value: Any) -> bool:
    return value is None or (type(value) is int and -INT_BOUND < value < INT_BOUND)


def _float_ok(value: Any) -> bool:
    # NaN and infinities have no JSON form (orjson writes null): such a unit is not kept.
    return value is None or (type(value) is float and math.isfinite(value))


def record_of_meta(meta: CheckpointMeta) -> Optional[Dict[str, Any]]:
    """A unit's CheckpointMeta as JSON values; None when it holds what a record does not keep."""
    for name, default in _UNKEPT_DEFAULTS:
        if getattr(meta, name) != default:
            return None
    fields: Dict[str, Any] = {}
    for name in _INT_FIELDS:
        value = getattr(meta, name)
        if not _int_ok(value):
            return None
        fields[name] = value
    for name in _FLOAT_FIELDS:
        value = getattr(meta, name)
        if not _float_ok(value):
            return None
        fields[name] = value
    for name in _BOOL_FIELDS:
        fields[name] = getattr(meta, name)
    fields["best_checkpoint"] = meta.best_checkpoint
    if not all(type(v) is float and math.isfinite(v) or type(v) is int and _int_ok(v) for _, v in meta.metrics):
        return None
    fields["metrics"] = meta.metrics
    fields["top_keys"] = meta.top_keys
    fields["details"] = meta.details
    summary = meta.state_dict
    if summary is not None:
        if not (_int_ok(summary.keys) and _int_ok(summary.bytes) and all(_int_ok(n) for _, n in summary.dtypes)):
            return None
        fields["state_dict"] = [summary.keys, summary.dtypes, summary.bytes, summary.source]
    else:
        fields["state_dict"] = None
    return fields


# Decoding is checked in bulk, with C-level passes (set(map(type, ...))): a later listing decodes a
# record per unit, and a per-value Python check cost more than reading the unit's files again.
# orjson yields no NaN or infinity (JSON has none) and no int past 64 bits; the store file is
# bounded in size as a whole, so values need no bound of their own beyond their types.
_STR = {str}
_NUMBER = {int, float}
_LIST = {list}


def _texts(value: Any) -> bool:
    return type(value) is list and set(map(type, value)) <= _STR


_TWO = {2}
_NONE_OR_INT = {int, type(None)}
_NONE_OR_FLOAT = {float, type(None)}
_NONE_OR_BOOL = {bool, type(None)}
_chain = itertools.chain.from_iterable


def _pairs(value: Any, first: set, second: set) -> Optional[tuple]:
    """A list of [x, y] pairs (x's type in `first`, y's in `second`) as a tuple of tuples, else None."""
    if type(value) is not list:
        return None
    if not value:
        return ()
    if not set(map(type, value)) <= _LIST or set(map(len, value)) != _TWO:
        return None
    flat = list(_chain(value))
    if not set(map(type, flat[0::2])) <= first or not set(map(type, flat[1::2])) <= second:
        return None
    return tuple(map(tuple, value))


def meta_from_record(fields: Any) -> Optional[CheckpointMeta]:
    """The CheckpointMeta a record keeps, every value type-checked; None when any is off."""
    if type(fields) is not dict or len(fields) != _RECORD_FIELDS:
        return None
    try:
        epoch, step, tensor_count, tensor_bytes = (fields[name] for name in _INT_FIELDS)
        loss, best_loss, epoch_float = (fields[name] for name in _FLOAT_FIELDS)
        has_optimizer, has_scheduler = (fields[name] for name in _BOOL_FIELDS)
        best, top_keys, summary = fields["best_checkpoint"], fields["top_keys"], fields["state_dict"]
        details = _pairs(fields["details"], _STR, _STR)
        metrics = _pairs(fields["metrics"], _STR, _NUMBER)
    except KeyError:
        return None
    if (
        details is None
        or metrics is None
        or not _texts(top_keys)
        or not {type(epoch), type(step), type(tensor_count), type(tensor_bytes)} <= _NONE_OR_INT
        or not {type(loss), type(best_loss), type(epoch_float)} <= _NONE_OR_FLOAT
        or not {type(has_optimizer), type(has_scheduler)} <= _NONE_OR_BOOL
        or not (best is None or type(best) is str)
    ):
        return None
    state_dict = None
    if summary is not None:
        if type(summary) is not list or len(summary) != 4:
            return None
        keys, dtypes, total, source = summary
        dtype_pairs = _pairs(dtypes, _STR, {int})
        if not (type(keys) is int and type(total) is int and type(source) is str and dtype_pairs is not None):
            return None
        state_dict = StateDictSummary(keys=keys, dtypes=dtype_pairs, bytes=total, source=source)
    return CheckpointMeta(
        epoch=epoch,
        step=step,
        tensor_count=tensor_count,
        tensor_bytes=tensor_bytes,
        loss=loss,
        best_loss=best_loss,
        epoch_float=epoch_float,
        has_optimizer=has_optimizer,
        has_scheduler=has_scheduler,
        best_checkpoint=best,
        metrics=metrics,
        top_keys=tuple(top_keys),
        details=details,
        state_dict=state_dict,
    )


def _proof_from(record: Any, kind: str, identity: Identity) -> Optional[Proof]:
    """A record's proof when it is well-formed, of this kind and for this identity; else None."""
    if type(record) is not list or len(record) != 9:
        return None
    if tuple(record[:5]) != identity or record[5] != kind:
        return None
    integrity, problem, summary = record[6], record[7], record[8]
    if integrity not in INTEGRITIES or integrity == INTEGRITY_UNCHECKED:
        return None
    if problem is not None and (type(problem) is not str or len(problem) > MAX_PROBLEM):
        return None
    if summary is None:
        return Proof(integrity, problem)
    if type(summary) is not list or len(summary) != 3:
        return None
    keys, dtypes, total = summary
    if type(keys) is not int or type(total) is not int or type(dtypes) is not list or len(dtypes) > 64:
        return None
    pairs: List[Tuple[str, int]] = []
    for pair in dtypes:
        if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str or type(pair[1]) is not int:
            return None
        pairs.append((pair[0][:32], pair[1]))
    return Proof(integrity, problem, StateDictSummary(keys=keys, dtypes=tuple(pairs), bytes=total))


def _prune(dir_fd: int, keep: str) -> None:
    """At most MAX_STORES store files (a hex name and .json, our own): the least recently written go first."""
    try:
        uid = os.getuid()
        with os.scandir(dir_fd) as it:
            stores = [
                (st.st_mtime, entry.name)
                for entry in it
                if _is_store_name(entry.name)
                for st in (entry.stat(follow_symlinks=False),)
                if stat_module.S_ISREG(st.st_mode) and st.st_uid == uid
            ]
        if len(stores) <= MAX_STORES:
            return
        stores.sort()
        for _, name in stores[: len(stores) - MAX_STORES]:
            if name != keep:
                os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _is_store_name(name: str) -> bool:
    """A name ProofStore gives: 32 lowercase hex digits and .json."""
    digits = name[:-5]
    return len(name) == 37 and name.endswith(".json") and all(c in "0123456789abcdef" for c in digits)
