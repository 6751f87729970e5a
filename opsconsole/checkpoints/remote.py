"""Checkpoint directories on a node, over the node's own SSH connection through SFTP.

`SftpFileSystem` is the FileSystem of scan.py and cleanup.py for a remote node. Its calls
come from a worker thread; each one is handed to the event loop that owns the SshLink
(`run_coroutine_threadsafe`), so parsing stays off that loop and the loop only moves
bytes. Only the ranges the readers ask for cross the network: a checkpoint's first 64 KiB
and its zip directory, never the whole file (except for an explicit CRC check).

One SFTP channel per node, opened on first use under the link's channel limit
(`channel_slot`) and reopened after the connection drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import stat as stat_module
import threading
from typing import Any, Awaitable, Callable, List, Optional, Tuple

from opsconsole.checkpoints.access import DirItem, FileStat, FileSystem
from opsconsole.checkpoints.open_files import REMOTE_FD_SCRIPT, OpenFiles, parse_fd_listing, remote_note

CALL_TIMEOUT_S = 60.0


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
                sftp = await conn.start_sftp_client(path_errors="surrogateescape")
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
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise RuntimeError("SftpFileSystem called on its own event loop: use a worker thread")
        future = asyncio.run_coroutine_threadsafe(self._run(path, action), self.loop)
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

    def run_reader(self, path: str, make_reader) -> object:
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
        async def read(sftp: Any) -> bytes:
            async with sftp.open(path, "rb") as handle:
                return await handle.read(limit)

        return self.call(path, read)

    def statvfs(self, path: str) -> Tuple[Optional[int], Optional[int]]:
        st = self.call(path, lambda sftp: sftp.statvfs(path))
        return st.bavail * st.frsize, st.blocks * st.frsize

    def remove(self, path: str) -> None:
        self.call(path, lambda sftp: sftp.remove(path))

    def rmtree(self, path: str) -> None:
        # asyncssh's rmtree lists with lstat semantics: a link inside is unlinked, never followed.
        self.call(path, lambda sftp: sftp.rmtree(path))

    # --- open files -------------------------------------------------------------------

    def open_files(self, root: str) -> OpenFiles:
        """Files under `root` some process on the node holds open (`ls -l /proc/*/fd/`)."""
        real_root = self.realpath(root)

        async def run(sftp: Any) -> Tuple[Optional[int], str, str]:
            return await self.link.run_command(["sh", "-c", REMOTE_FD_SCRIPT], timeout=self.timeout)

        try:
            status, out, _ = self.call(root, run)
        except OSError as exc:
            return OpenFiles(frozenset(), "open-file check failed: %s" % (exc.strerror or exc))
        found, uid = parse_fd_listing(out, real_root)
        mapped = set(found)
        if real_root.rstrip("/") != root.rstrip("/"):
            mapped |= {root.rstrip("/") + p[len(real_root.rstrip("/")):] for p in found}
        return OpenFiles(frozenset(mapped), remote_note(uid))


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
    """The open-file check of the right kind for `fs`."""
    if isinstance(fs, SftpFileSystem):
        return fs.open_files(root)
    from opsconsole.checkpoints.open_files import open_files_local

    return open_files_local(root)
