"""One node's SSH connection, shared by everything that reaches the node: the probe stream,
commands (`run_command`, the actions and the node-side helpers), log tails and SFTP
(`connection()` plus `channel_slot()`). The probe link (ssh.py: SshLink) is one of its users.

Channels are counted against `ssh.max_channels`, under sshd's MaxSessions.

Connecting reads ~/.ssh/config and uses ssh-agent as `ssh` does (asyncssh defaults);
the node's port, user, identity and jump override it only when set. Logins queue on a
semaphore shared by the fleet (sshd's MaxStartups drops bursts) after a small random
jitter. Host keys are always checked (see hostkeys.py).

A command's output is read bounded (EXEC_OUTPUT_LIMIT per stream): a node that floods it
stops the command (OutputOverLimit) instead of growing the console's memory.

RTT: the time of one SSH global request (`keepalive@openssh.com`, which OpenSSH answers
at once without starting anything) at connect and every RTT_REFRESH_S after. That is
the network plus sshd's event loop, not process start-up, which an `exec true` would add.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import random
import shlex
import socket
import time
import weakref
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Dict, List, Optional, Sequence, Tuple

import asyncssh

from opsconsole.config import NodeConfig, SshConfig
from opsconsole.model import STATE_AUTH, STATE_DOWN, STATE_HOSTKEY
from opsconsole.nodes.credentials import Signature, credentials_signature
from opsconsole.nodes.hostkeys import HostKeyVerdict, HostKeyVerifier

if TYPE_CHECKING:
    from opsconsole.model import NodeStateName

DEFAULT_MAX_LOGINS = 8
LOGIN_JITTER_S = 0.05  # spreads a fleet's logins so they don't hit sshd in one burst
RTT_REFRESH_S = 15.0
PROBE_EXIT_WAIT_S = 2.0  # for a command's channel to close after its output ended
READ_CHARS = 65536
# Any command's stdout and stderr are each read up to this (the checkpoint helper's answers list
# every file of the units it pinned: tens of MB at the most).
EXEC_OUTPUT_LIMIT = 256 * 1024 * 1024
_RTT_REQUEST = b"keepalive@openssh.com"
CHANNEL_RETRY_DELAYS = (0.02, 0.05, 0.1, 0.2)
# Keepalives wait at least this many frame intervals of silence (see keepalive_beside_stream).
STREAM_KEEPALIVE_SLACK = 1.5
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com")

# One limiter per event loop for connections made without one (the fleet passes its own).
_default_limiters: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = (
    weakref.WeakKeyDictionary()
)


def _default_limiter(size: int) -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    limiter = _default_limiters.get(loop)
    if limiter is None:
        limiter = _default_limiters[loop] = asyncio.Semaphore(size)
    return limiter


class LinkError(Exception):
    """The node cannot be reached: the state it is in (down, auth, hostkey) and why, in one line."""

    def __init__(self, state: "NodeStateName", reason: str, fingerprint: Optional[str] = None) -> None:
        super().__init__(reason)
        self.state = state
        self.reason = reason
        self.fingerprint = fingerprint


class OutputOverLimit(LinkError):
    """A command sent more output than it may: stopped, and nothing of it used."""


def _ssh_config_values(
    host: str, user: Optional[str], port: Optional[int], names: Sequence[str], config_path: Optional[str] = None
) -> Dict[str, Any]:
    """What ~/.ssh/config sets for `host` among `names` (unset ones left out); {} without a readable file."""
    path = config_path or os.path.expanduser("~/.ssh/config")
    if not os.path.exists(path):
        return {}
    try:
        from asyncssh.config import SSHClientConfig

        config = SSHClientConfig.load(None, [path], False, False, False, getpass.getuser(), user, host, port)
        return {name: config.get(name) for name in names if config.get(name)}
    except Exception:  # a config asyncssh cannot read fails the connect itself, with its message
        return {}


def keepalive_for(
    host: str, user: Optional[str], port: Optional[int], ssh: SshConfig, config_path: Optional[str] = None
) -> Tuple[float, int]:
    """Keepalive settings for a host: ~/.ssh/config's ServerAlive* where it sets them, like ssh.

    asyncssh lets explicit arguments override the config file, so ask the file first;
    where it is silent, our defaults keep a frozen node detected within seconds.
    """
    found = _ssh_config_values(host, user, port, ("ServerAliveInterval", "ServerAliveCountMax"), config_path)
    interval = float(found.get("ServerAliveInterval") or ssh.keepalive_interval)
    count_max = int(found.get("ServerAliveCountMax") or ssh.keepalive_count_max)
    return interval, count_max


def keepalive_beside_stream(interval: float, count_max: int, stream_interval: float) -> Tuple[float, int]:
    """Keepalive settings for a connection that also carries a frame every `stream_interval` seconds.

    A keepalive goes out after `interval` seconds with nothing received (ssh's
    ServerAliveInterval); with frames every `interval` seconds it would go out after
    nearly every frame that comes a little late: a request and a reply per node per
    second that tell nothing the frames don't. So the quiet time waited is at least
    STREAM_KEEPALIVE_SLACK frame intervals, and the count is lowered to match: a
    frozen node is given up after about the same time as configured, (count+1) x interval.
    """
    floor = STREAM_KEEPALIVE_SLACK * stream_interval
    if interval >= floor or stream_interval <= 0:
        return interval, count_max
    window = (count_max + 1) * interval
    return floor, max(1, int(round(window / floor)) - 1)


def ciphers_for(
    host: str, user: Optional[str], port: Optional[int], config_path: Optional[str] = None
) -> Optional[List[str]]:
    """The cipher list to offer: None where ~/.ssh/config sets Ciphers (asyncssh applies it), else ours.

    AES-GCM first: the same security class as chacha20-poly1305 (both AEAD, both in
    OpenSSH's defaults), but one OpenSSL call per packet with AES-NI where asyncssh's
    chacha20 makes four, which is most of the console's per-frame SSH cost at fleet scale.
    """
    if _ssh_config_values(host, user, port, ("Ciphers",), config_path):
        return None
    from asyncssh.encryption import get_default_encryption_algs, get_encryption_algs

    available = [alg.decode("ascii") for alg in get_encryption_algs()]
    preferred = [alg for alg in PREFERRED_CIPHERS if alg in available]
    defaults = [alg.decode("ascii") for alg in get_default_encryption_algs()]
    return preferred + [alg for alg in defaults if alg not in preferred]


def parse_jump(spec: str) -> Tuple[Optional[str], str, Optional[int]]:
    """Split one ProxyJump hop "[user@]host[:port]" (IPv6 as "[addr]:port") into (user, host, port)."""
    user: Optional[str] = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port: Optional[int] = None
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif spec.count(":") == 1:
        host, _, text = spec.partition(":")
        port = int(text)
    else:
        host = spec
    if not host:
        raise ValueError("empty host in jump %r" % spec)
    return user or None, host, port


def connect_timeout_reason(conn: Optional[asyncssh.SSHClientConnection], timeout: float) -> str:
    """Why a login that ran out of time did: how far it got says where to look.

    `conn` is the connection asyncssh made once TCP connected (None before that); its
    server_version is set once the node's sshd sent its greeting.
    """
    if conn is None:
        return "no TCP connection within %g s: host down or unreachable, or a firewall drops the packets" % timeout
    if not conn.get_extra_info("server_version"):
        return (
            "the port accepted but sent no SSH greeting within %g s: sshd hung or overloaded, "
            "or no SSH server on this port (try: ssh -v)" % timeout
        )
    return "SSH login did not finish within %g s: slow authentication on the node (try: ssh -v)" % timeout


def describe_connect_error(
    exc: BaseException, timeout: float, conn: Optional[asyncssh.SSHClientConnection] = None
) -> Tuple["NodeStateName", str]:
    """(state, reason) for an exception raised while connecting; `conn`: what a login got to (see above)."""
    if isinstance(exc, asyncssh.PermissionDenied):
        return STATE_AUTH, "authentication failed: %s" % (exc.reason or "permission denied")
    if isinstance(exc, (asyncssh.KeyImportError, asyncssh.KeyEncryptionError)):
        return STATE_AUTH, "cannot use the identity key: %s" % exc
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return STATE_HOSTKEY, "host key not verifiable: %s" % exc.reason
    if isinstance(exc, asyncssh.DisconnectError):
        return STATE_DOWN, "connection lost: %s" % (exc.reason or type(exc).__name__)
    if isinstance(exc, asyncio.TimeoutError):
        return STATE_DOWN, connect_timeout_reason(conn, timeout)
    if isinstance(exc, ConnectionRefusedError):
        return STATE_DOWN, "connection refused"
    if isinstance(exc, socket.gaierror):
        return STATE_DOWN, "cannot resolve host: %s" % (exc.strerror or exc)
    if isinstance(exc, OSError):
        return STATE_DOWN, "cannot connect: %s" % (exc.strerror or exc)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return STATE_DOWN, "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


def connection_lost(exc: BaseException) -> LinkError:
    """The LinkError of a channel that broke while a command or the probe ran."""
    return LinkError(STATE_DOWN, "connection lost: %s" % (getattr(exc, "reason", None) or exc))


def exit_status_of(process: Any) -> Optional[int]:
    """A finished SSH process's exit status; -1 when a signal ended it (asyncssh gives no status then)."""
    status = process.exit_status
    if status is None and process.exit_signal:
        return -1
    return status


class OutputTooLong(Exception):
    """A command's output went over its limit (see _communicate_bounded)."""


async def communicate_bounded(process: Any, input: Optional[str], merge: bool, limit: int) -> Tuple[str, str]:
    """process.communicate(input), but neither stream is held past `limit` characters: OutputTooLong."""
    if input is not None:
        process.stdin.write(input)
    process.stdin.write_eof()

    async def drain(stream: Any) -> str:
        parts: List[str] = []
        size = 0
        while True:
            chunk = await stream.read(READ_CHARS)
            if not chunk:
                return "".join(parts)
            size += len(chunk)
            if size > limit:
                raise OutputTooLong("over %d characters of output: stopped reading" % limit)
            parts.append(chunk)

    readers = [asyncio.ensure_future(drain(process.stdout))]
    if not merge:
        readers.append(asyncio.ensure_future(drain(process.stderr)))
    try:
        texts = await asyncio.gather(*readers)
    finally:
        for reader in readers:
            reader.cancel()
    return texts[0], texts[1] if len(texts) > 1 else ""


class SshConnection:
    """One node's persistent SSH connection (and its jump hosts): opened on first use and again
    after a loss, its channels counted, commands run over it with their output bounded."""

    def __init__(
        self,
        node: NodeConfig,
        ssh: SshConfig,
        stream_interval: Optional[float] = None,
        login_limiter: Optional[asyncio.Semaphore] = None,
        rng: Optional[random.Random] = None,
    ) -> None:
        if not node.host:
            raise ValueError("node %r has no host" % node.name)
        self.name = node.name
        self.node = node
        self.ssh = ssh
        # Frames arrive on the connection this often (a probe link): keepalives need not (keepalive_beside_stream).
        self.stream_interval = stream_interval
        self.address = node.host if node.port is None else "%s:%d" % (node.host, node.port)
        self._rng = rng or random.Random()
        self._limiter = login_limiter
        self._verifier = HostKeyVerifier(ssh)
        self._channels = asyncio.Semaphore(max(1, ssh.max_channels))
        self._connect_lock = asyncio.Lock()
        self._conn: Optional[asyncssh.SSHClientConnection] = None
        self._jumps: List[asyncssh.SSHClientConnection] = []
        self._lost: Optional[str] = None  # why the current connection ended
        self._rtt_task: Optional[asyncio.Task] = None
        self.last_rtt_ms: Optional[float] = None
        self.connect_attempts = 0  # logins tried (tests count them: auth/hostkey must not loop)
        self.channels_in_use = 0
        self.channels_peak = 0
        self.last_host_key: Optional[asyncssh.SSHKey] = None  # what a `hostkey` node presented
        self.last_host_key_target: Optional[Tuple[str, Optional[int]]] = None
        # The login to the node itself, while it runs: {"conn": ...} once TCP is up, "done" once it
        # succeeded; a caller whose own deadline cut it short tells from it how far it got.
        self.login_attempt: Optional[dict] = None
        # The user's keys as the last login could use them (credentials.py): an `auth` node tries
        # again once they change.
        self.credentials_seen: Optional[Signature] = None

    def credentials(self) -> "Awaitable[Signature]":
        """The signature of what a login to this node would offer now (see credentials.py)."""
        return credentials_signature(self.node.identity, with_defaults=bool(self.node.jump))

    def rtt_measured(self, rtt_ms: Optional[float]) -> None:
        """A new RTT reading (None: none could be taken); a probe link shows it with its next frame."""
        self.last_rtt_ms = rtt_ms

    # --- connecting ----------------------------------------------------------------------

    async def connection(self) -> asyncssh.SSHClientConnection:
        """The node's connection, opened (or reopened) when needed; raises LinkError when it can't be."""
        async with self._connect_lock:
            if self._conn is not None and self._lost is None:
                return self._conn
            await self._drop_connection()
            conn = await self._open()
            self._conn, self._lost = conn, None
            return conn

    def _client_factory(self, verdict_factory: Any, on_lost: bool, attempt: Optional[dict] = None) -> Any:
        link = self

        class _Client(verdict_factory):  # type: ignore[misc, valid-type]
            def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
                self._conn = conn
                if attempt is not None:  # TCP is up: a timeout from here on is the node's sshd
                    attempt["conn"] = conn

            def connection_lost(self, exc: Optional[Exception]) -> None:
                if on_lost and link._conn is getattr(self, "_conn", None):
                    reason = getattr(exc, "reason", None) or (str(exc) if exc else "closed by the node")
                    link._lost = reason

        return _Client

    async def _connect_hop(
        self,
        host: str,
        port: Optional[int],
        user: Optional[str],
        client_keys: Optional[List[Any]],
        tunnel: Optional[asyncssh.SSHClientConnection],
        target: bool,
    ) -> asyncssh.SSHClientConnection:
        known, verdict, client_class = self._verifier.prepare()
        interval, count_max = keepalive_for(host, user, port, self.ssh)
        if target and self.stream_interval:  # the stream's frames are the traffic keepalives would make
            interval, count_max = keepalive_beside_stream(interval, count_max, self.stream_interval)
        attempt = {}  # type: dict
        if target:
            self.login_attempt = attempt
        kwargs = dict(
            known_hosts=known,
            client_factory=self._client_factory(client_class, on_lost=target, attempt=attempt),
            keepalive_interval=interval,
            keepalive_count_max=count_max,
            connect_timeout=self.ssh.connect_timeout,
        )  # type: dict
        ciphers = ciphers_for(host, user, port)
        if ciphers is not None:
            kwargs["encryption_algs"] = ciphers
        if port is not None:
            kwargs["port"] = port
        if user is not None:
            kwargs["username"] = user
        if client_keys is not None:
            kwargs["client_keys"] = client_keys
        if tunnel is not None:
            kwargs["tunnel"] = tunnel
        try:
            conn = await asyncio.wait_for(asyncssh.connect(host, **kwargs), self.ssh.connect_timeout + 1.0)
            attempt["done"] = True
            return conn
        except asyncssh.HostKeyNotVerifiable as exc:
            raise self._hostkey_error(exc, verdict) from None
        except (asyncio.CancelledError, LinkError):
            raise
        except Exception as exc:
            state, reason = describe_connect_error(exc, self.ssh.connect_timeout, attempt.get("conn"))
            raise LinkError(state, reason) from None

    def _hostkey_error(self, exc: asyncssh.HostKeyNotVerifiable, verdict: HostKeyVerdict) -> LinkError:
        self.last_host_key = verdict.presented
        self.last_host_key_target = (verdict.host, verdict.port) if verdict.presented is not None else None
        if verdict.presented is None:
            return LinkError(STATE_HOSTKEY, "host key not verifiable: %s" % exc.reason)
        return LinkError(STATE_HOSTKEY, verdict.reason(self._verifier.path), fingerprint=verdict.fingerprint)

    async def _open(self) -> asyncssh.SSHClientConnection:
        self.connect_attempts += 1
        self.login_attempt = None
        self.credentials_seen = await self.credentials()  # before the keys are read: a change during it counts
        client_keys: Optional[List[Any]] = None
        if self.node.identity:
            try:
                client_keys = [asyncssh.read_private_key(self.node.identity)]
            except (OSError, asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as exc:
                raise LinkError(STATE_AUTH, "cannot read identity %s: %s" % (self.node.identity, exc)) from None
        limiter = self._limiter or _default_limiter(self.ssh.max_logins or DEFAULT_MAX_LOGINS)
        async with limiter:
            await asyncio.sleep(self._rng.uniform(0.0, LOGIN_JITTER_S))
            tunnel: Optional[asyncssh.SSHClientConnection] = None
            jumps: List[asyncssh.SSHClientConnection] = []
            try:
                for hop in self.node.jump.split(",") if self.node.jump else ():
                    try:
                        user, host, port = parse_jump(hop.strip())
                    except ValueError as exc:
                        raise LinkError(STATE_DOWN, "bad jump host %r: %s" % (hop, exc)) from None
                    try:
                        # As `ssh -J`: the jump host's own settings come from ~/.ssh/config, not node.identity.
                        tunnel = await self._connect_hop(host, port, user, None, tunnel, target=False)
                    except LinkError as err:
                        raise LinkError(
                            err.state, "jump host %s: %s" % (hop.strip(), err.reason), err.fingerprint
                        ) from None
                    jumps.append(tunnel)
                conn = await self._connect_hop(
                    self.node.host or "", self.node.port, self.node.user, client_keys, tunnel, target=True
                )
            except BaseException:
                for jump in reversed(jumps):
                    jump.close()
                raise
        self._jumps = jumps
        return conn

    async def _drop_connection(self) -> None:
        if self._rtt_task is not None:
            self._rtt_task.cancel()
            self._rtt_task = None
        conn, self._conn = self._conn, None
        jumps, self._jumps = self._jumps, []
        for c in [conn] + list(reversed(jumps)):
            if c is None:
                continue
            c.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.wait_closed(), 1.0)

    async def close(self) -> None:
        """Close the connection (and jump hosts). Safe to call more than once; a later use reconnects."""
        async with self._connect_lock:
            await self._drop_connection()

    # --- RTT ------------------------------------------------------------------------------

    async def measure_rtt(self, conn: asyncssh.SSHClientConnection) -> Optional[float]:
        """Milliseconds for one global request round trip; None when it can't be measured."""
        started = time.perf_counter()
        try:
            request = getattr(conn, "_make_global_request", None)
            if request is not None:
                await asyncio.wait_for(request(_RTT_REQUEST), self.ssh.connect_timeout)
            else:  # an asyncssh without it: an exec costs a process start too, but still says something
                await asyncio.wait_for(conn.run("true", check=False), self.ssh.connect_timeout)
        except (asyncio.TimeoutError, asyncssh.Error, OSError):
            return None
        return round((time.perf_counter() - started) * 1000.0, 2)

    async def _refresh_rtt(self, conn: asyncssh.SSHClientConnection) -> None:
        while True:
            await asyncio.sleep(RTT_REFRESH_S)
            rtt = await self.measure_rtt(conn)
            if rtt is not None:
                self.rtt_measured(rtt)

    async def _connected(self) -> asyncssh.SSHClientConnection:
        """connection(), with the RTT measured once per new connection."""
        conn = await self.connection()
        if self._rtt_task is None or self._rtt_task.done():
            self.rtt_measured(await self.measure_rtt(conn))
            self._rtt_task = asyncio.ensure_future(self._refresh_rtt(conn))
        return conn

    # --- channels and commands --------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def channel_slot(self) -> AsyncIterator[None]:
        """Hold one of the connection's `max_channels` channel slots (for SFTP, tails, the stream)."""
        async with self._channels:
            self.channels_in_use += 1
            self.channels_peak = max(self.channels_peak, self.channels_in_use)
            try:
                yield
            finally:
                self.channels_in_use -= 1

    async def _create_process(self, conn: asyncssh.SSHClientConnection, command: str, merge: bool) -> Any:
        """Open an exec channel; a refused open is tried again a few times.

        sshd frees a session slot only in its garbage pass after our CLOSE, so an open
        sent right behind a close can find MaxSessions still full for a moment.
        """
        for delay in CHANNEL_RETRY_DELAYS + (None,):
            try:
                return await conn.create_process(
                    command, stderr=asyncssh.STDOUT if merge else asyncssh.PIPE, errors="replace"
                )
            except asyncssh.ChannelOpenError:
                if delay is None or self._lost is not None:
                    raise
                await asyncio.sleep(delay)

    async def _exec(
        self,
        command: str,
        timeout: float,
        input: Optional[str] = None,
        merge: bool = False,
        output_limit: int = EXEC_OUTPUT_LIMIT,
    ) -> Tuple[Optional[int], str, str]:
        """Run `command` with `input` on stdin: (exit status, stdout, stderr), each stream read up to
        `output_limit` characters (past that the command is stopped: LinkError saying so)."""
        conn = await self.connection()
        async with self.channel_slot():
            try:
                process = await self._create_process(conn, command, merge)
            except asyncssh.ChannelOpenError as exc:
                raise LinkError(STATE_DOWN, "cannot open a channel: %s" % exc.reason) from None
            except (asyncssh.Error, OSError) as exc:
                raise LinkError(*describe_connect_error(exc, timeout)) from None
            try:
                stdout, stderr = await asyncio.wait_for(
                    communicate_bounded(process, input, merge, output_limit), timeout
                )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(process.wait_closed(), PROBE_EXIT_WAIT_S)
            except asyncio.TimeoutError:
                raise LinkError(STATE_DOWN, "command timed out after %g s" % timeout) from None
            except OutputTooLong as exc:
                raise OutputOverLimit(STATE_DOWN, "the command's %s" % exc) from None
            except (asyncssh.Error, OSError) as exc:
                raise connection_lost(exc) from None
            finally:
                process.close()
        return exit_status_of(process), stdout or "", stderr or ""

    async def run_command(
        self, argv: List[str], timeout: float = 30.0, input: Optional[str] = None
    ) -> Tuple[Optional[int], str, str]:
        """Run argv on the node (each word quoted with shlex.join): (exit status, stdout, stderr).

        The status is None when the node gave none (killed by a signal: -1). Raises
        LinkError when the node cannot be reached or the command outlives `timeout`.
        """
        if not argv:
            raise ValueError("empty command")
        return await self._exec(shlex.join([str(word) for word in argv]), timeout, input=input)
