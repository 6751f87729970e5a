"""Following a remote node's log files over its SSH connection: one follower process per node.

The node's Python runs filetail.py's own source (`python3 -c SOURCE SPEC`), which globs, follows
every file by name through rotation and truncation, and prints one JSON record per batch with
each line's offset and number. `tail -F` cannot start each file at its own offset, which a
resume after a reconnect needs: here the console keeps, per file, the offset, line count, inode
and the bytes before the offset, and the new process goes on from there (no line twice, none lost
while the file kept its inode). The spec travels as one shlex-quoted argument: file names with
spaces, quotes or `;` need no further care.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import shlex
from typing import Any, Callable, Dict, List, Optional, Sequence

from opsconsole.probe import filetail

# (path, [[offset, number, text, truncated], ...], how many of the first were in the file when following began)
RemoteLines = Callable[[str, List[list], int], None]
RECONNECT_DELAY_S = 1.0


def follower_source() -> str:
    """Python source that runs on the node: filetail.py itself plus a call of its main."""
    return inspect.getsource(filetail) + "\nremote_main(sys.argv)\n"


def remote_command(python: str, spec: Dict[str, Any]) -> str:
    """The quoted command line that starts the follower on the node."""
    return " ".join([shlex.quote(python), "-u", "-c", shlex.quote(follower_source()), shlex.quote(json.dumps(spec))])


class RemoteFollower:
    """Runs the follower on one node, restarting it after a lost connection from where it was."""

    def __init__(
        self,
        node: str,
        link: Any,
        globs: Sequence[str],
        on_lines: RemoteLines,
        *,
        python: str = "python3",
        poll_interval: float = 0.25,
        rescan_interval: float = 5.0,
    ) -> None:
        self.node, self.link, self.globs = node, link, list(globs)
        self.on_lines, self.python = on_lines, python
        self.poll_interval, self.rescan_interval = poll_interval, rescan_interval
        self.state: Dict[str, list] = {}  # path -> [offset, number, inode, fingerprint hex]
        self.paths: List[str] = []
        self.problems: Dict[str, str] = {}
        self.restarts = 0
        self._task: Optional[asyncio.Task] = None
        self._process: Any = None
        self._started = False

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._process is not None:
            self._process.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def spec(self) -> Dict[str, Any]:
        return {
            "globs": self.globs,
            "files": dict(self.state),
            "initial": not self._started,
            "poll": self.poll_interval,
            "rescan": self.rescan_interval,
        }

    async def _run(self) -> None:
        while True:
            try:
                await self._follow_once()
                self.problems[self.node] = "log follower exited"
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # LinkError, asyncssh errors: the node is down for now
                self.problems[self.node] = "node down: %s" % (getattr(exc, "reason", None) or exc)
            self._process = None
            self.restarts += 1
            await asyncio.sleep(RECONNECT_DELAY_S)

    async def _follow_once(self) -> None:
        conn = await self.link.connection()
        async with self.link.channel_slot():
            process = await conn.create_process(remote_command(self.python, self.spec()), errors="replace")
            self._process = process
            self._started = True
            self.problems.pop(self.node, None)
            try:
                async for line in process.stdout:
                    self.handle_record(line)
            finally:
                process.close()

    def handle_record(self, line: str) -> None:
        """One JSON record from the node's follower."""
        try:
            record = json.loads(line)
        except ValueError:
            self.problems[self.node] = "follower said: %s" % line.strip()[:200]
            return
        if "l" in record:
            path = record["p"]
            self.state[path] = record["r"]
            earlier = record.get("b", 0)
            self.on_lines(path, record["l"], earlier if type(earlier) is int else 0)
        elif "new" in record:
            if record["new"] not in self.paths:
                self.paths.append(record["new"])
        elif "g" in record:
            self._set_problem(record["g"], record.get("why"))
        elif "x" in record:
            self._set_problem(self.node + ":" + record["x"], record.get("why"))
        elif "e" in record:
            self.state.pop(record["e"], None)
        elif "fatal" in record:
            self.problems[self.node] = record["fatal"]

    def _set_problem(self, key: str, why: Optional[str]) -> None:
        if why:
            self.problems[key] = why
        else:
            self.problems.pop(key, None)


async def remote_older(link: Any, python: str, path: str, before: int, count: int) -> List[list]:
    """Lines before `before` in a remote file: [[offset, number, text, truncated], ...]."""
    spec = {"mode": "older", "path": path, "before": before, "count": count}
    status, out, err = await link.run_command([python, "-u", "-c", follower_source(), json.dumps(spec)], timeout=30.0)
    if status != 0:
        raise OSError(err.strip().splitlines()[-1] if err.strip() else "exit status %s" % status)
    for line in out.splitlines():
        record = json.loads(line)
        if "fatal" in record:
            raise OSError(record["fatal"])
        if "l" in record:
            return record["l"]
    return []
