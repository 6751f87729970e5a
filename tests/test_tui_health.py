"""The Health pane in the running console (Pilot): results per node and GPU, r/R reruns, the header badge."""

from __future__ import annotations

import sys
from dataclasses import replace

from test_cli import closed_loopback_port
from tui_fakes import FROZEN_NOW, FakeFleet, cluster_states, single_node_states  # noqa: E402

from opsconsole.config import Config, ConsoleConfig, NodeConfig, SshConfig, parse_config  # noqa: E402
from opsconsole.model import STATE_DOWN  # noqa: E402
from opsconsole.nodes.fleet import Fleet  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402
from tests.waiting import pane_shown, wait_for  # noqa: E402

SIZE = (150, 40)
# Nodes run the health bundle with this interpreter (torch CPU here: the suite answers `error` at once).
NODES = "".join(
    '[[nodes]]\nname = "%s"\nhost = "127.0.0.1"\npython = "%s"\n' % (name, sys.executable)
    for name in ("gpu-a01", "gpu-a02", "gpu-a03")
)


def hot(states, gpu_index=1, temperature=91.0):
    """The first node with one GPU over the 85 C limit."""
    first = states[0]
    gpus = tuple(replace(g, temperature=temperature) if g.index == gpu_index else g for g in first.frame.gpus)
    return [replace(first, frame=replace(first.frame, gpus=gpus, seq=first.frame.seq + 1))] + list(states[1:])


def console(states, config_text="", clock=None):
    fleet = FakeFleet(states)
    clock = clock if clock is not None else [FROZEN_NOW]
    return OpsConsole(parse_config(config_text, "test.toml"), fleet, now=lambda: clock[0]), fleet


def rows_of(pane):
    table = pane.table
    return [" ".join(str(cell) for cell in table.get_row_at(i)) for i in range(table.row_count)]


async def test_failures_show_per_gpu_and_raise_the_header_badge():
    app, fleet = console(hot(single_node_states()))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "HEALTH 1 FAIL" in str(app.header.render())
        await pilot.press("8")
        # Made on its first show, then drawn: waited for, not one pause (so in each test below).
        await wait_for(lambda: pane_shown(app, "health"), "the Health pane", pilot=pilot)
        assert app.visible_pane_id == "health"
        rows = rows_of(app.panes["health"])
        assert any("fail" in r and "local GPU 1" in r and "gpu_temperature" in r and "91°C" in r for r in rows), rows
        assert any("pass" in r and "local GPU 0" in r and "gpu_temperature" in r for r in rows)
        status = str(app.panes["health"].status.render())
        assert "1 fail" in status
        # The alert engine heard of it too (Alerts pane), as a health.* rule.
        assert any(e.rule == "health.gpu_temperature" for e in app.services.alerts.history)
        # The GPU cools down: the badge goes, the row turns pass with a newer `since`.
        state = fleet.states()["local"]
        cooled = tuple(replace(g, temperature=50.0) for g in state.frame.gpus)
        fleet.publish(replace(state, frame=replace(state.frame, gpus=cooled, seq=state.frame.seq + 1)))
        await wait_for(lambda: "HEALTH" not in str(app.header.render()), "the badge gone", pilot=pilot)
        assert app.health.failing() == 0


async def test_detail_line_shows_evidence_and_remedy_of_the_selected_result():
    app, _ = console(hot(single_node_states()))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("8")
        await wait_for(lambda: pane_shown(app, "health"), "the Health pane", pilot=pilot)
        pane = app.panes["health"]
        index = next(i for i, e in enumerate(pane._shown) if e.result.status == "fail")
        pane.table.move_cursor(row=index)
        # The detail follows the table's RowHighlighted message: waited for.
        await wait_for(lambda: "temperature_c=91" in str(pane.detail.render()), "the detail", pilot=pilot)
        detail = str(pane.detail.render())
        assert "temperature_c=91" in detail and "remedy: check the node's cooling" in detail


async def test_r_reruns_the_selected_node_with_the_gpu_suite():
    config = '[[nodes]]\nname = "local"\nlocal = true\npython = "%s"\n' % sys.executable
    clock = [FROZEN_NOW]
    app, _ = console(single_node_states(), config, clock)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("8")
        await wait_for(lambda: pane_shown(app, "health"), "the Health pane", pilot=pilot)
        clock[0] += 5.0  # the rerun's results are newer than the rules' first evaluation
        before = app.panes["health"].table.row_count
        assert before and not any("gpu_sanity" in r for r in rows_of(app.panes["health"]))
        await pilot.press("r")
        assert await wait_for(
            lambda: (
                not app.health.running and any(e.result.check.startswith("gpu_sanity") for e in app.health.entries())
            ),
            "the condition",
            pilot=pilot,
        )
        await wait_for(
            lambda: any("gpu_sanity" in r for r in rows_of(app.panes["health"])), "the suite's rows drawn", pilot=pilot
        )
        rows = rows_of(app.panes["health"])
        assert any("gpu_sanity" in r and "skip" in r for r in rows), rows  # no GPU here: skipped, with the reason
        assert rows.index(next(r for r in rows if "gpu_sanity" in r)) == 0  # newest first
        assert len(rows) > before
        skipped = sum(1 for e in app.panes["health"]._shown if e.result.status == "skip")
        assert skipped and "%d skip" % skipped in str(app.panes["health"].status.render())  # counted as listed


async def test_R_reruns_every_node_and_a_node_that_is_away_only_gets_its_rules():
    app, _ = console(cluster_states(), NODES)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("8")
        await wait_for(lambda: pane_shown(app, "health"), "the Health pane", pilot=pilot)
        await pilot.press("R")
        # Finished, not merely not yet started (a pause could end before the key's binding ran).
        assert await wait_for(
            lambda: (
                not app.health.running and any(e.result.check.startswith("gpu_sanity") for e in app.health.entries())
            ),
            "the rerun done",
            pilot=pilot,
        )
        suite_nodes = {e.result.node for e in app.health.entries() if e.result.check.startswith("gpu_sanity")}
        assert suite_nodes == {"gpu-a01", "gpu-a02"}  # gpu-a03 is down
        down = [e.result for e in app.health.entries("gpu-a03") if e.result.check == "node_reachable"]
        assert down and down[0].status == "fail"


async def test_filter_and_the_key_registry_know_the_health_keys():
    app, _ = console(hot(single_node_states()))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("8")
        await wait_for(lambda: pane_shown(app, "health"), "the Health pane", pilot=pilot)
        app.panes["health"].apply_filter("temperature")
        await pilot.pause()
        rows = rows_of(app.panes["health"])
        assert rows and all("gpu_temperature" in r for r in rows)
        ids = {spec.id: spec for spec in app.key_specs}
        assert ids["health.rerun"].key == "r" and ids["health.rerun_all"].key == "R"
        assert ids["health.rerun"].scope == "health"
        assert ids["pane.health"].key == "8"


async def test_a_long_node_name_is_cut_with_an_ellipsis_and_keeps_its_gpu():
    long_name = "h200-training-rerun-a01"
    states = hot([replace(s, name=long_name, frame=replace(s.frame, node=long_name)) for s in single_node_states()])
    app, _ = console(states)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("8")
        await wait_for(lambda: pane_shown(app, "health"), "the Health pane", pilot=pilot)
        pane = app.panes["health"]
        assert any(e.result.node == long_name for e in pane._shown)
        where = {str(pane.table.get_row_at(i)[2]) for i in range(pane.table.row_count)}
        assert "h200-trai… GPU 1" in where and "h200-training-r…" in where, where
        assert all(len(w) <= 16 for w in where)


def refused_node_console() -> OpsConsole:
    """The console of one SSH node n1 on a loopback port nothing listens on: every connect is refused."""
    config = Config(
        console=ConsoleConfig(interval=0.3),
        nodes=(NodeConfig(name="n1", host="127.0.0.1", port=closed_loopback_port()),),
        ssh=SshConfig(connect_timeout=5.0, backoff_initial=0.05, backoff_max=0.5),
    )
    return OpsConsole(config, Fleet(config))


async def test_a_node_down_since_the_start_is_a_node_reachable_error_after_its_first_failed_connect():
    app = refused_node_console()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: app.fleet.states()["n1"].state == STATE_DOWN, "n1 down", pilot=pilot)
        await pilot.press("8")
        await wait_for(lambda: app.panes["health"].table.row_count > 0, "a health row for n1", pilot=pilot)
        (entry,) = app.health.entries("n1")
        assert (entry.result.check, entry.result.status) == ("node_reachable", "error")
        assert "connection refused" in entry.result.message
        status = str(app.panes["health"].status.render())
        assert "1 error" in status, status
        assert app.fleet.states()["n1"].frame is None  # never up


def screen_lines(app: OpsConsole):
    return ["".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips()]


async def test_the_message_of_a_down_node_reads_whole_at_100_columns():
    app = refused_node_console()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(lambda: app.fleet.states()["n1"].state == STATE_DOWN, "n1 down", pilot=pilot)
        await pilot.press("8")
        await wait_for(lambda: app.panes["health"].table.row_count > 0, "a health row for n1", pilot=pilot)
        (entry,) = app.health.entries("n1")
        message = entry.result.message
        assert "connection refused" in message
        await wait_for(
            lambda: any(message in line for line in screen_lines(app)), "the whole message on screen", pilot=pilot
        )
        header = next(line for line in screen_lines(app) if "Message" in line)
        assert "Since" in header and "Check" in header  # it fits with every column kept


async def test_a_message_too_long_for_80_columns_takes_since_room_and_is_whole_under_the_table():
    app, fleet = console(hot(single_node_states()))
    state = fleet.states()["local"]
    long_reason = "handshake timed out after 30 s: ssh gpu-a01 via bastion.example.org refused the ProxyJump"
    fleet.publish(replace(state, state=STATE_DOWN, reason=long_reason))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("8")
        pane = app.panes["health"]
        await wait_for(lambda: pane.table.row_count > 0, "health rows", pilot=pilot)
        index = next(i for i, e in enumerate(pane._shown) if e.result.check == "node_reachable")
        message = pane._shown[index].result.message
        assert long_reason in message
        pane.table.move_cursor(row=index)
        # The detail follows the table's RowHighlighted message, a message after the move: waited for.
        await wait_for(
            lambda: (
                any("node_reachable" in line for line in screen_lines(app))
                and message in " ".join(str(pane.detail.render()).split())
            ),
            "the row on screen and its detail",
            pilot=pilot,
        )
        lines = screen_lines(app)
        header = next(line for line in lines if "Message" in line)
        assert "Since" not in header and "Status" in header and "Check" in header, header
        row = next(line for line in lines if "node_reachable" in line)
        shown = row[header.index("Message") :].rstrip()
        assert shown.endswith("…") and message.startswith(shown[:-1]), row
        assert len(shown) >= 35, row  # the room Since left went to the message
        assert message in " ".join(str(pane.detail.render()).split()), str(pane.detail.render())


async def test_a_node_down_since_the_start_raises_the_header_badge_as_an_error():
    """The badge counted failed checks only: a node that never answered (node_reachable error) left the
    header without HEALTH while the pane said `1 error`."""
    app = refused_node_console()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: app.health.entries("n1"), "n1's node_reachable result", pilot=pilot)
        (entry,) = app.health.entries("n1")
        assert entry.result.status == "error" and app.health.failing() == 0
        await wait_for(lambda: "HEALTH 1 ERROR" in str(app.header.render()), "the header's badge", pilot=pilot)
        assert "FAIL" not in str(app.header.render())


def test_the_badge_names_failures_and_errors_apart():
    from opsconsole.tui import bars
    from opsconsole.tui.header import header_text

    fleet = FakeFleet(single_node_states())
    palette = bars.palette_from_variables({})
    states = fleet.states()

    def counts_line(**health) -> str:
        text = header_text(Config(), states, fleet.totals(FROZEN_NOW), None, FROZEN_NOW, palette, **health)
        return text.plain.split("\n")[1]

    assert "HEALTH" not in counts_line()
    assert counts_line(health_failures=2).endswith("HEALTH 2 FAIL")
    assert counts_line(health_errors=1).endswith("HEALTH 1 ERROR")
    assert counts_line(health_failures=1, health_errors=3).endswith("HEALTH 1 FAIL 3 ERROR")
