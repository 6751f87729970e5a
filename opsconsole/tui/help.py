"""The `?` screen: every binding with its id, key and description, from the key registry."""

from __future__ import annotations

from typing import Sequence, Tuple

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from opsconsole.tui.formatting import printable

HelpRow = Tuple[str, str, str]  # (binding id, key as typed, description)


class HelpScreen(ModalScreen[None]):
    """A modal table of the console's keys; esc or ? closes it."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="help.close"),
        Binding("question_mark", "close", "Close", show=False),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 84; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    HelpScreen #help-title { text-style: bold; height: 1; }
    HelpScreen #help-note { color: $text-muted; height: auto; }
    HelpScreen DataTable { height: auto; max-height: 30; }
    """

    def __init__(self, rows: Sequence[HelpRow], config_source: str) -> None:
        super().__init__()
        self.rows = list(rows)
        self.config_source = config_source

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Keys", id="help-title")
            table: DataTable = DataTable(id="help-table", cursor_type="row", show_cursor=False)
            table.add_column("key", key="key", width=12)
            table.add_column("binding id", key="id", width=20)
            table.add_column("what it does", key="description", width=42)
            for binding_id, key, description in self.rows:
                # Keys come from [console.keys] as typed in the config.
                table.add_row(Text(printable(key), style="bold"), Text(binding_id), Text(description), key=binding_id)
            yield table
            yield Static(
                Text(
                    'Remap a key in %s:\n[console.keys]\n"pane.gpus" = "g"\n'
                    "ctrl+p: every key as a command, and themes. esc closes." % printable(self.config_source)
                ),
                id="help-note",
            )

    def action_close(self) -> None:
        self.dismiss(None)
