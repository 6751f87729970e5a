"""The node overview: one node's GPUs as blocks with bars and history, its GPU processes, its host.

What nvitop shows on one screen, drawn from the same frames as the other panes: the first pane
of a single-node console and what `enter` on a node opens. The layout follows the pane's size:
a three-line block per GPU (bars, readings, history) in as many columns as the width holds when
the height allows it, else one line per GPU (8 GPUs stay readable at 80x24). Every widget is
rewritten only when its text changed, so an unchanged tick costs a comparison, not a repaint.
"""

from __future__ import annotations

import math
from typing import List, Mapping, Optional, Sequence, Tuple

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import DataTable, Static

from opsconsole.config import DEFAULT_CONFIG, HealthConfig
from opsconsole.history import History, sparkline
from opsconsole.model import GpuSample, HostSample, NodeState, ProcessSample
from opsconsole.sanitize import printable_line
from opsconsole.tui import bars
from opsconsole.tui.bars import LEVEL_CRIT, LEVEL_DIM, LEVEL_OK, LEVEL_PLAIN, LEVEL_WARN, Palette
from opsconsole.tui.formatting import (
    NA,
    format_bytes,
    format_clock,
    format_duration,
    format_memory_pair,
    format_pcie_link,
    format_percent,
    format_power,
    format_power_pair,
    format_rate,
    format_temperature,
    printable,
    shorten,
)
from opsconsole.tui.gpu_levels import gpu_status, memory_level, temperature_level, throttle_text
from opsconsole.tui.host import node_condition, wrapped
from opsconsole.tui.lines_view import LinesView
from opsconsole.tui.live_pane import LivePane
from opsconsole.tui.table_diff import TableRow, styled_row

Segment = Tuple[str, str]  # (text, level)
Line = List[Segment]

BLOCK_WIDE_WIDTH = 96  # blocks side by side only when each gets this many cells
BLOCK_LINES = 3
DETAILED_BLOCK_LINES = 4  # with a line of PCIe, ECC, fan and power history, when the height allows
COMPACT_MIN_WIDTH = 76  # one GPU on one line: index, bars, readings and a short history
PROCESS_MIN_ROWS = 4  # the process table keeps at least its header and this many rows
HOST_WARN, HOST_CRIT = 80.0, 95.0

# (key, label, width); the command column takes what the others leave.
# The headers of the Processes pane's columns, for the same readings.
PROCESS_COLUMNS = (
    ("pid", "PID", 7),
    ("user", "User", 8),
    ("gpu", "GPU", 3),
    ("gpu_memory", "GPU mem", 9),
    ("sm", "SM", 4),
    ("cpu", "CPU", 5),
    ("rss", "RSS", 8),
    ("elapsed", "Elapsed", 7),
    ("state", "S", 1),
    ("command", "Command", 40),
)
COMMAND_MIN_WIDTH = 20


def pick_overview_node(states: Mapping[str, NodeState], node: Optional[str]) -> Optional[NodeState]:
    """The node the overview shows: the one drilled into, else the first in config order."""
    if node is not None:
        return states.get(node)
    return next(iter(states.values()), None)


# --- the GPU blocks ------------------------------------------------------------


def _short_name(name: Optional[str]) -> str:
    """`NVIDIA H200` as `H200`: the vendor is the same on every line."""
    if not name:
        return NA
    for prefix in ("NVIDIA ", "Tesla "):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def _reading(value: Optional[float], fmt: str) -> str:
    return NA if value is None else fmt % value


def _history_values(history: Optional[History], node: str, index: int, metric: str) -> List[Optional[float]]:
    ring = history.gpu(node, index, metric) if history is not None else None
    return ring.values() if ring is not None else []


def _temperature_text(gpu: GpuSample, health: HealthConfig) -> Segment:
    level = temperature_level(gpu, health)
    text = format_temperature(gpu.temperature)
    return (text + ("!" if level == LEVEL_CRIT else ""), level)  # not by colour alone


def _memory_text(gpu: GpuSample) -> str:
    if not gpu.memory_total:
        return NA
    return format_memory_pair(gpu.memory_used, gpu.memory_total)


def _health_segment(gpu: GpuSample, state: NodeState, now: float) -> Segment:
    text, level = gpu_status(gpu, state, now)
    ecc = gpu.ecc_volatile_uncorrected
    if ecc:
        return ("%s ECC %d" % (text, ecc), LEVEL_CRIT)
    if gpu.remapped_rows_pending or gpu.remapped_rows_failure:
        return ("%s remap!" % text, LEVEL_CRIT)
    return text, level


def gpu_block(
    gpu: GpuSample,
    state: NodeState,
    health: HealthConfig,
    history: Optional[History],
    now: float,
    width: int,
    detailed: bool = False,
) -> List[Line]:
    """Three lines for one GPU, `width` cells wide: identity and readings, utilisation, memory;
    `detailed` adds a fourth: PCIe link, ECC counts, fan, and the power history."""
    width = max(width, 20)
    throttle, throttle_level = throttle_text(gpu.clock_event_reasons)
    head: Line = [
        ("GPU %d " % gpu.index, "bold"),
        ("%-10s " % shorten(_short_name(gpu.name), 16), LEVEL_PLAIN),  # a name from the node: bounded
        _temperature_text(gpu, health),
        ("  %s" % format_power_pair(gpu.power_draw_w, gpu.power_limit_w), LEVEL_PLAIN),
        ("  SM %s" % format_clock(gpu.clock_sm_mhz), LEVEL_PLAIN),
        ("  mem %s" % format_clock(gpu.clock_mem_mhz), LEVEL_PLAIN),
        ("  %s" % _reading(gpu.pstate, "P%d"), LEVEL_PLAIN),
        ("  ", LEVEL_PLAIN),
        _health_segment(gpu, state, now),
    ]
    if throttle not in ("-", NA):
        head += [("  throttle ", LEVEL_PLAIN), (throttle, throttle_level)]
    if sum(len(text) for text, _ in head) > width:
        # At 80 columns the memory clock goes, so that the health and throttle stay on the line.
        head = [segment for segment in head if not segment[0].startswith("  mem ")]
    # Bars of a fixed share of the width; the history takes the rest of the line.
    bar_width = max(10, min(30, (width - 24) // 3))
    util_bar = bars.percent_bar(gpu.utilization_gpu, bar_width)
    readings_width = 18  # " 139.8/139.8 GiB" after the memory bar; blank after the utilisation bar
    spark_width = width - len("util ") - len(util_bar) - readings_width - 1
    util_line: Line = [
        ("util ", LEVEL_PLAIN),
        (util_bar, LEVEL_OK if gpu.utilization_gpu else LEVEL_PLAIN),
        (" " * readings_width, LEVEL_PLAIN),
    ]
    mem_line: Line = [
        ("mem  ", LEVEL_PLAIN),
        (bars.percent_bar(gpu.memory_percent, bar_width), memory_level(gpu, health)),
        (" %-*s" % (readings_width - 1, _memory_text(gpu)), LEVEL_PLAIN),
    ]
    if spark_width >= 4:
        for line, metric in ((util_line, "utilization"), (mem_line, "memory_percent")):
            values = _history_values(history, state.name, gpu.index, metric)
            line += [(" ", LEVEL_PLAIN), (sparkline(values, spark_width, 0.0, 100.0), "accent")]
    if not detailed:
        return [head, util_line, mem_line]
    pcie = format_pcie_link(gpu.pcie_gen, gpu.pcie_width)
    ecc = gpu.ecc_volatile_uncorrected
    details = "     pcie %-8s  ecc %s/%s  fan %s  persist %s" % (
        pcie,
        _reading(gpu.ecc_volatile_corrected, "%d"),
        _reading(ecc, "%d"),
        format_percent(gpu.fan_percent),
        NA if gpu.persistence_mode is None else ("on" if gpu.persistence_mode else "off"),
    )
    details = "%-*s" % (len("util ") + len(util_bar) + readings_width, details)
    power_line: Line = [(details, LEVEL_CRIT if ecc else LEVEL_PLAIN)]
    if spark_width >= 4:
        values = _history_values(history, state.name, gpu.index, "power_w")
        power_line += [(" ", LEVEL_PLAIN), (sparkline(values, spark_width, 0.0, gpu.power_limit_w), "accent")]
    return [head, util_line, mem_line, power_line]


def gpu_line(
    gpu: GpuSample, state: NodeState, health: HealthConfig, history: Optional[History], now: float, width: int
) -> Line:
    """One line for one GPU: index, utilisation and memory bars, temperature, power, clock, health, history."""
    throttle, throttle_level = throttle_text(gpu.clock_event_reasons)
    # Shorter bars below 84 cells, so that the readings with their units leave a history at 80 columns.
    util_bar, memory_bar = (8, 6) if width >= 84 else (5, 4)
    line: Line = [
        ("%d " % gpu.index, "bold"),
        (bars.percent_bar(gpu.utilization_gpu, util_bar), LEVEL_OK if gpu.utilization_gpu else LEVEL_PLAIN),
        (" mem ", LEVEL_PLAIN),
        (bars.bar(gpu.memory_percent, memory_bar), memory_level(gpu, health)),
        (" %-13s" % _memory_text(gpu), LEVEL_PLAIN),
        ("%5s " % format_temperature(gpu.temperature), temperature_level(gpu, health)),
        ("%5s " % format_power(gpu.power_draw_w), LEVEL_PLAIN),
        ("%8s " % format_clock(gpu.clock_sm_mhz), LEVEL_PLAIN),
        _health_segment(gpu, state, now),
    ]
    if throttle not in ("-", NA, "idle"):
        line += [(" ", LEVEL_PLAIN), (throttle, throttle_level)]
    used = sum(len(text) for text, _ in line)
    spark_width = width - used - 1
    if spark_width >= 4:
        line += [
            (" ", LEVEL_PLAIN),
            (
                sparkline(_history_values(history, state.name, gpu.index, "utilization"), spark_width, 0.0, 100.0),
                "accent",
            ),
        ]
    return line


def gpu_layout(gpu_count: int, width: int, height: int) -> Tuple[str, int]:
    """("detailed" | "blocks" | "lines", columns) for `gpu_count` GPUs in `width` x `height` cells.

    The fewest columns that fit the height: one column of wide blocks gives each GPU the
    longest history; side-by-side blocks (at 192+ columns) before one line per GPU.
    """
    if gpu_count == 0:
        return "lines", 1
    most_columns = max(1, min(gpu_count, width // BLOCK_WIDE_WIDTH))
    for mode, lines in (("detailed", DETAILED_BLOCK_LINES), ("blocks", BLOCK_LINES)):
        for columns in range(1, most_columns + 1):
            if math.ceil(gpu_count / columns) * lines <= height:
                return mode, columns
    if gpu_count <= height:
        return "lines", 1
    return "lines", max(1, min(gpu_count, width // COMPACT_MIN_WIDTH))


def gpu_lines(
    state: NodeState, health: HealthConfig, history: Optional[History], now: float, width: int, height: int
) -> List[Line]:
    """The GPUs of `state` laid out to fit `width` x `height` (columns of blocks or of lines)."""
    frame = state.frame
    if frame is None:
        return [[("waiting for the first frame from %s (%s)" % (state.name, state.state), LEVEL_DIM)]]
    gpus = frame.gpus
    if not gpus:
        note = frame.gpu_note or "the probe reported no GPUs"
        return [[("no GPUs: %s" % note, LEVEL_PLAIN)]]
    mode, columns = gpu_layout(len(gpus), width, height)
    gap = 2
    column_width = (width - gap * (columns - 1)) // columns
    cells: List[List[Line]] = []
    for gpu in gpus:
        if mode != "lines":
            cells.append(gpu_block(gpu, state, health, history, now, column_width, detailed=mode == "detailed"))
        else:
            cells.append([gpu_line(gpu, state, health, history, now, column_width)])
    per_column = math.ceil(len(cells) / columns)
    out: List[Line] = []
    # Column-major, as nvitop and a reader count: GPU 0..3 down the left, 4..7 down the right.
    for row in range(per_column):
        group = [cells[c * per_column + row] for c in range(columns) if c * per_column + row < len(cells)]
        for sub in range(len(group[0])):
            line: Line = []
            for position, cell in enumerate(group):
                part = fit(cell[sub], column_width)
                if position < len(group) - 1:
                    part = pad(part, column_width + gap)
                line += part
            out.append(line)
    return out


def history_column(lines: Sequence[Line]) -> Optional[int]:
    """Where the history sparklines begin (the same column on every line of a one-column layout)."""
    starts = set()
    for line in lines:
        column = 0
        for text, level in line:
            if level == "accent":
                starts.add(column)
                break
            column += len(text)
    return starts.pop() if len(starts) == 1 else None


def split_line(line: Line, column: int) -> Tuple[Line, Line]:
    """`line` cut at `column`: the cells before it and those from it on."""
    left: Line = []
    right: Line = []
    position = 0
    for text, level in line:
        if position + len(text) <= column:
            left.append((text, level))
        elif position >= column:
            right.append((text, level))
        else:
            left.append((text[: column - position], level))
            right.append((text[column - position :], level))
        position += len(text)
    return left, right


def fit(line: Line, width: int) -> Line:
    """`line` cut to `width` cells."""
    out: Line = []
    left = width
    for text, level in line:
        if left <= 0:
            break
        if len(text) > left:
            text = text[: max(0, left - 1)] + "…"
        out.append((text, level))
        left -= len(text)
    return out


def pad(line: Line, width: int) -> Line:
    used = sum(len(text) for text, _ in line)
    return line + [(" " * (width - used), LEVEL_PLAIN)] if used < width else line


# --- the host strip ------------------------------------------------------------


def host_items(state: NodeState, health: HealthConfig, now: float, width: Optional[int] = None) -> List[Line]:
    """The host's readings as items (CPU, memory, disks, network, load) for `pack`."""
    frame = state.frame
    host: Optional[HostSample] = frame.host if frame is not None else None
    title = "host %s" % state.name
    if host is not None and host.hostname and host.hostname != state.name:
        title += " (%s)" % host.hostname
    items: List[Line] = [[(title, "bold")]]
    condition = node_condition(state, now)
    if condition is not None and width is None:
        items.append([condition])
    elif condition is not None and width is not None:  # whole, on as many pieces as it needs: its end is often the fix
        pieces = wrapped(condition[0], width, first_offset=len(title) + 3)
        items += [[(piece.lstrip(" \n"), condition[1])] for piece in pieces]
    if host is None:
        items.append([("no host readings yet" if frame is None else "no host readings", LEVEL_DIM)])
        return items
    cpu = host.cpu_percent
    items.append(
        [
            ("cpu ", LEVEL_PLAIN),
            (bars.percent_bar(cpu, 10), bars.level_for(cpu, HOST_WARN, HOST_CRIT)),
            (" %d cores" % host.cpu_count if host.cpu_count else "", LEVEL_PLAIN),
        ]
    )
    mem = host.mem_percent
    used = None if host.mem_total is None or host.mem_available is None else host.mem_total - host.mem_available
    items.append(
        [
            ("mem ", LEVEL_PLAIN),
            (bars.percent_bar(mem, 10), bars.level_for(mem, health.memory_percent - 10, health.memory_percent)),
            (" %s" % format_memory_pair(used, host.mem_total), LEVEL_PLAIN),
        ]
    )
    if host.swap_total:
        swap = 100.0 * (host.swap_used or 0) / host.swap_total
        items.append([("swap %s" % format_percent(swap), bars.level_for(swap, 50.0, 90.0))])
    if host.load_avg:
        items.append([("load %s" % " ".join("%.2f" % value for value in host.load_avg), LEVEL_PLAIN)])
    for disk in host.disks[:4]:
        free = disk.free_percent
        level = (
            LEVEL_CRIT
            if free < health.disk_free_percent
            else (LEVEL_WARN if free < 2 * health.disk_free_percent else LEVEL_PLAIN)
        )
        items.append(
            [
                ("disk %s " % disk.path, LEVEL_PLAIN),
                (bars.bar(100.0 - free, 6), level),
                (" %s free" % format_bytes(disk.free), level),
            ]
        )
    for rate in host.net[:3]:
        items.append(
            [
                (
                    "net %s rx %s tx %s"
                    % (rate.interface, format_rate(rate.rx_bytes_per_s), format_rate(rate.tx_bytes_per_s)),
                    LEVEL_PLAIN,
                )
            ]
        )
    if host.uptime_s is not None:
        items.append([("uptime %s" % format_duration(host.uptime_s), LEVEL_PLAIN)])
    return items


def pack(items: Sequence[Line], width: int, max_lines: int, gap: str = "   ") -> List[Line]:
    """Items side by side, a new line when the next one does not fit; at most `max_lines` lines."""
    lines: List[Line] = []
    current: Line = []
    used = 0
    for item in items:
        size = sum(len(text) for text, _ in item)
        if current and used + len(gap) + size > width:
            lines.append(current)
            current, used = [], 0
        if current:
            current.append((gap, LEVEL_PLAIN))
            used += len(gap)
        current += fit(item, width)
        used += min(size, width)
    if current:
        lines.append(current)
    return lines[:max_lines]


# --- the process table -----------------------------------------------------------


def process_rows(state: NodeState, palette: Palette, filter_text: str, command_width: int) -> List[TableRow]:
    """The node's GPU processes, by GPU memory; one row per (process, GPU)."""
    frame = state.frame
    processes: Sequence[ProcessSample] = frame.processes if frame is not None else ()
    dim = not state.is_live
    needle = filter_text.lower()
    ordered = sorted(processes, key=lambda p: (-(p.gpu_memory_bytes or 0), p.pid, p.gpu_index or 0))
    rows: List[TableRow] = []
    for proc in ordered:
        command = " ".join((proc.command or proc.name).split())
        cells = [
            (str(proc.pid), LEVEL_PLAIN),
            (shorten(proc.user, 8) or NA, LEVEL_PLAIN),
            (NA if proc.gpu_index is None else str(proc.gpu_index), LEVEL_PLAIN),
            (format_bytes(proc.gpu_memory_bytes), LEVEL_PLAIN),
            (format_percent(proc.gpu_sm_percent), LEVEL_PLAIN),
            (format_percent(proc.cpu_percent), bars.level_for(proc.cpu_percent, HOST_WARN, 10 * HOST_CRIT)),
            (format_bytes(proc.rss_bytes), LEVEL_PLAIN),
            (format_duration(proc.elapsed_at(frame.time) if frame is not None else None), LEVEL_PLAIN),
            (proc.state or "?", LEVEL_CRIT if proc.state in ("D", "Z") else LEVEL_PLAIN),
            (command[:command_width], LEVEL_PLAIN),
        ]
        if needle and needle not in " ".join(text for text, _ in cells).lower():
            continue
        key = "%d/%s/%s" % (proc.pid, proc.gpu_index, proc.gpu_uuid)
        rows.append(styled_row(key, [(text, palette.style(LEVEL_DIM if dim else level)) for text, level in cells]))
    return rows


# --- the pane --------------------------------------------------------------------


def lines_text(lines: Sequence[Line], palette: Palette, dim: bool) -> List[Text]:
    """Styled lines as Texts; node-provided strings (names, paths, interfaces) made printable on one line.

    Each Line is one row: a tab in a host name or a mount point reached the terminal raw (moving the
    cursor to a tab stop Textual does not know of), and a newline broke the row in two.
    """
    out = []
    for line in lines:
        text = Text(no_wrap=True, overflow="ellipsis", end="")
        out.append(text)
        for part, level in line:
            if level == "bold":
                style = "bold"
            elif level == "accent":
                style = palette.accent
            else:
                style = palette.style(LEVEL_DIM if dim and level != LEVEL_CRIT else level)
            text.append(printable_line(part), style=style)
    return out


class OverviewPane(LivePane):
    """One node on one screen: GPU blocks with bars and history, its GPU processes, its host strip."""

    pane_id = "overview"
    title = "Overview"
    key = "o"

    DEFAULT_CSS = """
    OverviewPane { height: 1fr; }
    OverviewPane > #overview-gpu-area { height: auto; }
    OverviewPane #overview-gpus { padding: 0 0 0 1; width: auto; }
    OverviewPane #overview-history { width: 1fr; }
    OverviewPane > #overview-host { padding: 0 1; background: $panel; }
    OverviewPane > #overview-procs-title { height: 1; color: $text-muted; padding: 0 1; }
    OverviewPane > DataTable { height: 2; }
    """

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self._shown: dict = {}  # widget id -> what it shows now, to skip unchanged updates
        self._command_width = 0
        self._table_height = 0
        self._readings_width = 0

    def compose(self) -> ComposeResult:
        # Readings on the left, history on the right: Textual sends a changed run from the left
        # edge of its widget, so the scrolling sparklines do not resend the readings before them.
        with Horizontal(id="overview-gpu-area"):
            yield LinesView(id="overview-gpus")
            yield LinesView(id="overview-history")
        yield LinesView(id="overview-host")
        yield Static("", id="overview-procs-title")
        table: DataTable = DataTable(id="overview-procs", cursor_type="row")
        for key, label, width in PROCESS_COLUMNS:
            table.add_column(label, key=key, width=width)
        yield table

    def on_resize(self) -> None:
        self.redraw()

    def _update(self, widget_id: str, text: Text) -> None:
        """Show `text` in the one-line widget if it differs (the layout never changes for it)."""
        key = (text.plain, tuple(text.spans))
        if self._shown.get(widget_id) == key:
            return
        self._shown[widget_id] = key
        self.query_one("#" + widget_id, Static).update(text, layout=False)

    def _fit_table_height(self, rows: int, room: int, scrollbar: bool = False) -> None:
        """The process table as tall as its rows (a DataTable repaints all of itself on any cell
        change, so empty rows below the processes would be sent to the terminal every second), and a
        line more for its horizontal scrollbar when the columns are wider than the pane (at 80
        columns the scrollbar took the only process row's line)."""
        height = max(2, min(rows + 1, max(room, PROCESS_MIN_ROWS + 1))) + (1 if scrollbar else 0)
        if height != self._table_height:
            self._table_height = height
            self.query_one("#overview-procs", DataTable).styles.height = height

    def _fit_command_column(self, width: int) -> int:
        """Give the command column what the other columns leave (it was cut at 60 cells before)."""
        others = sum(column_width + 2 for _, _, column_width in PROCESS_COLUMNS[:-1])
        command_width = max(COMMAND_MIN_WIDTH, width - others - 3)
        if command_width != self._command_width:
            self._command_width = command_width
            table = self.query_one("#overview-procs", DataTable)
            table.columns[table.ordered_columns[-1].key].width = command_width
            table._require_update_dimensions = True  # no public way to resize a fixed-width column
            table.refresh()
        return command_width

    def draw(self, states: Mapping[str, NodeState], node: Optional[str], now: float) -> None:
        config = getattr(self.app, "config", DEFAULT_CONFIG)
        health = config.health
        palette = bars.palette_from_variables(self.app.theme_variables)
        history = getattr(getattr(self.app, "services", None), "history", None)
        width = max(40, self.size.width - 2)
        height = self.size.height or 24
        state = pick_overview_node(states, node)
        if state is None:
            self.query_one("#overview-gpus", LinesView).set_lines([Text("no nodes configured")])
            return
        dim = not state.is_live
        host_lines = pack(host_items(state, health, now, width), width, 3)
        gpu_count = len(state.frame.gpus) if state.frame is not None else 0
        process_count = len(state.frame.processes) if state.frame is not None else 0
        # The GPUs get what the host strip and a few process rows leave.
        gpu_height = max(1, height - len(host_lines) - 2 - min(max(process_count, 1), PROCESS_MIN_ROWS))
        lines = gpu_lines(state, health, history, now, width, gpu_height)
        split = history_column(lines)
        if split is None:  # side-by-side blocks, or no history yet: one widget holds it all
            readings, sparks = lines, []
            split = width + 1
        else:
            readings, sparks = [list(part) for part in zip(*(split_line(line, split) for line in lines))]
        readings_view = self.query_one("#overview-gpus", LinesView)
        if split + 1 != self._readings_width:
            self._readings_width = split + 1
            readings_view.styles.width = split + 1  # its left padding and the readings
        gpu_texts = lines_text(readings, palette, dim)
        readings_view.set_lines(gpu_texts)
        self.query_one("#overview-history", LinesView).set_lines(lines_text(sparks, palette, dim))
        self.query_one("#overview-host", LinesView).set_lines(lines_text(host_lines, palette, dim))
        command_width = self._fit_command_column(self.size.width)
        rows = process_rows(state, palette, self.filter_text, command_width)
        title = "processes on the GPUs of %s: %d" % (state.name, len(rows))
        if gpu_count and not process_count:
            title = "no processes on the GPUs of %s" % state.name
        if node is None and len(states) > 1:
            title += "   (first of %d nodes; Nodes (4), enter opens another)" % len(states)
        if self.filter_text:
            title += "   filter: %s" % self.filter_text
        self._update("overview-procs-title", Text(printable(title)))
        others = sum(column_width + 2 for _, _, column_width in PROCESS_COLUMNS[:-1])
        scrolls = others + command_width + 2 > self.size.width
        self._fit_table_height(len(rows), height - len(gpu_texts) - len(host_lines) - 1, scrollbar=scrolls)
        self.sync_table(self.query_one("#overview-procs", DataTable), rows)
