"""What a listing proved about each file of a unit, kept on disk and trusted only for that same file.

A listing proves each member of a checkpoint unit sound (a safetensors header and the size it
implies, a torch zip's end and directory) before the unit may count as a good one. The proof
is a read of each file; done again by every new process it is most of a listing's cost
(benchmarks/checkpoint_hf_units.py). So a proof is kept in $XDG_CACHE_HOME/opsconsole/proofs/,
one small JSON file per listed directory and machine (this_machine: a home directory on NFS
is shared by machines whose devices and inodes are their own), keyed by the file's identity:
device, inode, size, mtime and ctime in nanoseconds. A file truncated, rewritten, replaced or touched has another
identity (a user can set the mtime back but never the ctime, which git's index relies on too),
so it is read and proved again.

Three levels, each asked in turn and each parsed only when asked for (the store file's three
lines): the whole listing, for a digest of every name and identity of every directory it listed
(and the checkpoint code's own stamp), what a new process of an unchanged directory takes; each
unit's result, for its kind and its members' names and identities; each file's proof.

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

import collections
import dataclasses
import hashlib
import itertools
import math
import operator
import os
import stat as stat_module
from typing import Annotated, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import msgspec
import orjson

from opsconsole.checkpoints.records import (
    INTEGRITIES,
    INTEGRITY_UNCHECKED,
    CheckpointEntry,
    CheckpointMeta,
    StateDictSummary,
)

# Bumped whenever what a check proves changes: older stores are then ignored whole.
# 2: every weight and state file of a unit checked (not the first 64); a zip-less file of zeros corrupt.
# 3: three lines (format and whole listing, units, files); unit metadata one flat list.
# 4: a kept listing's repeated texts, detail pairs and summaries kept once, in tables (listing_columns).
FORMAT = 4
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


MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
_this_machine: Optional[str] = None


def this_machine(id_files: Sequence[str] = MACHINE_ID_FILES, boot_id_file: str = BOOT_ID_FILE) -> str:
    """What tells this machine from the others that share its home directory: its id and hostname.

    The id is systemd's (or D-Bus's) machine id, else the boot id (a new one each boot: the
    proofs are read again after a reboot, which may renumber devices anyway). Nodes installed
    from one image can share a machine id, so the hostname goes with it.
    """
    machine = ""
    for path in tuple(id_files) + (boot_id_file,):
        try:
            with open(path, "rb") as handle:
                machine = handle.read(256).strip().decode("ascii", "replace")
        except OSError:
            continue
        if machine:
            break
    return "%s@%s" % (machine, os.uname().nodename)


def _machine() -> str:
    global _this_machine
    if _this_machine is None:
        _this_machine = this_machine()
    return _this_machine


class ProofStore:
    """The proofs kept for one listed directory; loaded at the first lookup, written by flush().

    The store file is three JSON lines, each parsed only when asked for: the format and the
    kept listing (what a later listing of unchanged files asks first), the unit results, the
    file proofs (what a listing with a change asks next).
    """

    def __init__(
        self, node: str, root: str, directory: Optional[str], racy_s: float = RACY_S, machine: Optional[str] = None
    ) -> None:
        self.directory = directory
        self.racy_s = racy_s
        # One store per machine too: "local" is every machine's name for itself (this_machine).
        self.machine = _machine() if machine is None else machine
        named = "%s\0%s\0%s" % (node, self.machine, os.path.abspath(root))
        key = hashlib.sha256(named.encode("utf-8", "surrogateescape"))
        self.path = os.path.join(directory, key.hexdigest()[:32] + ".json") if directory else None
        self._loaded = False
        self._listing: Any = None  # (digest, other, columns) as decoded against _HEAD: typed, not yet checked whole
        self._dirs: Dict[str, Any] = {}  # as decoded against _HEAD; each checked when asked for (kept_names)
        self._new_dirs: Optional[Dict[str, list]] = None
        self._raw_units: Optional[memoryview] = None
        self._raw_files: Optional[memoryview] = None
        self._records_read: Optional[Dict[str, list]] = None
        self._units_read: Optional[Dict[str, list]] = None
        self._used: Dict[str, list] = {}
        self._used_units: Dict[str, list] = {}
        self._new_listing: Optional[list] = None
        self._meta_records: Dict[int, Tuple[CheckpointMeta, Optional[list]]] = {}
        self._dirty = False
        self.hits = 0  # files whose kept proof was used
        self.stored = 0  # files whose proof was kept
        self.unit_hits = 0  # units whose kept result was used
        self.units_stored = 0
        self.listing_hits = 0  # listings kept whole and used
        self.listings_stored = 0

    @classmethod
    def for_listing(cls, node: str, root: str) -> "ProofStore":
        return cls(node, root, cache_home())

    # --- lookup --------------------------------------------------------------------------------

    def lookup(self, path: str, kind: str, identity: Optional[Identity]) -> Optional[Proof]:
        """The proof of `kind` kept for this very file (same identity), else None."""
        if identity is None or self.path is None:
            return None
        record = self._records().get(path)
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

    def _records(self) -> Dict[str, list]:
        if self._records_read is None:
            self._load()
            self._records_read = _section(self._raw_files, "files")
        return self._records_read

    def _units(self) -> Dict[str, list]:
        if self._units_read is None:
            self._load()
            self._units_read = _section(self._raw_units, "units")
        return self._units_read

    def _load(self) -> None:
        """Read the store file once: its first line parsed (format, listing), the others kept as bytes."""
        if self._loaded:
            return
        self._loaded = True
        assert self.path is not None
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return
        try:
            st = os.fstat(fd)
            # Only a regular file of our own that nobody else may write is read at all.
            if (
                not stat_module.S_ISREG(st.st_mode)
                or st.st_uid != os.getuid()
                or st.st_mode & 0o022
                or st.st_size > MAX_STORE_BYTES
            ):
                return
            # The file's own size (+1 to see it grow), not the bound: os.read allocates the whole
            # count first (a 16 MiB mapping made, touched and shrunk cost more than the parse).
            data = os.read(fd, st.st_size + 1)
        except OSError:
            return
        finally:
            os.close(fd)
        if len(data) != st.st_size:
            return  # rewritten in place while read (flush replaces it whole: never ours)
        # orjson writes no newline inside a document; the later lines are cut out only when asked for.
        first = data.find(b"\n")
        second = data.find(b"\n", first + 1) if first >= 0 else -1
        if second < 0 or data.find(b"\n", second + 1) >= 0:
            return
        view = memoryview(data)
        # The first line decoded against its schema (_Head), each value's type checked in C; a kept
        # listing off in any way leaves the units and files of the store to use (their format read alone).
        try:
            head: Any = _HEAD.decode(view[:first])
            listing = head.listing
        except msgspec.ValidationError:
            try:
                head = _FORMAT_ONLY.decode(view[:first])
            except msgspec.MsgspecError:
                return
            listing = None
        except msgspec.MsgspecError:
            return
        if head.format != FORMAT:
            return
        self._listing = listing
        self._dirs = (head.dirs or {}) if listing is not None else {}
        self._raw_units, self._raw_files = view[first + 1 : second], view[second + 1 :]

    def flush(self) -> None:
        """Write the proofs this listing made, with those kept before (bounded); errors are ignored."""
        if not self._dirty or self.path is None or self.directory is None:
            return
        self._dirty = False
        # What this listing used or made first, then what the store held (units this listing found
        # in memory, or that are gone: a gone file's identity never comes back), up to the bound.
        records = _merged(self._used, self._records())
        units = _merged(self._used_units, self._units())
        if self._new_listing is not None:
            listing, dirs = self._new_listing, self._new_dirs
        elif self.listing_hits:
            listing, dirs = self._listing, self._dirs
        else:
            listing, dirs = None, None
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
            document = b"\n".join(
                (
                    orjson.dumps({"format": FORMAT, "listing": listing, "dirs": dirs}),
                    orjson.dumps({"units": units}),
                    orjson.dumps({"files": records}),
                )
            )
            if len(document) > MAX_STORE_BYTES:
                return  # it would be ignored when read
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
        record = self._units().get(path)
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
        fields = self._meta_record(result.meta)
        if fields is None or (result.problem is not None and len(result.problem) > MAX_UNIT_PROBLEM):
            return
        self._used_units[path] = [key, result.format, result.integrity, result.problem, fields]
        self._dirty = True
        self.units_stored += 1

    # --- a whole listing -----------------------------------------------------------------------

    def lookup_listing(self, digest: Optional[str], other: int, place: Any) -> Optional[List[CheckpointEntry]]:
        """The entries kept for the listing of exactly these files (`digest`) with `other` names that
        are no checkpoint, each checked (entries_from_columns, `place` as there); None when any is off."""
        if digest is None or self.path is None:
            return None
        self._load()
        kept = self._listing
        if kept is None or kept[0] != digest or kept[1] != other:
            return None
        entries = entries_from_columns(kept[2], place)
        if entries is not None:
            self.listing_hits += 1
        return entries

    def kept_names(self, rel: str, identity: Tuple[int, int, int, int]) -> Optional[List[str]]:
        """The names the kept listing found in directory `rel` (relative to the root), when the
        directory's identity (device, inode, mtime ns, ctime ns) is still the one it had then: a
        name made, removed or renamed in it changes its mtime and ctime (POSIX), and the listing
        was kept only when every ctime in it was RACY_S old, so none of those went unseen. None
        when there is no such record or a name in it is no plain name of a directory entry."""
        if self.path is None:
            return None
        self._load()
        record = self._dirs.get(rel)
        if record is None or tuple(record[:4]) != identity:
            return None
        names = record[4]
        joined = "".join(names)  # each name one directory entry's: no separator, no NUL, never . or ..
        if len(names) > MAX_KEPT_NAMES or "/" in joined or "\0" in joined or not _NOT_NAMES.isdisjoint(names):
            return None
        return names

    def store_listing(
        self,
        digest: Optional[str],
        newest_ctime_ns: int,
        other: int,
        entries: Sequence[Any],
        started: float,
        dirs: Optional[Dict[str, list]] = None,
    ) -> None:
        """Keep a whole listing for exactly these files, when each is RACY_S old and each entry has a
        record; with `dirs`, what kept_names answers (each directory's identity and names)."""
        if digest is None or self.path is None or newest_ctime_ns > (started - self.racy_s) * 1e9:
            return
        if len(entries) > MAX_LISTED_ENTRIES or any(
            e.integrity == INTEGRITY_UNCHECKED
            or e.unreadable
            or (e.problem is not None and len(e.problem) > MAX_UNIT_PROBLEM)
            for e in entries
        ):
            return  # unchecked or unreadable may pass (a busy worker, a file being written): read again next time
        rows = []
        for entry in entries:
            row = record_of_entry(entry, self._meta_record(entry.meta))
            if row is None:
                return
            rows.append(row)
        self._new_listing = [digest, other, listing_columns(rows)]
        self._new_dirs = dirs
        self._dirty = True
        self.listings_stored += 1

    def _meta_record(self, meta: CheckpointMeta) -> Optional[list]:
        """record_of_meta, once per meta: a unit's result and its listed entry share one."""
        kept = self._meta_records.get(id(meta))
        if kept is None or kept[0] is not meta:
            kept = self._meta_records[id(meta)] = (meta, record_of_meta(meta))
        return kept[1]


MAX_KEPT_NAMES = 10_000  # names of one kept directory (scan.MAX_UNIT_FILES)


_NOT_NAMES = frozenset(("", ".", ".."))  # of no directory entry


def _section(raw: Optional[memoryview], name: str) -> Dict[str, list]:
    """One of the store's later lines ({"units": {...}} or {"files": {...}}); {} when it is anything else."""
    if not raw:
        return {}
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    if type(document) is not dict or len(document) != 1:
        return {}
    value = document.get(name)
    return value if type(value) is dict else {}


def _merged(first: Dict[str, list], then: Dict[str, list]) -> Dict[str, list]:
    merged = dict(first)
    for path, record in then.items():
        if len(merged) >= MAX_RECORDS:
            break
        merged.setdefault(path, record)
    return merged


# code, format, layout, series, number, unit, cut; then (name, dev, ino, size, ctime_ns) a file. No
# mtime: any change of it (a write, or utime setting it back) sets the ctime to the time of the change.
# The code's stamp: a unit judged by other code (before an upgrade that judges it differently) is read again.
UNIT_KEY_HEAD = 7
MAX_KEYED_FILES = 1024
MAX_UNIT_PROBLEM = 4096


def unit_key(kind: Any, cut: bool, walked: Sequence[Tuple[str, Any]], code: str = "") -> Optional[list]:
    """What a kept unit result is for: the code that judged it, the unit's kind and each member's name
    and identity (None: no identity)."""
    if cut or len(walked) > MAX_KEYED_FILES:
        return None  # a unit of thousands of files (a big DCP save) would make the store too big to keep
    key = [code, kind.format, kind.layout, kind.series, kind.number, kind.unit, cut]
    extend = key.extend
    for rel, st in walked:
        raw = st.raw
        if raw is None:
            return None
        extend((rel, raw.st_dev, raw.st_ino, raw.st_size, raw.st_ctime_ns))
    return key


# A unit's CheckpointMeta as one flat list: the scalars below in this order, then metrics and
# details flattened ([k1, v1, k2, v2, ...]), top_keys, and the state dict summary (None, or
# [keys, dtypes flattened, bytes, source]). Flat lists decode with C-level passes only
# (map(type, ...) against the allowed types, zip to pairs): a later listing decodes one record per
# unit, and per-value Python checks (the dict of named fields before) cost more than the listing's stats.
_META_SCALARS = (
    "epoch",
    "step",
    "tensor_count",
    "tensor_bytes",
    "loss",
    "best_loss",
    "epoch_float",
    "has_optimizer",
    "has_scheduler",
    "best_checkpoint",
)
_NONE = type(None)
_META_SCALAR_TYPES = (
    (int, _NONE),
    (int, _NONE),
    (int, _NONE),
    (int, _NONE),
    (float, _NONE),
    (float, _NONE),
    (float, _NONE),
    (bool, _NONE),
    (bool, _NONE),
    (str, _NONE),
)
_META_RECORD_LENGTH = len(_META_SCALARS) + 4  # metrics, top_keys, details, state_dict
# Never kept: a unit holding any of them other than its default is not kept at all.
_META_UNKEPT = {"timestamp": None, "unsafe_globals": (), "callbacks": (), "crc_recorded": None}
INT_BOUND = 2**63


def _check_covers(cls: type, kept: Sequence[str], fixed: Sequence[str]) -> None:
    """Records are decoded without the dataclass's __init__: every field must be kept or fixed, or import fails."""
    names = {f.name for f in dataclasses.fields(cls)}
    if names != set(kept) | set(fixed) or set(kept) & set(fixed):
        raise RuntimeError("proofs.py: the record of %s does not cover its fields: %s" % (cls.__name__, sorted(names)))


_check_covers(CheckpointMeta, _META_SCALARS + ("metrics", "top_keys", "details", "state_dict"), tuple(_META_UNKEPT))
_check_covers(StateDictSummary, ("keys", "dtypes", "bytes", "source"), ())
_new = object.__new__
_contains = operator.contains


def _int_ok(value: Any) -> bool:
    return value is None or (type(value) is int and -INT_BOUND < value < INT_BOUND)


def _float_ok(value: Any) -> bool:
    # NaN and infinities have no JSON form (orjson writes null): such a unit is not kept.
    return value is None or (type(value) is float and math.isfinite(value))


def _flat(pairs: Sequence[Tuple[Any, Any]]) -> list:
    return list(_chain(pairs))


def record_of_meta(meta: CheckpointMeta) -> Optional[list]:
    """A unit's CheckpointMeta as one flat JSON list; None when it holds what a record does not keep."""
    for name, default in _META_UNKEPT.items():
        if getattr(meta, name) != default:
            return None
    scalars = [getattr(meta, name) for name in _META_SCALARS]
    if not all(map(_int_ok, scalars[:4])) or not all(map(_float_ok, scalars[4:7])):
        return None
    if not all(type(v) is float and math.isfinite(v) or type(v) is int and _int_ok(v) for _, v in meta.metrics):
        return None
    summary = meta.state_dict
    if summary is None:
        kept_summary = None
    elif not (_int_ok(summary.keys) and _int_ok(summary.bytes) and all(_int_ok(n) for _, n in summary.dtypes)):
        return None
    else:
        kept_summary = [summary.keys, _flat(summary.dtypes), summary.bytes, summary.source]
    return scalars + [_flat(meta.metrics), list(meta.top_keys), _flat(meta.details), kept_summary]


# orjson yields no NaN or infinity (JSON has none) and no int past 64 bits; the store file is
# bounded in size as a whole, so values need no bound of their own beyond their types.
_NUMBER = {int, float}
_INT = {int}
_chain = itertools.chain.from_iterable


def _texts(value: Any) -> bool:
    """Whether `value` is a list of texts only (str.join refuses anything else, in C)."""
    if type(value) is not list:
        return False
    try:
        "".join(value)
    except TypeError:
        return False
    return True


def _paired(flat: list) -> tuple:
    """[k1, v1, k2, v2 ...] as ((k1, v1), ...): how every kept list of pairs is flattened."""
    pairs = iter(flat)
    return tuple(zip(pairs, pairs))


def _text_pairs(flat: Any) -> Optional[tuple]:
    """[k1, v1, k2, v2 ...], all texts, as ((k1, v1), ...); else None."""
    if not _texts(flat) or len(flat) & 1:
        return None
    return _paired(flat)


def _pairs(flat: Any, second: set) -> Optional[tuple]:
    """[k1, v1, k2, v2 ...] (each k a text, each v's type in `second`) as ((k1, v1), ...), else None."""
    if type(flat) is not list or len(flat) & 1 or not _texts(flat[0::2]) or not set(map(type, flat[1::2])) <= second:
        return None
    return _paired(flat)


def _state_dict_summary(summary: Any) -> Optional[StateDictSummary]:
    """A kept [keys, dtypes, bytes, source] as a StateDictSummary, every value type-checked; None when off."""
    if type(summary) is not list or len(summary) != 4:
        return None
    keys, dtypes, total, source = summary
    dtype_pairs = _pairs(dtypes, _INT)
    if not (type(keys) is int and type(total) is int and type(source) is str and dtype_pairs is not None):
        return None
    state_dict = _new(StateDictSummary)
    state_dict.__dict__.update(keys=keys, dtypes=dtype_pairs, bytes=total, source=source)
    return state_dict


def meta_from_record(record: Any) -> Optional[CheckpointMeta]:
    """The CheckpointMeta a record keeps, every value type-checked; None when any is off."""
    if type(record) is not list or len(record) != _META_RECORD_LENGTH:
        return None
    scalars = record[:10]
    if not all(map(_contains, _META_SCALAR_TYPES, map(type, scalars))):
        return None
    metrics = _pairs(record[10], _NUMBER)
    details = _text_pairs(record[12])
    top_keys = record[11]
    if metrics is None or details is None or not _texts(top_keys):
        return None
    summary = record[13]
    state_dict = None
    if summary is not None:
        state_dict = _state_dict_summary(summary)
        if state_dict is None:
            return None
    return _meta_of(tuple(scalars), metrics, tuple(top_keys), details, state_dict)


# --- a whole listing -----------------------------------------------------------------------------
# What every later `opsconsole checkpoints DIR` process asks first: the listing an earlier one made
# of exactly the same files. Keyed by a digest of every name and identity (mode, device, inode,
# size, mtime, ctime) of every directory the listing listed, so any change to a file, a name or a
# directory is a miss; kept only when all of them are RACY_S old. One entry is one flat list:
_ENTRY_SCALARS = (
    "name",
    "format",
    "size_bytes",
    "mtime",
    "is_dir",
    "integrity",
    "problem",
    "latest",
    "best",
    "lowest_loss",
    "layout",
    "unit",
    "series",
    "unmanaged",
    "unreadable",
)
_ENTRY_SCALAR_TYPES = (
    (str,),
    (str,),
    (int,),
    (float,),
    (bool,),
    (str,),
    (str, _NONE),
    (bool,),
    (bool,),
    (bool,),
    (str,),
    (str,),
    (str, _NONE),
    (str, _NONE),
    (str, _NONE),
)
_ENTRY_LISTS = ("members", "protections")
# Rebuilt, never read from the record: the path from the listed root, judged from the live stats.
_ENTRY_FIXED = {"is_link": False, "link_target": None, "crc_checked": False}
_ENTRY_REBUILT = ("path", "judged", "meta")
_check_covers(CheckpointEntry, _ENTRY_SCALARS + _ENTRY_LISTS, tuple(_ENTRY_FIXED) + _ENTRY_REBUILT)
MAX_LISTED_ENTRIES = 10_000


def record_of_entry(entry: CheckpointEntry, meta: Optional[list] = None) -> Optional[list]:
    """One listed entry as a flat JSON list (`meta`: record_of_meta(entry.meta) if made already);
    None when the listing cannot be kept with it."""
    if entry.is_link or entry.link_target is not None or entry.crc_checked:
        return None
    if meta is None:
        meta = record_of_meta(entry.meta)
    if meta is None or not _float_ok(entry.mtime) or entry.mtime is None or not _int_ok(entry.size_bytes):
        return None
    return [getattr(entry, name) for name in _ENTRY_SCALARS] + [list(entry.members), list(entry.protections), meta]


# A kept listing is its entries' records by column (each entry's record is a row): one list of
# every entry's name, one of every format ..., then one per meta field, then five tables that the
# columns of texts point into. Every value's type is checked by msgspec, in C, as the store's first
# line is decoded (_Columns), an index by its use, and the entries are built by C-level passes (map,
# zip, dict.update) without the dataclasses' __init__: a listing of many units costs a few passes
# per field, not Python code per value.
#
# What repeats from unit to unit is kept once (format 4): a Trainer's units name the same
# trainer_state.json keys, in the same detail lines, with the same state-dict summary, and a
# listing of them was mostly those texts (31 kB for 20 units, parsed and checked afresh by every
# new process). The tables: every distinct text; every distinct (key, text) detail pair as two
# text indexes; every distinct tuple of texts (a unit's members, protections, top-level keys) as
# text indexes; every distinct tuple of detail pairs as pair indexes; every distinct state-dict
# summary. A row's members, protections, top_keys and details are an index into its table, its
# state_dict one into the summaries (-1: none). Equal values decode to one shared object: all of
# them are immutable (tuples, frozen dataclasses).
LISTING_ROW_COLUMNS = len(_ENTRY_SCALARS) + 2 + _META_RECORD_LENGTH
_LISTING_TABLES = 5  # texts, pairs, text tuples, pair tuples, state-dict summaries
_INTEGRITY_SET = set(INTEGRITIES)
_EVEN = operator.itemgetter(slice(0, None, 2))
_ODD = operator.itemgetter(slice(1, None, 2))
_MEMBERS = len(_ENTRY_SCALARS)
_PROTECTIONS = _MEMBERS + 1
_META = _PROTECTIONS + 1
_METRICS, _TOP_KEYS, _DETAILS, _STATE_DICT = range(_META + len(_META_SCALARS), LISTING_ROW_COLUMNS)


# Every field's name in the order entries_from_columns gives their values.
_META_NAMES = _META_SCALARS + ("metrics", "top_keys", "details", "state_dict") + tuple(_META_UNKEPT)
_META_FIXED = tuple(_META_UNKEPT.values())


def _meta_of(scalars: tuple, metrics: tuple, top_keys: tuple, details: tuple, state_dict: Any) -> CheckpointMeta:
    """A CheckpointMeta of checked values (a unit's record), built without the frozen dataclass's
    __init__ (a field-by-field object.__setattr__): _check_covers makes sure at import that no
    field is left out."""
    meta = _new(CheckpointMeta)
    meta.__dict__.update(zip(_META_NAMES, scalars + (metrics, top_keys, details, state_dict) + _META_FIXED))
    return meta


_ENTRY_NAMES = _ENTRY_SCALARS + _ENTRY_LISTS + _ENTRY_REBUILT + tuple(_ENTRY_FIXED)
_ENTRY_FIXED_VALUES = tuple(_ENTRY_FIXED.values())


class _Table:
    """Distinct values in the order first met, each with its index."""

    def __init__(self) -> None:
        self.index: Dict[Any, int] = {}
        self.values: List[Any] = []

    def add(self, value: Any, stored: Any = None) -> int:
        """The index of `value` (hashable), added as `stored` (else itself) when new."""
        found = self.index.get(value)
        if found is None:
            found = self.index[value] = len(self.values)
            self.values.append(value if stored is None else stored)
        return found


def listing_columns(rows: Sequence[list]) -> list:
    """The columns of entry records (record_of_entry), their metas' columns after the entries', then
    the tables their texts point into (see above). A value not of its field's shape is kept as it is,
    never coerced: entries_from_columns refuses it."""
    texts, pairs, text_tuples, pair_tuples, summaries = _Table(), _Table(), _Table(), _Table(), _Table()

    def text_tuple(values: Any) -> Any:
        if type(values) is not list:
            return values
        return text_tuples.add(tuple(values), [texts.add(value) for value in values])

    def pair_tuple(flat: Any) -> Any:
        if type(flat) is not list or len(flat) & 1:
            return flat
        indexes = [pairs.add((key, value)) for key, value in zip(flat[0::2], flat[1::2])]
        return pair_tuples.add(tuple(indexes), indexes)

    def summary_index(summary: Any) -> Any:
        if summary is None:
            return -1
        return summaries.add(orjson.dumps(summary), summary) if type(summary) is list else summary

    compact = []
    for row in rows:
        if len(row) != _MEMBERS + 3 or type(row[-1]) is not list or len(row[-1]) != _META_RECORD_LENGTH:
            return []  # not a record_of_entry row: columns that are refused
        meta = list(row[-1])
        meta[_TOP_KEYS - _META] = text_tuple(meta[_TOP_KEYS - _META])
        meta[_DETAILS - _META] = pair_tuple(meta[_DETAILS - _META])
        meta[_STATE_DICT - _META] = summary_index(meta[_STATE_DICT - _META])
        compact.append(row[:_MEMBERS] + [text_tuple(row[_MEMBERS]), text_tuple(row[_PROTECTIONS])] + meta)
    columns = [list(column) for column in zip(*compact)] if compact else [[] for _ in range(LISTING_ROW_COLUMNS)]
    flat_pairs = [texts.add(text) for pair in pairs.values for text in pair]
    return columns + [texts.values, flat_pairs, text_tuples.values, pair_tuples.values, summaries.values]


# What a kept listing's columns must be, checked by msgspec in C as the store's first line is decoded
# (every value's type, every int within 64 bits): a column of each field's type, then the tables.
_INT64 = Annotated[int, msgspec.Meta(ge=1 - INT_BOUND, le=INT_BOUND - 1)]  # as _int_ok


def _column_type(types: Sequence[type]) -> Any:
    """List[T] of a field whose values are of `types` (int: within 64 bits)."""
    return List[Union[tuple(_INT64 if t is int else t for t in types)]]  # type: ignore[misc]


_INDEXES = List[int]  # into a table: each checked by its use (entries_from_columns)
_COLUMN_TYPES = (
    tuple(map(_column_type, _ENTRY_SCALAR_TYPES))
    + (_INDEXES, _INDEXES)  # members, protections
    + tuple(map(_column_type, _META_SCALAR_TYPES))
    + (List[List[Union[str, _INT64, float]]], _INDEXES, _INDEXES, _INDEXES)  # metrics, top_keys, details, state_dict
    + (List[str], _INDEXES, List[_INDEXES], List[_INDEXES])  # texts, pairs, text tuples, pair tuples
    + (List[Tuple[_INT64, List[Union[str, _INT64]], _INT64, str]],)  # state-dict summaries
)
_Columns = Tuple[_COLUMN_TYPES]  # type: ignore[valid-type]


class _Head(msgspec.Struct):
    """The store's first line: its format and the kept listing, (digest, names that are no checkpoint, columns)."""

    format: int
    listing: Optional[Tuple[str, int, _Columns]] = None  # type: ignore[valid-type]
    # The kept listing's directories: relative path -> (device, inode, mtime ns, ctime ns, names).
    dirs: Optional[Dict[str, Tuple[int, int, int, int, List[str]]]] = None


class _FormatOnly(msgspec.Struct):
    format: int


_HEAD = msgspec.json.Decoder(_Head)
_FORMAT_ONLY = msgspec.json.Decoder(_FormatOnly)
_COLUMNS = msgspec.json.Decoder(_Columns)


def decode_columns(data: bytes) -> Optional[tuple]:
    """A kept listing's columns (listing_columns) from their JSON, each value's type checked; None when one is off."""
    try:
        return _COLUMNS.decode(data)
    except msgspec.MsgspecError:
        return None


def _tuples_of(rows: list, table: list) -> list:
    """Each of `rows` (a list of indexes into `table`) as a tuple of the values they point to.

    IndexError when one is off the table: a kept listing's every index is checked by its use, in C
    (an index from the end is one within the table too). operator.itemgetter builds each tuple in
    one call (a map over the row costs a call per index)."""
    out = []
    for row in rows:
        if len(row) > 1:
            out.append(operator.itemgetter(*row)(table))
        else:
            out.append(tuple(map(table.__getitem__, row)))
    return out


def entries_from_columns(columns: Any, place: Any) -> Optional[List[CheckpointEntry]]:
    """The entries a kept listing's columns hold (as decoded against _Columns: every value of its
    field's type); None when any is off (rows of unequal lengths, an integrity no listing gives,
    metrics that are no (name, number) pairs, a summary no StateDictSummary holds, an index off its
    table, names that are not exactly the listing's units).

    `place(names, is_dirs)` gives each entry's path and judged files from the listing just made
    (never from the record), or None when the names are not exactly its units."""
    texts, flat_pairs, text_tuple_rows, pair_tuple_rows, summary_rows = columns[LISTING_ROW_COLUMNS:]
    columns = columns[:LISTING_ROW_COLUMNS]
    count = len(columns[0])
    if count > MAX_LISTED_ENTRIES or set(map(len, columns)) != {count} or len(flat_pairs) & 1:
        return None
    entry_columns, meta_columns, metrics = columns[:_MEMBERS], columns[_META:_METRICS], columns[_METRICS]
    metric_names, metric_values = list(map(_EVEN, metrics)), list(map(_ODD, metrics))
    if (
        not set(entry_columns[5]) <= _INTEGRITY_SET
        or list(map(len, metric_names)) != list(map(len, metric_values))  # a list of pairs of odd length
        or not _texts(list(_chain(metric_names)))
        or not set(map(type, _chain(metric_values))) <= _NUMBER
    ):
        return None
    state_dicts: List[Optional[StateDictSummary]] = []
    for summary in summary_rows:
        state_dict = _state_dict_summary(list(summary))
        if state_dict is None:
            return None
        state_dicts.append(state_dict)
    state_dicts.append(None)  # index -1: no summary
    # The tables' values, each decoded once, then each row's: an index off its table is an
    # IndexError here, before anything is built.
    try:
        text_of = texts.__getitem__
        pairs = list(zip(map(text_of, _EVEN(flat_pairs)), map(text_of, _ODD(flat_pairs))))
        text_tuples, pair_tuples = _tuples_of(text_tuple_rows, texts), _tuples_of(pair_tuple_rows, pairs)
        members = list(map(text_tuples.__getitem__, columns[_MEMBERS]))
        protections = list(map(text_tuples.__getitem__, columns[_PROTECTIONS]))
        top_keys = list(map(text_tuples.__getitem__, columns[_TOP_KEYS]))
        details = list(map(pair_tuples.__getitem__, columns[_DETAILS]))
        summaries = list(map(state_dicts.__getitem__, columns[_STATE_DICT]))
    except IndexError:
        return None
    placed = place(entry_columns[0], entry_columns[4])
    if placed is None or len(placed) != count:
        return None
    # The metas, then the entries, each built without the frozen dataclass's __init__, each field from
    # a checked value: _check_covers makes sure at import that none is left out.
    repeat = itertools.repeat
    metas = list(map(_new, repeat(CheckpointMeta, count)))
    meta_values = zip(
        *meta_columns,
        map(tuple, map(zip, metric_names, metric_values)),
        top_keys,
        details,
        summaries,
        *map(repeat, _META_FIXED),
    )
    _consume(map(dict.update, map(vars, metas), map(zip, repeat(_META_NAMES), meta_values)))
    entries = list(map(_new, repeat(CheckpointEntry, count)))
    entry_values = zip(
        *entry_columns,
        members,
        protections,
        map(_FIRST, placed),
        map(_SECOND, placed),
        metas,
        *map(repeat, _ENTRY_FIXED_VALUES),
    )
    _consume(map(dict.update, map(vars, entries), map(zip, repeat(_ENTRY_NAMES), entry_values)))
    return entries


_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)
_consume: Callable[[Iterable[Any]], None] = collections.deque(
    maxlen=0
).extend  # runs an iterator to its end, keeping nothing


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
