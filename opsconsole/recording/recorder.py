"""Writes node states (and findings, health results, alerts) into a recording as they arrive."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from opsconsole.model import NodeFrame, NodeState, to_wire
from opsconsole.probe.wire_delta import delta_of
from opsconsole.recording import store

DEFAULT_CHUNK_S = 5.0
DEFAULT_KEYFRAME_EVERY = 2  # chunks: a seek decodes at most 10 s of deltas
DEFAULT_MAX_BYTES = 200 * 1024 * 1024
# A chunk is written early when it holds this many records, so that a long chunk_s, a short
# interval and many nodes still make chunks a reader inflates within store.MAX_CHUNK_INFLATED
# (store.write_chunk splits what is still too large).
MAX_CHUNK_RECORDS = 16_384

# NodeState fields kept beside the frame (the frame travels as a delta line).
STATE_FIELDS = ("state", "reason", "address", "received_at", "rtt_ms", "fingerprint", "since")


def state_fields(state: NodeState) -> Dict[str, Any]:
    return {name: getattr(state, name) for name in STATE_FIELDS}


@dataclass
class RecorderStats:
    records: int = 0
    chunks: int = 0
    bytes_written: int = 0
    dropped_chunks: int = 0


class Recorder:
    """Appends to one recording file; bounded by `max_bytes` and `max_age_s` (oldest dropped first)."""

    def __init__(
        self,
        path: str,
        *,
        chunk_s: float = DEFAULT_CHUNK_S,
        keyframe_every: int = DEFAULT_KEYFRAME_EVERY,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_age_s: Optional[float] = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.chunk_s = chunk_s
        self.keyframe_every = max(1, keyframe_every)
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.clock = clock
        self.stats = RecorderStats()
        self._db = store.open_for_writing(path)
        store.set_meta(self._db, "started", repr(clock()))
        self._last_wire: Dict[str, Dict[str, Any]] = {}  # per node: the frame the next delta is taken against
        self._latest: Dict[str, NodeState] = {}  # what a keyframe chunk restates
        self._written_frame: Dict[str, Optional[NodeFrame]] = {}
        self._records: list = []
        self._chunk_started: Optional[float] = None
        self._chunks_since_keyframe = self.keyframe_every  # the first chunk is a keyframe chunk
        self._closed = False

    # --- input -----------------------------------------------------------

    def observe(self, state: NodeState) -> None:
        """Record one node state (call with every state the fleet publishes)."""
        now = state.received_at if state.received_at is not None else self.clock()
        if self._chunk_started is not None and now - self._chunk_started >= self.chunk_s:
            self.flush()
        if self._chunk_started is None:
            self._open_chunk(now)
        self._latest[state.name] = state
        self._add(state, now)
        if len(self._records) >= MAX_CHUNK_RECORDS:
            self.flush()

    def event(self, kind: str, node: Optional[str], data: Dict[str, Any], t: Optional[float] = None) -> None:
        """Record a finding, health result or alert (`data` must be JSON-able)."""
        store.write_event(self._db, self.clock() if t is None else t, kind, node, data)

    # --- chunks ----------------------------------------------------------

    def _open_chunk(self, now: float) -> None:
        self._chunk_started = now
        self._keyframe_chunk = self._chunks_since_keyframe >= self.keyframe_every
        if self._keyframe_chunk:
            self._chunks_since_keyframe = 0
            self._last_wire = {}
            self._written_frame = {}
            for state in self._latest.values():  # restate every node, so a seek can start here
                self._add(state, now)

    def _add(self, state: NodeState, now: float) -> None:
        record: Dict[str, Any] = {"t": now, "n": state.name, "s": state_fields(state)}
        frame = state.frame
        if frame is not None and (
            state.name not in self._written_frame or self._written_frame[state.name] is not frame
        ):
            record["f"] = self._frame_record(state.name, frame)
            self._written_frame[state.name] = frame
        elif frame is None:
            self._written_frame[state.name] = None
            self._last_wire.pop(state.name, None)  # the next frame is stored whole: a replay has no base
            record["f"] = None
        self._records.append(record)
        self.stats.records += 1

    def _frame_record(self, node: str, frame: NodeFrame) -> Dict[str, Any]:
        """The full wire frame (lossless: no rounding), or its delta against the node's previous one."""
        wire = to_wire(frame)
        last = self._last_wire.get(node)
        self._last_wire[node] = wire
        if last is not None:
            try:
                return delta_of(last, wire)
            except Exception:  # a frame the diff cannot express (same seq, new fields): store it whole
                pass
        return wire

    def flush(self) -> None:
        """Write the chunk being collected (a partial one too) and apply retention."""
        if not self._records:
            self._chunk_started = None
            return
        self.stats.bytes_written += store.write_chunk(self._db, self._records, self._keyframe_chunk)
        self.stats.chunks += 1
        self._chunks_since_keyframe += 1
        self._records = []
        self._chunk_started = None
        self._apply_retention()

    def _apply_retention(self) -> None:
        if self.max_age_s is not None:
            self.stats.dropped_chunks += store.drop_before_keyframe(self._db, self.clock() - self.max_age_s)
        if self.stats.chunks % self.keyframe_every:
            return  # size is checked once per keyframe group: cheap, and groups are the unit dropped
        while store.size_bytes(self._db) > self.max_bytes:
            span = store.time_range(self._db)
            second = self._db.execute(
                "SELECT t0 FROM chunks WHERE keyframe = 1 ORDER BY id LIMIT 1 OFFSET 1"
            ).fetchone()
            if span is None or second is None:
                break  # only one group left: keep it, whatever its size
            self.stats.dropped_chunks += store.drop_before_keyframe(self._db, second[0])

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        store.set_meta(self._db, "stopped", repr(self.clock()))
        self._db.close()
        self._closed = True

    def __enter__(self) -> "Recorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
