"""The stacks screen with what a node can send that no real job would: hostile names, a node that is
down. The real hang is in test_stacks_torchrun.py."""

from __future__ import annotations

import socket
import time

from opsconsole.config import ActionsConfig, Config, ConsoleConfig, NodeConfig, SshConfig
from opsconsole.hang.pyspy import Frame, ThreadStack
from opsconsole.hang.stacks import RankStack, StackError, build_report
from opsconsole.nodes.fleet import Fleet
from opsconsole.tui.app import OpsConsole
from opsconsole.tui.stacks import RankStackScreen, StacksScreen

SIZE = (140, 44)
EVIL = "\x1b]52;c;ZXZpbA==\x07\x1b[2J\u202egnp.exe"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the socket goes


async def wait(pilot, predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await pilot.pause(0.05)
    raise AssertionError("condition not met within %g s" % timeout)


async def test_a_node_that_is_down_is_an_error_line_and_hostile_frames_show_as_visible_characters(tmp_path):
    config = Config(
        console=ConsoleConfig(interval=0.5, read_only=True),
        nodes=(NodeConfig(name="gone", host="127.0.0.1", port=closed_port()),),
        ssh=SshConfig(connect_timeout=3.0, backoff_initial=5.0, backoff_max=5.0, known_hosts=str(tmp_path / "kh")),
        actions=ActionsConfig(audit_log=str(tmp_path / "audit.log")),
    )
    app = OpsConsole(config, Fleet(config))
    async with app.run_test(size=SIZE) as pilot:
        app.action_show_pane("nodes")
        await pilot.pause()
        await pilot.press("S")
        screen = await wait(pilot, lambda: isinstance(app.screen, StacksScreen) and app.screen.report and app.screen)
        assert screen.report.ranks == () and screen.report.errors[0].node == "gone"
        assert screen.report.errors[0].reason.startswith("unreachable: ")
        assert "gone: unreachable" in str(screen.query_one("#stacks-errors").content)
        # The top line says why too, not only "no stack came" above a table of nothing.
        verdict = str(screen.query_one("#stacks-verdict").content)
        assert verdict.startswith("no stack came: gone: unreachable: "), verdict

        # What a hostile node could make py-spy's output say, once it went through the parser.
        frames = (Frame(EVIL * 3, "/x/" + EVIL + ".py", 7), Frame("train", "/job/train.py", 9))
        thread = ThreadStack(EVIL, 5, frames)
        hostile = build_report(
            [RankStack("gone", 5, 0, frames, (thread,), cmd=EVIL), RankStack("gone", 6, 1, frames[1:])],
            [StackError("gone", EVIL, 7)],
        )
        screen.show(hostile)
        await pilot.pause()
        table = screen.query_one("#stacks-table")
        cells = [str(cell) for key in ("gone/5", "gone/6") for cell in table.get_row(key)]
        assert not any("\x1b" in cell or "\x07" in cell or "\u202e" in cell for cell in cells)
        table.move_cursor(row=table.get_row_index("gone/5"))
        await pilot.press("enter")
        stack_screen = await wait(pilot, lambda: isinstance(app.screen, RankStackScreen) and app.screen)
        body = str(stack_screen.query_one("#rank-stack-body").content)
        assert "␛]52;c;ZXZpbA==␇␛[2J" in body and "\x1b" not in body and "\u202e" not in body
        await pilot.press("escape")
        await pilot.press("escape")
        await wait(pilot, lambda: not isinstance(app.screen, (StacksScreen, RankStackScreen)))


def test_the_gpu_processes_of_each_nodes_last_frame_go_to_the_node_as_the_fallback():
    from opsconsole.model import NodeFrame, NodeState, ProcessSample
    from opsconsole.tui.stacks import gpu_processes

    frame = NodeFrame(
        node="g1",
        time=0.0,
        processes=(
            ProcessSample(pid=40, gpu_index=1),
            ProcessSample(pid=40, gpu_index=2),
            ProcessSample(pid=31, gpu_index=0),
        ),
        top_processes=(ProcessSample(pid=7),),
    )
    states = {"g1": NodeState(name="g1", frame=frame), "g2": NodeState(name="g2"), "g3": NodeState(name="g3")}
    assert gpu_processes(states, ["g1", "g2"]) == {"g1": [31, 40]}
