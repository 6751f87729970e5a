"""SshLink when things go wrong, against real OpenSSH: refused, wrong key, killed, frozen, no python3."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import socket
from pathlib import Path

import pytest

from opsconsole.config import NodeConfig
from opsconsole.model import STATE_AUTH, STATE_DOWN, STATE_FALLBACK, STATE_STALE, STATE_UP
from opsconsole.nodes.backoff import Backoff
from opsconsole.nodes.smi_fallback import FallbackPoller, fallback_script, parse_df, split_sections
from opsconsole.nodes.ssh import SshLink
from tests.sshd import StateLog, keygen, public_key, ssh_client, sshd_factory  # noqa: F401
from tests.test_ssh_link import FAST, HOSTNAME, INTERVAL, node_for, running
from tests.waiting import wait_for

FIXTURES = Path(__file__).parent / "fixtures"


# --- backoff (pure) ------------------------------------------------------------------


class FixedRandom(random.Random):
    """random() returns the given fractions in turn."""

    def __init__(self, values):
        super().__init__()
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


@pytest.mark.parametrize(
    "initial, maximum, fractions, expected",
    [
        (1.0, 60.0, [1.0] * 8, [1, 2, 4, 8, 16, 32, 60, 60]),  # doubles, then capped
        (1.0, 60.0, [0.5] * 4, [0.5, 1, 2, 4]),  # full jitter: a fraction of the cap
        (0.1, 0.5, [1.0] * 5, [0.1, 0.2, 0.4, 0.5, 0.5]),
        (2.0, 1.0, [1.0] * 2, [2.0, 2.0]),  # a maximum below initial is raised to it
        (1.0, 60.0, [0.0, 0.25], [0.0, 0.5]),
    ],
)
def test_backoff_table(initial, maximum, fractions, expected):
    backoff = Backoff(initial, maximum, FixedRandom(fractions))
    assert [backoff.next_delay() for _ in expected] == pytest.approx(expected)


def test_backoff_reset_and_many_failures():
    backoff = Backoff(1.0, 30.0, FixedRandom([1.0] * 2000))
    for _ in range(1500):  # no overflow after very many failures
        delay = backoff.next_delay()
    assert delay == 30.0
    backoff.reset()
    assert backoff.next_delay() == 1.0
    with pytest.raises(ValueError):
        Backoff(0, 1)


# --- fallback parsing (pure, real captures) ---------------------------------------------


def proc_output(root: Path, smi_query: str, smi_apps: str) -> str:
    parts = ["@@opsconsole time", "1796220000"]
    for name, rel in (
        ("stat", "stat"),
        ("meminfo", "meminfo"),
        ("loadavg", "loadavg"),
        ("uptime", "uptime"),
        ("net_dev", "net/dev"),
    ):
        parts += ["@@opsconsole " + name, (root / rel).read_text()]
    parts += ["@@opsconsole hostname", "gpu-node-7"]
    parts += [
        "@@opsconsole df:0",
        "Filesystem 1024-blocks Used Available Capacity Mounted on",
        "/dev/my disk 1000 400 600 40% /",
    ]
    parts += ["@@opsconsole smi_gpu", smi_query, "@@opsconsole smi_gpu_rc", "0"]
    parts += ["@@opsconsole smi_apps", smi_apps, "@@opsconsole smi_apps_rc", "0", "@@opsconsole end"]
    return "\n".join(parts) + "\n"


def test_fallback_frames_from_captured_proc_and_h200_nvidia_smi():
    # Captured on an H200 with exactly the command lines the fallback runs (noheader, nounits).
    query = (FIXTURES / "h200_probe" / "smi-query-load.csv").read_text()
    apps = (FIXTURES / "h200_probe" / "smi-apps-load.csv").read_text()
    poller = FallbackPoller("n7", ("/",))
    first = poller.frame_from_output(proc_output(FIXTURES / "proc" / "t0", query, apps))
    second = poller.frame_from_output(proc_output(FIXTURES / "proc" / "t1", query, apps))
    assert first.host.cpu_percent is None  # the baseline
    assert second.host.cpu_percent is not None and 0 <= second.host.cpu_percent <= 100
    assert second.host.hostname == "gpu-node-7" and second.node == "n7"
    assert second.host.disks[0].total == 1000 * 1024 and second.host.disks[0].free == 600 * 1024
    assert second.gpu_source == "nvidia-smi" and len(second.gpus) >= 1
    assert second.gpus[0].name and "H200" in second.gpus[0].name
    assert second.driver_version and second.gpus[0].memory_total > 0
    assert second.processes and second.processes[0].gpu_index == second.gpus[0].index
    assert second.seq == 2 and second.time == 1796220000


def test_fallback_without_nvidia_smi_and_with_a_refused_field():
    poller = FallbackPoller("n", ("/",))
    missing = "@@opsconsole smi_gpu\nsh: 1: nvidia-smi: not found\n@@opsconsole smi_gpu_rc\n127\n@@opsconsole end\n"
    frame = poller.frame_from_output(missing)
    assert frame.gpu_source == "none" and "not found" in frame.gpu_note
    refused = '@@opsconsole smi_gpu\nField "memory.reserved" is not a valid field to query.\n@@opsconsole smi_gpu_rc\n2\n@@opsconsole end\n'
    frame = poller.frame_from_output(refused)
    assert frame.gpu_source == "none" and frame.errors
    assert "memory.reserved" not in poller.command()  # the next tick asks the basic fields


def test_fallback_script_quotes_disk_paths_and_sections_split():
    script = fallback_script(["/data/$(reboot)"])
    assert "'/data/$(reboot)'" in script
    assert split_sections("junk\n@@opsconsole a\n1\n2\n@@opsconsole b\n@@opsconsole c\nx") == {
        "a": "1\n2",
        "b": "",
        "c": "x",
    }
    assert parse_df("df: /x: No such file\n", "/x") is None


# --- real sshd ------------------------------------------------------------------------------


@pytest.mark.sshd
async def test_closed_port_is_down_and_retried_with_backoff(sshd_factory):
    server = sshd_factory.start()
    port = server.port
    server.kill()
    link = SshLink(NodeConfig(name="gone", host="127.0.0.1", port=port), FAST, INTERVAL)
    log = StateLog()
    async with running(link, log):
        state = await log.wait_state(STATE_DOWN, 5)
        await log.wait_for(lambda s: s.state == STATE_DOWN and link.connect_attempts >= 3, 10)
    assert state.reason == "connection refused" and state.frame is None


@pytest.mark.sshd
async def test_port_that_accepts_but_never_speaks_ssh_says_so(ssh_client):
    # A listening socket that accepts and stays silent (a hung sshd, or another service on the port):
    # the reason says TCP got through and the SSH greeting never came, not just "timed out".
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    quick = dataclasses.replace(FAST, connect_timeout=1.0)
    link = SshLink(NodeConfig(name="silent", host="127.0.0.1", port=port), quick, INTERVAL)
    log = StateLog()
    try:
        async with running(link, log):
            state = await log.wait_state(STATE_DOWN, 10)
    finally:
        silent.close()
    assert state.reason.startswith("the port accepted but sent no SSH greeting within 1 s: "), state.reason
    assert "try: ssh -v" in state.reason and state.frame is None


@pytest.mark.sshd
async def test_one_poll_cut_short_while_logging_in_says_how_far_the_login_got(ssh_client):
    # `opsconsole snapshot` polls with a deadline as long as the login's own: the deadline that ends
    # it still says the port accepted and no SSH greeting came, not just "no frame within 1 s".
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    quick = dataclasses.replace(FAST, connect_timeout=1.0)
    link = SshLink(NodeConfig(name="silent", host="127.0.0.1", port=silent.getsockname()[1]), quick, INTERVAL)
    try:
        state = await link.poll_once(1.0)
    finally:
        await link.close()
        silent.close()
    assert state.state == STATE_DOWN and state.frame is None
    assert state.reason.startswith("the port accepted but sent no SSH greeting within 1 s: "), state.reason


@pytest.mark.sshd
async def test_wrong_client_key_is_auth_and_not_retried_in_a_loop(sshd_factory, ssh_client):
    other = keygen(ssh_client.home / "someone_else", "other")
    server = sshd_factory.start(authorized_keys=[public_key(other)])
    link = SshLink(node_for(server), FAST, INTERVAL)
    log = StateLog()
    async with running(link, log):
        state = await log.wait_state(STATE_AUTH, 10)
        # Parked until the user acts (not sleeping a backoff period before the next login).
        await wait_for(lambda: link.waiting_for_user, "the link to wait for a retry")
        assert link.connect_attempts == 1
        # One login, as sshd saw it (its log line comes when it is done with the session).
        await wait_for(lambda: server.count_log("Connection closed by authenticating user"), "sshd's log line")
        assert server.count_log("Connection closed by authenticating user") == 1
        # The user fixes it (the key gets authorized) and asks for a retry.
        (server.dir / "authorized_keys").write_text(ssh_client.public_key() + "\n")
        mark = len(log.states)
        link.retry()
        await log.wait_state(STATE_UP, 20, start=mark)
    assert "authentication failed" in state.reason and state.frame is None
    assert log.names.count(STATE_AUTH) == 1


@pytest.fixture
def quick_credential_checks(monkeypatch):
    """An `auth` node looks at the user's keys every 0.2 s here (2 s in the console)."""
    import opsconsole.nodes.ssh as ssh_module

    monkeypatch.setattr(ssh_module, "CREDENTIALS_CHECK_S", 0.2)
    monkeypatch.setattr("opsconsole.nodes.credentials.AGENT_FRESH_S", 0.0)


@pytest.fixture
def ssh_agent(ssh_client, tmp_path, monkeypatch):
    """A real ssh-agent of our own (no keys), SSH_AUTH_SOCK pointing at it; killed after the test."""
    import shutil
    import subprocess

    agent = shutil.which("ssh-agent")
    if agent is None:
        pytest.skip("ssh-agent not installed")
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen([agent, "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until = 100
        while not sock.exists() and wait_until:
            import time

            time.sleep(0.05)
            wait_until -= 1
        assert sock.exists(), "ssh-agent made no socket"
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        yield sock
    finally:
        proc.kill()
        proc.wait()


def ssh_add(sock: Path, key: Path) -> None:
    import subprocess

    env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
    subprocess.run(["ssh-add", "-q", str(key)], env=env, check=True, stdin=subprocess.DEVNULL, capture_output=True)


@pytest.mark.sshd
async def test_an_auth_node_logs_in_by_itself_once_the_right_key_is_added_to_the_agent(
    sshd_factory, ssh_client, ssh_agent, quick_credential_checks
):
    # The node authorises a key the client has only in a file elsewhere: ~/.ssh's key is refused.
    # The user runs `ssh-add` (the real one, into a real agent): the node connects, no `c` needed.
    right = keygen(ssh_client.home / "right_key", "right")
    server = sshd_factory.start(authorized_keys=[public_key(right)])
    link = SshLink(node_for(server), FAST, INTERVAL)
    log = StateLog()
    async with running(link, log):
        await log.wait_state(STATE_AUTH, 10)
        await wait_for(lambda: link.waiting_for_user, "the link to wait for the user")
        # Unchanged keys: no second login however long it waits (five looks at the keys).
        await asyncio.sleep(1.0)
        assert link.connect_attempts == 1
        mark = len(log.states)
        ssh_add(ssh_agent, right)
        up = await log.wait_state(STATE_UP, 20, start=mark)
    assert link.connect_attempts == 2
    # Woken by the key, the node stays `auth` until the attempt says otherwise: no `connecting` flicker.
    assert [s.state for s in log.states[mark:]][0] == STATE_UP, log.names
    assert up.frame is not None


@pytest.mark.sshd
async def test_an_auth_node_logs_in_by_itself_once_its_identity_file_is_replaced(
    sshd_factory, ssh_client, quick_credential_checks
):
    # The node's `identity` names a key the node does not accept; the user puts the right key in
    # its place (a new file renamed over it, as an editor or `cp` would leave it).
    right = keygen(ssh_client.home / "right_key", "right")
    wrong = keygen(ssh_client.home / "wrong_key", "wrong")
    identity = ssh_client.home / "node_key"
    identity.write_bytes(wrong.read_bytes())
    identity.chmod(0o600)
    server = sshd_factory.start(authorized_keys=[public_key(right)])
    node = dataclasses.replace(node_for(server), identity=str(identity))
    link = SshLink(node, FAST, INTERVAL)
    log = StateLog()
    async with running(link, log):
        await log.wait_state(STATE_AUTH, 10)
        await wait_for(lambda: link.waiting_for_user, "the link to wait for the user")
        await asyncio.sleep(1.0)
        assert link.connect_attempts == 1
        mark = len(log.states)
        staged = ssh_client.home / "node_key.new"
        staged.write_bytes(right.read_bytes())
        staged.chmod(0o600)
        os.replace(staged, identity)
        await log.wait_state(STATE_UP, 20, start=mark)
    assert link.connect_attempts == 2


@pytest.mark.sshd
async def test_an_auth_node_whose_new_key_is_refused_too_tries_once_and_waits_again(
    sshd_factory, ssh_client, ssh_agent, quick_credential_checks
):
    # A key added that the node refuses as well: one login for the change, then parked again.
    other = keygen(ssh_client.home / "someone_else", "other")
    also_wrong = keygen(ssh_client.home / "also_wrong", "also wrong")
    server = sshd_factory.start(authorized_keys=[public_key(other)])
    link = SshLink(node_for(server), FAST, INTERVAL)
    log = StateLog()
    async with running(link, log):
        await log.wait_state(STATE_AUTH, 10)
        await wait_for(lambda: link.waiting_for_user, "the link to wait for the user")
        ssh_add(ssh_agent, also_wrong)
        await wait_for(lambda: link.connect_attempts == 2, "one login for the added key")
        await wait_for(lambda: link.waiting_for_user, "the link to wait again")
        await asyncio.sleep(1.0)
        assert link.connect_attempts == 2
    assert STATE_UP not in log.names


@pytest.mark.sshd
async def test_sshd_killed_mid_stream_then_restarted_comes_back_up(sshd_factory):
    server = sshd_factory.start()
    link = SshLink(node_for(server), FAST, INTERVAL)
    log = StateLog()
    async with running(link, log):
        up = await log.wait_state(STATE_UP, 20)
        server.kill()
        down = await log.wait_state(STATE_DOWN, 10)
        assert down.reason.startswith("connection lost") or down.reason == "connection refused"
        assert down.frame == up.frame or down.frame.seq >= up.frame.seq  # the last good frame is kept
        mark = len(log.states)
        await asyncio.sleep(0.5)
        server.start()
        back = await log.wait_state(STATE_UP, 20, start=mark)
    assert back.frame.seq == 1  # a new probe on a new connection
    assert back.frame.host.hostname == HOSTNAME
    assert server.count_log("Accepted publickey") == 2


@pytest.mark.sshd
async def test_frozen_sshd_goes_stale_then_down_within_the_keepalive_window(sshd_factory):
    server = sshd_factory.start()
    link = SshLink(node_for(server), FAST, INTERVAL)
    log = StateLog()
    loop = asyncio.get_running_loop()
    try:
        async with running(link, log):
            up = await log.wait_state(STATE_UP, 20)
            mark = len(log.states)
            server.freeze()
            frozen_at = loop.time()
            stale = await log.wait_state(STATE_STALE, 10, start=mark)
            down = await log.wait_state(STATE_DOWN, 10, start=mark)
            took = loop.time() - frozen_at
    finally:
        server.thaw()
    assert took < 10  # generous: keepalive 0.5 s x 2 notices it in about 1.5 s
    assert log.states.index(stale) < log.states.index(down)
    assert "keepalive" in down.reason
    assert down.frame is not None and down.frame.seq >= up.frame.seq


@pytest.mark.sshd
async def test_node_without_the_configured_python_uses_the_fallback(sshd_factory):
    server = sshd_factory.start()
    link = SshLink(node_for(server, python="/nonexistent/python3"), FAST, INTERVAL)
    log = StateLog()
    async with running(link, log):
        state = await log.wait_for(lambda s: s.state == STATE_FALLBACK and s.frame.seq >= 2, 20)
    assert state.reason.startswith("no usable python3 on node: ")
    assert (
        "; using nvidia-smi + /proc (for the full probe: python3 >= 3.6 on the node's PATH, or python = \""
        in state.reason
    )
    assert state.reason.endswith(" in its [[nodes]] entry)")
    assert "/nonexistent/python3" in state.reason
    host = state.frame.host
    assert host.hostname == HOSTNAME and host.mem_total > 0 and host.cpu_percent is not None
    assert host.cpu_count == os.cpu_count()
    assert state.frame.gpu_source in ("nvidia-smi", "none")
    assert STATE_UP not in log.names


@pytest.mark.sshd
async def test_node_without_python3_on_path_uses_the_fallback(sshd_factory, tmp_path):
    # The session's PATH holds only sh; HOME is an empty dir, so no dotfile puts pyenv or the like back.
    bin_dir, home = tmp_path / "bin", tmp_path / "node_home"
    bin_dir.mkdir()
    home.mkdir()
    (bin_dir / "sh").symlink_to("/bin/sh")
    server = sshd_factory.start(SetEnv="PATH=%s HOME=%s" % (bin_dir, home))
    status, out, _ = await _run_on(server, ["/bin/sh", "-c", "echo $PATH; command -v python3 || echo no-python3"])
    assert out.split() == [str(bin_dir), "no-python3"]  # the premise: python3 really is hidden
    link = SshLink(node_for(server), FAST, INTERVAL)
    state = await link.poll_once(20)
    await link.close()
    assert state.state == STATE_FALLBACK, state.reason
    assert "python3" in state.reason and "not found" in state.reason
    assert state.frame.host.hostname == HOSTNAME and state.frame.host.cpu_percent is not None
    assert state.frame.host.mem_total > 0 and state.frame.host.disks


async def _run_on(server, argv):
    link = SshLink(node_for(server), FAST, INTERVAL)
    try:
        return await link.run_command(argv)
    finally:
        await link.close()


@pytest.mark.parametrize(
    "config_text, host, expected",
    [
        ("Host alias1\n  HostName 127.0.0.1\n  ServerAliveInterval 7\n  ServerAliveCountMax 4\n", "alias1", (7.0, 4)),
        ("Host alias1\n  ServerAliveInterval 7\n", "other", (1.0, 3)),  # not this host: our defaults
        ("Host *\n  ServerAliveCountMax 9\n", "n1", (1.0, 9)),
        ("", "n1", (1.0, 3)),
    ],
)
def test_keepalive_honours_ssh_config_server_alive(tmp_path, config_text, host, expected):
    from opsconsole.config import SshConfig
    from opsconsole.nodes.ssh import keepalive_for

    path = tmp_path / "config"
    path.write_text(config_text)
    ssh = SshConfig(keepalive_interval=1.0, keepalive_count_max=3)
    assert keepalive_for(host, None, None, ssh, config_path=str(path)) == expected


# Node-side scripts standing in for the probe (run as `sh SCRIPT - --once ...`, the bundle on stdin).
ENDLESS_LINE = "cat >/dev/null; yes a | tr -d '\\n'\n"  # one line that never ends
ENDLESS_TEXT = "cat >/dev/null; yes 'no frame here'\n"  # gigabytes of short lines, none a frame
LONG_LINE = "cat >/dev/null; head -c 4500000 /dev/zero | tr '\\0' a; echo; echo '{\"after\": 1}'\n"


@pytest.mark.sshd
@pytest.mark.parametrize(
    "script, reason",
    [
        (ENDLESS_LINE, "characters of output and no frame, over the limit of"),
        (ENDLESS_TEXT, "characters of output and no frame, over the limit of"),
        (LONG_LINE, "a line of 4500001 characters, over the limit of 4194304"),
    ],
)
async def test_poll_once_reads_a_flooding_node_bounded_and_calls_it_a_bad_frame(sshd_factory, tmp_path, script, reason):
    """A node whose 'probe' floods the channel: poll_once stops reading at its limit and says why,
    holding a few MiB at most (tracemalloc's peak), never the gigabytes the node would send."""
    import tracemalloc

    from opsconsole.model import BAD_FRAME
    from opsconsole.nodes.ssh import ONCE_OUTPUT_LIMIT

    hostile = tmp_path / "probe.sh"
    hostile.write_text(script)
    server = sshd_factory.start()
    link = SshLink(node_for(server, python="/bin/sh %s" % hostile), FAST, INTERVAL)
    tracemalloc.start()
    try:
        state = await link.poll_once(60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await link.close()
    assert state.state == STATE_DOWN and state.frame is None
    assert state.reason.startswith(BAD_FRAME) and reason in state.reason, state.reason
    assert peak < 4 * ONCE_OUTPUT_LIMIT, peak


@pytest.mark.sshd
async def test_a_fallback_node_flooding_its_nvidia_smi_output_is_a_bad_frame(sshd_factory, tmp_path):
    """No python3 on the node, and an nvidia-smi that never stops talking: the fallback's read
    stops at its limit and the node shows a bad frame instead of the console holding it all."""
    import tracemalloc

    from opsconsole.model import BAD_FRAME
    from opsconsole.nodes.ssh import FALLBACK_OUTPUT_LIMIT

    bin_dir, home = tmp_path / "bin", tmp_path / "node_home"
    bin_dir.mkdir()
    home.mkdir()
    (bin_dir / "sh").symlink_to("/bin/sh")
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nexec yes 'flood, flood, flood'\n")
    smi.chmod(0o755)
    server = sshd_factory.start(SetEnv="PATH=%s HOME=%s" % (bin_dir, home))
    link = SshLink(node_for(server), FAST, INTERVAL)
    tracemalloc.start()
    try:
        state = await link.poll_once(60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await link.close()
    assert state.state == STATE_DOWN and state.frame is None
    assert state.reason == BAD_FRAME + "the command's over %d characters of output: stopped reading" % (
        FALLBACK_OUTPUT_LIMIT
    )
    assert peak < 3 * FALLBACK_OUTPUT_LIMIT, peak


@pytest.mark.sshd
async def test_a_login_that_replaces_every_command_is_said_so_not_shown_as_a_live_fallback(sshd_factory, tmp_path):
    # A ForceCommand that prints a banner (escapes included) and runs none of what it is sent: the probe
    # "fails" like a missing python3, and the fallback's script never runs either. The node is down
    # with that said, not a live fallback node of empty readings and errors.
    wrapper = tmp_path / "force_command.sh"
    wrapper.write_text("#!/bin/sh\nprintf 'Welcome \\033[2J\\033]0;title\\007to gpu01\\n'\nexit 127\n")
    wrapper.chmod(0o755)
    server = sshd_factory.start(ForceCommand=str(wrapper))
    link = SshLink(node_for(server), FAST, INTERVAL)
    state = await link.poll_once(20)
    await link.close()
    assert state.state == STATE_DOWN and state.frame is None
    assert "the node ran none of the fallback script (a ForceCommand or login script" in state.reason, state.reason
    assert state.reason.endswith("exit status 127, it printed: Welcome ␛[2J␛]0;title␇to gpu01")  # escapes made visible


@pytest.mark.sshd
async def test_a_watched_node_whose_login_replaces_every_command_is_down_never_live(sshd_factory, tmp_path):
    # The same node watched: every fallback tick is unusable and no good frame ever came, so the node
    # is down with the reason (a live `fallback` state would count it as up in the header).
    wrapper = tmp_path / "force_command.sh"
    wrapper.write_text("#!/bin/sh\necho 'Welcome to gpu01'\nexit 127\n")
    wrapper.chmod(0o755)
    server = sshd_factory.start(ForceCommand=str(wrapper))
    link = SshLink(node_for(server), FAST, INTERVAL)
    log = StateLog()
    async with running(link, log):
        first = await log.wait_for(lambda s: "fallback script" in (s.reason or ""), 20)
        await log.wait_for(lambda s: len(log.states) >= log.states.index(first) + 3, 20)  # more ticks since
    assert first.state == STATE_DOWN and first.frame is None
    assert first.reason.endswith("exit status 127, it printed: Welcome to gpu01")
    assert STATE_FALLBACK not in log.names and STATE_UP not in log.names, log.summary()


@pytest.mark.sshd
async def test_a_login_banner_even_a_json_one_is_not_taken_for_the_nodes_frame(sshd_factory, tmp_path):
    # A ForceCommand that prints a MOTD (its first line JSON with a node and a time) and then runs the
    # command: the frame is the probe's, not the MOTD's, in one poll and in the stream.
    wrapper = tmp_path / "force_command.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        """echo '{"motd": "welcome", "node": "impostor", "time": 1}'\n"""
        'i=0; while [ $i -lt 300 ]; do echo "MOTD line $i"; i=$((i+1)); done\n'
        'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n'
    )
    wrapper.chmod(0o755)
    server = sshd_factory.start(ForceCommand=str(wrapper))
    link = SshLink(node_for(server), FAST, INTERVAL)
    state = await link.poll_once(20)
    await link.close()
    assert state.state == STATE_UP, state.reason
    assert state.frame.node != "impostor" and state.frame.host.hostname == HOSTNAME and state.frame.time > 1
    link = SshLink(node_for(server), FAST, INTERVAL)
    log = StateLog()
    async with running(link, log):
        await log.wait_for(lambda s: s.state == STATE_UP and s.frame.seq >= 2, 20)
    framed = [s.frame for s in log.states if s.frame is not None]
    assert framed and all(f.node != "impostor" and f.time > 1 for f in framed)
