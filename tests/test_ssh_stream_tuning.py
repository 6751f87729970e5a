"""The SSH stream's receive path and its settings: line splitting, keepalives beside the stream, ciphers,
the one stale sweep of all streams, and the scale simulator's packets against the real sshd's."""

from __future__ import annotations

import asyncssh
import pytest

from opsconsole.nodes.ssh import (
    MAX_LINE_CHARS,
    PREFERRED_CIPHERS,
    ProbeSession,
    StaleSweep,
    ciphers_for,
    keepalive_beside_stream,
    stale_sweep,
)
from tests.sshd import ssh_client, sshd_factory  # noqa: F401  (fixtures)

STDERR = asyncssh.EXTENDED_DATA_STDERR


async def test_probe_session_hands_over_whole_lines_however_the_data_is_cut():
    lines = []
    session = ProbeSession(lines.append)
    session.data_received('{"a":1}\n', None)  # one packet, one line
    session.data_received('{"b":', None)
    session.data_received("2}\n{", None)
    session.data_received('"c":3}\n{"d":4}\n', None)
    assert lines == ['{"a":1}\n', '{"b":2}\n', '{"c":3}\n', '{"d":4}\n']


async def test_stderr_and_stdout_never_mix_within_a_line():
    lines = []
    session = ProbeSession(lines.append)
    session.data_received('{"frame":', None)
    session.data_received("Traceback (most", STDERR)
    session.data_received(" recent call last):\n", STDERR)
    session.data_received("1}\n", None)
    assert lines == ["Traceback (most recent call last):\n", '{"frame":1}\n']


async def test_the_rest_is_handed_over_at_the_end_and_closed_resolves():
    lines = []
    session = ProbeSession(lines.append)
    session.data_received("last words without a newline", STDERR)
    session.data_received('{"cut', None)
    assert lines == []
    assert session.eof_received() is False
    session.connection_lost(None)
    assert sorted(lines) == ["last words without a newline", '{"cut']
    assert session.closed.done() and session.closed.result() is None


async def test_a_line_over_the_limit_is_dropped_as_it_comes_and_reported():
    lines, too_long = [], []
    session = ProbeSession(lines.append, too_long.append)
    chunk = "x" * (MAX_LINE_CHARS // 2 + 1)
    session.data_received(chunk, None)
    session.data_received(chunk, None)  # over the limit: let go of, not held
    assert lines == [] and too_long == [] and not session._splitters[None]._parts
    session.data_received("tail\n{}\n", None)
    assert too_long == [2 * len(chunk) + 5] and lines == ["{}\n"]


@pytest.mark.parametrize(
    "configured, stream_interval, expected",
    [
        ((1.0, 3), 1.0, (1.5, 2)),  # the default beside a 1 s stream: given up after 4.5 s (configured 4 s)
        ((0.5, 2), 0.3, (0.5, 2)),  # already longer than the frames' gap: as configured
        ((0.5, 2), 1.0, (1.5, 1)),
        ((5.0, 3), 1.0, (5.0, 3)),
        ((1.0, 3), 0.0, (1.0, 3)),
    ],
)
def test_keepalives_beside_a_stream_wait_past_one_frame_gap(configured, stream_interval, expected):
    interval, count = keepalive_beside_stream(configured[0], configured[1], stream_interval)
    assert (interval, count) == expected
    assert interval >= min(configured[0], 1.5 * stream_interval) or interval == configured[0]
    if stream_interval > 0:
        assert interval >= 1.5 * stream_interval or interval == configured[0]


def test_ciphers_prefer_aes_gcm_unless_ssh_config_chooses(tmp_path):
    none = tmp_path / "absent"
    offered = ciphers_for("gpu01", None, None, config_path=str(none))
    assert offered[: len(PREFERRED_CIPHERS)] == list(PREFERRED_CIPHERS)
    assert len(offered) == len(set(offered)) and "aes256-ctr" in offered
    config = tmp_path / "config"
    config.write_text("Host gpu01\n    Ciphers chacha20-poly1305@openssh.com\n")
    assert ciphers_for("gpu01", None, None, config_path=str(config)) is None  # asyncssh applies the file
    assert ciphers_for("gpu02", None, None, config_path=str(config))[0] == PREFERRED_CIPHERS[0]


@pytest.mark.sshd
async def test_a_real_sshd_stream_runs_on_aes_gcm_with_keepalives_past_the_frame_gap(sshd_factory):
    import asyncio
    import contextlib

    from opsconsole.config import NodeConfig, SshConfig
    from opsconsole.model import STATE_UP
    from opsconsole.nodes.ssh import SshLink
    from tests.sshd import StateLog

    server = sshd_factory.start()
    node = NodeConfig(name="n1", host=server.address, port=server.port)
    link = SshLink(node, SshConfig(connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=3), 0.5)
    log = StateLog()
    task = asyncio.ensure_future(link.run(log))
    try:
        state = await log.wait_for(lambda s: s.state == STATE_UP and s.frame.seq >= 3, 20)
        conn = link._conn
        assert conn.get_extra_info("recv_cipher") == PREFERRED_CIPHERS[0]
        assert conn.get_extra_info("send_cipher") == PREFERRED_CIPHERS[0]
        assert (conn._keepalive_interval, conn._keepalive_count_max) == (0.75, 2)  # 2 s to give up, as configured
        assert state.frame.top_processes and state.frame.top_processes[0].pid > 0  # the lazy lists, read
        assert state.frame.host.cpu_per_core  # the lazy cores, read
        assert stale_sweep().watched == 1  # the stream's stale check is the loop's one sweep, no timer of its own
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await link.close()
    assert stale_sweep().watched == 0


async def _sweeps_until(predicate, sweep: StaleSweep, most: int = 500) -> None:
    import asyncio

    for _ in range(most):  # a bounded number of sweep periods, not a wall-clock deadline
        if predicate():
            return
        await asyncio.sleep(sweep.period)
    raise AssertionError("condition not met after %d sweeps" % most)


async def test_one_sweep_finds_every_quiet_stream_and_ends_with_the_last():
    import asyncio

    loop = asyncio.get_running_loop()
    sweep = StaleSweep(period=0.01)
    quiet = []
    passed, ahead = [loop.time() - 1.0], [loop.time() + 3600.0]

    def broken() -> None:
        quiet.append("broken")
        raise RuntimeError("a bug in one node's check")

    sweep.watch("passed", passed, lambda: quiet.append("passed"))
    sweep.watch("ahead", ahead, lambda: quiet.append("ahead"))
    sweep.watch("broken", [loop.time() - 1.0], broken)
    task = sweep._task
    await _sweeps_until(lambda: quiet.count("passed") >= 2 and quiet.count("broken") >= 2, sweep)
    assert "ahead" not in quiet  # and the broken one did not stop the sweep
    passed[0] = loop.time() + 3600.0  # a frame came: the deadline moved
    seen = len(quiet)
    sweep.unwatch("broken")
    for _ in range(5):  # five more sweeps: nothing is quiet any more
        await asyncio.sleep(sweep.period)
    assert quiet[seen:] == []
    assert sweep._task is task and not task.done()
    sweep.unwatch("passed")
    sweep.unwatch("ahead")
    await asyncio.sleep(0)
    assert task.cancelled() and sweep.watched == 0
    sweep.watch("again", [loop.time() - 1.0], lambda: quiet.append("again"))
    await _sweeps_until(lambda: "again" in quiet, sweep)  # a new task once something is watched again
    sweep.unwatch("again")
    assert stale_sweep() is stale_sweep()  # one per event loop


# --- the scale simulator sends what sshd sends ------------------------------------------


def _received_types(monkeypatch) -> list:
    from asyncssh.packet import SSHPacketLogger

    seen = []
    original = SSHPacketLogger.log_received_packet

    def spy(self, pkttype, pktid, packet, note=""):
        seen.append(pkttype)
        return original(self, pkttype, pktid, packet, note)

    monkeypatch.setattr(SSHPacketLogger, "log_received_packet", spy)
    return seen


async def _exec_packets(monkeypatch, host, port, user, key, known_hosts, command):
    """The types of the packets the client gets for one exec, after a first one warmed the connection up."""
    conn = await asyncssh.connect(host, port, username=user, client_keys=[key], known_hosts=known_hosts, config=None)
    try:
        await conn.run(command, check=False)
        with monkeypatch.context() as patch:
            seen = _received_types(patch)
            result = await conn.run(command, check=False)
        return seen, result
    finally:
        conn.close()


@pytest.mark.sshd
async def test_the_scale_simulator_answers_an_exec_with_the_packets_sshd_sends(
    sshd_factory, ssh_client, tmp_path, monkeypatch
):
    from benchmarks.simulated_nodes import NVIDIA_SMI_COMMAND, SimulatedNodes, nvidia_smi_csv

    server = sshd_factory.start()
    csv = tmp_path / "nvidia-smi.csv"
    csv.write_bytes(nvidia_smi_csv())
    real, answer = await _exec_packets(
        monkeypatch,
        server.address,
        server.port,
        "root",
        str(ssh_client.key),
        str(ssh_client.known_hosts),
        "cat %s" % csv,
    )
    assert answer.exit_status == 0 and answer.stdout.encode() == nvidia_smi_csv()
    with SimulatedNodes(tmp_path / "sim", ports=1) as sim:
        simulated, answer = await _exec_packets(
            monkeypatch,
            "127.0.0.1",
            sim.ports[0],
            "sim000",
            sim.keys.client_key,
            sim.keys.known_hosts,
            NVIDIA_SMI_COMMAND,
        )
    assert answer.exit_status == 0 and answer.stdout.encode() == nvidia_smi_csv()
    # open confirmation, window adjust, exec success, data, EOF, exit-status, close: the baseline
    # polled in benchmarks/fleet_scale.py pays for what a real node's sshd makes it handle.
    assert sorted(simulated) == sorted(real)
    assert len(real) == 7
