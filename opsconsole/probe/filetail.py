"""Reading one growing log file line by line, through rotation and truncation (stdlib only).

The same code follows local files (logs/follow.py) and runs on remote nodes (logs/remote.py ships
this module's source to the node's Python): it lives in probe/, with what else runs on nodes, imports
only the stdlib and runs on Python 3.6+.

A `FileTail` keeps the file open and remembers, besides its read position, the inode and the
last bytes before that position (a fingerprint). Each `poll()`:
- a new inode at the path (rotation): the rest of the old file is read first, then the new one from 0;
- a file shorter than the position, or whose bytes before the position changed (truncated, then
  grown past the old size between two polls): read again from 0;
- a last line without its newline waits; a line over MAX_LINE_BYTES is cut there and the rest of
  it skipped, so memory stays bounded however long a line is.
Lines come out as (offset, number, raw bytes, truncated); number is 0 while it is unknown (a huge
file opened at its last page: the index fills the count in later through `set_base`).
"""

import glob
import json
import os
import select
import stat
import sys
import time
from itertools import accumulate, chain, repeat

MAX_LINE_BYTES = 64 * 1024  # the same value as records.MAX_LINE_BYTES (kept here: stdlib only)
FINGERPRINT_BYTES = 64
READ_CHUNK = 1 << 20
POLL_BUDGET = 8 << 20  # bytes read from one file per poll, so one busy file cannot starve the others
LAST_PAGE_BYTES = 256 * 1024  # a file first seen starts at most this far from its end (its last page)
LAST_PAGE_LINES = 200  # ... and at its last this many lines: one page per source shows at once, older ones on demand
FIRST_TAIL_BLOCK = 32 * 1024
TAIL_BLOCK = 64 * 1024  # reading backwards from the end: one block holds ~500 lines of a training log
COUNT_LINES_LIMIT = 256 << 20  # below this size the lines before the last page are simply counted
# Files one follower keeps open (a FileTail holds its file's descriptor). A glob over a big run's rank
# logs can match thousands, and a login node's usual limit is 1024 descriptors for the whole process.
MAX_FOLLOWED_FILES = 256


class NotRegularFile(OSError):
    """A path that holds something other than a regular file (a FIFO, a device, a socket)."""


def open_regular(path):
    """A read-only descriptor of the regular file at `path`; OSError (NotRegularFile) for anything else.

    Opened non-blocking: opening a FIFO waits for a writer, so one put at a followed path (a rotation,
    or swapped in after the glob looked) hung the follower for ever, and with it the console's quit.
    O_NONBLOCK changes nothing for a regular file's reads.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile("not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def cut_line(raw):
    """The first MAX_LINE_BYTES of a line, not splitting a UTF-8 character."""
    cut = MAX_LINE_BYTES
    while cut > 0 and (raw[cut] & 0xC0) == 0x80:
        cut -= 1
    return raw[:cut]


def last_page_start(fd, size, page=LAST_PAGE_BYTES, lines=LAST_PAGE_LINES):
    """Offset where the last page of an open file starts: its last `lines` complete lines, read
    backwards from the end, but never more than `page` bytes back (then: the first whole line there)."""
    floor = max(0, size - page)
    position, newlines = size, 0
    step = FIRST_TAIL_BLOCK  # 200 lines of a training log fit in it: one read, no more bytes than needed
    while position > floor:
        step = min(step, position - floor)
        position -= step
        block = os.pread(fd, step, position)
        count = block.count(b"\n")
        if newlines + count > lines:  # the newline before the page's first line is in this block
            # It is the j-th newline from the block's end: the page starts after the last j pieces.
            j = lines + 1 - newlines
            pieces = block.split(b"\n")
            return position + len(block) - sum(map(len, pieces[-j:])) - (j - 1)
        newlines += count
        step = TAIL_BLOCK
    if floor == 0:
        return 0
    block = os.pread(fd, page, floor - 1)  # one byte before: is `floor` already a line start?
    newline = block.find(b"\n")
    if newline < 0:
        return size  # one giant last line: follow from the end
    return floor + newline


def count_lines_before(fd, offset):
    """Newlines in the first `offset` bytes of an open file (the number of lines before it)."""
    count, position = 0, 0
    while position < offset:
        block = os.pread(fd, min(READ_CHUNK * 4, offset - position), position)
        if not block:
            break
        count += block.count(b"\n")
        position += len(block)
    return count


def read_lines_before(fd, before, count, block_size=64 * 1024, reads=None):
    """Up to `count` complete lines ending at or before offset `before`: [(offset, raw, truncated)].

    Reads backwards in blocks from `before`, so the cost depends on what is returned, not on the
    file's size. Bytes after the last newline before `before` (a partial line) are not a line.
    `reads`, when given, is a one-element list that counts the pread calls.
    """
    if count <= 0 or before <= 0:
        return []
    blocks = []
    position = before
    newlines = 0
    while position > 0:
        size = min(block_size, position)
        position -= size
        block = os.pread(fd, size, position)
        if reads is not None:
            reads[0] += 1
        blocks.append(block)
        newlines += block.count(b"\n")
        if newlines > count:  # count lines end at count newlines; one more marks where the first starts
            break
    data = b"".join(reversed(blocks))
    last = data.rfind(b"\n")
    if last < 0:
        return []
    data = data[:last]  # drop the final newline and any partial line after it
    pieces = data.split(b"\n")
    offset = position
    if position > 0:
        offset += len(pieces[0]) + 1
        pieces = pieces[1:]  # it starts before what was read
    starts = []
    for raw in pieces:
        starts.append(offset)
        offset += len(raw) + 1
    result = []
    for start, raw in list(zip(starts, pieces))[-count:]:
        if len(raw) > MAX_LINE_BYTES:
            result.append((start, cut_line(raw), True))
        else:
            result.append((start, raw, False))
    return result


class FileTail(object):
    """Follows one file by name: new complete lines on each poll, rotation and truncation handled."""

    def __init__(self, path, offset=0, number=0, inode=None, fingerprint=b"", base_known=True):
        self.path = path
        self.fd = None
        self.inode = None
        self.dev = None
        self.line_start = offset  # offset of the next line not yet delivered
        self.read_pos = offset  # bytes read so far (past line_start by the partial line)
        self.count = number  # lines delivered since the base
        self.base = 0 if base_known else None  # lines before the start offset; None: unknown yet
        self.partial = b""
        self.skipping = False  # inside a cut over-long line, until its newline
        self.fingerprint = fingerprint  # up to FINGERPRINT_BYTES bytes just before read_pos
        self.want_inode = inode  # resuming: the inode the offset belongs to
        self.size_seen = -1
        self.mtime_seen = None
        self.error = None  # the last reason this file could not be read, e.g. "permission denied"
        self.events = []  # ("rotated" | "truncated", offset) since the caller last looked
        # A file open at start-up: its size then. Lines before it were written before following began (their
        # findings are "earlier"); None once they were delivered, or for a file that appeared later.
        self.backlog_end = None

    # --- state the caller keeps to resume elsewhere -------------------------------------------------

    def resume_state(self):
        """(offset, number, inode, fingerprint) that let a new FileTail go on from the next line."""
        fingerprint = b""
        if self.fd is not None and self.line_start > 0:
            take = min(FINGERPRINT_BYTES, self.line_start)
            try:
                fingerprint = os.pread(self.fd, take, self.line_start - take)
            except OSError:
                fingerprint = b""
        return self.line_start, self.count if self.base is None else self.base + self.count, self.inode, fingerprint

    def set_base(self, lines_before_start):
        """The number of lines before the start offset became known (the index counted them)."""
        if self.base is None:
            self.base = lines_before_start

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    # --- polling ---------------------------------------------------------------------------------------

    def poll(self, budget=POLL_BUDGET):
        """New complete lines since the last poll: [(offset, number, raw, truncated)]."""
        out = []
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            self.error = describe_os_error(exc)
            return out
        if self.fd is None:
            if st is None:
                self.error = "no such file"
                return out
            if not self._open(st):
                return out
        elif st is None or (st.st_ino, st.st_dev) != (self.inode, self.dev):
            # Rotated (or removed): read what is left of the old file, then switch.
            if self._read(out, budget) and st is not None:
                self._flush_partial(out)
                self.close()
                self._reset_position(0)
                self.events.append(("rotated", 0))
                if self._open(st):  # else its error says why; reading no descriptor raised TypeError
                    self._read(out, budget)
            return out
        else:
            changed = st.st_size != self.size_seen or st.st_mtime_ns != self.mtime_seen
            if changed and (st.st_size < self.read_pos or not self._fingerprint_matches()):
                self._reset_position(0)
                self.events.append(("truncated", 0))
        self.size_seen, self.mtime_seen = st.st_size, st.st_mtime_ns
        self._read(out, budget, st.st_size)
        return out

    def _open(self, st):
        try:
            fd = open_regular(self.path)
        except OSError as exc:
            self.error = describe_os_error(exc)
            return False
        opened = os.fstat(fd)
        self.fd, self.inode, self.dev, self.error = fd, opened.st_ino, opened.st_dev, None
        if self.want_inode is not None:
            # Resuming: the offset only means something in the same file with the same bytes before it.
            same = opened.st_ino == self.want_inode and opened.st_size >= self.read_pos
            if not same or not self._fingerprint_matches():
                self._reset_position(0)
                self.events.append(("rotated" if not same else "truncated", 0))
            self.want_inode = None
        return True

    def _reset_position(self, offset):
        self.line_start = self.read_pos = offset
        self.partial, self.skipping, self.fingerprint = b"", False, b""
        self.count, self.base = 0, 0
        self.size_seen = -1

    def _fingerprint_matches(self):
        if self.read_pos == 0 or not self.fingerprint:
            return True
        take = len(self.fingerprint)
        try:
            return os.pread(self.fd, take, self.read_pos - take) == self.fingerprint
        except OSError:
            return False

    def _read(self, out, budget, end=None):
        """Read up to `budget` bytes (and, when `end` is given, up to that size the stat saw: no
        read that finds nothing, no 1 MiB buffer for a few lines); True when the end was reached."""
        left = budget
        while left > 0:
            want = min(READ_CHUNK, left)
            if end is not None:
                if self.read_pos >= end:
                    return True
                want = min(want, end - self.read_pos)
            try:
                chunk = os.pread(self.fd, want, self.read_pos)
            except OSError as exc:
                self.error = describe_os_error(exc)
                return True
            if not chunk:
                return True
            self.read_pos += len(chunk)
            left -= len(chunk)
            self.fingerprint = (self.fingerprint + chunk[-FINGERPRINT_BYTES:])[-FINGERPRINT_BYTES:]
            self._split(chunk, out)
        return False

    def _number(self):
        self.count += 1
        return 0 if self.base is None else self.base + self.count

    def _split(self, chunk, out):
        if self.skipping:
            newline = chunk.find(b"\n")
            if newline < 0:
                return
            self.skipping = False
            self.line_start = self.read_pos - len(chunk) + newline + 1
            chunk = chunk[newline + 1 :]
        data = self.partial + chunk if self.partial else chunk
        parts = data.split(b"\n")
        self.partial = parts.pop()
        offset = self.line_start
        lengths = list(map(len, parts))
        if lengths and max(lengths) <= MAX_LINE_BYTES:
            # No line to cut (the usual case): offsets, numbers and tuples made by C loops.
            starts = list(accumulate(chain((offset,), map((1).__add__, lengths))))  # initial= is 3.8+
            first = self.count + 1
            self.count += len(parts)
            numbers = repeat(0) if self.base is None else range(self.base + first, self.base + self.count + 1)
            out.extend(zip(starts, numbers, parts, repeat(False)))
            offset = starts[-1]
            parts = ()
        append = out.append
        for raw in parts:
            size = len(raw)
            if size > MAX_LINE_BYTES:
                append((offset, self._number(), cut_line(raw), True))
            else:
                self.count += 1
                append((offset, 0 if self.base is None else self.base + self.count, raw, False))
            offset += size + 1
        self.line_start = offset
        if len(self.partial) > MAX_LINE_BYTES:
            append((offset, self._number(), cut_line(self.partial), True))
            self.partial, self.skipping = b"", True

    def _flush_partial(self, out):
        """A rotated-away file gets no newline any more: its last partial line is a line."""
        if self.partial and not self.skipping:
            out.append((self.line_start, self._number(), self.partial, False))
        self.partial = b""


def within_cap(paths, followed, cap=MAX_FOLLOWED_FILES):
    """The new paths of `paths` (not in `followed`) that fit under `cap` followed files: the most recently
    written first when they do not all fit; in the order given. A path that cannot be stat'ed counts as oldest.
    """
    new = [path for path in paths if path not in followed]
    room = max(0, cap - len(followed))
    if len(new) <= room:
        return new

    def written(path):
        try:
            return os.stat(path).st_mtime_ns
        except OSError:
            return -1

    kept = set(sorted(new, key=written, reverse=True)[:room])
    return [path for path in new if path in kept]


def cap_problem(matches, followed):
    """What a pattern says when not all of its `matches` are followed, else None."""
    count = sum(1 for path in matches if path in followed)
    if count == len(matches):
        return None
    return "%d files match: following the %d most recently written" % (len(matches), count)


def describe_os_error(exc):
    """A short reason for an OSError, as the console shows it."""
    import errno

    if isinstance(exc, NotRegularFile):
        return "not a regular file"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOENT:
        return "no such file"
    if exc.errno == errno.EISDIR:
        return "is a directory"
    return exc.strerror or str(exc)


# --- the remote side: run by remote.py as `python3 -c SOURCE SPEC` ------------------------------------


def _emit(record):
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")


def _lines_record(path, tail, lines):
    offset, number, inode, fingerprint = tail.resume_state()
    record = {
        "p": path,
        "l": [[o, n, raw.decode("utf-8", "replace"), t] for o, n, raw, t in lines],
        "r": [offset, number, inode, fingerprint.hex()],
    }
    end = tail.backlog_end
    if end is not None:
        # "b": how many of the first lines were in the file when following began (its last page at start-up).
        earlier = sum(1 for line in lines if line[0] < end)
        if earlier:
            record["b"] = earlier
        if earlier < len(lines) or offset >= end:
            tail.backlog_end = None
    return record


def start_tail(path, initial, count_limit=COUNT_LINES_LIMIT):
    """A FileTail for a file first seen: at its last page on start-up, from 0 when it appeared later.

    The lines before the last page are counted now when the file holds at most `count_limit` bytes;
    a bigger one gets its line numbers later (the local follower's index). Used by the local follower
    (logs/follow.py) and by remote_follow on a node.
    """
    if not initial:
        return FileTail(path)
    try:
        fd = open_regular(path)
    except OSError:
        return FileTail(path)  # its first poll says why
    try:
        size = os.fstat(fd).st_size
        start = last_page_start(fd, size)
        if start == 0:
            tail = FileTail(path)
        else:
            known = size <= count_limit
            tail = FileTail(path, offset=start, base_known=known)
            if known:
                tail.base = count_lines_before(fd, start)
        tail.backlog_end = size if size else None
        return tail
    finally:
        os.close(fd)


def _watch_stdin():
    """fd 0 when it is the console's channel (a pipe or socket), else None: its EOF means the console
    went away. Without this a follower of idle files never writes, so never sees EPIPE, and would
    live on the node forever after the console closed the channel."""
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return None
    return 0 if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else None


def _console_gone(stdin_fd, parent, wait):
    """Wait up to `wait` seconds; True when the console's channel reached EOF or our parent (the
    sshd session) exited."""
    if os.getppid() != parent:
        return True
    if stdin_fd is None:
        if wait > 0:
            time.sleep(wait)
        return False
    readable, _, _ = select.select([stdin_fd], [], [], wait)
    if readable:
        try:
            data = os.read(stdin_fd, 4096)
        except OSError:
            return True
        if not data:
            return True
    return False


def remote_follow(spec):
    """Follow the spec's globs and resumed files, one JSON record per line of stdout, until the
    console goes away (its channel's EOF on stdin, or the sshd session exiting)."""
    stdin_fd, parent = _watch_stdin(), os.getppid()
    tails = {}
    for path, state in spec.get("files", {}).items():
        offset, number, inode, fingerprint = state
        tails[path] = FileTail(path, offset, number, inode, bytes.fromhex(fingerprint or ""))
    initial = bool(spec.get("initial"))
    poll, rescan = float(spec.get("poll", 0.25)), float(spec.get("rescan", 5.0))
    next_scan = 0.0
    reported = {}
    while True:
        now = time.time()
        if now >= next_scan:
            next_scan = now + rescan
            for pattern in spec.get("globs", []):
                matches = [p for p in sorted(glob.glob(pattern)) if os.path.isfile(p)]
                for path in within_cap(matches, tails):
                    tails[path] = start_tail(path, initial)
                    _emit({"new": path})
                problem = cap_problem(matches, tails) if matches else "no file matches"
                if reported.get(pattern, "") != problem:
                    reported[pattern] = problem
                    _emit({"g": pattern, "why": problem})
            initial = False
        busy = False
        for path, tail in list(tails.items()):
            lines = tail.poll()
            if tail.events:
                for kind, offset in tail.events:
                    _emit({"e": path, "kind": kind})
                tail.events = []
                tail.backlog_end = None  # rotated or truncated: its offsets are another file's
            if reported.get(path, "") != tail.error:
                reported[path] = tail.error
                _emit({"x": path, "why": tail.error})
            if lines:
                busy = True
                _emit(_lines_record(path, tail, lines))
        sys.stdout.flush()
        if _console_gone(stdin_fd, parent, 0 if busy else poll):
            return


def remote_older(spec):
    """Print the lines before an offset of one file as one JSON record (for scroll-back)."""
    path, before, count = spec["path"], int(spec["before"]), int(spec["count"])
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if before < 0 or before > size:
            before = size
        lines = read_lines_before(fd, before, count)
        first = 0
        if lines and size <= COUNT_LINES_LIMIT:
            first = count_lines_before(fd, lines[0][0]) + 1
    finally:
        os.close(fd)
    records = [[o, first + i if first else 0, raw.decode("utf-8", "replace"), t] for i, (o, raw, t) in enumerate(lines)]
    _emit({"p": path, "l": records})
    sys.stdout.flush()


def remote_main(argv):
    spec = json.loads(argv[1])
    try:
        if spec.get("mode") == "older":
            remote_older(spec)
        else:
            remote_follow(spec)
    except (BrokenPipeError, KeyboardInterrupt):
        pass
    except OSError as exc:
        _emit({"fatal": describe_os_error(exc)})
