"""Config: TOML into validated frozen dataclasses; errors name file, line and key.

The dataclasses below are the contract the rest of the code reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple


@dataclass(frozen=True)
class ConsoleConfig:
    interval: float = 2.0  # seconds between polls
    theme: str = "opsconsole-dark"
    read_only: bool = False
    keys: Tuple[Tuple[str, str], ...] = ()  # (binding id, key) remaps from [console.keys]


@dataclass(frozen=True)
class NodeConfig:
    """One node. `local=True` is the machine the console runs on (no SSH)."""

    name: str
    host: Optional[str] = None  # hostname or ~/.ssh/config alias; None for local
    port: Optional[int] = None  # None: from ~/.ssh/config or 22
    user: Optional[str] = None
    identity: Optional[str] = None  # private key file
    jump: Optional[str] = None  # ProxyJump, "[user@]host[:port]"
    python: str = "python3"  # interpreter on the node
    local: bool = False


@dataclass(frozen=True)
class SshConfig:
    host_key_policy: str = "strict"  # "strict" or "accept-new"; checking is never off
    known_hosts: Optional[str] = None  # None: ~/.ssh/known_hosts
    max_logins: int = 8  # logins in flight at once (sshd MaxStartups drops beyond ~10)
    max_channels: int = 8  # per connection, under sshd MaxSessions (10)
    connect_timeout: float = 10.0
    keepalive_interval: float = 1.0
    keepalive_count_max: int = 3
    backoff_initial: float = 1.0
    backoff_max: float = 60.0


@dataclass(frozen=True)
class LogsConfig:
    paths: Tuple[str, ...] = ()  # globs


@dataclass(frozen=True)
class CheckpointDirConfig:
    path: str
    node: Optional[str] = None  # None: the local node


@dataclass(frozen=True)
class HealthConfig:
    gpu_temperature_c: float = 85.0
    disk_free_percent: float = 10.0
    memory_percent: float = 90.0
    disk_paths: Tuple[str, ...] = ("/",)


@dataclass(frozen=True)
class ActionsConfig:
    audit_log: Optional[str] = None  # None: $XDG_STATE_HOME/opsconsole/audit.log
    confirm: bool = True


@dataclass(frozen=True)
class Config:
    source: Optional[str] = None  # the file it came from; None for the built-in default
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    nodes: Tuple[NodeConfig, ...] = (NodeConfig(name="local", local=True),)
    ssh: SshConfig = field(default_factory=SshConfig)
    logs: LogsConfig = field(default_factory=LogsConfig)
    checkpoints: Tuple[CheckpointDirConfig, ...] = ()
    health: HealthConfig = field(default_factory=HealthConfig)
    actions: ActionsConfig = field(default_factory=ActionsConfig)


DEFAULT_CONFIG = Config()


class ConfigError(Exception):
    """A config problem, already formatted as one line: `file:line: key: message`."""
