"""The Processes pane on this machine's real processes: kernel threads, tree, details, keyboard selection, sort label.

Frames come from the real probe polling this VM (its kernel threads, this test's own process
tree); details are read node-side by the real reader through a real LocalLink.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, List

import pytest
from h200_fleet import NOW, three_nodes
from textual.app import App, ComposeResult
from textual.widgets import DataTable

from opsconsole.config import NodeConfig
from opsconsole.fleet_view import (
    GPU_PROCESSES,
    HOST_PROCESSES,
    PROCESS_SORT_KEYS,
    TREE_BRANCH,
    TREE_LAST,
    ProcessRow,
    process_rows,
    process_tree,
)
from opsconsole.model import STATE_UP, NodeState
from opsconsole.nodes.local import LocalLink
from opsconsole.probe.agent import Probe
from opsconsole.tui.process_details import ProcessDetailsScreen
from opsconsole.tui.processes import ProcessesPane
from opsconsole.tui.table_diff import row_keys_in_order
from tests.pid_reuse import after_the_slack, start_on_pid
from tests.sshd import ssh_client, sshd_factory  # noqa: F401

SIZE = (200, 50)
NODE = "local"


class ConsoleLikeApp(App):
    """One Processes pane, and the console's way to a node's link (`_link_of`), to a real LocalLink."""

    def __init__(self, pane: ProcessesPane) -> None:
        super().__init__()
        self.pane = pane
        self.link = LocalLink(NodeConfig(name=NODE, local=True), interval=1.0)

    def compose(self) -> ComposeResult:
        yield self.pane

    def _link_of(self, name: str) -> object:
        return self.link if name == NODE else None


@pytest.fixture
def rank_child():
    """A sleeping child started as torchrun starts a rank, with a marker and an escape in its argv."""
    marker = "opsconsole-rank-%s" % uuid.uuid4().hex[:8]
    env = dict(
        os.environ,
        RANK="3",
        LOCAL_RANK="1",
        WORLD_SIZE="8",
        MASTER_ADDR="10.0.0.7",
        MASTER_PORT="29500",
        OPSCONSOLE_TEST_SECRET="not-for-the-screen",
    )
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)",
            marker,
            "\x1b]52;c;aGk=\x07",
        ],
        env=env,
        stdout=subprocess.PIPE,
    )
    assert child.stdout.readline() == b"ready\n"
    yield child, marker
    child.kill()
    child.wait()


def local_states() -> Dict[str, NodeState]:
    """This machine polled by the real probe (two polls: CPU % is a delta)."""
    probe = Probe(node_name=NODE, gpu_reader=None)
    try:
        probe.prime(0.05)
        frame = probe.poll()
    finally:
        probe.close()
    now = time.time()
    return {NODE: NodeState(name=NODE, state=STATE_UP, frame=frame, received_at=now, since=now)}


def keys(table: DataTable) -> List[str]:
    return row_keys_in_order(table)


def cell(table: DataTable, key: str, column: str) -> str:
    return dict(zip((c.key.value for c in table.ordered_columns), table.get_row(key)))[column].plain


def status(pane: ProcessesPane) -> str:
    return str(pane.status.render())


async def until(pilot, condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in %g s" % timeout
        await pilot.pause(0.05)


def focus_pane_as_the_console_does(app: App, pane: ProcessesPane) -> None:
    """OpsConsole.focus_pane after the filter closes: the pane's first focusable widget."""
    app.screen.set_focus(next(widget for widget in app.screen.focus_chain if pane in widget.ancestors))


def tree_prefix(command: str) -> str:
    """The tree branch drawn before a command (`│  └─ `)."""
    return command[: len(command) - len(command.lstrip("│├└─ "))]


def kernel_pids() -> List[int]:
    """Kernel threads on this machine, by the PF_KTHREAD flag of their stat (the probe's own test)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path("/proc/%s/stat" % entry).read_bytes()
            except OSError:
                continue
            if int(stat[stat.rindex(b")") + 2 :].split()[6]) & 0x00200000:
                found.append(int(entry))
    return found


async def test_kernel_threads_hidden_until_T(rank_child):
    if not kernel_pids():
        pytest.skip("no kernel threads visible here (a container without the host's /proc)")
    child, _ = rank_child
    pane = ProcessesPane()
    async with ConsoleLikeApp(pane).run_test(size=SIZE) as pilot:
        pane.show(local_states(), None, NOW)
        await pilot.pause()
        host = pane.host_table.table
        listed = {int(key.rpartition("/")[2]) for key in keys(host)}
        kernel = {p.pid for p in pane.states[NODE].frame.top_processes if p.kernel_thread}
        assert kernel and not listed & kernel
        assert {os.getpid(), child.pid, 1} <= listed  # every user process, the sleeping child too
        assert "%d kernel threads hidden: T" % len(kernel) in status(pane)
        await pilot.press("T")
        listed = {int(key.rpartition("/")[2]) for key in keys(host)}
        assert kernel <= listed and child.pid in listed
        assert "kernel threads shown: T" in status(pane)
        assert cell(host, "%s/2" % NODE, "command") == "[kthreadd]"
        await pilot.press("T")
        assert not {int(key.rpartition("/")[2]) for key in keys(host)} & kernel


async def test_tree_view_puts_children_under_their_parent_and_keeps_the_cursor(rank_child):
    child, marker = rank_child
    pane = ProcessesPane()
    async with ConsoleLikeApp(pane).run_test(size=SIZE) as pilot:
        pane.show(local_states(), None, NOW)
        await pilot.pause()
        host = pane.host_table.table
        await pilot.press("t")
        assert "tree" in status(pane)
        order = keys(host)
        me, kid = "%s/%d" % (NODE, os.getpid()), "%s/%d" % (NODE, child.pid)
        assert order.index(me) < order.index(kid)
        # The child one level deeper than this process, on a branch.
        branch, own = tree_prefix(cell(host, kid, "command")), tree_prefix(cell(host, me, "command"))
        assert branch.endswith((TREE_BRANCH, TREE_LAST)) and len(branch) == len(own) + 3 if own else len(branch) == 3
        assert cell(host, "%s/1" % NODE, "command")[:1] not in "├└│ "  # init is a root
        # The cursor moves by keyboard in the tree, and what it is on is what actions target.
        host.focus()
        host.move_cursor(row=order.index(kid), animate=False)
        await pilot.pause()
        assert pane.highlighted_process() == (NODE, child.pid)
        # Away and back: down then up, or up then down where the child is the last row (its branch may
        # be the tree's last one, as under CI's process tree, and down on the last row stays there).
        away_and_back = ("up", "down") if order.index(kid) == len(order) - 1 else ("down", "up")
        await pilot.press(*away_and_back)
        assert pane.highlighted_process() == (NODE, child.pid)
        await pilot.press("t")
        assert "tree" not in status(pane) and not cell(host, kid, "command").startswith(("├", "└", "│", " "))


async def test_enter_opens_details_read_on_the_node(rank_child):
    child, marker = rank_child
    pane = ProcessesPane()
    app = ConsoleLikeApp(pane)
    async with app.run_test(size=SIZE) as pilot:
        pane.show(local_states(), None, NOW)
        pane.apply_filter(marker)
        await pilot.pause()
        host = pane.host_table.table
        assert keys(host) == ["%s/%d" % (NODE, child.pid)]
        host.focus()
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ProcessDetailsScreen) and app.screen.details is not None)
        screen = app.screen
        assert screen.details.problem is None, screen.details
        assert dict(screen.details.rank_env) == {
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "8",
            "MASTER_ADDR": "10.0.0.7",
            "MASTER_PORT": "29500",
        }
        text = str(screen.query_one("#details-node").render()) + str(screen.query_one("#details-frame").render())
        assert "RANK=3" in text and "MASTER_ADDR=10.0.0.7" in text
        assert "not-for-the-screen" not in text  # only the rank variables of the environment
        assert marker in text and "\x1b" not in text and "\x07" not in text  # the escape is shown, never sent
        assert "Cgroup" in text and any(line.startswith("0::") or ":" in line for line in screen.details.cgroup)
        assert "GPUs" in text and "none" in text  # no GPU context on this VM
        assert "Process %d on %s" % (child.pid, NODE) in str(screen.query_one("#details-title").render())
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, ProcessDetailsScreen))


async def test_details_of_a_process_that_exited_say_so(rank_child):
    child, marker = rank_child
    pane = ProcessesPane()
    app = ConsoleLikeApp(pane)
    async with app.run_test(size=SIZE) as pilot:
        pane.show(local_states(), None, NOW)
        pane.apply_filter(marker)
        await pilot.pause()
        child.kill()
        child.wait()
        pane.host_table.table.focus()
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ProcessDetailsScreen) and app.screen.details is not None)
        assert app.screen.details.problem == "gone: /proc has no such process"


async def test_details_of_a_pid_now_held_by_another_process_say_the_listed_one_exited(rank_child):
    """The listed process exits and another gets its PID before enter: the screen says so and shows
    nothing of the successor (its command line, environment)."""
    from opsconsole.nodes.process_details import MOVED

    child, marker = rank_child
    pane = ProcessesPane()
    app = ConsoleLikeApp(pane)
    async with app.run_test(size=SIZE) as pilot:
        pane.show(local_states(), None, NOW)
        pane.apply_filter(marker)
        await pilot.pause()
        listed = next(p for p in pane.states[NODE].frame.top_processes if p.pid == child.pid)
        child.kill()
        child.wait()
        after_the_slack(listed.start_time)
        successor_marker = "opsconsole-successor-%s" % uuid.uuid4().hex[:8]
        successor = start_on_pid(child.pid, [sys.executable, "-c", "import time; time.sleep(60)", successor_marker])
        try:
            pane.host_table.table.focus()
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ProcessDetailsScreen) and app.screen.details is not None)
            details = app.screen.details
            text = str(app.screen.query_one("#details-node").render())
        finally:
            successor.kill()
            successor.wait()
    assert details.problem == MOVED == "this process has exited (pid now belongs to another)"
    assert MOVED in text and successor_marker not in text and not details.args and not details.rank_env
    assert details.start_time > listed.start_time + 1.5  # the node's reading of the successor


async def test_selection_after_a_filter_runs_across_both_tables():
    """In the default view (both tables), the keyboard reaches host processes: down from the last
    GPU row enters the host table; a filter that empties the GPU table leaves it out of the focus."""
    pane = ProcessesPane()
    async with ConsoleLikeApp(pane).run_test(size=SIZE) as pilot:
        pane.show(three_nodes(), None, NOW)
        pane.apply_filter("user:alice")
        await pilot.pause()
        gpu, host = pane.gpu_table.table, pane.host_table.table
        assert keys(gpu) == ["gpu01/421@0"] and keys(host) == ["gpu01/421", "gpu01/501"]
        focus_pane_as_the_console_does(pilot.app, pane)
        await pilot.pause()
        assert pilot.app.focused is gpu and pane.highlighted_process() == ("gpu01", 421)
        await pilot.press("down")
        assert pilot.app.focused is host and pane.highlighted_process() == ("gpu01", 421)
        await pilot.press("down")
        assert pane.highlighted_process() == ("gpu01", 501)  # the hung worker: pickable by keyboard
        await pilot.press("up", "up")
        assert pilot.app.focused is gpu
        # A filter that leaves no GPU process: the GPU table takes no focus, the host table has it.
        pane.apply_filter("state:D")
        await pilot.pause()
        assert keys(gpu) == [] and not gpu.can_focus and host.can_focus
        focus_pane_as_the_console_does(pilot.app, pane)
        await pilot.pause()
        assert pilot.app.focused is host and pane.highlighted_process() == ("gpu01", 501)
        pane.apply_filter("")
        await pilot.pause()
        assert gpu.can_focus


async def test_sort_label_is_the_header_of_the_sorted_column():
    pane = ProcessesPane()
    async with ConsoleLikeApp(pane).run_test(size=SIZE) as pilot:
        pane.show(three_nodes(), None, NOW)
        await pilot.pause()
        host = pane.host_table.table
        host.focus()
        await pilot.pause()
        seen = []
        for _ in range(len(pane.host_table.sort.keys) + 2):
            column = pane.host_table.sort.column
            header = host.columns[column].label.plain
            assert "sort: %s" % header in status(pane), (header, status(pane))
            assert header.endswith(("▲", "▼")) and "config order" not in status(pane)
            seen.append(column)
            await pilot.press("r")
            assert "sort: %s" % host.columns[column].label.plain in status(pane)
            await pilot.press("s")
        assert seen[0] == "cpu" and set(seen) >= set(pane.host_table.sort.keys)  # round the columns, no "config order"


async def test_a_sort_cycle_keeps_each_columns_natural_direction():
    """`s` from CPU▼ went to RSS▲ (the smallest first): CPU, RSS, GPU memory and SM sort largest first
    whenever the cycle (or a header click) reaches them; the rest smallest first. The status line and
    the header say the same, and the rows are in that order."""
    pane = ProcessesPane()
    states = dict(local_states(), **three_nodes())  # this machine's real processes, and GPU ones
    async with ConsoleLikeApp(pane).run_test(size=SIZE) as pilot:
        pane.show(states, None, NOW)
        await pilot.pause()
        for sorted_table, kind in ((pane.host_table, HOST_PROCESSES), (pane.gpu_table, GPU_PROCESSES)):
            rows = {row.key: row for row in process_rows(states, None, kind)}
            table = sorted_table.table
            table.focus()
            await pilot.pause()
            directions = {}
            for _ in range(len(sorted_table.sort.keys)):
                await pilot.press("s")
                column = sorted_table.sort.column
                header = table.columns[column].label.plain
                assert "sort: %s" % header in status(pane), (header, status(pane))
                directions[column] = header[-1]
                drawn = [rows[key] for key in keys(table)]
                values = [v for v in (PROCESS_SORT_KEYS[column](row) for row in drawn) if v is not None]
                assert values == sorted(values, reverse=header.endswith("▼")), (column, values)
            largest_first = {"gpu_memory", "sm", "cpu", "rss"} & set(directions)
            assert largest_first and all(directions[key] == "▼" for key in largest_first), directions
            assert all(arrow == "▲" for key, arrow in directions.items() if key not in largest_first), directions


@pytest.mark.parametrize("width", [80, 100, 140, 200])
async def test_the_command_keeps_its_column_on_a_narrow_terminal(width):
    # At 80 columns every other column took the row and the command (what runs on the GPU) was off
    # screen: columns now go in DROP_ORDER until the command has COMMAND_MIN cells.
    from opsconsole.tui.processes import COMMAND_MIN

    pane = ProcessesPane()
    async with ConsoleLikeApp(pane).run_test(size=(width, 40)) as pilot:
        pane.show(three_nodes(), None, NOW)
        await pilot.pause()
        for table in (pane.gpu_table.table, pane.host_table.table):
            columns = {str(key.value): column for key, column in table.columns.items()}
            assert "command" in columns and "pid" in columns
            used = sum(c.get_render_width(table) for key, c in columns.items() if key != "command")
            assert width - 2 - used >= COMMAND_MIN, (width, list(columns))
        gpu_keys = [str(key.value) for key in pane.gpu_table.table.columns]
        assert {"gpu", "gpu_memory", "sm"} <= set(gpu_keys)  # what the GPU table is for stays
        if width >= 200:
            assert {"user", "cpu", "rss", "elapsed", "state", "job"} <= set(gpu_keys)  # nothing dropped


def row(node: str, pid: int, ppid, cpu: float = 0.0) -> ProcessRow:
    return ProcessRow(
        key="%s/%d" % (node, pid),
        kind="host",
        node=node,
        pid=pid,
        user="u",
        name="p",
        command="c%d" % pid,
        gpu_index=None,
        gpu_memory=None,
        sm_percent=None,
        cpu_percent=cpu,
        rss=None,
        elapsed=None,
        proc_state="S",
        node_state="up",
        live=True,
        ppid=ppid,
    )


def test_process_tree_orders_siblings_and_survives_loops():
    rows = [
        row("a", 1, 0),
        row("a", 10, 1, cpu=5.0),
        row("a", 11, 1, cpu=50.0),
        row("a", 12, 11),
        row("b", 12, 1),
        row("a", 20, 21),
        row("a", 21, 20),
    ]  # b's 12 has no parent on b; 20 and 21 loop
    placed = process_tree(rows, lambda r: r.cpu_percent, reverse=True)
    assert [(r.node, r.pid, prefix) for r, prefix in placed] == [
        ("a", 1, ""),
        ("a", 11, "├─ "),
        ("a", 12, "│  └─ "),
        ("a", 10, "└─ "),
        ("b", 12, ""),
        ("a", 20, ""),
        ("a", 21, "└─ "),
    ]
    chain = [row("a", 1, 0)] + [row("a", pid, pid - 1) for pid in range(2, 3000)]  # deeper than the recursion limit
    assert len(process_tree(chain, None)) == 2999


async def test_details_are_read_over_the_nodes_real_ssh_connection(rank_child, sshd_factory):
    """A remote node: the reader runs there as `python3 -I - PID [START]` over the node's own connection
    (the sshd runs here, so the node's /proc is this machine's)."""
    from opsconsole.config import SshConfig
    from opsconsole.nodes.process_details import MOVED, fetch_process_details
    from opsconsole.nodes.ssh import SshLink

    child, marker = rank_child
    server = sshd_factory.start()
    fast = SshConfig(
        connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2, backoff_initial=0.05, backoff_max=0.5
    )
    link = SshLink(NodeConfig(name="n1", host=server.address, port=server.port, python=sys.executable), fast, 0.3)
    try:
        details = await fetch_process_details(link, child.pid)
        assert details.problem is None, details
        assert dict(details.rank_env)["RANK"] == "3" and dict(details.rank_env)["MASTER_ADDR"] == "10.0.0.7"
        assert marker in details.args and details.cgroup
        gone = await fetch_process_details(link, int(Path("/proc/sys/kernel/pid_max").read_text()) + 1)
        assert gone.problem == "gone: /proc has no such process"
        # The start time the frame said: the same process is read; a later owner is not.
        started = details.start_time
        assert started is not None
        same = await fetch_process_details(link, child.pid, expected_start=started + 1.0)
        assert same.problem is None and marker in same.args
        moved = await fetch_process_details(link, child.pid, expected_start=started - 60)
        assert moved.problem == MOVED and not moved.args and not moved.rank_env and not moved.cgroup
    finally:
        await link.close()


@pytest.mark.parametrize(
    "answer, problem",
    [
        ("", "the node's answer is not JSON"),
        ("Traceback (most recent call last):", "the node's answer is not JSON"),
        ("[1, 2]", "the node's answer is not an object"),
        ('{"pid": 999, "errors": {}}', "the node answered for another pid"),
        ("x" * (2 << 20), "answer of 2097152 characters, over the 1048576 limit"),
    ],
)
def test_a_bad_answer_from_the_node_is_a_problem_not_a_crash(answer, problem):
    from opsconsole.nodes.process_details import details_from_answer

    assert details_from_answer(42, answer).problem == problem


@pytest.mark.parametrize(
    "start_time",
    ["1000.0", "null", '"1000"', "NaN", "Infinity", "1e308", "true"],
)
def test_an_answer_whose_start_time_is_not_the_listed_ones_shows_nothing_of_the_process(start_time):
    """The console compares the start time again (a reader that ignored it, or a hostile one): only an
    answer for a process started within the slack of the listed one is shown."""
    from opsconsole.nodes.process_details import MOVED, details_from_answer

    answer = '{"pid": 42, "start_time": %s, "args": ["secret"], "rank_env": {"RANK": "1"}, "errors": {}}' % start_time
    details = details_from_answer(42, answer, expected_start=5000.0)
    assert details.problem == MOVED and details.args == () and details.rank_env == ()
    assert details_from_answer(42, answer.replace(start_time, "5000.5"), expected_start=5000.0).args == ("secret",)
    moved = details_from_answer(42, '{"pid": 42, "moved": true, "args": ["secret"], "errors": {}}')
    assert moved.problem == MOVED and moved.args == ()


def test_odd_fields_in_an_answer_are_left_out():
    from opsconsole.nodes.process_details import details_from_answer

    details = details_from_answer(
        42,
        '{"pid": 42, "args": ["a", 5, {"x": 1}, "b"], "rank_env": {"RANK": 7, "WORLD_SIZE": "8",'
        ' "EVIL": "1"}, "cgroup": "0::/", "cwd": ["x"], "starttime": -1, "errors": []}',
    )
    assert details.args == ("a", "b") and details.rank_env == (("WORLD_SIZE", "8"),)
    assert details.cgroup == () and details.cwd is None and details.starttime is None and details.problem is None


async def test_details_name_the_job_and_container_the_probe_found():
    """A GPU process whose job the probe read (probe/jobs.py): the details say whose job it is; a node
    with no connection says so instead of the node's part."""
    from dataclasses import replace

    states = three_nodes()
    frame = states["gpu01"].frame
    owned = replace(frame.processes[0], job_id="4242", job_step="0", job_user="alice", container="docker/0123456789ab")
    states["gpu01"] = replace(states["gpu01"], frame=replace(frame, processes=(owned,)))
    pane = ProcessesPane()
    app = ConsoleLikeApp(pane)
    async with app.run_test(size=SIZE) as pilot:
        pane.show(states, None, NOW)
        pane.apply_filter("gpu:0")
        await pilot.pause()
        pane.gpu_table.table.focus()
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ProcessDetailsScreen) and app.screen.details is not None)
        text = str(app.screen.query_one("#details-frame").render())
        assert "Slurm job     4242" in text and "Job user      alice" in text and "docker/0123456789ab" in text
        assert "GPU 0" in text and "21 GiB GPU memory" in text
        assert app.screen.details.problem == "no connection to the node"  # gpu01 is a fixture, not a link
