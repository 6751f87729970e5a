"""The config schema, declared once: each section a frozen dataclass whose fields carry type, default and range.

These dataclasses are the contract the rest of the code reads, and the schema a file is validated
against (validate.py, by msgspec). Ranges and patterns are `Limits` in the types, which validate.py
turns into msgspec `Meta` constraints on the first file it reads; enums are Literal types. A field's
dataclass metadata says where the file spells it differently (`alias`, a `table` of free names, an
`argv` command as one string) and what validate.py and sections.py need for the messages
(`expects`, `example`) and for paths under ~ (`path`).
"""

# No `from __future__ import annotations`: msgspec reads these types as objects instead of compiling each string.
import os
from dataclasses import field, fields
from typing import Annotated, Any, Dict, Literal, Optional, Tuple, get_args

from opsconsole.alert_names import Comparison, MetricName, Severity
from opsconsole.model import frozen

# Bounds of the numeric settings: a floor where a tiny value would spin a loop (1e-300 s between
# polls), a ceiling where a huge one would overflow a timer or hold memory; all must be finite.
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 3600.0
MIN_POLL_S = 0.05  # a file poll or a reconnect back-off
MAX_TIMEOUT_S = 86400.0
MAX_AGE_S = 10 * 365 * 86400.0
MAX_RECORD_MB = 1_000_000.0


class Limits:
    """A setting's range or pattern, as msgspec's `Meta` takes them (ge, le, gt, pattern, extra).

    Not msgspec's own: a console started without a config file validates nothing, and importing
    msgspec (its compiled core, and the inspect and JSON-schema modules it loads) cost ~0.6 MB of
    its RSS on the VM. validate.py makes each one a msgspec `Meta` before the first file is checked."""

    __slots__ = ("constraints",)

    def __init__(self, **constraints: Any) -> None:
        self.constraints = constraints

    def __repr__(self) -> str:
        return "Limits(%s)" % ", ".join("%s=%r" % item for item in self.constraints.items())


def between(low: float, high: float) -> Limits:
    """The range a setting means ("must be between"), unlike a floor and a sanity ceiling."""
    return Limits(ge=low, le=high, extra={"between": True})


Text = Annotated[str, Limits(pattern=r"\S")]  # never blank
Words = Tuple[Text, ...]


def local_path(default: Any = None) -> Any:
    """A path on the console's machine, ~ for the user's home (sections.py); of a command, its program."""
    return field(default=default, metadata={"path": True})


def expand_home(path: str, home: Optional[str]) -> str:
    """A path as the user wrote it, ~ and ~/... under `home` (the environment's HOME, as given)."""
    if home and (path == "~" or path.startswith("~/")):
        return home + path[1:]
    return os.path.expanduser(path)


def argv(default: Tuple[str, ...]) -> Any:
    """A command as an array of words, or one string split like a shell (validate.py)."""
    return field(default=default, metadata={"argv": True})


def table(shape: str = "a table", *, expects: str = "") -> Any:
    """A TOML table of free names (binding ids, node names), kept as (name, value) pairs in file order.

    `shape` says what the table is when something else was written; `expects`, what each value is.
    """
    return field(default=(), metadata={"table": shape, "expects": expects})


HostKeyPolicy = Literal["strict", "accept-new"]  # checking is never off
HOST_KEY_POLICIES: Tuple[str, ...] = get_args(HostKeyPolicy)
Port = Annotated[int, between(1, 65535)]
Interval = Annotated[float, Limits(ge=MIN_INTERVAL_S, le=MAX_INTERVAL_S)]
Timeout = Annotated[float, Limits(gt=0, le=MAX_TIMEOUT_S)]
Percent = Annotated[float, between(0, 100)]


@frozen
class ConsoleConfig:
    """[console]: the poll interval, the theme, read-only, and the keys rebound."""

    interval: Interval = 2.0  # seconds between polls
    theme: Text = "opsconsole-dark"
    read_only: bool = False
    keys: Tuple[Tuple[str, Text], ...] = table(expects="a key string")  # (binding id, key) from [console.keys]


@frozen
class NodeConfig:
    """One node. `local=True` is the machine the console runs on (no SSH)."""

    name: Text
    host: Optional[Text] = None  # hostname or ~/.ssh/config alias; None for local
    port: Optional[Port] = None  # None: from ~/.ssh/config or 22
    user: Optional[Text] = None
    identity: Optional[Text] = local_path()  # private key file
    jump: Optional[Text] = None  # ProxyJump, "[user@]host[:port]"
    python: Text = "python3"  # interpreter on the node
    local: bool = False


@frozen
class NodeEntry:
    """One [[nodes]] table as written: `hosts` (a hostlist) makes one NodeConfig per host (sections.py)."""

    name: Optional[Text] = None  # default: the host's name, or "local"
    host: Optional[Text] = None
    # hostlist patterns; one string is read as an array of one
    hosts: Optional[Words] = field(default=None, metadata={"expects": "a hostlist string or an array of strings"})
    port: Optional[Port] = None
    user: Optional[Text] = None
    identity: Optional[Text] = local_path()
    jump: Optional[Text] = None
    python: Text = "python3"
    local: bool = False


@frozen
class SshConfig:
    """[ssh]: host key policy, login and channel limits, timeouts, keepalive and reconnect back-off."""

    host_key_policy: HostKeyPolicy = "strict"
    known_hosts: Optional[Text] = local_path()  # None: ~/.ssh/known_hosts
    max_logins: Annotated[int, Limits(ge=1, le=256)] = 8  # logins in flight at once (sshd MaxStartups drops beyond ~10)
    max_channels: Annotated[int, Limits(ge=1, le=64)] = 8  # per connection, under sshd MaxSessions (10)
    connect_timeout: Timeout = 10.0
    keepalive_interval: Interval = 1.0
    keepalive_count_max: Annotated[int, Limits(ge=1, le=100)] = 3
    backoff_initial: Annotated[float, Limits(ge=MIN_POLL_S, le=MAX_INTERVAL_S)] = 1.0
    backoff_max: Timeout = 60.0  # at least backoff_initial (sections.py)


@frozen
class LogsConfig:
    """[logs]: the log globs followed on every node and per node, and how they are polled and kept."""

    paths: Words = ()  # globs followed on every node
    node_paths: Tuple[Tuple[str, Words], ...] = table("a table of node name = [globs]")  # from [logs.node_paths]
    # seconds between looks at files without inotify (NFS) and remote files
    poll_interval: Annotated[float, Limits(ge=MIN_POLL_S, le=60.0)] = 0.25
    rescan_interval: Interval = 5.0  # seconds between globbing again for new files
    # seconds without a new line before a live run counts as stalled
    stall_after: Annotated[float, Limits(gt=0, le=30 * 86400.0)] = 600.0
    max_lines: Annotated[int, Limits(ge=100, le=10_000_000)] = 100_000  # lines kept in memory per source

    def globs_for(self, node: str) -> Tuple[str, ...]:
        """The globs followed on `node`: `paths` plus its own from [logs.node_paths]."""
        own = tuple(g for name, globs in self.node_paths if name == node for g in globs)
        return self.paths + tuple(g for g in own if g not in self.paths)


@frozen
class CheckpointDirConfig:
    """One [[checkpoints]] directory: where it is, on which node, and what cleanup keeps."""

    path: Text
    node: Optional[Text] = None  # None: the local node
    # cleanup keeps the newest `keep` (like CheckpointManager's max_to_keep), plus best and latest
    keep: Annotated[int, Limits(ge=0, le=1_000_000)] = 3
    # seconds: anything modified more recently is never deleted (it may be mid-write)
    min_age: Annotated[float, Limits(ge=0, le=MAX_AGE_S)] = 600.0


@frozen
class HealthConfig:
    """[health]: the thresholds of the health rules and the on-node GPU suite's limits."""

    gpu_temperature_c: Annotated[float, Limits(gt=0, le=200.0)] = 85.0
    disk_free_percent: Percent = 10.0
    memory_percent: Percent = 90.0
    disk_paths: Words = ("/",)
    temperature_margin_c: Annotated[float, Limits(ge=0, le=100.0)] = 5.0  # warn this close to the slowdown threshold
    swap_used_percent: Percent = 10.0  # swap in use above this share of swap
    iowait_percent: Percent = 20.0  # CPU time waiting on I/O above this: an I/O bottleneck
    gpu_idle_percent: Percent = 10.0  # GPU utilisation below this counts as idle
    # a training job's children using this much CPU in all are busy
    loader_busy_percent: Annotated[float, Limits(gt=0, le=100_000.0)] = 50.0
    gpu_test_memory_share: Annotated[float, between(0.001, 0.9)] = 0.25  # share of free GPU memory the test writes
    gpu_test_timeout_s: Timeout = 120.0  # the on-node GPU suite is stopped after this long


# Placeholders an action's argv template may use; each fills one argv word, never a shell line.
GPU_RESET_PLACEHOLDERS = ("index", "uuid", "pci_bus_id", "node")
DRAIN_PLACEHOLDERS = ("node", "reason")


@frozen
class ActionsConfig:
    """[actions]: the audit log, confirmations, and the argv templates and timeouts of actions."""

    audit_log: Optional[Text] = local_path()  # None: $XDG_STATE_HOME/opsconsole/audit.log
    confirm: bool = True
    # argv templates: each word is formatted on its own ({index} ...), never through a shell
    gpu_reset_command: Words = argv(("nvidia-smi", "--gpu-reset", "-i", "{index}"))
    drain_command: Words = argv(("scontrol", "update", "NodeName={node}", "State=DRAIN", "Reason={reason}"))
    signal_escalation_s: Timeout = 30.0  # after SIGINT (or SIGTERM), ask before the next signal
    command_timeout_s: Timeout = 120.0  # an action's command is stopped after this long
    gpu_tests_after_reset: bool = True  # after a GPU reset, run the GPU suite on that GPU too


@frozen
class HistoryConfig:
    """[history]: how many samples each GPU and node metric keeps."""

    size: Annotated[int, between(2, 100_000)] = 300  # samples kept per GPU and node metric (5 minutes at 1 s)


@frozen
class RecordConfig:
    """[record]: where the console's recordings go and how much of them is kept."""

    directory: Optional[Text] = local_path()  # where the console's record key writes; None: $XDG_STATE_HOME/opsconsole
    max_mb: Annotated[float, Limits(gt=0, le=MAX_RECORD_MB)] = 200.0  # oldest part dropped beyond this
    max_age_s: Optional[Annotated[float, Limits(gt=0, le=MAX_AGE_S)]] = None  # None: kept until max_mb
    chunk_s: Annotated[float, Limits(ge=1.0, le=60.0)] = 5.0


@frozen
class AlertRuleConfig:
    """One [[alerts]] rule: a metric compared with a threshold for a while, at a severity."""

    name: Text  # default (validate.py): "metric comparison threshold"
    metric: MetricName
    comparison: Comparison
    threshold: float
    for_s: Annotated[float, Limits(ge=0, le=7 * 86400.0)] = field(default=0.0, metadata={"alias": "for"})
    severity: Severity = "warning"
    clear: Optional[float] = None


@frozen
class AlertingConfig:
    """[alerting]: the built-in rules, and how an alert is told (bell, toast, hook command)."""

    builtin_rules: bool = True  # the seed's thresholds (temperature, disk, memory) and hard faults
    bell: bool = False
    toast: bool = True
    # argv of a command that gets each alert as JSON on stdin (its program: a local path)
    hook: Words = local_path(())
    hook_timeout_s: Annotated[float, Limits(gt=0, le=MAX_INTERVAL_S)] = 5.0


Telemetry = Literal["ssh", "prometheus"]
SourceKind = Literal["prometheus"]
PROMETHEUS_LABEL = r"^[A-Za-z_][A-Za-z0-9_]*$"


@frozen
class SourceConfig:
    """A telemetry source other than SSH: `kind = "prometheus"` reads a Prometheus server's API."""

    url: Annotated[str, Limits(pattern=r"^https?://[^/\s]+\S*$")] = field(
        metadata={"expects": "an http:// or https:// URL", "example": "http://prometheus:9090"}
    )
    kind: SourceKind = "prometheus"
    name: Text = "prometheus"  # default (sections.py): prometheus, prometheus-2, ... by position
    bearer_token_file: Optional[Text] = local_path()  # sent as "Authorization: Bearer ..."
    ca_file: Optional[Text] = local_path()  # CA bundle for https; verification is never off
    node_labels: Words = ("Hostname", "instance")  # first present names the node (instance: port dropped)
    gpu_label: Annotated[str, Limits(pattern=PROMETHEUS_LABEL)] = field(
        default="gpu", metadata={"expects": "a Prometheus label name"}
    )
    interval: Optional[Interval] = None  # None: console.interval
    timeout: Annotated[float, Limits(gt=0, le=MAX_INTERVAL_S)] = 10.0
    telemetry: Telemetry = "ssh"  # for a node also reached over SSH: whose frames to show
    nodes: Words = ()  # only these nodes (hostlists expanded); () = all
    selector: Optional[Text] = None  # extra label matchers for every query, e.g. 'cluster="a"'
    rate_window: Annotated[str, Limits(pattern=r"^([0-9]+(ms|s|m|h|d|w|y))+$")] = field(
        default="1m", metadata={"expects": 'a Prometheus duration like "1m" or "30s"'}
    )  # range of rate() over node-exporter counters
    slow_every: Annotated[int, Limits(ge=1, le=10_000)] = 6  # names, limits, ECC, file systems: every N refreshes
    stale_after: Optional[Timeout] = None  # None: 3 x max(scrape interval seen, interval) + 2 s
    # "ADDRESS_OR_NAME=NODE": names a host whose exporters say no usable name (see sources/node_identity.py).
    node_names: Words = ()


@frozen
class Config:
    """The whole config: every section, validated; `source` names the file it came from."""

    source: Optional[str] = None  # the file it came from; None for the built-in default
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    nodes: Tuple[NodeConfig, ...] = (NodeConfig(name="local", local=True),)
    ssh: SshConfig = field(default_factory=SshConfig)
    logs: LogsConfig = field(default_factory=LogsConfig)
    checkpoints: Tuple[CheckpointDirConfig, ...] = ()
    health: HealthConfig = field(default_factory=HealthConfig)
    actions: ActionsConfig = field(default_factory=ActionsConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    alerts: Tuple[AlertRuleConfig, ...] = ()
    alerting: AlertingConfig = field(default_factory=AlertingConfig)
    sources: Tuple[SourceConfig, ...] = ()


DEFAULT_CONFIG = Config()

# The file's sections: [table] or [[array of tables]], each validated as the class of one table.
TABLES: Dict[str, type] = {
    "console": ConsoleConfig,
    "ssh": SshConfig,
    "logs": LogsConfig,
    "health": HealthConfig,
    "actions": ActionsConfig,
    "history": HistoryConfig,
    "record": RecordConfig,
    "alerting": AlertingConfig,
}
ARRAYS_OF_TABLES: Dict[str, type] = {
    "nodes": NodeEntry,
    "checkpoints": CheckpointDirConfig,
    "alerts": AlertRuleConfig,
    "sources": SourceConfig,
}
ARRAY_SECTIONS = tuple(ARRAYS_OF_TABLES)

# Keys people write to switch a safety off: known, so that they get a pointed answer instead of "unknown key".
REFUSED_KEYS: Dict[Tuple[str, str], str] = {
    ("sources", "insecure_skip_verify"): 'TLS verification cannot be turned off; trust a private CA with "ca_file"',
}


def file_keys(cls: type) -> Tuple[str, ...]:
    """The keys a table of `cls` may hold, as the file spells them, in declaration order."""
    return tuple(f.metadata.get("alias", f.name) for f in fields(cls))


# Section name -> its keys, in the order Config declares the sections (unknown-key hints list them).
SECTIONS: Dict[str, Tuple[str, ...]] = {
    name: file_keys((TABLES.get(name) or ARRAYS_OF_TABLES[name]))
    + tuple(key for (section, key) in REFUSED_KEYS if section == name)
    for name in (f.name for f in fields(Config))
    if name != "source"
}
