"""The interface every way of reaching a node implements."""

from __future__ import annotations

import abc
from typing import Callable

from opsconsole.model import NodeState

Publish = Callable[[NodeState], None]


class NodeLink(abc.ABC):
    """A live link to one node: streams frames and publishes each state change."""

    name: str

    @abc.abstractmethod
    async def run(self, publish: Publish) -> None:
        """Connect, stream frames, reconnect with backoff; never return until cancelled.

        Every new frame and every state change is passed to `publish` as a whole
        NodeState; the last good frame is kept in it across disconnects.
        """

    @abc.abstractmethod
    async def poll_once(self, timeout: float) -> NodeState:
        """One frame (or the reason there is none) within `timeout` seconds."""

    async def close(self) -> None:
        """Release connections. Safe to call more than once."""
