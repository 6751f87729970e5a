"""The Checkpoints pane: every configured checkpoint directory, its checkpoints, integrity and cleanup.

Top: one row per `[[checkpoints]]` directory (node, path, count, total size, free space).
Then, when there are some, the listing's warnings about the highlighted directory as a whole (two
HF runs in one output_dir), wrapped whole. Below: the units of the highlighted directory as the headless listing shows them: name, layout
(which library's unit: HF checkpoint, final model, Lightning, DCP ...), series (or "not managed"),
epoch/step, loss (the lowest marked), size, age, integrity, the marks (best, top-k, latest,
current tag) and a note (the problem, why it could not be read, why it is not managed). Below
WIDE_FROM columns the format and age columns give way so the note stays readable. Scans, CRC checks,
plans and deletions run in thread workers; a remote directory is read over its node's
SSH connection (SFTP, opsconsole/checkpoints/remote.py), whose loop is this app's loop.

Keys: enter details, v full CRC check (v again cancels), c cleanup (the registered
checkpoint_cleanup action: its plan, the directory's name typed, the runner's audit; absent in a
read-only console), u rescan now, d / D next /
previous directory (tab switches panes, so the directory table never takes the focus).
A remote directory is scanned only while its node is connected: logging in is the fleet's job.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, ProgressBar, Static

from opsconsole.actions.registry import TARGET_CHECKPOINT_DIR, Target
from opsconsole.checkpoints.access import LOCAL, FileSystem
from opsconsole.checkpoints.records import (
    CURRENT_TAG,
    INTEGRITY_CORRUPT,
    INTEGRITY_NO_CRC,
    INTEGRITY_OK,
    INTEGRITY_TRUNCATED,
    LAYOUT_ACCELERATE,
    LAYOUT_CHECKPOINT_MANAGER,
    LAYOUT_DCP,
    LAYOUT_DEEPSPEED,
    LAYOUT_FILE,
    LAYOUT_HF_CHECKPOINT,
    LAYOUT_HF_FINAL,
    LAYOUT_LIGHTNING,
    LAYOUT_LINK,
    LAYOUT_MEGATRON,
    LAYOUT_NUMBERED,
    LAYOUT_SHARDED,
    LAYOUT_TORCHTITAN,
    CheckpointEntry,
    DirListing,
)
from opsconsole.checkpoints.retention import age_text
from opsconsole.config import CheckpointDirConfig
from opsconsole.fleet_view import FilterFields, filter_rows
from opsconsole.model import STATE_FALLBACK, STATE_STALE, STATE_UP
from opsconsole.nodes.base import is_replayed
from opsconsole.sanitize import printable_line
from opsconsole.tui.action_flow import ActionKeys, action_bindings
from opsconsole.tui.formatting import NA, format_age, format_bytes, format_metric, printable, printable_text, shorten
from opsconsole.tui.table_diff import TableRow
from opsconsole.tui.table_pane import Column, SortedTable, TablePane

RESCAN_S = 30.0  # a visible pane rescans this often (unchanged files come from the cache)
PROGRESS_EVERY_S = 0.1
INTEGRITY_STYLES = {
    INTEGRITY_OK: "green",
    INTEGRITY_NO_CRC: "yellow",
    INTEGRITY_TRUNCATED: "bold red",
    INTEGRITY_CORRUPT: "bold red",
}

DIR_COLUMNS = (
    Column("node", "Node", 12),
    Column("root", "Directory"),
    Column("count", "Ckpts", 5),
    Column("total", "Size", 9),
    Column("free", "Free", 9),
    Column("scanned", "Scanned", 7),
    Column("state", "State", 40),
)
CKPT_COLUMNS = (  # 170 columns: the note keeps about 30 cells
    Column("name", "Name", 24),
    Column("layout", "Layout", 13),
    Column("format", "Format", 11),
    Column("series", "Series", 15),
    Column("epoch", "Epoch", 5),
    Column("step", "Step", 7),
    Column("loss", "Loss", 8),
    Column("size", "Size", 9),
    Column("age", "Age", 4),
    Column("integrity", "Integrity", 10),
    Column("marks", "Marks", 12),
    Column("note", "Note"),
)
NARROW_DROPPED = ("format", "age", "epoch")  # the details screen still has them
CKPT_COLUMNS_NARROW = tuple(  # 120 columns
    replace(c, width={"name": 20, "series": 13, "step": 6, "loss": 7, "size": 8, "marks": 11}.get(c.key, c.width))
    for c in CKPT_COLUMNS
    if c.key not in NARROW_DROPPED
)
WIDE_FROM = 150  # pane width (cells) from which the wide column set is used
NOTE_CHARS = 80

# What the Layout column calls each library's unit (the headless listing prints the raw layout).
LAYOUT_LABELS = {
    LAYOUT_CHECKPOINT_MANAGER: "ckpt manager",
    LAYOUT_NUMBERED: "numbered",
    LAYOUT_LIGHTNING: "Lightning",
    LAYOUT_HF_CHECKPOINT: "HF checkpoint",
    LAYOUT_HF_FINAL: "final model",
    LAYOUT_ACCELERATE: "accelerate",
    LAYOUT_DEEPSPEED: "DeepSpeed",
    LAYOUT_MEGATRON: "Megatron",
    LAYOUT_DCP: "DCP",
    LAYOUT_TORCHTITAN: "torchtitan",
    LAYOUT_SHARDED: "sharded model",
    LAYOUT_FILE: "file",
    LAYOUT_LINK: "link",
}


def layout_label(entry: CheckpointEntry) -> str:
    return LAYOUT_LABELS.get(entry.layout, entry.layout)


def columns_for(width: int) -> Tuple[Column, ...]:
    """The checkpoint columns for a pane `width` cells wide."""
    return CKPT_COLUMNS if width >= WIDE_FROM or width <= 0 else CKPT_COLUMNS_NARROW


@dataclass(frozen=True)
class DirRow:
    """One configured directory and what its last scan found."""

    key: str
    node: str
    root: str
    listing: Optional[DirListing]
    scanning: bool


def _integrity_key(entry: CheckpointEntry) -> Tuple[int, str]:
    order = {INTEGRITY_CORRUPT: 0, INTEGRITY_TRUNCATED: 1, INTEGRITY_NO_CRC: 3, INTEGRITY_OK: 4}
    return order.get(entry.integrity, 2), entry.integrity


CKPT_SORT_KEYS = {
    "name": lambda e: e.name,
    "format": lambda e: e.format,
    "epoch": lambda e: e.meta.epoch,
    "step": lambda e: e.meta.step,
    "loss": lambda e: e.meta.loss,
    "size": lambda e: e.size_bytes,
    "age": lambda e: -e.mtime,
    "integrity": _integrity_key,
    "marks": lambda e: (not e.latest, not e.best, not is_top_k(e)),
    "layout": layout_label,
    "series": lambda e: (e.series is None, e.series or ""),
    "note": lambda e: note_text(e),
}
DIR_SORT_KEYS = {
    "node": lambda r: r.node,
    "root": lambda r: r.root,
    "count": lambda r: r.listing.managed_count if r.listing else None,
    "total": lambda r: r.listing.managed_bytes if r.listing else None,
    "free": lambda r: r.listing.free_bytes if r.listing else None,
}
CHECKPOINT_FILTER = FilterFields(
    free=lambda e: (e.name, e.format, layout_label(e), e.series or "not managed", e.integrity, note_text(e)),
    text={
        "name": lambda e: (e.name,),
        "format": lambda e: (e.format,),
        "integrity": lambda e: (e.integrity,),
        "layout": lambda e: (e.layout, layout_label(e)),
        "series": lambda e: (e.series or "not managed",),
    },
    numbers={
        "epoch": lambda e: e.meta.epoch,
        "step": lambda e: e.meta.step,
        "loss": lambda e: e.meta.loss,
        "size": lambda e: e.size_bytes / 2**30,  # GiB
    },
)


def dir_key(config: CheckpointDirConfig) -> str:
    return "%s:%s" % (config.node or "local", config.path)


def is_top_k(entry: CheckpointEntry) -> bool:
    return any(p.startswith("top-k") for p in entry.protections)


def is_current_tag(entry: CheckpointEntry) -> bool:
    """DeepSpeed's `latest` or Megatron's latest_checkpointed_iteration.txt names it."""
    return entry.current_tag


def marks_text(entry: CheckpointEntry) -> str:
    """What the library recorded about the unit, in words: best, top-k, latest or current tag."""
    parts = []
    if entry.best:
        parts.append("best")
    if is_top_k(entry):
        parts.append("top-k")
    if is_current_tag(entry):
        parts.append(CURRENT_TAG)
    elif entry.latest:
        parts.append("latest")
    if entry.is_link:
        parts.append("link")
    return " ".join(parts)


def epoch_text(entry: CheckpointEntry) -> str:
    """HF's fractional epoch (2.50) as the headless listing prints it, else the whole epoch."""
    exact = entry.meta.epoch_float
    if exact is not None and exact != int(exact):
        return "%.2f" % exact
    return NA if entry.meta.epoch is None else str(entry.meta.epoch)


def note_text(entry: CheckpointEntry) -> str:
    """The problem, then why it could not be read, then why it is not managed (one line)."""
    parts = []
    if entry.problem:
        parts.append(entry.problem)
    if entry.unreadable and entry.unreadable != entry.problem:
        parts.append(
            entry.unreadable
            if entry.unreadable.startswith(("unreadable", "could not read"))
            else "unreadable: " + entry.unreadable
        )
    if entry.series is None and not entry.is_link:
        parts.append(entry.unmanaged or "no recognised series")  # the Series column says "not managed"
    return "; ".join(parts)


def note_cell(entry: CheckpointEntry) -> Text:
    note = note_text(entry)
    style = "yellow" if entry.problem or entry.unreadable else "dim"
    return Text(shorten(note, NOTE_CHARS), style=style if note else "", no_wrap=True, overflow="ellipsis", end="")


def series_cell(entry: CheckpointEntry) -> Text:
    if entry.series is None:
        return Text("not managed", style="dim", end="")
    return Text(entry.series, no_wrap=True, overflow="ellipsis", end="")


def loss_cell(entry: CheckpointEntry) -> Text:
    if entry.meta.loss is None:
        return Text(NA, style="dim", end="")
    text = format_metric(entry.meta.loss)
    if entry.lowest_loss:
        return Text(text + " ★", style="bold green", end="")
    return Text(text, end="")


def checkpoint_cells(entry: CheckpointEntry, now: float) -> Dict[str, Any]:
    """One unit's cells by column key (integrity coloured, the lowest loss starred)."""
    integrity = entry.integrity + (" ✓crc" if entry.crc_checked and entry.integrity == INTEGRITY_OK else "")
    return {
        "name": Text(entry.name, style="bold" if entry.latest else "", no_wrap=True, overflow="ellipsis", end=""),
        "layout": layout_label(entry),
        "format": entry.format,
        "series": series_cell(entry),
        "epoch": epoch_text(entry),
        "step": NA if entry.meta.step is None else str(entry.meta.step),
        "loss": loss_cell(entry),
        "size": NA if entry.is_link else format_bytes(entry.size_bytes),
        "age": format_age(now - entry.mtime),
        "integrity": Text(integrity, style=INTEGRITY_STYLES.get(entry.integrity, "dim"), end=""),
        "marks": Text(marks_text(entry), style="bold cyan", end=""),
        "note": note_cell(entry),
    }


def checkpoint_table_row(entry: CheckpointEntry, now: float, columns: Tuple[Column, ...] = CKPT_COLUMNS) -> TableRow:
    """One unit's row for the columns shown."""
    cells = checkpoint_cells(entry, now)
    return TableRow(entry.key, tuple(cells[c.key] for c in columns))


def dir_table_row(row: DirRow, now: float) -> TableRow:
    listing = row.listing
    if listing is None:
        state = Text("scanning…" if row.scanning else "not scanned yet", style="dim", end="")
        return TableRow(row.key, (row.node, row.root, NA, NA, NA, NA, state))
    if listing.problem:
        state = Text(shorten(listing.problem, 60), style="bold red", end="")
    else:
        broken = sum(1 for e in listing.entries if e.integrity in (INTEGRITY_TRUNCATED, INTEGRITY_CORRUPT))
        text = "%s%s" % ("rescanning… " if row.scanning else "", "%d broken" % broken if broken else "ok")
        state = Text(text, style="bold red" if broken else "green", end="")
    free = NA if listing.free_bytes is None else format_bytes(listing.free_bytes)
    return TableRow(
        row.key,
        (
            row.node,
            row.root,
            str(listing.managed_count),  # series members only: a final model or a lone file is none
            format_bytes(listing.managed_bytes),
            free,
            format_age(now - listing.scanned_at),
            state,
        ),
    )


def detail_text(entry: CheckpointEntry, now: float) -> Text:
    """Everything known about one checkpoint, for the detail view."""
    meta = entry.meta
    text = Text()

    def row(label: str, value: Any, style: str = "") -> None:
        text.append("%-18s" % label if len(label) < 18 else label + " ", style="bold")
        text.append("%s\n" % value, style=style)

    row("Path", entry.path)
    row("Layout", "%s  (%s)" % (layout_label(entry), entry.layout))
    row("Unit", entry.unit or NA)
    row("Format", entry.format + ("  (directory)" if entry.is_dir else ""))
    if entry.series is not None:
        row("Series", entry.series + ("  (%s)" % entry.unmanaged if entry.unmanaged else ""))
    else:
        row("Series", "not managed: %s" % (entry.unmanaged or "no recognised series"), "dim")
    if entry.is_link:
        row("Link target", entry.link_target or "?")
    row("Size", "%s (%d bytes)" % (format_bytes(entry.size_bytes), entry.size_bytes))
    row(
        "Modified",
        "%s  (%s ago)" % (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.mtime)), age_text(now - entry.mtime)),
    )
    row(
        "Integrity",
        entry.integrity + ("  (full CRC check)" if entry.crc_checked else "  (quick check; v runs the CRC check)"),
        INTEGRITY_STYLES.get(entry.integrity, ""),
    )
    if entry.problem:
        row("Problem", entry.problem, "yellow")
    if entry.unreadable:
        row("Unreadable", entry.unreadable, "yellow")
    markers = marks_text(entry) or "-"
    row("Markers", markers + ("  (lowest loss)" if entry.lowest_loss else ""))
    # What keeps it, as the library recorded it, and what goes with it: a unit is deleted whole or not at all.
    for index, why in enumerate(entry.protections[:MAX_DETAIL_LINES] or ("nothing recorded",)):
        row("Protected by" if index == 0 else "", why)
    members = entry.members[:MAX_DETAIL_LINES] or (entry.name,)
    for index, member in enumerate(members):
        shown = entry.path if member == "." else member
        if entry.is_dir:
            shown += "/  (the directory and all it holds: %s)" % (entry.unit or "?")
        row("Members (whole)" if index == 0 else "", shown)
    if len(entry.members) > MAX_DETAIL_LINES:
        row("", "… and %d more" % (len(entry.members) - MAX_DETAIL_LINES), "dim")
    row("Epoch", NA if meta.epoch is None else meta.epoch)
    row("Step", NA if meta.step is None else meta.step)
    row("Loss", format_metric(meta.loss))
    row("Best loss", format_metric(meta.best_loss))
    row("Timestamp", meta.timestamp or NA)
    for key, value in meta.metrics:
        row("Metric " + key, value if isinstance(value, str) else format_metric(value))
    if meta.state_dict is not None:
        sd = meta.state_dict
        dtypes = ", ".join("%s ×%d" % (d, n) for d, n in sd.dtypes) or NA
        row(
            "State dict",
            "%d tensors, %s%s" % (sd.keys, format_bytes(sd.bytes), "  (under %r)" % sd.source if sd.source else ""),
        )
        row("  dtypes", dtypes)
    else:
        row("State dict", NA)
    row("Optimizer", _presence(meta.has_optimizer))
    row("Scheduler", _presence(meta.has_scheduler))
    if meta.tensor_count is not None:
        row("Zip storages", "%d, %s" % (meta.tensor_count, format_bytes(meta.tensor_bytes)))
    if meta.crc_recorded is False:
        row("CRC", "none recorded (every CRC is 0): a CRC check cannot verify this file", "yellow")
    if meta.unsafe_globals:
        row("Not loaded", ", ".join(meta.unsafe_globals), "yellow")
    if meta.best_checkpoint:
        row("HF best", meta.best_checkpoint)
    if meta.details:
        text.append("\nAll keys\n", style="bold underline")
        width = min(32, max(len(key) for key, _ in meta.details)) + 4
        for key, value in meta.details:
            text.append(("  " + shorten(key, width - 4)).ljust(width), style="bold")
            text.append("%s\n" % value)
    return text


MAX_DETAIL_LINES = 200  # members and protections listed in the details screen


def _presence(value: Optional[bool]) -> str:
    if value is None:
        return NA
    return "present" if value else "absent"


class CheckpointDetailScreen(ModalScreen[None]):
    """All metadata of one checkpoint; esc, enter or q closes."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="checkpoint_detail.close"),
        Binding("enter", "close", "Close", show=False),
        Binding("q", "close", "Close", show=False),
    ]
    DEFAULT_CSS = """
    CheckpointDetailScreen { align: center middle; }
    CheckpointDetailScreen > VerticalScroll {
        width: 110; max-width: 95%; height: auto; max-height: 90%;
        border: thick $accent; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, entry: CheckpointEntry, now: float) -> None:
        super().__init__()
        self.entry = entry
        self.body = printable_text(detail_text(entry, now))  # file names and metadata are data

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text(printable(self.entry.name), style="bold"), id="detail-title")
            yield Static(self.body, id="detail-body")

    def action_close(self) -> None:
        self.dismiss(None)


class CheckpointsPane(ActionKeys, TablePane):
    """Checkpoint directories and their checkpoints (see the module docstring)."""

    pane_id = "checkpoints"
    title = "Checkpoints"
    key = "7"
    filter_fields = CHECKPOINT_FILTER

    BINDINGS = [
        Binding("enter", "details", "Details", id="checkpoints.details"),
        Binding("v", "verify", "CRC check", id="checkpoints.verify"),
        Binding("u", "rescan", "Rescan", id="checkpoints.rescan"),
        Binding("d", "next_dir", "Next directory", id="checkpoints.next_dir"),
        Binding("D", "previous_dir", "Previous directory", id="checkpoints.previous_dir", show=False),
    ] + action_bindings(TARGET_CHECKPOINT_DIR)  # c: clean up, the registered action

    DEFAULT_CSS = """
    CheckpointsPane > #checkpoint-dirs { height: auto; max-height: 8; }
    CheckpointsPane > #checkpoint-list { height: 1fr; }
    CheckpointsPane > #checkpoint-warnings { height: auto; max-height: 6; padding: 0 1; color: $warning; display: none; }
    CheckpointsPane > #checkpoint-warnings.-shown { display: block; }
    CheckpointsPane > #checkpoint-progress { height: 1; display: none; padding: 0 1; }
    CheckpointsPane > #checkpoint-progress.-running { display: block; }
    CheckpointsPane #checkpoint-progress-label { width: auto; margin-right: 2; }
    """

    class Scanned(Message):
        def __init__(self, key: str, listing: DirListing) -> None:
            super().__init__()
            self.key = key
            self.listing = listing

    class CrcProgress(Message):
        def __init__(self, done: int, total: int) -> None:
            super().__init__()
            self.done = done
            self.total = total

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.listings: Dict[str, DirListing] = {}
        self.scanning: Dict[str, bool] = {}
        self.selected_dir: Optional[str] = None
        self.verifying: Optional[str] = None  # path under CRC check
        self._cancel_crc = threading.Event()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._last_scan = 0.0
        self.progress_label = Static("", id="checkpoint-progress-label", markup=False)
        self.progress = ProgressBar(total=100, show_eta=True, id="checkpoint-progress-bar")
        # What the listing says of the shown directory as a whole (two HF runs in one output_dir: which
        # checkpoint resume_from_checkpoint=True takes), wrapped above its units: a warning of a few
        # hundred characters at the end of the one-line status was cut at the terminal's width.
        self.warnings_line = Static("", id="checkpoint-warnings", markup=False)

    # --- layout ----------------------------------------------------------------------

    def make_tables(self) -> List[SortedTable]:
        # Tab switches panes, so the directory table is moved with d / D and never takes the focus.
        dir_table = DataTable(id="checkpoint-dirs", cursor_type="row", zebra_stripes=False)
        dir_table.can_focus = False
        dirs = SortedTable(dir_table, DIR_SORT_KEYS)
        ckpts = SortedTable(DataTable(id="checkpoint-list", cursor_type="row"), CKPT_SORT_KEYS)
        return [dirs, ckpts]

    @property
    def dir_table(self) -> SortedTable:
        return self.tables[0]

    @property
    def checkpoint_table(self) -> SortedTable:
        return self.tables[1]

    def compose_tables(self) -> ComposeResult:
        yield self.dir_table.table
        yield self.warnings_line
        yield self.checkpoint_table.table
        with Horizontal(id="checkpoint-progress"):
            yield self.progress_label
            yield self.progress

    def on_mount(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.dir_table.set_columns(DIR_COLUMNS)
        self.checkpoint_table.set_columns(columns_for(self.size.width))
        # No focus() here: focusing a widget of a hidden tab would make the tab bar switch to it.
        super().on_mount()

    def on_resize(self, event: events.Resize) -> None:
        """Narrow panes drop the format and age columns (the note stays readable)."""
        columns = columns_for(event.size.width)
        if [c.key for c in columns] != [c.key for c in self.checkpoint_table.columns]:
            self.checkpoint_table.set_columns(columns)
            self.redraw()

    # --- configured directories --------------------------------------------------------

    @property
    def configured(self) -> List[CheckpointDirConfig]:
        config = getattr(self.app, "config", None)
        return list(config.checkpoints) if config is not None else []

    def config_of(self, key: str) -> Optional[CheckpointDirConfig]:
        return next((c for c in self.configured if dir_key(c) == key), None)

    def filesystem_for(self, config: CheckpointDirConfig) -> FileSystem:
        """LOCAL, or the node's SFTP file system on its fleet link (made once per node)."""
        node = config.node
        if node is None:
            return LOCAL
        nodes = {n.name: n for n in self.app.config.nodes}
        if node in nodes and nodes[node].local:
            return LOCAL
        try:
            link = self.app.fleet.link(node)
        except KeyError:
            raise RuntimeError("no node named %s in this console's fleet" % node) from None
        # One per node, shared with the cleanup action (checkpoints/filesystems.py).
        return self.app.services.filesystems.get(node, link, self._loop)

    @staticmethod
    def root_of(config: CheckpointDirConfig, fs: FileSystem) -> str:
        """The directory as the file system names it: `~` expanded for a local one."""
        import os

        return config.path if fs.remote else os.path.expanduser(config.path)

    async def on_unmount(self) -> None:
        await self.app.services.filesystems.aclose()

    # --- scanning ------------------------------------------------------------------------

    def now_value(self) -> float:
        now = getattr(self.app, "now", None)
        return now() if callable(now) else time.time()

    def start_scans(self) -> None:
        """Scan every configured directory not being scanned already (each in its own worker)."""
        self._last_scan = time.monotonic()
        for config in self.configured:
            key = dir_key(config)
            if not self.scanning.get(key):
                self.scanning[key] = True
                self.scan_worker(config, key)

    def node_not_ready(self, config: CheckpointDirConfig) -> Optional[str]:
        """Why a remote directory is not scanned now: its node is not connected (None when it is).

        The fleet owns logging in: a scan must not retry a node waiting in auth or hostkey
        (retrying a wrong key can lock the account) nor hammer one that is down.
        """
        if config.node is None:
            return None
        nodes = {n.name: n for n in self.app.config.nodes}
        if config.node in nodes and nodes[config.node].local:
            return None
        state = self.app.fleet.states().get(config.node)
        if state is None or state.state in (STATE_UP, STATE_STALE, STATE_FALLBACK):
            return None
        return "node %s is %s%s: not scanned" % (
            config.node,
            state.state,
            " (%s)" % state.reason if state.reason else "",
        )

    @work(thread=True, exit_on_error=False, group="checkpoint-scan")
    def scan_worker(self, config: CheckpointDirConfig, key: str) -> None:
        from opsconsole.checkpoints.scan import scan_directory

        try:
            why_not = self.node_not_ready(config)
            if why_not:
                self.post_message(
                    self.Scanned(
                        key,
                        DirListing(
                            root=config.path, node=config.node or "local", problem=why_not, scanned_at=self.now_value()
                        ),
                    )
                )
                return
            fs = self.filesystem_for(config)
            listing = scan_directory(self.root_of(config, fs), fs, now=self.now_value())
        except Exception as exc:  # a node missing from the fleet, a bug in a reader: shown, not raised
            listing = DirListing(
                root=config.path,
                node=config.node or "local",
                problem="scan failed: %s" % exc,
                scanned_at=self.now_value(),
            )
        self.post_message(self.Scanned(key, listing))

    @on(Scanned)
    def scan_arrived(self, message: "CheckpointsPane.Scanned") -> None:
        message.stop()
        self.scanning[message.key] = False
        self.listings[message.key] = message.listing
        self.redraw()

    def action_rescan(self) -> None:
        """Scan every directory now."""
        self.start_scans()
        self.redraw()

    # --- drawing -------------------------------------------------------------------------

    def draw(self) -> List[str]:
        configured = self.configured
        if not configured:
            self.dir_table.show([], lambda r: dir_table_row(r, self.now))
            self.checkpoint_table.show(
                [], lambda e: checkpoint_table_row(e, self.now, tuple(self.checkpoint_table.columns))
            )
            if is_replayed(getattr(self.app, "fleet", None)):
                return ["a replay lists no checkpoint directory (they are this machine's as they are now)"]
            return ["no [[checkpoints]] directories configured (see config.example.toml)"]
        visible = getattr(self.app, "visible_pane_id", self.pane_id) == self.pane_id
        if visible and (not self._last_scan or time.monotonic() - self._last_scan > RESCAN_S):
            self.start_scans()  # only while shown: a console that never opens the pane never scans
        now = self.now or self.now_value()
        rows = [
            DirRow(
                dir_key(c),
                c.node or "local",
                c.path,
                self.listings.get(dir_key(c)),
                bool(self.scanning.get(dir_key(c))),
            )
            for c in configured
        ]
        self.dir_table.show(
            rows,
            lambda r: dir_table_row(r, now),
            signature=lambda r: (r, format_age(now - r.listing.scanned_at) if r.listing else None),
        )
        key = self.current_dir_key()
        listing = self.listings.get(key) if key else None
        entries = list(listing.entries) if listing else []
        shown = filter_rows(entries, self.filter, self.filter_fields)
        columns = tuple(self.checkpoint_table.columns)
        self.checkpoint_table.show(
            shown, lambda e: checkpoint_table_row(e, now, columns), signature=lambda e: (e, format_age(now - e.mtime))
        )
        parts = [self.count_part(self.checkpoint_table, "units")]
        if listing is not None and not listing.problem:
            free = NA if listing.free_bytes is None else format_bytes(listing.free_bytes)
            parts.append(
                "%d managed (%s), %d not managed (%s) in %s:%s, %s free"
                % (
                    listing.managed_count,
                    format_bytes(listing.managed_bytes),
                    listing.unmanaged_count,
                    format_bytes(listing.unmanaged_bytes),
                    listing.node,
                    listing.root,
                    free,
                )
            )
        elif listing is not None:
            parts.append(listing.problem or "")
        warnings = list(listing.warnings) if listing is not None else []
        # One line each, its text from the disk made printable (a newline in a name cannot forge a line).
        self.warnings_line.update(Text("\n".join(printable_line("warning: " + w) for w in warnings)))
        self.warnings_line.set_class(bool(warnings), "-shown")
        if warnings:
            parts.append("%d warning%s above the units" % (len(warnings), "" if len(warnings) == 1 else "s"))
        config = self.config_of(key or "")
        if config is not None:
            parts.append("cleanup keeps the newest %d, min age %s" % (config.keep, age_text(config.min_age)))
        parts.append("sort: " + self.checkpoint_table.sort_label())
        if self.verifying:
            parts.append("CRC check running (v cancels)")
        return parts

    def current_dir_key(self) -> Optional[str]:
        """The directory whose checkpoints are shown: the highlighted one, else the first."""
        table = self.dir_table.table
        if table.row_count and table.is_valid_row_index(table.cursor_row):
            return table.ordered_rows[table.cursor_row].key.value
        configured = self.configured
        return dir_key(configured[0]) if configured else None

    @on(DataTable.RowHighlighted, "#checkpoint-dirs")
    def dir_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key is not None and event.row_key.value != self.selected_dir:
            self.selected_dir = event.row_key.value
            self.redraw()

    def _step_dir(self, step: int) -> None:
        table = self.dir_table.table
        if table.row_count < 2:
            return
        table.move_cursor(row=(table.cursor_row + step) % table.row_count, animate=False)
        self.selected_dir = table.ordered_rows[table.cursor_row].key.value
        self.redraw()

    def action_next_dir(self) -> None:
        """Show the checkpoints of the next configured directory."""
        self._step_dir(1)

    def action_previous_dir(self) -> None:
        self._step_dir(-1)

    @on(DataTable.RowSelected, "#checkpoint-list")
    def checkpoint_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_details()

    def current_entry(self) -> Optional[CheckpointEntry]:
        table = self.checkpoint_table.table
        if not table.row_count or not table.is_valid_row_index(table.cursor_row):
            return None
        path = table.ordered_rows[table.cursor_row].key.value
        listing = self.listings.get(self.current_dir_key() or "")
        if listing is None:
            return None
        return next((e for e in listing.entries if e.path == path), None)

    # --- details ---------------------------------------------------------------------------

    def action_details(self) -> None:
        """Show every metadata key of the highlighted checkpoint."""
        entry = self.current_entry()
        if entry is None:
            self.app.notify("no checkpoint highlighted", severity="warning")
            return
        self.app.push_screen(CheckpointDetailScreen(entry, self.now_value()))

    # --- full CRC check ----------------------------------------------------------------------

    def action_verify(self) -> None:
        """Run the full CRC check of the highlighted checkpoint (pressed again: cancel it)."""
        from opsconsole.checkpoints.verify import can_verify

        if self.verifying:
            self._cancel_crc.set()
            self.app.notify("cancelling the CRC check of %s" % self.verifying)
            return
        entry = self.current_entry()
        key = self.current_dir_key()
        config = self.config_of(key or "")
        if entry is None or config is None:
            self.app.notify("no checkpoint highlighted", severity="warning")
            return
        why_not = can_verify(entry)
        if why_not:
            self.app.notify(why_not, severity="warning")
            return
        self.verifying = entry.path
        self._cancel_crc.clear()
        self.progress_label.update("CRC %s" % printable(shorten(entry.name, 40)))
        self.progress.update(total=max(1, entry.size_bytes), progress=0)
        self.query_one("#checkpoint-progress").add_class("-running")
        self.verify_worker(entry, config, key)
        self.redraw()

    @work(thread=True, exit_on_error=False, group="checkpoint-crc")
    def verify_worker(self, entry: CheckpointEntry, config: CheckpointDirConfig, key: str) -> None:
        from opsconsole.checkpoints.verify import verify_checkpoint
        from opsconsole.checkpoints.zipmeta import CrcResult

        last = [0.0]

        def progress(done: int, total: int) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_S or done >= total:
                last[0] = now
                self.post_message(self.CrcProgress(done, total))

        try:
            result = verify_checkpoint(entry, self.filesystem_for(config), progress, self._cancel_crc.is_set)
        except Exception as exc:
            result = CrcResult("unchecked", "CRC check failed: %s" % exc, 0, 0)
        self.app.call_from_thread(self.verify_done, entry, key, result)

    @on(CrcProgress)
    def crc_progress(self, message: "CheckpointsPane.CrcProgress") -> None:
        message.stop()
        self.progress.update(total=max(1, message.total), progress=message.done)

    def verify_done(self, entry: CheckpointEntry, key: str, result: Any) -> None:
        self.verifying = None
        self.query_one("#checkpoint-progress").remove_class("-running")
        listing = self.listings.get(key)
        if result.integrity != "unchecked" and listing is not None:
            entries = tuple(
                replace(e, integrity=result.integrity, problem=result.problem, crc_checked=True)
                if e.path == entry.path
                else e
                for e in listing.entries
            )
            self.listings[key] = replace(listing, entries=entries)
        severity = "information" if result.integrity == INTEGRITY_OK else "warning"
        if result.integrity in (INTEGRITY_CORRUPT, INTEGRITY_TRUNCATED):
            severity = "error"
        self.app.notify(
            "%s: %s%s" % (entry.name, result.integrity, ": " + result.problem if result.problem else ""),
            severity=severity,
            timeout=10,
        )
        self.redraw()

    # --- cleanup: the registered checkpoint_cleanup action (plan, typed word, runner, audit) ---------

    def action_target(self, action_id: str) -> Optional[Target]:
        """The highlighted directory, on its node (a directory without one is the local node's)."""
        config = self.config_of(self.current_dir_key() or "")
        if config is None:
            return None
        return Target(TARGET_CHECKPOINT_DIR, config.node or self.local_node_name(), path=config.path)

    def local_node_name(self) -> str:
        return next((n.name for n in self.app.config.nodes if n.local), "local")

    def after_action(self, target: Target) -> None:
        """A cleanup changed a directory: list it again."""
        if target.kind == TARGET_CHECKPOINT_DIR:
            self.action_rescan()
