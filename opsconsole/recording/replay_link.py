"""A node that plays a recording in a loop, shifted to now: real captured data beside a live demo.

Its name says it is a replay, so nobody mistakes it for a live machine. Its PIDs are the
recorded machine's, never this one's: it has no command channel and is marked replayed, and
the action registry refuses every action on it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Callable, Optional

from opsconsole.model import NodeState
from opsconsole.nodes.base import NodeLink, Publish
from opsconsole.recording.replay import RecordingReader

TICK_S = 0.5


class ReplayLink(NodeLink):
    """Publishes node `source` of a recording as node `name`, looping, with times moved to the present."""

    is_replay = True

    def __init__(
        self, name: str, path: str, source: Optional[str] = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.name = name
        self.path = path
        self.source = source
        self.clock = clock
        self.reader = RecordingReader(path)
        if self.source is None:
            names = sorted(self.reader.seek(self.reader.end))
            if not names:
                raise ValueError("%s: no node could be read at the recording's end" % path)
            self.source = names[0]

    def _shifted(self, state: NodeState, offset: float) -> NodeState:
        frame = state.frame
        if frame is not None:
            frame = replace(frame, node=self.name, time=frame.time + offset)
        return replace(
            state,
            name=self.name,
            frame=frame,
            reason=state.reason,
            received_at=None if state.received_at is None else state.received_at + offset,
            since=None if state.since is None else state.since + offset,
            address="replay of " + self.path.rsplit("/", 1)[-1],
        )

    async def run(self, publish: Publish) -> None:
        reader = self.reader
        length = max(reader.end - reader.first_full_time(), 1.0)
        while True:
            loop_start = self.clock()
            offset = loop_start - reader.first_full_time()
            reader.seek(reader.first_full_time())
            state = reader.states().get(self.source)
            if state is not None:
                publish(self._shifted(state, offset))
            while self.clock() - loop_start < length:
                await asyncio.sleep(TICK_S)
                for changed in reader.advance(self.clock() - offset):
                    if changed.name == self.source:
                        publish(self._shifted(changed, offset))

    async def poll_once(self, timeout: float) -> NodeState:
        state = self.reader.seek(self.reader.end).get(self.source)
        return self._shifted(state, self.clock() - self.reader.end) if state else NodeState(name=self.name)

    async def close(self) -> None:
        self.reader.close()
