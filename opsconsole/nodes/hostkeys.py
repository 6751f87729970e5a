"""Host-key checking against known_hosts, the `accept-new` policy, and trusting a key on request.

Checking is never turned off. Every connection gets a fresh read of known_hosts
(so a key trusted a moment ago counts on the next retry) and a client object that
sees the key the server presented: that is how the console can show the
fingerprint of an unknown or changed key and let the user trust it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import asyncssh

from opsconsole.config import SshConfig

POLICY_STRICT = "strict"
POLICY_ACCEPT_NEW = "accept-new"
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
DEFAULT_PORT = 22


def known_hosts_path(ssh: SshConfig) -> str:
    """The user's known_hosts file: SshConfig.known_hosts, else ~/.ssh/known_hosts."""
    return os.path.expanduser(ssh.known_hosts or os.path.join("~", ".ssh", "known_hosts"))


def known_hosts_files(ssh: SshConfig) -> List[str]:
    """The files whose keys are trusted, as `ssh` reads them: the user's, then the global one."""
    return [path for path in (known_hosts_path(ssh), GLOBAL_KNOWN_HOSTS) if os.path.isfile(path)]


def load_known_hosts(paths: Sequence[str]) -> asyncssh.SSHKnownHosts:
    """Parse the known_hosts files; unreadable ones count as empty (the key is then unknown)."""
    known = asyncssh.SSHKnownHosts()
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                known.load(f.read())
        except OSError:
            continue
    return known


def host_pattern(host: str, port: Optional[int]) -> str:
    """A host as known_hosts names it: `host` on port 22, `[host]:port` otherwise."""
    if port is None or port == DEFAULT_PORT:
        return host
    return "[%s]:%d" % (host, port)


def fingerprint(key: asyncssh.SSHKey) -> str:
    """The key's SHA256 fingerprint, as `ssh-keygen -l` prints it: `SHA256:...`."""
    return key.get_fingerprint("sha256")


def public_key_text(key: asyncssh.SSHKey) -> str:
    """`ssh-ed25519 AAAA...` without a comment."""
    parts = key.export_public_key("openssh").decode("ascii").split()
    return " ".join(parts[:2])


def known_hosts_line(host: str, port: Optional[int], key: asyncssh.SSHKey) -> str:
    """One known_hosts line for the key, newline included."""
    return "%s %s\n" % (host_pattern(host, port), public_key_text(key))


def trust_host_key(known_hosts_path: str, host: str, port: Optional[int], key: asyncssh.SSHKey) -> str:
    """Append the key for host:port to known_hosts (creating it, and ~/.ssh, as ssh does); return the line.

    The console calls this only after the user confirmed the fingerprint.
    """
    path = os.path.expanduser(known_hosts_path)
    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700, exist_ok=True)
    line = known_hosts_line(host, port, key)
    prefix = ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    prefix = "\n"  # a file whose last line has no newline: don't glue ours to it
    except FileNotFoundError:
        pass
    with open(path, "a", encoding="ascii") as f:
        f.write(prefix + line)
    return line


@dataclass
class HostKeyVerdict:
    """What one connection attempt saw of the server's host key."""

    host: str = ""
    port: Optional[int] = None
    presented: Optional[asyncssh.SSHKey] = None
    known: Tuple[asyncssh.SSHKey, ...] = ()  # keys known_hosts holds for this host (a changed key)
    accepted_new: bool = False
    added_line: Optional[str] = None

    @property
    def fingerprint(self) -> Optional[str]:
        return fingerprint(self.presented) if self.presented is not None else None

    def reason(self, known_hosts: str) -> str:
        """Why the key was refused, in one line the UI can show."""
        where = host_pattern(self.host, self.port) if self.host else "the host"
        if self.presented is None:
            return "host key of %s could not be verified" % where
        shown = "%s %s" % (self.presented.get_algorithm(), self.fingerprint)
        if self.known:
            old = ", ".join(fingerprint(key) for key in self.known)
            return (
                "HOST KEY CHANGED for %s: it presented %s but %s has %s (possible man-in-the-middle; "
                "remove the old line only if the change is expected)" % (where, shown, known_hosts, old)
            )
        return "unknown host key for %s: %s is not in %s; trust it to connect" % (where, shown, known_hosts)


class HostKeyVerifier:
    """Makes the known_hosts argument and client object of each connection attempt."""

    def __init__(self, ssh: SshConfig) -> None:
        if ssh.host_key_policy not in (POLICY_STRICT, POLICY_ACCEPT_NEW):
            raise ValueError("unknown host_key_policy %r" % ssh.host_key_policy)
        self.policy = ssh.host_key_policy
        self.path = known_hosts_path(ssh)
        self.files = lambda: known_hosts_files(ssh)
        self.read_signature: Tuple[Tuple[str, int, int, int], ...] = ()  # the files as the last attempt read them

    def files_signature(self) -> Tuple[Tuple[str, int, int, int], ...]:
        """What changes when a known_hosts file does (written, replaced by `ssh-keygen -R`, made, removed)."""
        seen = []
        for path in (self.path, GLOBAL_KNOWN_HOSTS):
            try:
                st = os.stat(path)
            except OSError:
                continue
            seen.append((path, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(seen)

    def prepare(self) -> Tuple[asyncssh.SSHKnownHosts, HostKeyVerdict, "type"]:
        """(known_hosts for asyncssh, the verdict it fills in, the client_factory to pass)."""
        self.read_signature = self.files_signature()  # before the read: a change during it counts as a change
        known = load_known_hosts(self.files())
        verdict = HostKeyVerdict()
        verifier = self

        class _Client(asyncssh.SSHClient):
            # asyncssh calls this only for a key that known_hosts does not already trust.
            def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
                verdict.host, verdict.port, verdict.presented = host, port, key
                matched = known.match(host, addr, None if port == DEFAULT_PORT else port)[0]
                # A line matched by name and by address comes back twice (127.0.0.1 is both): keep each key once.
                verdict.known = tuple({fingerprint(k): k for k in matched}.values())
                if verdict.known or verifier.policy != POLICY_ACCEPT_NEW:
                    return False  # a changed key is refused under every policy
                try:
                    verdict.added_line = trust_host_key(verifier.path, host, port, key)
                except OSError:
                    return False  # cannot record it: refuse rather than trust silently
                verdict.accepted_new = True
                return True

        return known, verdict, _Client
