"""LogHub: every followed log source of the fleet, local and remote, behind one small API."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from opsconsole.config import Config
from opsconsole.logs.filetail import FileTail
from opsconsole.logs.follow import LocalFollower
from opsconsole.logs.index import LineIndex, read_last_lines
from opsconsole.logs.names import label_source, parse_line
from opsconsole.logs.records import TRUNCATED_MARKER, LogLine, LogSource
from opsconsole.logs.remote import RemoteFollower, remote_older

OnLines = Callable[[Sequence[LogLine]], None]


def make_line(source: LogSource, offset: int, number: int, text: str, truncated: bool) -> LogLine:
    """A LogLine with the time, level and rank its text carries."""
    if text.endswith("\r"):
        text = text[:-1]
    when, level, rank = parse_line(text)
    if truncated:
        text += TRUNCATED_MARKER
    return LogLine(source=source, number=number, offset=offset, text=text, time=when, level=level,
                   rank=source.rank if rank is None else rank, truncated=truncated)


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


class LogHub:
    """Follows `config.logs` globs on every node: local files directly, remote ones over their SshLink."""

    def __init__(self, config: Config, links: Mapping[str, object] = {}, *, poll_interval: float = 0.25,
                 use_inotify: Optional[bool] = None) -> None:
        self.config = config
        self.use_inotify = use_inotify  # None: inotify where it works; False: polling (as on NFS)
        self.links = dict(links)
        self.poll_interval = poll_interval if poll_interval != 0.25 else config.logs.poll_interval
        self._sources: Dict[str, LogSource] = {}
        self._local: Optional[LocalFollower] = None
        self._local_node = "local"
        self._remote: Dict[str, RemoteFollower] = {}
        self._indexes: Dict[str, LineIndex] = {}
        self._problems: Dict[str, str] = {}
        self._on_lines: Optional[OnLines] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    # --- start and stop ------------------------------------------------------------------------------

    async def start(self, on_lines: OnLines) -> None:
        """Start following; `on_lines` gets batches on this event loop, in file order per source."""
        self._on_lines = on_lines
        self._loop = asyncio.get_running_loop()
        logs = self.config.logs
        for node in self.config.nodes:
            globs = logs.globs_for(node.name)
            if not globs:
                continue
            link = self.links.get(node.name)
            if node.local or (link is not None and not hasattr(link, "channel_slot")):
                if self._local is not None:
                    continue
                self._local_node = node.name
                globs = tuple(os.path.expanduser(g) for g in globs)
                self._local = LocalFollower(globs, self._deliver_local, poll_interval=self.poll_interval,
                                            rescan_interval=logs.rescan_interval, on_new=self._new_local,
                                            use_inotify=self.use_inotify)
                await asyncio.to_thread(self._local.start)
            elif link is None:
                self._problems[node.name] = "node down: no connection to it"
            else:
                follower = RemoteFollower(node.name, link, globs, self._remote_lines(node.name),
                                          python=node.python, poll_interval=self.poll_interval,
                                          rescan_interval=logs.rescan_interval)
                self._remote[node.name] = follower
                follower.start()

    async def stop(self) -> None:
        """Stop every follower and index builder."""
        for index in self._indexes.values():
            index.cancel()
        if self._local is not None:
            await asyncio.to_thread(self._local.stop)
            self._local = None
        for follower in self._remote.values():
            await follower.stop()
        self._remote.clear()

    # --- what the console asks --------------------------------------------------------------------------

    def sources(self) -> List[LogSource]:
        """Every source seen so far (a rotated file stays one source)."""
        remote = [label_source(name, path) for name, f in self._remote.items() for path in f.paths]
        for source in remote:
            self._sources.setdefault(source.key, source)
        return list(self._sources.values())

    def problems(self) -> Dict[str, str]:
        """Source key, glob or node name -> why it is not followed ("permission denied", "node down: ...")."""
        problems = dict(self._problems)
        if self._local is not None:
            for key, why in list(self._local.problems.items()):
                problems[key if key.startswith("/") is False else self._local_node + ":" + key] = why
        for follower in self._remote.values():
            problems.update(follower.problems)
        return problems

    async def older(self, source_key: str, before_offset: int, count: int) -> List[LogLine]:
        """Up to `count` lines before `before_offset` of one source (scroll-back)."""
        source = self._source(source_key)
        if source.node in self._remote:
            follower = self._remote[source.node]
            records = await remote_older(self.links[source.node], follower.python, source.path, before_offset, count)
            return [make_line(source, *record) for record in records]
        index = self._indexes.get(source_key)
        if index is None:
            index = self._indexes[source_key] = LineIndex(source.path)
        if index._thread is None or index.complete:
            await asyncio.to_thread(index.extend)  # numbers for what is shown (once; then only the growth)
        found = await asyncio.to_thread(index.lines_before, before_offset, count)
        return [make_line(source, offset, number, decode(raw), cut) for offset, number, raw, cut in found]

    async def last_lines(self, source_key: str, count: int) -> List[LogLine]:
        """The last `count` complete lines of one source as the file is now."""
        source = self._source(source_key)
        if source.node in self._remote:
            return await self.older(source_key, -1, count)
        found = await asyncio.to_thread(read_last_lines, source.path, count)
        index = self._indexes.get(source_key)
        return [make_line(source, offset, index.number_at(offset) if index else 0, decode(raw), cut)
                for offset, raw, cut in found]

    def _source(self, key: str) -> LogSource:
        source = self._sources.get(key)
        if source is None:
            self.sources()
            source = self._sources.get(key)
        if source is None:
            raise KeyError("no log source %r" % key)
        return source

    # --- local ------------------------------------------------------------------------------------------

    def _new_local(self, path: str, tail: FileTail) -> None:
        """A new local file: label it, and count its lines in the background when it is big."""
        source = label_source(self._local_node, path)
        self._sources[source.key] = source
        index = LineIndex(path)
        self._indexes[source.key] = index
        if tail.base is None:
            start = tail.line_start
            index.start_background(on_done=lambda: self._local_base_known(tail, index, start))

    def _local_base_known(self, tail: FileTail, index: LineIndex, start: int) -> None:
        """The index reached the tail's start: its lines get their numbers from now on."""
        number = index.number_at(start)
        if self._local is not None and number:
            with self._local.lock:
                tail.set_base(number - 1)

    def _deliver_local(self, batch: List) -> None:
        """From the follower thread: make LogLines there, hand them to the loop in one call."""
        lines: List[LogLine] = []
        for path, raws in batch:
            source = self._sources.get(self._local_node + ":" + path) or label_source(self._local_node, path)
            for offset, number, raw, cut in raws:
                lines.append(make_line(source, offset, number, decode(raw), cut))
        if self._loop is not None and lines:
            self._loop.call_soon_threadsafe(self._hand_on, lines)

    def _hand_on(self, lines: Sequence[LogLine]) -> None:
        if self._on_lines is not None:
            self._on_lines(lines)

    # --- remote -----------------------------------------------------------------------------------------

    def _remote_lines(self, node: str) -> Callable[[str, List[list]], None]:
        def on_lines(path: str, records: List[list]) -> None:
            key = node + ":" + path
            source = self._sources.get(key)
            if source is None:
                source = self._sources[key] = label_source(node, path)
            self._hand_on([make_line(source, *record) for record in records])

        return on_lines
