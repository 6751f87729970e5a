"""The contract every console pane implements, so the app can switch and feed them alike."""

from __future__ import annotations

from typing import ClassVar, Mapping, Optional

from textual.widget import Widget

from opsconsole.model import NodeState


class Pane(Widget):
    """A full-width view (GPUs, Processes, Host, Nodes, ...) fed with the fleet's states.

    The app calls `show()` after every state change, but only on the visible pane,
    and once more when a pane becomes visible. `show()` must update rows in place
    (DataTable.update_cell in a batch), never rebuild the table per tick.
    """

    pane_id: ClassVar[str] = ""  # "gpus", "processes", "host", "nodes", "cluster"
    title: ClassVar[str] = ""  # shown in the tab bar
    key: ClassVar[str] = ""  # number key that opens it: "1", "2", ...

    def show(self, states: Mapping[str, NodeState], node: Optional[str], now: float) -> None:
        """Draw `states` (config order); `node` is the node drilled into, None = all."""
        raise NotImplementedError

    def apply_filter(self, text: str) -> None:
        """Apply the `/` filter text ("" clears it); panes without a filter ignore it."""
