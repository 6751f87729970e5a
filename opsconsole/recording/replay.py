"""Reading a recording back: node states at any time, and a fleet that plays them to the console."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from opsconsole.model import NODE_STATES, NodeFrame, NodeState, from_wire
from opsconsole.nodes.totals import FleetTotals, totals_of
from opsconsole.probe.procs import looks_like_kernel_thread
from opsconsole.probe.wire_delta import DeltaError, apply_delta
from opsconsole.recording import store
from opsconsole.sanitize import printable_line

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
PLAY_TICK_S = 0.25


MAX_PROBLEMS = 20  # problems kept per reader (the first ones, then the latest replaces the last)
MAX_NODES = 10_000  # nodes a replay follows; a crafted file cannot make it follow millions
MAX_TEXT_CHARS = 4096  # reason, address, fingerprint


def state_fields_of(raw: Dict[str, Any]) -> Dict[str, Any]:
    """A record's NodeState fields, checked (ChunkError names the first bad one)."""
    state = raw.get("state")
    if state not in NODE_STATES:
        raise store.ChunkError("unknown node state %s" % printable_line(repr(state)[:40]))
    fields: Dict[str, Any] = {"state": state}
    for key in ("reason", "address", "fingerprint"):
        value = raw.get(key)
        if value is not None and (type(value) is not str or len(value) > MAX_TEXT_CHARS):
            raise store.ChunkError("%s is not a short string" % key)
        fields[key] = value
    for key in ("received_at", "since"):
        value = raw.get(key)
        if value is not None:
            value = store.valid_time(value)
            if value is None:
                raise store.ChunkError("%s is not a plausible time" % key)
        fields[key] = value
    rtt = raw.get("rtt_ms")
    if rtt is not None and (type(rtt) not in (int, float) or not 0 <= rtt < 1e9):  # NaN fails the range too
        raise store.ChunkError("rtt_ms is not a round-trip time")
    fields["rtt_ms"] = None if rtt is None else float(rtt)
    return fields


class RecordingReader:
    """States of every node at a point in time; moving forward is incremental, backward re-seeks.

    What the file holds never raises once it is open: a chunk, record or frame that cannot be
    read is left out (a node keeps its last good frame) and said in `problems`.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: List[str] = []
        self._db = store.open_for_reading(path)
        try:
            self.meta = store.meta(self._db)
            span = store.time_range(self._db)
            if span is None:
                raise store.RecordingError("%s: the recording holds no frames" % printable_line(path))
            self.start, self.end = span
            first = next(store.chunks_from_keyframe(self._db, self.start), None)
        except (sqlite3.Error, store.ChunkError) as exc:
            self._db.close()
            raise store.RecordingError("%s: not a readable recording (%s)" % (printable_line(path), exc)) from None
        except store.RecordingError:
            self._db.close()
            raise
        if first is None or not first.records:
            self._db.close()
            why = "it has no keyframe chunk" if first is None else first.problem or "its first chunk is empty"
            raise store.RecordingError("%s: not a readable recording (%s)" % (printable_line(path), why))
        seen: Dict[str, float] = {}
        for record in first.records:
            seen.setdefault(record["n"], record["t"])
        self._first_full = min(max(max(seen.values()), self.start), self.end)
        self.position = self.start
        self._states: Dict[str, NodeState] = {}
        self._records: Optional[Iterator[dict]] = None
        self._pending: Optional[dict] = None  # the first record after `position`, read ahead
        self.seek(self.start)

    @property
    def problem(self) -> Optional[str]:
        """The latest problem met in the file, None while everything read was good."""
        return self.problems[-1] if self.problems else None

    def _note(self, problem: str) -> None:
        problem = printable_line(problem)
        if problem in self.problems:
            return
        if len(self.problems) >= MAX_PROBLEMS:
            self.problems[-1] = problem
        else:
            self.problems.append(problem)

    def first_full_time(self) -> float:
        """When every node of the first chunk had reported once: where playing starts."""
        return self._first_full

    def _stream(self, t: float) -> Iterator[dict]:
        for chunk in store.chunks_from_keyframe(self._db, t):
            if chunk.problem is not None:
                self._note(chunk.problem)
            yield from chunk.records

    def seek(self, t: float) -> Dict[str, NodeState]:
        """States as they were at time `t` (clamped to the recording; NaN is the start)."""
        if t != t:
            t = self.start
        t = min(max(t, self.start), self.end)
        self._states = {}
        self._records = self._stream(t)
        self._pending = None
        self.position = -float("inf")
        self.advance(t)
        return self.states()

    def advance(self, t: float) -> List[NodeState]:
        """Apply the records up to `t`; returns the states that changed (oldest first)."""
        if t != t:
            return []
        if t < self.position:
            before = dict(self._states)
            self.seek(t)
            return [s for name, s in self._states.items() if before.get(name) is not s]
        t = min(t, self.end)
        changed: Dict[str, NodeState] = {}
        while True:
            record = self._pending if self._pending is not None else next(self._records, None)
            self._pending = None
            if record is None:
                break
            if record["t"] > t:
                self._pending = record
                break
            state = self._apply(record)
            if state is not None:
                changed[state.name] = state
        self.position = t
        return list(changed.values())

    def _apply(self, record: dict) -> Optional[NodeState]:
        name = record["n"]
        previous = self._states.get(name)
        if previous is None and len(self._states) >= MAX_NODES:
            self._note("more than %d nodes: %s and later ones left out" % (MAX_NODES, name))
            return None
        try:
            fields = state_fields_of(record["s"])
        except store.ChunkError as exc:
            self._note("%s at %s: record left out (%s)" % (name, _clock(record["t"]), exc))
            return None
        frame = previous.frame if previous is not None else None
        if "f" in record:
            frame = self._frame(name, record, frame)
        state = NodeState(name=name, frame=frame, **fields)
        self._states[name] = state
        return state

    def _frame(self, name: str, record: dict, frame: Optional[NodeFrame]) -> Optional[NodeFrame]:
        """The record's frame; the node's last good one when it cannot be read (frames are validated by their decoder)."""
        wire = record["f"]
        try:
            if type(wire) is str:  # recordings before 2026-12-02 18:45 kept the frame as a JSON line
                wire = json.loads(wire)
            if wire is None:
                return None
            if type(wire) is not dict:
                raise ValueError("not an object")
            if "delta" in wire:
                try:
                    return with_kernel_threads_marked(apply_delta(frame, wire))
                except DeltaError:
                    return frame  # a chain broken by retention: the frame waits for the next keyframe
            return with_kernel_threads_marked(from_wire(NodeFrame, wire))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            self._note(
                "%s at %s: frame left out (%s)" % (name, _clock(record["t"]), str(exc)[:200] or type(exc).__name__)
            )
            return frame

    def states(self) -> Dict[str, NodeState]:
        return dict(self._states)

    def events(self, t0: float, t1: float) -> List[Tuple[float, str, Optional[str], dict]]:
        return store.events_between(self._db, t0, t1)

    def close(self) -> None:
        self._db.close()


def with_kernel_threads_marked(frame: NodeFrame) -> NodeFrame:
    """`frame` with its kernel threads marked where its probe predates the flag (kernel_thread None).

    Recordings made before 2026-12-03 (examples/h200-training.opsrec among them) carry no flag,
    and the console would list their kernel threads and say none is hidden. Only the rows found
    to be kernel threads are replaced: the rest stay the objects (and the values) recorded.
    """
    rows = frame.top_processes
    if not any(row.kernel_thread is None and looks_like_kernel_thread(row) for row in rows):
        return frame
    marked = tuple(
        dataclasses.replace(row, kernel_thread=True)
        if row.kernel_thread is None and looks_like_kernel_thread(row)
        else row
        for row in rows
    )
    return dataclasses.replace(frame, top_processes=marked)


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


class ReplayFleet:
    """A fleet for the console that plays a recording: pause, speed, seek; nothing to act on."""

    is_replay = True

    def __init__(self, path: str, *, stale_after: float = 8.0, wall: Callable[[], float] = time.monotonic) -> None:
        self.reader = RecordingReader(path)
        self.stale_after = stale_after
        self.speed = 1.0
        self.paused = False
        self._wall = wall
        self._on_change: Optional[Callable[[NodeState], None]] = None
        self._task: Optional[asyncio.Task] = None
        self._last_wall = wall()
        self.start_at: Optional[float] = None  # where playing starts; None: once every node reported

    # --- what the console reads ------------------------------------------

    def now(self) -> float:
        """The replay's clock: ages and the header's time are measured against it."""
        return self.reader.position

    def states(self) -> Dict[str, NodeState]:
        return self.reader.states()

    @property
    def problem(self) -> Optional[str]:
        """The latest part of the recording that could not be read (left out), None if none."""
        return self.reader.problem

    @property
    def names(self) -> List[str]:
        return list(self.reader.states())

    def totals(self, now: float) -> FleetTotals:
        return totals_of(self.reader.states().values(), now, self.stale_after)

    def link(self, name: str):
        raise KeyError("%s: a replay has no live link (actions are disabled)" % name)

    async def retry(self, name: str) -> bool:
        return False  # a recorded node has nothing to reconnect to

    # --- controls ----------------------------------------------------------

    def toggle_pause(self) -> bool:
        self._catch_up()
        self.paused = not self.paused
        return self.paused

    def faster(self) -> float:
        self._catch_up()
        self.speed = next((s for s in SPEEDS if s > self.speed), SPEEDS[-1])
        return self.speed

    def slower(self) -> float:
        self._catch_up()
        self.speed = next((s for s in reversed(SPEEDS) if s < self.speed), SPEEDS[0])
        return self.speed

    def seek(self, t: float) -> None:
        self._last_wall = self._wall()
        self.reader.seek(t)
        self._publish_all()

    def step(self, seconds: float) -> None:
        self.seek(self.reader.position + seconds)

    # --- running -----------------------------------------------------------

    async def start(self, on_change: Callable[[NodeState], None]) -> None:
        self._on_change = on_change
        self.seek(self.start_at if self.start_at is not None else self.reader.first_full_time())
        self._task = asyncio.ensure_future(self._play())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self.reader.close()

    async def _play(self) -> None:
        while True:
            await asyncio.sleep(PLAY_TICK_S)
            self._catch_up()

    def _catch_up(self) -> None:
        wall = self._wall()
        elapsed, self._last_wall = wall - self._last_wall, wall
        if self.paused or self.reader.position >= self.reader.end:
            return
        for state in self.reader.advance(self.reader.position + elapsed * self.speed):
            self._emit(state)

    def _publish_all(self) -> None:
        for state in self.reader.states().values():
            self._emit(state)

    def _emit(self, state: NodeState) -> None:
        if self._on_change is not None:
            self._on_change(state)
