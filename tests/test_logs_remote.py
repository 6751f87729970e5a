"""Remote following over a real sshd: odd file names, new files, reconnect without duplicates, scroll-back."""

from __future__ import annotations

import asyncio

import pytest

from opsconsole.config import Config, LogsConfig, NodeConfig, SshConfig
from opsconsole.logs.hub import LogHub
from opsconsole.nodes.ssh import SshLink
from tests.sshd import ssh_client, sshd_factory  # noqa: F401
from tests.waiting import wait_for

pytestmark = pytest.mark.sshd

FAST = SshConfig(
    connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2, backoff_initial=0.05, backoff_max=0.5
)


def append(path, lines):
    with open(path, "a") as out:
        out.write("".join(line + "\n" for line in lines))


async def remote_hub(server, folder):
    """A started LogHub following `folder`/*.log on node n1 (the sshd `server`): (hub, link, lines got)."""
    node = NodeConfig(name="n1", host=server.address, port=server.port)
    config = Config(
        nodes=(node,), logs=LogsConfig(paths=(str(folder / "*.log"),), poll_interval=0.05, rescan_interval=0.3)
    )
    link = SshLink(node, FAST, 0.3)
    got = []
    hub = LogHub(config, {"n1": link})
    await hub.start(got.extend)
    return hub, link, got


async def test_remote_follow_odd_names_new_files_and_reconnect(tmp_path, sshd_factory):
    server = sshd_factory.start()
    odd = tmp_path / 'it\'s a; "run" log.log'
    append(odd, ["2024-12-02 18:30:01,000 - INFO - one", "2024-12-02 18:30:02,000 - ERROR - two"])
    hub, link, got = await remote_hub(server, tmp_path)
    try:
        await wait_for(lambda: len(got) == 2)
        assert [(l.number, l.text[-3:], l.level) for l in got] == [(1, "one", "INFO"), (2, "two", "ERROR")]
        assert got[0].source.key == "n1:" + str(odd)
        # A new file matching the glob is picked up, from its first line.
        fresh = tmp_path / "train_gpu-b_rank5_20241202_183001.log"
        append(fresh, ["[rank5]: hello"])
        await wait_for(lambda: any(l.source.path == str(fresh) for l in got))
        new = [l for l in got if l.source.path == str(fresh)]
        assert new[0].source.label == "gpu-b:rank5" and new[0].rank == 5 and new[0].number == 1
        # The connection drops; lines written meanwhile arrive once after the reconnect.
        server.kill()
        append(odd, ["while down %d" % i for i in range(3)])
        await asyncio.sleep(0.5)
        server.start()
        append(odd, ["after %d" % i for i in range(2)])
        await wait_for(lambda: sum(1 for l in got if l.source.path == str(odd)) >= 7, timeout=30)
        await asyncio.sleep(0.5)
        odd_lines = [l for l in got if l.source.path == str(odd)]
        assert [l.number for l in odd_lines] == list(range(1, 8))
        assert [l.text for l in odd_lines[2:]] == ["while down 0", "while down 1", "while down 2", "after 0", "after 1"]
        assert hub._remote["n1"].restarts >= 1
        # Scroll-back runs on the node too.
        older = await hub.older(got[0].source.key, odd_lines[3].offset, 10)
        assert [(l.number, l.text[-3:]) for l in older] == [(1, "one"), (2, "two"), (3, "n 0")]
        assert "n1" not in hub.problems()
    finally:
        await hub.stop()
        await link.close()


def followers_of(folder) -> list:
    """Processes on this machine running a remote follower whose spec names `folder`."""
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if any("remote_main(sys.argv)" in part for part in cmdline) and any(str(folder) in part for part in cmdline):
            found.append(process)
    return found


def test_a_follower_of_idle_files_exits_when_its_channel_closes(tmp_path):
    """The follower writes only when lines come; it must still notice the console left (stdin EOF)."""
    import json
    import subprocess
    import sys

    from opsconsole.logs.remote import follower_source

    append(tmp_path / "idle.log", ["2024-12-02 18:30:01,000 - INFO - one"])
    spec = {"globs": [str(tmp_path / "*.log")], "files": {}, "initial": True, "poll": 0.05, "rescan": 0.3}
    child = subprocess.Popen(
        [sys.executable, "-u", "-c", follower_source(), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout.readline(), "the follower said nothing"  # it started and globbed
        child.stdin.close()  # what sshd does when the console closes the channel
        assert child.wait(timeout=20) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


async def test_no_follower_is_left_on_the_node_after_the_console_disconnects(tmp_path, sshd_factory):
    server = sshd_factory.start()
    append(tmp_path / "quiet.log", ["2024-12-02 18:30:01,000 - INFO - one"])
    hub, link, got = await remote_hub(server, tmp_path)
    try:
        await wait_for(lambda: len(got) == 1)
        assert followers_of(tmp_path), "the follower should be running on the node"
    finally:
        await hub.stop()
        await link.close()
    await wait_for(lambda: not followers_of(tmp_path), timeout=20)
