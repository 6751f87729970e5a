"""The GPUs pane: one table row per GPU, coloured by the health thresholds."""

from __future__ import annotations

from typing import List, Mapping, Optional, Tuple

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Static

from opsconsole.actions.registry import TARGET_GPU, Target
from opsconsole.config import DEFAULT_CONFIG, HealthConfig
from opsconsole.health import xid
from opsconsole.history import History, sparkline
from opsconsole.model import GpuSample, NodeState
from opsconsole.tui import bars
from opsconsole.tui.action_flow import ActionKeys, action_bindings
from opsconsole.tui.bars import LEVEL_CRIT, LEVEL_DIM, LEVEL_PLAIN, Palette
from opsconsole.tui.formatting import (
    NA,
    format_clock,
    format_memory_pair,
    format_pcie_link,
    format_percent,
    format_power_pair,
    format_temperature_pair,
    printable,
)
from opsconsole.tui.gpu_levels import gpu_status, memory_level, temperature_level, throttle_text
from opsconsole.tui.live_pane import LivePane
from opsconsole.tui.table_diff import StyledCell, TableRow, styled_row

# (key, label, width): fixed widths so an update never reflows the table.
COLUMNS = (
    ("node", "Node", None),  # as wide as the longest name: names were cut at 9 cells
    ("gpu", "GPU", 3),
    ("name", "Name", 11),
    ("util", "Util", 11),
    ("memory", "Memory", 19),  # "···· 139.8/140.4 GiB"
    ("temp", "Temp", 8),  # "62/89°C!"
    ("power", "Power", 9),
    ("sm_clock", "SM clock", 8),  # "1980 MHz", as the overview shows it (all columns fit 140 cells)
    ("pstate", "P", 2),
    ("throttle", "Throttle", 10),
    ("ecc", "ECC", 3),
    ("pcie", "PCIe", 8),
    ("fan", "Fan", 4),
    ("status", "Status", 10),
)
UTIL_BAR = 6
MEMORY_BAR = 4


def _number(value: Optional[float], fmt: str = "%d") -> str:
    return NA if value is None else fmt % value


def util_cell(gpu: GpuSample, history: Optional[History], node: str) -> str:
    """Utilisation as a sparkline of its last samples and the value; a bar until there is a past."""
    ring = history.gpu(node, gpu.index, "utilization") if history is not None else None
    if ring is None or len(ring) < 2 or gpu.utilization_gpu is None:
        return bars.percent_bar(gpu.utilization_gpu, UTIL_BAR)
    return "%s %4s" % (sparkline(ring.values(), UTIL_BAR, 0.0, 100.0), format_percent(gpu.utilization_gpu))


def gpu_cells(
    gpu: GpuSample,
    state: NodeState,
    first_of_node: bool,
    health: HealthConfig,
    now: float,
    history: Optional[History] = None,
) -> List[StyledCell]:
    """The row of one GPU as (text, level) pairs, in COLUMNS order."""
    if gpu.memory_total:
        memory = "%s %s" % (
            bars.bar(gpu.memory_percent, MEMORY_BAR),
            format_memory_pair(gpu.memory_used, gpu.memory_total),
        )
    else:
        memory = NA
    temp = format_temperature_pair(gpu.temperature, gpu.temperature_slowdown)
    if temperature_level(gpu, health) == LEVEL_CRIT:
        temp += "!"  # not by colour alone
    power = format_power_pair(gpu.power_draw_w, gpu.power_limit_w)
    sm = format_clock(gpu.clock_sm_mhz)
    ecc = gpu.ecc_volatile_uncorrected
    pcie = format_pcie_link(gpu.pcie_gen, gpu.pcie_width)
    fan = format_percent(gpu.fan_percent)
    return [
        (state.name if first_of_node else "", LEVEL_PLAIN),
        (str(gpu.index), LEVEL_PLAIN),
        (gpu.name or NA, LEVEL_PLAIN),
        (util_cell(gpu, history, state.name), LEVEL_PLAIN),
        (memory, memory_level(gpu, health)),
        (temp, temperature_level(gpu, health)),
        (power, LEVEL_PLAIN),
        (sm, LEVEL_PLAIN),
        (_number(gpu.pstate, "P%d"), LEVEL_PLAIN),
        throttle_text(gpu.clock_event_reasons),
        (_number(ecc), LEVEL_CRIT if ecc else LEVEL_PLAIN),
        (pcie, LEVEL_PLAIN),
        (fan, LEVEL_PLAIN),
        gpu_status(gpu, state, now),
    ]


def row_style(cells: List[StyledCell], level: str, palette: Palette, accent_index: int) -> List[StyledCell]:
    """Turn levels into styles; a row level (lost, dimmed) overrides the cells' own."""
    out = []
    for index, (text, cell_level) in enumerate(cells):
        if level:
            style = palette.style(level)
        elif index == accent_index and not cell_level:
            style = palette.accent
        else:
            style = palette.style(cell_level)
        out.append((text, style))
    return out


def gpu_rows(
    states: Mapping[str, NodeState],
    node: Optional[str],
    health: HealthConfig,
    palette: Palette,
    now: float,
    filter_text: str = "",
    history: Optional[History] = None,
) -> List[TableRow]:
    """Rows for the GPUs of `node`, or of every node grouped by node when `node` is None."""
    names = [node] if node is not None else list(states)
    needle = filter_text.lower()
    util_column = [key for key, _, _ in COLUMNS].index("util")
    rows: List[TableRow] = []
    for name in names:
        state = states.get(name)
        if state is None or state.frame is None:
            continue
        first = True
        for gpu in state.frame.gpus:
            cells = gpu_cells(gpu, state, first, health, now, history)
            if needle and needle not in (" ".join(text for text, _ in cells) + " " + name).lower():
                continue
            first = False
            level = LEVEL_CRIT if gpu.lost else (LEVEL_DIM if not state.is_live else LEVEL_PLAIN)
            rows.append(styled_row("%s/%d" % (name, gpu.index), row_style(cells, level, palette, util_column)))
    return rows


def gpus_hint(states: Mapping[str, NodeState], node: Optional[str], filter_text: str) -> str:
    """The line above the table: which GPUs these are, and what is missing."""
    parts = []
    if node is not None:
        parts.append("node %s (esc: all nodes)" % node)
    elif len(states) > 1:
        parts.append("%d nodes, GPUs grouped by node (4: pick a node, enter: drill in)" % len(states))
    waiting = [s.name for s in states.values() if s.frame is None and (node is None or s.name == node)]
    if waiting:
        parts.append("no frame yet: " + ", ".join(waiting[:5]) + (" ..." if len(waiting) > 5 else ""))
    notes = [
        "%s: %s" % (s.name, s.frame.gpu_note)
        for s in states.values()
        if s.frame is not None and not s.frame.gpus and s.frame.gpu_note and (node is None or s.name == node)
    ]
    parts.extend(notes[:3])
    shown = [s for s in states.values() if node is None or s.name == node]
    for name, index, offer in xid.offers_in(shown)[:2]:  # the key the Xid catalog calls for: R (idle GPU) or D
        parts.append("%s/%d: %s: %s" % (name, index, offer.reason, offer.key_hint))
    if filter_text:
        parts.append("filter: %s" % filter_text)
    return "   ".join(parts)


class GpusPane(ActionKeys, LivePane):
    """Every GPU of the current node (or of all nodes), updated cell by cell. `R` resets the highlighted GPU."""

    pane_id = "gpus"
    title = "GPUs"
    key = "1"

    # R: absent in a read-only console; t: plots of the highlighted GPU's last minutes.
    BINDINGS = [Binding("t", "trends", "Trends", id="gpus.trends")] + action_bindings(TARGET_GPU)

    DEFAULT_CSS = """
    GpusPane { height: 1fr; }
    GpusPane > #gpus-hint { height: 1; color: $text-muted; padding: 0 1; }
    GpusPane > DataTable { height: 1fr; }
    """

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self._hint_text = ""

    def compose(self) -> ComposeResult:
        hint = Static("", id="gpus-hint")
        hint.display = False
        yield hint
        table: DataTable = DataTable(id="gpus-table", cursor_type="row", zebra_stripes=False)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        yield table

    def draw(self, states: Mapping[str, NodeState], node: Optional[str], now: float) -> None:
        health = getattr(self.app, "config", DEFAULT_CONFIG).health
        palette = bars.palette_from_variables(self.app.theme_variables)
        history = getattr(getattr(self.app, "services", None), "history", None)
        self.sync_table(
            self.query_one(DataTable), gpu_rows(states, node, health, palette, now, self.filter_text, history)
        )
        text = gpus_hint(states, node, self.filter_text)
        if text != self._hint_text:
            self._hint_text = text
            hint = self.query_one("#gpus-hint", Static)
            hint.update(Text(printable(text)))  # node names and GPU notes are data
            hint.display = bool(text)  # one node, no filter: the table gets the line

    def highlighted_gpu(self) -> Optional[Tuple[str, int]]:
        """(node, GPU index) of the row under the cursor, None when the table is empty."""
        table = self.query_one("#gpus-table", DataTable)
        if table.row_count == 0:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # a cursor past the rows after a filter: nothing selected
            return None
        node, _, index = (key or "").rpartition("/")
        try:
            return node, int(index)
        except ValueError:
            return None

    def action_trends(self) -> None:
        found = self.highlighted_gpu()
        history = getattr(getattr(self.app, "services", None), "history", None)
        if found is None or history is None:  # a bell alone said nothing in most terminals
            self.app.notify("no GPU selected: t plots the highlighted GPU's last minutes", severity="warning")
            return
        from opsconsole.tui.history_view import HistoryScreen  # plotext loads only when asked for

        self.app.push_screen(HistoryScreen(history, found[0], found[1]))

    def action_target(self, action_id: str) -> Optional[Target]:
        found = self.highlighted_gpu()
        if found is None:
            return None
        return Target(TARGET_GPU, found[0], gpu=found[1])
