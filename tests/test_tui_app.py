"""The console app driven through Textual's Pilot, on a fake fleet of real captured readings."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_cli import clean_home, run_cli  # noqa: F401
from textual.command import CommandPalette
from textual.widgets import DataTable, Input, OptionList
from tui_fakes import (  # noqa: E402
    FROZEN_NOW,
    FakeFleet,
    cluster_states,
    idle_gpu,
    loaded_gpu,
    single_node_states,
    up_state,
)

from opsconsole.config import Config, ConfigError, ConsoleConfig  # noqa: E402
from opsconsole.tui import app as app_module  # noqa: E402
from opsconsole.tui import bars  # noqa: E402
from opsconsole.tui.app import KEY_SPECS, PANES, OpsConsole, TooSmall  # noqa: E402
from opsconsole.tui.help import HelpScreen  # noqa: E402
from opsconsole.tui.host import HostPane  # noqa: E402
from opsconsole.tui.keys import APP_KEYS, display_key, keymap_from_config  # noqa: E402
from opsconsole.tui.themes import THEMES_DIR, choose_theme, load_theme_file, load_themes  # noqa: E402
from tests.waiting import pane_shown, wait_for  # noqa: E402

SIZE = (140, 40)
OKABE_ITO = {"#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"}


def make_app(states=None, **console) -> OpsConsole:
    config = Config(console=ConsoleConfig(**console)) if console else Config()
    fleet = FakeFleet(states if states is not None else single_node_states())
    return OpsConsole(config, fleet, now=lambda: FROZEN_NOW)


def gpu_table(app: OpsConsole) -> DataTable:
    return app.panes["gpus"].query_one(DataTable)


async def show_gpus(pilot) -> None:
    """Open the GPUs pane (a one-node console opens on its overview), drawn: it is made on its first
    show, and a fixed pause could end before it was (under load)."""
    await pilot.press("1")
    await wait_for(lambda: pane_shown(pilot.app, "gpus"), "the GPUs pane shown", pilot=pilot)


def row_text(table: DataTable, key: str) -> str:
    return " | ".join(str(cell) for cell in table.get_row(key))


# --- launch and data -------------------------------------------------------------------


async def test_launch_shows_one_row_per_gpu_with_the_captured_values():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await show_gpus(pilot)
        table = gpu_table(app)
        idle, loaded = idle_gpu(0), loaded_gpu(1)
        assert [key.value for key in table.rows] == ["local/0", "local/1"]
        first = row_text(table, "local/0")
        assert idle.name in first
        assert "%d/%d" % (idle.temperature, idle.temperature_slowdown) in first
        assert "%d/%d" % (idle.power_draw_w, idle.power_limit_w) in first
        second = row_text(table, "local/1")
        assert "%d%%" % loaded.utilization_gpu in second
        assert "%.1f/%.1f" % (loaded.memory_used / 2**30, loaded.memory_total / 2**30) in second
        assert "SwPowerCap" in second  # decoded from the capture's clocks_event_reasons 0x4


async def test_header_names_the_node_mode_and_totals():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        text = app.header._shown.plain
        assert "local (h200-box)" in text
        assert "[RW]" in text
        assert "GPUs 2" in text
        mean = (idle_gpu().utilization_gpu + loaded_gpu().utilization_gpu) / 2
        assert "mean util %.0f%%" % mean in text
        assert "newest frame 0.4s ago" in text
        assert "alerts 0" in text


async def test_read_only_header_and_several_nodes():
    app = make_app(cluster_states(), read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        text = app.header._shown.plain
        assert "[R]" in text and "[RW]" not in text
        assert "3 nodes" in text
        assert "up 2  down 1" in text


async def test_down_node_rows_are_dimmed_with_their_age():
    app = make_app(cluster_states())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: pane_shown(app, "gpus"), "the GPUs pane shown", pilot=pilot)
        table = gpu_table(app)
        status = table.get_cell("gpu-a03/0", "status")
        assert status.plain == "down 42s"
        assert str(status.style) == "dim"
        assert table.get_cell("gpu-a01/0", "status").plain == "ok"
        assert len(table.rows) == 8 + 1 + 2


# --- panes and keys ----------------------------------------------------------------------


async def test_number_keys_and_tab_switch_panes():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.visible_pane_id == "overview"  # one node: its overview first
        for cls in PANES:
            await pilot.press(cls.key)
            # A pane shown the first time is imported and mounted then, in the app's loop: wait for it.
            await wait_for(lambda: app.visible_pane_id == cls.pane_id, "pane " + cls.pane_id, pilot=pilot)
            await wait_for(
                lambda: app.panes[cls.pane_id].region.height > 0, "pane %s on screen" % cls.pane_id, pilot=pilot
            )
        await pilot.press("tab")
        await wait_for(lambda: app.visible_pane_id == PANES[0].pane_id, "tab to the first pane", pilot=pilot)
        assert app.visible_pane_id == PANES[0].pane_id  # wraps around
        await pilot.press("shift+tab")
        await wait_for(lambda: app.visible_pane_id == PANES[-1].pane_id, "shift+tab to the last pane", pilot=pilot)
        assert app.visible_pane_id == PANES[-1].pane_id


async def test_clicking_a_tab_switches_pane():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.click("#--content-tab-tab-host")
        await wait_for(lambda: app.visible_pane_id == "host", "the Host pane", pilot=pilot)
        assert app.visible_pane_id == "host"


async def test_only_the_visible_pane_is_fed(monkeypatch):
    calls = []
    original = HostPane.show
    monkeypatch.setattr(HostPane, "show", lambda self, *a: (calls.append(a), original(self, *a)))
    fleet = FakeFleet(single_node_states())
    app = OpsConsole(Config(), fleet, now=lambda: FROZEN_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        fleet.publish(up_state("local", [loaded_gpu(0), loaded_gpu(1)], hostname="h200-box"))
        await pilot.pause(0.3)
        assert calls == []
        await pilot.press("3")
        # Made on its first show, then fed: waited for, not one pause.
        await wait_for(
            lambda: calls and "host local (h200-box)" in str(app.panes["host"].query_one("#host-summary").render()),
            "the Host pane fed",
            pilot=pilot,
        )
        assert len(calls) >= 1
        host_text = str(app.panes["host"].query_one("#host-summary").render())
        assert "host local (h200-box)" in host_text


async def test_help_lists_every_binding_and_escape_closes_it():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await wait_for(
            lambda: isinstance(app.screen, HelpScreen) and app.screen.query(DataTable), "the help", pilot=pilot
        )
        assert isinstance(app.screen, HelpScreen)
        table = app.screen.query_one(DataTable)
        listed = {key.value for key in table.rows}
        assert listed == {spec.id for spec in KEY_SPECS}
        assert table.get_cell("app.quit", "key").plain == "q"
        await pilot.press("escape")
        await wait_for(lambda: not isinstance(app.screen, HelpScreen), "the help closed", pilot=pilot)
        assert not isinstance(app.screen, HelpScreen)


async def test_filter_on_processes_pane_and_escape_clears_it():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("2")
        await wait_for(lambda: pane_shown(app, "processes"), "the Processes pane shown", pilot=pilot)
        host_table = app.panes["processes"].query_one("#host-processes", DataTable)
        before = len(host_table.rows)
        assert before >= 2  # both captured host processes
        await pilot.press("slash")
        # Mounted on the first `/`, then focused: waited for, not one pause (app.focused, not the
        # input's has_focus, which its Focus event sets a message later).
        filter_input = app.filter_input
        await wait_for(lambda: filter_input.has_class("-open"), "the filter line open", pilot=pilot)
        assert app.focused is filter_input
        await pilot.press(*"process_api")
        await wait_for(lambda: app._pane_filters.get("processes") == "process_api", "the filter applied", pilot=pilot)
        assert len(host_table.rows) == 1
        assert "process_api" in " ".join(str(c) for c in host_table.get_row_at(0))
        await pilot.press("escape")
        await wait_for(lambda: not filter_input.has_class("-open"), "the filter line closed", pilot=pilot)
        assert len(host_table.rows) == before


async def test_filter_on_gpus_pane_keeps_matching_rows():
    app = make_app(cluster_states())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("slash", *"a02", "enter")
        # The GPUs pane is made on the first show and the filter line on the first `/`; enter keeps
        # the filter and gives the table the focus back: waited for, not one pause.
        filter_input = app.filter_input
        await wait_for(
            lambda: (
                app._pane_filters.get("gpus") == "a02"
                and not filter_input.has_class("-open")
                and pane_shown(app, "gpus")
            ),
            "the filter kept",
            pilot=pilot,
        )
        table = gpu_table(app)
        assert [key.value for key in table.rows] == ["gpu-a02/0"]
        assert not app.query_one("#filter", Input).has_class("-open")  # enter keeps the filter


async def test_escape_clears_a_kept_filter_when_no_drill_down_is_open():
    app = make_app(cluster_states())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: pane_shown(app, "gpus"), "the GPUs pane shown", pilot=pilot)
        table = gpu_table(app)
        every = sorted(key.value for key in table.rows)
        await pilot.press("slash", *"a02", "enter")
        filter_input = app.query_one("#filter", Input)
        await wait_for(lambda: not filter_input.has_class("-open") and table.has_focus, "the filter kept", pilot=pilot)
        assert [key.value for key in table.rows] == ["gpu-a02/0"]
        await pilot.press("escape")
        await wait_for(lambda: not app._pane_filters.get("gpus"), "the filter cleared", pilot=pilot)
        assert sorted(key.value for key in table.rows) == every and len(every) > 1
        await pilot.press("slash")
        await wait_for(lambda: filter_input.has_class("-open"), "the filter line open", pilot=pilot)
        assert app.query_one("#filter", Input).value == ""  # cleared, not kept for the next /


async def test_config_remaps_a_key_and_the_old_one_stops_working():
    app = make_app(keys=(("pane.host", "H"),))  # h is the Nodes pane's health rerun: refused (test_tui_keymap)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("3")
        await pilot.pause()
        assert app.visible_pane_id == "overview"
        await pilot.press("H")
        await wait_for(lambda: app.visible_pane_id == "host", "H shows Host", pilot=pilot)
        assert app.visible_pane_id == "host"
        assert dict((r[0], r[1]) for r in app.help_rows())["pane.host"] == "H"


@pytest.mark.parametrize(
    "remap, other",
    [
        ('"pane.gpus" = "q"', "takes the key q of app.quit (Quit)"),  # q would open GPUs and no longer quit
        ('"processes.tree" = "x"', "takes the key x of process.signal_term (Processes: SIGTERM)"),
    ],
)
def test_a_remap_onto_a_key_in_use_is_refused_naming_both_bindings(tmp_path, clean_home, remap, other):
    _, env = clean_home
    path = tmp_path / "keys.toml"
    path.write_text('[[nodes]]\nname = "box"\nlocal = true\n[console.keys]\n%s\n' % remap)
    done = run_cli(["--config", str(path)], env)
    assert done.returncode == 2, done.stdout[-500:] + done.stderr
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    binding = remap.split('"')[1]
    assert str(path) in done.stderr and '"%s"' % binding in done.stderr and other in done.stderr, done.stderr


def test_the_app_itself_refuses_a_colliding_remap_too():
    # replay and demo build the app without the console command's early check
    with pytest.raises(ConfigError, match='"pane.gpus" = "q" takes the key q of app.quit'):
        make_app(keys=(("pane.gpus", "q"),))


async def test_a_swap_that_remaps_both_keys_still_works():
    app = make_app(keys=(("pane.gpus", "2"), ("pane.processes", "1")))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("1")
        await wait_for(lambda: app.visible_pane_id == "processes", "1 shows Processes", pilot=pilot)
        await pilot.press("2")
        await wait_for(lambda: app.visible_pane_id == "gpus", "2 shows GPUs", pilot=pilot)
        rows = dict((r[0], r[1]) for r in app.help_rows())
        assert (rows["pane.gpus"], rows["pane.processes"]) == ("2", "1")


def test_unknown_binding_id_in_config_is_a_config_error():
    # It was a notification and the console ran without the remap (tests/test_tui_keymap.py: exit 2).
    with pytest.raises(ConfigError, match='no binding "pane.nope"; the closest: pane.nodes'):
        make_app(keys=(("pane.nope", "x"),))


async def test_drill_down_from_nodes_and_escape_back():
    app = make_app(cluster_states())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("4")
        # The Nodes pane is made on first show, drawn, then focused: waited for, not one pause.
        await wait_for(lambda: pane_shown(app, "nodes"), "the Nodes pane shown", pilot=pilot)
        nodes_table = app.panes["nodes"].query_one("#nodes-table", DataTable)
        assert app.focused is nodes_table
        # And its rows: the pane can hold the focus before its first rows are drawn, and a `down` then
        # moves nothing (the fresh-clone CI run of ce83cb9 drilled into gpu-a01).
        await wait_for(lambda: nodes_table.row_count == len(cluster_states()), "the Nodes rows", pilot=pilot)
        await pilot.press("down", "enter")
        await wait_for(lambda: app.node is not None, "the drill", pilot=pilot)
        assert app.node == "gpu-a02"
        assert app.visible_pane_id == "overview"
        await show_gpus(pilot)
        assert [key.value for key in gpu_table(app).rows] == ["gpu-a02/0"]
        assert "> gpu-a02" in app.header._shown.plain
        await pilot.press("escape")
        await wait_for(lambda: app.node is None and app.visible_pane_id == "nodes", "back to Nodes", pilot=pilot)
        assert app.node is None
        assert app.visible_pane_id == "nodes"


def palette_top_hit(app: OpsConsole) -> str:
    """The command palette's highlighted hit (its first line), "" while there is none."""
    if not CommandPalette.is_open(app):
        return ""
    options = app.screen.query(OptionList)
    if not options or options.first().highlighted is None:
        return ""
    return str(options.first().get_option_at_index(options.first().highlighted).prompt).split("\n")[0]


async def test_command_palette_runs_a_binding_and_lists_themes():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+p")
        await wait_for(lambda: CommandPalette.is_open(app), "the palette", pilot=pilot)
        assert CommandPalette.is_open(app)
        await pilot.press(*"Show Host")
        # The palette searches as it is typed: enter once the Host pane's command is the highlighted hit.
        await wait_for(lambda: "Host" in palette_top_hit(app), "the Host command on top", pilot=pilot)
        await pilot.press("enter")
        await wait_for(lambda: app.visible_pane_id == "host", "the palette to show the Host pane", pilot=pilot)
        await pilot.press("ctrl+p")
        # Typed before the palette is open, the words would be the Host pane's keys.
        await wait_for(
            lambda: CommandPalette.is_open(app) and isinstance(app.focused, Input), "the palette again", pilot=pilot
        )
        await pilot.press(*"Theme: opsconsole-high")
        await wait_for(lambda: "opsconsole-high-contrast" in palette_top_hit(app), "the theme on top", pilot=pilot)
        await pilot.press("enter")
        await wait_for(lambda: app.theme == "opsconsole-high-contrast", "the palette to switch the theme", pilot=pilot)


# --- themes ------------------------------------------------------------------------------


async def test_theme_from_config_is_applied():
    app = make_app(theme="opsconsole-light")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.theme == "opsconsole-light"
        await show_gpus(pilot)
        light = load_theme_file(THEMES_DIR / "opsconsole-light.toml")
        assert app.theme_variables["background"].upper() == light.background.upper()
        # The cells take their colours from the theme in use.
        status = gpu_table(app).get_cell("local/0", "status")
        assert str(status.style).upper() == light.success.upper()


async def test_unknown_theme_falls_back_and_names_the_choices():
    app = make_app(theme="solarized-nope")
    async with app.run_test(size=SIZE) as pilot:
        # A toast is a Notify message (App.notify posts it): waited for, not one pause.
        await wait_for(lambda: any("solarized-nope" in n.message for n in app._notifications), "the toast", pilot=pilot)
        assert app.theme == "opsconsole-dark"
        messages = " ".join(n.message for n in app._notifications)
        assert "solarized-nope" in messages
        for name in ("opsconsole-dark", "opsconsole-light", "opsconsole-high-contrast"):
            assert name in messages


async def test_theme_switch_recolours_cells_in_place():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await show_gpus(pilot)
        table = gpu_table(app)
        before = str(table.get_cell("local/0", "status").style)
        app.theme = "opsconsole-light"
        await wait_for(lambda: str(table.get_cell("local/0", "status").style) != before, "restyled cells", pilot=pilot)
        after = str(table.get_cell("local/0", "status").style)
        assert after.upper() == app.theme_variables["success"].upper()


def test_theme_files_load_and_use_okabe_ito_status_colours():
    themes, problems = load_themes()
    assert problems == []
    names = {theme.name for theme in themes}
    assert {"opsconsole-dark", "opsconsole-light", "opsconsole-high-contrast"} <= names
    contrast = next(t for t in themes if t.name == "opsconsole-high-contrast")
    assert {contrast.success.upper(), contrast.warning.upper()} <= OKABE_ITO
    assert contrast.background == "#000000"


def test_broken_theme_file_is_a_problem_not_a_crash(tmp_path):
    (tmp_path / "bad.toml").write_text('name = "bad"\nprimary = "not-a-colour"\n')
    (tmp_path / "good.toml").write_text('name = "good"\nprimary = "#0072B2"\n')
    themes, problems = load_themes(tmp_path)
    assert [t.name for t in themes] == ["good"]
    assert len(problems) == 1 and "bad.toml" in problems[0]


def test_choose_theme():
    assert choose_theme("b", ["a", "b"]) == ("b", None)
    name, message = choose_theme("zz", ["opsconsole-dark", "textual-dark"], "opsconsole-dark")
    assert name == "opsconsole-dark"
    assert "zz" in message and "opsconsole-dark" in message and "textual-dark" in message


# --- layout and updates ------------------------------------------------------------------


async def test_too_small_terminal_gets_a_message_then_the_layout_comes_back():
    app = make_app()
    async with app.run_test(size=(70, 15)) as pilot:
        await pilot.pause()
        message = app.query_one(TooSmall)
        assert message.display and message.region.height > 0
        assert str(message.render()) == "terminal too small: need 80x20, have 70x15"
        assert app.query_one("#main").region.height == 0
        await pilot.resize_terminal(120, 30)
        await wait_for(lambda: app.query_one(TooSmall).region.height == 0, "the layout back", pilot=pilot)
        assert app.panes["overview"].region.height > 0


async def test_update_changes_cells_in_place():
    fleet = FakeFleet(single_node_states())
    app = OpsConsole(Config(), fleet, now=lambda: FROZEN_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await show_gpus(pilot)
        table = gpu_table(app)
        pane = app.panes["gpus"]
        cleared = []
        table.clear = lambda *a, **k: cleared.append(a)  # a spy: an update must not rebuild
        keys_before = [key.value for key in table.rows]
        updated_before = pane.cells_updated
        # GPU 0 goes from the idle capture to the under-load capture.
        fleet.publish(up_state("local", [loaded_gpu(0), loaded_gpu(1)], hostname="h200-box"))
        loaded = loaded_gpu(0)
        await wait_for(
            lambda: table.get_cell("local/0", "temp").plain.startswith("%d/" % loaded.temperature),
            "the loaded GPU's cells",
            pilot=pilot,
        )
        assert [key.value for key in table.rows] == keys_before
        assert cleared == []
        assert table.get_cell("local/0", "temp").plain.startswith("%d/" % loaded.temperature)
        assert "%d%%" % loaded.utilization_gpu in table.get_cell("local/0", "util").plain
        # Only the cells that differ were sent: the node/index/name cells stayed.
        assert 0 < pane.cells_updated - updated_before < len(table.columns)
        assert table.get_cell("local/0", "name").plain == loaded.name


async def test_fleet_changes_are_coalesced_into_one_redraw(monkeypatch):
    # The clock's tick redraws on its own once a second; on a loaded machine it came during the test
    # and counted as a second redraw. It is out of this test (the next one covers a tick among changes).
    monkeypatch.setattr(app_module, "TICK_S", 3600.0)
    fleet = FakeFleet(single_node_states())
    app = OpsConsole(Config(), fleet, now=lambda: FROZEN_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        redraws = []
        original = app.redraw
        monkeypatch.setattr(app, "redraw", lambda: (redraws.append(1), original()))
        for _ in range(20):
            app.on_fleet_change(fleet.states()["local"])
        assert redraws == []  # on_change only schedules
        await wait_for(lambda: redraws, "the redraw", pilot=pilot)
        await pilot.pause()
        assert len(redraws) == 1


async def test_a_redraw_among_fleet_changes_takes_their_pending_redraw_with_it(monkeypatch):
    """A redraw from elsewhere (the clock's tick, a pane shown) draws the changes waiting for their
    coalesced redraw: that one is dropped. Under load the tick fell between 20 changes and their
    timer, and the same changes were drawn twice."""
    monkeypatch.setattr(app_module, "TICK_S", 3600.0)  # the test calls the redraw the tick would make
    fleet = FakeFleet(single_node_states())
    app = OpsConsole(Config(), fleet, now=lambda: FROZEN_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        redraws = []
        original = app.redraw
        monkeypatch.setattr(app, "redraw", lambda: (redraws.append(1), original()))
        for _ in range(20):
            app.on_fleet_change(fleet.states()["local"])
        app.redraw()  # as the tick does: it draws these changes
        # A timer started after the changes' one, with a longer delay, fires after it would have.
        later = []
        app.set_timer(2 * app_module.REDRAW_DELAY_S, lambda: later.append(1))
        await wait_for(lambda: later, "a timer set after the changes' one", pilot=pilot)
        await pilot.pause()
        assert len(redraws) == 1


async def test_q_quits_and_stops_the_fleet():
    fleet = FakeFleet(single_node_states())
    app = OpsConsole(Config(), fleet, now=lambda: FROZEN_NOW)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert fleet.started
        await pilot.press("q")
        await wait_for(lambda: app.return_code is not None, "the exit", pilot=pilot)
    assert app.return_code == 0
    assert fleet.stopped


# --- pure parts --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "percent, width, expected",
    [(0, 4, "····"), (100, 4, "████"), (50, 4, "██··"), (None, 3, "···"), (150, 2, "██"), (12.5, 2, "▎·")],
)
def test_bar(percent, width, expected):
    assert bars.bar(percent, width) == expected


@pytest.mark.parametrize("value, expected", [(None, ""), (10, "ok"), (80, "warn"), (89.9, "warn"), (90, "crit")])
def test_level_for(value, expected):
    assert bars.level_for(value, 80, 90) == expected


def test_gpu_temperature_threshold_follows_config_and_slowdown():
    from opsconsole.config import HealthConfig
    from opsconsole.tui.gpus import temperature_level

    gpu = replace(idle_gpu(), temperature=80.0)  # slowdown is 89 on the H200
    assert temperature_level(gpu, HealthConfig(gpu_temperature_c=85.0)) == "ok"  # 9 °C from slowdown
    assert temperature_level(gpu, HealthConfig(gpu_temperature_c=85.0, temperature_margin_c=10.0)) == "warn"
    assert temperature_level(replace(gpu, temperature=84.0), HealthConfig(gpu_temperature_c=95.0)) == "warn"
    assert temperature_level(gpu, HealthConfig(gpu_temperature_c=80.0)) == "crit"
    assert temperature_level(replace(gpu, temperature=89.0), HealthConfig(gpu_temperature_c=95.0)) == "crit"


def test_keymap_from_config_maps_known_ids_and_refuses_unknown_ones():
    assert keymap_from_config((("app.quit", "x"),), APP_KEYS) == {"app.quit": "x"}
    with pytest.raises(ConfigError, match='no binding "no.such"'):
        keymap_from_config((("app.quit", "x"), ("no.such", "y")), APP_KEYS)


def test_display_key():
    assert display_key("question_mark") == "?"
    assert display_key("slash,f") == "/ / f"


async def test_palette_lists_quit_once():
    """ctrl+p: one "Quit" (the console's app.quit with its key); Textual's own system Quit doubled it."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+p")

        def drawn_lines():
            return ["".join(s.text for s in strip).strip() for strip in app.screen._compositor.render_strips()]

        lines = await wait_for(
            lambda: (lambda drawn: drawn if any("app.quit" in line for line in drawn) else None)(drawn_lines()),
            "the palette's commands",
            pilot=pilot,
        )
        assert [line for line in lines if line == "Quit"] == ["Quit"], lines
        titles = [command.title for command in app.get_system_commands(app.screen)]
        assert "Quit" not in titles and "Theme" in titles  # Textual's other commands stay
