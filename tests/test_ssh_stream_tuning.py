"""The SSH stream's receive path and its settings: line splitting, keepalives beside the stream, ciphers."""

from __future__ import annotations

import asyncssh
import pytest

from opsconsole.nodes.ssh import (
    MAX_LINE_CHARS,
    PREFERRED_CIPHERS,
    ProbeSession,
    ciphers_for,
    keepalive_beside_stream,
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


async def test_a_line_without_end_is_handed_over_instead_of_growing():
    lines = []
    session = ProbeSession(lines.append)
    chunk = "x" * (MAX_LINE_CHARS // 2 + 1)
    session.data_received(chunk, None)
    assert lines == []
    session.data_received(chunk, None)
    assert lines == [chunk + chunk]
    session.data_received("tail\n", None)
    assert lines[-1] == "tail\n"


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
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await link.close()
