"""The console's layout at 80x24, 160 and 300 columns: every tab in sight, the Nodes table fitted to the
width, the footer whole at 160, the host's command column using the space, node names whole.

Assertions read the screen as the terminal would get it; the snapshots keep the whole picture.
"""

from __future__ import annotations

from dataclasses import replace
from typing import List

import pytest
from tui_fakes import FROZEN_NOW, FakeFleet, cluster_states, single_node_states

from opsconsole.config import Config
from opsconsole.tui.app import PANES, OpsConsole
from opsconsole.tui.nodes import DROP_ORDER, NODE_COLUMNS, node_columns
from opsconsole.tui.tab_labels import fit_tab_labels
from tests.waiting import pane_shown, wait_for

LONG_NAME = "gpu-node-0017.research.example.org"


def screen_lines(app: OpsConsole) -> List[str]:
    return ["".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips()]


def long_named_cluster():
    states = cluster_states()
    first = states[0]
    frame = replace(first.frame, node=LONG_NAME)
    return [replace(first, name=LONG_NAME, frame=frame)] + states[1:]


def console(states) -> OpsConsole:
    return OpsConsole(Config(), FakeFleet(states), now=lambda: FROZEN_NOW)


@pytest.mark.parametrize("width", [80, 100, 160, 300])
async def test_every_pane_has_its_tab_in_sight(width):
    app = console(cluster_states())
    async with app.run_test(size=(width, 24)) as pilot:
        await pilot.press("4")
        await wait_for(lambda: pane_shown(app, "nodes"), "the Nodes pane", pilot=pilot)  # made on its first show
        tab_line = screen_lines(app)[2]
        labels, _ = fit_tab_labels(PANES, width)
        for entry in PANES:
            assert labels[entry.pane_id] in tab_line, (entry.pane_id, tab_line)
        assert tab_line.index(labels[PANES[0].pane_id]) <= 2  # the first tab is not scrolled away
        if width >= 160:
            assert "5 Cluster GPUs" in tab_line and "7 Checkpoints" in tab_line


@pytest.mark.parametrize("width", [80, 120, 160, 300])
async def test_nodes_table_fits_the_width_and_keeps_what_matters(width):
    app = console(long_named_cluster())
    async with app.run_test(size=(width, 24)) as pilot:
        await pilot.press("4")
        lines = await wait_for(
            lambda: (lambda drawn: drawn if any(line.lstrip().startswith("Node ") for line in drawn) else None)(
                screen_lines(app)
            ),
            "the Nodes table",
            pilot=pilot,
        )
        header = next(line for line in lines if line.lstrip().startswith("Node "))
        for label in ("Node", "State", "GPUs", "Util", "Memory"):
            assert " %s" % label in header, header
        assert len(header.rstrip()) <= width
        # Nothing scrolls off the right edge: the table's virtual width is the screen's.
        table = app.panes["nodes"].tables[0].table
        assert table.virtual_size.width <= width
        # Node names whole, not cut to a column's fixed width.
        assert any(LONG_NAME in line for line in lines)
        reason = "connection refused (127.0.0.1:2222)"
        if width >= 120:
            assert " Reason" in header
        if width >= 160:
            for label in ("Errors", "Age", "Hottest"):
                assert label in header
        if width >= 300:
            assert reason in "\n".join(lines) and "Trend" in header and "RTT" in header


def test_node_columns_drop_in_order_and_give_the_reason_the_rest():
    assert [c.key for c in node_columns(78, 34, 4)] == ["name", "state", "gpus", "util_mean", "memory"]
    full = node_columns(400, 8, 4)
    assert [c.key for c in full] == [c.key for c in NODE_COLUMNS]
    fixed = sum(max(c.width, len(c.label) + 1) + 2 for c in full if c.key != "reason")
    assert next(c.width for c in full if c.key == "reason") == 400 - fixed - 2  # all the room left, no cap
    narrow = node_columns(78, 8, 4)
    kept = [c.key for c in narrow]
    assert kept[:6] == ["name", "state", "reason", "gpus", "util_mean", "memory"]
    dropped = [key for key in DROP_ORDER if key not in kept]
    assert dropped == list(DROP_ORDER[: len(dropped)])  # in order, the first first
    assert sum(max(c.width, len(c.label) + 1) + 2 for c in narrow) <= 78


FIX = 'set python = "/opt/conda/envs/train/bin/python3" in its [[nodes]] entry'
LONG_REASON = "probe did not start: python3 on the node is 3.6.8, the probe needs 3.8 or newer; " + FIX


def cluster_with_a_long_reason():
    states = cluster_states()
    down = next(i for i, state in enumerate(states) if not state.is_live)
    states[down] = replace(states[down], reason=LONG_REASON)
    return states


@pytest.mark.parametrize("width", [80, 160, 300])
async def test_a_long_reason_takes_the_width_and_says_enter_shows_it(width):
    """Reason gets what the other columns leave (no 80-character cap); cut short, it ends in `… enter`."""
    app = console(cluster_with_a_long_reason())
    async with app.run_test(size=(width, 24)) as pilot:
        await pilot.press("4")
        lines = await wait_for(
            lambda: (lambda drawn: drawn if any("probe did not" in line for line in drawn) else None)(
                screen_lines(app)
            ),
            "the long reason drawn",
            pilot=pilot,
        )
        row = next(line for line in lines if "probe did not" in line)
        assert len(row.rstrip()) <= width
        shown = row[row.index("probe did not") :].split("  ")[0].strip()
        if width >= 300:  # room for all of it: whole, the fix included
            assert shown == LONG_REASON
        elif width >= 160:
            assert len(shown) > 20 and shown.endswith("… enter") and LONG_REASON.startswith(shown[: -len("… enter")])
        else:
            assert shown.endswith("…")


async def test_footer_is_whole_at_160_columns():
    app = console(cluster_states())
    async with app.run_test(size=(160, 30)) as pilot:
        words = ("q Quit", "? Help", "/ Filter", "^r Record", "^e Report", "^p Command palette")
        for key in ("4", "6", "1"):
            await pilot.press(key)
            # Waited for, not slept on: under load the footer of a pane shown the first time is
            # drawn after its mount (it was blank after a 0.3 s pause once in a loaded run).
            footer = await wait_for(
                lambda: next((line for line in [screen_lines(app)[-1]] if all(w in line for w in words)), None),
                "the whole footer after %s" % key,
                pilot=pilot,
            )
            assert all(w in footer for w in words), (key, footer)


async def test_host_command_column_uses_a_wide_terminal():
    app = console(single_node_states())
    async with app.run_test(size=(300, 30)) as pilot:
        await pilot.press("3")
        commands = [p.command for p in single_node_states()[0].frame.top_processes]
        longest = max(commands, key=len)
        assert len(longest) > 100
        # Whole, where it stopped at 60 characters.
        await wait_for(lambda: longest in "\n".join(screen_lines(app)), "the longest command whole", pilot=pilot)


async def test_gpu_rows_show_long_node_names_whole():
    app = console(long_named_cluster())
    async with app.run_test(size=(160, 30)) as pilot:
        await pilot.press("1")
        await wait_for(lambda: any(LONG_NAME in line for line in screen_lines(app)), "the long name", pilot=pilot)
        assert (
            sum(LONG_NAME in line for line in screen_lines(app)) == 1
        )  # whole, on its first GPU row (it was cut at 9)


@pytest.mark.parametrize(
    "size, keys",
    [
        ((80, 24), ["4"]),
        ((160, 40), ["4"]),
        ((300, 40), ["4"]),
        ((80, 24), ["3"]),
        ((300, 40), ["3"]),
    ],
)
def test_layout_snapshots(snap_compare, size, keys):
    assert snap_compare(
        console(long_named_cluster() if keys == ["4"] else single_node_states()), terminal_size=size, press=keys
    )


async def test_the_header_never_wraps_onto_the_tab_bar_at_80_columns():
    app = console(single_node_states())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        await wait_for(lambda: pane_shown(app, "host"), "the Host pane", pilot=pilot)  # made on its first show
        lines = screen_lines(app)
        assert lines[0].startswith(" opsconsole ") and lines[1].startswith(" nodes 1")
        assert lines[2].startswith(" o Over 1 GPUs")  # the tab bar, not the header's last word


@pytest.mark.parametrize("pane_key", ["2", "6"])
async def test_footer_at_80_columns_ends_with_the_palette_key(pane_key):
    """A busy pane's keys overflow under the docked palette key; none shows past it in the last column."""
    app = console(cluster_states())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press(pane_key)
        footer = await wait_for(
            lambda: (lambda line: line if "Command palette" in line else None)(screen_lines(app)[-1]),
            "the footer with the palette key",
            pilot=pilot,
        )
        assert footer.rstrip().endswith("^p Command palette"), footer


async def test_host_process_rss_is_whole_at_80_columns():
    """A resident size reads whole in the Host pane ("270 MiB", "1023 KiB"), not cut to "270 M…"."""
    state = single_node_states()[0]
    first, second = state.frame.top_processes[:2]
    sizes = {first.pid: 270 * 2**20, second.pid: 1023 * 2**10}
    processes = tuple(replace(p, rss_bytes=sizes.get(p.pid, p.rss_bytes)) for p in state.frame.top_processes)
    app = console([replace(state, frame=replace(state.frame, top_processes=processes))])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("3")
        for shown in ("270 MiB", "1023 KiB"):
            await wait_for(lambda: shown in "\n".join(screen_lines(app)), "rss %s whole" % shown, pilot=pilot)


@pytest.mark.parametrize("width", [80, 160])
async def test_help_box_fits_the_terminal_and_cuts_no_binding(width):
    """`?` at 80 columns: the box's right edge on screen (it was 84 wide), every binding id whole, long
    descriptions wrapped within it; at 160 each description whole on its line."""
    app = console(cluster_states())
    async with app.run_test(size=(width, 40)) as pilot:
        await pilot.press("question_mark")
        lines = await wait_for(
            lambda: (lambda drawn: drawn if any("╮" in line for line in drawn) else None)(screen_lines(app)),
            "the help box with its right corner",
            pilot=pilot,
        )
        top = next(line for line in lines if "╮" in line)
        assert top.index("╮") < width
        assert any("esc closes" in line for line in lines)  # the note under the table, with how to remap a key
        rows = app.help_rows()
        table = app.screen.query_one("#help-table")
        longest = max(rows, key=lambda row: len(row[2]))
        for binding_id, _, description in rows:
            assert table.get_cell(binding_id, "id").plain == binding_id
        column = table.columns[next(key for key in table.columns if key.value == "description")]
        assert column.width + table.columns[next(k for k in table.columns if k.value == "id")].width < width
        if width >= 160:
            assert column.width >= len(longest[2])
        else:
            assert column.width < len(longest[2])
            assert table.rows[next(k for k in table.rows if k.value == longest[0])].height >= 2  # wrapped, not cut


async def test_overview_process_row_shows_at_80_columns():
    """The overview's process table at 80x24 scrolls sideways; its scrollbar gets a line of its own
    instead of covering the only process row."""
    (state,) = single_node_states()
    pids = [str(p.pid) for p in state.frame.processes]
    assert pids
    app = console([state])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("o")
        await wait_for(
            lambda: any(line.split()[:1] == [pids[0]] for line in screen_lines(app) if line.strip()),
            "the first process row on the overview",
            pilot=pilot,
        )
