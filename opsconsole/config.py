"""Config: TOML into validated frozen dataclasses; errors name file, line and key.

The dataclasses below are the contract the rest of the code reads.
"""

from __future__ import annotations

import ast
import difflib
import math
import os
import re
import shlex
import stat
import string
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Tuple, Union

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

from opsconsole.file_kinds import file_kind
from opsconsole.hostlist import expand_hostlist

# Bounds of the numeric settings: a floor where a tiny value would spin a loop (1e-300 s between
# polls), a ceiling where a huge one would overflow a timer or hold memory; all must be finite.
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 3600.0
MIN_POLL_S = 0.05  # a file poll or a reconnect back-off
MAX_TIMEOUT_S = 86400.0
MAX_AGE_S = 10 * 365 * 86400.0
MAX_RECORD_MB = 1_000_000.0


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
    paths: Tuple[str, ...] = ()  # globs followed on every node
    node_paths: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()  # (node name, globs) from [logs.node_paths]
    poll_interval: float = 0.25  # seconds between looks at files without inotify (NFS) and remote files
    rescan_interval: float = 5.0  # seconds between globbing again for new files
    stall_after: float = 600.0  # seconds without a new line before a live run counts as stalled
    max_lines: int = 100_000  # lines kept in memory per source

    def globs_for(self, node: str) -> Tuple[str, ...]:
        """The globs followed on `node`: `paths` plus its own from [logs.node_paths]."""
        own = tuple(g for name, globs in self.node_paths if name == node for g in globs)
        return self.paths + tuple(g for g in own if g not in self.paths)


@dataclass(frozen=True)
class CheckpointDirConfig:
    path: str
    node: Optional[str] = None  # None: the local node
    keep: int = 3  # cleanup keeps the newest `keep` (like CheckpointManager's max_to_keep), plus best and latest
    min_age: float = 600.0  # seconds: anything modified more recently is never deleted (it may be mid-write)


@dataclass(frozen=True)
class HealthConfig:
    gpu_temperature_c: float = 85.0
    disk_free_percent: float = 10.0
    memory_percent: float = 90.0
    disk_paths: Tuple[str, ...] = ("/",)
    temperature_margin_c: float = 5.0  # warn this close to the GPU's slowdown threshold
    swap_used_percent: float = 10.0  # swap in use above this share of swap
    iowait_percent: float = 20.0  # CPU time waiting on I/O above this: an I/O bottleneck
    gpu_idle_percent: float = 10.0  # GPU utilisation below this counts as idle
    loader_busy_percent: float = 50.0  # a training job's children using this much CPU in all are busy
    gpu_test_memory_share: float = 0.25  # share of free GPU memory the pattern test writes
    gpu_test_timeout_s: float = 120.0  # the on-node GPU suite is stopped after this long


# Placeholders an action's argv template may use; each fills one argv word, never a shell line.
GPU_RESET_PLACEHOLDERS = ("index", "uuid", "pci_bus_id", "node")
DRAIN_PLACEHOLDERS = ("node", "reason")


@dataclass(frozen=True)
class ActionsConfig:
    audit_log: Optional[str] = None  # None: $XDG_STATE_HOME/opsconsole/audit.log
    confirm: bool = True
    # argv templates: each word is formatted on its own ({index} ...), never through a shell
    gpu_reset_command: Tuple[str, ...] = ("nvidia-smi", "--gpu-reset", "-i", "{index}")
    drain_command: Tuple[str, ...] = ("scontrol", "update", "NodeName={node}", "State=DRAIN", "Reason={reason}")
    signal_escalation_s: float = 30.0  # after SIGINT (or SIGTERM), ask before the next signal
    command_timeout_s: float = 120.0  # an action's command is stopped after this long
    gpu_tests_after_reset: bool = True  # after a GPU reset, run the GPU suite on that GPU too


@dataclass(frozen=True)
class HistoryConfig:
    size: int = 300  # samples kept per GPU and node metric (5 minutes at 1 s)


@dataclass(frozen=True)
class RecordConfig:
    directory: Optional[str] = None  # where the console's record key writes; None: $XDG_STATE_HOME/opsconsole
    max_mb: float = 200.0  # oldest part dropped beyond this
    max_age_s: Optional[float] = None  # None: kept until max_mb
    chunk_s: float = 5.0


@dataclass(frozen=True)
class AlertRuleConfig:
    name: str
    metric: str
    comparison: str
    threshold: float
    for_s: float = 0.0
    severity: str = "warning"
    clear: Optional[float] = None


@dataclass(frozen=True)
class AlertingConfig:
    builtin_rules: bool = True  # the seed's thresholds (temperature, disk, memory) and hard faults
    bell: bool = False
    toast: bool = True
    hook: Tuple[str, ...] = ()  # argv of a command that gets each alert as JSON on stdin
    hook_timeout_s: float = 5.0


@dataclass(frozen=True)
class SourceConfig:
    """A telemetry source other than SSH: `kind = "prometheus"` reads a Prometheus server's API."""

    url: str
    kind: str = "prometheus"
    name: str = "prometheus"
    bearer_token_file: Optional[str] = None  # sent as "Authorization: Bearer ..."
    ca_file: Optional[str] = None  # CA bundle for https; verification is never off
    node_labels: Tuple[str, ...] = ("Hostname", "instance")  # first present names the node (instance: port dropped)
    gpu_label: str = "gpu"
    interval: Optional[float] = None  # None: console.interval
    timeout: float = 10.0
    telemetry: str = "ssh"  # for a node also reached over SSH: whose frames to show, "ssh" or "prometheus"
    nodes: Tuple[str, ...] = ()  # only these nodes (hostlists expanded); () = all
    selector: Optional[str] = None  # extra label matchers for every query, e.g. 'cluster="a"'
    rate_window: str = "1m"  # range of rate() over node-exporter counters
    slow_every: int = 6  # names, limits, ECC, file systems: every N refreshes
    stale_after: Optional[float] = None  # None: 3 x max(scrape interval seen, interval) + 2 s
    # "ADDRESS_OR_NAME=NODE": names a host whose exporters say no usable name (see sources/node_identity.py).
    node_names: Tuple[str, ...] = ()


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
    history: HistoryConfig = field(default_factory=HistoryConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    alerts: Tuple[AlertRuleConfig, ...] = ()
    alerting: AlertingConfig = field(default_factory=AlertingConfig)
    sources: Tuple[SourceConfig, ...] = ()


DEFAULT_CONFIG = Config()


class ConfigError(Exception):
    """A config problem, already formatted as one line: `file:line: key: message`."""

    def __init__(
        self,
        message: str,
        *,
        file: Optional[str] = None,
        line: Optional[int] = None,
        key: Optional[str] = None,
    ) -> None:
        self.message = message
        self.file = file
        self.line = line
        self.key = key
        head = []
        if file is not None:
            head.append(file if line is None else f"{file}:{line}")
        if key:
            head.append(key)
        super().__init__(_one_line(": ".join(head + [message])))


# --- finding and reading the file ------------------------------------------

ENV_CONFIG = "OPSCONSOLE_CONFIG"


def load_config(cli_path: Optional[str] = None, env: Mapping[str, str] = os.environ) -> Config:
    """Find, read and validate the config; DEFAULT_CONFIG when there is no file at all."""
    found = _locate_config(cli_path, env)
    if found is None:
        return DEFAULT_CONFIG
    shown, path = found
    data = _read_config_bytes(path, shown)
    try:
        text = data.decode("utf-8-sig")  # tolerate the BOM some editors write
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError("file is not UTF-8 text", file=shown, line=line, key="syntax") from None
    return parse_config(text, shown, home=env.get("HOME"))


MAX_CONFIG_BYTES = 1024 * 1024  # a config is a few kB; /dev/zero or a log given by mistake is refused


def _read_config_bytes(path: Path, shown: str) -> bytes:
    """The file's bytes, at most MAX_CONFIG_BYTES; a FIFO, device or directory is refused unopened.

    os.stat comes first (opening a FIFO would wait for a writer); the open is non-blocking and
    checked again with fstat, so a FIFO put there after the stat cannot hang the read either.
    """
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError("cannot read config: Is a directory", file=shown)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("cannot read config: not a regular file (%s)" % file_kind(info.st_mode), file=shown)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ConfigError("cannot read config: not a regular file", file=shown)
            chunks, size = [], 0
            while size <= MAX_CONFIG_BYTES:
                chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise ConfigError(f"cannot read config: {reason}", file=shown) from None
    if size > MAX_CONFIG_BYTES:
        raise ConfigError("cannot read config: larger than %d KiB" % (MAX_CONFIG_BYTES // 1024), file=shown)
    return b"".join(chunks)


def _locate_config(cli_path: Optional[str], env: Mapping[str, str]) -> Optional[Tuple[str, Path]]:
    # Returns (path as the user gave it, path to open). Explicit paths are returned even
    # when missing so that reading them fails loudly instead of falling back to defaults.
    home = env.get("HOME") or None
    if cli_path is not None:
        if not cli_path:
            raise ConfigError("cannot read config: --config was given an empty path")
        return cli_path, Path(_expand_home(cli_path, home))
    from_env = env.get(ENV_CONFIG)
    if from_env:
        return from_env, Path(_expand_home(from_env, home))
    xdg = env.get("XDG_CONFIG_HOME")
    # The XDG spec says to ignore a relative XDG_CONFIG_HOME.
    if xdg and os.path.isabs(xdg):
        base = Path(xdg)
    else:
        base = Path(_expand_home("~", home)) / ".config"
    path = base / "opsconsole" / "config.toml"
    if path.exists():
        return str(path), path
    return None


def _expand_home(path: str, home: Optional[str]) -> str:
    if home and (path == "~" or path.startswith("~/")):
        return home + path[1:]
    return os.path.expanduser(path)


# --- parsing ---------------------------------------------------------------


def parse_config(text: str, filename: str, *, home: Optional[str] = None) -> Config:
    """Parse and validate TOML text; `filename` is only used in error messages."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line, message = _syntax_error_position(exc, text)
        raise ConfigError(message, file=filename, line=line, key="syntax") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError("arrays or tables nested too deep", file=filename, key="syntax") from None
    except ValueError:  # not a TOMLDecodeError: an integer of more than 4300 digits
        raise ConfigError("invalid value: a number too long to read", file=filename, key="syntax") from None
    try:
        checker = _Checker(filename, _KeyLines(text), home)
        return checker.config(data)
    except RecursionError:
        raise ConfigError("arrays or tables nested too deep", file=filename, key="syntax") from None


def _syntax_error_position(exc: Exception, text: str) -> Tuple[int, str]:
    """Turn tomllib's "msg (at line X, column Y)" into (X, "msg (column Y)")."""
    raw = str(exc)
    line = getattr(exc, "lineno", None)  # Python 3.14 has these attributes
    column = getattr(exc, "colno", None)
    message = getattr(exc, "msg", None)
    if message is None:
        match = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", raw, re.S)
        if match:
            message, line, column = match.group(1), int(match.group(2)), int(match.group(3))
        else:
            match = re.fullmatch(r"(.*) \(at end of document\)", raw, re.S)
            message = match.group(1) if match else raw
    if line is None:
        line = max(1, len(text.splitlines()))
    message = _tidy_toml_message(message)
    if column is not None:
        message += f" (column {column})"
    return int(line), message


def _tidy_toml_message(message: str) -> str:
    # "Cannot declare ('console', 'keys') twice" reads better as "[console.keys]".
    def table_name(match: "re.Match[str]") -> str:
        try:
            parts = ast.literal_eval(match.group(1))
        except (ValueError, SyntaxError):
            return match.group(0)
        if isinstance(parts, str):
            parts = (parts,)
        return "[" + _format_path(tuple(parts)) + "]"

    message = re.sub(r"(\((?:'[^']*'(?:, )?)+,?\))", table_name, message)
    if len(message) > 1 and message[0].isupper() and message[1].islower():
        message = message[0].lower() + message[1:]
    return message


# --- the key locator: which line a key path was written on ------------------

KeyPath = Tuple[Union[str, int], ...]


class _KeyLines:
    """Map key paths like ("nodes", 2, "port") to the line they were written on.

    tomllib keeps no positions, so this scans the (already valid) TOML text:
    table headers, arrays of tables (the Nth [[nodes]] is nodes[N-1]), key = value
    lines, dotted keys, inline tables and array elements. A surprise in the text
    stops the scan; what was found so far is kept and lookups fall back to the
    nearest enclosing table, then line 1.
    """

    def __init__(self, text: str) -> None:
        self.lines: Dict[KeyPath, int] = {}
        self._text = text
        self._pos = 0
        self._line = 1
        self._array_counts: Dict[KeyPath, int] = {}
        try:
            self._scan_document()
        except (_ScanStop, RecursionError):  # deep nesting: lines found so far are kept
            pass

    def line_of(self, path: KeyPath) -> int:
        """Return the line of `path`, else of its nearest enclosing table, else 1."""
        for end in range(len(path), 0, -1):
            line = self.lines.get(tuple(path[:end]))
            if line is not None:
                return line
        return 1

    # scanning helpers

    def _peek(self, count: int = 1) -> str:
        return self._text[self._pos : self._pos + count]

    def _advance_to(self, end: int) -> None:
        if end <= self._pos:
            raise _ScanStop()
        self._line += self._text.count("\n", self._pos, end)
        self._pos = end

    def _skip(self, newlines: bool) -> None:
        text, pos = self._text, self._pos
        while pos < len(text):
            ch = text[pos]
            if ch in " \t":
                pos += 1
            elif newlines and ch in "\r\n":
                pos += 1
            elif newlines and ch == "#":
                end = text.find("\n", pos)
                pos = len(text) if end < 0 else end
            else:
                break
        if pos > self._pos:
            self._advance_to(pos)

    def _expect(self, token: str) -> None:
        if not self._text.startswith(token, self._pos):
            raise _ScanStop()
        self._advance_to(self._pos + len(token))

    def _record(self, path: KeyPath, line: int) -> None:
        for end in range(1, len(path) + 1):
            self.lines.setdefault(tuple(path[:end]), line)

    # grammar

    def _scan_document(self) -> None:
        table: KeyPath = ()
        while True:
            self._skip(newlines=True)
            if self._pos >= len(self._text):
                return
            line = self._line
            if self._peek(2) == "[[":
                self._advance_to(self._pos + 2)
                table = self._array_header(line)
                self._skip(newlines=False)
                self._expect("]]")
            elif self._peek() == "[":
                self._advance_to(self._pos + 1)
                table = self._resolve(self._key())
                self._record(table, line)
                self._skip(newlines=False)
                self._expect("]")
            else:
                self._key_value(table)

    def _array_header(self, line: int) -> KeyPath:
        parts = self._key()
        whole = self._resolve(parts[:-1]) + (parts[-1],)
        index = self._array_counts.get(whole, 0)
        self._array_counts[whole] = index + 1
        path = whole + (index,)
        self._record(path, line)
        return path

    def _resolve(self, parts: Tuple[str, ...]) -> KeyPath:
        # [nodes.sub] after [[nodes]] means the latest nodes entry.
        path: KeyPath = ()
        for part in parts:
            path = path + (part,)
            count = self._array_counts.get(path)
            if count:
                path = path + (count - 1,)
        return path

    def _key_value(self, table: KeyPath) -> None:
        line = self._line
        path = table + self._key()
        self._record(path, line)
        self._skip(newlines=False)
        self._expect("=")
        self._skip(newlines=False)
        self._value(path)

    def _key(self) -> Tuple[str, ...]:
        parts: List[str] = []
        while True:
            self._skip(newlines=False)
            ch = self._peek()
            if ch in ('"', "'"):
                start = self._pos
                self._string_end()
                raw = self._text[start : self._pos]
                parts.append(tomllib.loads(f"k = {raw}")["k"])
            else:
                match = re.compile(r"[A-Za-z0-9_-]+").match(self._text, self._pos)
                if not match:
                    raise _ScanStop()
                parts.append(match.group(0))
                self._advance_to(match.end())
            self._skip(newlines=False)
            if self._peek() != ".":
                return tuple(parts)
            self._advance_to(self._pos + 1)

    def _value(self, path: KeyPath) -> None:
        ch = self._peek()
        if ch in ('"', "'"):
            self._string_end()
        elif ch == "[":
            self._array(path)
        elif ch == "{":
            self._inline_table(path)
        else:
            match = re.compile(r"[^,\]}\r\n#]+").match(self._text, self._pos)
            if not match:
                raise _ScanStop()
            self._advance_to(match.end())

    def _string_end(self) -> None:
        text, pos = self._text, self._pos
        for quote in ('"""', "'''"):
            if text.startswith(quote, pos):
                end = pos + 3
                while True:
                    if quote == '"""' and text.startswith("\\", end):
                        end += 2
                        continue
                    if text.startswith(quote, end):
                        break
                    if end >= len(text):
                        raise _ScanStop()
                    end += 1
                end += 3
                for _ in range(2):  # up to two quotes may end the content: """a"""""
                    if text.startswith(quote[0], end):
                        end += 1
                self._advance_to(end)
                return
        quote = text[pos]
        end = pos + 1
        while end < len(text) and text[end] != quote:
            end += 2 if quote == '"' and text[end] == "\\" else 1
        if end >= len(text):
            raise _ScanStop()
        self._advance_to(end + 1)

    def _array(self, path: KeyPath) -> None:
        self._advance_to(self._pos + 1)
        index = 0
        while True:
            self._skip(newlines=True)
            if self._peek() == "]":
                self._advance_to(self._pos + 1)
                return
            self._record(path + (index,), self._line)
            self._value(path + (index,))
            index += 1
            self._skip(newlines=True)
            if self._peek() == ",":
                self._advance_to(self._pos + 1)

    def _inline_table(self, path: KeyPath) -> None:
        self._advance_to(self._pos + 1)
        while True:
            self._skip(newlines=True)
            if self._peek() == "}":
                self._advance_to(self._pos + 1)
                return
            self._key_value(path)
            self._skip(newlines=True)
            if self._peek() == ",":
                self._advance_to(self._pos + 1)


class _ScanStop(Exception):
    """The locator met text it does not follow; it keeps what it found."""


# --- validation ------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_MISSING = object()

SECTIONS: Dict[str, Tuple[str, ...]] = {
    "console": ("interval", "theme", "read_only", "keys"),
    "nodes": ("name", "host", "hosts", "port", "user", "identity", "jump", "python", "local"),
    "ssh": (
        "host_key_policy",
        "known_hosts",
        "max_logins",
        "max_channels",
        "connect_timeout",
        "keepalive_interval",
        "keepalive_count_max",
        "backoff_initial",
        "backoff_max",
    ),
    "logs": ("paths", "node_paths", "poll_interval", "rescan_interval", "stall_after", "max_lines"),
    "checkpoints": ("path", "node", "keep", "min_age"),
    "health": (
        "gpu_temperature_c",
        "disk_free_percent",
        "memory_percent",
        "disk_paths",
        "temperature_margin_c",
        "swap_used_percent",
        "iowait_percent",
        "gpu_idle_percent",
        "loader_busy_percent",
        "gpu_test_memory_share",
        "gpu_test_timeout_s",
    ),
    "actions": (
        "audit_log",
        "confirm",
        "gpu_reset_command",
        "drain_command",
        "signal_escalation_s",
        "command_timeout_s",
        "gpu_tests_after_reset",
    ),
    "history": ("size",),
    "record": ("directory", "max_mb", "max_age_s", "chunk_s"),
    "alerts": ("name", "metric", "comparison", "threshold", "for", "severity", "clear"),
    "alerting": ("builtin_rules", "bell", "toast", "hook", "hook_timeout_s"),
    "sources": (
        "kind",
        "name",
        "url",
        "bearer_token_file",
        "ca_file",
        "node_labels",
        "gpu_label",
        "interval",
        "timeout",
        "telemetry",
        "nodes",
        "selector",
        "rate_window",
        "slow_every",
        "stale_after",
        "node_names",
        "insecure_skip_verify",
    ),
}
ARRAY_SECTIONS = ("nodes", "checkpoints", "alerts", "sources")  # written as [[nodes]], [[checkpoints]], [[alerts]]
HOST_KEY_POLICIES = ("strict", "accept-new")
# Values people try in order to switch checking off; they get a pointed answer.
_CHECKING_OFF_WORDS = {
    "off",
    "no",
    "none",
    "false",
    "0",
    "disable",
    "disabled",
    "ignore",
    "insecure",
    "skip",
    "accept",
    "accept-any",
    "accept-all",
    "auto-add",
    "autoadd",
}


class _Checker:
    """Validate parsed TOML into a Config, raising ConfigError at the first problem."""

    def __init__(self, filename: str, lines: _KeyLines, home: Optional[str]) -> None:
        self.filename = filename
        self.lines = lines
        self.home = home

    def fail(self, path: KeyPath, message: str) -> NoReturn:
        raise ConfigError(message, file=self.filename, line=self.lines.line_of(path), key=_format_path(path))

    # whole file

    def config(self, data: Dict[str, Any]) -> Config:
        for name, value in data.items():
            if name not in SECTIONS:
                self.unknown_top_level(name, value)
        parts: Dict[str, Any] = {}
        for name, value in data.items():
            parts[name] = getattr(self, "section_" + name)(value)
        if parts.get("sources") and "nodes" not in parts:
            parts["nodes"] = ()  # the fleet comes from the sources: no implicit local node
        nodes = parts.get("nodes", DEFAULT_CONFIG.nodes)
        checkpoints = parts.get("checkpoints", ())
        self.check_checkpoint_nodes(checkpoints, nodes)
        # Each section's parser returns its Config field (same name); absent sections keep the default.
        return replace(DEFAULT_CONFIG, source=self.filename, **parts)

    def unknown_top_level(self, name: str, value: Any) -> NoReturn:
        path = (name,)
        if isinstance(value, dict) or (isinstance(value, list) and value and all(isinstance(v, dict) for v in value)):
            self.fail(path, "unknown section" + _suggest(name, SECTIONS))
        owners = [section for section, keys in SECTIONS.items() if name in keys]
        if owners:
            where = f"[[{owners[0]}]]" if owners[0] in ARRAY_SECTIONS else f"[{owners[0]}]"
            self.fail(path, f"unknown top-level key; it belongs under {where}")
        self.fail(path, "unknown top-level key" + _suggest(name, SECTIONS))

    def table(self, value: Any, path: KeyPath, section: str) -> Dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, f"expected a table, got {_show(value)}")
        allowed = SECTIONS[section]
        for key in value:
            if key not in allowed:
                self.fail(path + (key,), "unknown key" + _suggest(key, allowed))
        return value

    def array_of_tables(self, value: Any, path: KeyPath) -> List[Dict[str, Any]]:
        name = path[-1]
        if not isinstance(value, list):
            self.fail(path, f"expected an array of tables ([[{name}]]), got {_show(value)}")
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                self.fail(path + (index,), f"expected a table, got {_show(item)}")
        return value

    # sections

    def section_console(self, value: Any) -> ConsoleConfig:
        path: KeyPath = ("console",)
        table = self.table(value, path, "console")
        default = ConsoleConfig()
        return ConsoleConfig(
            interval=self.number(table, path, "interval", default.interval, low=MIN_INTERVAL_S, most=MAX_INTERVAL_S),
            theme=self.string(table, path, "theme", default.theme),
            read_only=self.boolean(table, path, "read_only", default.read_only),
            keys=self.key_bindings(table.get("keys", _MISSING), path + ("keys",)),
        )

    def key_bindings(self, value: Any, path: KeyPath) -> Tuple[Tuple[str, str], ...]:
        if value is _MISSING:
            return ()
        if not isinstance(value, dict):
            self.fail(path, f"expected a table, got {_show(value)}")
        pairs = []
        for binding, key in value.items():
            if not isinstance(key, str):
                self.fail(path + (binding,), f"expected a key string, got {_show(key)}")
            if not key.strip():
                self.fail(path + (binding,), "expected a key string, got an empty string")
            pairs.append((binding, key))
        return tuple(pairs)

    def section_ssh(self, value: Any) -> SshConfig:
        path: KeyPath = ("ssh",)
        table = self.table(value, path, "ssh")
        d = SshConfig()
        known_hosts = self.string(table, path, "known_hosts", None)
        backoff_initial = self.number(
            table, path, "backoff_initial", d.backoff_initial, low=MIN_POLL_S, most=MAX_INTERVAL_S
        )
        backoff_max = self.number(table, path, "backoff_max", d.backoff_max, above=0, most=MAX_TIMEOUT_S)
        if backoff_max < backoff_initial:
            self.fail(
                path + ("backoff_max",),
                "must be at least backoff_initial"
                f" ({_show(table.get('backoff_initial', backoff_initial))}), got {_show(table['backoff_max'])}",
            )
        return SshConfig(
            host_key_policy=self.host_key_policy(table, path),
            known_hosts=None if known_hosts is None else self.expand(known_hosts),
            max_logins=self.integer(table, path, "max_logins", d.max_logins, low=1, most=256),
            max_channels=self.integer(table, path, "max_channels", d.max_channels, low=1, most=64),
            connect_timeout=self.number(table, path, "connect_timeout", d.connect_timeout, above=0, most=MAX_TIMEOUT_S),
            keepalive_interval=self.number(
                table, path, "keepalive_interval", d.keepalive_interval, low=MIN_INTERVAL_S, most=MAX_INTERVAL_S
            ),
            keepalive_count_max=self.integer(
                table, path, "keepalive_count_max", d.keepalive_count_max, low=1, most=100
            ),
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
        )

    def host_key_policy(self, table: Dict[str, Any], path: KeyPath) -> str:
        key_path = path + ("host_key_policy",)
        value = table.get("host_key_policy", SshConfig().host_key_policy)
        choices = 'use "strict" or "accept-new"'
        if value is False or (isinstance(value, str) and value.strip().lower() in _CHECKING_OFF_WORDS):
            self.fail(key_path, f"host key checking cannot be disabled; {choices}")
        if not isinstance(value, str):
            self.fail(key_path, f'expected "strict" or "accept-new", got {_show(value)}')
        if value not in HOST_KEY_POLICIES:
            self.fail(
                key_path,
                f'expected "strict" or "accept-new", got {_show(value)}' + _suggest(value, HOST_KEY_POLICIES),
            )
        return value

    def section_nodes(self, value: Any) -> Tuple[NodeConfig, ...]:
        path: KeyPath = ("nodes",)
        entries = self.array_of_tables(value, path)
        if not entries:
            self.fail(path, "expected at least one node (leave [[nodes]] out for the local node)")
        nodes: List[NodeConfig] = []
        first_seen: Dict[str, KeyPath] = {}  # node name -> path of the entry that made it
        local_entry: Optional[KeyPath] = None
        for index, entry in enumerate(entries):
            entry_path = path + (index,)
            self.table(entry, entry_path, "nodes")
            made = self.node_entry(entry, entry_path)
            if made[0].local:
                if local_entry is not None:
                    self.fail(
                        entry_path + ("local",),
                        f"only one node can be local; {_format_path(local_entry)} already is",
                    )
                local_entry = entry_path
            name_path = entry_path + (self.name_source(entry),)
            for node in made:
                if node.name in first_seen:
                    where = first_seen[node.name]
                    if where == entry_path:
                        self.fail(name_path, f"hostlist names {_quote(node.name)} twice")
                    self.fail(
                        name_path,
                        f"duplicate node name {_quote(node.name)}; first defined by {_format_path(where)}",
                    )
                first_seen[node.name] = entry_path
                nodes.append(node)
        return tuple(nodes)

    @staticmethod
    def name_source(entry: Dict[str, Any]) -> str:
        for key in ("name", "hosts", "host", "local"):
            if key in entry:
                return key
        return "name"

    def node_entry(self, entry: Dict[str, Any], path: KeyPath) -> List[NodeConfig]:
        name = self.string(entry, path, "name", None)
        host = self.string(entry, path, "host", None)
        local = self.boolean(entry, path, "local", False)
        port = self.integer(entry, path, "port", None, low=1, high=65535)
        user = self.string(entry, path, "user", None)
        identity = self.string(entry, path, "identity", None)
        jump = self.string(entry, path, "jump", None)
        python = self.string(entry, path, "python", "python3")
        hosts = self.host_patterns(entry, path)
        if hosts is not None and name is not None:
            self.fail(
                path + ("hosts",),
                '"name" and "hosts" cannot be used together; each host of "hosts" is named after itself',
            )
        if hosts is not None and host is not None:
            self.fail(path + ("hosts",), '"host" and "hosts" cannot be used together')
        if host is not None:
            if re.search(r"\s", host):
                self.fail(path + ("host",), f"host names cannot contain whitespace, got {_show(host)}")
            if re.search(r"[\[\],]", host):
                self.fail(path + ("host",), f'{_show(host)} looks like a hostlist; use "hosts" for patterns')
        if local:
            if host is not None or hosts is not None:
                used = "host" if host is not None else "hosts"
                self.fail(path + ("local",), f'a local node has no host; remove "{used}" or "local"')
            for key in ("port", "user", "identity", "jump"):
                if key in entry:
                    self.fail(path + (key,), "not used by a local node (it is reached without SSH)")
            return [NodeConfig(name=name or "local", python=python, local=True)]
        if host is None and hosts is None:
            self.fail(path, 'a node needs "host", "hosts" or "local = true"')
        shared = dict(
            port=port,
            user=user,
            identity=None if identity is None else self.expand(identity),
            jump=jump,
            python=python,
        )
        if hosts is not None:
            return [NodeConfig(name=h, host=h, **shared) for h in hosts]
        return [NodeConfig(name=name if name is not None else host, host=host, **shared)]

    def host_patterns(self, entry: Dict[str, Any], path: KeyPath) -> Optional[List[str]]:
        if "hosts" not in entry:
            return None
        value = entry["hosts"]
        key_path = path + ("hosts",)
        patterns = value if isinstance(value, list) else [value]
        if not patterns or not all(isinstance(p, str) for p in patterns):
            self.fail(key_path, f"expected a hostlist string or an array of strings, got {_show(value)}")
        hosts: List[str] = []
        for pattern in patterns:
            try:
                hosts.extend(expand_hostlist(pattern, allow_duplicates=True))
            except ValueError as exc:
                self.fail(key_path, str(exc))
        return hosts

    def section_logs(self, value: Any) -> LogsConfig:
        path: KeyPath = ("logs",)
        table = self.table(value, path, "logs")
        d = LogsConfig()
        node_paths = []
        per_node = table.get("node_paths", {})
        if not isinstance(per_node, dict):
            self.fail(path + ("node_paths",), "must be a table of node name = [globs]")
        for name in per_node:
            node_paths.append((name, self.strings(per_node, path + ("node_paths",), name, ())))
        return LogsConfig(
            paths=self.strings(table, path, "paths", ()),
            node_paths=tuple(node_paths),
            poll_interval=self.number(table, path, "poll_interval", d.poll_interval, low=MIN_POLL_S, most=60.0),
            rescan_interval=self.number(
                table, path, "rescan_interval", d.rescan_interval, low=MIN_INTERVAL_S, most=MAX_INTERVAL_S
            ),
            stall_after=self.number(table, path, "stall_after", d.stall_after, above=0, most=30 * 86400.0),
            max_lines=self.integer(table, path, "max_lines", d.max_lines, low=100, most=10_000_000),
        )

    def section_checkpoints(self, value: Any) -> Tuple[CheckpointDirConfig, ...]:
        path: KeyPath = ("checkpoints",)
        dirs = []
        for index, entry in enumerate(self.array_of_tables(value, path)):
            entry_path = path + (index,)
            self.table(entry, entry_path, "checkpoints")
            if "path" not in entry:
                self.fail(entry_path, 'missing required key "path"')
            dirs.append(
                CheckpointDirConfig(
                    path=self.string(entry, entry_path, "path", None),
                    node=self.string(entry, entry_path, "node", None),
                    keep=self.integer(entry, entry_path, "keep", CheckpointDirConfig.keep, low=0, most=1_000_000),
                    min_age=self.number(
                        entry, entry_path, "min_age", CheckpointDirConfig.min_age, low=0, most=MAX_AGE_S
                    ),
                )
            )
        return tuple(dirs)

    def check_checkpoint_nodes(self, dirs: Tuple[CheckpointDirConfig, ...], nodes: Tuple[NodeConfig, ...]) -> None:
        """Check that each checkpoint directory names a configured node."""
        names = [node.name for node in nodes]
        for index, entry in enumerate(dirs):
            if entry.node is not None and entry.node not in names:
                self.fail(
                    ("checkpoints", index, "node"),
                    f"no node is named {_quote(entry.node)}" + _suggest(entry.node, names),
                )

    def section_health(self, value: Any) -> HealthConfig:
        path: KeyPath = ("health",)
        table = self.table(value, path, "health")
        d = HealthConfig()
        return HealthConfig(
            gpu_temperature_c=self.number(table, path, "gpu_temperature_c", d.gpu_temperature_c, above=0, most=200.0),
            disk_free_percent=self.number(table, path, "disk_free_percent", d.disk_free_percent, low=0, high=100),
            memory_percent=self.number(table, path, "memory_percent", d.memory_percent, low=0, high=100),
            disk_paths=self.strings(table, path, "disk_paths", d.disk_paths),
            temperature_margin_c=self.number(
                table, path, "temperature_margin_c", d.temperature_margin_c, low=0, most=100.0
            ),
            swap_used_percent=self.number(table, path, "swap_used_percent", d.swap_used_percent, low=0, high=100),
            iowait_percent=self.number(table, path, "iowait_percent", d.iowait_percent, low=0, high=100),
            gpu_idle_percent=self.number(table, path, "gpu_idle_percent", d.gpu_idle_percent, low=0, high=100),
            loader_busy_percent=self.number(
                table, path, "loader_busy_percent", d.loader_busy_percent, above=0, most=100_000.0
            ),
            gpu_test_memory_share=self.number(
                table, path, "gpu_test_memory_share", d.gpu_test_memory_share, low=0.001, high=0.9
            ),
            gpu_test_timeout_s=self.number(
                table, path, "gpu_test_timeout_s", d.gpu_test_timeout_s, above=0, most=MAX_TIMEOUT_S
            ),
        )

    def section_actions(self, value: Any) -> ActionsConfig:
        path: KeyPath = ("actions",)
        table = self.table(value, path, "actions")
        audit_log = self.string(table, path, "audit_log", None)
        d = ActionsConfig()
        return ActionsConfig(
            audit_log=None if audit_log is None else self.expand(audit_log),
            confirm=self.boolean(table, path, "confirm", d.confirm),
            gpu_reset_command=self.argv_template(
                table, path, "gpu_reset_command", d.gpu_reset_command, GPU_RESET_PLACEHOLDERS
            ),
            drain_command=self.argv_template(table, path, "drain_command", d.drain_command, DRAIN_PLACEHOLDERS),
            signal_escalation_s=self.number(
                table, path, "signal_escalation_s", d.signal_escalation_s, above=0, most=MAX_TIMEOUT_S
            ),
            command_timeout_s=self.number(
                table, path, "command_timeout_s", d.command_timeout_s, above=0, most=MAX_TIMEOUT_S
            ),
            gpu_tests_after_reset=self.boolean(table, path, "gpu_tests_after_reset", d.gpu_tests_after_reset),
        )

    def argv_template(
        self, table: Dict[str, Any], path: KeyPath, key: str, default: Tuple[str, ...], placeholders: Tuple[str, ...]
    ) -> Tuple[str, ...]:
        """An argv template: an array of words (or one string split as a shell would), {name} per word."""
        if key not in table:
            return default
        value = table[key]
        if isinstance(value, str):
            try:
                words = tuple(shlex.split(value))
            except ValueError as exc:
                self.fail(path + (key,), "cannot split the command: %s" % exc)
        else:
            words = self.strings(table, path, key, default)
        if not words:
            self.fail(path + (key,), "expected a command, got an empty one")
        for word in words:
            try:
                fields = [name for _, name, spec, conv in string.Formatter().parse(word) if name is not None]
            except ValueError as exc:
                self.fail(path + (key,), "bad placeholder in %s: %s (write {{ and }} for braces)" % (_show(word), exc))
            for name in fields:
                if name not in placeholders:
                    self.fail(
                        path + (key,),
                        "unknown placeholder {%s}; use %s" % (name, ", ".join("{%s}" % p for p in placeholders)),
                    )
        if "{" in words[0]:
            self.fail(path + (key,), "the program (first word) cannot be a placeholder")
        return words

    def section_history(self, value: Any) -> HistoryConfig:
        path: KeyPath = ("history",)
        table = self.table(value, path, "history")
        return HistoryConfig(size=self.integer(table, path, "size", HistoryConfig().size, low=2, high=100_000))

    def section_record(self, value: Any) -> RecordConfig:
        path: KeyPath = ("record",)
        table = self.table(value, path, "record")
        d = RecordConfig()
        directory = self.string(table, path, "directory", None)
        max_age = self.number(table, path, "max_age_s", -1.0, above=0, most=MAX_AGE_S) if "max_age_s" in table else None
        return RecordConfig(
            directory=None if directory is None else self.expand(directory),
            max_mb=self.number(table, path, "max_mb", d.max_mb, above=0, most=MAX_RECORD_MB),
            max_age_s=max_age,
            chunk_s=self.number(table, path, "chunk_s", d.chunk_s, low=1.0, most=60.0),
        )

    def section_alerts(self, value: Any) -> Tuple[AlertRuleConfig, ...]:
        from opsconsole.alert_names import COMPARISONS, METRICS, SEVERITIES

        path: KeyPath = ("alerts",)
        rules: List[AlertRuleConfig] = []
        names: Dict[str, int] = {}
        for index, entry in enumerate(self.array_of_tables(value, path)):
            entry_path = path + (index,)
            self.table(entry, entry_path, "alerts")
            for key in ("metric", "comparison", "threshold"):
                if key not in entry:
                    self.fail(entry_path, 'missing required key "%s"' % key)
            metric = self.string(entry, entry_path, "metric", None)
            if metric not in METRICS:
                self.fail(entry_path + ("metric",), "unknown metric %s" % _show(metric) + _suggest(metric, METRICS))
            comparison = self.string(entry, entry_path, "comparison", None)
            if comparison not in COMPARISONS:
                self.fail(
                    entry_path + ("comparison",),
                    "expected one of %s, got %s" % (" ".join(COMPARISONS), _show(comparison)),
                )
            severity = self.string(entry, entry_path, "severity", "warning")
            if severity not in SEVERITIES:
                self.fail(
                    entry_path + ("severity",),
                    "expected %s, got %s" % (", ".join(SEVERITIES), _show(severity)) + _suggest(severity, SEVERITIES),
                )
            name = self.string(entry, entry_path, "name", "%s %s %s" % (metric, comparison, entry["threshold"]))
            if name in names:
                self.fail(
                    entry_path + ("name",),
                    "duplicate alert name %s; first used by alerts[%d]" % (_quote(name), names[name]),
                )
            names[name] = index
            clear = self.number(entry, entry_path, "clear", 0.0) if "clear" in entry else None
            rules.append(
                AlertRuleConfig(
                    name=name,
                    metric=metric,
                    comparison=comparison,
                    threshold=self.number(entry, entry_path, "threshold", 0.0),
                    for_s=self.number(entry, entry_path, "for", 0.0, low=0, most=7 * 86400.0),
                    severity=severity,
                    clear=clear,
                )
            )
        return tuple(rules)

    def section_alerting(self, value: Any) -> AlertingConfig:
        path: KeyPath = ("alerting",)
        table = self.table(value, path, "alerting")
        d = AlertingConfig()
        hook = self.strings(table, path, "hook", d.hook)
        return AlertingConfig(
            builtin_rules=self.boolean(table, path, "builtin_rules", d.builtin_rules),
            bell=self.boolean(table, path, "bell", d.bell),
            toast=self.boolean(table, path, "toast", d.toast),
            hook=tuple(self.expand(hook[0]) for _ in hook[:1]) + tuple(hook[1:]),
            hook_timeout_s=self.number(table, path, "hook_timeout_s", d.hook_timeout_s, above=0, most=MAX_INTERVAL_S),
        )

    def section_sources(self, value: Any) -> Tuple[SourceConfig, ...]:
        """[[sources]]: telemetry read from a Prometheus server (issue 8)."""
        path: KeyPath = ("sources",)
        sources: List[SourceConfig] = []
        seen: Dict[str, int] = {}
        for index, entry in enumerate(self.array_of_tables(value, path)):
            entry_path = path + (index,)
            self.table(entry, entry_path, "sources")
            kind = self.string(entry, entry_path, "kind", "prometheus")
            if kind != "prometheus":
                self.fail(
                    entry_path + ("kind",),
                    'expected "prometheus", got %s' % _show(kind) + _suggest(kind, ("prometheus",)),
                )
            if "insecure_skip_verify" in entry:
                self.fail(
                    entry_path + ("insecure_skip_verify",),
                    'TLS verification cannot be turned off; trust a private CA with "ca_file"',
                )
            if "url" not in entry:
                self.fail(entry_path, 'missing required key "url" (e.g. "http://prometheus:9090")')
            url = self.string(entry, entry_path, "url", None)
            if not re.match(r"^https?://[^/\s]+", url) or re.search(r"\s", url):
                self.fail(entry_path + ("url",), "expected an http:// or https:// URL, got %s" % _show(url))
            name = self.string(entry, entry_path, "name", "prometheus" if index == 0 else "prometheus-%d" % (index + 1))
            if name in seen:
                self.fail(
                    entry_path + ("name",),
                    "duplicate source name %s; first used by sources[%d]" % (_quote(name), seen[name]),
                )
            seen[name] = index
            token = self.string(entry, entry_path, "bearer_token_file", None)
            ca_file = self.string(entry, entry_path, "ca_file", None)
            if ca_file is not None and url.startswith("http://"):
                self.fail(entry_path + ("ca_file",), "a CA file is only used with an https:// url")
            d = SourceConfig(url=url)
            labels = self.strings(entry, entry_path, "node_labels", d.node_labels)
            if not labels:
                self.fail(entry_path + ("node_labels",), 'expected at least one label, e.g. ["Hostname", "instance"]')
            for label_index, label in enumerate(labels + (self.string(entry, entry_path, "gpu_label", d.gpu_label),)):
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", label):
                    where = ("node_labels", label_index) if label_index < len(labels) else ("gpu_label",)
                    self.fail(entry_path + where, "not a Prometheus label name: %s" % _show(label))
            telemetry = self.string(entry, entry_path, "telemetry", d.telemetry)
            if telemetry not in ("ssh", "prometheus"):
                self.fail(
                    entry_path + ("telemetry",),
                    'expected "ssh" or "prometheus", got %s' % _show(telemetry)
                    + _suggest(telemetry, ("ssh", "prometheus")),
                )
            window = self.string(entry, entry_path, "rate_window", d.rate_window)
            if not re.fullmatch(r"([0-9]+(ms|s|m|h|d|w|y))+", window):
                self.fail(
                    entry_path + ("rate_window",),
                    'expected a Prometheus duration like "1m" or "30s", got %s' % _show(window),
                )
            nodes: List[str] = []
            for pattern_index, pattern in enumerate(self.strings(entry, entry_path, "nodes", ())):
                try:
                    nodes.extend(expand_hostlist(pattern, allow_duplicates=True))
                except ValueError as exc:
                    self.fail(entry_path + ("nodes", pattern_index), str(exc))
            node_names = self.strings(entry, entry_path, "node_names", ())
            for name_index, entry_text in enumerate(node_names):
                if not re.fullmatch(r"[^=\s]{1,253}=[^=\s]{1,253}", entry_text):
                    self.fail(
                        entry_path + ("node_names", name_index),
                        'expected "ADDRESS=NODE" like "10.0.0.5=gpu-a", got %s' % _show(entry_text),
                    )
            interval = (
                self.number(entry, entry_path, "interval", 0.0, low=MIN_INTERVAL_S, most=MAX_INTERVAL_S)
                if "interval" in entry
                else None
            )
            stale_after = (
                self.number(entry, entry_path, "stale_after", 0.0, above=0, most=MAX_TIMEOUT_S)
                if "stale_after" in entry
                else None
            )
            sources.append(
                SourceConfig(
                    url=url,
                    kind=kind,
                    name=name,
                    bearer_token_file=None if token is None else self.expand(token),
                    ca_file=None if ca_file is None else self.expand(ca_file),
                    node_labels=labels,
                    gpu_label=self.string(entry, entry_path, "gpu_label", d.gpu_label),
                    interval=interval,
                    timeout=self.number(entry, entry_path, "timeout", d.timeout, above=0, most=MAX_INTERVAL_S),
                    telemetry=telemetry,
                    nodes=tuple(dict.fromkeys(nodes)),
                    selector=self.string(entry, entry_path, "selector", None),
                    rate_window=window,
                    slow_every=self.integer(entry, entry_path, "slow_every", d.slow_every, low=1, most=10_000),
                    stale_after=stale_after,
                    node_names=node_names,
                )
            )
        return tuple(sources)

    # typed values

    def string(self, table: Dict[str, Any], path: KeyPath, key: str, default: Any) -> Any:
        if key not in table:
            return default
        value = table[key]
        if not isinstance(value, str):
            self.fail(path + (key,), f"expected a string, got {_show(value)}")
        if not value.strip():
            self.fail(path + (key,), "expected a string, got an empty string")
        return value

    def boolean(self, table: Dict[str, Any], path: KeyPath, key: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            self.fail(path + (key,), f"expected a boolean (true or false), got {_show(value)}")
        return value

    def integer(
        self,
        table: Dict[str, Any],
        path: KeyPath,
        key: str,
        default: Any,
        low: Optional[int] = None,
        high: Optional[int] = None,
        most: Optional[int] = None,
    ) -> Any:
        if key not in table:
            return default
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path + (key,), f"expected an integer, got {_show(value)}")
        self.check_range(path + (key,), value, low=low, high=high, most=most)
        return value

    def number(
        self,
        table: Dict[str, Any],
        path: KeyPath,
        key: str,
        default: float,
        low: Optional[float] = None,
        high: Optional[float] = None,
        above: Optional[float] = None,
        most: Optional[float] = None,
    ) -> float:
        if key not in table:
            return default
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(path + (key,), f"expected a number, got {_show(value)}")
        try:
            as_float = float(value)  # an int of 400 digits overflows here
        except OverflowError:
            as_float = math.inf
        if not math.isfinite(as_float):
            self.fail(path + (key,), f"expected a finite number, got {_show(value)}")
        self.check_range(path + (key,), value, low=low, high=high, above=above, most=most)
        return as_float

    def check_range(
        self,
        path: KeyPath,
        value: Union[int, float],
        low: Optional[float] = None,
        high: Optional[float] = None,
        above: Optional[float] = None,
        most: Optional[float] = None,
    ) -> None:
        """`low`..`high` is the range a setting means; `most` is a sanity ceiling (a huge value overflows a timer)."""
        shown = _show(value)
        if above is not None and not value > above:
            self.fail(path, f"must be greater than {_show(above)}, got {shown}")
        if low is not None and high is not None and not low <= value <= high:
            self.fail(path, f"must be between {_show(low)} and {_show(high)}, got {shown}")
        if low is not None and value < low:
            self.fail(path, f"must be at least {_show(low)}, got {shown}")
        if most is not None and value > most:
            self.fail(path, f"must be at most {_show(most)}, got {shown}")

    def strings(self, table: Dict[str, Any], path: KeyPath, key: str, default: Tuple[str, ...]) -> Tuple[str, ...]:
        if key not in table:
            return default
        value = table[key]
        if not isinstance(value, list):
            self.fail(path + (key,), f"expected an array of strings, got {_show(value)}")
        for index, item in enumerate(value):
            if not isinstance(item, str):
                self.fail(path + (key, index), f"expected an array of strings, got {_show(item)} in it")
            if not item.strip():
                self.fail(path + (key, index), "expected an array of strings, got an empty string in it")
        return tuple(value)

    def expand(self, path: str) -> str:
        return _expand_home(path, self.home)


# --- message formatting ----------------------------------------------------


def _suggest(word: str, choices: Any) -> str:
    """Return '; did you mean "x"?' for a close match, else the list of valid choices."""
    options = [str(c) for c in choices]
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {_quote(close[0])}?"
    if options and len(options) <= 12:
        return "; expected one of: " + ", ".join(options)
    return ""


def _format_path(path: KeyPath) -> str:
    """Format ("nodes", 2, "port") as nodes[2].port."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = part if _BARE_KEY.fullmatch(part) else _quote(part)
            out += ("." if out else "") + text
    return out


def _show(value: Any) -> str:
    """Describe a TOML value briefly, on one line, as TOML would spell it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _quote(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # 22.0 stays 22.0, so "expected an integer" makes sense
    if isinstance(value, int):
        digits = str(abs(value)) if value.bit_length() < 14000 else None  # str() of 4300+ digits raises
        if digits is not None and len(digits) <= 30:
            return repr(value)
        return "a%s integer of %s digits" % (
            " negative" if value < 0 else "n",
            len(digits) if digits else "thousands of",
        )
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an empty array" if not value else "an array"
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    return type(value).__name__


def _quote(text: str) -> str:
    """Double-quote text with backslash escapes, so that it stays on one line."""
    return '"' + _escape(text, '"\\') + '"'


def _escape(text: str, also: str = "") -> str:
    out = []
    for ch in text:
        if ch in also:
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def _one_line(text: str) -> str:
    # Every message is one line, whatever a file name or value holds.
    return _escape(text)
