"""LogHub: every followed log source of the fleet, local and remote, behind one small API."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from opsconsole.config import Config
from opsconsole.logs.follow import LocalFollower
from opsconsole.logs.index import LineIndex, read_last_lines
from opsconsole.logs.names import label_source, parse_line
from opsconsole.logs.records import TRUNCATED_MARKER, LogLine, LogSource
from opsconsole.logs.remote import RemoteFollower, remote_older
from opsconsole.model import replace_decoded
from opsconsole.probe.filetail import FileTail

OnLines = Callable[[Sequence[LogLine]], None]
HAND_ON_WAIT_S = 0.25  # the follower thread looks this often whether the hub stopped while it waits


# Every followed line becomes a LogLine, so this is the follower's hot path (200k lines/s must fit
# in a fraction of one core). Two shortcuts, each giving exactly what the plain code gives:
# - the seed's '%(asctime)s - %(levelname)s - %(message)s' lines are parsed by slicing, with the
#   epoch of each distinct "YYYY-MM-DD HH:MM:SS" taken once from names.parse_line (3 us -> 0.5 us);
# - the frozen dataclass is filled through its __dict__ (its __init__ pays object.__setattr__ per field).
SEED_SECOND = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d", re.ASCII)
SEED_LEVELS = {
    "DEBUG": "DEBUG",
    "INFO": "INFO",
    "WARNING": "WARNING",
    "WARN": "WARNING",
    "ERROR": "ERROR",
    "CRITICAL": "CRITICAL",
    "FATAL": "CRITICAL",
}
FRACTIONS = {"%03d" % n: float("0.%03d" % n) for n in range(1000)}
_second_epochs: Dict[str, Optional[float]] = {}  # "YYYY-MM-DD HH:MM:SS" -> epoch (None: not a time)
SEED_PREFIX = 36  # stamp (23) + " - " + the longest level word (CRITICAL) + its space
SEED_PREFIXES_KEPT = 4096
_seed_prefixes: Dict[str, Tuple[float, str]] = {}  # a seed line's first SEED_PREFIX characters -> (time, level)
_LINE_FIELDS = ("source", "number", "offset", "text", "time", "level", "rank", "truncated")


def _fast_fill_defaults() -> Optional[Dict[str, Any]]:
    """Defaults of LogLine's other fields, or None when LogLine cannot be filled through __dict__."""
    if hasattr(LogLine, "__slots__") or hasattr(LogLine, "__post_init__"):
        return None
    defaults: Dict[str, Any] = {}
    for field in dataclasses.fields(LogLine):
        if field.name in _LINE_FIELDS:
            continue
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            return None  # a fresh value per line: leave it to __init__
        else:
            return None
    return defaults


_LINE_DEFAULTS = _fast_fill_defaults()


def _second_epoch(stamp: str) -> Optional[float]:
    """Epoch of a "YYYY-MM-DD HH:MM:SS" (names.parse_line's value before the fraction), cached."""
    value = _second_epochs.get(stamp, False)
    if value is False:
        value = parse_line(stamp)[0] if SEED_SECOND.fullmatch(stamp) else None
        if len(_second_epochs) > 65536:
            _second_epochs.clear()
        _second_epochs[stamp] = value
    return value  # type: ignore[return-value]


def parse_seed_line(text: str) -> Optional[Tuple[Optional[float], Optional[str], Optional[int]]]:
    """parse_line's answer for a '2026-12-02 23:10:01,025 - INFO - ...' line; None for other lines."""
    if text[23:26] != " - " or text[19:20] not in (",", "."):
        return None
    base = _second_epoch(text[:19])
    fraction = FRACTIONS.get(text[20:23])
    if base is None or fraction is None:
        return None
    space = text.find(" ", 26, SEED_PREFIX)
    level = SEED_LEVELS.get(text[26:space]) if space > 0 else None
    if level is None:
        return None  # parse_line would search further along the line
    return base + fraction, level, None


def make_line(source: LogSource, offset: int, number: int, text: str, truncated: bool) -> LogLine:
    """A LogLine with the time, level and rank its text carries."""
    if text.endswith("\r"):
        text = text[:-1]
    parsed = parse_seed_line(text)
    when, level, rank = parse_line(text) if parsed is None else parsed
    if truncated:
        text += TRUNCATED_MARKER
    if rank is None:
        rank = source.rank
    if _LINE_DEFAULTS is None:
        return LogLine(
            source=source,
            number=number,
            offset=offset,
            text=text,
            time=when,
            level=level,
            rank=rank,
            truncated=truncated,
        )
    line = _new_line(LogLine)
    fields = line.__dict__
    if _LINE_DEFAULTS:
        fields.update(_LINE_DEFAULTS)
    fields.update(
        source=source, number=number, offset=offset, text=text, time=when, level=level, rank=rank, truncated=truncated
    )
    return line


_new_line = object.__new__


def make_lines(source: LogSource, raws: Sequence[Tuple[int, int, bytes, bool]]) -> List[LogLine]:
    """make_line over FileTail's (offset, number, raw, truncated) lines of one source, inlined (hot path)."""
    if _LINE_DEFAULTS is None or _LINE_DEFAULTS:
        return [
            make_line(source, offset, number, raw.decode("utf-8", "replace"), cut) for offset, number, raw, cut in raws
        ]
    out: List[LogLine] = []
    append = out.append
    source_rank = source.rank
    epochs, fractions, levels, prefixes = _second_epochs, FRACTIONS, SEED_LEVELS, _seed_prefixes
    new, line_class = _new_line, LogLine
    for offset, number, raw, cut in raws:
        text = raw.decode("utf-8", "replace")
        if text.endswith("\r"):
            text = text[:-1]
        # parse_seed_line, inlined; what it reads lies in the first SEED_PREFIX characters, so lines
        # of the same millisecond and message start share one answer
        prefix = text[:SEED_PREFIX]
        known = prefixes.get(prefix)
        if known is not None:
            when, level = known
        else:
            when = level = None
            if text[23:26] == " - " and text[19:20] in (",", "."):
                base = epochs.get(text[:19], False)
                if base is False:
                    base = _second_epoch(text[:19])
                fraction = fractions.get(text[20:23])
                if base is not None and fraction is not None:
                    space = text.find(" ", 26, SEED_PREFIX)
                    if space > 0:
                        level = levels.get(text[26:space])
                        if level is not None:
                            when = base + fraction
                            if len(prefixes) >= SEED_PREFIXES_KEPT:
                                prefixes.clear()
                            prefixes[prefix] = (when, level)
        if level is None:
            when, level, rank = parse_line(text)
            if rank is None:
                rank = source_rank
        else:
            rank = source_rank
        if cut:
            text += TRUNCATED_MARKER
        line = new(line_class)
        fields = line.__dict__  # item by item: no keyword dict per line
        fields["source"] = source
        fields["number"] = number
        fields["offset"] = offset
        fields["text"] = text
        fields["time"] = when
        fields["level"] = level
        fields["rank"] = rank
        fields["truncated"] = cut
        append(line)
    return out


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


class LogHub:
    """Follows `config.logs` globs on every node: local files directly, remote ones over their SshLink."""

    def __init__(
        self,
        config: Config,
        links: Mapping[str, object] = {},
        *,
        poll_interval: float = 0.25,
        use_inotify: Optional[bool] = None,
    ) -> None:
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
        self._stopping = False
        self._deferred_indexes: Optional[List[Callable[[], None]]] = None  # while start() reads the last pages

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
                self._local = LocalFollower(
                    globs,
                    self._deliver_local,
                    poll_interval=self.poll_interval,
                    rescan_interval=logs.rescan_interval,
                    on_new=self._new_local,
                    use_inotify=self.use_inotify,
                )
                self._deferred_indexes = []
                try:
                    await asyncio.to_thread(self._local.start)  # the last pages are delivered by then
                finally:
                    deferred, self._deferred_indexes = self._deferred_indexes, None
                for begin in deferred:
                    begin()  # counting big files' lines now: not competing with the first pages
            elif link is None:
                self._problems[node.name] = "node down: no connection to it"
            else:
                follower = RemoteFollower(
                    node.name,
                    link,
                    globs,
                    self._remote_lines(node.name),
                    python=node.python,
                    poll_interval=self.poll_interval,
                    rescan_interval=logs.rescan_interval,
                )
                self._remote[node.name] = follower
                follower.start()

    async def stop(self) -> None:
        """Stop every follower and index builder."""
        self._stopping = True
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
        return make_lines(source, found)

    async def last_lines(self, source_key: str, count: int) -> List[LogLine]:
        """The last `count` complete lines of one source as the file is now."""
        source = self._source(source_key)
        if source.node in self._remote:
            return await self.older(source_key, -1, count)
        index = self._indexes.get(source_key)

        def read() -> List[Tuple[int, int, bytes, bool]]:
            found = read_last_lines(source.path, count)
            # The lines are consecutive: one look-up in the index numbers them all.
            first = index.number_at(found[0][0]) if index is not None and found else 0
            return [(offset, first + i if first else 0, raw, cut) for i, (offset, raw, cut) in enumerate(found)]

        return make_lines(source, await asyncio.to_thread(read))

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

            def begin() -> None:
                index.start_background(on_done=lambda: self._local_base_known(tail, index, start))

            if self._deferred_indexes is not None:
                self._deferred_indexes.append(begin)
            else:
                begin()

    def _local_base_known(self, tail: FileTail, index: LineIndex, start: int) -> None:
        """The index reached the tail's start: its lines get their numbers from now on."""
        number = index.number_at(start)
        if self._local is not None and number:
            with self._local.lock:
                tail.set_base(number - 1)

    def _deliver_local(self, batch: List) -> None:
        """From the follower thread: make LogLines there, hand them to the loop, wait till it took them.

        Waiting is the back-pressure: a console slower than its logs leaves the lines in the files, not
        in memory. It also keeps the two threads from fighting over the GIL: the follower reads while
        the loop is idle, the loop takes the batch while the follower waits (without this, each read of
        the follower waited out the interpreter's 5 ms switch interval behind the busy loop).
        """
        lines: List[LogLine] = []
        for path, raws in batch:
            source = self._sources.get(self._local_node + ":" + path) or label_source(self._local_node, path)
            lines.extend(make_lines(source, raws))
        loop = self._loop
        if loop is None or not lines:
            return
        taken = threading.Event()
        try:
            loop.call_soon_threadsafe(self._hand_on, lines, taken)
        except RuntimeError:  # the loop is closed: nobody to give the lines to
            return
        while not taken.wait(HAND_ON_WAIT_S):
            if self._stopping or loop.is_closed() or not loop.is_running():
                return

    def _hand_on(self, lines: Sequence[LogLine], taken: Optional[threading.Event] = None) -> None:
        try:
            if self._on_lines is not None:
                self._on_lines(lines)
        finally:
            if taken is not None:
                taken.set()

    # --- remote -----------------------------------------------------------------------------------------

    def _remote_lines(self, node: str) -> Callable[[str, List[list], int], None]:
        def on_lines(path: str, records: List[list], earlier: int = 0) -> None:
            key = node + ":" + path
            source = self._sources.get(key)
            if source is None:
                source = self._sources[key] = label_source(node, path)
            lines = [make_line(source, *record) for record in records]
            if earlier:  # the file's last page at start-up, as the local ones are read within start()
                lines[:earlier] = [replace_decoded(line, {"earlier": True}) for line in lines[:earlier]]
            self._hand_on(lines)

        return on_lines
