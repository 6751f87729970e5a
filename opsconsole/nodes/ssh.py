"""A node's probe link over SSH: the probe streamed over the node's connection, states as they change.

The connection itself (logins, host keys, jump hosts, channels, commands, RTT) is
ssh_connection.SshConnection, shared by everything that reaches the node; SshLink is that
connection with the probe stream on it (the actions, log tails and SFTP use the same object).

States: connecting -> up (each frame) -> stale (no frame for 3 intervals, still
connected) -> down (lost, refused, timed out: retried with backoff). `auth` waits
for `retry()` or a change to the user's keys (credentials.py), and `hostkey` for
`retry()` or a change to known_hosts: retrying a wrong
key or a changed host key in a loop helps nobody and can lock the account. A node whose interpreter is missing or too
old is read by the nvidia-smi + /proc fallback instead (state `fallback`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import shlex
import time
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Deque, Dict, List, Optional, Sequence, Tuple, cast

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
from opsconsole.nodes.line_split import MAX_LINE_CHARS, LineSplitter
from opsconsole.nodes.smi_fallback import FallbackPoller, split_sections
from opsconsole.nodes.ssh_connection import (  # noqa: F401 (names importers of this module use)
    CHANNEL_RETRY_DELAYS,
    EXEC_OUTPUT_LIMIT,
    PREFERRED_CIPHERS,
    PROBE_EXIT_WAIT_S,
    READ_CHARS,
    STREAM_KEEPALIVE_SLACK,
    LinkError,
    OutputOverLimit,
    SshConnection,
    ciphers_for,
    connect_timeout_reason,
    connection_lost,
    describe_connect_error,
    exit_status_of,
    keepalive_beside_stream,
    keepalive_for,
    parse_jump,
)
from opsconsole.probe.wire_delta import StreamDecoder
from opsconsole.sanitize import printable_line
from opsconsole.units import format_frame_age

if TYPE_CHECKING:
    from opsconsole.model import NodeStateName

log = logging.getLogger(__name__)

STALE_INTERVALS = 3
FIRST_FRAME_GRACE_S = 5.0  # interpreter start and NVML init before the first frame
ERROR_LINES_KEPT = 20
ONCE_SETTLE_S = 0.25  # between the two fallback reads of poll_once, for CPU % and rates
# poll_once reads at most this much of the probe's output (a keyframe line is at most MAX_LINE_CHARS).
ONCE_OUTPUT_LIMIT = MAX_LINE_CHARS + (1 << 20)
# A fallback tick's /proc files and nvidia-smi tables are well under a MiB.
FALLBACK_OUTPUT_LIMIT = 16 * 1024 * 1024
# The stream sends a full frame this often (and first): a delta that cannot be applied
# (which a reliable SSH channel should never cause) costs at most this many seconds of frames.
# A keyframe costs the console several deltas' decoding: at 10 s they were 45 % of it.
KEYFRAME_EVERY_S = 30.0
# How often the one stale sweep of an event loop looks at every stream (see StaleSweep): a node goes
# `stale` at most this much later than STALE_INTERVALS intervals after its last frame.
STALE_SWEEP_S = 0.25
CREDENTIALS_CHECK_S = 2.0  # an `auth` node looks this often whether the user's keys changed (no login)
KNOWN_HOSTS_CHECK_S = 1.0  # a `hostkey` node looks this often whether known_hosts changed (a stat, no login)


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
        self._watched: Dict[Any, Tuple[List[float], Callable[[], None]]] = {}
        self._task: Optional[asyncio.Task] = None

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


def probe_frame_line(line: str) -> bool:
    """Whether a line before the probe's first frame can be that frame: every keyframe carries the
    frame version, a login banner or MOTD that happens to be JSON does not (it was taken for the
    node's frame: a host named after the MOTD's field, at its "time")."""
    return '"version":' in line or line.lstrip()[:1] != "{"


class FallbackScriptNotRun(OutputOverLimit):
    """The fallback's output holds none of its script's sections: as unusable as output over the limit
    (a bad frame: the last good frame stays, the next tick tries again)."""


def fallback_reason(why: str) -> str:
    """Why the node is read with nvidia-smi + /proc, and how to get the full probe back."""
    return (
        "no usable python3 on node: %s; using nvidia-smi + /proc (for the full probe: python3 >= %s on "
        'the node\'s PATH, or python = "/path/to/python3" in its [[nodes]] entry)'
        % (why, ".".join(map(str, MIN_PYTHON)))
    )


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
        self._splitters: Dict[Any, LineSplitter] = {}
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


class SshLink(SshConnection, NodeLink):
    """Streams the probe from one node over its SSH connection (see the module docstring)."""

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
        SshConnection.__init__(self, node, ssh, float(interval), login_limiter, rng)
        self.interval = float(interval)
        self.disk_paths = tuple(disk_paths)
        self._backoff = Backoff(ssh.backoff_initial, ssh.backoff_max, self._rng)
        self._retry = asyncio.Event()
        self.waiting_for_user = False  # parked in auth/hostkey until retry(): no login attempt meanwhile
        self._publish: Optional[Publish] = None
        self._state = NodeState(name=node.name, address=self.address, since=time.time())
        self.error_lines: Deque[str] = collections.deque(maxlen=ERROR_LINES_KEPT)

    def rtt_measured(self, rtt_ms: Optional[float]) -> None:
        SshConnection.rtt_measured(self, rtt_ms)
        self._state = replace(self._state, rtt_ms=rtt_ms)  # shown with the next frame

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

    def _enter(
        self, state: "NodeStateName", reason: Optional[str] = None, publish: bool = True, **fields: Any
    ) -> NodeState:
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

    async def _wait_known_hosts(self) -> bool:
        """Park a `hostkey` node until retry() or until a known_hosts file changes, whichever comes first.

        Removing the old line (`ssh-keygen -R`) or adding the right key outside the console is how a person
        answers a changed key: the next attempt then sees the key unknown (T trusts it) or matching (it
        connects). Only the files' metadata is looked at meanwhile: no login while they stay as they were.
        True when woken by the files, False by retry().
        """
        seen = self._verifier.read_signature

        async def changed() -> bool:
            return self._verifier.files_signature() != seen

        return await self._wait_for_user(changed, KNOWN_HOSTS_CHECK_S)

    async def _wait_credentials(self) -> bool:
        """Park an `auth` node until retry() or until the user's keys change (`ssh-add`, a key file
        made or replaced, the ssh config or the node's identity edited): one more login then, with
        the node kept in `auth` until it says otherwise. Only metadata and the agent's key list are
        looked at meanwhile. True when woken by the keys, False by retry()."""
        seen = self.credentials_seen

        async def changed() -> bool:
            return seen is not None and await self.credentials() != seen

        return await self._wait_for_user(changed, CREDENTIALS_CHECK_S)

    async def _wait_for_user(self, changed: Callable[[], Awaitable[bool]], period: float) -> bool:
        """Wait for retry() (False) or for `changed()`, asked every `period` s, to say True (True)."""
        woken = False
        self.waiting_for_user = True
        try:
            while True:
                try:
                    await asyncio.wait_for(self._retry.wait(), period)
                    break
                except asyncio.TimeoutError:
                    if await changed():
                        woken = True
                        break
        finally:
            self.waiting_for_user = False
        self._retry.clear()
        return woken

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
                channel, session = await conn.create_session(
                    lambda: ProbeSession(on_line, on_too_long), self.probe_command(), encoding="utf-8", errors="replace"
                )
                return channel, cast(ProbeSession, session)
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
        output: List[str] = []

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
            if seen["frames"] == 0 and not probe_frame_line(line):
                frame, why = None, None  # a login banner's line, even a JSON one: text, not a frame
            else:
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
            age = "no frame for %s" % format_frame_age(time.time() - since) if since else "no frame yet"
            bad = self._state.reason
            if bad is not None and bad.startswith(BAD_FRAME):  # frames come, but bad ones: say so first
                age = "%s (no good frame for %s)" % (bad, format_frame_age(time.time() - since)) if since else bad
            self._enter(STATE_STALE, age)

    # --- the fallback ------------------------------------------------------------------------

    async def _fallback_tick(self, poller: FallbackPoller, timeout: float) -> NodeFrame:
        started = time.perf_counter()
        status, out, _ = await self._exec(poller.command(), timeout, merge=True, output_limit=FALLBACK_OUTPUT_LIMIT)
        ms = round((time.perf_counter() - started) * 1000.0, 2)
        if not split_sections(out):
            # Not one of the script's section lines: the node ran something else (a ForceCommand or a
            # login script that replaces the command). A frame of nothing but errors would pass for live.
            printed = next((line.strip() for line in out.splitlines() if line.strip()), "nothing")
            raise FallbackScriptNotRun(
                STATE_DOWN,
                "the node ran none of the fallback script (a ForceCommand or login script replacing the "
                "command? try: ssh NODE echo ok); exit status %s, it printed: %s"
                % (status, printable_line(printed[:200])),
            )
        return poller.frame_from_output(out, probe_ms=ms)

    async def _run_fallback(self, why: str) -> str:
        """Read the node with nvidia-smi + /proc every interval until the connection fails; returns why."""
        reason = fallback_reason(why)
        poller = FallbackPoller(self.node.name, self.disk_paths)
        loop = asyncio.get_running_loop()
        stale_after = STALE_INTERVALS * self.interval
        exec_timeout = max(self.ssh.connect_timeout, stale_after * 4)

        def bad_tick(why_bad: str) -> None:
            # The last good frame stays, live while it is fresh; with none at all the node is not
            # live (it would count as up with nothing to show), with an old one it is stale.
            received = self._state.received_at
            if received is None:
                self._enter(STATE_DOWN, why_bad)
            elif time.time() - received > stale_after:
                self._enter(STATE_STALE, why_bad)
            else:
                self._enter(STATE_FALLBACK, why_bad)

        while True:
            started = loop.time()
            tick = asyncio.ensure_future(self._fallback_tick(poller, exec_timeout))
            try:
                done, _ = await asyncio.wait({tick}, timeout=stale_after)
                if not done:
                    self._enter(STATE_STALE, "no frame for %s (fallback)" % format_frame_age(stale_after))
                frame = await tick
            except OutputOverLimit as err:  # a bad frame: the last good one stays, the next tick tries again
                bad_tick(BAD_FRAME + err.reason)
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
            else:
                bad_tick(bad)
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))

    # --- run and poll_once ----------------------------------------------------------------------

    async def run(self, publish: Publish) -> None:
        """Connect, stream frames, reconnect with backoff; never returns until cancelled."""
        self._publish = publish
        quiet = False  # a retry the console started itself keeps the state it had while it runs
        try:
            while True:
                if self._state.state != STATE_DOWN and not quiet:
                    # A node that is down stays down (with its reason) while it is retried: no flicker.
                    self._enter(STATE_CONNECTING, None)
                quiet = False
                try:
                    conn = await self._connected()
                except LinkError as err:
                    self._enter(err.state, err.reason, fingerprint=err.fingerprint)
                    if err.state == STATE_HOSTKEY:
                        # The person acts on known_hosts (T, ssh-keygen -R): T shows `connecting`, a changed
                        # file keeps the key's state (and T usable) until the attempt says what it is now.
                        quiet = await self._wait_known_hosts()
                    elif err.state == STATE_AUTH:
                        # Not in a loop: a person has to act first (r, or a key added or changed here).
                        quiet = await self._wait_credentials()
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
            login = self.login_attempt
            if login is not None and not login.get("done"):  # cut short while logging in: say how far it got
                return self._enter(STATE_DOWN, connect_timeout_reason(login.get("conn"), timeout), publish=False)
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
        lines: List[str] = []
        found: Dict[str, Any] = {"frame": None, "bad": None}

        def on_line(line: str) -> None:
            if found["frame"] is not None:
                return
            frame, problem = decoder.decode_line(line) if probe_frame_line(line) else (None, None)
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
                    chunk = await process.stdout.read(READ_CHARS)
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
                raise connection_lost(exc) from None
            finally:
                process.close()
        return exit_status_of(process), lines, found["bad"], found["frame"]

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
