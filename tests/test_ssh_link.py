"""SshLink against real OpenSSH servers: frames, host keys, ~/.ssh/config, ProxyJump, commands, channels."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys

import asyncssh
import pytest

from opsconsole.config import NodeConfig, SshConfig
from opsconsole.model import STATE_DOWN, STATE_HOSTKEY, STATE_UP
from opsconsole.nodes.hostkeys import fingerprint, trust_host_key
from opsconsole.nodes.ssh import LinkError, SshLink, parse_jump
from tests.sshd import SSH_KEYGEN, StateLog, keygen, public_key, ssh_client, sshd_factory  # noqa: F401

pytestmark = pytest.mark.sshd

FAST = SshConfig(
    connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2, backoff_initial=0.05, backoff_max=0.5
)
INTERVAL = 0.3
HOSTNAME = os.uname().nodename


def ssh_fingerprint(pub_path) -> str:
    """The fingerprint as OpenSSH's own ssh-keygen computes it."""
    out = subprocess.run(
        [SSH_KEYGEN, "-l", "-E", "sha256", "-f", str(pub_path)], capture_output=True, text=True, check=True
    )
    return out.stdout.split()[1]


def node_for(server, name="n1", **fields) -> NodeConfig:
    return NodeConfig(name=name, host=server.address, port=server.port, **fields)


@contextlib.asynccontextmanager
async def running(link: SshLink, log: StateLog):
    task = asyncio.ensure_future(link.run(log))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await link.close()


async def test_two_nodes_stream_real_frames(sshd_factory):
    servers = [sshd_factory.start(), sshd_factory.start()]
    limiter = asyncio.Semaphore(8)
    links = [
        SshLink(node_for(s, name="node%d" % i), FAST, INTERVAL, login_limiter=limiter) for i, s in enumerate(servers)
    ]
    logs = [StateLog(), StateLog()]
    async with running(links[0], logs[0]), running(links[1], logs[1]):
        for i, log in enumerate(logs):
            # The second frame of a stream has CPU figures (the first only takes the baseline).
            state = await log.wait_for(lambda s: s.state == STATE_UP and s.frame.seq >= 2, 20)
            frame = state.frame
            assert frame.node == "node%d" % i
            assert frame.host.hostname == HOSTNAME
            assert frame.host.cpu_count == os.cpu_count()
            assert frame.host.cpu_percent is not None and frame.host.mem_total > 0
            assert [d.path for d in frame.host.disks] == ["/"]
            assert state.received_at is not None and state.rtt_ms is not None and state.rtt_ms > 0
            assert state.address == "%s:%d" % (servers[i].address, servers[i].port)
            assert log.names[0] == "connecting"
    for server in servers:
        assert server.count_log("Accepted publickey") == 1  # one connection per node, reused


async def test_poll_once_returns_a_frame_and_a_closed_port_is_down(sshd_factory):
    server = sshd_factory.start()
    link = SshLink(node_for(server), FAST, INTERVAL)
    try:
        state = await link.poll_once(20)
        assert state.state == STATE_UP, state.reason
        assert state.frame.host.hostname == HOSTNAME and state.frame.host.cpu_percent is not None
    finally:
        await link.close()
    port = server.port
    server.kill()
    closed = SshLink(NodeConfig(name="gone", host="127.0.0.1", port=port), FAST, INTERVAL)
    state = await closed.poll_once(5)
    assert state.state == STATE_DOWN and state.reason == "connection refused"
    assert state.frame is None


async def test_wrong_host_key_is_refused_with_the_presented_fingerprint(sshd_factory, ssh_client):
    server = sshd_factory.start(trust=False)
    ssh_client.trust_wrong_key(server)
    for policy in ("strict", "accept-new"):  # a changed key is refused under every policy
        link = SshLink(node_for(server), SshConfig(host_key_policy=policy, **_fast_fields()), INTERVAL)
        log = StateLog()
        async with running(link, log):
            state = await log.wait_state(STATE_HOSTKEY, 10)
            await asyncio.sleep(1.0)  # would a loop retry it, or a frame slip through?
        assert state.fingerprint == ssh_fingerprint(str(server.host_key) + ".pub")
        assert "CHANGED" in state.reason and state.fingerprint in state.reason
        assert all(s.frame is None for s in log.states)
        assert STATE_UP not in log.names
        assert link.connect_attempts == 1
    assert server.count_log("Accepted publickey") == 0  # never logged in to an impostor


async def test_changed_host_key_names_the_one_old_key_once(sshd_factory, ssh_client):
    server = sshd_factory.start()  # trusted: its key is the one line of known_hosts
    old = ssh_fingerprint(str(server.host_key) + ".pub")
    assert len(ssh_client.known_hosts.read_text().splitlines()) == 1
    server.kill()
    server.host_key.unlink()
    server.host_key.with_name(server.host_key.name + ".pub").unlink()
    server.start()  # regenerates the host key (as a reinstalled node does), same address and port
    new = ssh_fingerprint(str(server.host_key) + ".pub")
    assert new != old
    link = SshLink(node_for(server), SshConfig(**_fast_fields()), INTERVAL)
    log = StateLog()
    async with running(link, log):
        state = await log.wait_state(STATE_HOSTKEY, 10)
    assert "CHANGED" in state.reason and new in state.reason
    assert state.reason.count(old) == 1, state.reason


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"), reason="this machine has an NVIDIA driver")
async def test_a_node_without_pynvml_or_a_driver_says_no_driver_over_ssh(sshd_factory, tmp_path):
    venv = tmp_path / "bare-venv"  # the node's python3: no pynvml, as on a bare compute node
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    server = sshd_factory.start()
    link = SshLink(node_for(server, python=str(venv / "bin" / "python")), FAST, INTERVAL)
    try:
        state = await link.poll_once(20)
    finally:
        await link.close()
    assert state.state == STATE_UP, state.reason
    assert state.frame.gpus == () and state.frame.gpu_note is not None
    assert state.frame.gpu_note.startswith("no NVIDIA driver on this node"), state.frame.gpu_note
    assert "pynvml" not in state.frame.gpu_note


def _fast_fields():
    return dict(
        connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2, backoff_initial=0.05, backoff_max=0.5
    )


async def test_unknown_host_is_hostkey_until_trusted_and_retried(sshd_factory, ssh_client):
    server = sshd_factory.start(trust=False)
    link = SshLink(node_for(server), FAST, INTERVAL)
    log = StateLog()
    async with running(link, log):
        state = await log.wait_state(STATE_HOSTKEY, 10)
        assert "unknown host key" in state.reason
        assert state.fingerprint == ssh_fingerprint(str(server.host_key) + ".pub")
        # What the console does behind its confirmation: fetch, show, trust, retry.
        key = await asyncssh.get_server_host_key(server.address, server.port)
        assert fingerprint(key) == state.fingerprint
        line = trust_host_key(str(ssh_client.known_hosts), server.address, server.port, key)
        assert line == server.known_hosts_line()
        assert link.connect_attempts == 1
        mark = len(log.states)
        link.retry()
        up = await log.wait_state(STATE_UP, 20, start=mark)
    assert up.frame.host.hostname == HOSTNAME
    assert up.fingerprint is None
    assert ssh_client.known_hosts.read_text() == server.known_hosts_line()


async def test_accept_new_records_an_unknown_key_and_connects(sshd_factory, ssh_client):
    server = sshd_factory.start(trust=False)
    link = SshLink(node_for(server), SshConfig(host_key_policy="accept-new", **_fast_fields()), INTERVAL)
    log = StateLog()
    async with running(link, log):
        await log.wait_state(STATE_UP, 20)
    assert STATE_HOSTKEY not in log.names
    assert ssh_client.known_hosts.read_text() == server.known_hosts_line()


async def test_ssh_config_alias_with_its_own_identity_file(sshd_factory, ssh_client):
    alias_key = keygen(ssh_client.ssh_dir / "alias_key", "alias")
    # Only the alias's key is authorized: a login works only if IdentityFile was honoured.
    server = sshd_factory.start(authorized_keys=[public_key(alias_key)])
    ssh_client.add_config(
        "Host gpu-alias\n  HostName %s\n  Port %d\n  User root\n  IdentityFile ~/.ssh/alias_key\n"
        % (server.address, server.port)
    )
    link = SshLink(NodeConfig(name="alias", host="gpu-alias"), FAST, INTERVAL)
    state = await link.poll_once(20)
    await link.close()
    assert state.state == STATE_UP, state.reason
    assert state.address == "gpu-alias"
    assert state.frame.host.hostname == HOSTNAME


async def test_proxy_jump_through_one_sshd_to_another(sshd_factory):
    jump = sshd_factory.start("127.0.0.1")
    target = sshd_factory.start("127.0.0.2")
    node = NodeConfig(
        name="behind", host=target.address, port=target.port, jump="root@%s:%d" % (jump.address, jump.port)
    )
    link = SshLink(node, FAST, INTERVAL)
    log = StateLog()
    async with running(link, log):
        state = await log.wait_for(lambda s: s.state == STATE_UP and s.frame.seq >= 2, 20)
    assert state.frame.host.hostname == HOSTNAME
    assert jump.count_log("Accepted publickey") == 1  # the jump host was logged in to ...
    assert target.count_log("Accepted publickey") == 1  # ... and the target reached through it


async def test_proxy_jump_from_ssh_config(sshd_factory, ssh_client):
    jump = sshd_factory.start("127.0.0.1")
    target = sshd_factory.start("127.0.0.2")
    ssh_client.add_config(
        "Host bastion\n  HostName %s\n  Port %d\n\nHost inner\n  HostName %s\n  Port %d\n  ProxyJump bastion\n"
        % (jump.address, jump.port, target.address, target.port)
    )
    link = SshLink(NodeConfig(name="inner", host="inner"), FAST, INTERVAL)
    state = await link.poll_once(20)
    await link.close()
    assert state.state == STATE_UP, state.reason
    assert jump.count_log("Accepted publickey") == 1


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("bastion", (None, "bastion", None)),
        ("me@bastion", ("me", "bastion", None)),
        ("me@10.0.0.1:2222", ("me", "10.0.0.1", 2222)),
        ("[::1]:2200", (None, "::1", 2200)),
        ("a@b@c:22", ("a@b", "c", 22)),
    ],
)
def test_parse_jump(spec, expected):
    assert parse_jump(spec) == expected


async def test_run_command_passes_hostile_values_as_plain_words(sshd_factory, tmp_path):
    server = sshd_factory.start()
    link = SshLink(node_for(server), FAST, INTERVAL)
    marker = tmp_path / "pwned"
    hostile = ["$(touch %s)" % marker, "`touch %s`" % marker, "; touch %s" % marker, "a b'c\"d", "*", "\n$HOME"]
    try:
        status, out, err = await link.run_command(["ls", "-d", "--", hostile[0]])
        assert status != 0 and hostile[0] in err  # ls looked for a file of that very name
        status, out, _ = await link.run_command(["printf", "%s\\0"] + hostile)
        assert status == 0
        assert out.split("\0")[:-1] == hostile
    finally:
        await link.close()
    assert not marker.exists()


async def test_parallel_commands_stay_under_max_channels(sshd_factory):
    server = sshd_factory.start(MaxSessions="3")
    link = SshLink(node_for(server), SshConfig(max_channels=3, **_fast_fields()), INTERVAL)
    try:
        results = await asyncio.gather(
            *(link.run_command(["sh", "-c", "sleep 0.1; echo $0", str(i)]) for i in range(12))
        )
        assert [r[1].strip() for r in results] == [str(i) for i in range(12)]
        assert all(r[0] == 0 for r in results)
        assert link.channels_peak == 3  # parallel, and never past the cap
        assert link.channels_in_use == 0
    finally:
        await link.close()
    # The control: the same burst with a cap above sshd's MaxSessions does get refused.
    loose = SshLink(node_for(server), SshConfig(max_channels=12, **_fast_fields()), INTERVAL)
    try:
        outcomes = await asyncio.gather(
            *(loose.run_command(["sh", "-c", "sleep 1.5"]) for _ in range(12)), return_exceptions=True
        )
    finally:
        await loose.close()
    refused = [o for o in outcomes if isinstance(o, LinkError)]
    assert refused and all("channel" in o.reason for o in refused)
