"""The `?` screen: every binding with its id, key and description, from the key registry."""

from __future__ import annotations

from typing import Sequence, Tuple

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from opsconsole.tui.formatting import printable

HelpRow = Tuple[str, str, str]  # (binding id, key as typed, description)

# Around the table: the box's border and padding (4), each column's cell padding (3 x 2), the vertical scrollbar (2).
HELP_CHROME = 4 + 6 + 2
MIN_DESCRIPTION = 20


class HelpScreen(ModalScreen[None]):
    """A modal table of the console's keys; esc or ? closes it."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="help.close"),
        Binding("question_mark", "close", "Close", show=False),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: auto; max-width: 100%; height: 90%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    HelpScreen #help-title { text-style: bold; height: 1; }
    HelpScreen #help-note { color: $text-muted; height: auto; }
    HelpScreen DataTable { height: 1fr; }  /* the rest is the note's: at 80x24 a table of auto height pushed it off */
    """

    def __init__(self, rows: Sequence[HelpRow], config_source: str) -> None:
        super().__init__()
        self.rows = list(rows)
        self.config_source = config_source

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("Keys", id="help-title")
            table: DataTable = DataTable(id="help-table", cursor_type="row", show_cursor=False)
            # Columns as wide as their longest entry; the description takes what the terminal leaves and
            # wraps there (fixed widths 12/20/42 cut ids and descriptions, and the 84-cell box ran off 80).
            keys = [printable(key) for _, key, _ in self.rows]
            key_width = max([len("key")] + [cell_len(key) for key in keys])
            id_width = max([len("binding id")] + [cell_len(binding_id) for binding_id, _, _ in self.rows])
            longest = max([len("what it does")] + [cell_len(description) for _, _, description in self.rows])
            room = self.app.size.width - HELP_CHROME - key_width - id_width
            description_width = max(MIN_DESCRIPTION, min(longest, room))
            table.add_column("key", key="key", width=key_width)
            table.add_column("binding id", key="id", width=id_width)
            table.add_column("what it does", key="description", width=description_width)
            for (binding_id, _, description), key in zip(self.rows, keys):
                # Keys come from [console.keys] as typed in the config.
                table.add_row(
                    Text(key, style="bold"),
                    Text(binding_id),
                    Text(description),
                    key=binding_id,
                    height=None if cell_len(description) > description_width else 1,
                )
            table.styles.width = key_width + id_width + description_width + HELP_CHROME - 4
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
