"""One confirmation screen for every dangerous action: `y` confirms, `n`/`esc` cancel, Cancel focused.

The most dangerous actions pass `word` (k9s style): the user types it (a node name, a
PID) and presses enter; `y` alone does nothing then. With `confirm_label=None` the
screen only informs (a refusal that shows the command to run instead) and always
dismisses with False.

Keys that arrive within ARM_DELAY_S of the screen appearing are dropped: they were typed
before anyone could read the question (a paste, a burst over a laggy SSH link, `/eyes`
whose `e` opened this screen). Nothing has the focus until then, so no widget takes them.
"""

from __future__ import annotations

from typing import Optional, Union

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from opsconsole.tui.formatting import printable, printable_text


class ConfirmScreen(ModalScreen[bool]):
    """A modal question; dismisses with True only on an explicit confirmation."""

    ARM_DELAY_S = 0.5
    AUTO_FOCUS = ""  # nothing: focus is given when the screen is armed

    BINDINGS = [
        Binding("y", "confirm", "Yes", id="confirm.yes"),
        Binding("n", "cancel", "No", id="confirm.no"),
        Binding("escape", "cancel", "Cancel", id="confirm.cancel"),
    ]

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical {
        width: 110; max-width: 95%; height: auto; max-height: 90%;
        border: thick $warning; background: $surface; padding: 0 1;
    }
    ConfirmScreen.-danger > Vertical { border: thick $error; }
    ConfirmScreen #confirm-title { text-style: bold; height: auto; margin-bottom: 1; }
    ConfirmScreen #confirm-body { height: auto; }
    ConfirmScreen #confirm-word-prompt { height: auto; margin-top: 1; }
    ConfirmScreen #confirm-word { margin: 0; }
    ConfirmScreen #confirm-buttons { height: auto; margin-top: 1; align-horizontal: right; }
    ConfirmScreen Button { margin-left: 2; }
    """

    def __init__(
        self,
        title: str,
        body: Union[str, Text],
        *,
        word: Optional[str] = None,
        confirm_label: Optional[str] = "Confirm",
        cancel_label: str = "Cancel",
        danger: bool = False,
    ) -> None:
        super().__init__(classes="-danger" if danger else "")
        # Titles and bodies carry node names, command lines and paths: control characters made visible.
        self.title_text = printable(title)
        self.body = printable_text(body if isinstance(body, Text) else Text(body))
        self.word = word
        self.confirm_label = confirm_label
        self.cancel_label = cancel_label
        self.armed = False
        self.keys_dropped = 0  # keys that arrived before the screen was armed

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.title_text), id="confirm-title")
            yield Static(self.body, id="confirm-body")
            if self.word is not None and self.confirm_label is not None:
                yield Static(
                    Text.assemble("Type ", (printable(self.word), "bold"), " and press enter to confirm:"),
                    id="confirm-word-prompt",
                )
                yield Input(placeholder=printable(self.word), id="confirm-word")
            with Horizontal(id="confirm-buttons"):
                if self.confirm_label is not None:
                    yield Button(
                        self.confirm_label,
                        id="confirm-yes",
                        variant="error" if self.word else "warning",
                        disabled=self.word is not None,
                    )
                yield Button(self.cancel_label, id="confirm-no", variant="default")

    def on_mount(self) -> None:
        self.screen.set_focus(None)
        self.set_timer(self.ARM_DELAY_S, self._arm)

    def _arm(self) -> None:
        self.armed = True
        # Cancel has the focus: a stray enter or space must never confirm. With a word to
        # type, the input has it: there enter confirms only once the word matches. Given at
        # once, with `armed` (Widget.focus waits for the queued events): a key that came
        # between the two found no widget with the focus, and an enter meant for Cancel was
        # lost (seen under load).
        if self.word is not None and self.confirm_label is not None:
            self.set_focus(self.query_one("#confirm-word", Input))
        else:
            self.set_focus(self.query_one("#confirm-no", Button))

    def on_key(self, event: events.Key) -> None:
        if not self.armed:  # typed before the question could be read: neither an answer nor a binding
            self.keys_dropped += 1
            event.stop()
            event.prevent_default()

    def on_paste(self, event: events.Paste) -> None:
        if not self.armed:
            event.stop()
            event.prevent_default()

    @property
    def word_typed(self) -> bool:
        """Whether the typed word matches (always True when no word is asked for)."""
        if self.word is None:
            return True
        return self.query_one("#confirm-word", Input).value.strip() == self.word

    def action_confirm(self) -> None:
        """`y`: confirm, unless a word must be typed or the screen only informs."""
        if self.confirm_label is None or self.word is not None or not self.armed:
            return
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)

    @on(Input.Changed, "#confirm-word")
    def word_changed(self, event: Input.Changed) -> None:
        self.query_one("#confirm-yes", Button).disabled = not self.word_typed

    @on(Input.Submitted, "#confirm-word")
    def word_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.word_typed:
            self.dismiss(True)
        else:
            self.app.bell()

    @on(Button.Pressed, "#confirm-yes")
    def yes_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if self.armed and self.word_typed:
            self.dismiss(True)

    @on(Button.Pressed, "#confirm-no")
    def no_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(False)
