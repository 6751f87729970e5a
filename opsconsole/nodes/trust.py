"""Trusting a node's host key from the console: what would be appended, where, and whether it is safe.

The console shows a `TrustPlan` before anything is written, and writes only the key
object the plan holds (the very key whose fingerprint the user saw).

Policy: an UNKNOWN key may be trusted after a confirmation; the line is appended to
the user's known_hosts, nothing else is touched. A CHANGED key (known_hosts holds a
different key for the host: a reinstall, or a man-in-the-middle) is never written by
the console: appending would leave both keys trusted, and removing the old one is an
edit of the user's security file that deserves a deliberate step outside the console.
The plan names the lines holding the old key and the `ssh-keygen -R` command to run;
after that the key is unknown and can be trusted here.

No Textual here (unit-testable); asyncssh is loaded only when a plan is made.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple, Union

from opsconsole.model import STATE_HOSTKEY, NodeState


@dataclass(frozen=True)
class KnownKeyLine:
    """A known_hosts line that holds another key for the host (the old key of a CHANGED host)."""

    path: str
    line_number: int  # 1-based, as editors and ssh-keygen show it
    pattern: str  # what `ssh-keygen -R` needs to remove it: `host` or `[host]:port`
    key_type: str
    fingerprint: str


@dataclass(frozen=True)
class TrustPlan:
    """Everything the confirmation shows and the append needs, for one node's presented key."""

    node: str
    host: str  # the host the key came from (a jump host's, when the jump refused it)
    port: Optional[int]
    pattern: str  # `host` or `[host]:port`, as known_hosts writes it
    key_type: str  # `ssh-ed25519`, ...
    fingerprint: str  # `SHA256:...`
    key: Any  # the asyncssh.SSHKey presented: exactly what gets written
    known_hosts: str  # the file the line would be appended to
    line: str  # the known_hosts line, newline included
    old_keys: Tuple[KnownKeyLine, ...] = ()
    already_trusted: bool = False  # known_hosts has it now (trusted elsewhere since): just retry
    via_jump: bool = False  # the key is the jump host's, not the node's own

    @property
    def changed(self) -> bool:
        """known_hosts holds a different key for this host: possible man-in-the-middle."""
        return bool(self.old_keys) and not self.already_trusted

    @property
    def address(self) -> str:
        return self.host if self.port is None else "%s:%d" % (self.host, self.port)

    def remove_commands(self) -> List[str]:
        """The `ssh-keygen -R` commands that remove the old key's lines (one per pattern and file)."""
        commands: List[str] = []
        for entry in self.old_keys:
            command = "ssh-keygen -R %s -f %s" % (shlex.quote(entry.pattern), shlex.quote(entry.path))
            if command not in commands:
                commands.append(command)
        return commands

    def detail(self) -> str:
        """One line for the audit log: what was (or would have been) trusted."""
        kind = "changed" if self.changed else ("already trusted" if self.already_trusted else "unknown")
        text = "%s %s %s (%s key) -> %s" % (self.pattern, self.key_type, self.fingerprint, kind, self.known_hosts)
        if self.changed:
            text += "; old: " + ", ".join("%s:%d %s" % (e.path, e.line_number, e.fingerprint) for e in self.old_keys)
        return text


def ssh_link_of(link: Any) -> Optional[Any]:
    """`link` if it is an SshLink, else None; never imports asyncssh for a local-only console."""
    module = sys.modules.get("opsconsole.nodes.ssh")
    if module is None:
        return None  # no SshLink was ever made in this process
    return link if isinstance(link, module.SshLink) else None


def _known_key_lines(
    paths: List[str], host: str, port: Optional[int], presented: Any
) -> Tuple[List[KnownKeyLine], bool]:
    """(lines holding other keys for host:port, whether the presented key is there), as asyncssh matches them."""
    import asyncssh

    from opsconsole.nodes.hostkeys import fingerprint, host_pattern

    wanted = presented.export_public_key("openssh").split()[:2]
    lines: List[KnownKeyLine] = []
    found = False
    match_port = None if port in (None, 22) else port
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        for number, raw in enumerate(text.splitlines(), 1):
            entry = raw.strip()
            if not entry or entry.startswith("#"):
                continue
            try:
                keys = asyncssh.SSHKnownHosts(entry).match(host, host, match_port)[0]
            except (ValueError, asyncssh.KeyImportError):
                continue  # a line asyncssh cannot read is ignored by the connection too
            seen = []  # host and addr are the same here: asyncssh can return one key twice
            for key in keys:
                text = key.export_public_key("openssh").split()[:2]
                if text in seen:
                    continue
                seen.append(text)
                if text == wanted:
                    found = True
                    continue
                # Matching without the port too means the line is for plain `host` (port 22 or any).
                portless = bool(asyncssh.SSHKnownHosts(entry).match(host, host, None)[0])
                pattern = host if portless else host_pattern(host, port)
                lines.append(KnownKeyLine(path, number, pattern, key.get_algorithm(), fingerprint(key)))
    return lines, found


def plan_trust(state: NodeState, link: Any) -> Union[TrustPlan, str]:
    """The plan for trusting the key node `state.name` presented; a str says why there is none."""
    if state.state != STATE_HOSTKEY:
        return "%s is %s, not waiting on a host key: nothing to trust" % (state.name, state.state)
    ssh_link = ssh_link_of(link)
    if ssh_link is None:
        return "%s is not reached over SSH: it has no host key to trust" % state.name
    key = ssh_link.last_host_key
    target = ssh_link.last_host_key_target
    if key is None or target is None:
        return "%s: no host key was presented (%s); nothing to trust" % (state.name, state.reason or "no reason")

    from opsconsole.nodes.hostkeys import (
        fingerprint,
        host_pattern,
        known_hosts_files,
        known_hosts_line,
        known_hosts_path,
    )

    host, port = target
    shown = fingerprint(key)
    if state.fingerprint and state.fingerprint != shown:
        return "%s: the presented key changed since it was shown (%s, now %s); try again" % (
            state.name,
            state.fingerprint,
            shown,
        )
    path = known_hosts_path(ssh_link.ssh)
    # Read now, not from the state's reason: the user may have removed the old line since.
    old, already = _known_key_lines(known_hosts_files(ssh_link.ssh), host, port, key)
    return TrustPlan(
        node=state.name,
        host=host,
        port=None if port in (None, 22) else port,
        pattern=host_pattern(host, port),
        key_type=key.get_algorithm(),
        fingerprint=shown,
        key=key,
        known_hosts=path,
        line=known_hosts_line(host, port, key),
        old_keys=tuple(old),
        already_trusted=already,
        via_jump=_is_jump_host(ssh_link.node, host),
    )


def _is_jump_host(node: Any, host: str) -> bool:
    """Whether `host` is one of the node's ProxyJump hops rather than the node itself."""
    if not node.jump or host == node.host:
        return False
    from opsconsole.nodes.ssh import parse_jump

    hops = []
    for hop in node.jump.split(","):
        try:
            hops.append(parse_jump(hop.strip())[1])
        except ValueError:
            continue
    return host in hops


def trust_planned_key(plan: TrustPlan) -> Optional[str]:
    """Append the plan's line to its known_hosts; None when done, else why not.

    Refuses a changed key, and checks the file again first, so a line added (or an
    old key put back) since the plan was shown is not written twice or past.
    """
    if plan.changed:
        return "host key of %s CHANGED: the console does not edit known_hosts for it; run %s" % (
            plan.node,
            " and ".join(plan.remove_commands()),
        )
    if plan.already_trusted:
        return None
    from opsconsole.nodes.hostkeys import trust_host_key

    try:
        old, already = _known_key_lines([plan.known_hosts], plan.host, plan.port, plan.key)
        if already:
            return None
        if old:
            return "%s now holds another key for %s: not written" % (plan.known_hosts, plan.pattern)
        trust_host_key(plan.known_hosts, plan.host, plan.port, plan.key)
    except OSError as exc:
        return "cannot write %s: %s" % (plan.known_hosts, exc.strerror or exc)
    return None


__all__ = ["KnownKeyLine", "TrustPlan", "plan_trust", "ssh_link_of", "trust_planned_key"]
