"""A real hang: 2 torchrun ranks on gloo, rank 1 stuck before the all_reduce that rank 0 waits in.

`opsconsole stacks --json` (here and over SSH to a real sshd on loopback) and the console's stacks
screen (Pilot, opened with S) must name rank 1 as the odd one and the function it is stuck in.
The job is started and ended by the module fixture; py-spy needs ptrace on the ranks, so the tests
skip with the reason where it is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.sshd import ssh_client, sshd_factory  # noqa: F401
from tests.torchrun import torchrun_command, torchrun_env
from tests.waiting import wait_for

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
PY_SPY = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
START_TIMEOUT_S = 120.0

JOB = textwrap.dedent("""
    import os
    import sys
    import time

    import torch
    import torch.distributed as dist


    def stuck_before_all_reduce(ready):
        open(ready, "w").close()
        time.sleep(3600)


    def train_step(rank, ready_dir):
        x = torch.ones(4)
        if rank == 1:
            stuck_before_all_reduce(os.path.join(ready_dir, "rank1"))
        open(os.path.join(ready_dir, "rank0"), "w").close()
        dist.all_reduce(x)


    dist.init_process_group("gloo")
    train_step(dist.get_rank(), sys.argv[1])
""")


def ranks_of(launcher_pid: int) -> dict:
    """{rank: pid} of the launcher's children that have RANK in their environment."""
    import psutil

    found = {}
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            env = child.environ()
        except (psutil.Error, OSError):
            continue
        if "RANK" in env:
            found[int(env["RANK"])] = child.pid
    return found


def dump(pid: int) -> subprocess.CompletedProcess:
    return subprocess.run([PY_SPY, "dump", "--pid", str(pid), "--json"], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory):
    """The hung 2-rank job: {"launcher": pid, "ranks": {0: pid, 1: pid}}; ended after the module."""
    if not os.path.exists(PY_SPY):
        pytest.skip("py-spy is not installed: pip install py-spy (it is in the test extra)")
    base = tmp_path_factory.mktemp("hung_job")
    (base / "job.py").write_text(JOB)
    env = torchrun_env()
    log = open(base / "launcher.log", "wb")
    launcher = subprocess.Popen(
        torchrun_command(base / "job.py", str(base)),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        ranks = {}
        while time.monotonic() < deadline:
            ranks = ranks_of(launcher.pid)
            if len(ranks) == 2 and (base / "rank0").exists() and (base / "rank1").exists():
                probe = dump(ranks[0])
                if probe.returncode != 0:
                    lowered = probe.stderr.lower()
                    if "permission" in lowered or "not permitted" in lowered:
                        pytest.skip(
                            "ptrace refused here (py-spy dump: %s): kernel.yama.ptrace_scope or the "
                            "container's SYS_PTRACE" % probe.stderr.strip()[-200:]
                        )
                elif "all_reduce" in probe.stdout:  # rank 0 is inside the collective: the hang is set
                    break
            if launcher.poll() is not None:
                pytest.fail("torchrun ended: %s" % (base / "launcher.log").read_text()[-2000:])
            time.sleep(0.2)
        else:
            pytest.fail("the job did not reach its hang within %g s" % START_TIMEOUT_S)
        yield {"launcher": launcher.pid, "ranks": ranks, "dir": base}
    finally:
        _end(launcher)
        log.close()


def _end(launcher: subprocess.Popen) -> None:
    """SIGTERM to the job's process group (torchrun and its ranks: this test started them), then SIGKILL."""
    for signum, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(launcher.pid, signum)
        except ProcessLookupError:
            return
        try:
            launcher.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_stacks(*args: str, env=None) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "stacks", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)


def local_config(tmp_path: Path, read_only: bool = False) -> Path:
    path = tmp_path / "local.toml"
    path.write_text(
        '[console]\nread_only = %s\n\n[[nodes]]\nname = "local"\nlocal = true\n\n'
        '[actions]\naudit_log = "%s"\n' % ("true" if read_only else "false", tmp_path / "audit.log")
    )
    return path


def assert_rank_1_is_odd(result: dict, ranks: dict, node: str) -> None:
    ours = {entry["pid"]: entry for entry in result["ranks"] if entry["node"] == node}
    assert ours[ranks[1]]["rank"] == 1 and ours[ranks[0]]["rank"] == 0
    assert set(ours[ranks[1]]) == {"node", "pid", "rank", "job", "frames"}
    assert ours[ranks[1]]["frames"][0]["function"] == "stuck_before_all_reduce"
    assert ours[ranks[1]]["frames"][0]["file"].endswith("job.py")
    assert ours[ranks[0]]["frames"][0]["function"] == "all_reduce"
    assert result["odd"] == [1]
    odd = [group for group in result["groups"] if group["odd"]]
    assert [group["ranks"] for group in odd] == [[1]]
    assert odd[0]["frames"][0]["function"] == "stuck_before_all_reduce"
    assert [g["ranks"] for g in result["groups"] if not g["odd"]] == [[0]]
    assert result["errors"] == []


def test_stacks_json_names_rank_1_and_its_function(hung_job, tmp_path):
    ranks = hung_job["ranks"]
    result = run_stacks("--config", str(local_config(tmp_path)), "--pid", str(ranks[0]), "--pid", str(ranks[1]))
    assert_rank_1_is_odd(result, ranks, "local")


def test_the_node_helper_finds_both_ranks_by_their_environment_not_torchrun(hung_job):
    from opsconsole.probe.rank_stacks import find_ranks

    found = {entry["pid"]: entry for entry in find_ranks()}
    ranks = hung_job["ranks"]
    assert found[ranks[0]]["rank"] == 0 and found[ranks[1]]["rank"] == 1
    assert found[ranks[1]]["world_size"] == 2 and found[ranks[1]]["local_rank"] == 1
    assert hung_job["launcher"] not in found  # the agent has no RANK of its own


def test_the_table_names_the_odd_rank_first(hung_job, tmp_path):
    ranks = hung_job["ranks"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "opsconsole",
            "stacks",
            "--config",
            str(local_config(tmp_path)),
            "--pid",
            str(ranks[0]),
            "--pid",
            str(ranks[1]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == "odd: rank 1 in `stuck_before_all_reduce` (job.py:12), while the others wait in a collective"
    assert lines[3] == "ODD  rank 1 in `stuck_before_all_reduce` (job.py:12)"
    assert any(
        line.startswith("     rank 0 in `all_reduce` (distributed_c10d.py:") and line.endswith("via job.py:20")
        for line in lines
    )


@pytest.mark.sshd
def test_stacks_over_ssh_to_a_real_sshd_names_rank_1(hung_job, sshd_factory, tmp_path):
    server = sshd_factory.start()
    config = tmp_path / "ssh.toml"
    config.write_text(
        '[[nodes]]\nname = "n1"\nhost = "%s"\nport = %d\npython = "%s"\n\n[actions]\naudit_log = "%s"\n'
        % (server.address, server.port, sys.executable, tmp_path / "audit.log")
    )
    ranks = hung_job["ranks"]
    # The node's helper finds the ranks itself (by RANK in /proc/PID/environ), as on a real node.
    result = run_stacks("--config", str(config), env=dict(os.environ))
    mine = {entry["pid"] for entry in result["ranks"]}
    assert {ranks[0], ranks[1]} <= mine
    # Other jobs on this machine are other ranks; limited to ours, the verdict is exact.
    result = run_stacks("--config", str(config), "--pid", str(ranks[0]), "--pid", str(ranks[1]), env=dict(os.environ))
    assert_rank_1_is_odd(result, ranks, "n1")
    assert server.count_log("Accepted publickey") == 2  # one login per command: the node's one connection


async def test_the_console_shows_rank_1_and_its_stack_on_S_read_only_and_audited(hung_job, tmp_path):
    from opsconsole.config import load_config
    from opsconsole.nodes.fleet import Fleet
    from opsconsole.tui.app import OpsConsole
    from opsconsole.tui.stacks import RankStackScreen, StacksScreen

    config = load_config(str(local_config(tmp_path, read_only=True)))
    app = OpsConsole(config, Fleet(config))
    ranks = hung_job["ranks"]
    async with app.run_test(size=(160, 48)) as pilot:
        app.action_show_pane("logs")
        await pilot.pause()
        await pilot.press("S")
        screen = await wait_for(
            lambda: isinstance(app.screen, StacksScreen) and app.screen.report is not None and app.screen,
            "the condition",
            pilot=pilot,
        )
        report = screen.report
        # Every rank of this machine is there (another job's too, if one runs): ours by its pid.
        rank1 = next(r for r in report.ranks if r.pid == ranks[1])
        assert rank1.rank == 1 and rank1.frames[0].function == "stuck_before_all_reduce"
        assert 1 in report.odd and "stuck_before_all_reduce" in report.verdict
        table = screen.query_one("#stacks-table")
        key = "local/%d" % ranks[1]
        row = table.get_row(key)
        assert str(row[0]) == "ODD" and "`stuck_before_all_reduce` (job.py:12)" in str(row[5])
        table.move_cursor(row=table.get_row_index(key))
        await pilot.press("enter")
        stack_screen = await wait_for(
            lambda: isinstance(app.screen, RankStackScreen) and app.screen, "the condition", pilot=pilot
        )
        body = str(stack_screen.query_one("#rank-stack-body").content)
        assert "stuck_before_all_reduce (%s:12)" % (hung_job["dir"] / "job.py") in body
        assert "train_step (%s:18)" % (hung_job["dir"] / "job.py") in body
        await pilot.press("escape")
        await pilot.press("escape")
        await wait_for(
            lambda: not isinstance(app.screen, (StacksScreen, RankStackScreen)), "the condition", pilot=pilot
        )
    records = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    stacks = [r for r in records if r["action"] == "stacks"]
    assert [r["outcome"] for r in stacks] == ["attempt", "ok"]
    assert stacks[0]["command"] == ["opsconsole", "stacks"] and stacks[0]["id"] == stacks[1]["id"]


def test_native_frames_on_request_keep_rank_1_odd(hung_job, tmp_path):
    ranks = hung_job["ranks"]
    result = run_stacks(
        "--config", str(local_config(tmp_path)), "--native", "--pid", str(ranks[0]), "--pid", str(ranks[1])
    )
    rank1 = next(entry for entry in result["ranks"] if entry["pid"] == ranks[1])
    functions = [frame["function"] for frame in rank1["frames"]]
    assert "stuck_before_all_reduce" in functions
    assert functions.index("stuck_before_all_reduce") > 0  # native frames (the sleep in libc) inside it
    assert result["odd"] == [1]


async def test_S_on_the_nodes_pane_then_every_node_and_again_each_audited(hung_job, tmp_path):
    from opsconsole.config import load_config
    from opsconsole.nodes.fleet import Fleet
    from opsconsole.tui.app import OpsConsole
    from opsconsole.tui.stacks import StacksScreen

    config = load_config(str(local_config(tmp_path)))
    app = OpsConsole(config, Fleet(config))
    ranks = hung_job["ranks"]
    async with app.run_test(size=(160, 48)) as pilot:
        app.action_show_pane("nodes")
        await wait_for(lambda: app.panes["nodes"].highlighted_node() == "local", "the condition", pilot=pilot)
        await pilot.press("S")
        screen = await wait_for(
            lambda: isinstance(app.screen, StacksScreen) and app.screen.report is not None and app.screen,
            "the condition",
            pilot=pilot,
        )
        assert screen.scope.nodes == ("local",) and "node local" in str(screen.query_one("#stacks-title").content)
        assert ranks[1] in {r.pid for r in screen.report.ranks}
        for key, title in (("a", "every node"), ("g", "every node")):
            before = screen.report
            await pilot.press(key)
            await wait_for(
                lambda: screen.report is not None and screen.report is not before, "the condition", pilot=pilot
            )  # a new one
            assert title in str(screen.query_one("#stacks-title").content)
            assert 1 in screen.report.odd
            assert str(screen.query_one("#stacks-table").get_row("local/%d" % ranks[1])[0]) == "ODD"
    records = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    stacks = [(r["outcome"], r["command"]) for r in records if r["action"] == "stacks"]
    assert stacks == [
        ("attempt", ["opsconsole", "stacks", "--node", "local"]),
        ("ok", ["opsconsole", "stacks", "--node", "local"]),
        ("attempt", ["opsconsole", "stacks"]),
        ("ok", ["opsconsole", "stacks"]),
        ("attempt", ["opsconsole", "stacks"]),
        ("ok", ["opsconsole", "stacks"]),
    ]
