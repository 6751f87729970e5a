"""Data from the outside world is drawn as it is: never read as markup, never breaking the draw.

Process names and command lines, node names and reasons, host key fingerprints, GPU names, log
lines and file names, checkpoint names and metadata, audit records, alert and health messages all
come from machines and people the console does not control. Here they hold Textual markup
("[bold]", "[/x]", "[link=...]", "[@click=...]"), shell characters, wide CJK and emoji, control
characters and ANSI escapes, 10,000-character strings and empty strings; every pane, screen,
toast, tooltip and the command palette is visited with `run_test(notifications=True,
tooltips=True)` (run_test draws neither by default), and what the terminal would receive is read
back from the compositor.
"""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import pytest
from h200_fleet import idle_gpu  # noqa: E402
from rich.text import Text  # noqa: E402
from textual.command import CommandPalette
from textual.widgets import DataTable, Static  # noqa: E402
from textual.widgets._footer import FooterKey  # noqa: E402  (Textual exports no name for a footer key)
from textual.widgets._toast import Toast  # noqa: E402
from tui_fakes import FROZEN_NOW, FakeFleet, loaded_gpu, node_frame  # noqa: E402

from opsconsole.config import (
    NodeConfig,  # noqa: E402
    SshConfig,  # noqa: E402
    parse_config,  # noqa: E402
)
from opsconsole.model import (  # noqa: E402
    STATE_DOWN,
    STATE_HOSTKEY,
    STATE_UP,
    DiskUsage,
    NetRate,
    NodeState,
    ProcessSample,
)
from opsconsole.nodes.ssh import SshLink  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402
from opsconsole.tui.formatting import printable  # noqa: E402
from opsconsole.tui.help import HelpScreen  # noqa: E402
from opsconsole.tui.table_diff import as_cell  # noqa: E402
from opsconsole.tui.themes import load_themes  # noqa: E402
from tests.waiting import wait_for

SIZE = (160, 50)

# Markup Textual would act on: a closing tag with no opening one (MarkupError), a link, a click action.
MARKUP = "[bold]b[/x] [/__w/pytorch/gloo/pair.cc:553] [link=https://evil.example]l[/link] [@click=app.quit]q[/]"
SHELL = "$HOME; rm -rf / 'sq' \"dq\" `id` & | > <"
WIDE = "日本語テキスト🚀🔥"
CONTROL = "\x1b[31mred\x1b[0m \x1b]0;pwned\x07 \x08\x00\x7f\x9b"
HOSTILE = " ".join((MARKUP, SHELL, WIDE, CONTROL))
LONG = "[/x]" * 2500  # 10,000 characters, every one of them markup
# What must show literally wherever a hostile value is drawn in full.
LITERAL = "[bold]b[/x] [/__w/pytorch/gloo/pair.cc:553]"
# HOSTILE as drawn up to its window-title escape (Rich drops BEL and BS where it builds a Text itself).
SHOWN = printable(" ".join((MARKUP, SHELL, WIDE, "\x1b[31mred\x1b[0m \x1b]0;pwned")))

# A file name cannot hold "/": its markup is an opening tag and an action link.
FILE_MARKUP = "[bold]o[@click=app.quit]q"
NODE = "gpu[/x]01"  # node names are config text, and "[/x]" is a closing tag
DOWN = "[bold]down $HOME;'q' 日本"
HOSTKEY = "[link=x]hk[/link]"
NO_GPUS = "nogpu\x1b[2J"
EMPTY = ""


def hostile_process(pid: int, gpu: Optional[int] = None) -> ProcessSample:
    return ProcessSample(
        pid=pid,
        name=HOSTILE,
        user=MARKUP,
        command=HOSTILE if pid % 2 else LONG,
        cpu_percent=50.0,
        rss_bytes=2**30,
        elapsed_s=60.0,
        state="R",
        threads=4,
        gpu_index=gpu,
        gpu_memory_bytes=2**30 if gpu is not None else None,
        gpu_sm_percent=10.0 if gpu is not None else None,
    )


def hostile_states() -> List[NodeState]:
    gpus = (
        replace(
            loaded_gpu(0),
            name=HOSTILE,
            errors=(HOSTILE,),
            clock_event_reasons=(MARKUP, "SwPowerCap"),
            ecc_volatile_uncorrected=1,
            temperature=95.0,
        ),  # ECC and heat: an alert and a failing check
        replace(idle_gpu(1), name=EMPTY, uuid=MARKUP),
        replace(idle_gpu(2), name=LONG, lost=True),
    )
    frame = node_frame(NODE, gpus, hostname=HOSTILE)
    host = replace(
        frame.host,
        disks=(DiskUsage(path=HOSTILE, total=100, used=99, free=1),),
        net=(NetRate(interface=MARKUP, rx_bytes_per_s=1.0, tx_bytes_per_s=2.0),),
    )
    frame = replace(
        frame,
        host=host,
        driver_version=MARKUP,
        errors=(HOSTILE,),
        processes=(hostile_process(421, 0), hostile_process(422, 1)),
        top_processes=(
            hostile_process(1001),
            hostile_process(1002),
            replace(hostile_process(1003), name="", command="", user=""),
        ),
    )
    up = NodeState(
        name=NODE,
        state=STATE_UP,
        address=HOSTILE,
        frame=frame,
        received_at=FROZEN_NOW - 0.4,
        rtt_ms=1.0,
        since=FROZEN_NOW - 600,
    )
    down = NodeState(
        name=DOWN,
        state=STATE_DOWN,
        reason=HOSTILE + " " + LONG,
        address=MARKUP,
        frame=replace(node_frame(DOWN, [idle_gpu(0)]), processes=(hostile_process(7, 0),)),
        received_at=FROZEN_NOW - 42,
        since=FROZEN_NOW - 40,
    )
    hostkey = NodeState(
        name=HOSTKEY, state=STATE_HOSTKEY, reason=HOSTILE, fingerprint="SHA256:" + MARKUP, since=FROZEN_NOW - 5
    )
    nogpu = NodeState(
        name=NO_GPUS,
        state=STATE_UP,
        frame=replace(node_frame(NO_GPUS, []), gpus=(), gpu_note=HOSTILE, gpu_source="none"),
        received_at=FROZEN_NOW - 1,
        since=FROZEN_NOW - 60,
    )
    return [up, down, hostkey, nogpu]


def write_safetensors(path: Path, metadata: dict) -> None:
    header = json.dumps(
        {"__metadata__": metadata, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}
    ).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")


def write_world(tmp_path: Path) -> str:
    """Log files, checkpoints and an audit log with hostile names and contents; the config naming them."""
    logs = tmp_path / "logs"
    logs.mkdir()
    log_name = FILE_MARKUP.join(("train_h", "st $HOME;'q' 日本🚀_rank0_20261202_120000.log"))
    lines = [
        "2026-12-02 12:00:01,000 - INFO - step 1 " + HOSTILE,
        "2026-12-02 12:00:02,000 - ERROR - RuntimeError: " + MARKUP + " Read error: Connection reset by peer",
        "2026-12-02 12:00:03,000 - INFO - " + LONG,
        "",
        "2026-12-02 12:00:04,000 - ERROR - torch.OutOfMemoryError: CUDA out of memory. " + HOSTILE,
    ]
    (logs / log_name).write_text("\n".join(lines) + "\n")

    ckpts = tmp_path / "ckpts"
    ckpts.mkdir()
    write_safetensors(
        ckpts / ("epoch=3-step=100 %s $HOME;'q' 日本🚀.safetensors" % FILE_MARKUP),
        {MARKUP: HOSTILE, "epoch": "3", "loss": "0.5", "[/k]": LONG, "": ""},
    )
    (ckpts / ("%s \x1b[2J broken.pt" % FILE_MARKUP)).write_bytes(b"\x1b[2Jnot a checkpoint")

    audit = tmp_path / "audit.log"
    record = {
        "time": "2026-12-02T12:00:00+00:00",
        "user": MARKUP,
        "host": HOSTILE,
        "node": NODE,
        "action": "signal[/x]",
        "target": HOSTILE,
        "outcome": "failed",
        "id": "1",
        "detail": HOSTILE,
        "command": ["kill", "-INT", HOSTILE],
        "result": {"exit_status": 1, "stdout": HOSTILE, "stderr": LONG},
        MARKUP: CONTROL,
    }
    audit.write_text(json.dumps(record) + "\n")

    return "\n".join(
        (
            "[logs]",
            "paths = [%s]" % json.dumps(str(logs / "train_*_rank*_*.log")),
            "[[checkpoints]]",
            "path = %s" % json.dumps(str(ckpts)),
            "min_age = 0",
            "[actions]",
            "audit_log = %s" % json.dumps(str(audit)),
            "[[alerts]]",
            "name = %s" % json.dumps("rule " + MARKUP),
            'metric = "gpu.temperature"',
            'comparison = ">"',
            "threshold = 90",
            'severity = "critical"',
            "",
        )
    )


class HostileFleet(FakeFleet):
    """The hostile node is an SSH node, never connected: its confirmations are drawn, nothing is confirmed.

    Not this machine: a local node's PIDs are checked against this machine's processes when the plan is
    made, and the made-up PIDs of the hostile frame are no process here (the plan would be refused).
    """

    def link(self, name: str) -> SshLink:
        return SshLink(NodeConfig(name=name, host="127.0.0.1", port=9), SshConfig(), 1.0)


def console(tmp_path: Path, extra_config: str = "") -> OpsConsole:
    config = parse_config(write_world(tmp_path) + extra_config, str(tmp_path / "[bold]opsconsole[/x].toml"))
    return OpsConsole(config, HostileFleet(hostile_states()), now=lambda: FROZEN_NOW)


def screen_lines(app: OpsConsole) -> List[str]:
    """What the terminal would receive for the current screen, line by line (toasts and tooltips included)."""
    return ["".join(segment.text for segment in strip) for strip in app.screen._compositor.render_strips()]


def screen_text(app: OpsConsole) -> str:
    return "\n".join(screen_lines(app))


def assert_drawn(app: OpsConsole, *literal: str) -> str:
    """The app is alive, the screen draws, no control character reaches the terminal, `literal` shows."""
    assert app.is_running, "the console died"
    text = screen_text(app)
    bad = sorted({hex(ord(ch)) for ch in text if ch != "\n" and (ord(ch) < 32 or 0x7F <= ord(ch) < 0xA0)})
    assert not bad, "control characters reach the terminal: %s" % bad
    for part in literal:
        assert part in text, "%r is not on screen" % part
    return text


async def drawn(pilot, app: OpsConsole, *literal: str) -> str:
    """assert_drawn once `literal` is on screen: the rows are in before the screen is composed again
    (a fixed 0.1 s pause could end first on a loaded machine)."""
    await wait_for(lambda: all(part in screen_text(app) for part in literal), "%r on screen" % (literal,), pilot=pilot)
    return assert_drawn(app, *literal)


def cell_texts(table: DataTable) -> List[str]:
    """Every cell of the table as the text it draws."""
    return [str(cell) for row in table.ordered_rows for cell in table.get_row(row.key)]


async def settled(pilot, app) -> None:
    """Let the first frames and alerts arrive (the hot GPU's alert toast), then clear their toasts
    (tests that are not about them)."""
    await wait_for(lambda: list(app.screen.query(Toast)), "the alerts' toasts", pilot=pilot)
    app.clear_notifications()


async def press_and_draw(pilot, *keys: str) -> None:
    """The keys, each handled (Pilot waits for the app to go idle after each), then the screen redrawn."""
    await pilot.press(*keys)
    await pilot.pause()


# --- the plain-text helpers ------------------------------------------------------------------------


def test_printable_makes_control_characters_visible_one_for_one():
    assert printable("a\x1b[31mb\x07\x00\x7f\x9b") == "a␛[31mb␇␀␡\ufffd"
    assert printable("two\nlines\tand a tab") == "two\nlines\tand a tab"
    assert printable(WIDE + MARKUP) == WIDE + MARKUP
    assert len(printable(HOSTILE)) == len(HOSTILE)


def test_a_cell_is_plain_text_with_its_styles_kept():
    styled = Text("pid \x1b[2J [/x]", style="bold")
    styled.stylize("red", 4, 8)
    cell = as_cell(styled)
    assert cell.plain == "pid ␛[2J [/x]" and cell.style == "bold" and cell.spans == styled.spans
    assert as_cell("[/x]\x1b").plain == "[/x]␛"
    clean = Text("already clean")
    assert as_cell(clean) is clean  # nothing copied when nothing changes


def test_a_theme_file_whose_name_is_markup_is_a_problem_not_a_theme(tmp_path):
    (tmp_path / "evil.toml").write_text('name = "ev[/x]il"\nprimary = "#ff0000"\n')
    themes, problems = load_themes(tmp_path)
    assert themes == [] and len(problems) == 1 and "letters, digits" in problems[0]


# --- the console -------------------------------------------------------------------------------------


async def test_every_pane_draws_hostile_data_as_it_is(tmp_path):
    app = console(tmp_path)
    async with app.run_test(size=SIZE, notifications=True, tooltips=True) as pilot:
        await wait_for(lambda: list(app.screen.query(Toast)), "the alerts' toasts", pilot=pilot)
        # Alert toasts name the node and the rule from the config: drawn literally.
        toasts = " ".join(str(toast.render()) for toast in app.screen.query(Toast))
        assert "gpu[/x]01 GPU 0" in toasts and "rule " + LITERAL in toasts
        assert_drawn(app)
        app.clear_notifications()

        await press_and_draw(pilot, "1")
        assert_drawn(app, "no frame yet: " + HOSTKEY, "nogpu␛[2J: " + LITERAL, NODE)
        gpus = cell_texts(app.query_one("#gpus-table", DataTable))
        assert any(SHOWN in cell for cell in gpus) and printable(LONG) in gpus and "err 1" in gpus

        await press_and_draw(pilot, "o")  # the first node's overview: GPU names, processes, host
        assert_drawn(app, "host " + NODE + " (" + printable(HOSTILE)[:40], "GPU 2", "LOST")
        overview = cell_texts(app.query_one("#overview-procs", DataTable))
        assert any(SHOWN[:60] in cell for cell in overview) and "[bold]b…" in overview  # the user, cut

        await press_and_draw(pilot, "2")
        pane = app.panes["processes"]
        commands = cell_texts(pane.gpu_table.table) + cell_texts(pane.host_table.table)
        assert any(SHOWN[:100] in cell for cell in commands) and "[bold]b[/x]…" in commands  # the user, cut
        assert any(cell.startswith("[/x][/x]") and cell.endswith("…") for cell in commands)  # LONG, cut
        assert_drawn(app, LITERAL)

        await press_and_draw(pilot, "3")  # mounted on first show: wait for it, not a longer pause
        await wait_for(
            lambda: app.visible_pane_id == "host" and "host " + NODE in screen_text(app), "the Host pane", pilot=pilot
        )
        # The summary's lines are cut at the width, never wrapped (1e0fc32): the host name shows up to
        # the cut, and the whole of it, escapes as visible pictures, is what the summary draws.
        assert_drawn(app, "host " + NODE + " (" + printable(HOSTILE)[:60])
        summary = str(app.query_one("#host-summary", Static).render())
        assert "host " + NODE + " (" + SHOWN in summary and "␛[31mred␛[0m" in summary
        # The disk path, too long for its line, is cut in the middle so that its free space shows.
        disk_line = next(line for line in summary.splitlines() if line.startswith("disks"))
        assert (
            disk_line.startswith("disks  " + SHOWN[:40])
            and "…" in disk_line
            and " free of " in disk_line
            and "(1%)" in disk_line
        )
        assert any(SHOWN in cell for cell in cell_texts(app.query_one("#host-procs", DataTable)))

        await press_and_draw(pilot, "4")
        assert_drawn(app, DOWN, HOSTKEY, "nogpu␛[2J")
        reasons = cell_texts(app.query_one("#nodes-table", DataTable))
        # The reason gets the room the other columns leave: drawn literally up to its cut.
        assert any(
            cell.startswith("[bold]b[/x] [/") and cell.endswith("…") and SHOWN.startswith(cell[:-1]) for cell in reasons
        )

        await press_and_draw(pilot, "5")
        assert_drawn(app, NODE, "gpu[/x]01")
        assert any(SHOWN in cell for cell in cell_texts(app.query_one("#cluster-table", DataTable)))

        await press_and_draw(pilot, "6")
        logs = app.panes["logs"]
        await wait_for(lambda: len(logs.view.visible) >= 4, "the hostile log lines", pilot=pilot)
        await drawn(pilot, app, LITERAL, "[link=https://evil.example]l[/link]")

        await press_and_draw(pilot, "7")
        checkpoints = app.panes["checkpoints"]
        await wait_for(lambda: checkpoints.checkpoint_table.table.row_count == 2, "the two checkpoints", pilot=pilot)
        # Names are cut to the Name column, literally (the whole names: the detail screen, below).
        await drawn(pilot, app, FILE_MARKUP[:23] + "…", "epoch=3-step=100 [bold]…")
        names = cell_texts(checkpoints.checkpoint_table.table)
        assert any(cell.startswith(FILE_MARKUP[:22]) for cell in names)

        await press_and_draw(pilot, "8")
        assert_drawn(app, "node down: " + LITERAL[:20], NODE)

        await press_and_draw(pilot, "9")
        assert_drawn(app, "rule [bold]b[/x]", NODE)

        await press_and_draw(pilot, "0")
        assert_drawn(app, "signal[/x]", "[bold]b[/x")
        assert app.is_running


async def test_filters_with_brackets_and_bad_regexes_show_an_error_not_a_crash(tmp_path):
    app = console(tmp_path)
    async with app.run_test(size=SIZE, notifications=True, tooltips=True) as pilot:
        await settled(pilot, app)
        for key in "1234567890":  # `[` is free text in the tables and a bad regex in the Logs pane
            await press_and_draw(pilot, key, "slash", "[")
            assert_drawn(app)
            await press_and_draw(pilot, *"(?", "]", "/", "x", "]")
            assert_drawn(app)
            await press_and_draw(pilot, "escape")
        logs = app.panes["logs"]
        await press_and_draw(pilot, "6", "slash", "[")
        await wait_for(lambda: "invalid regex" in str(logs.status.render()), "the regex error", pilot=pilot)
        assert_drawn(app, "/[/", "invalid regex")
        await press_and_draw(pilot, "escape", "4", "slash", *"util<[/x]")
        assert "'[/x]' is not a number" in str(app.panes["nodes"].status.render())
        assert_drawn(app, "filter: util<[/x]", "'[/x]' is not a number")
        await press_and_draw(pilot, "escape")
        assert app.is_running


async def test_drill_history_help_and_tooltips_with_hostile_names(tmp_path):
    app = console(tmp_path)
    async with app.run_test(size=SIZE, notifications=True, tooltips=True) as pilot:
        await settled(pilot, app)
        await press_and_draw(pilot, "4", "home", "enter")  # drill into gpu[/x]01: its overview
        assert app.node == NODE and app.visible_pane_id == "overview"
        assert_drawn(app, "processes on the GPUs of " + NODE, "host " + NODE)
        await press_and_draw(pilot, "1")
        assert_drawn(app, "node " + NODE + " (esc: all nodes)")
        await press_and_draw(pilot, "t")  # the GPU's history
        assert type(app.screen).__name__ == "HistoryScreen"
        assert_drawn(app, "History of " + NODE + " GPU 0")
        await press_and_draw(pilot, "escape", "escape", "4", "down", "t")  # the down node's history
        assert_drawn(app, "History of node " + DOWN)
        await press_and_draw(pilot, "escape", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert_drawn(app)
        assert "[bold]opsconsole[/x].toml" in str(app.screen.query_one("#help-note").render())
        await press_and_draw(pilot, "escape", "4")
        # A footer key's tooltip (the binding's whole description) shows over the hostile tables and draws
        # as the rest does. Each key is hovered until its tooltip is on screen.
        for key in [key for key in app.screen.query(FooterKey) if key.tooltip][:2]:
            await pilot.hover(key)
            await wait_for(
                lambda: any(
                    t.display and str(key.tooltip) in str(t.render()) for t in app.screen.query("#textual-tooltip")
                ),
                "the tooltip of " + str(key.tooltip),
                pilot=pilot,
            )
            assert_drawn(app, str(key.tooltip)[:20])
        assert app.is_running


async def test_the_command_palette_takes_keys_from_the_config_as_they_are(tmp_path):
    # A key from [console.keys] is config text; the palette read its help line as markup.
    app = console(tmp_path, '[console.keys]\n"pane.gpus" = "g[/x]"\n"node.trends" = "[bold]"\n')
    async with app.run_test(size=SIZE, notifications=True, tooltips=True) as pilot:
        await settled(pilot, app)
        await press_and_draw(pilot, "ctrl+p")
        await wait_for(lambda: isinstance(app.screen, CommandPalette), "the command palette", pilot=pilot)
        assert_drawn(app)
        await press_and_draw(pilot, *"show gpus")
        # The palette searches in a worker: wait for its hit, then check the whole screen.
        await wait_for(lambda: "pane.gpus  (g[/x])" in screen_text(app), "the palette's hit", pilot=pilot)
        assert_drawn(app, "pane.gpus  (g[/x])")
        await press_and_draw(pilot, "escape", "question_mark")
        assert_drawn(app, "g[/x]")
        assert app.is_running


async def test_detail_screens_and_confirmations_show_the_data_as_it_is(tmp_path):
    app = console(tmp_path)
    async with app.run_test(size=SIZE, notifications=True, tooltips=True) as pilot:
        await settled(pilot, app)
        await press_and_draw(pilot, "7")
        checkpoints = app.panes["checkpoints"]
        await wait_for(lambda: checkpoints.checkpoint_table.table.row_count == 2, "the two checkpoints", pilot=pilot)
        table = checkpoints.checkpoint_table.table
        safetensors = next(i for i, row in enumerate(table.ordered_rows) if row.key.value.endswith(".safetensors"))
        table.focus()
        table.move_cursor(row=safetensors)
        await press_and_draw(pilot, "enter")
        assert type(app.screen).__name__ == "CheckpointDetailScreen"
        assert_drawn(app, FILE_MARKUP)
        body = str(app.screen.query_one("#detail-body").render())
        assert "__metadata__.[bold]b[/x] [/__w/…  " + MARKUP[:60] in body and "[/k]" in body
        await press_and_draw(pilot, "escape", "0", "enter")  # the hostile audit record, whole
        assert type(app.screen).__name__ == "ResultScreen"
        assert_drawn(app, "signal[/x] failed on " + NODE, "kill -INT [bold]b[/x]", "␛[31mred")
        await press_and_draw(pilot, "escape", "2", "home", "i")  # SIGINT to the hostile GPU process
        await wait_for(
            lambda: type(app.screen).__name__ == "ConfirmScreen" and app.screen.armed, "the confirmation", pilot=pilot
        )
        assert_drawn(app, "pid 421 (" + LITERAL, "␛[31mred")
        await press_and_draw(pilot, "escape")
        await press_and_draw(pilot, "4", "home", "D")  # drain asks for a reason, naming the node
        await wait_for(lambda: type(app.screen).__name__ == "ReasonScreen", "the reason prompt", pilot=pilot)
        assert_drawn(app, NODE)
        await press_and_draw(pilot, "escape")
        app.clear_notifications()
        await pilot.pause(0.1)
        app.notify(HOSTILE, title=CONTROL)
        await wait_for(lambda: list(app.screen.query(Toast)), "the toast", pilot=pilot)
        assert_drawn(app)  # a toast wraps: its own text says what it shows
        toast = " ".join(str(toast.render()) for toast in app.screen.query(Toast))
        assert printable(HOSTILE) in toast and printable(CONTROL) in toast
        assert app.is_running


@pytest.mark.parametrize("width", [1, 2, 5, 9, 10, 23, 40])
def test_a_reason_of_wide_characters_is_cut_to_its_cells_not_its_characters(width):
    # A node's reason is its own text: CJK characters and emoji take two cells each. Cut by characters,
    # a 20-character reason of them filled 40 cells and pushed the columns after it off the row.
    from rich.cells import cell_len

    from opsconsole.tui.formatting import shorten
    from opsconsole.tui.nodes import shorten_reason

    reason = "数据加载器 卡住了 节点 gpu-01 无法连接 🔥🔥🔥 please fix the node"
    for cut in (shorten(reason, width), shorten_reason(reason, width)):
        assert cell_len(cut) <= width, (cut, width)
        assert cut.endswith("…") or cut.endswith("… enter"), cut
    assert shorten(reason, 200) == reason
