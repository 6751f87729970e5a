"""A remote node's first read of a log is "earlier", as a local file's is (real sshd, LogHub, LogFeed, Diagnoser).

A local file's last page is read while LogFeed.start() runs, so its unstamped lines keep no time and their findings
are "pre-start". A remote node's last page arrives later, once its follower runs over SSH: its unstamped lines got
their arrival time, so an old OOM traceback already in the file was a live finding, stamped when the console
started, and fired as a new alert. The old failure is real torch output (tests/data/recovered_oom/crash_oom.log,
unstamped as torch prints it).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from opsconsole.config import Config, LogsConfig, NodeConfig, SshConfig
from opsconsole.diagnosis.engine import Diagnoser, precedence
from opsconsole.diagnosis.progress import RunProgress
from opsconsole.logs.feed import LogFeed
from opsconsole.logs.hub import LogHub
from opsconsole.nodes.ssh import SshLink
from tests.sshd import ssh_client, sshd_factory  # noqa: F401
from tests.waiting import wait_for

pytestmark = pytest.mark.sshd

FAST = SshConfig(
    connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2, backoff_initial=0.05, backoff_max=0.5
)
DATA = Path(__file__).resolve().parent / "data" / "recovered_oom"
OLD_OOM = [line for line in (DATA / "crash_oom.log").read_text().splitlines() if not line[:4].isdigit()]
LIVE = "RuntimeError: CUDA error: an illegal memory access was encountered"


def append(path: Path, lines) -> None:
    with open(path, "a") as out:
        out.write("".join(line + "\n" for line in lines))


async def test_a_remote_nodes_first_read_is_before_the_start_and_its_unstamped_findings_have_no_time(
    tmp_path, sshd_factory
):
    server = sshd_factory.start()
    log = tmp_path / "train.log"
    append(log, OLD_OOM)
    node = NodeConfig(name="n1", host=server.address, port=server.port)
    config = Config(nodes=(node,), logs=LogsConfig(paths=(str(log),), poll_interval=0.05, rescan_interval=0.3))
    link = SshLink(node, FAST, 0.3)
    got: list = []
    found: list = []

    def deliver_findings(lines, findings) -> None:
        found.extend((line, finding) for line, finding in zip(lines, findings) if finding is not None)

    feed = LogFeed(
        LogHub(config, {"n1": link}),
        Diagnoser(),
        lambda lines, _: got.extend(lines),
        deliver_findings,
        progress=RunProgress(600.0),
        precedence=precedence,
    )
    await feed.start()
    try:
        await wait_for(lambda: len(got) == len(OLD_OOM), "the remote file's last page")
        assert feed.started_at is not None
        assert [line.text for line in got] == OLD_OOM and got[0].source.node == "n1"
        assert all(line.time is None and feed.before_start(line) for line in got), got[:3]
        oom = [(line, finding) for line, finding in found if finding.category == "cuda_oom"]
        assert oom and all(finding.time is None for _, finding in oom), oom
        assert feed.earlier_categories() == ["cuda_oom"]
        # A line written after the first read is live, unstamped as it is: its arrival time.
        before = time.time()
        append(log, [LIVE])
        await wait_for(lambda: any(line.text == LIVE for line in got), "the line written after the start")
        live = next(line for line in got if line.text == LIVE)
        assert live.time is not None and live.time >= before and not feed.before_start(live)
        assert "cuda_illegal_memory" not in feed.earlier_categories()
        rows, root = feed.summary()
        assert root == "cuda_illegal_memory", rows  # the old OOM no longer outranks what fails now
    finally:
        await feed.stop()
        await link.close()
