"""Checkpoint metadata read in a separate, limited, reused worker process.

The readers (formats.py, zipmeta.py, safe_unpickle.py) bound the work they foresee; this
process bounds what they do not. A few hundred bytes of pickle can overflow the C stack
(a 2M-deep tuple hashed as a dict key: SIGSEGV), spend minutes in C (ints that all hash
alike, as dict keys: quadratic) or allocate gigabytes (bytearray of one memo-shared
200 MB bytes, again and again). In here each ends as one file's "unreadable: <reason>"
and the console, the command and the neighbouring files go on.

The worker is a small dedicated interpreter (this module run as __main__), started with
subprocess (an exec, so nothing of the console's threads, asyncio loop or Textual is forked),
reused for every read and restarted after it dies. It runs `python -E -s`: no PYTHON*
variable of the environment (PYTHONINSPECT, PYTHONSTARTUP, PYTHONMALLOC, PYTHONWARNINGS ...)
and no user site changes how the interpreter that parses hostile files behaves; its import
path is instead the parent's own sys.path, given on its command line (worker_command), so an
install that the console finds through PYTHONPATH (`pip install --target`) or the user site
finds its dependencies (orjson) in the worker too. It sets its own
limits: RLIMIT_AS (memory), RLIMIT_CORE 0, and an RLIMIT_CPU soft limit moved to "CPU used
so far + budget" before each request, so a request that spins in C dies by SIGXCPU. The
parent adds a wall-clock timeout per answer and caps the size of every reply; a new worker
says it is ready (imports done, limits set) before its first request, so its start is
bounded apart (start_timeout_s) and never counts against a file. Messages
are length-prefixed frames: JSON of plain types (never pickle) and raw bytes.

Both local and remote reads go through it. The reader is a generator of read requests:
for a local file the worker opens the file itself (lstat'd regular file, O_NOFOLLOW,
O_NONBLOCK, checked again with fstat) and answers them with pread; for a remote file the
worker sends each request back to the parent, which fetches the bytes over SFTP
(fs.run_reader) and sends them in. Either way the parse of the bytes runs in the worker.
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import json
import os
import select
import signal
import stat as stat_module
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Dict, Generator, List, Optional, Tuple

MiB = 1024 * 1024
FRAME = struct.Struct(">cI")  # kind (b"J" JSON, b"B" bytes), length
MAX_REQUEST_BYTES = 512 * MiB  # what the worker accepts in one frame (a fetched data.pkl is at most 256 MiB)
MAX_FETCH = 512 * MiB  # what the parent fetches for the worker in one request
EXIT_MEMORY = 3  # the worker's exit status after a MemoryError (its state is not trusted after one)
EXIT_STATE = 4  # a read left the shared stand-ins changed: start afresh
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class WorkerLimits:
    """What one worker may use. A normal read of a 2 GB checkpoint's metadata peaks near 30 MiB."""

    memory_bytes: int = 1024 * MiB  # RLIMIT_AS of the worker
    cpu_seconds: int = 10  # RLIMIT_CPU budget per request (whole seconds: the kernel's resolution)
    timeout_s: float = 10.0  # wall clock the parent waits for any one answer
    # ... and for a new worker to say it is ready (interpreter, imports, limits): not a file's
    # time, so not in its timeout (on a loaded machine a start alone took past a 1 s timeout).
    start_timeout_s: float = 60.0
    max_reply_bytes: int = 4 * MiB  # one reply (a ReadResult as JSON is a few KiB)
    # First try each file without safe_unpickle's opcode walk (most of a read's time), these
    # limits bounding it with a short CPU budget; a file whose try kills the worker is read
    # again, walk on, with the full budget: its outcome is then the careful read's.
    optimistic: bool = True
    first_try_cpu_seconds: int = 2


class WorkerFailure(Exception):
    """The worker could not give a result for this file: `reason` is one line ("worker killed by SIGSEGV").

    `died`: the worker is gone (killed, timed out, over its memory): a careful second try may do better.
    """

    def __init__(self, reason: str, died: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.died = died


# --- frames and plain values, both sides ------------------------------------------------------


def write_frame(out: BinaryIO, kind: bytes, payload: bytes) -> None:
    """One frame onto an unbuffered pipe; a raw write may take only part of it, so loop."""
    for part in (FRAME.pack(kind, len(payload)), payload):
        view = memoryview(part)
        while view:
            written = out.write(view)
            view = view[written or 0 :]


def _read_exact(read: Callable[[int], bytes], count: int) -> Optional[bytes]:
    """`count` bytes, or None at end of file before the first byte (a short read after it is EOFError)."""
    parts: List[bytes] = []
    got = 0
    while got < count:
        chunk = read(min(count - got, 1 << 20))
        if not chunk:
            if got == 0:
                return None
            raise EOFError("frame cut short")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _result_types() -> Dict[str, type]:
    """The records a reply may hold: ReadResult, CrcResult and every dataclass of records.py (new ones included)."""
    from opsconsole.checkpoints import fr_dump, records
    from opsconsole.checkpoints.formats import ReadResult
    from opsconsole.checkpoints.zipmeta import CrcResult

    types = {
        name: value
        for name, value in vars(records).items()
        if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == records.__name__
    }
    types.update(ReadResult=ReadResult, CrcResult=CrcResult)
    types.update(fr_dump.RECORD_TYPES)  # a flight-recorder dump, read by the "fr_dump" reader
    return types


def to_plain(value: Any) -> Any:
    """A result as JSON-ready plain types: dataclasses as {"$": name, field: ...}, tuples as lists."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        plain = {"$": type(value).__name__}
        for item in dataclasses.fields(value):
            plain[item.name] = to_plain(getattr(value, item.name))
        return plain
    if isinstance(value, (tuple, list)):
        return [to_plain(item) for item in value]
    raise TypeError("%s is not a plain result value" % type(value).__name__)


def from_plain(value: Any, types: Dict[str, type]) -> Any:
    """to_plain's inverse: lists back to tuples, {"$": name} back to the frozen dataclass (known names only)."""
    if isinstance(value, list):
        return tuple(from_plain(item, types) for item in value)
    if isinstance(value, dict):
        cls = types.get(value.get("$"))  # type: ignore[arg-type]
        if cls is None:
            raise ValueError("unknown record %r" % str(value.get("$"))[:40])
        known = {item.name for item in dataclasses.fields(cls) if item.init}
        return cls(**{key: from_plain(item, types) for key, item in value.items() if key in known})
    return value


# --- the worker process ------------------------------------------------------------------------


def _readers() -> Dict[str, Callable[..., Generator]]:
    """The readers a request may name, each as make(size, **args)."""
    from opsconsole.checkpoints import formats, fr_dump

    return {
        "file": lambda size, name, window=formats.HEAD_BYTES: formats.file_reader(str(name), size, int(window)),
        "safetensors": lambda size: formats.safetensors_reader(size),
        "zip_check": lambda size: formats.zip_check_reader(size),
        # A DCP directory's .metadata is a pickle: parsed here, like data.pkl, never in the console.
        "dcp_metadata": lambda size, files: formats.dcp_metadata_reader(
            size, {str(name): int(length) for name, length in dict(files).items()}
        ),
        # PyTorch's flight-recorder dumps are pickles from the training processes: same limits, same unpickler.
        "fr_dump": lambda size: fr_dump.fr_dump_reader(size),
    }


def _stand_ins_fingerprint() -> Tuple[Tuple[Any, ...], ...]:
    """What the shared stand-ins are now: a read that changed them must not colour the next one."""
    from opsconsole.checkpoints import safe_unpickle

    return tuple(
        sorted(
            (
                key,
                type(value).__name__,
                getattr(value, "name", None) if type(value) is safe_unpickle.DtypeStub else id(value),
            )
            for key, value in safe_unpickle.SAFE_GLOBALS.items()
        )
    )


class _Served:
    """The worker's side of one connection: frames in, frames out."""

    def __init__(self, fd_in: int, fd_out: int) -> None:
        self.fd_in = fd_in
        self.out = os.fdopen(fd_out, "wb", buffering=0)

    def receive(self) -> Optional[Tuple[bytes, bytes]]:
        header = _read_exact(lambda n: os.read(self.fd_in, n), FRAME.size)
        if header is None:
            return None
        kind, length = FRAME.unpack(header)
        if length > MAX_REQUEST_BYTES:
            raise EOFError("request of %d bytes" % length)
        body = _read_exact(lambda n: os.read(self.fd_in, n), length) if length else b""
        if body is None:
            raise EOFError("frame cut short")
        return kind, body

    def send(self, message: Dict[str, Any]) -> None:
        write_frame(self.out, b"J", json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii"))


def _open_regular(path: str) -> int:
    """An fd of `path` when it is a regular file; never blocks on a FIFO or device swapped in after the lstat."""
    mode = os.lstat(path).st_mode
    if not stat_module.S_ISREG(mode):
        raise WorkerFailure(_not_regular_text(mode))
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags)
    mode = os.fstat(fd).st_mode
    if not stat_module.S_ISREG(mode):
        os.close(fd)
        raise WorkerFailure(_not_regular_text(mode))
    return fd


def _not_regular_text(mode: int) -> str:
    for test, kind in (
        (stat_module.S_ISFIFO, "a FIFO"),
        (stat_module.S_ISSOCK, "a socket"),
        (stat_module.S_ISCHR, "a character device"),
        (stat_module.S_ISBLK, "a block device"),
        (stat_module.S_ISDIR, "a directory"),
        (stat_module.S_ISLNK, "a symlink"),
    ):
        if test(mode):
            return "%s, not a regular file: never opened" % kind
    return "not a regular file: never opened"


def _run_request(
    served: _Served, request: Dict[str, Any], readers: Dict[str, Callable[..., Generator]]
) -> Dict[str, Any]:
    make = readers.get(request.get("reader"))  # type: ignore[arg-type]
    if make is None:
        return {"failure": "no reader %r" % str(request.get("reader"))[:40]}
    args = request.get("args") or {}
    path = request.get("path")
    try:
        if path is not None:  # local: open and pread here
            from opsconsole.checkpoints.zipmeta import drive_local

            fd = _open_regular(str(path))
            try:
                result = drive_local(make(os.fstat(fd).st_size, **args), fd)
            finally:
                os.close(fd)
        else:  # remote: every read request goes back to the parent
            result = _drive_remote(served, make(int(request["size"]), **args))
    except WorkerFailure as failure:
        return {"failure": failure.reason}
    except OSError as exc:
        return {"oserror": [exc.errno or 0, exc.strerror or str(exc)]}
    except (MemoryError, EOFError):
        raise
    except Exception as exc:  # a reader's bug, not the file's: one line, and the worker goes on
        return {
            "failure": "reader failed: %s: %s"
            % (type(exc).__name__, str(exc)[:200].splitlines()[0] if str(exc) else "")
        }
    return {"result": to_plain(result)}


def _drive_remote(served: _Served, reader: Generator) -> Any:
    try:
        request = next(reader)
        while True:
            offset, length = request
            served.send({"fetch": [int(offset), int(length)]})
            answer = served.receive()
            if answer is None or answer[0] != b"B":
                raise EOFError("the parent sent no bytes")
            request = reader.send(answer[1])
    except StopIteration as stop:
        return stop.value


def _memory_figures() -> Dict[str, int]:
    """Peak resident and virtual size of this process (KiB): /proc's VmHWM and VmPeak.

    Not getrusage's ru_maxrss: Linux carries it across exec, so a child of a big parent
    would report the parent's peak.
    """
    figures: Dict[str, int] = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmPeak", "VmRSS", "VmSize"):
                    figures[key] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return figures


def _set_limits(limits: WorkerLimits) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash of hostile input leaves no core file behind
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))


def _arm_cpu_budget(seconds: int) -> None:
    """Let this request use `seconds` more CPU: past it the kernel sends SIGXCPU, which kills us."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    soft = used + seconds
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def serve(limits: WorkerLimits) -> int:
    """The worker's loop: one request at a time until the parent closes our stdin."""
    # The protocol gets its own fds; fd 1 goes to stderr so no stray print can corrupt a frame.
    fd_in, fd_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    from opsconsole.checkpoints import safe_unpickle

    served = _Served(fd_in, fd_out)
    readers = _readers()
    fingerprint = _stand_ins_fingerprint()
    _set_limits(limits)
    served.send({"ready": True})  # the parent's timeout for each request starts from here
    while True:
        try:
            message = served.receive()
        except EOFError:
            return 1
        if message is None:
            return 0
        kind, body = message
        request = json.loads(body) if kind == b"J" else {}
        if request.get("op") == "stats":
            import resource

            usage = resource.getrusage(resource.RUSAGE_SELF)
            served.send({"stats": dict(_memory_figures(), pid=os.getpid(), cpu_s=usage.ru_utime + usage.ru_stime)})
            continue
        careful = request.get("careful", True) is not False
        safe_unpickle.WALK_FIRST = careful
        _arm_cpu_budget(limits.cpu_seconds if careful else min(limits.cpu_seconds, limits.first_try_cpu_seconds))
        try:
            reply = _run_request(served, request, readers)
            text = json.dumps(reply, ensure_ascii=True, separators=(",", ":"))
        except MemoryError:
            reply, text = None, ""
        except EOFError:
            return 1
        if reply is None:
            # Whatever was half-built is garbage now; say so in a few bytes and leave
            # ("exit" tells the parent to wait for us rather than send the next request).
            served.send(
                {"failure": "over the worker's memory limit (%d MiB)" % (limits.memory_bytes // MiB), "exit": True}
            )
            return EXIT_MEMORY
        if len(text) > limits.max_reply_bytes:
            text = json.dumps(
                {
                    "failure": "metadata of %d bytes is over the %d-byte reply limit"
                    % (len(text), limits.max_reply_bytes)
                }
            )
        changed = _stand_ins_fingerprint() != fingerprint
        if changed:  # this file's reply stands; the next file gets a worker whose stand-ins are as built
            text = text[:-1] + ',"exit":true}'
        write_frame(served.out, b"J", text.encode("ascii"))
        if changed:
            return EXIT_STATE


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m opsconsole.checkpoints.worker", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--memory-bytes", type=int, default=WorkerLimits.memory_bytes)
    parser.add_argument("--cpu-seconds", type=int, default=WorkerLimits.cpu_seconds)
    parser.add_argument("--max-reply-bytes", type=int, default=WorkerLimits.max_reply_bytes)
    parser.add_argument("--first-try-cpu-seconds", type=int, default=WorkerLimits.first_try_cpu_seconds)
    args = parser.parse_args(argv)
    return serve(
        WorkerLimits(
            memory_bytes=args.memory_bytes,
            cpu_seconds=args.cpu_seconds,
            max_reply_bytes=args.max_reply_bytes,
            first_try_cpu_seconds=args.first_try_cpu_seconds,
        )
    )


# --- the parent's side -------------------------------------------------------------------------


def _death_text(returncode: Optional[int], limits: WorkerLimits) -> str:
    if returncode is None:
        return "worker stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "signal %d" % -returncode
        if -returncode == getattr(signal, "SIGXCPU", -1):
            return "worker killed by SIGXCPU: over its CPU limit of %d s" % limits.cpu_seconds
        return "worker killed by %s" % name
    if returncode == EXIT_MEMORY:
        return "over the worker's memory limit (%d MiB)" % (limits.memory_bytes // MiB)
    return "worker exited with status %d" % returncode


# Run by `python -E -s -c`: the parent's import path (argv[1], JSON) in the parent's order, the
# interpreter's own entries after it, then this module as __main__ with the rest of argv.
_BOOTSTRAP = (
    "import json, runpy, sys\n"
    "parent = [p for p in json.loads(sys.argv.pop(1)) if isinstance(p, str)]\n"
    "sys.path[:] = sys.path[:1] + parent + [p for p in sys.path[1:] if p not in parent]\n"
    "runpy.run_module('opsconsole.checkpoints.worker', run_name='__main__', alter_sys=True)\n"
)


def parent_import_path() -> List[str]:
    """This process's sys.path as absolute directories, in order (what the worker imports from too)."""
    seen: List[str] = []
    for entry in sys.path:
        if not isinstance(entry, str):
            continue
        path = os.path.abspath(entry or os.curdir)
        if path not in seen:
            seen.append(path)
    return seen


def worker_command(limits: WorkerLimits) -> List[str]:
    """The worker's argv: -E -s against the environment, the parent's import path given explicitly."""
    return [
        sys.executable,
        "-E",
        "-s",
        "-c",
        _BOOTSTRAP,
        json.dumps(parent_import_path()),
        "--memory-bytes",
        str(limits.memory_bytes),
        "--cpu-seconds",
        str(limits.cpu_seconds),
        "--max-reply-bytes",
        str(limits.max_reply_bytes),
        "--first-try-cpu-seconds",
        str(limits.first_try_cpu_seconds),
    ]


class WorkerProcess:
    """One worker process, used by one thread at a time; started on first use and after it dies."""

    def __init__(self, limits: WorkerLimits = WorkerLimits()) -> None:
        self.limits = limits
        self._process: Optional[subprocess.Popen] = None
        self.starts = 0  # how many processes this slot has started (tests and benchmarks read it)

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process is not None else None

    def _start(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self.discard()
        command = worker_command(self.limits)
        try:
            # An exec, not a fork of this (threaded) process; its own session: a terminal's
            # Ctrl-C goes to the console, which closes the worker itself.
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=PACKAGE_ROOT,
                close_fds=True,
                start_new_session=True,
                bufsize=0,
            )
        except OSError as exc:
            raise WorkerFailure("metadata worker could not start: %s" % (exc.strerror or exc)) from None
        self.starts += 1
        ready = self._receive(self.limits.start_timeout_s, "metadata worker not ready after %g s")
        if ready != {"ready": True}:
            raise self._fail("metadata worker sent %s before it was ready" % str(ready)[:60])
        return self._process

    def discard(self) -> None:
        """Kill the process (if any) and forget it; the next request starts a new one."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            try:
                pipe.close()  # type: ignore[union-attr]
            except OSError:
                pass

    def close(self) -> None:
        """Let the process end on its own (EOF on its stdin), killing it if it does not."""
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.stdin.close()  # type: ignore[union-attr]
            process.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        try:
            process.stdout.close()  # type: ignore[union-attr]
        except OSError:
            pass

    def _fail(self, reason: Optional[str] = None) -> WorkerFailure:
        """The worker is gone or useless: why (its signal, its status, or `reason`), after killing it."""
        process = self._process
        returncode = None
        if process is not None:
            try:
                returncode = process.wait(timeout=1)  # it usually died already: its status says how
            except subprocess.TimeoutExpired:
                pass
        self.discard()
        return WorkerFailure(reason or _death_text(returncode, self.limits), died=True)

    def _send(self, kind: bytes, payload: bytes) -> None:
        try:
            write_frame(self._process.stdin, kind, payload)  # type: ignore[union-attr, arg-type]
        except (BrokenPipeError, ConnectionResetError, ValueError):
            raise self._fail() from None

    def _receive(self, timeout_s: Optional[float] = None, timed_out: str = "timed out after %g s") -> Dict[str, Any]:
        """The next reply, within `timeout_s` (the limits' timeout_s by default)."""
        process = self._process
        assert process is not None and process.stdout is not None
        fd = process.stdout.fileno()
        wait_s = self.limits.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s

        def read(count: int) -> bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise self._fail(timed_out % wait_s)
            try:
                return os.read(fd, count)
            except OSError:
                return b""

        try:
            header = _read_exact(read, FRAME.size)
            if header is None:
                raise self._fail()
            kind, length = FRAME.unpack(header)
            if kind != b"J" or length > self.limits.max_reply_bytes:
                raise self._fail("reply of %d bytes is over the %d-byte limit" % (length, self.limits.max_reply_bytes))
            body = _read_exact(read, length)
        except EOFError:
            raise self._fail() from None
        if body is None:
            raise self._fail()
        try:
            reply = json.loads(body)
        except (ValueError, RecursionError):
            raise self._fail("worker sent a reply that is not JSON") from None
        if not isinstance(reply, dict):
            raise self._fail("worker sent a reply that is not an object")
        return reply

    def exchange(self, request: Dict[str, Any]) -> Generator[Tuple[int, int], bytes, Dict[str, Any]]:
        """Send `request`; yield each (offset, length) the worker asks for and pass the bytes in; its final reply.

        Left unfinished (the caller's read failed), the worker is mid-request: it is discarded.
        """
        self._start()
        finished = False
        try:
            self._send(b"J", json.dumps(request, ensure_ascii=True).encode("ascii"))
            while True:
                reply = self._receive()
                fetch = reply.get("fetch")
                if fetch is None:
                    finished = True
                    if reply.get("exit"):
                        self.discard()  # it is leaving after this reply: the next request starts a new one
                    return reply
                if (
                    not isinstance(fetch, list)
                    or len(fetch) != 2
                    or not all(type(n) is int and n >= 0 for n in fetch)
                    or fetch[1] > MAX_FETCH
                ):
                    raise self._fail("worker asked for a read of %s" % str(fetch)[:60])
                data = yield (fetch[0], fetch[1])
                self._send(b"B", bytes(data))
        finally:
            if not finished:
                self.discard()

    def stats(self) -> Dict[str, Any]:
        """The worker's pid, peak memory (KiB) and CPU so far (for benchmarks)."""
        self._start()
        self._send(b"J", b'{"op":"stats"}')
        return self._receive().get("stats") or {}


class MetadataWorkers:
    """A few reused worker processes, one per reading thread at a time (remote scans read 8 files at once)."""

    def __init__(self, size: int = 4, limits: WorkerLimits = WorkerLimits()) -> None:
        self.size = max(1, size)
        self.limits = limits
        self._idle: List[WorkerProcess] = []
        self._all: List[WorkerProcess] = []
        self._available = threading.Condition()
        self._closed = False

    def _take(self) -> WorkerProcess:
        with self._available:
            while not self._idle and len(self._all) >= self.size:
                self._available.wait()
            if self._idle:
                return self._idle.pop()
            worker = WorkerProcess(self.limits)
            self._all.append(worker)
            return worker

    def _give(self, worker: WorkerProcess) -> None:
        with self._available:
            self._idle.append(worker)
            self._available.notify()

    @property
    def starts(self) -> int:
        """Processes started so far, restarts included."""
        return sum(worker.starts for worker in self._all)

    def read(self, fs: Any, path: str, reader: str, **args: Any) -> Any:
        """Run the named reader over `path` of `fs` in a worker: its result.

        Raises OSError when the file cannot be opened or read (as fs.run_reader does) and
        WorkerFailure when it is no regular file or the worker died, timed out or said no.
        Never opens what lstat does not call a regular file.
        """
        st = fs.lstat(path)
        if not st.is_file:
            mode = stat_module.S_IFDIR if st.is_dir else stat_module.S_IFLNK if st.is_link else 0
            if not getattr(fs, "remote", False):
                mode = os.lstat(path).st_mode
            raise WorkerFailure(_not_regular_text(mode))
        tries = (False, True) if self.limits.optimistic else (True,)
        for careful in tries:
            worker = self._take()
            try:
                request = {"reader": reader, "args": args, "careful": careful}
                if getattr(fs, "remote", False):
                    reply = fs.run_reader(path, lambda size: worker.exchange(dict(request, size=size)))
                else:
                    reply = _drive_without_fetch(worker.exchange(dict(request, path=os.path.abspath(path))))
                return _unpack(reply)
            except WorkerFailure as failure:
                if not failure.died or careful:
                    raise
            finally:
                self._give(worker)
        raise AssertionError("unreachable: the careful try returns or raises")

    def run(self, request: Dict[str, Any]) -> Any:
        """One raw request (`reader`, `args`, and `path` or nothing): for tests of the worker's own guards."""
        worker = self._take()
        try:
            return _unpack(_drive_without_fetch(worker.exchange(request)))
        finally:
            self._give(worker)

    def stats(self) -> Dict[str, Any]:
        worker = self._take()
        try:
            return worker.stats()
        finally:
            self._give(worker)

    def close(self) -> None:
        with self._available:
            workers, self._all, self._idle = self._all, [], []
        for worker in workers:
            worker.close()


def _drive_without_fetch(exchange: Generator[Tuple[int, int], bytes, Dict[str, Any]]) -> Dict[str, Any]:
    try:
        next(exchange)
    except StopIteration as stop:
        return stop.value
    exchange.close()  # a local read that asks us for bytes is not one we started
    raise WorkerFailure("worker asked for bytes of a local file")


def _unpack(reply: Dict[str, Any]) -> Any:
    if "failure" in reply:
        raise WorkerFailure(str(reply["failure"])[:300], died=bool(reply.get("exit")))
    if "oserror" in reply:
        number, text = (list(reply["oserror"]) + [0, ""])[:2]
        raise OSError(int(number) if type(number) is int else errno.EIO, str(text)[:300])
    try:
        return from_plain(reply.get("result"), _result_types())
    except (TypeError, ValueError) as exc:
        raise WorkerFailure("worker sent a malformed result: %s" % str(exc)[:100]) from None


# The console and each command share these: started on the first read, closed at exit.
METADATA_WORKERS = MetadataWorkers()
atexit.register(METADATA_WORKERS.close)


def read_checkpoint_file(fs: Any, path: str, name: str, window: int, workers: Optional[MetadataWorkers] = None) -> Any:
    """formats.file_reader's result for one checkpoint file, read in a worker; a failure is the file's problem.

    OSError (cannot open or read) is raised as fs.run_reader raises it; anything that stops
    the worker becomes "unreadable: <reason>" for this file alone, with what its name says.
    """
    from opsconsole.checkpoints import formats
    from opsconsole.checkpoints.records import INTEGRITY_UNCHECKED

    try:
        return (workers or METADATA_WORKERS).read(fs, path, "file", name=name, window=window)
    except WorkerFailure as failure:
        result = formats.ReadResult(
            formats._named_format(name),
            formats.meta_from_name(name),
            INTEGRITY_UNCHECKED,
            "unreadable: %s" % failure.reason,
        )
        if "unreadable" in {item.name for item in dataclasses.fields(result)}:
            # Not known damage: retention keeps what it could not read and never ranks it.
            result = dataclasses.replace(result, unreadable="could not read: %s" % failure.reason)
        return result


def read_dcp_metadata(fs: Any, path: str, files: Dict[str, int], workers: Optional[MetadataWorkers] = None) -> Any:
    """formats.dcp_result for a DCP directory whose `.metadata` is at `path`, parsed in a worker.

    `files` maps the directory's files (relative paths) to their sizes. A worker that dies, times
    out or says no makes the directory "could not read .metadata: <reason>": kept, never damage.
    """
    from opsconsole.checkpoints import formats
    from opsconsole.checkpoints.records import FORMAT_DCP, INTEGRITY_UNCHECKED, CheckpointMeta

    try:
        return (workers or METADATA_WORKERS).read(fs, path, "dcp_metadata", files=files)
    except WorkerFailure as failure:
        why = "could not read .metadata: %s" % failure.reason
        return formats.ReadResult(FORMAT_DCP, CheckpointMeta(), INTEGRITY_UNCHECKED, why, unreadable=why)


if __name__ == "__main__":
    sys.exit(main())
