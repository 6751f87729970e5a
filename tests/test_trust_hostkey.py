"""Trusting a host key from the console: real sshd, the real Fleet in the real app, driven by Pilot.

Decision tested here (see opsconsole/nodes/trust.py): an unknown key is appended after
`y`; a CHANGED key is never written by the console, the modal shows the `ssh-keygen -R`
command instead, and once the user has run it the key is unknown and can be trusted.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import asyncssh
import pytest
from textual import events
from textual.widgets import Button, DataTable

from opsconsole.config import ActionsConfig, Config, ConsoleConfig, NodeConfig, SshConfig
from opsconsole.model import STATE_HOSTKEY, STATE_UP, NodeState
from opsconsole.nodes.fleet import Fleet
from opsconsole.nodes.trust import TrustPlan, _known_key_lines, plan_trust
from opsconsole.tui.app import OpsConsole
from opsconsole.tui.confirm import ConfirmScreen
from opsconsole.tui.nodes import NodesPane
from tests.sshd import SSH_KEYGEN, keygen, ssh_client, sshd_factory  # noqa: F401
from tests.waiting import pane_shown, wait_for

SIZE = (140, 40)
WAIT_LIMIT_S = 40.0  # generous: a loaded 2-core machine; the tests poll, they don't time anything
FAST = SshConfig(
    connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2, backoff_initial=0.05, backoff_max=0.5
)


def ssh_fingerprint(pub_path) -> str:
    out = subprocess.run(
        [SSH_KEYGEN, "-l", "-E", "sha256", "-f", str(pub_path)], capture_output=True, text=True, check=True
    )
    return out.stdout.split()[1]


def console_for(server, audit: Path, read_only: bool = False) -> OpsConsole:
    config = Config(
        console=ConsoleConfig(interval=0.3, read_only=read_only),
        nodes=(NodeConfig(name="n1", host=server.address, port=server.port),),
        ssh=FAST,
        actions=ActionsConfig(audit_log=str(audit)),
    )
    return OpsConsole(config, Fleet(config))


def state_of(app: OpsConsole, name: str = "n1") -> NodeState:
    return app.fleet.states()[name]


async def open_trust(pilot, app: OpsConsole, asks: bool = True):
    """Wait for `hostkey`, go to the Nodes pane, select n1, press T (and, when it `asks`, wait for its question)."""
    await wait_for(
        lambda: state_of(app).state == STATE_HOSTKEY, "n1 in state hostkey", timeout=WAIT_LIMIT_S, pilot=pilot
    )
    await pilot.press("4")
    # Made on its first show, drawn, then focused: waited for, not one pause.
    await wait_for(lambda: pane_shown(app, "nodes"), "the Nodes pane", pilot=pilot)
    table = app.panes["nodes"].query_one("#nodes-table", DataTable)
    assert table.has_focus
    assert app.panes["nodes"].highlighted_node() == "n1"
    await pilot.press("T")
    if asks:
        await until_armed(pilot, app)
    else:
        await pilot.pause()  # nothing to wait for: T does nothing here


async def until_armed(pilot, app) -> None:
    """Wait until a confirmation is on screen and takes keys (it drops those of its first moments).

    It returned at once while the screen was not pushed yet, and after 10 s of polls whatever the
    screen was: under load the keys after it were dropped or went to the pane."""
    await wait_for(
        lambda: isinstance(app.screen, ConfirmScreen) and app.screen.armed, "the confirmation armed", pilot=pilot
    )


def audit_records(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def body_of(screen: ConfirmScreen) -> str:
    return str(screen.query_one("#confirm-body").render())


def messages(app: OpsConsole) -> str:
    return " | ".join(n.message for n in app._notifications)


@pytest.mark.sshd
async def test_trust_an_unknown_key_and_the_node_comes_up(sshd_factory, ssh_client, tmp_path):
    server = sshd_factory.start(trust=False)
    audit = tmp_path / "audit.log"
    app = console_for(server, audit)
    async with app.run_test(size=SIZE) as pilot:
        await open_trust(pilot, app)
        screen = app.screen
        assert isinstance(screen, ConfirmScreen)
        assert screen.focused is screen.query_one("#confirm-no", Button)  # Cancel by default
        fingerprint = ssh_fingerprint(str(server.host_key) + ".pub")
        body = body_of(screen)
        assert fingerprint in body and state_of(app).fingerprint == fingerprint
        assert "n1" in body and "[%s]:%d" % (server.address, server.port) in body and "ssh-ed25519" in body
        assert server.known_hosts_line().strip() in body  # the exact line ...
        assert str(ssh_client.known_hosts) in body  # ... and the file it goes to
        assert ssh_client.known_hosts.read_text() == ""  # nothing written before `y`
        await pilot.press("y")
        await wait_for(
            lambda: state_of(app).state == STATE_UP, "n1 up after trusting", timeout=WAIT_LIMIT_S, pilot=pilot
        )
        assert not isinstance(app.screen, ConfirmScreen)
        assert state_of(app).fingerprint is None and state_of(app).frame is not None
    assert ssh_client.known_hosts.read_text() == server.known_hosts_line()
    records = audit_records(audit)
    # Confirmed before known_hosts is written, its result after (as every action's records go).
    assert [(r["action"], r["node"], r["outcome"]) for r in records] == [
        ("trust_hostkey", "n1", "confirmed"),
        ("trust_hostkey", "n1", "ok"),
    ]
    assert fingerprint in records[0]["detail"] and str(ssh_client.known_hosts) in records[0]["detail"]
    assert records[1]["detail"] == records[0]["detail"]


@pytest.mark.sshd
@pytest.mark.parametrize("key", ["n", "escape"])
async def test_cancel_leaves_known_hosts_alone(sshd_factory, ssh_client, tmp_path, key):
    server = sshd_factory.start(trust=False)
    audit = tmp_path / "audit.log"
    app = console_for(server, audit)
    async with app.run_test(size=SIZE) as pilot:
        await open_trust(pilot, app)
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press(key)
        await wait_for(lambda: not isinstance(app.screen, ConfirmScreen), "the cancel", pilot=pilot)
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.pause(0.5)  # a retry, if one were wrongly sent, would have connected by now
        assert state_of(app).state == STATE_HOSTKEY
        assert app.fleet.link("n1").connect_attempts == 1
    assert ssh_client.known_hosts.read_text() == ""
    assert [r["outcome"] for r in audit_records(audit)] == ["cancelled"]
    assert server.count_log("Accepted publickey") == 0


@pytest.mark.sshd
async def test_read_only_console_refuses(sshd_factory, ssh_client, tmp_path):
    server = sshd_factory.start(trust=False)
    audit = tmp_path / "audit.log"
    app = console_for(server, audit, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await open_trust(pilot, app, asks=False)  # presses T on n1, in state hostkey
        assert not isinstance(app.screen, ConfirmScreen)
        assert "[R]" in app.header._shown.plain
        # Absent, as the README says of keys that change anything: not in the footer, help or palette.
        shown = [b.key for (_, b, _, _) in app.active_bindings.values() if b.show]
        assert "T" not in shown and "c" in shown, shown
        assert "node.trust_hostkey" not in {row[0] for row in app.help_rows()}
        assert audit_records(audit) == []  # the key did nothing at all
        # Asked for anyway (a message, as a script or another path would): refused and audited.
        app.panes["nodes"].post_message(NodesPane.TrustHostKey("n1"))
        await wait_for(lambda: "read-only" in messages(app), "the refusal", pilot=pilot)
        assert not isinstance(app.screen, ConfirmScreen)
    assert ssh_client.known_hosts.read_text() == ""
    records = audit_records(audit)
    assert [r["outcome"] for r in records] == ["refused"] and "read-only" in records[0]["detail"]


@pytest.mark.sshd
async def test_changed_key_is_refused_then_trusted_after_the_user_removes_the_old_line(
    sshd_factory, ssh_client, tmp_path
):
    server = sshd_factory.start(trust=False)
    ssh_client.trust_wrong_key(server)
    before = ssh_client.known_hosts.read_text()
    old_fingerprint = ssh_fingerprint(ssh_client.home / ("other_%d.pub" % server.port))
    new_fingerprint = ssh_fingerprint(str(server.host_key) + ".pub")
    audit = tmp_path / "audit.log"
    app = console_for(server, audit)
    async with app.run_test(size=SIZE) as pilot:
        await open_trust(pilot, app)
        assert "CHANGED" in state_of(app).reason
        screen = app.screen
        assert isinstance(screen, ConfirmScreen)
        assert not screen.query("#confirm-yes")  # nothing to confirm: the console will not write it
        body = body_of(screen)
        assert new_fingerprint in body and old_fingerprint in body and "MAN-IN-THE-MIDDLE" in body
        command = "ssh-keygen -R '[%s]:%d' -f %s" % (server.address, server.port, ssh_client.known_hosts)
        assert command in body
        await pilot.press("y")  # not a one-keystroke trust
        await pilot.pause()
        assert app.screen is screen
        await pilot.press("escape")
        await wait_for(lambda: not isinstance(app.screen, ConfirmScreen), "the screen closed", pilot=pilot)
        assert not isinstance(app.screen, ConfirmScreen)
        assert ssh_client.known_hosts.read_text() == before
        # The user runs the command the modal showed; the key is then unknown, and trusted with y.
        subprocess.run(command, shell=True, check=True, capture_output=True)
        await pilot.press("T")
        await until_armed(pilot, app)
        assert isinstance(app.screen, ConfirmScreen) and app.screen.query("#confirm-yes")
        assert new_fingerprint in body_of(app.screen)
        await pilot.press("y")
        await wait_for(
            lambda: state_of(app).state == STATE_UP, "n1 up after the old key went", timeout=WAIT_LIMIT_S, pilot=pilot
        )
    assert ssh_client.known_hosts.read_text() == server.known_hosts_line()
    assert [r["outcome"] for r in audit_records(audit)] == ["refused", "confirmed", "ok"]
    assert old_fingerprint in audit_records(audit)[0]["detail"]


@pytest.mark.sshd
async def test_audit_write_failure_is_a_notification(sshd_factory, ssh_client, tmp_path):
    server = sshd_factory.start(trust=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    app = console_for(server, blocker / "audit.log")
    async with app.run_test(size=SIZE) as pilot:
        await open_trust(pilot, app)
        await pilot.press("n")
        await wait_for(lambda: "not written" in messages(app), "the toast", pilot=pilot)
        assert "not written" in messages(app) and "Not a directory" in messages(app)
        await pilot.press("2")  # still running and answering keys
        await wait_for(lambda: app.visible_pane_id == "processes", "the Processes pane", pilot=pilot)
        assert app.visible_pane_id == "processes"
    assert blocker.read_text() == ""


@pytest.mark.sshd
async def test_a_trust_that_cannot_be_audited_is_not_done(sshd_factory, ssh_client, tmp_path):
    server = sshd_factory.start(trust=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    app = console_for(server, blocker / "audit.log")
    assert ssh_client.known_hosts.read_text() == ""
    async with app.run_test(size=SIZE) as pilot:
        await open_trust(pilot, app)
        await pilot.press("y")
        await wait_for(lambda: "audit log could not be written" in messages(app), "the toast", pilot=pilot)
        assert "audit log could not be written" in messages(app)
    assert ssh_client.known_hosts.read_text() == ""  # not trusted: nothing appended


async def test_a_local_node_only_notifies(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = Config(console=ConsoleConfig(interval=0.5))  # the built-in config: one local node
    app = OpsConsole(config, Fleet(config))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await wait_for(lambda: pane_shown(app, "nodes"), "the Nodes pane", pilot=pilot)
        await pilot.press("T")
        await wait_for(lambda: "not reached over SSH" in messages(app), "the toast", pilot=pilot)
        assert not isinstance(app.screen, ConfirmScreen)
        assert "not reached over SSH" in messages(app)
    assert not (tmp_path / "state").exists()  # not an attempt: nothing audited


# --- the plan, without the UI --------------------------------------------------------------


def test_plan_refuses_nodes_without_a_waiting_key():
    assert "not waiting on a host key" in plan_trust(NodeState(name="n1", state=STATE_UP), object())
    assert "not reached over SSH" in plan_trust(NodeState(name="n1", state=STATE_HOSTKEY), object())


def test_known_key_lines_port_hashed_and_portless(tmp_path):
    presented_path = keygen(tmp_path / "presented")
    other_path = keygen(tmp_path / "other")
    presented = asyncssh.read_public_key(str(presented_path) + ".pub")
    other = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    mine = " ".join((tmp_path / "presented.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text("# comment\n[127.0.0.1]:2222 %s\n10.0.0.9 %s\n" % (other, other))
    lines, found = _known_key_lines([str(known)], "127.0.0.1", 2222, presented)
    assert not found and [(l.line_number, l.pattern) for l in lines] == [(2, "[127.0.0.1]:2222")]
    assert lines[0].fingerprint == ssh_fingerprint(str(other_path) + ".pub")
    # A hashed file (ssh-keygen -H) is read the same way; a port-less line counts for any port.
    known.write_text("127.0.0.1 %s\n[127.0.0.1]:2222 %s\n" % (other, mine))
    subprocess.run([SSH_KEYGEN, "-H", "-f", str(known)], check=True, capture_output=True)
    assert "127.0.0.1" not in known.read_text()
    lines, found = _known_key_lines([str(known)], "127.0.0.1", 2222, presented)
    assert found and [l.pattern for l in lines] == ["127.0.0.1"]
    plan = TrustPlan(
        node="n1",
        host="127.0.0.1",
        port=2222,
        pattern="[127.0.0.1]:2222",
        key_type="ssh-ed25519",
        fingerprint="SHA256:x",
        key=presented,
        known_hosts=str(known),
        line="",
        old_keys=tuple(lines),
    )
    assert plan.remove_commands() == ["ssh-keygen -R 127.0.0.1 -f %s" % known]


# --- the reusable confirmation screen --------------------------------------------------------


class _Host:
    """A bare app that pushes one ConfirmScreen and keeps its answer."""

    @staticmethod
    def make(screen: ConfirmScreen):
        from textual.app import App

        class HostApp(App):
            answers: list = []

            def on_mount(self) -> None:
                self.push_screen(screen, callback=self.answers.append)

        return HostApp()


@pytest.mark.parametrize("keys, answer", [(["y"], True), (["n"], False), (["escape"], False), (["enter"], False)])
async def test_confirm_screen_keys(keys, answer):
    app = _Host.make(ConfirmScreen("Kill 421?", "kill -s TERM 421 on gpu-a01"))
    async with app.run_test() as pilot:
        await until_armed(pilot, app)
        await pilot.press(*keys)  # enter presses the focused button: Cancel
        await wait_for(lambda: app.answers, "the answer", pilot=pilot)
    assert app.answers == [answer]


async def test_confirm_screen_with_a_typed_word():
    app = _Host.make(ConfirmScreen("Reset GPU 3?", "nvidia-smi -r -i 3", word="gpu-a01", danger=True))
    async with app.run_test() as pilot:
        await until_armed(pilot, app)
        confirm = app.screen.query_one("#confirm-yes", Button)
        assert confirm.disabled
        await pilot.press("y", "enter")  # `y` is typed into the word, not a confirmation
        await pilot.pause()
        assert app.answers == [] and confirm.disabled
        await pilot.press("backspace", *"gpu-a01")
        await wait_for(lambda: not confirm.disabled, "the word typed", pilot=pilot)
        assert not confirm.disabled
        await pilot.press("enter")
        await wait_for(lambda: app.answers, "the answer", pilot=pilot)
    assert app.answers == [True]


@pytest.mark.parametrize("keys", [["y"], ["enter"], list("gpu-a01") + ["enter"]])
async def test_keys_in_the_burst_that_opened_a_confirmation_are_dropped(keys):
    """Keys arriving before the question can be read (a paste, a laggy link) neither answer nor type."""
    word = "gpu-a01" if "g" in keys else None
    screen = ConfirmScreen("Reset GPU 3?", "nvidia-smi -r -i 3", word=word, danger=True)
    screen.ARM_DELAY_S = 60.0  # this screen arms when the test says so, however slow the machine is
    app = _Host.make(screen)
    async with app.run_test() as pilot:
        for _ in range(200):
            if app.screen is screen and screen.is_mounted:
                break
            await pilot.pause(0.05)
        await pilot.press(*keys)
        assert app.screen is screen and not screen.armed and screen.keys_dropped == len(keys)
        assert app.answers == [] and screen.focused is None
        screen._arm()  # what the timer does
        await pilot.pause()
        assert app.answers == [] and screen.armed
        if word:
            assert screen.query_one("#confirm-word").value == "" and screen.focused is screen.query_one("#confirm-word")
        else:
            assert screen.focused is screen.query_one("#confirm-no", Button)


@pytest.mark.parametrize("word", [None, "gpu-a01"])
async def test_a_key_that_arrives_as_the_confirmation_arms_finds_its_widget_focused(word):
    """The focus is given with `armed`, not after the queued events: an enter already queued when the
    screen armed reached no widget and was lost (the Processes pane's stray-enter test, under load)."""
    screen = ConfirmScreen("Kill 421?", "kill -s TERM 421 on gpu-a01", word=word)
    screen.ARM_DELAY_S = 60.0  # this screen arms when the test says so
    app = _Host.make(screen)
    async with app.run_test() as pilot:
        await wait_for(lambda: app.screen is screen and screen.is_mounted, "the confirmation", pilot=pilot)
        app.post_message(events.Key("enter", None))  # queued: handled after _arm, as a key typed just before
        screen._arm()  # what the timer does
        expected = screen.query_one("#confirm-word" if word else "#confirm-no")
        assert screen.focused is expected
        if word:  # enter with the word not typed: the screen stays, the input keeps the focus
            await pilot.pause()
            assert app.answers == [] and screen.focused is expected
            await pilot.press(*word, "enter")
        await wait_for(lambda: app.answers, "the answer", pilot=pilot)
    assert app.answers == [bool(word)]


# --- a changed key the user answers outside the console (ssh-keygen -R) ----------------------------


def header_and_row(app: OpsConsole) -> tuple:
    """The header's node counts line and n1's Reason cell as the console shows them now."""
    table = app.panes["nodes"].query_one("#nodes-table", DataTable)
    columns = [str(c.label).strip() for c in table.columns.values()]
    reason = str(table.get_row("n1")[[c.startswith("Reason") for c in columns].index(True)])
    return app.header._shown.plain.split("\n")[1], reason


@pytest.mark.sshd
async def test_removing_the_changed_key_outside_the_console_shows_it_unknown_without_t(
    sshd_factory, ssh_client, tmp_path
):
    """Two host keys: the server's and an old one in known_hosts. After `ssh-keygen -R` the next attempt
    finds the key unknown and says so (the fingerprint T would trust) with nothing written or trusted."""
    server = sshd_factory.start(trust=False)
    ssh_client.trust_wrong_key(server)
    new_fingerprint = ssh_fingerprint(str(server.host_key) + ".pub")
    audit = tmp_path / "audit.log"
    app = console_for(server, audit)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            lambda: state_of(app).state == STATE_HOSTKEY, "n1 in state hostkey", timeout=WAIT_LIMIT_S, pilot=pilot
        )
        await pilot.press("4")
        assert "HOST KEY CHANGED" in state_of(app).reason
        await wait_for(lambda: header_and_row(app)[1].startswith("HOST KEY"), "the row drawn", pilot=pilot)
        assert "down 1 (hostkey 1)" in header_and_row(app)[0]
        link = app.fleet.link("n1")
        attempts = link.connect_attempts
        pattern = "[%s]:%d" % (server.address, server.port)
        subprocess.run([SSH_KEYGEN, "-R", pattern, "-f", str(ssh_client.known_hosts)], check=True, capture_output=True)
        after_removal = ssh_client.known_hosts.read_text()
        assert pattern not in after_removal
        await wait_for(
            lambda: state_of(app).reason.startswith("unknown host key"),
            "n1's key unknown once the old line went",
            timeout=WAIT_LIMIT_S,
            pilot=pilot,
        )
        state = state_of(app)
        assert state.state == STATE_HOSTKEY and state.fingerprint == new_fingerprint
        assert new_fingerprint in state.reason and "CHANGED" not in state.reason
        await wait_for(lambda: header_and_row(app)[1].startswith("unknown host key"), "the row redrawn", pilot=pilot)
        assert "down 1 (hostkey 1)" in header_and_row(app)[0]
        assert link.connect_attempts == attempts + 1  # one attempt for the change, not a loop
        await pilot.pause(0.5)
        assert link.connect_attempts == attempts + 1
        assert not isinstance(app.screen, ConfirmScreen)
    assert ssh_client.known_hosts.read_text() == after_removal  # nothing trusted or written without T
    assert audit_records(audit) == []
    assert server.count_log("Accepted publickey") == 0


@pytest.mark.sshd
async def test_replacing_the_changed_key_outside_the_console_connects_without_t(sshd_factory, ssh_client, tmp_path):
    """The user removes the old key and adds the right one (as from the node's admin): the node comes up."""
    server = sshd_factory.start(trust=False)
    ssh_client.trust_wrong_key(server)
    audit = tmp_path / "audit.log"
    app = console_for(server, audit)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            lambda: state_of(app).state == STATE_HOSTKEY, "n1 in state hostkey", timeout=WAIT_LIMIT_S, pilot=pilot
        )
        pattern = "[%s]:%d" % (server.address, server.port)
        subprocess.run([SSH_KEYGEN, "-R", pattern, "-f", str(ssh_client.known_hosts)], check=True, capture_output=True)
        ssh_client.trust(server)
        await wait_for(
            lambda: state_of(app).state == STATE_UP, "n1 up with the right key", timeout=WAIT_LIMIT_S, pilot=pilot
        )
        assert state_of(app).fingerprint is None
    assert ssh_client.known_hosts.read_text() == server.known_hosts_line()
    assert audit_records(audit) == []
