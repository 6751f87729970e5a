"""Action keys in the real console (Pilot): read-only mode, confirmations, GPU reset with a stub, signals, drain, Audit pane.

The fleets here are fakes of the Fleet interface; what they publish is real: GPUs from the
H200 captures, processes read by the probe's /proc reader at each frame, real child processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from h200_fleet import idle_gpu, load_process, loaded_gpu  # noqa: E402
from textual.widgets import Button, DataTable, Input
from tui_fakes import FakeFleet, single_node_states  # noqa: E402

from opsconsole.actions import signals  # noqa: E402
from opsconsole.actions.registry import ACTIONS  # noqa: E402
from opsconsole.config import ActionsConfig, Config, ConsoleConfig, NodeConfig  # noqa: E402
from opsconsole.model import STATE_UP, NodeFrame, NodeState, ProcessSample  # noqa: E402
from opsconsole.nodes.local import LocalLink  # noqa: E402
from opsconsole.probe.procs import ProcessTable  # noqa: E402
from opsconsole.tui.action_flow import ReasonScreen, ResultScreen  # noqa: E402
from opsconsole.tui.app import ConsoleCommands, OpsConsole  # noqa: E402
from opsconsole.tui.confirm import ConfirmScreen  # noqa: E402
from opsconsole.tui.help import HelpScreen  # noqa: E402
from tests.waiting import wait_for  # noqa: E402

SIZE = (150, 45)
WAIT_LIMIT_S = 20.0
# Checkpoint cleanup's key belongs to the Checkpoints pane, which these consoles do not have.
# T (trust a host key) writes known_hosts: no registered action, hidden in read-only all the same.
DANGEROUS_IDS = {a.binding_id for a in ACTIONS if a.danger != "safe" and a.target_kind != "checkpoints"} | {
    "node.trust_hostkey"
}
DANGEROUS_KEYS = {"processes": ["i", "x", "K", "e"], "gpus": ["R"], "nodes": ["D", "T"]}


class LiveFleet(FakeFleet):
    """A fake fleet whose frames keep arriving: each states() is a frame received now.

    `pids`: host processes the frame lists, read from /proc by the probe's reader each time
    (a process that exited drops out, as it would from a real node's frame).
    """

    def __init__(self, name: str, gpus=(), processes=(), pids=()) -> None:
        super().__init__([NodeState(name=name, state=STATE_UP)])
        self.name, self.gpus, self.processes, self.pids = name, tuple(gpus), tuple(processes), list(pids)
        self.table = ProcessTable(use_psutil=False)
        self.seq = 0

    def states(self) -> Dict[str, NodeState]:
        self.seq += 1
        now = time.time()
        top = tuple(p for p in self.table.join([ProcessSample(pid=pid) for pid in self.pids]) if p.state is not None)
        frame = NodeFrame(
            node=self.name,
            time=now,
            seq=self.seq,
            gpus=self.gpus,
            processes=self.processes,
            top_processes=top,
            gpu_source="nvml",
        )
        return {self.name: NodeState(name=self.name, state=STATE_UP, frame=frame, received_at=now, since=now - 60)}

    def link(self, name: str) -> LocalLink:
        """The node is this machine, as the console's embedded default is: its PIDs are ours to signal."""
        if name != self.name:
            raise KeyError(name)
        return LocalLink(NodeConfig(name=name, local=True), 1.0)


def console(tmp_path: Path, fleet, read_only: bool = False, **actions) -> OpsConsole:
    config = Config(
        console=ConsoleConfig(interval=0.2, read_only=read_only),
        nodes=(NodeConfig(name="local", local=True),),
        actions=ActionsConfig(audit_log=str(tmp_path / "audit.log"), **actions),
    )
    return OpsConsole(config, fleet)


def audit_records(tmp_path: Path) -> List[dict]:
    path = tmp_path / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def messages(app) -> str:
    return " | ".join(n.message for n in app._notifications)


async def open_pane(pilot, app, key: str, pane_id: str) -> None:
    """Press the pane's key until it is visible and holds the focus (a pane mounting late may take it)."""
    pane = app.panes[pane_id]

    def settled() -> bool:
        focused = app.focused
        return app.visible_pane_id == pane_id and focused is not None and pane in focused.ancestors

    for _ in range(int(WAIT_LIMIT_S / 0.1)):
        await pilot.press(key)
        await pilot.pause(0.1)
        if settled():
            return
    raise AssertionError("pane %s never took the focus" % pane_id)


def highlighted(app) -> Optional[int]:
    """The PID under the Processes pane's cursor (None without a row): what its signal keys act on.

    The pane lists the fleet's processes from the frame after its first show; a key pressed before
    that finds no row and asks nothing (under load the wait for SIGINT gave up)."""
    found = app.panes.get("processes")
    process = found.highlighted_process() if found is not None else None
    return process[1] if process is not None else None


def palette_ids(app) -> List[str]:
    return [help_text.split()[0] for _, _, help_text in ConsoleCommands(app.screen)._commands()]


def footer_keys(app) -> List[str]:
    return [binding.key for (_, binding, enabled, _) in app.active_bindings.values() if binding.show]


# --- read-only ------------------------------------------------------------------------------


async def test_read_only_console_has_no_dangerous_keys_in_footer_help_or_palette(tmp_path):
    app = console(tmp_path, FakeFleet(single_node_states()), read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: "[R]" in app.header._shown.plain, "the header drawn", pilot=pilot)
        assert "[R]" in app.header._shown.plain
        for pane, keys in DANGEROUS_KEYS.items():
            await open_pane(pilot, app, {"processes": "2", "gpus": "1", "nodes": "4"}[pane], pane)
            if pane == "processes":
                await pilot.press(
                    "t", "t"
                )  # the tree view on and off again: the flat list (GPU and host processes), a row under the cursor
                await pilot.pause()
            ids = set(palette_ids(app))
            assert not ids & DANGEROUS_IDS, ids & DANGEROUS_IDS
            for key in keys:
                assert key not in footer_keys(app), (pane, key)
                await pilot.press(key)
                await pilot.pause()
                assert not isinstance(app.screen, (ConfirmScreen, ReasonScreen)), (pane, key)
        assert "node.health_rerun" in palette_ids(app)  # the safe action stays
        help_ids = {row[0] for row in app.help_rows()}
        assert not help_ids & DANGEROUS_IDS and "node.health_rerun" in help_ids
        await pilot.press("question_mark")
        # Pushed after the key's binding runs, its table made on mount: waited for, not one pause.
        await wait_for(
            lambda: isinstance(app.screen, HelpScreen) and app.screen.query("#help-table"), "the help", pilot=pilot
        )
        assert isinstance(app.screen, HelpScreen)
        table = app.screen.query_one("#help-table", DataTable)
        assert not {str(key.value) for key in table.rows} & DANGEROUS_IDS
    assert audit_records(tmp_path) == []  # nothing was even attempted


# --- GPU reset --------------------------------------------------------------------------------


def reset_stub(tmp_path: Path) -> Path:
    stub = tmp_path / "fake-nvidia-smi"
    stub.write_text(
        "#!%s\nimport json, sys\njson.dump(sys.argv[1:], open(%r, 'w'))\nprint('GPU reset done')\n"
        % (sys.executable, str(tmp_path / "argv.json"))
    )
    stub.chmod(0o755)
    return stub


async def test_gpu_reset_typed_confirmation_then_the_stub_runs_and_the_result_shows(tmp_path):
    stub = reset_stub(tmp_path)
    fleet = LiveFleet("local", gpus=[idle_gpu(0), loaded_gpu(1)], processes=[load_process(gpu_index=1)])
    app = console(tmp_path, fleet, gpu_reset_command=(str(stub), "--gpu-reset", "-i", "{index}"))
    async with app.run_test(size=SIZE) as pilot:
        await open_pane(pilot, app, "1", "gpus")
        await pilot.press("R")
        await wait_for(
            lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed, "the reset confirmation", pilot=pilot
        )
        screen = app.screen
        body = str(screen.query_one("#confirm-body").render())
        assert "%s --gpu-reset -i 0" % stub in body and "local" in body and "privileges" in body
        assert screen.query_one("#confirm-yes", Button).disabled
        await pilot.press("y", "enter")  # y is just a letter in the word box; enter with a wrong word rings
        await pilot.pause()
        assert app.screen is screen and not (tmp_path / "argv.json").exists()
        await pilot.press("backspace")
        await pilot.press(*"local/0")
        await pilot.press("enter")
        await wait_for(
            lambda: isinstance(app.screen, ResultScreen) and app.screen.is_mounted, "the result screen", pilot=pilot
        )
        result = str(app.screen.query_one("#result-body").render())
        assert "exit status 0" in result and "GPU reset done" in result and "GPU 0 read again" in result
        assert json.loads((tmp_path / "argv.json").read_text()) == ["--gpu-reset", "-i", "0"]
        await pilot.press("escape")
        # The result screen goes, then the GPUs table has the focus back: keys typed before that were the
        # screen's (under load `down` and `R` went to it and the refusal never came).
        await wait_for(
            lambda: not isinstance(app.screen, ResultScreen) and isinstance(app.focused, DataTable),
            "the GPUs table again",
            pilot=pilot,
        )
        # Pre-check refusal: GPU 1 runs a compute process.
        await pilot.press("down", "R")
        await wait_for(lambda: "stop them first" in messages(app), "the refusal", pilot=pilot)
        assert not isinstance(app.screen, ConfirmScreen)
    outcomes = [(r["action"], r["target"], r["outcome"]) for r in audit_records(tmp_path)]
    assert outcomes == [
        ("gpu_reset", "gpu 0", "attempt"),
        ("gpu_reset", "gpu 0", "ok"),
        ("gpu_reset", "gpu 1", "refused"),
    ]


# --- signals --------------------------------------------------------------------------------


async def test_sigterm_from_the_processes_pane_cancel_is_focused_then_y_sends_it(tmp_path):
    # Until the test's SIGTERM: a loaded run took past 30 s, `sleep 30` exited 0 on its own first.
    sleeper = subprocess.Popen(["sleep", "infinity"])
    try:
        fleet = LiveFleet("local", pids=[sleeper.pid])
        app = console(tmp_path, fleet)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await open_pane(pilot, app, "2", "processes")
            await pilot.press("t", "t")  # the tree view on and off again: the flat list, as at start
            await wait_for(lambda: highlighted(app) == sleeper.pid, "the sleeper's row highlighted", pilot=pilot)
            await pilot.press("x")
            await wait_for(
                lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed,
                "the signal confirmation",
                pilot=pilot,
            )
            body = str(app.screen.query_one("#confirm-body").render())
            assert "kill -s TERM -- %d" % sleeper.pid in body and "local" in body and "sleep" in body
            # The screen's focus, given with `armed` (the button's has_focus follows a message later).
            assert app.screen.focused is app.screen.query_one("#confirm-no", Button)
            await pilot.press("enter")  # a stray enter presses Cancel
            # The flow ends after the screen goes (it notes the cancel): an x before that is "already
            # running" and opens nothing (under load the next wait gave up on it).
            await wait_for(
                lambda: not isinstance(app.screen, ConfirmScreen) and not app.action_flow.running,
                "the cancel",
                pilot=pilot,
            )
            assert sleeper.poll() is None
            await pilot.press("x")
            await wait_for(
                lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed,
                "the confirmation again",
                pilot=pilot,
            )
            await pilot.press("y")
            await wait_for(lambda: "gone" in messages(app) or "zombie" in messages(app), "the verdict", pilot=pilot)
            assert sleeper.wait(10) == -15
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait(10)
    assert [r["outcome"] for r in audit_records(tmp_path)] == ["cancelled", "attempt", "ok"]


def waiting_in(function_name: str) -> bool:
    """Whether a task of this event loop is suspended inside the coroutine function of that name."""
    for task in asyncio.all_tasks():
        coroutine = task.get_coro()
        while coroutine is not None:
            code = getattr(coroutine, "cr_code", None) or getattr(coroutine, "gi_code", None)
            if code is None:
                break
            if code.co_name == function_name:
                return True
            coroutine = getattr(coroutine, "cr_await", None) or getattr(coroutine, "gi_yieldfrom", None)
    return False


STUBBORN = (
    "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)\n"
)


async def test_an_escalation_question_waits_while_the_filter_is_typed_into(tmp_path, monkeypatch):
    """The 'still running: send SIGTERM?' question comes on a timer; it never opens under a typing user."""
    # The escalation's watch (signal_escalation_s of frames, then the question) starts once the filter
    # is open, so the question comes due while the user types however slow the machine is: under load
    # the 1.5 s passed before the filter was open, and the question came before anyone typed.
    filter_open = asyncio.Event()
    real_watch = signals.watch_process

    async def watch_once_the_filter_is_open(*args, **kwargs):
        await filter_open.wait()
        return await real_watch(*args, **kwargs)

    monkeypatch.setattr(signals, "watch_process", watch_once_the_filter_is_open)
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        fleet = LiveFleet("local", pids=[stubborn.pid])
        app = console(tmp_path, fleet, signal_escalation_s=1.5)  # the question comes while the filter is open
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await open_pane(pilot, app, "2", "processes")
            await pilot.press("t", "t")  # the tree view on and off again: the flat list, as at start
            await wait_for(lambda: highlighted(app) == stubborn.pid, "the process's row highlighted", pilot=pilot)
            await pilot.press("e")
            await wait_for(
                lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed, "the escalation", pilot=pilot
            )
            await pilot.press("y")  # SIGINT, which the process ignores
            await wait_for(lambda: not isinstance(app.screen, ConfirmScreen), "the SIGINT", pilot=pilot)
            await pilot.press("slash")
            await wait_for(lambda: isinstance(app.focused, Input), "the filter", pilot=pilot)
            filter_open.set()
            # The escalation's wait passes while the user types: type until its question is due and held
            # back (the flow waits in wait_until_not_typing), then on for 0.5 s of that wait's polls.
            typed = 0
            while not waiting_in("wait_until_not_typing"):
                assert typed < 400, "the escalation's question never came due"
                await pilot.press("y")
                await pilot.pause()
                typed += 1
                assert not isinstance(app.screen, ConfirmScreen)
            for _ in range(5):
                await pilot.press("y")
                await pilot.pause(0.1)
                typed += 1
                assert not isinstance(app.screen, ConfirmScreen)
            assert app.filter_input.value == "y" * typed
            await pilot.press("escape")  # the input closes: now the question may open
            await wait_for(
                lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed, "the SIGTERM question", pilot=pilot
            )
            assert "SIGTERM" in app.screen.title_text
            await pilot.press("escape")
            # The flow notes the answer after the screen goes: wait for the flow to end, not a fixed
            # 0.3 s (under load the app closed before the 'cancelled' record was written).
            await wait_for(
                lambda: not isinstance(app.screen, ConfirmScreen) and not app.action_flow.running,
                "the answer",
                pilot=pilot,
            )
        assert stubborn.poll() is None  # SIGTERM was never sent
        outcomes = [(r["command"], r["outcome"]) for r in audit_records(tmp_path)]
        assert [o for _, o in outcomes] == ["attempt", "ok", "cancelled"] and "TERM" in " ".join(outcomes[-1][0])
    finally:
        stubborn.kill()
        stubborn.wait(10)


# --- drain and the Audit pane -----------------------------------------------------------------


async def test_drain_asks_a_reason_confirms_runs_and_the_audit_pane_shows_it_newest_first(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Slurm calls this machine gpu-a07; the console calls it `local` (its embedded default's label).
    host = socket.gethostname()
    (bin_dir / "scontrol").write_text(
        "#!%s\nimport json, sys\nif sys.argv[1:] == ['-o', 'show', 'node']:\n"
        "    print('NodeName=gpu-a07 NodeAddr=10.0.0.7 NodeHostName=%s State=IDLE')\n"
        "else:\n    open(%r, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        % (sys.executable, host, str(tmp_path / "calls.jsonl"))
    )
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    app = console(tmp_path, LiveFleet("local", gpus=[idle_gpu(0)]))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await open_pane(pilot, app, "4", "nodes")
        await pilot.press("D")
        await wait_for(
            lambda: isinstance(app.screen, ReasonScreen) and app.screen.is_mounted, "the reason prompt", pilot=pilot
        )
        await pilot.press("enter")  # empty: refused in place
        await wait_for(
            lambda: "needs a reason" in str(app.screen.query_one("#reason-error").render()), "the refusal", pilot=pilot
        )
        assert isinstance(app.screen, ReasonScreen)
        assert "needs a reason" in str(app.screen.query_one("#reason-error").render())
        app.screen.query_one("#reason-input", Input).value = "XID 79 on GPU 3"
        await pilot.press("enter")
        await wait_for(
            lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed, "the drain confirmation", pilot=pilot
        )
        body = str(app.screen.query_one("#confirm-body").render())
        assert "scontrol update NodeName=gpu-a07 State=DRAIN 'Reason=XID 79 on GPU 3'" in body
        assert "Slurm node gpu-a07: Slurm's node on host %s, where local runs" % host.lower() in body
        await pilot.press("y")
        await wait_for(
            lambda: (tmp_path / "calls.jsonl").exists() and "exit status 0" in messages(app), "drain", pilot=pilot
        )
        await open_pane(pilot, app, "0", "audit")
        table = app.panes["audit"].query_one("#audit-table", DataTable)
        await wait_for(lambda: table.row_count >= 2, "the audit records", pilot=pilot)
        first = [str(cell) for cell in table.get_row_at(0)]
        assert first[3] == "drain_node" and first[5] == "ok" and "Reason=XID 79 on GPU 3" in first[6]
        assert [str(c) for c in table.get_row_at(1)][5] == "attempt"
        await pilot.press("enter")
        await wait_for(
            lambda: isinstance(app.screen, ResultScreen) and app.screen.is_mounted, "the record's result", pilot=pilot
        )
        assert isinstance(app.screen, ResultScreen)
        assert "exit status" in str(app.screen.query_one("#result-body").render())
    assert json.loads((tmp_path / "calls.jsonl").read_text()) == [
        "update",
        "NodeName=gpu-a07",
        "State=DRAIN",
        "Reason=XID 79 on GPU 3",
    ]


async def test_action_keys_can_be_remapped_and_yes_no_can_be_switched_off(tmp_path):
    """[console.keys] remaps an action like any binding; [actions] confirm = false skips yes/no, never a typed word."""
    # Until the test's SIGINT, however long the run takes. SIGINT at its default in the child, as
    # test_actions_signals starts its children: a worker whose SIGINT is ignored (a run started in the
    # background of a non-interactive shell) passes that on across exec, and `sleep` would not die.
    sleeper = subprocess.Popen(["sleep", "infinity"], preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        config = Config(
            console=ConsoleConfig(interval=0.2, keys=(("process.signal_int", "I"), ("gpu.reset", "G"))),
            nodes=(NodeConfig(name="local", local=True),),
            actions=ActionsConfig(
                audit_log=str(tmp_path / "audit.log"),
                confirm=False,
                gpu_reset_command=(str(reset_stub(tmp_path)), "-i", "{index}"),
            ),
        )
        app = OpsConsole(config, LiveFleet("local", gpus=[idle_gpu(0)], pids=[sleeper.pid]))
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert ("gpu.reset", "G") in [(row[0], row[1]) for row in app.help_rows()]
            assert DANGEROUS_IDS <= {row[0] for row in app.help_rows()}  # read-write: all offered
            await open_pane(pilot, app, "1", "gpus")
            assert "G" in footer_keys(app) and "R" not in footer_keys(app)
            await pilot.press("G")  # the typed word is still asked
            await wait_for(
                lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed,
                "the reset confirmation",
                pilot=pilot,
            )
            assert app.screen.word == "local/0"
            await pilot.press("escape")
            await pilot.pause()
            await open_pane(pilot, app, "2", "processes")
            assert {"process.signal_int", "process.signal_kill"} <= set(palette_ids(app))
            await pilot.press("t", "t", "i")  # the old key does nothing now
            await pilot.pause(0.3)
            assert sleeper.poll() is None and not isinstance(app.screen, ConfirmScreen)
            # The pane lists the sleeper from its next frame on: `I` before that signals nothing.
            await wait_for(lambda: highlighted(app) == sleeper.pid, "the sleeper's row highlighted", pilot=pilot)
            await pilot.press("I")  # no yes/no: sent at once
            await wait_for(lambda: sleeper.poll() is not None, "SIGINT delivered", pilot=pilot)
            assert sleeper.returncode == -2
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait(10)
    outcomes = [(r["action"], r["outcome"]) for r in audit_records(tmp_path)]
    assert outcomes[0] == ("gpu_reset", "cancelled") and outcomes[1:3] == [
        ("signal_int", "attempt"),
        ("signal_int", "ok"),
    ]


def test_audit_rows_show_old_and_new_records_on_one_line():
    from opsconsole.actions.audit import AuditLog
    from opsconsole.tui.audit import record_cells, record_detail

    log = AuditLog("/nonexistent/audit.log")  # only used to format lines, never written
    # A record as written before every record had target, command and id: it still reads.
    old = {
        "time": "2026-12-01T10:00:00.000+00:00",
        "user": "u",
        "host": "login1",
        "action": "trust_hostkey",
        "node": "n1",
        "detail": "[127.0.0.1]:22 ssh-ed25519 SHA256:x",
        "outcome": "confirmed",
    }
    cells = record_cells(old)
    assert cells["what"] == "[127.0.0.1]:22 ssh-ed25519 SHA256:x" and cells["target"] == ""
    new = json.loads(
        log.record_line(
            "drain_node",
            "n1",
            "exit 1: bad\nnews",
            "failed",
            target="node n1",
            command=["scontrol", "update", "Reason=a b"],
            entry_id="abc",
            result={"exit_status": 1, "stdout": "", "stderr": "bad\nnews"},
        )
    )
    cells = record_cells(new)
    assert cells["what"] == "scontrol update Reason=a b ← exit 1: bad news"  # one line in the table
    detail = str(record_detail(new))
    assert "exit status 1" in detail and "stderr:\nbad\nnews" in detail
    assert cells["time"][:4].isdigit() and len(cells["time"]) == 19


async def test_audit_pane_cuts_a_long_node_name_with_an_ellipsis(tmp_path):
    from opsconsole.actions.audit import AuditLog

    AuditLog(str(tmp_path / "audit.log")).write("trust_hostkey", "h200-training-rerun-a01", "detail", "confirmed")
    app = console(tmp_path, LiveFleet("local"))
    async with app.run_test(size=(160, 40)) as pilot:
        await open_pane(pilot, app, "0", "audit")
        table = app.panes["audit"].query_one("#audit-table", DataTable)
        assert await wait_for(lambda: table.row_count == 1, "the audit record", pilot=pilot)
        assert str(table.get_row_at(0)[2]) == "h200-traini…"
