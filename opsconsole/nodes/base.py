"""The interface every way of reaching a node implements."""

from __future__ import annotations

import abc
from typing import Any, Callable, Optional

from opsconsole.model import NodeState

Publish = Callable[[NodeState], None]

# Where an action's commands for a node run. A link says which, or None: a replay, a recording
# or a metrics source shows a node's processes, but its PIDs are not this machine's to signal.
COMMANDS_HERE = "here"  # this machine: os.kill, local files
COMMANDS_SSH = "ssh"  # over the node's own SSH connection


class NodeLink(abc.ABC):
    """A live link to one node: streams frames and publishes each state change."""

    name: str
    # See COMMANDS_HERE / COMMANDS_SSH. None (the default): no action may reach the node's processes
    # or files, so a new kind of link acts on nothing until it says where its commands go.
    commands_run: Optional[str] = None
    # A replay of a recording: what it shows happened elsewhere, or long ago. No action, ever.
    is_replay: bool = False

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


def command_channel(link: Any) -> Optional[str]:
    """Where commands for the node of `link` run (COMMANDS_HERE, COMMANDS_SSH), None when nowhere."""
    return getattr(link, "commands_run", None) if link is not None else None


def is_replayed(link: Any) -> bool:
    """Whether `link` (or a fleet) replays a recording rather than watching a live node."""
    return bool(getattr(link, "is_replay", False))
