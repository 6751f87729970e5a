"""The Audit pane: the audit log, newest first; enter shows a record whole (command, result, output).

The file is read again only when its size or mtime changes (after an action here, or one
by another console writing the same log), and only its tail (actions.audit.READ_TAIL_BYTES).
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from opsconsole.actions.audit import (
    OUTCOME_ATTEMPT,
    OUTCOME_CANCELLED,
    OUTCOME_FAILED,
    OUTCOME_OK,
    OUTCOME_REFUSED,
    audit_path,
    read_recent_records,
)
from opsconsole.config import DEFAULT_CONFIG
from opsconsole.model import NodeState
from opsconsole.tui.formatting import printable, shorten
from opsconsole.tui.pane import Pane

MAX_RECORDS = 500
COLUMNS = (
    ("time", "Time", 19),
    ("user", "User", 10),
    ("node", "Node", 12),
    ("action", "Action", 16),
    ("target", "Target", 18),
    ("outcome", "Outcome", 9),
    ("what", "Command / detail", None),
)
OUTCOME_STYLES = {
    OUTCOME_OK: "green",
    OUTCOME_FAILED: "bold red",
    OUTCOME_REFUSED: "yellow",
    OUTCOME_CANCELLED: "dim",
    OUTCOME_ATTEMPT: "cyan",
    "confirmed": "green",
    "unreadable": "bold red",
}


def local_time(stamp: Any) -> str:
    """An ISO time from the log as local `YYYY-MM-DD HH:MM:SS` (as written when it is not ISO)."""
    try:
        when = datetime.datetime.fromisoformat(str(stamp))
    except ValueError:
        return str(stamp or "")[:19]
    return when.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def record_cells(record: Mapping[str, Any]) -> Dict[str, str]:
    """The text of each column for one record (old records lack target/command: the detail shows)."""
    command = record.get("command") or []
    what = " ".join(str(w) for w in command) if isinstance(command, list) else str(command)
    detail = str(record.get("detail") or "")
    if what and detail and record.get("outcome") != OUTCOME_ATTEMPT:
        what = "%s  ← %s" % (what, detail)
    elif not what:
        what = detail
    return {
        "time": local_time(record.get("time")),
        "user": str(record.get("user") or ""),
        "node": str(record.get("node") or ""),
        "action": str(record.get("action") or ""),
        "target": str(record.get("target") or ""),
        "outcome": str(record.get("outcome") or ""),
        "what": " ".join(what.split())[:300],  # one line in the table; enter shows it whole
    }


def record_detail(record: Mapping[str, Any]) -> Text:
    """A record whole, for the detail screen: fields, then the result's output."""
    text = Text()
    for key in ("time", "user", "host", "node", "action", "target", "outcome", "id", "detail"):
        if key in record:
            text.append("%-12s" % key, style="bold")
            text.append(str(record[key]) + "\n")
    command = record.get("command")
    if command:
        text.append("%-12s" % "command", style="bold")
        text.append((" ".join(str(w) for w in command) if isinstance(command, list) else str(command)) + "\n")
    result = record.get("result")
    if isinstance(result, dict):
        for key in ("exit_status", "error", "timed_out", "duration_s"):
            if key in result:
                text.append("%-12s" % key.replace("_", " "), style="bold")
                text.append(str(result[key]) + "\n")
        for key in ("stdout", "stderr"):
            if result.get(key):
                text.append("\n%s:\n" % key, style="bold")
                text.append(str(result[key]).rstrip("\n") + "\n")
    other = {
        k: v
        for k, v in record.items()
        if k not in ("time", "user", "host", "node", "action", "target", "outcome", "id", "detail", "command", "result")
    }
    if other:
        text.append("\n" + json.dumps(other, ensure_ascii=False, indent=1) + "\n")
    return text


class AuditPane(Pane):
    """The audit log of this console's config, newest first; `/` filters, enter opens a record."""

    pane_id = "audit"
    title = "Audit"
    key = "0"

    DEFAULT_CSS = """
    AuditPane { height: 1fr; layout: vertical; }
    AuditPane > #audit-status { height: 1; padding: 0 1; color: $text-muted; }
    AuditPane > DataTable { height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: List[Dict[str, Any]] = []  # newest first, after the filter
        self.problem: Optional[str] = None
        self.filter_text = ""
        self._all: List[Dict[str, Any]] = []
        self._signature: Optional[Tuple[int, int]] = None

    @property
    def path(self) -> str:
        return audit_path(getattr(self.app, "config", DEFAULT_CONFIG).actions)

    def compose(self) -> ComposeResult:
        yield Static("", id="audit-status", markup=False)
        table: DataTable = DataTable(id="audit-table", cursor_type="row", zebra_stripes=True)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        yield table

    def on_mount(self) -> None:
        self.reload()

    def show(self, states: Mapping[str, NodeState], node: Optional[str], now: float) -> None:
        """Called every tick while visible: re-read only when the file changed."""
        if self._file_signature() != self._signature:
            self.reload()

    def apply_filter(self, text: str) -> None:
        self.filter_text = text or ""
        self._fill()

    def _file_signature(self) -> Optional[Tuple[int, int]]:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns

    def reload(self) -> None:
        """Read the log's tail again and redraw."""
        if not self.is_mounted:
            return
        self._signature = self._file_signature()
        self._all, self.problem = read_recent_records(self.path, MAX_RECORDS)
        self._fill()

    def _fill(self) -> None:
        if not self.is_mounted:
            return
        needle = self.filter_text.strip().lower()
        table = self.query_one("#audit-table", DataTable)
        rows = []
        for record in self._all:
            cells = record_cells(record)
            if needle and needle not in " ".join(cells.values()).lower():
                continue
            rows.append((record, cells))
        self.records = [record for record, _ in rows]
        with self.app.batch_update():
            table.clear()
            for index, (record, cells) in enumerate(rows):
                style = OUTCOME_STYLES.get(cells["outcome"], "")
                table.add_row(
                    *[
                        # A fixed column's text cut by cells with an ellipsis, as other panes cut theirs.
                        Text(
                            shorten(printable(cells[key]), width) if width else printable(cells[key]),
                            style=style if key == "outcome" else "",
                            end="",
                        )
                        for key, _, width in COLUMNS
                    ],
                    key=str(index),
                )
        status = "%d records, newest first · %s" % (len(rows), self.path)
        if needle:
            status += " · filter: %s" % self.filter_text.strip()
        if self.problem:
            status += " · " + self.problem
        elif self._signature is None:
            status += " (no actions recorded yet)"
        self.query_one("#audit-status", Static).update(Text(printable(status)))

    @on(DataTable.RowSelected, "#audit-table")
    def open_record(self, event: DataTable.RowSelected) -> None:
        event.stop()
        try:
            record = self.records[int(event.row_key.value or "")]
        except (ValueError, IndexError):
            return
        from opsconsole.tui.action_flow import ResultScreen

        title = "%s %s on %s" % (record.get("action", "?"), record.get("outcome", ""), record.get("node", "?"))
        self.app.push_screen(ResultScreen(title, record_detail(record), record.get("outcome") != OUTCOME_FAILED))
