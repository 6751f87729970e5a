"""The Host pane: CPU, load, memory, disks and network of one node, and its busiest processes."""

from __future__ import annotations

import textwrap
from typing import List, Mapping, Optional, Sequence, Tuple

from rich.cells import cell_len, get_character_cell_size
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from opsconsole.config import DEFAULT_CONFIG, HealthConfig
from opsconsole.model import DiskUsage, HostSample, NodeState, ProcessSample
from opsconsole.sanitize import printable_line
from opsconsole.tui import bars
from opsconsole.tui.bars import LEVEL_CRIT, LEVEL_DIM, LEVEL_PLAIN, LEVEL_WARN, Palette
from opsconsole.tui.formatting import (
    NA,
    format_bytes,
    format_duration,
    format_frame_age,
    format_memory_pair,
    format_percent,
    format_rate,
    printable,
    printable_text,
)
from opsconsole.tui.live_pane import LivePane
from opsconsole.tui.table_diff import TableRow, styled_row

Segment = Tuple[str, str]  # (text, level); "\n" ends a line

# The Processes pane's headers for the same readings, in its order. No name column: the command
# line starts with it, and at 80 columns the command kept 6 cells beside it.
PROCESS_COLUMNS = (
    ("pid", "PID", 7),
    ("user", "User", 8),
    ("cpu", "CPU", 5),
    ("rss", "RSS", 8),  # "1023 KiB", the widest format_bytes spells below a GiB
    ("threads", "Threads", 7),
    ("elapsed", "Elapsed", 7),
    ("state", "S", 1),
    ("command", "Command", 60),
)
COMMAND_MIN_WIDTH = 20
CPU_BAR = 30
CORE_BAR = 8
CORE_GAP = "   "  # between one core's percent and the next core's number
MANY_CORES = 32  # beyond this, one spark cell per core
DISK_BAR = 10
CPU_WARN, CPU_CRIT = 80.0, 95.0


def pick_node(states: Mapping[str, NodeState], node: Optional[str]) -> Optional[NodeState]:
    """The node the pane shows: the one drilled into, else the first in config order."""
    if node is not None:
        return states.get(node)
    return next(iter(states.values()), None)


def _bar_segments(label: str, percent: Optional[float], width: int, level: str, tail: str = "") -> List[Segment]:
    return [(label, LEVEL_PLAIN), (bars.percent_bar(percent, width), level), (tail, LEVEL_PLAIN)]


def core_segments(per_core: Sequence[float], width: int) -> List[Segment]:
    """Per-core bars in a grid that fits `width`, or one spark cell per core when there are many."""
    if not per_core:
        return [("cores  " + NA, LEVEL_PLAIN), ("\n", "")]
    out: List[Segment] = []
    if len(per_core) > MANY_CORES:
        per_line = max(8, width - 8)
        for start in range(0, len(per_core), per_line):
            out.append(("cores " if start == 0 else "      ", LEVEL_PLAIN))
            for value in per_core[start : start + per_line]:
                out.append((bars.spark(value), bars.level_for(value, CPU_WARN, CPU_CRIT)))
            out.append(("\n", ""))
        return out
    # A cell is "NN ████████ 100%": the number padded to the widest index, then the bar and its
    # percent; cells are parted by CORE_GAP, so a percent never touches the next core's number.
    digits = len(str(len(per_core) - 1))
    cell = digits + 1 + len(bars.percent_bar(0.0, CORE_BAR))
    prefix = "cores "
    per_line = max(1, (width - len(prefix) + len(CORE_GAP)) // (cell + len(CORE_GAP)))
    for start in range(0, len(per_core), per_line):
        out.append((prefix if start == 0 else " " * len(prefix), LEVEL_PLAIN))
        for index in range(start, min(start + per_line, len(per_core))):
            value = per_core[index]
            out.append(("%s%*d " % (CORE_GAP if index > start else "", digits, index), LEVEL_PLAIN))
            out.append((bars.percent_bar(value, CORE_BAR), bars.level_for(value, CPU_WARN, CPU_CRIT)))
        out.append(("\n", ""))
    return out


def node_condition(state: NodeState, now: float) -> Optional[Segment]:
    """The node's state and why, for the line above its readings; None for a node that is simply up.

    A node never heard from says "no frame yet" (not "frame never old"); a live node read another
    way (fallback, degraded) shows its reason too, which carries the fix.
    """
    reason = ": " + state.reason if state.reason else ""
    if state.is_live:
        return ("%s%s" % (state.state, reason), LEVEL_WARN) if state.reason else None
    age = "no frame yet" if state.received_at is None else "frame %s old" % format_frame_age(state.age(now))
    return ("%s, %s%s" % (state.state, age, reason), LEVEL_CRIT)


def wrapped(text: str, width: int, first_offset: int) -> List[str]:
    """`text` cut at spaces into pieces: the first fits beside `first_offset` columns, each other one a
    line of `width` (starting with a newline); a word longer than a line is cut."""
    lines = textwrap.wrap(text, width, initial_indent=" " * (first_offset), break_on_hyphens=False) or [""]
    return ["   " + lines[0].lstrip()] + ["\n" + line for line in lines[1:]]


def host_segments(state: NodeState, health: HealthConfig, now: float, width: int) -> List[Segment]:
    """The summary above the process table, as styled segments."""
    frame = state.frame
    host: Optional[HostSample] = frame.host if frame is not None else None
    # Names, mount points and interfaces on one line each: "\n" segments are the summary's layout, and
    # a newline or tab in a host name broke it (a tab reached the terminal raw).
    title = "host %s" % printable_line(state.name)
    if host is not None and host.hostname and host.hostname != state.name:
        title += " (%s)" % printable_line(host.hostname)
    out: List[Segment] = [(title, LEVEL_PLAIN)]
    condition = node_condition(state, now)
    if condition is not None:  # on lines of its own, whole: its end is often the fix
        for part in wrapped(condition[0], width, first_offset=len(title) + 3):
            out.append((part, condition[1]))
        if host is not None:
            out.append(("\n", ""))
    if host is None:
        out += [
            ("\n", ""),
            ("no host readings yet" if frame is None else "the probe sent no host readings", LEVEL_PLAIN),
            ("\n", ""),
        ]
        return out
    load = " ".join("%.2f" % value for value in host.load_avg) or NA
    iowait = format_percent(host.iowait_percent)
    out.append(
        (
            "   uptime %s   load %s   iowait %s   via %s" % (format_duration(host.uptime_s), load, iowait, host.source),
            LEVEL_PLAIN,
        )
    )
    out.append(("\n", ""))
    cpu = host.cpu_percent
    out += _bar_segments(
        "cpu   ", cpu, CPU_BAR, bars.level_for(cpu, CPU_WARN, CPU_CRIT), "   %d cores" % host.cpu_count
    )
    out.append(("\n", ""))
    out += core_segments(host.cpu_per_core, width)
    mem = host.mem_percent
    used = None if host.mem_total is None or host.mem_available is None else host.mem_total - host.mem_available
    out += _bar_segments(
        "mem   ",
        mem,
        CPU_BAR,
        bars.level_for(mem, health.memory_percent - 10, health.memory_percent),
        "   %s" % format_memory_pair(used, host.mem_total),
    )
    if host.swap_total:
        swap = 100.0 * (host.swap_used or 0) / host.swap_total
        out.append(("   swap ", LEVEL_PLAIN))
        out.append((bars.percent_bar(swap, DISK_BAR), bars.level_for(swap, 50.0, 90.0)))
        out.append(("  %s" % format_memory_pair(host.swap_used, host.swap_total), LEVEL_PLAIN))
    else:
        out.append(("   swap none", LEVEL_PLAIN))
    out.append(("\n", ""))
    out += disk_segments(host.disks, health, width)
    out.append(("net  ", LEVEL_PLAIN))
    if not host.net:
        out.append(("  " + NA, LEVEL_PLAIN))
    for rate in host.net:
        out.append(
            (
                "  %s rx %s tx %s"
                % (printable_line(rate.interface), format_rate(rate.rx_bytes_per_s), format_rate(rate.tx_bytes_per_s)),
                LEVEL_PLAIN,
            )
        )
    out.append(("\n", ""))
    return out


def disk_segments(disks: Sequence[DiskUsage], health: HealthConfig, width: int) -> List[Segment]:
    """The disks on one line when they fit `width` cells, else one a line. A path too long for its
    line is cut in the middle, so the free space, which the line is for, never falls behind the
    ellipsis that cuts the summary at the width."""
    label = "disks"
    if not disks:
        return [(label, LEVEL_PLAIN), ("  " + NA, LEVEL_PLAIN), ("\n", "")]
    items = []
    for disk in disks:
        free = disk.free_percent
        level = (
            LEVEL_CRIT
            if free < health.disk_free_percent
            else (LEVEL_WARN if free < 2 * health.disk_free_percent else LEVEL_PLAIN)
        )
        # The free space first and as the overview says it ("64 GiB free"): what a cut line keeps.
        reading = " %s free of %s (%s)" % (format_bytes(disk.free), format_bytes(disk.total), format_percent(free))
        # Measured as drawn: a control character is one visible picture (printable), not zero cells.
        items.append((printable_line(disk.path), bars.bar(100.0 - free, DISK_BAR), level, reading))

    def cells(path: str, bar: str, reading: str) -> int:
        return 2 + cell_len(path) + 1 + len(bar) + len(reading)

    fits = len(label) + sum(cells(path, bar, reading) for path, bar, _, reading in items) <= width
    lines = [items] if fits else [[item] for item in items]
    out: List[Segment] = []
    for index, line in enumerate(lines):
        out.append((label if index == 0 else " " * len(label), LEVEL_PLAIN))
        for path, bar, level, reading in line:
            room = width - len(label) - cells("", bar, reading)
            out.append(("  %s " % cut_middle(path, room), LEVEL_PLAIN))
            out.append((bar, level))
            out.append((reading, level))
        out.append(("\n", ""))
    return out


def cut_middle(text: str, width: int) -> str:
    """`text` in at most `width` terminal cells: its start and end kept, "…" between them."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…" if width == 1 else ""
    head_room = width // 2
    head, used = [], 0
    for char in text:
        size = get_character_cell_size(char)
        if used + size > head_room:
            break
        head.append(char)
        used += size
    tail: List[str] = []
    tail_room, used = width - 1 - used, 0
    for char in reversed(text):
        size = get_character_cell_size(char)
        if used + size > tail_room:
            break
        tail.append(char)
        used += size
    return "".join(head) + "…" + "".join(reversed(tail))


def segments_text(segments: Sequence[Segment], palette: Palette, dim: bool) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis", end="")
    for part, level in segments:
        text.append(part, style=palette.style(LEVEL_DIM if dim and part != "\n" else level))
    text.rstrip()
    return text


HOST_PANE_PROCESSES = 30  # the summary's share; the Processes pane lists them all


def process_rows(
    processes: Sequence[ProcessSample], palette: Palette, dim: bool, filter_text: str, frame_time: float = 0.0
) -> List[TableRow]:
    """The top host processes: D and Z first (marked, not just coloured), then by CPU; kernel threads left out."""
    needle = filter_text.lower()
    rows: List[TableRow] = []
    ordered = sorted(
        (p for p in processes if not p.kernel_thread),
        key=lambda p: (p.state not in ("D", "Z"), -(p.cpu_percent or 0.0)),
    )
    for proc in ordered:
        if len(rows) >= HOST_PANE_PROCESSES:
            break
        cells = [
            (str(proc.pid), LEVEL_PLAIN),
            (proc.user or NA, LEVEL_PLAIN),
            (format_percent(proc.cpu_percent), bars.level_for(proc.cpu_percent, CPU_WARN, 10 * CPU_CRIT)),
            (format_bytes(proc.rss_bytes), LEVEL_PLAIN),
            (NA if proc.threads is None else str(proc.threads), LEVEL_PLAIN),
            (format_duration(proc.elapsed_at(frame_time)), LEVEL_PLAIN),
            (proc.state or "?", LEVEL_CRIT if proc.state in ("D", "Z") else LEVEL_PLAIN),
            (proc.command.replace("\n", " ") or "[%s]" % proc.name, LEVEL_PLAIN),
        ]
        if needle and needle not in " ".join([proc.name] + [text for text, _ in cells]).lower():
            continue
        rows.append(
            styled_row(str(proc.pid), [(text, palette.style(LEVEL_DIM if dim else level)) for text, level in cells])
        )
    return rows


class HostPane(LivePane):
    """Host readings of the current node (the drilled-into one, else the first)."""

    pane_id = "host"
    title = "Host"
    key = "3"

    DEFAULT_CSS = """
    HostPane { height: 1fr; }
    HostPane > #host-summary { height: auto; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    HostPane > #host-procs-title { height: 1; color: $text-muted; padding: 0 1; }
    HostPane > DataTable { height: 1fr; }
    """

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self._summary_key: Optional[tuple] = None
        self._title_text = ""

    def compose(self) -> ComposeResult:
        yield Static("", id="host-summary")
        yield Static("", id="host-procs-title")
        table: DataTable = DataTable(id="host-procs", cursor_type="row")
        for key, label, width in PROCESS_COLUMNS:
            table.add_column(label, key=key, width=width)
        yield table

    def on_resize(self) -> None:
        self._summary_key = None  # the core grid depends on the width
        self.redraw()

    def fit_command_column(self, width: int) -> None:
        """Give the command column what the other columns leave (it stopped at 60 cells at any width)."""
        others = sum(column_width + 2 for _, _, column_width in PROCESS_COLUMNS[:-1])
        command_width = max(COMMAND_MIN_WIDTH, width - others - 3)  # 2 of cell padding, 1 for a scroll bar
        table = self.query_one("#host-procs", DataTable)
        column = table.columns.get("command")
        if column is not None and column.width != command_width:
            column.width = command_width
            table._require_update_dimensions = True  # no public way to resize a fixed-width column
            table.refresh()

    def draw(self, states: Mapping[str, NodeState], node: Optional[str], now: float) -> None:
        health = getattr(self.app, "config", DEFAULT_CONFIG).health
        palette = bars.palette_from_variables(self.app.theme_variables)
        state = pick_node(states, node)
        width = max(40, self.size.width - 2)
        if state is None:
            segments: List[Segment] = [("no nodes", LEVEL_PLAIN)]
            processes: Sequence[ProcessSample] = ()
            frame_time = now
            dim = False
        else:
            segments = host_segments(state, health, now, width)
            processes = state.frame.top_processes if state.frame is not None else ()
            frame_time = state.frame.time if state.frame is not None else now
            dim = not state.is_live
        key = (tuple(segments), palette, dim)
        if key != self._summary_key:
            self._summary_key = key
            # Host name, reason, disk paths and interfaces are data: control characters made visible.
            self.query_one("#host-summary", Static).update(printable_text(segments_text(segments, palette, dim)))
        title = "top processes by CPU"
        if node is None and len(states) > 1:
            title += "   (first of %d nodes; pick another in Nodes with 4, enter)" % len(states)
        if self.filter_text:
            title += "   filter: %s" % self.filter_text
        if title != self._title_text:
            self._title_text = title
            self.query_one("#host-procs-title", Static).update(Text(printable(title)))
        self.fit_command_column(self.size.width)
        self.sync_table(self.query_one(DataTable), process_rows(processes, palette, dim, self.filter_text, frame_time))
