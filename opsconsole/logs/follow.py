"""Following local log files: one thread for all of them, woken by inotify or by polling."""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import select
import struct
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from opsconsole.probe.filetail import COUNT_LINES_LIMIT, FileTail, cap_problem, start_tail, within_cap

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
WATCH_MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
SAFETY_POLL_S = 1.0  # with inotify, files are still looked at this often (missed events, NFS)
# After a wake-up, wait this long so that one pass reads many lines: a busy file (thousands of
# lines a second) then costs one read per file per pass instead of one per write. Adds at most
# this much to the latency (the target is 250 ms at p99).
COALESCE_S = 0.01
PASS_BUDGET = 2 << 20  # bytes read in one pass over all files: a batch (and its LogLines) stays bounded
MIN_FILE_BUDGET = 128 << 10  # ... but each file may read at least this much per pass

Batch = List[Tuple[str, List[Tuple[int, int, bytes, bool]]]]  # (path, lines) per file


class Inotify:
    """The kernel's inotify through ctypes (Linux); `available()` says whether it can be used."""

    def __init__(self) -> None:
        self._libc = load_libc()
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.watched: Dict[str, int] = {}

    def watch(self, directory: str) -> None:
        if directory in self.watched:
            return
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(directory), WATCH_MASK)
        if wd >= 0:
            self.watched[directory] = wd

    def wait(self, timeout: float) -> Tuple[bool, bool]:
        """(any event, a file was created or moved in) within `timeout`; the events are drained."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False, False
        created = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            position = 0
            while position + 16 <= len(data):
                _, mask, _, size = struct.unpack_from("iIII", data, position)
                created = created or bool(mask & (IN_CREATE | IN_MOVED_TO))
                position += 16 + size
        return True, created

    def close(self) -> None:
        os.close(self.fd)


_libc: Optional[ctypes.CDLL] = None


def load_libc() -> ctypes.CDLL:
    """The C library, loaded once (find_library runs `ldconfig -p`: milliseconds, so only as a fallback)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6", use_errno=True)
        except OSError:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


class LocalFollower:
    """Follows the local files matching `globs` in a thread; batches go to `deliver` (from that thread)."""

    def __init__(
        self,
        globs: Sequence[str],
        deliver: Callable[[Batch], None],
        *,
        poll_interval: float = 0.25,
        rescan_interval: float = 5.0,
        use_inotify: Optional[bool] = None,
        on_new: Optional[Callable[[str, FileTail], None]] = None,
    ) -> None:
        self.globs = list(globs)
        self.deliver = deliver
        self.poll_interval = poll_interval
        self.rescan_interval = rescan_interval
        self.on_new = on_new
        self.tails: Dict[str, FileTail] = {}
        self.problems: Dict[str, str] = {}
        self.lock = threading.Lock()  # held while a poll pass reads the tails
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.inotify: Optional[Inotify] = None
        if use_inotify is not False:
            try:
                self.inotify = Inotify()
            except (OSError, AttributeError):
                if use_inotify:
                    raise
        self.mode = "inotify" if self.inotify else "polling"

    def start(self) -> None:
        """Find the files and deliver their last pages (from the caller's thread), then follow in a thread."""
        self.rescan(initial=True)
        self.poll_all()
        self._thread = threading.Thread(target=self._run, name="log-follow", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        with self.lock:
            for tail in self.tails.values():
                tail.close()
        if self.inotify is not None:
            self.inotify.close()

    def rescan(self, initial: bool = False) -> None:
        """Glob again: new files are followed (from their start, or their last page at start-up)."""
        for pattern in self.globs:
            base = pattern
            while glob.has_magic(base):
                base = os.path.dirname(base)
            if self.inotify is not None and os.path.isdir(base):
                self.inotify.watch(base)
            try:
                matches = [os.path.abspath(p) for p in sorted(glob.glob(pattern)) if os.path.isfile(p)]
            except OSError as exc:
                self.problems[pattern] = str(exc)
                continue
            # At most MAX_FOLLOWED_FILES open at once, the most recently written first: one descriptor
            # each, and thousands of rank logs ran the console out of descriptors (EMFILE) and killed it.
            new = within_cap(matches, self.tails)
            problem = cap_problem(matches, set(self.tails).union(new))
            if not matches:
                self.problems[pattern] = (
                    "no file matches"
                    if os.access(base, os.R_OK | os.X_OK) or not os.path.exists(base)
                    else "permission denied"
                )
            elif problem is not None:
                self.problems[pattern] = problem
            else:
                self.problems.pop(pattern, None)
            for path in new:
                tail = start_tail(path, initial, COUNT_LINES_LIMIT // 8)  # big files: numbered by the index later
                with self.lock:
                    self.tails[path] = tail
                if self.inotify is not None:
                    self.inotify.watch(os.path.dirname(path))
                if self.on_new is not None:
                    self.on_new(path, tail)

    def poll_all(self) -> int:
        """One pass over every file; returns the number of lines delivered."""
        return self._poll_pass()[0]

    def _poll_pass(self) -> Tuple[int, bool]:
        """(lines delivered, some file has more to read than this pass's budget let it)."""
        batch: Batch = []
        more = False
        with self.lock:
            budget = max(MIN_FILE_BUDGET, PASS_BUDGET // max(1, len(self.tails)))
            for path, tail in self.tails.items():
                before = tail.read_pos
                lines = tail.poll(budget)
                if tail.read_pos - before >= budget:
                    more = True
                if tail.error:
                    self.problems[path] = tail.error
                else:
                    self.problems.pop(path, None)
                if lines:
                    batch.append((path, lines))
        if batch:
            self.deliver(batch)
        return sum(len(lines) for _, lines in batch), more

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as exc:  # shown as a problem; the console goes on without local logs
            self.problems["local"] = "log follower stopped: %s" % exc

    def _follow(self) -> None:
        next_scan = time.monotonic() + self.rescan_interval
        while not self._stop.is_set():
            _, more = self._poll_pass()
            if time.monotonic() >= next_scan:
                self.rescan()
                next_scan = time.monotonic() + self.rescan_interval
            if more:
                continue  # a file is further behind than one pass reads: go on at once
            if self.inotify is not None:
                woken, created = self.inotify.wait(SAFETY_POLL_S)
                if created:
                    self.rescan()  # a created or renamed file may be a new match
                if woken:
                    self._stop.wait(COALESCE_S)
            else:
                self._stop.wait(self.poll_interval)
