"""What every action is made of: danger levels, confirmation and target kinds, the target, the
context planning and running get, the plan, the report, and the Action record the registry lists.

One module that each action module (signals, GPU reset, drain, health rerun, checkpoint cleanup)
and the registry import, so no action module needs the registry.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, List, Mapping, Optional, Tuple

from opsconsole.actions.runner import ActionOutcome, ActionRunner
from opsconsole.config import Config
from opsconsole.model import NodeState
from opsconsole.nodes.base import COMMANDS_HERE, command_channel

if TYPE_CHECKING:
    from opsconsole.actions import gpu_reset, signals

# Danger levels, least to most. Anything above SAFE is absent in a read-only console.
DANGER_SAFE = "safe"  # reads only (a health rerun)
DANGER_DISRUPTIVE = "disruptive"  # stops or drains work, recoverable (SIGINT, SIGTERM, drain)
DANGER_DESTRUCTIVE = "destructive"  # loses work or data (SIGKILL, deleting checkpoints)
DANGER_CRITICAL = "critical"  # hardware state (GPU reset)
DANGER_LEVELS = (DANGER_SAFE, DANGER_DISRUPTIVE, DANGER_DESTRUCTIVE, DANGER_CRITICAL)

# Confirmation kinds.
CONFIRM_NONE = "none"
CONFIRM_YES_NO = "yes-no"  # Cancel focused; `y` confirms
CONFIRM_TYPED = "typed"  # a word to type, for the most dangerous

# Target kinds (also the binding id prefix).
TARGET_PROCESS = "process"
TARGET_GPU = "gpu"
TARGET_NODE = "node"
TARGET_CHECKPOINT_DIR = "checkpoints"


class Refused(Exception):
    """The action cannot be done on this target (one line, for the UI and the audit log)."""


@dataclass(frozen=True)
class Target:
    """What an action acts on: a process, a GPU, a node or a checkpoint directory, on one node."""

    kind: str
    node: str
    pid: Optional[int] = None
    gpu: Optional[int] = None
    path: Optional[str] = None
    name: str = ""  # the process name as reported, for the confirmation

    def describe(self) -> str:
        if self.kind == TARGET_PROCESS:
            return "pid %s%s" % (self.pid, " (%s)" % self.name if self.name else "")
        if self.kind == TARGET_GPU:
            return "gpu %s" % self.gpu
        if self.kind == TARGET_CHECKPOINT_DIR:
            return "dir %s" % self.path
        return "node %s" % self.node


@dataclass
class ActionContext:
    """What planning and running need: the config, the node's latest state and link, the runner."""

    config: Config
    get_state: Callable[[], Optional[NodeState]]
    link: Any
    runner: ActionRunner
    # Escalation asks before SIGTERM and SIGKILL; without a UI the answer is no.
    confirm_next: Optional[Callable[[str, "signals.ProcessVerdict"], Awaitable[bool]]] = None
    # Progress lines while an action waits (an escalation's timeout); the console shows them.
    progress: Optional[Callable[[str], None]] = None
    # Health checks of one node (and GPU), as opsconsole.health.runner gives them; None: not available.
    health_checks: Optional[Callable[[str, Optional[int], bool], Awaitable[List[Any]]]] = None
    # The console replays a recording: every node is one, whatever its link says.
    replayed: bool = False
    # The console's per-node file systems (checkpoints/filesystems.py), shared with the Checkpoints
    # pane; None: an action makes its own and closes it (headless).
    filesystems: Optional[Any] = None

    @property
    def local(self) -> bool:
        """Whether the node is this machine (commands run here, signals checked and sent by this process)."""
        return command_channel(self.link) == COMMANDS_HERE

    @property
    def frame_wait_s(self) -> float:
        """How long to wait for the frames that show an action's effect."""
        return max(5.0, 3 * self.config.console.interval + 2.0)


@dataclass(frozen=True)
class Plan:
    """A planned action: the exact command, where it runs, the pre-checks, and the word to type."""

    action: "Action"
    target: Target
    argv: Tuple[str, ...]
    where: str  # "on gpu-a01 over SSH", "on this machine (login node)"
    checks: Tuple["gpu_reset.Precheck", ...] = ()
    notes: Tuple[str, ...] = ()
    params: Tuple[Tuple[str, str], ...] = ()
    word: Optional[str] = None  # typed confirmation
    payload: Any = None  # what planning found that running needs (a cleanup's retention plan)

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    def param(self, name: str, default: str = "") -> str:
        return dict(self.params).get(name, default)


@dataclass(frozen=True)
class ActionReport:
    """What happened: overall ok, the lines to show (output, exit status, what the frames said)."""

    ok: bool
    title: str
    lines: Tuple[str, ...]
    outcomes: Tuple[ActionOutcome, ...] = ()
    output: str = ""  # the command's stdout and stderr, for the result screen


PlanFn = Callable[["Action", Target, ActionContext, Mapping[str, str]], Awaitable[Plan]]
RunFn = Callable[[Plan, ActionContext], Awaitable[ActionReport]]


@dataclass(frozen=True)
class Action:
    """One registered action."""

    id: str
    key: str
    label: str
    danger: str
    confirm: str
    target_kind: str
    description: str
    plan: PlanFn
    run: RunFn
    needs_reason: bool = False  # asks for a reason first (drain)
    available: Callable[[Config], Optional[str]] = field(default=lambda config: None)  # why not, or None
    binding: str = ""  # the key registry id when not `<target kind>.<id>`

    @property
    def binding_id(self) -> str:
        """The key registry id, e.g. `process.signal_int` (what `[console.keys]` remaps)."""
        return self.binding or "%s.%s" % (self.target_kind, self.id)

    @property
    def hidden_when_read_only(self) -> bool:
        return self.danger != DANGER_SAFE
