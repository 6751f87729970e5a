"""A node reached over SSH: one asyncssh connection, the probe streamed over it, states as they change.

One persistent connection per node carries everything: the probe stream, commands
(`run_command`), and later log tails and SFTP (`connection()` plus `channel_slot()`).
Channels are counted against `ssh.max_channels`, under sshd's MaxSessions.

Connecting reads ~/.ssh/config and uses ssh-agent as `ssh` does (asyncssh defaults);
the node's port, user, identity and jump override it only when set. Logins queue on a
semaphore shared by the fleet (sshd's MaxStartups drops bursts) after a small random
jitter. Host keys are always checked (see hostkeys.py).

States: connecting -> up (each frame) -> stale (no frame for 3 intervals, still
connected) -> down (lost, refused, timed out: retried with backoff). `auth` and
`hostkey` wait for `retry()`: retrying a wrong key or a changed host key in a loop
helps nobody and can lock the account. A node whose interpreter is missing or too
old is read by the nvidia-smi + /proc fallback instead (state `fallback`).

RTT: the time of one SSH global request (`keepalive@openssh.com`, which OpenSSH answers
at once without starting anything) at connect and every RTT_REFRESH_S after. That is
the network plus sshd's event loop, not process start-up, which an `exec true` would add.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import getpass
import logging
import os
import random
import shlex
import socket
import time
import weakref
from dataclasses import replace
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Tuple

import asyncssh

from opsconsole.config import NodeConfig, SshConfig
from opsconsole.model import (
    BAD_FRAME,
    STATE_AUTH,
    STATE_CONNECTING,
    STATE_DOWN,
    STATE_FALLBACK,
    STATE_HOSTKEY,
    STATE_STALE,
    STATE_UP,
    FrameError,
    NodeFrame,
    NodeState,
    checked,
    replace_decoded,
)
from opsconsole.nodes.backoff import Backoff
from opsconsole.nodes.base import COMMANDS_SSH, NodeLink, Publish
from opsconsole.nodes.bundle import MIN_PYTHON, UNSUPPORTED_MARKER, probe_bundle
from opsconsole.nodes.hostkeys import HostKeyVerdict, HostKeyVerifier
from opsconsole.nodes.line_split import MAX_LINE_CHARS, LineSplitter
from opsconsole.nodes.smi_fallback import FallbackPoller
from opsconsole.probe.wire_delta import StreamDecoder

log = logging.getLogger(__name__)

DEFAULT_MAX_LOGINS = 8
LOGIN_JITTER_S = 0.05  # spreads a fleet's logins so they don't hit sshd in one burst
STALE_INTERVALS = 3
FIRST_FRAME_GRACE_S = 5.0  # interpreter start and NVML init before the first frame
RTT_REFRESH_S = 15.0
ERROR_LINES_KEPT = 20
PROBE_EXIT_WAIT_S = 2.0
ONCE_SETTLE_S = 0.25  # between the two fallback reads of poll_once, for CPU % and rates
ONCE_READ_CHARS = 65536
# poll_once reads at most this much of the probe's output (a keyframe line is at most MAX_LINE_CHARS).
ONCE_OUTPUT_LIMIT = MAX_LINE_CHARS + (1 << 20)
# Any command's stdout and stderr are each read up to this (the checkpoint helper's answers list
# every file of the units it pinned: tens of MB at the most); a fallback tick's /proc files and
# nvidia-smi tables are well under a MiB.
EXEC_OUTPUT_LIMIT = 256 * 1024 * 1024
FALLBACK_OUTPUT_LIMIT = 16 * 1024 * 1024
_RTT_REQUEST = b"keepalive@openssh.com"
CHANNEL_RETRY_DELAYS = (0.02, 0.05, 0.1, 0.2)
# The stream sends a full frame this often (and first): a delta that cannot be applied
# (which a reliable SSH channel should never cause) costs at most this many seconds of frames.
# A keyframe costs the console several deltas' decoding: at 10 s they were 45 % of it.
KEYFRAME_EVERY_S = 30.0
# Keepalives wait at least this many frame intervals of silence (see keepalive_beside_stream).
STREAM_KEEPALIVE_SLACK = 1.5
# How often the one stale sweep of an event loop looks at every stream (see StaleSweep): a node goes
# `stale` at most this much later than STALE_INTERVALS intervals after its last frame.
STALE_SWEEP_S = 0.25
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com")

# One limiter per event loop for links made without one (the fleet passes its own).
_default_limiters: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = (
    weakref.WeakKeyDictionary()
)


def _default_limiter(size: int) -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    limiter = _default_limiters.get(loop)
    if limiter is None:
        limiter = _default_limiters[loop] = asyncio.Semaphore(size)
    return limiter


class StaleSweep:
    """Every stream's stale check of one event loop in one task, every STALE_SWEEP_S.

    A stream watched by a timer of its own wakes the console once per node every few
    seconds to find its node fine: at 256 nodes that was a third of the loop's wake-ups.
    Each stream hands over its deadline (a one-item list its frames move, in loop time)
    and `went_quiet` is called once the deadline has passed, on every sweep until it moves
    again. The task runs while something is watched.
    """

    def __init__(self, period: float = STALE_SWEEP_S) -> None:
        self.period = period
        self._watched = {}  # type: Dict[Any, Tuple[List[float], Callable[[], None]]]
        self._task = None  # type: Optional[asyncio.Task]

    def watch(self, key: Any, deadline: List[float], went_quiet: Callable[[], None]) -> None:
        self._watched[key] = (deadline, went_quiet)
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._sweep())

    def unwatch(self, key: Any) -> None:
        self._watched.pop(key, None)
        if not self._watched and self._task is not None:
            self._task.cancel()
            self._task = None

    @property
    def watched(self) -> int:
        return len(self._watched)

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while self._watched:
            await asyncio.sleep(self.period)
            now = loop.time()
            for deadline, went_quiet in list(self._watched.values()):
                if deadline[0] <= now:
                    try:
                        went_quiet()
                    except Exception as exc:  # one node's trouble must not stop the others' checks
                        log.warning("stale check failed: %s: %s", type(exc).__name__, exc)


_sweeps: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, StaleSweep]" = weakref.WeakKeyDictionary()


def stale_sweep() -> StaleSweep:
    """The running event loop's StaleSweep."""
    loop = asyncio.get_running_loop()
    sweep = _sweeps.get(loop)
    if sweep is None:
        sweep = _sweeps[loop] = StaleSweep()
    return sweep


class LinkError(Exception):
    """The node cannot be reached: the state it is in (down, auth, hostkey) and why, in one line."""

    def __init__(self, state: str, reason: str, fingerprint: Optional[str] = None) -> None:
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
    user = None  # type: Optional[str]
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None  # type: Optional[int]
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


def describe_connect_error(exc: BaseException, timeout: float) -> Tuple[str, str]:
    """(state, reason) for an exception raised while connecting."""
    if isinstance(exc, asyncssh.PermissionDenied):
        return STATE_AUTH, "authentication failed: %s" % (exc.reason or "permission denied")
    if isinstance(exc, (asyncssh.KeyImportError, asyncssh.KeyEncryptionError)):
        return STATE_AUTH, "cannot use the identity key: %s" % exc
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return STATE_HOSTKEY, "host key not verifiable: %s" % exc.reason
    if isinstance(exc, asyncssh.DisconnectError):
        return STATE_DOWN, "connection lost: %s" % (exc.reason or type(exc).__name__)
    if isinstance(exc, asyncio.TimeoutError):
        return STATE_DOWN, "timed out after %g s" % timeout
    if isinstance(exc, ConnectionRefusedError):
        return STATE_DOWN, "connection refused"
    if isinstance(exc, socket.gaierror):
        return STATE_DOWN, "cannot resolve host: %s" % (exc.strerror or exc)
    if isinstance(exc, OSError):
        return STATE_DOWN, "cannot connect: %s" % (exc.strerror or exc)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return STATE_DOWN, "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


def unusable_python_reason(exit_status: Optional[int], lines: Sequence[str]) -> Optional[str]:
    """Why the node's interpreter cannot run the probe, judged from a run that gave no frame; None if it could.

    127/126 are the shell's "not found" and "not executable"; a SyntaxError means a
    python too old for the bundle's code; the bundle's own marker means older than MIN_PYTHON (3.6).
    """
    text = "\n".join(lines)
    meaningful = [line.strip() for line in lines if line.strip()]
    last = meaningful[-1] if meaningful else "exit status %s" % exit_status
    for line in meaningful:
        if line.startswith(UNSUPPORTED_MARKER):
            return "python %s is older than %s" % (
                line[len(UNSUPPORTED_MARKER) :].strip(),
                ".".join(map(str, MIN_PYTHON)),
            )
    if exit_status in (126, 127):
        return last
    if "SyntaxError" in text:
        return "python too old for the probe (%s)" % last
    if exit_status not in (0, None) and ("not found" in text or "No such file or directory" in text):
        return last
    return None


def _fallback_problem(frame: NodeFrame) -> Optional[str]:
    """None when the fallback's frame (parsed from nvidia-smi and /proc text) passes the frame checks, else why not."""
    try:
        checked(frame)
    except FrameError as exc:
        return BAD_FRAME + str(exc)
    return None


def fallback_reason(why: str) -> str:
    return "no usable python3 on node: %s; using nvidia-smi + /proc" % why


class ProbeSession(asyncssh.SSHClientSession):
    """The probe channel's receiving end: hands each complete line to `on_line` as it arrives.

    stdout and stderr are both read (an unread stderr window would stall stdout), each
    with its own LineSplitter so the two never mix within a line. A partial line left at
    the end is handed over too. A line longer than MAX_LINE_CHARS is dropped as it comes,
    never held whole, and reported to `on_too_long` with its length.
    `closed` resolves when the channel closes.
    """

    def __init__(self, on_line: Callable[[str], None], on_too_long: Optional[Callable[[int], None]] = None) -> None:
        self._on_line = on_line
        self._on_too_long = on_too_long or (lambda length: None)
        self._splitters = {}  # type: Dict[Any, LineSplitter]
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: str, datatype: Any) -> None:
        splitter = self._splitters.get(datatype)
        if splitter is None:
            splitter = self._splitters[datatype] = LineSplitter(self._on_line, self._on_too_long, MAX_LINE_CHARS)
        splitter.feed(data)

    def _flush(self) -> None:
        splitters, self._splitters = self._splitters, {}
        for splitter in splitters.values():
            splitter.flush()

    def eof_received(self) -> bool:
        self._flush()
        return False

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._flush()
        if not self.closed.done():
            self.closed.set_result(exc)


class OutputTooLong(Exception):
    """A command's output went over its limit (see _communicate_bounded)."""


async def _communicate_bounded(process: Any, input: Optional[str], merge: bool, limit: int) -> Tuple[str, str]:
    """process.communicate(input), but neither stream is held past `limit` characters: OutputTooLong."""
    if input is not None:
        process.stdin.write(input)
    process.stdin.write_eof()

    async def drain(stream: Any) -> str:
        parts = []  # type: List[str]
        size = 0
        while True:
            chunk = await stream.read(ONCE_READ_CHARS)
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


class SshLink(NodeLink):
    """Streams the probe from one node over a persistent SSH connection (see the module docstring)."""

    commands_run = COMMANDS_SSH

    def __init__(
        self,
        node: NodeConfig,
        ssh: SshConfig,
        interval: float,
        login_limiter: Optional[asyncio.Semaphore] = None,
        disk_paths: Sequence[str] = ("/",),
        rng: Optional[random.Random] = None,
    ) -> None:
        if not node.host:
            raise ValueError("node %r has no host" % node.name)
        self.name = node.name
        self.node = node
        self.ssh = ssh
        self.interval = float(interval)
        self.disk_paths = tuple(disk_paths)
        self.address = node.host if node.port is None else "%s:%d" % (node.host, node.port)
        self._rng = rng or random.Random()
        self._limiter = login_limiter
        self._verifier = HostKeyVerifier(ssh)
        self._backoff = Backoff(ssh.backoff_initial, ssh.backoff_max, self._rng)
        self._channels = asyncio.Semaphore(max(1, ssh.max_channels))
        self._connect_lock = asyncio.Lock()
        self._retry = asyncio.Event()
        self.waiting_for_user = False  # parked in auth/hostkey until retry(): no login attempt meanwhile
        self._conn = None  # type: Optional[asyncssh.SSHClientConnection]
        self._jumps = []  # type: List[asyncssh.SSHClientConnection]
        self._lost = None  # type: Optional[str]  # why the current connection ended
        self._rtt_task = None  # type: Optional[asyncio.Task]
        self._publish = None  # type: Optional[Publish]
        self._state = NodeState(name=node.name, address=self.address, since=time.time())
        self.connect_attempts = 0  # logins tried (tests count them: auth/hostkey must not loop)
        self.channels_in_use = 0
        self.channels_peak = 0
        self.error_lines = collections.deque(maxlen=ERROR_LINES_KEPT)  # type: Deque[str]
        self.last_host_key = None  # type: Optional[asyncssh.SSHKey]  # what a `hostkey` node presented
        self.last_host_key_target = None  # type: Optional[Tuple[str, Optional[int]]]

    # --- state ---------------------------------------------------------------------

    @property
    def state(self) -> NodeState:
        """The last state this link produced."""
        return self._state

    @property
    def last_error(self) -> Optional[str]:
        """The last non-frame line the probe printed (a warning or a traceback's end), if any."""
        return self.error_lines[-1] if self.error_lines else None

    @property
    def rtt_ms(self) -> Optional[float]:
        return self._state.rtt_ms

    def _enter(self, state: str, reason: Optional[str] = None, publish: bool = True, **fields: Any) -> NodeState:
        now = time.time()
        since = self._state.since if self._state.state == state else now
        if state != STATE_HOSTKEY:
            fields.setdefault("fingerprint", None)
        self._state = replace(self._state, state=state, reason=reason, since=since, **fields)
        if publish and self._publish is not None:
            self._publish(self._state)
        return self._state

    def retry(self) -> None:
        """Try again now: wakes a node waiting in `auth`/`hostkey` (after the user fixed it) or in backoff."""
        self._backoff.reset()
        self._retry.set()

    async def _wait_retry(self, delay: Optional[float]) -> None:
        """Sleep `delay` seconds (None: until retry()), cut short by retry()."""
        try:
            if delay is None:
                self.waiting_for_user = True
                try:
                    await self._retry.wait()
                finally:
                    self.waiting_for_user = False
            else:
                await asyncio.wait_for(self._retry.wait(), delay)
        except asyncio.TimeoutError:
            pass
        self._retry.clear()

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

    def _client_factory(self, verdict_factory: Any, on_lost: bool) -> Any:
        link = self

        class _Client(verdict_factory):  # type: ignore[misc, valid-type]
            def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
                self._conn = conn

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
        if target:  # the stream's frames arrive on this one: they are the traffic keepalives would make
            interval, count_max = keepalive_beside_stream(interval, count_max, self.interval)
        kwargs = dict(
            known_hosts=known,
            client_factory=self._client_factory(client_class, on_lost=target),
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
            return await asyncio.wait_for(asyncssh.connect(host, **kwargs), self.ssh.connect_timeout + 1.0)
        except asyncssh.HostKeyNotVerifiable as exc:
            raise self._hostkey_error(exc, verdict) from None
        except (asyncio.CancelledError, LinkError):
            raise
        except Exception as exc:
            state, reason = describe_connect_error(exc, self.ssh.connect_timeout)
            raise LinkError(state, reason) from None

    def _hostkey_error(self, exc: asyncssh.HostKeyNotVerifiable, verdict: HostKeyVerdict) -> LinkError:
        self.last_host_key = verdict.presented
        self.last_host_key_target = (verdict.host, verdict.port) if verdict.presented is not None else None
        if verdict.presented is None:
            return LinkError(STATE_HOSTKEY, "host key not verifiable: %s" % exc.reason)
        return LinkError(STATE_HOSTKEY, verdict.reason(self._verifier.path), fingerprint=verdict.fingerprint)

    async def _open(self) -> asyncssh.SSHClientConnection:
        self.connect_attempts += 1
        client_keys = None  # type: Optional[List[Any]]
        if self.node.identity:
            try:
                client_keys = [asyncssh.read_private_key(self.node.identity)]
            except (OSError, asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as exc:
                raise LinkError(STATE_AUTH, "cannot read identity %s: %s" % (self.node.identity, exc)) from None
        limiter = self._limiter or _default_limiter(self.ssh.max_logins or DEFAULT_MAX_LOGINS)
        async with limiter:
            await asyncio.sleep(self._rng.uniform(0.0, LOGIN_JITTER_S))
            tunnel = None  # type: Optional[asyncssh.SSHClientConnection]
            jumps = []  # type: List[asyncssh.SSHClientConnection]
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
                self._state = replace(self._state, rtt_ms=rtt)  # shown with the next frame

    async def _connected(self) -> asyncssh.SSHClientConnection:
        """connection(), with the RTT measured once per new connection."""
        conn = await self.connection()
        if self._rtt_task is None or self._rtt_task.done():
            rtt = await self.measure_rtt(conn)
            self._state = replace(self._state, rtt_ms=rtt)
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
                    _communicate_bounded(process, input, merge, output_limit), timeout
                )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(process.wait_closed(), PROBE_EXIT_WAIT_S)
            except asyncio.TimeoutError:
                raise LinkError(STATE_DOWN, "command timed out after %g s" % timeout) from None
            except OutputTooLong as exc:
                raise OutputOverLimit(STATE_DOWN, "the command's %s" % exc) from None
            except (asyncssh.Error, OSError) as exc:
                raise LinkError(STATE_DOWN, "connection lost: %s" % (getattr(exc, "reason", None) or exc)) from None
            finally:
                process.close()
        status = process.exit_status
        if status is None and process.exit_signal:
            status = -1
        return status, stdout or "", stderr or ""

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

    # --- the probe stream ------------------------------------------------------------------

    def probe_command(self, once: bool = False) -> str:
        """The quoted command line that runs the bundle on the node (the stream as keyframes and deltas)."""
        argv = shlex.split(self.node.python) + ["-"]
        if once:
            argv += ["--once"]
        else:
            keyframe_every = max(1, min(30, int(KEYFRAME_EVERY_S / self.interval)))
            argv += ["--interval", "%g" % self.interval, "--delta", "--keyframe-every", str(keyframe_every)]
        argv += ["--node-name", self.node.name]
        for path in self.disk_paths:
            argv += ["--disk", path]
        return shlex.join(argv)

    def _note_line(self, line: str) -> None:
        text = line.rstrip("\n")
        if text.strip():
            self.error_lines.append(text[:500])

    def _bad_frame(self, why: str) -> None:
        """A line that should have been a frame was not: say so on the node, keep its last good frame."""
        self._note_line(why)
        self._enter(self._state.state, why)

    async def _open_probe_session(
        self, conn: asyncssh.SSHClientConnection, on_line: Callable[[str], None], on_too_long: Callable[[int], None]
    ) -> Tuple[Any, "ProbeSession"]:
        """Open the probe's exec channel with a ProbeSession on it; a refused open is tried again (see _create_process)."""
        for delay in CHANNEL_RETRY_DELAYS + (None,):
            try:
                return await conn.create_session(
                    lambda: ProbeSession(on_line, on_too_long), self.probe_command(), encoding="utf-8", errors="replace"
                )
            except asyncssh.ChannelOpenError:
                if delay is None or self._lost is not None:
                    raise
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _stream(self, conn: asyncssh.SSHClientConnection) -> Tuple[str, Optional[str]]:
        """Run the probe and publish its frames until it ends: ("lost"|"exited"|"fallback", detail).

        Lines are handled in the channel's data callback (ProbeSession), not read by this
        task: at fleet scale a task wake-up and a stream read per frame per node cost
        as much as the SSH packet itself.
        """
        loop = asyncio.get_running_loop()
        stale_after = STALE_INTERVALS * self.interval
        # The stale sweep reads the deadline each frame moves: no timer per line, none per node.
        deadline = [loop.time() + stale_after + FIRST_FRAME_GRACE_S]
        decoder = StreamDecoder()
        decode_line = decoder.decode_line
        seen = {"frames": 0, "dropping": False}
        output = []  # type: List[str]

        def on_line(line: str) -> None:
            try:
                handle_line(line)
            except Exception as exc:  # called from asyncssh's data callback: a bug here must not end the connection
                self._note_line("cannot handle a probe line: %s: %s" % (type(exc).__name__, exc))

        def bad_line(why: str) -> None:
            if not seen["dropping"]:  # once per broken chain, not once per delta dropped after it
                self._bad_frame(why)
            seen["dropping"] = True

        def on_too_long(length: int) -> None:
            try:
                bad_line("%sa line of %d characters, over the limit of %d" % (BAD_FRAME, length, MAX_LINE_CHARS))
            except Exception as exc:  # as on_line
                self._note_line("cannot handle a probe line: %s: %s" % (type(exc).__name__, exc))

        def handle_line(line: str) -> None:
            frame, why = decode_line(line)
            if frame is None:
                if why is None:  # no frame: a warning or a traceback the probe printed
                    self._note_line(line)
                    if seen["frames"] == 0 and len(output) < ERROR_LINES_KEPT:
                        output.append(line.rstrip("\n"))
                else:
                    bad_line(why)
                return
            seen["dropping"] = False
            seen["frames"] += 1
            if seen["frames"] == 1:
                self._backoff.reset()
            self._publish_frame(frame)
            deadline[0] = loop.time() + stale_after

        async with self.channel_slot():
            try:
                channel, session = await self._open_probe_session(conn, on_line, on_too_long)
                channel.write(probe_bundle())
                channel.write_eof()
            except (asyncssh.Error, OSError) as exc:
                if self._lost is not None:
                    return "lost", self._lost
                return "exited", "cannot start the probe: %s" % (getattr(exc, "reason", None) or exc)
            sweep = stale_sweep()
            sweep.watch(self, deadline, self._went_quiet)
            try:
                await session.closed
            finally:
                sweep.unwatch(self)
                channel.close()
            with contextlib.suppress(asyncio.TimeoutError, asyncssh.Error, OSError):
                await asyncio.wait_for(channel.wait_closed(), PROBE_EXIT_WAIT_S)
        if self._lost is not None or conn.is_closed():
            return "lost", self._lost or "closed"
        status = channel.get_exit_status()
        if status is None and channel.get_exit_signal():
            status = -1
        if seen["frames"] == 0:
            why = unusable_python_reason(status, output)
            if why is not None:
                return "fallback", why
        last = self.last_error or "no output"
        return "exited", "probe exited with status %s: %s" % (status, last)

    def _publish_frame(self, frame: NodeFrame) -> None:
        """Enter `up` with a new frame: _enter's result, without dataclasses.replace's cost on the hot path."""
        if self._state.state != STATE_UP:
            self._enter(STATE_UP, None, frame=frame, received_at=time.time())
            return
        self._state = replace_decoded(
            self._state, {"reason": None, "fingerprint": None, "frame": frame, "received_at": time.time()}
        )
        if self._publish is not None:
            self._publish(self._state)

    def _went_quiet(self) -> None:
        """The stream's deadline passed without a frame (StaleSweep): enter `stale`; the next frame brings `up` back."""
        if self._state.state != STATE_STALE:
            since = self._state.received_at
            age = "no frame for %.1f s" % (time.time() - since) if since else "no frame yet"
            bad = self._state.reason
            if bad is not None and bad.startswith(BAD_FRAME):  # frames come, but bad ones: say so first
                age = "%s (no good frame for %.1f s)" % (bad, time.time() - since) if since else bad
            self._enter(STATE_STALE, age)

    # --- the fallback ------------------------------------------------------------------------

    async def _fallback_tick(self, poller: FallbackPoller, timeout: float) -> NodeFrame:
        started = time.perf_counter()
        status, out, _ = await self._exec(poller.command(), timeout, merge=True, output_limit=FALLBACK_OUTPUT_LIMIT)
        ms = round((time.perf_counter() - started) * 1000.0, 2)
        return poller.frame_from_output(out, probe_ms=ms)

    async def _run_fallback(self, why: str) -> str:
        """Read the node with nvidia-smi + /proc every interval until the connection fails; returns why."""
        reason = fallback_reason(why)
        poller = FallbackPoller(self.node.name, self.disk_paths)
        loop = asyncio.get_running_loop()
        stale_after = STALE_INTERVALS * self.interval
        exec_timeout = max(self.ssh.connect_timeout, stale_after * 4)
        while True:
            started = loop.time()
            tick = asyncio.ensure_future(self._fallback_tick(poller, exec_timeout))
            try:
                done, _ = await asyncio.wait({tick}, timeout=stale_after)
                if not done:
                    self._enter(STATE_STALE, "no frame for %.1f s (fallback)" % stale_after)
                frame = await tick
            except OutputOverLimit as err:  # a bad frame: the last good one stays, the next tick tries again
                self._enter(STATE_FALLBACK, BAD_FRAME + err.reason)
                await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))
                continue
            except LinkError as err:
                if self._lost is not None:
                    return "connection lost: %s" % self._lost
                return err.reason
            finally:
                if not tick.done():
                    tick.cancel()
            self._backoff.reset()
            bad = _fallback_problem(frame)
            if bad is None:
                self._enter(STATE_FALLBACK, reason, frame=frame, received_at=time.time())
            else:  # the last good frame stays
                self._enter(STATE_FALLBACK, bad)
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))

    # --- run and poll_once ----------------------------------------------------------------------

    async def run(self, publish: Publish) -> None:
        """Connect, stream frames, reconnect with backoff; never returns until cancelled."""
        self._publish = publish
        try:
            while True:
                if self._state.state != STATE_DOWN:
                    # A node that is down stays down (with its reason) while it is retried: no flicker.
                    self._enter(STATE_CONNECTING, None)
                try:
                    conn = await self._connected()
                except LinkError as err:
                    self._enter(err.state, err.reason, fingerprint=err.fingerprint)
                    if err.state in (STATE_AUTH, STATE_HOSTKEY):
                        await self._wait_retry(None)  # not in a loop: a person has to act first
                    else:
                        await self._wait_retry(self._backoff.next_delay())
                    continue
                outcome, detail = await self._stream(conn)
                if outcome == "fallback":
                    reason = await self._run_fallback(detail or "")
                    self._enter(STATE_DOWN, reason)
                elif outcome == "lost":
                    self._enter(STATE_DOWN, "connection lost: %s" % detail)
                else:
                    self._enter(STATE_DOWN, detail)
                await self._wait_retry(self._backoff.next_delay())
        finally:
            self._publish = None

    async def poll_once(self, timeout: float) -> NodeState:
        """One frame (state up or fallback) or the reason there is none, within `timeout` seconds."""
        try:
            return await asyncio.wait_for(self._poll_once(timeout), timeout)
        except asyncio.TimeoutError:
            return self._enter(STATE_DOWN, "no frame within %g s" % timeout, publish=False)
        except OutputOverLimit as err:
            return self._enter(STATE_DOWN, BAD_FRAME + err.reason, publish=False)
        except LinkError as err:
            return self._enter(err.state, err.reason, publish=False, fingerprint=err.fingerprint)

    async def _probe_once_output(
        self, conn: asyncssh.SSHClientConnection
    ) -> Tuple[Optional[int], List[str], Optional[str], Optional[NodeFrame]]:
        """Run the probe once and read its output as it comes, bounded: (exit status, the lines before a
        frame (each cut to 500 characters, at most ERROR_LINES_KEPT), why no frame came (a bad frame), the frame).

        Reading stops at the first frame and after ONCE_OUTPUT_LIMIT characters: a node that sends an
        endless line or gigabytes is a bad frame, never memory held by the console (a line over
        MAX_LINE_CHARS is let go as it comes, see LineSplitter).
        """
        decoder = StreamDecoder()
        lines = []  # type: List[str]
        found = {"frame": None, "bad": None}  # type: Dict[str, Any]

        def on_line(line: str) -> None:
            if found["frame"] is not None:
                return
            frame, problem = decoder.decode_line(line)
            if frame is not None:
                found["frame"] = frame
                return
            if problem is not None:
                found["bad"] = found["bad"] or problem
            self._note_line(problem or line)
            if len(lines) < ERROR_LINES_KEPT:
                lines.append(line.rstrip("\n")[:500])

        def on_too_long(length: int) -> None:
            if found["bad"] is None:
                found["bad"] = "%sa line of %d characters, over the limit of %d" % (BAD_FRAME, length, MAX_LINE_CHARS)

        splitter = LineSplitter(on_line, on_too_long, MAX_LINE_CHARS)
        read = 0
        async with self.channel_slot():
            try:
                process = await self._create_process(conn, self.probe_command(once=True), merge=True)
            except asyncssh.ChannelOpenError as exc:
                raise LinkError(STATE_DOWN, "cannot open a channel: %s" % exc.reason) from None
            except (asyncssh.Error, OSError) as exc:
                raise LinkError(*describe_connect_error(exc, self.ssh.connect_timeout)) from None
            try:
                process.stdin.write(probe_bundle())
                process.stdin.write_eof()
                while found["frame"] is None:
                    chunk = await process.stdout.read(ONCE_READ_CHARS)
                    if not chunk:
                        splitter.flush()
                        break
                    read += len(chunk)
                    splitter.feed(chunk)
                    if read > ONCE_OUTPUT_LIMIT and found["frame"] is None:
                        found["bad"] = found[
                            "bad"
                        ] or "%s%d characters of output and no frame, over the limit of %d" % (
                            BAD_FRAME,
                            read,
                            ONCE_OUTPUT_LIMIT,
                        )
                        break
                if found["frame"] is None and found["bad"] is None:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(process.wait_closed(), PROBE_EXIT_WAIT_S)
            except (asyncssh.Error, OSError) as exc:
                raise LinkError(STATE_DOWN, "connection lost: %s" % (getattr(exc, "reason", None) or exc)) from None
            finally:
                process.close()
        status = process.exit_status
        if status is None and process.exit_signal:
            status = -1
        return status, lines, found["bad"], found["frame"]

    async def _poll_once(self, timeout: float) -> NodeState:
        conn = await self._connected()
        status, lines, bad, frame = await self._probe_once_output(conn)
        if frame is not None:
            return self._enter(STATE_UP, None, publish=False, frame=frame, received_at=time.time())
        if bad is not None:
            return self._enter(STATE_DOWN, bad, publish=False)
        why = unusable_python_reason(status, lines)
        if why is None:
            return self._enter(
                STATE_DOWN, "probe exited with status %s: %s" % (status, self.last_error or "no output"), publish=False
            )
        poller = FallbackPoller(self.node.name, self.disk_paths)
        await self._fallback_tick(poller, timeout)  # the baseline for CPU % and network rates
        await asyncio.sleep(ONCE_SETTLE_S)
        frame = await self._fallback_tick(poller, timeout)
        bad = _fallback_problem(frame)
        if bad is not None:
            return self._enter(STATE_DOWN, bad, publish=False)
        return self._enter(STATE_FALLBACK, fallback_reason(why), publish=False, frame=frame, received_at=time.time())
