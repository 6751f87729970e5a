"""Checkpoint directories on a node, over the node's own SSH connection through SFTP.

`SftpFileSystem` is the FileSystem of scan.py and cleanup.py for a remote node. Its calls
come from a worker thread; each one is handed to the event loop that owns the SshLink
(`run_coroutine_threadsafe`), so parsing stays off that loop and the loop only moves
bytes. Only the ranges the readers ask for cross the network: a checkpoint's first 64 KiB
and its zip directory, never the whole file (except for an explicit CRC check).

One SFTP channel per node, opened on first use under the link's channel limit
(`channel_slot`) and reopened after the connection drops.

SFTP lists and reads; it never deletes. Pinning a plan, finding files in use and deleting run
probe/delete_units.py on the node (its source as `python3 -I -u -c SOURCE`, like the log
follower), which opens the directory with O_NOFOLLOW, checks its identity and each unit's, and
deletes relative to that descriptor: the same code that deletes locally. A deletion session is
one exec channel answering one JSON line per request, so the console writes each unit's audit
record before it asks for that unit's deletion.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import inspect
import json
import shlex
import stat as stat_module
import threading
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple

from opsconsole.checkpoints.access import DirItem, FileStat, FileSystem, not_regular
from opsconsole.checkpoints.open_files import OpenFiles, open_files_from
from opsconsole.probe.delete_units import MAX_TREE_ENTRIES

CALL_TIMEOUT_S = 60.0
HELPER_NOISE_LINES = 5  # non-JSON lines of the helper (a warning, `python3: not found`) kept for the error


def _file_stat(attrs: Any) -> FileStat:
    mode = attrs.permissions or 0
    mtime = attrs.mtime_ns / 1e9 if getattr(attrs, "mtime_ns", None) else float(attrs.mtime or 0)
    return FileStat(
        size=int(attrs.size or 0),
        mtime=mtime,
        is_dir=stat_module.S_ISDIR(mode),
        is_link=stat_module.S_ISLNK(mode),
        is_file=stat_module.S_ISREG(mode),
    )


def _os_error(exc: BaseException, path: str = "") -> OSError:
    import asyncssh

    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, asyncssh.SFTPNoSuchFile):
        return FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    if isinstance(exc, asyncssh.SFTPPermissionDenied):
        return PermissionError(errno.EACCES, "Permission denied", path)
    if isinstance(exc, asyncssh.SFTPError):
        return OSError(errno.EIO, exc.reason or "SFTP error", path)
    reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    return OSError(errno.EIO, "SSH: %s" % reason, path)


class SftpFileSystem(FileSystem):
    """A node's files through SFTP on its SshLink; every method blocks its (worker) thread, never the loop."""

    remote = True
    read_window = 16 * 1024  # over a network: smaller first reads, a round trip more when needed

    def __init__(self, link: Any, loop: asyncio.AbstractEventLoop, timeout: float = CALL_TIMEOUT_S) -> None:
        self.link = link
        self.node = link.name
        self.loop = loop
        self.timeout = timeout
        self._sftp: Any = None
        self._conn: Any = None
        self._stack: Optional[contextlib.AsyncExitStack] = None
        self._lock: Optional[asyncio.Lock] = None
        self.bytes_read = 0  # file bytes fetched by readers (benchmarks and tests check it stays small)

    # --- the bridge -------------------------------------------------------------------

    async def _client(self) -> Any:
        import asyncssh

        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            conn = await self.link.connection()
            if self._sftp is not None and self._conn is conn:
                return self._sftp
            await self._close_client()
            stack = contextlib.AsyncExitStack()
            try:
                await stack.enter_async_context(self.link.channel_slot())
                try:
                    sftp = await conn.start_sftp_client(path_errors="surrogateescape")
                except asyncssh.ChannelOpenError as exc:
                    if "request failed" not in (exc.reason or "").lower():
                        raise
                    # sshd refused the subsystem: said as what to fix, not as asyncssh's words.
                    raise OSError(
                        errno.EOPNOTSUPP,
                        "the node's sshd offers no SFTP (no `Subsystem sftp` in its sshd_config), which reading "
                        "checkpoints on a node needs (%s)" % exc.reason,
                    ) from None
                stack.push_async_callback(self._quit, sftp)
            except BaseException:
                await stack.aclose()
                raise
            self._sftp, self._conn, self._stack = sftp, conn, stack
            return sftp

    @staticmethod
    async def _quit(sftp: Any) -> None:
        sftp.exit()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(sftp.wait_closed(), 2.0)

    async def _close_client(self) -> None:
        stack, self._stack, self._sftp, self._conn = self._stack, None, None, None
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()

    async def _run(self, path: str, action: Callable[[Any], Awaitable[Any]]) -> Any:
        import asyncssh

        from opsconsole.nodes.ssh import LinkError

        try:
            sftp = await self._client()
            return await action(sftp)
        except (asyncssh.SFTPError, OSError) as exc:
            raise _os_error(exc, path) from None
        except LinkError as exc:
            raise OSError(errno.EHOSTUNREACH, "%s: %s" % (self.node, exc.reason), path) from None
        except asyncssh.Error as exc:
            await self._close_client()  # the connection went: the next call reopens
            raise _os_error(exc, path) from None

    def call(self, path: str, action: Callable[[Any], Awaitable[Any]]) -> Any:
        """Run `action(sftp)` on the link's loop and wait for it (from a worker thread only)."""
        return self.wait_for(path, lambda: self._run(path, action))

    def wait_for(self, path: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """Run the coroutine `make()` on the link's loop and wait for it (from a worker thread only)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise RuntimeError("SftpFileSystem called on its own event loop: use a worker thread")
        future = asyncio.run_coroutine_threadsafe(make(), self.loop)
        try:
            return future.result(self.timeout)
        except TimeoutError:
            future.cancel()
            raise OSError(errno.ETIMEDOUT, "%s: no answer within %g s" % (self.node, self.timeout), path) from None

    def close(self) -> None:
        """Close the SFTP channel (safe to call from any thread but the loop's)."""
        if self._stack is None:
            return
        asyncio.run_coroutine_threadsafe(self._close_client(), self.loop).result(self.timeout)

    async def aclose(self) -> None:
        """Close the SFTP channel from the loop itself."""
        await self._close_client()

    # --- FileSystem -------------------------------------------------------------------

    def listdir(self, path: str) -> List[DirItem]:
        names = self.call(path, lambda sftp: sftp.readdir(path))
        return [DirItem(n.filename, _file_stat(n.attrs)) for n in names if n.filename not in (".", "..")]

    def stat(self, path: str) -> FileStat:
        return _file_stat(self.call(path, lambda sftp: sftp.stat(path)))

    def lstat(self, path: str) -> FileStat:
        return _file_stat(self.call(path, lambda sftp: sftp.lstat(path)))

    def readlink(self, path: str) -> str:
        return self.call(path, lambda sftp: sftp.readlink(path))

    def realpath(self, path: str) -> str:
        return self.call(path, lambda sftp: sftp.realpath(path))

    def _regular(self, path: str) -> None:
        # An SFTP open of a FIFO blocks the node's SFTP server until a writer comes: lstat first.
        attrs = self.call(path, lambda sftp: sftp.lstat(path))
        if not stat_module.S_ISREG(attrs.permissions or 0):
            raise not_regular(path, attrs.permissions or 0)

    def run_reader(self, path: str, make_reader) -> object:
        self._regular(path)
        handle = self.call(path, lambda sftp: sftp.open(path, "rb"))
        try:
            size = int(self.call(path, lambda sftp: handle.stat()).size or 0)
            reader = make_reader(size)
            try:
                request = next(reader)
                while True:
                    offset, length = request
                    data = self.call(path, lambda sftp, o=offset, n=length: handle.read(n, o)) if length > 0 else b""
                    self.bytes_read += len(data)
                    request = reader.send(data)
            except StopIteration as stop:
                return stop.value
        finally:
            with contextlib.suppress(OSError):
                self.call(path, lambda sftp: handle.close())

    def read_file(self, path: str, limit: int) -> bytes:
        self._regular(path)

        async def read(sftp: Any) -> bytes:
            async with sftp.open(path, "rb") as handle:
                return await handle.read(limit)

        return self.call(path, read)

    def statvfs(self, path: str) -> Tuple[Optional[int], Optional[int]]:
        st = self.call(path, lambda sftp: sftp.statvfs(path))
        return st.bavail * st.frsize, st.blocks * st.frsize

    # --- the node-side helper: pin, in use, delete ----------------------------------------

    def helper_command(self) -> List[str]:
        """argv that runs probe/delete_units.py on the node from its source (nothing installed there)."""
        return helper_argv(getattr(getattr(self.link, "node", None), "python", None) or "python3")

    async def _ask_once(self, request: Dict[str, Any]) -> Dict[str, Any]:
        from opsconsole.nodes.ssh import LinkError

        try:
            status, out, err = await self.link.run_command(
                self.helper_command(), timeout=self.timeout, input=json.dumps(request) + "\n"
            )
        except LinkError as exc:
            raise OSError(errno.EHOSTUNREACH, "%s: %s" % (self.node, exc.reason)) from None
        return first_answer(out + "\n" + err, status)

    def pin_units(self, root: str, units: List[List[str]]) -> Dict[str, Any]:
        return self.wait_for(root, lambda: self._ask_once({"op": "pin", "root": root, "units": units}))

    def files_in_use(self, root: str) -> Dict[str, Any]:
        return self.wait_for(root, lambda: self._ask_once({"op": "in_use", "root": root}))

    def open_pinned(self, root: str, root_id: List[int], units: List[Dict[str, Any]]) -> "RemotePinnedRoot":
        return RemotePinnedRoot(self, root, root_id, units)


def helper_argv(python: str) -> List[str]:
    from opsconsole.probe import delete_units

    # -I: the node's PYTHON* variables and user site-packages cannot change what runs.
    return shlex.split(python) + ["-I", "-u", "-c", inspect.getsource(delete_units)]


def answer_of(line: str) -> Optional[Dict[str, Any]]:
    """The helper's answer on this output line (a JSON object), None for anything else it printed."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        answer = json.loads(line)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def first_answer(text: str, status: Optional[int] = None) -> Dict[str, Any]:
    """The first JSON object line of the helper's output; OSError with what it said otherwise."""
    noise = []
    for line in text.splitlines():
        line = line.strip()
        answer = answer_of(line)
        if answer is not None:
            return answer
        if line and len(noise) < HELPER_NOISE_LINES:
            noise.append(line[:300])
    said = "; ".join(noise) or "no output (exit status %s)" % status
    raise OSError(errno.EIO, "the node's deletion helper did not answer: %s" % said)


class RemotePinnedRoot:
    """delete_units.PinnedRoot on the node, one request and one answer per line over one exec channel.

    Blocking methods for a worker thread, as SftpFileSystem's. OSError when the channel fails:
    after a `delete` was sent, whether the unit went is then unknown (the caller says so).
    """

    def __init__(self, fs: SftpFileSystem, root: str, root_id: List[int], units: List[Dict[str, Any]]) -> None:
        self.fs = fs
        self.root = root
        self.refused: Optional[str] = None
        self.note: Optional[str] = None  # the node's in-use check was incomplete, and why
        self._process: Any = None
        self._stack: Optional[contextlib.AsyncExitStack] = None
        request = {"op": "open", "root": root, "root_id": list(root_id), "units": units}
        try:
            answer = fs.wait_for(root, lambda: self._start(request))
        except BaseException:
            self.close()
            raise
        note = answer.get("note")
        self.note = str(note)[:500] if note else None
        if answer.get("ok") is not True:
            why = answer.get("why") or answer.get("error") or "the node refused the plan"
            self.refused = str(why)[:1000]
            self.close()

    async def _start(self, request: Dict[str, Any]) -> Dict[str, Any]:
        import asyncssh

        from opsconsole.nodes.ssh import LinkError

        stack = contextlib.AsyncExitStack()
        try:
            conn = await self.fs.link.connection()
            await stack.enter_async_context(self.fs.link.channel_slot())
            # stderr merged: an unread stderr would stall stdout, and what it says explains a failure.
            process = await conn.create_process(
                shlex.join(self.fs.helper_command()), stderr=asyncssh.STDOUT, encoding="utf-8", errors="replace"
            )
            stack.callback(process.close)
        except LinkError as exc:
            await stack.aclose()
            raise OSError(errno.EHOSTUNREACH, "%s: %s" % (self.fs.node, exc.reason)) from None
        except (asyncssh.Error, OSError) as exc:
            await stack.aclose()
            raise OSError(
                errno.EIO,
                "%s: cannot start the deletion helper: %s" % (self.fs.node, getattr(exc, "reason", None) or exc),
            ) from None
        self._process, self._stack = process, stack
        return await self._exchange(request)

    async def _exchange(self, request: Dict[str, Any]) -> Dict[str, Any]:
        import asyncssh

        process = self._process
        if process is None:
            raise OSError(errno.EPIPE, "the deletion session on %s is closed" % self.fs.node)
        noise: List[str] = []
        try:
            process.stdin.write(json.dumps(request) + "\n")
            while True:
                line = await asyncio.wait_for(process.stdout.readline(), self.fs.timeout)
                if not line:
                    break
                answer = answer_of(line)
                if answer is not None:
                    return answer
                if line.strip() and len(noise) < HELPER_NOISE_LINES:
                    noise.append(line.strip()[:300])
        except asyncio.TimeoutError:
            raise OSError(errno.ETIMEDOUT, "%s: no answer within %g s" % (self.fs.node, self.fs.timeout)) from None
        except (asyncssh.Error, OSError, BrokenPipeError) as exc:
            raise OSError(
                errno.EIO, "%s: the deletion session failed: %s" % (self.fs.node, getattr(exc, "reason", None) or exc)
            ) from None
        raise OSError(errno.EIO, "%s: the deletion helper ended: %s" % (self.fs.node, "; ".join(noise) or "no output"))

    def _ask(self, request: Dict[str, Any]) -> Dict[str, Any]:
        return self.fs.wait_for(self.root, lambda: self._exchange(request))

    def check(self, index: int) -> Optional[str]:
        answer = self._ask({"op": "check", "unit": index})
        if "error" in answer:
            return "the node's helper: %s" % str(answer["error"])[:500]
        why = answer.get("why")
        return None if why is None else str(why)[:1000]

    def delete(self, index: int) -> Tuple[List[str], Optional[str]]:
        answer = self._ask({"op": "delete", "unit": index})
        if "error" in answer:
            return [], "the node's helper: %s" % str(answer["error"])[:500]
        went = answer.get("went")
        # At most one name per entry the unit was pinned with (delete_units.MAX_TREE_ENTRIES).
        went = [str(m)[:4096] for m in went[:MAX_TREE_ENTRIES]] if isinstance(went, list) else []
        why = answer.get("why")
        return went, None if why is None else str(why)[:1000]

    async def _close(self) -> None:
        stack, self._stack, process, self._process = self._stack, None, self._process, None
        if process is not None:
            with contextlib.suppress(Exception):
                process.stdin.write(json.dumps({"op": "close"}) + "\n")
                process.stdin.write_eof()
                await asyncio.wait_for(process.wait_closed(), 2.0)
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()

    def close(self) -> None:
        if self._stack is None and self._process is None:
            return
        with contextlib.suppress(Exception):
            self.fs.wait_for(self.root, self._close)


class LoopThread:
    """An event loop in a daemon thread, for the headless commands that reach nodes over SSH."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="opsconsole-ssh", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[Any], timeout: Optional[float] = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5.0)
        if not self.loop.is_running():
            self.loop.close()


def open_files_for(fs: FileSystem, root: str) -> OpenFiles:
    """Files under `root` open or mapped by a process of the machine that holds it."""
    try:
        answer = fs.files_in_use(root)
    except OSError as exc:
        return OpenFiles(frozenset(), "open-file check failed: %s" % (exc.strerror or exc))
    return open_files_from(answer)
