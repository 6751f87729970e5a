"""Real OpenSSH servers on loopback for tests, and a client HOME that reaches them.

Each server lives in its own temp dir (host key, authorized_keys, PidFile, log) and
listens on 127.0.0.x at a free port, as TESTING.md describes. `kill()` stops the
listener and every session process below it (killing only the listener leaves
established sessions alive); `freeze()`/`thaw()` SIGSTOP/SIGCONT all of them.

The client side is a temp HOME with .ssh/config, .ssh/known_hosts and an ed25519
key, applied with monkeypatch (HOME set, SSH_AUTH_SOCK removed), so the connection
takes the same path a user's own setup takes.

Use: `from tests.sshd import sshd_factory, ssh_client  # noqa: F401` (pytest fixtures).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import psutil
import pytest

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
START_TIMEOUT_S = 10.0


def sshd_missing_reason() -> Optional[str]:
    """Why real-sshd tests cannot run here, or None when they can."""
    if not os.path.exists(SSHD):
        return "OpenSSH server not installed (%s missing): apt-get install -y openssh-server" % SSHD
    if not os.path.exists(SSH_KEYGEN):
        return "ssh-keygen not installed"
    return None


def require_sshd() -> None:
    reason = sshd_missing_reason()
    if reason:
        pytest.skip(reason)


def keygen(path: Path, comment: str = "opsconsole-test") -> Path:
    """Make an ed25519 key pair at path (and path.pub) without a passphrase."""
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return path


def public_key(path: Path) -> str:
    """`ssh-ed25519 AAAA...` of the key at path (its .pub file), without the comment."""
    text = Path(str(path) + ".pub").read_text().split()
    return "%s %s" % (text[0], text[1])


def free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def port_accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else "[%s]:%d" % (address, port)


@dataclass
class SshServer:
    """One real sshd: start, stop, kill (sessions included), freeze and thaw."""

    dir: Path
    address: str
    port: int
    authorized_keys: Sequence[str]
    options: Dict[str, str] = field(default_factory=dict)
    process: Optional[subprocess.Popen] = None

    @property
    def host_key(self) -> Path:
        return self.dir / "host_ed25519"

    @property
    def config_path(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def log_path(self) -> Path:
        return self.dir / "sshd.log"

    def host_public_key(self) -> str:
        return public_key(self.host_key)

    def known_hosts_line(self) -> str:
        """The line a client's known_hosts needs to trust this server."""
        return "%s %s\n" % (known_hosts_name(self.address, self.port), self.host_public_key())

    def write_config(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.host_key.exists():
            keygen(self.host_key, "host")
        (self.dir / "authorized_keys").write_text("".join(k.strip() + "\n" for k in self.authorized_keys))
        lines = {
            "Port": str(self.port),
            "ListenAddress": self.address,
            "HostKey": str(self.host_key),
            "PidFile": str(self.dir / "sshd.pid"),
            "AuthorizedKeysFile": str(self.dir / "authorized_keys"),
            "StrictModes": "no",
            "UsePAM": "no",
            "PasswordAuthentication": "no",
            "KbdInteractiveAuthentication": "no",
            "PermitRootLogin": "prohibit-password",
            "AllowTcpForwarding": "yes",
            "Subsystem": "sftp internal-sftp",
            "LogLevel": "VERBOSE",
        }
        lines.update(self.options)
        self.config_path.write_text("".join("%s %s\n" % item for item in lines.items()))

    def start(self) -> "SshServer":
        """Start sshd (after `sshd -t`) and wait until its port accepts connections."""
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.write_config()
        check = subprocess.run([SSHD, "-t", "-f", str(self.config_path)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError("sshd -t refused the config: %s" % check.stderr.strip())
        log = open(self.log_path, "ab")
        try:
            self.process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_accepts(self.address, self.port):
            if self.process.poll() is not None:
                raise RuntimeError("sshd exited with %s: %s" % (self.process.returncode, self.log_tail()))
            if time.monotonic() > deadline:
                raise RuntimeError("sshd did not listen on %s:%d" % (self.address, self.port))
            time.sleep(0.02)
        return self

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def count_log(self, needle: str) -> int:
        """How many lines of the sshd log contain `needle` (e.g. "Connection from")."""
        try:
            return sum(1 for line in self.log_path.read_text(errors="replace").splitlines() if needle in line)
        except OSError:
            return 0

    def processes(self) -> List[psutil.Process]:
        """The listener and every process below it (per-connection sshd, the session's shell and probe)."""
        if self.process is None or self.process.poll() is not None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def session_processes(self) -> List[psutil.Process]:
        return self.processes()[1:]

    def _signal_all(self, signum: int) -> None:
        for proc in self.processes():
            try:
                proc.send_signal(signum)
            except psutil.NoSuchProcess:
                pass

    def freeze(self) -> None:
        """SIGSTOP the listener and every session: connections hang as if the node froze."""
        self._signal_all(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal_all(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the listener and all its sessions: established connections drop too."""
        if self.process is None:
            return
        procs = self.processes()
        for proc in procs:
            try:
                proc.send_signal(signal.SIGCONT)  # a frozen process dies only once resumed
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        # Only the listener is our child to reap; the session processes die with SIGKILL (a wait on
        # them would see zombies until init reaps them, and would block the test's event loop).
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=5)
        self.process = None

    stop = kill

    def restart(self) -> "SshServer":
        """Kill and start again on the same address and port with the same host key."""
        self.kill()
        return self.start()


class ClientEnv:
    """A client HOME: ~/.ssh/{config,known_hosts,id_ed25519} (a key asyncssh finds by default)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.ssh_dir = home / ".ssh"
        self.ssh_dir.mkdir(parents=True, mode=0o700)
        self.key = keygen(self.ssh_dir / "id_ed25519", "client")
        self.known_hosts = self.ssh_dir / "known_hosts"
        self.config = self.ssh_dir / "config"
        self.known_hosts.write_text("")
        self.config.write_text("")

    def public_key(self) -> str:
        return public_key(self.key)

    def trust(self, server: SshServer) -> None:
        """Put the server's real host key in known_hosts."""
        with open(self.known_hosts, "a") as f:
            f.write(server.known_hosts_line())

    def trust_wrong_key(self, server: SshServer) -> None:
        """Put a different ed25519 key for the server in known_hosts (as after a reinstall or an attack)."""
        other = keygen(self.home / ("other_%d" % server.port), "impostor")
        with open(self.known_hosts, "a") as f:
            f.write("%s %s\n" % (known_hosts_name(server.address, server.port), public_key(other)))

    def add_config(self, text: str) -> None:
        with open(self.config, "a") as f:
            f.write(text.rstrip("\n") + "\n")


class SshdFactory:
    """Starts servers in a temp dir and kills them all at teardown."""

    def __init__(self, root: Path, client: ClientEnv) -> None:
        self.root = root
        self.client = client
        self.servers = []  # type: List[SshServer]

    def start(
        self,
        address: str = "127.0.0.1",
        trust: bool = True,
        authorized_keys: Optional[Sequence[str]] = None,
        **options: str,
    ) -> SshServer:
        """A running sshd that accepts the client key; `trust` adds its host key to known_hosts."""
        port = free_port(address)
        server = SshServer(
            dir=self.root / ("sshd_%s_%d" % (address, port)),
            address=address,
            port=port,
            authorized_keys=list(authorized_keys) if authorized_keys is not None else [self.client.public_key()],
            options=dict(options),
        )
        server.start()
        self.servers.append(server)
        if trust:
            self.client.trust(server)
        return server

    def close(self) -> None:
        for server in self.servers:
            try:
                server.kill()
            except Exception:
                pass


@pytest.fixture
def ssh_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ClientEnv:
    """A temp HOME with .ssh/config, known_hosts and a client key; HOME set, ssh-agent hidden."""
    require_sshd()
    env = ClientEnv(tmp_path / "home")
    monkeypatch.setenv("HOME", str(env.home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return env


@pytest.fixture
def sshd_factory(tmp_path: Path, ssh_client: ClientEnv) -> Iterator[SshdFactory]:
    """Start real sshd servers with `sshd_factory.start(...)`; all are killed after the test."""
    factory = SshdFactory(tmp_path / "servers", ssh_client)
    try:
        yield factory
    finally:
        factory.close()


class StateLog:
    """Collects what a link publishes; `wait_for` awaits a state matching a predicate."""

    def __init__(self) -> None:
        import asyncio

        self._asyncio = asyncio
        self.states = []  # type: list
        self._changed = asyncio.Event()

    def __call__(self, state) -> None:
        self.states.append(state)
        self._changed.set()

    @property
    def names(self) -> List[str]:
        return [s.state for s in self.states]

    async def wait_for(self, predicate, timeout: float, start: int = 0):
        """The first published state from index `start` on that matches; fails the test after `timeout` s."""
        asyncio = self._asyncio
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        index = start
        while True:
            while index < len(self.states):
                state = self.states[index]
                index += 1
                if predicate(state):
                    return state
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError("no matching state within %g s; got %s" % (timeout, self.summary()))
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def wait_state(self, name: str, timeout: float, start: int = 0):
        return await self.wait_for(lambda s: s.state == name, timeout, start)

    def summary(self) -> str:
        out = []
        for s in self.states[-12:]:
            out.append("%s(%s)" % (s.state, s.reason))
        return ", ".join(out)
