"""A torch.save zip read from its central directory: entries, tensor bytes, quick and full integrity.

Readers here are written once as generators that yield `(offset, length)` read requests
and receive the bytes: `drive_local` answers them with pread, the SFTP reader in remote.py
answers them over the network. So the same code reads a local file and a remote one, and
only the few ranges it needs cross the wire (the directory at the end, data.pkl at the start).

A file still being written by torch.save has no end-of-central-directory record yet: it
reads as truncated, like a file cut short by a full disk or a killed job.
"""

from __future__ import annotations

import os
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Callable, Generator, List, Optional, Tuple

from opsconsole.checkpoints.records import (
    INTEGRITY_CORRUPT,
    INTEGRITY_NO_CRC,
    INTEGRITY_OK,
    INTEGRITY_TRUNCATED,
    INTEGRITY_UNCHECKED,
)

ReadRequest = Tuple[int, int]  # (offset, length)
Reader = Generator[ReadRequest, bytes, object]

TAIL_BYTES = 66 * 1024  # EOCD (22 bytes + a comment up to 64 KiB) and, usually, the whole directory
MAX_DIRECTORY_BYTES = 256 * 1024 * 1024
CRC_CHUNK = 8 * 1024 * 1024
LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # 30 bytes
CENTRAL_HEADER = struct.Struct("<4sHHHHHHIIIHHHHHII")  # 46 bytes
EOCD = struct.Struct("<4sHHHHIIH")  # 22 bytes
ZIP64_LOCATOR = struct.Struct("<4sIQI")  # 20 bytes
ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")  # 56 bytes
SIG_LOCAL = b"PK\x03\x04"
SIG_CENTRAL = b"PK\x01\x02"
SIG_EOCD = b"PK\x05\x06"
SIG_ZIP64_LOCATOR = b"PK\x06\x07"
SIG_ZIP64_EOCD = b"PK\x06\x06"
TENSOR_ENTRY = re.compile(r"(?:^|/)data/(\d+)$")


class ZipProblem(Exception):
    """The zip cannot be read: `integrity` (truncated or corrupt) and a one-line reason."""

    def __init__(self, integrity: str, reason: str) -> None:
        super().__init__(reason)
        self.integrity = integrity
        self.reason = reason


@dataclass(frozen=True)
class ZipEntry:
    """One member as the central directory records it."""

    name: str
    offset: int  # of its local header
    compressed_size: int
    size: int
    crc: int
    method: int  # 0 stored (what torch writes), 8 deflated
    flags: int


@dataclass(frozen=True)
class ZipDirectory:
    """The central directory of a zip file of `file_size` bytes."""

    entries: Tuple[ZipEntry, ...]
    directory_offset: int
    directory_size: int
    file_size: int
    zip64: bool = False

    def find(self, suffix: str) -> Optional[ZipEntry]:
        """The member whose name is `suffix` or ends in `/suffix` (torch's top folder is the file's stem)."""
        for entry in self.entries:
            if entry.name == suffix or entry.name.endswith("/" + suffix):
                return entry
        return None

    def tensor_entries(self) -> List[ZipEntry]:
        """The `<stem>/data/<N>` members: one per storage."""
        found = self.__dict__.get("_tensor_entries")
        if found is None:
            found = [entry for entry in self.entries if "/data/" in entry.name and TENSOR_ENTRY.search(entry.name)]
            object.__setattr__(self, "_tensor_entries", found)  # frozen: computed once, kept
        return found

    def storage_entry(self, key: str) -> Optional[ZipEntry]:
        """The member holding storage `key` (data.pkl's persistent id)."""
        pkl = self.find("data.pkl")
        prefix = pkl.name[: -len("data.pkl")] if pkl is not None else ""
        name = "%sdata/%s" % (prefix, key)
        for entry in self.entries:
            if entry.name == name:
                return entry
        return None

    @property
    def tensor_count(self) -> int:
        return len(self.tensor_entries())

    @property
    def tensor_bytes(self) -> int:
        return sum(entry.size for entry in self.tensor_entries())

    @property
    def crc_recorded(self) -> bool:
        """False when every CRC is 0 (torch.serialization.set_crc32_options(False)): nothing to verify."""
        return any(entry.crc != 0 for entry in self.entries if entry.size > 0)


def drive_local(reader: Reader, fd: int) -> object:
    """Run a reader generator against an open file descriptor; returns its result."""
    try:
        request = next(reader)
        while True:
            offset, length = request
            request = reader.send(os.pread(fd, length, offset))
    except StopIteration as stop:
        return stop.value


def read_local(path: str, make_reader: Callable[[int], Reader]) -> object:
    """Open `path`, run `make_reader(size)` against it, close it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return drive_local(make_reader(size), fd)
    finally:
        os.close(fd)


# --- the central directory -----------------------------------------------------------------


def directory_reader(size: int, tail_bytes: int = TAIL_BYTES) -> Generator[ReadRequest, bytes, ZipDirectory]:
    """Read and check the central directory of a zip of `size` bytes (raises ZipProblem).

    The first read is the last `tail_bytes`; only a zip comment longer than that (torch
    writes none) costs a second, full-size read of the end.
    """
    if size < EOCD.size:
        raise ZipProblem(INTEGRITY_TRUNCATED, "only %d bytes: no zip directory" % size)
    tail_start = max(0, size - tail_bytes)
    tail = yield (tail_start, size - tail_start)
    eocd_at = _find_eocd(tail, size - tail_start)
    if eocd_at is None and tail_start > max(0, size - TAIL_BYTES):
        tail_start = max(0, size - TAIL_BYTES)
        tail = yield (tail_start, size - tail_start)
        eocd_at = _find_eocd(tail, size - tail_start)
    if eocd_at is None:
        raise ZipProblem(INTEGRITY_TRUNCATED, "no zip end record: the file is cut short")
    _, disk, _, _, count, cd_size, cd_offset, _ = EOCD.unpack_from(tail, eocd_at)
    eocd_pos = tail_start + eocd_at
    zip64 = False
    if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        zip64 = True
        count, cd_size, cd_offset, record_end = yield from _zip64_end(tail, tail_start, eocd_at)
    else:
        record_end = eocd_pos
    if disk != 0:
        raise ZipProblem(INTEGRITY_CORRUPT, "multi-disk zip")
    if cd_offset + cd_size > record_end:
        raise ZipProblem(
            INTEGRITY_TRUNCATED,
            "zip directory at %d+%d runs past its end record at %d" % (cd_offset, cd_size, record_end),
        )
    if cd_size > MAX_DIRECTORY_BYTES:
        raise ZipProblem(INTEGRITY_CORRUPT, "zip directory of %d bytes is implausibly large" % cd_size)
    if cd_offset >= tail_start:
        data = tail[cd_offset - tail_start : cd_offset - tail_start + cd_size]
    else:
        data = yield (cd_offset, cd_size)
    if len(data) != cd_size:
        raise ZipProblem(INTEGRITY_TRUNCATED, "zip directory cut short")
    entries = _parse_directory(data, count)
    for entry in entries:
        # The local header alone needs 30 bytes plus the name before the data starts.
        end = (
            entry.offset
            + LOCAL_HEADER.size
            + len(entry.name.encode("utf-8", "surrogateescape"))
            + entry.compressed_size
        )
        if end > cd_offset:
            raise ZipProblem(
                INTEGRITY_TRUNCATED,
                "%s: %d bytes at %d run past the data area (%d bytes)"
                % (entry.name, entry.compressed_size, entry.offset, cd_offset),
            )
    return ZipDirectory(tuple(entries), cd_offset, cd_size, size, zip64)


CHECK_TAIL_BYTES = 8 * 1024  # the end record and a checkpoint's small directory, usually in one read
ZEROS_HEAD = 512  # a file not a zip whose first bytes (up to this many) are all zero is corrupt
NOT_A_ZIP = "not a zip archive (a legacy torch.save, or another format): its end is not checked"


def directory_check_reader(size: int) -> Generator[ReadRequest, bytes, Tuple[str, Optional[str]]]:
    """(integrity, problem) of a zip's end: what directory_reader proves, without building its entries.

    A listing proves every torch file of a unit this way (optimizer.pt, scheduler.pt ...): the
    end record is at the very end, the directory it points to is whole, and every member's
    data lies before it, so a file cut short anywhere reads as truncated. One read of the last
    8 KiB usually holds all of it; a long directory or comment costs one more. A file that is
    no zip at all (no local header at its start either) is not called truncated: it is
    unchecked, as a legacy pickle is. Zip64 ends go through directory_reader.
    """
    if size < EOCD.size:
        return INTEGRITY_TRUNCATED, "only %d bytes: no zip directory" % size
    tail_start = max(0, size - CHECK_TAIL_BYTES)
    tail = yield (tail_start, size - tail_start)
    eocd_at = _find_eocd(tail, size - tail_start)
    if eocd_at is None and tail_start > 0:
        tail_start = max(0, size - TAIL_BYTES)  # a zip comment of up to 64 KiB
        tail = yield (tail_start, size - tail_start)
        eocd_at = _find_eocd(tail, size - tail_start)
    if eocd_at is None:
        head = tail[:ZEROS_HEAD] if tail_start == 0 else (yield (0, min(size, ZEROS_HEAD)))
        if head[:4] == SIG_LOCAL:
            return INTEGRITY_TRUNCATED, "no zip end record: the file is cut short"
        if not head.strip(b"\0"):
            # What a crash leaves of a file whose data never reached the disk: its size, zeros.
            # No legacy torch.save (a pickle, b"\x80" first) or other format starts so.
            return INTEGRITY_CORRUPT, "no zip, and its first %d bytes are all zero (data lost in a crash?)" % len(head)
        return INTEGRITY_UNCHECKED, NOT_A_ZIP
    _, disk, _, _, count, cd_size, cd_offset, _ = EOCD.unpack_from(tail, eocd_at)
    if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF or disk != 0:
        try:
            directory = yield from directory_reader(size)
        except ZipProblem as problem:
            return problem.integrity, problem.reason
        return quick_integrity(directory), None
    record_end = tail_start + eocd_at
    if cd_offset + cd_size > record_end:
        return (
            INTEGRITY_TRUNCATED,
            "zip directory at %d+%d runs past its end record at %d" % (cd_offset, cd_size, record_end),
        )
    if cd_size > MAX_DIRECTORY_BYTES:
        return INTEGRITY_CORRUPT, "zip directory of %d bytes is implausibly large" % cd_size
    if cd_offset >= tail_start:
        data = tail[cd_offset - tail_start : cd_offset - tail_start + cd_size]
    else:
        data = yield (cd_offset, cd_size)
    if len(data) != cd_size:
        return INTEGRITY_TRUNCATED, "zip directory cut short"
    return _check_directory(data, count, cd_offset)


# The central header fields a check needs, the rest skipped: signature (as a number), CRC,
# compressed and uncompressed size, name, extra and comment lengths, the local header's offset.
_CENTRAL_CHECKED = struct.Struct("<I12xIIIHHH8xI")
_SIG_CENTRAL_NUMBER = struct.unpack("<I", SIG_CENTRAL)[0]
_FULL32 = 0xFFFFFFFF


def _check_directory(data: bytes, count: int, cd_offset: int) -> Tuple[str, Optional[str]]:
    """_parse_directory's and directory_reader's checks over the raw directory, without the entries.

    Each entry's signature, and its member's local header, name and data inside the data area
    (before the directory): a file cut short anywhere before its end record reads as truncated.
    A listing checks every torch file of every unit so: a lean pass first (one unpack of only
    the fields checked, per entry), and at the first entry it cannot pass (a bad signature,
    zip64 sizes, data past the area, a short header) the careful pass, which says what is wrong.
    """
    unpack = _CENTRAL_CHECKED.unpack_from
    limit = cd_offset - LOCAL_HEADER.size
    end = len(data)
    pos = 0
    seen = 0
    any_crc = False
    try:
        while pos < end:
            signature, crc, csize, usize, name_len, extra_len, comment_len, offset = unpack(data, pos)
            if (
                signature != _SIG_CENTRAL_NUMBER
                or usize == _FULL32
                or csize == _FULL32
                or offset == _FULL32
                or offset + name_len + csize > limit
            ):
                return _check_directory_carefully(data, count, cd_offset)
            if crc and usize:
                any_crc = True
            seen += 1
            pos += 46 + name_len + extra_len + comment_len
    except struct.error:  # a header cut short by the directory's end
        return _check_directory_carefully(data, count, cd_offset)
    if seen != count:
        return INTEGRITY_CORRUPT, "zip directory lists %d entries, its end record says %d" % (seen, count)
    return (INTEGRITY_OK if any_crc else INTEGRITY_NO_CRC), None


def _check_directory_carefully(data: bytes, count: int, cd_offset: int) -> Tuple[str, Optional[str]]:
    """_check_directory's verdict entry by entry, with zip64 sizes read and what is wrong in words."""
    unpack = _CENTRAL_CHECKED.unpack_from
    header_size = CENTRAL_HEADER.size
    local_size = LOCAL_HEADER.size
    pos = 0
    seen = 0
    any_crc = False
    last = len(data) - header_size  # the last position a whole header can start at
    while pos < len(data):
        if pos > last:
            return INTEGRITY_CORRUPT, "zip directory entry %d is damaged" % seen
        signature, crc, csize, usize, name_len, extra_len, comment_len, offset = unpack(data, pos)
        if signature != _SIG_CENTRAL_NUMBER:
            return INTEGRITY_CORRUPT, "zip directory entry %d is damaged" % seen
        if usize == _FULL32 or csize == _FULL32 or offset == _FULL32:
            start = pos + header_size
            try:
                usize, csize, offset = _zip64_extra(
                    data[start + name_len : start + name_len + extra_len], usize, csize, offset
                )
            except ZipProblem as problem:
                return problem.integrity, problem.reason
        if offset + local_size + name_len + csize > cd_offset:
            name = data[pos + header_size : pos + header_size + name_len].decode("utf-8", "replace")
            return (
                INTEGRITY_TRUNCATED,
                "%s: %d bytes at %d run past the data area (%d bytes)" % (name, csize, offset, cd_offset),
            )
        if crc and usize:
            any_crc = True
        seen += 1
        pos += header_size + name_len + extra_len + comment_len
    if seen != count:
        return INTEGRITY_CORRUPT, "zip directory lists %d entries, its end record says %d" % (seen, count)
    return (INTEGRITY_OK if any_crc else INTEGRITY_NO_CRC), None


def _find_eocd(tail: bytes, tail_len: int) -> Optional[int]:
    # The last signature whose comment length reaches exactly the end of the file.
    position = tail.rfind(SIG_EOCD)
    while position >= 0:
        if position + EOCD.size <= len(tail):
            comment_len = struct.unpack_from("<H", tail, position + 20)[0]
            if position + EOCD.size + comment_len == tail_len:
                return position
        position = tail.rfind(SIG_EOCD, 0, position)
    return None


def _zip64_end(tail: bytes, tail_start: int, eocd_at: int) -> Generator[ReadRequest, bytes, Tuple[int, int, int, int]]:
    locator_at = eocd_at - ZIP64_LOCATOR.size
    if locator_at < 0 or tail[locator_at : locator_at + 4] != SIG_ZIP64_LOCATOR:
        raise ZipProblem(INTEGRITY_CORRUPT, "zip64 sizes without a zip64 locator")
    _, _, record_offset, _ = ZIP64_LOCATOR.unpack_from(tail, locator_at)
    if record_offset + ZIP64_EOCD.size > tail_start + locator_at:
        # It is written just before its locator; an offset past that (up to 2**64) is no offset.
        raise ZipProblem(INTEGRITY_CORRUPT, "zip64 end record offset %d is past its locator" % record_offset)
    if record_offset >= tail_start:
        record = tail[record_offset - tail_start : record_offset - tail_start + ZIP64_EOCD.size]
    else:
        record = yield (record_offset, ZIP64_EOCD.size)
    if len(record) < ZIP64_EOCD.size or record[:4] != SIG_ZIP64_EOCD:
        raise ZipProblem(INTEGRITY_CORRUPT, "zip64 end record missing")
    fields = ZIP64_EOCD.unpack_from(record)
    return fields[7], fields[8], fields[9], record_offset


def _parse_directory(data: bytes, count: int) -> List[ZipEntry]:
    entries: List[ZipEntry] = []
    pos = 0
    while pos < len(data):
        if pos + CENTRAL_HEADER.size > len(data) or data[pos : pos + 4] != SIG_CENTRAL:
            raise ZipProblem(INTEGRITY_CORRUPT, "zip directory entry %d is damaged" % len(entries))
        f = CENTRAL_HEADER.unpack_from(data, pos)
        flags, method, crc, csize, usize = f[3], f[4], f[7], f[8], f[9]
        name_len, extra_len, comment_len, offset = f[10], f[11], f[12], f[16]
        start = pos + CENTRAL_HEADER.size
        raw_name = data[start : start + name_len]
        extra = data[start + name_len : start + name_len + extra_len]
        name = raw_name.decode("utf-8" if flags & 0x800 else "cp437", "replace")
        if usize == 0xFFFFFFFF or csize == 0xFFFFFFFF or offset == 0xFFFFFFFF:
            usize, csize, offset = _zip64_extra(extra, usize, csize, offset)
        entries.append(ZipEntry(name, offset, csize, usize, crc, method, flags))
        pos = start + name_len + extra_len + comment_len
    if len(entries) != count:
        raise ZipProblem(
            INTEGRITY_CORRUPT, "zip directory lists %d entries, its end record says %d" % (len(entries), count)
        )
    return entries


def _zip64_extra(extra: bytes, usize: int, csize: int, offset: int) -> Tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        body = extra[pos + 4 : pos + 4 + length]
        if tag == 0x0001:
            values = [struct.unpack_from("<Q", body, i)[0] for i in range(0, len(body) - 7, 8)]
            if usize == 0xFFFFFFFF and values:
                usize = values.pop(0)
            if csize == 0xFFFFFFFF and values:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF and values:
                offset = values.pop(0)
            return usize, csize, offset
        pos += 4 + length
    raise ZipProblem(INTEGRITY_CORRUPT, "zip64 sizes without their extra field")


# --- members -------------------------------------------------------------------------------


def member_reader(entry: ZipEntry, limit: int) -> Generator[ReadRequest, bytes, bytes]:
    """Read one member's (decompressed) bytes; raises ZipProblem when it is damaged or over `limit`."""
    if entry.size > limit:
        raise ZipProblem(INTEGRITY_CORRUPT, "%s is %d bytes, over the %d read limit" % (entry.name, entry.size, limit))
    # What is read is the compressed size: bound it too, or a small `size` could bring a 100 GB read.
    if entry.method == 0 and entry.compressed_size != entry.size:
        raise ZipProblem(
            INTEGRITY_CORRUPT, "%s: stored with %d bytes but sized %d" % (entry.name, entry.compressed_size, entry.size)
        )
    if entry.compressed_size > limit:
        raise ZipProblem(
            INTEGRITY_CORRUPT,
            "%s is %d bytes compressed, over the %d read limit" % (entry.name, entry.compressed_size, limit),
        )
    # Local header and data in one request; the local extra field may differ from the central one.
    guess = LOCAL_HEADER.size + len(entry.name.encode("utf-8", "surrogateescape")) + 256
    data = yield (entry.offset, guess + entry.compressed_size)
    start = _data_start(entry, data)
    if start + entry.compressed_size > len(data):
        more = yield (entry.offset + len(data), start + entry.compressed_size - len(data))
        data += more
    raw = data[start : start + entry.compressed_size]
    if len(raw) != entry.compressed_size:
        raise ZipProblem(INTEGRITY_TRUNCATED, "%s cut short" % entry.name)
    return _decompress(entry, raw)


def _data_start(entry: ZipEntry, header: bytes) -> int:
    if len(header) < LOCAL_HEADER.size or header[:4] != SIG_LOCAL:
        raise ZipProblem(INTEGRITY_CORRUPT, "%s: no local header at offset %d" % (entry.name, entry.offset))
    fields = LOCAL_HEADER.unpack(header[: LOCAL_HEADER.size])
    return LOCAL_HEADER.size + fields[9] + fields[10]


def _decompress(entry: ZipEntry, raw: bytes) -> bytes:
    if entry.method == 0:
        return raw
    if entry.method == 8:
        # Never more than the directory's size (already under the read limit): a deflate
        # bomb of a few KB would otherwise inflate to gigabytes.
        inflater = zlib.decompressobj(-15)
        try:
            out = inflater.decompress(raw, entry.size + 1)
        except zlib.error as exc:
            raise ZipProblem(INTEGRITY_CORRUPT, "%s: %s" % (entry.name, exc)) from None
        if len(out) != entry.size:
            raise ZipProblem(
                INTEGRITY_CORRUPT,
                "%s inflates to %s bytes, its directory says %d"
                % (entry.name, "over %d" % entry.size if len(out) > entry.size else len(out), entry.size),
            )
        return out
    raise ZipProblem(INTEGRITY_CORRUPT, "%s: compression method %d not supported" % (entry.name, entry.method))


@dataclass(frozen=True)
class CrcResult:
    """The outcome of a full CRC check: integrity, a reason when not ok, bytes checked."""

    integrity: str
    problem: Optional[str]
    checked_bytes: int
    entries: int


Progress = Callable[[int, int], None]  # (bytes done, bytes total)


def crc_reader(
    directory: ZipDirectory,
    progress: Optional[Progress] = None,
    cancelled: Callable[[], bool] = lambda: False,
    chunk: int = CRC_CHUNK,
) -> Generator[ReadRequest, bytes, CrcResult]:
    """Check every member's CRC-32 against the directory; `progress` is told as bytes go by."""
    if not directory.crc_recorded:
        return CrcResult(INTEGRITY_NO_CRC, "no CRC recorded (every CRC in the zip is 0)", 0, len(directory.entries))
    total = sum(entry.compressed_size for entry in directory.entries)
    done = 0
    for entry in sorted(directory.entries, key=lambda e: e.offset):
        if cancelled():
            return CrcResult("unchecked", "CRC check cancelled", done, len(directory.entries))
        header = yield (entry.offset, LOCAL_HEADER.size + 1024)
        position = entry.offset + _data_start(entry, header)
        remaining = entry.compressed_size
        crc = 0
        inflated = 0
        inflater = zlib.decompressobj(-15) if entry.method == 8 else None
        while remaining > 0:
            if cancelled():
                return CrcResult("unchecked", "CRC check cancelled", done, len(directory.entries))
            block = yield (position, min(chunk, remaining))
            if not block:
                return CrcResult(INTEGRITY_TRUNCATED, "%s cut short" % entry.name, done, len(directory.entries))
            position += len(block)
            remaining -= len(block)
            done += len(block)
            if inflater is not None:
                try:
                    crc, inflated = _inflate_crc(inflater, block, crc, chunk, inflated, entry.size)
                except zlib.error as exc:
                    return CrcResult(INTEGRITY_CORRUPT, "%s: %s" % (entry.name, exc), done, len(directory.entries))
                if inflated > entry.size:
                    return CrcResult(
                        INTEGRITY_CORRUPT,
                        "%s inflates past its %d bytes" % (entry.name, entry.size),
                        done,
                        len(directory.entries),
                    )
            else:
                crc = zlib.crc32(block, crc)
            if progress is not None:
                progress(done, total)
        if entry.crc == 0 and entry.size > 0:
            continue  # this member was written without a CRC
        if crc != entry.crc:
            return CrcResult(
                INTEGRITY_CORRUPT,
                "CRC mismatch in %s (recorded %08x, read %08x)" % (entry.name, entry.crc, crc),
                done,
                len(directory.entries),
            )
    if progress is not None:
        progress(total, total)
    return CrcResult(INTEGRITY_OK, None, done, len(directory.entries))


def _inflate_crc(inflater, block: bytes, crc: int, chunk: int, inflated: int, size: int) -> Tuple[int, int]:
    """CRC of what `block` inflates to, `chunk` bytes of output at a time, stopping past `size`.

    8 MB of deflate can inflate to 8 GB: one decompress() call of it would hold all of it.
    """
    while block and inflated <= size:
        out = inflater.decompress(block, chunk)
        crc = zlib.crc32(out, crc)
        inflated += len(out)
        block = inflater.unconsumed_tail
    return crc, inflated


def full_check_reader(
    size: int, progress: Optional[Progress] = None, cancelled: Callable[[], bool] = lambda: False
) -> Generator[ReadRequest, bytes, CrcResult]:
    """Directory, then every CRC: the whole full check as one reader."""
    try:
        directory = yield from directory_reader(size)
    except ZipProblem as problem:
        return CrcResult(problem.integrity, problem.reason, 0, 0)
    try:
        return (yield from crc_reader(directory, progress, cancelled))
    except ZipProblem as problem:
        return CrcResult(problem.integrity, problem.reason, 0, len(directory.entries))


def quick_integrity(directory: ZipDirectory) -> str:
    """ok, or no_crc where the zip recorded no CRC to check later."""
    return INTEGRITY_OK if directory.crc_recorded else INTEGRITY_NO_CRC
