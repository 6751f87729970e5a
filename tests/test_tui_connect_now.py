"""`c` in the Nodes pane: one login now, for a node waiting on the user (real sshd, real Fleet, Pilot).

A node in `auth` never retries by itself with the same keys (a wrong key in a loop can lock the
account); once the user fixed it on the node (a key authorised there, which this machine cannot
see), `c` is how they say so.
"""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from opsconsole.config import Config, ConsoleConfig
from opsconsole.model import STATE_AUTH, STATE_UP
from opsconsole.nodes.fleet import Fleet
from opsconsole.tui.app import OpsConsole
from tests.sshd import keygen, public_key, ssh_client, sshd_factory  # noqa: F401
from tests.test_trust_hostkey import SIZE, WAIT_LIMIT_S, console_for, messages, state_of
from tests.waiting import pane_shown, wait_for


@pytest.mark.sshd
async def test_c_connects_an_auth_node_once_its_key_is_authorised_on_the_node(sshd_factory, ssh_client, tmp_path):
    other = keygen(ssh_client.home / "someone_else", "other")
    server = sshd_factory.start(authorized_keys=[public_key(other)])
    app = console_for(server, tmp_path / "audit.jsonl")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: state_of(app).state == STATE_AUTH, "n1 in auth", timeout=WAIT_LIMIT_S, pilot=pilot)
        link = app.fleet.link("n1")
        await wait_for(lambda: link.waiting_for_user, "n1 to wait for the user", timeout=WAIT_LIMIT_S, pilot=pilot)
        assert link.connect_attempts == 1
        await pilot.press("4")
        # The Nodes pane is made on its first show, drawn, then focused: waited for, not one pause.
        await wait_for(
            lambda: (
                "nodes" not in app._pane_mounts
                and app.panes.get("nodes") is not None
                and app.panes["nodes"].query_one("#nodes-table", DataTable).has_focus
            ),
            "the Nodes pane focused",
            pilot=pilot,
        )
        assert app.panes["nodes"].highlighted_node() == "n1"
        (server.dir / "authorized_keys").write_text(ssh_client.public_key() + "\n")  # fixed on the node
        await pilot.press("c")
        await wait_for(lambda: state_of(app).state == STATE_UP, "n1 up", timeout=WAIT_LIMIT_S, pilot=pilot)
        assert "n1: connecting now" in messages(app)
        assert link.connect_attempts == 2
        await pilot.press("c")  # up: nothing to do
        await wait_for(lambda: "n1 is up: already connected" in messages(app), "the toast", pilot=pilot)
        assert "n1 is up: already connected" in messages(app)
        assert link.connect_attempts == 2


async def test_c_on_a_local_node_says_it_is_connected(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = Config(console=ConsoleConfig(interval=0.5))  # the built-in config: one local node
    app = OpsConsole(config, Fleet(config))
    async with app.run_test(size=SIZE) as pilot:
        name = app.fleet.names[0]
        await wait_for(
            lambda: state_of(app, name).state == STATE_UP, "the local node up", timeout=WAIT_LIMIT_S, pilot=pilot
        )
        await pilot.press("4")
        await wait_for(lambda: pane_shown(app, "nodes"), "the Nodes pane", pilot=pilot)  # made on its first show
        await pilot.press("c")
        await wait_for(lambda: "%s is up: already connected" % name in messages(app), "the toast", pilot=pilot)
        assert "%s is up: already connected" % name in messages(app)
