"""What a section means beyond its types: node lists from hostlists, unique and existing names, argv templates.

Runs on sections the schema has validated (validate.py); `raw` is the section as the file wrote it,
read only to tell a key written from a default. Each check fails at the key that caused it.
"""

from __future__ import annotations

import re
import string
from dataclasses import fields, is_dataclass, replace
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple

from opsconsole.config.errors import KeyPath, format_path, quote, show, suggest
from opsconsole.config.schema import (
    DEFAULT_CONFIG,
    DRAIN_PLACEHOLDERS,
    GPU_RESET_PLACEHOLDERS,
    PROMETHEUS_LABEL,
    ActionsConfig,
    AlertRuleConfig,
    CheckpointDirConfig,
    Config,
    NodeConfig,
    NodeEntry,
    SourceConfig,
    SshConfig,
    expand_home,
)
from opsconsole.hostlist import expand_hostlist

Fail = Callable[[KeyPath, str], NoReturn]


def finish(validated: Dict[str, Any], raw: Dict[str, Any], filename: str, home: Optional[str], fail: Fail) -> Config:
    """The Config of a validated document: each section's meaning checked, paths under ~ expanded."""
    parts: Dict[str, Any] = {}
    for name, value in validated.items():
        if name == "nodes":
            parts[name] = node_list(tuple(with_home(entry, home) for entry in value), fail)
        elif name == "sources":
            parts[name] = tuple(prometheus_sources([with_home(s, home) for s in value], raw[name], fail))
        elif isinstance(value, tuple):
            parts[name] = tuple(with_home(item, home) for item in value)
        else:
            parts[name] = with_home(value, home)
    if "ssh" in parts:
        check_backoff(parts["ssh"], raw["ssh"], fail)
    if "actions" in parts:
        check_action_commands(parts["actions"], fail)
    if "alerts" in parts:
        check_alert_names(parts["alerts"], fail)
    if parts.get("sources") and "nodes" not in parts:
        parts["nodes"] = ()  # the fleet comes from the sources: no implicit local node
    check_checkpoint_nodes(parts.get("checkpoints", ()), parts.get("nodes", DEFAULT_CONFIG.nodes), fail)
    # Each section becomes its Config field (same name); absent sections keep the default.
    return replace(DEFAULT_CONFIG, source=filename, **parts)


def with_home(table: Any, home: Optional[str]) -> Any:
    """`table` with ~ expanded in the fields the schema marks as local paths (a command: its program)."""
    if not is_dataclass(table) or isinstance(table, type):
        return table
    changes: Dict[str, Any] = {}
    for f in fields(table):
        value = getattr(table, f.name)
        if not f.metadata.get("path") or not value:
            continue
        if isinstance(value, str):
            changes[f.name] = expand_home(value, home)
        else:
            changes[f.name] = (expand_home(value[0], home),) + tuple(value[1:])
    return replace(table, **changes) if changes else table


# --- [[nodes]] --------------------------------------------------------------------------------


def node_list(entries: Tuple[NodeEntry, ...], fail: Fail) -> Tuple[NodeConfig, ...]:
    path: KeyPath = ("nodes",)
    if not entries:
        fail(path, "expected at least one node (leave [[nodes]] out for the local node)")
    nodes: List[NodeConfig] = []
    first_seen: Dict[str, KeyPath] = {}  # node name -> path of the entry that made it
    local_entry: Optional[KeyPath] = None
    for index, entry in enumerate(entries):
        entry_path = path + (index,)
        made = nodes_of_entry(entry, entry_path, fail)
        if entry.local:
            if local_entry is not None:
                fail(entry_path + ("local",), f"only one node can be local; {format_path(local_entry)} already is")
            local_entry = entry_path
        name_path = entry_path + (name_source(entry),)
        for node in made:
            if node.name in first_seen:
                where = first_seen[node.name]
                if where == entry_path:
                    fail(name_path, f"hostlist names {quote(node.name)} twice")
                fail(name_path, f"duplicate node name {quote(node.name)}; first defined by {format_path(where)}")
            first_seen[node.name] = entry_path
            nodes.append(node)
    return tuple(nodes)


def name_source(entry: NodeEntry) -> str:
    """The key an entry's node names come from, where a duplicate name is reported."""
    for key in ("name", "hosts", "host"):
        if getattr(entry, key) is not None:
            return key
    return "local" if entry.local else "name"


def nodes_of_entry(entry: NodeEntry, path: KeyPath, fail: Fail) -> List[NodeConfig]:
    host, hosts = entry.host, entry.hosts
    if hosts is not None and entry.name is not None:
        fail(
            path + ("hosts",),
            '"name" and "hosts" cannot be used together; each host of "hosts" is named after itself',
        )
    if hosts is not None and host is not None:
        fail(path + ("hosts",), '"host" and "hosts" cannot be used together')
    if host is not None:
        if re.search(r"\s", host):
            fail(path + ("host",), f"host names cannot contain whitespace, got {show(host)}")
        if re.search(r"[\[\],]", host):
            fail(path + ("host",), f'{show(host)} looks like a hostlist; use "hosts" for patterns')
    if entry.local:
        if host is not None or hosts is not None:
            used = "host" if host is not None else "hosts"
            fail(path + ("local",), f'a local node has no host; remove "{used}" or "local"')
        for key in ("port", "user", "identity", "jump"):
            if getattr(entry, key) is not None:
                fail(path + (key,), "not used by a local node (it is reached without SSH)")
        return [NodeConfig(name=entry.name or "local", python=entry.python, local=True)]
    if host is None and hosts is None:
        fail(path, 'a node needs "host", "hosts" or "local = true"')

    def node(name: str, host: str) -> NodeConfig:
        return NodeConfig(
            name=name,
            host=host,
            port=entry.port,
            user=entry.user,
            identity=entry.identity,
            jump=entry.jump,
            python=entry.python,
        )

    if hosts is not None:
        return [node(h, h) for h in expand_patterns(hosts, path + ("hosts",), fail)]
    assert host is not None
    return [node(entry.name if entry.name is not None else host, host)]


def expand_patterns(patterns: Tuple[str, ...], path: KeyPath, fail: Fail, each: bool = False) -> List[str]:
    """Hostlist patterns expanded, duplicates kept; a bad one fails at `path` (or its item, with `each`)."""
    if not patterns and not each:
        fail(path, "expected a hostlist string or an array of strings, got an empty array")
    hosts: List[str] = []
    for index, pattern in enumerate(patterns):
        try:
            hosts.extend(expand_hostlist(pattern, allow_duplicates=True))
        except ValueError as exc:
            fail(path + ((index,) if each else ()), str(exc))
    return hosts


def check_checkpoint_nodes(dirs: Tuple[CheckpointDirConfig, ...], nodes: Tuple[NodeConfig, ...], fail: Fail) -> None:
    """Each checkpoint directory names a configured node."""
    names = [node.name for node in nodes]
    for index, entry in enumerate(dirs):
        if entry.node is not None and entry.node not in names:
            fail(("checkpoints", index, "node"), f"no node is named {quote(entry.node)}" + suggest(entry.node, names))


# --- [ssh], [actions], [[alerts]] ------------------------------------------------------------------


def check_backoff(ssh: SshConfig, raw: Dict[str, Any], fail: Fail) -> None:
    if ssh.backoff_max < ssh.backoff_initial:
        fail(
            ("ssh", "backoff_max"),
            f"must be at least backoff_initial ({show(raw.get('backoff_initial', ssh.backoff_initial))}),"
            f" got {show(raw.get('backoff_max'))}",
        )


def check_action_commands(actions: ActionsConfig, fail: Fail) -> None:
    for key, placeholders in (("gpu_reset_command", GPU_RESET_PLACEHOLDERS), ("drain_command", DRAIN_PLACEHOLDERS)):
        check_argv_template(getattr(actions, key), ("actions", key), placeholders, fail)


def check_argv_template(words: Tuple[str, ...], path: KeyPath, placeholders: Tuple[str, ...], fail: Fail) -> None:
    """An argv template: {name} placeholders in any word but the program, each filling one word."""
    if not words:
        fail(path, "expected a command, got an empty one")
    for word in words:
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(word) if name is not None]
        except ValueError as exc:
            fail(path, "bad placeholder in %s: %s (write {{ and }} for braces)" % (show(word), exc))
        for name in names:
            if name not in placeholders:
                fail(path, "unknown placeholder {%s}; use %s" % (name, ", ".join("{%s}" % p for p in placeholders)))
    if "{" in words[0]:
        fail(path, "the program (first word) cannot be a placeholder")


def check_alert_names(rules: Tuple[AlertRuleConfig, ...], fail: Fail) -> None:
    first: Dict[str, int] = {}
    for index, rule in enumerate(rules):
        if rule.name in first:
            fail(
                ("alerts", index, "name"),
                "duplicate alert name %s; first used by alerts[%d]" % (quote(rule.name), first[rule.name]),
            )
        first[rule.name] = index


# --- [[sources]] -------------------------------------------------------------------------------


def prometheus_sources(sources: List[SourceConfig], raw: List[Dict[str, Any]], fail: Fail) -> List[SourceConfig]:
    """[[sources]] (issue 8): unique names (prometheus, prometheus-2, ... by default), hostlists expanded."""
    done: List[SourceConfig] = []
    seen: Dict[str, int] = {}
    for index, source in enumerate(sources):
        path: KeyPath = ("sources", index)
        if "name" not in raw[index] and index > 0:
            source = replace(source, name="prometheus-%d" % (index + 1))
        if source.name in seen:
            fail(
                path + ("name",),
                "duplicate source name %s; first used by sources[%d]" % (quote(source.name), seen[source.name]),
            )
        seen[source.name] = index
        if source.ca_file is not None and source.url.startswith("http://"):
            fail(path + ("ca_file",), "a CA file is only used with an https:// url")
        if not source.node_labels:
            fail(path + ("node_labels",), 'expected at least one label, e.g. ["Hostname", "instance"]')
        for label_index, label in enumerate(source.node_labels):
            if not re.match(PROMETHEUS_LABEL, label):
                fail(path + ("node_labels", label_index), "expected a Prometheus label name, got %s" % show(label))
        for name_index, entry in enumerate(source.node_names):
            if not re.fullmatch(r"[^=\s]{1,253}=[^=\s]{1,253}", entry):
                fail(
                    path + ("node_names", name_index),
                    'expected "ADDRESS=NODE" like "10.0.0.5=gpu-a", got %s' % show(entry),
                )
        nodes = expand_patterns(source.nodes, path + ("nodes",), fail, each=True)
        done.append(replace(source, nodes=tuple(dict.fromkeys(nodes))))
    return done
