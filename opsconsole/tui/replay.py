"""The console on a recording: every pane as live, a bar with the replay's clock, and its keys."""

from __future__ import annotations

import time
from typing import Optional, Tuple

from rich.text import Text
from textual.widgets import Input, Static

from opsconsole.recording.seek import SeekError, offset_text, seek_target
from opsconsole.sanitize import printable_line
from opsconsole.tui.app import OpsConsole
from opsconsole.tui.keys import REPLAY_KEYS, bindings_from_specs

_clock = offset_text  # the bar writes offsets as `g` and --at read them back


def replay_text(
    start: float,
    end: float,
    position: float,
    speed: float,
    paused: bool,
    width: int = 30,
    problem: Optional[str] = None,
) -> Text:
    """One line: REPLAY, the recording's clock, a progress bar, offset / length, speed, paused, and
    the latest part of the file that could not be read (left out: nodes keep their last good frame)."""
    span = max(end - start, 1e-9)
    done = min(max((position - start) / span, 0.0), 1.0)
    filled = int(round(done * width))
    text = Text(no_wrap=True, overflow="ellipsis", end="")
    text.append(" REPLAY ", style="bold reverse")
    text.append("  " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(position)))
    text.append("  [" + "=" * filled + "-" * (width - filled) + "]  ")
    text.append("%s / %s" % (_clock(position - start), _clock(end - start)))
    text.append("  x%g" % speed, style="bold")
    if paused:
        text.append("  PAUSED", style="bold reverse")
    elif position >= end:
        text.append("  END", style="bold")
    text.append("   actions disabled", style="italic")
    if problem:
        text.append("   unreadable part left out: " + printable_line(problem), style="bold")
    return text


class ReplayBar(Static):
    DEFAULT_CSS = """
    ReplayBar { height: 1; background: $warning 30%; color: $foreground; }
    """


class ReplayConsole(OpsConsole):
    """OpsConsole fed by a ReplayFleet; read-only whatever the config says (set by the command)."""

    BINDINGS = bindings_from_specs(REPLAY_KEYS)
    extra_key_specs = REPLAY_KEYS

    def node_count(self) -> int:
        """The nodes of the recording (its first record holds one; where play starts holds all)."""
        reader = self.fleet.reader
        return len(reader.seek(reader.first_full_time()))  # start() seeks where it plays from

    async def on_mount(self) -> None:
        self.replay_bar = ReplayBar(id="replay-bar")
        await self.query_one("#main").mount(self.replay_bar, after=self.header)
        self.seek_input = Input(
            placeholder="go to: +30s, -5m, 90, 2:25 (as the bar), 50%, 14:05:30 (enter goes, esc cancels)",
            id="replay-seek",
        )
        self.seek_input.display = False
        await self.query_one("#main").mount(self.seek_input, after=self.replay_bar)
        await super().on_mount()

    def redraw(self) -> None:
        super().redraw()
        fleet = self.fleet
        reader = fleet.reader
        bar = getattr(self, "replay_bar", None)
        if bar is not None:
            bar.update(
                replay_text(
                    reader.start,
                    reader.end,
                    reader.position,
                    fleet.speed,
                    fleet.paused,
                    problem=getattr(fleet, "problem", None),
                )
            )

    # --- keys ------------------------------------------------------------

    def action_replay_pause(self) -> None:
        self.fleet.toggle_pause()
        self.redraw()

    def action_replay_faster(self) -> None:
        self.fleet.faster()
        self.redraw()

    def action_replay_slower(self) -> None:
        self.fleet.slower()
        self.redraw()

    def action_replay_step(self, seconds: float) -> None:
        self.fleet.step(seconds)
        self.redraw()

    def action_replay_go(self, text: str) -> None:
        self._go(text)

    def check_action(self, action: str, parameters: Tuple[object, ...]) -> Optional[bool]:
        if action == "replay_goto" and (isinstance(self.focused, Input) or not self.main_screen_shown()):
            return False  # typed into an input (the seek line, the filter) or a modal screen's `g`
        return super().check_action(action, parameters)

    def action_replay_goto(self) -> None:
        self.seek_input.value = ""
        self.seek_input.display = True
        # Focus now, not after the queued events (Widget.focus defers it), as the filter line does:
        # the keys typed in the same burst as `g` (a paste, a laggy link) are the seek line's, never
        # the panes' (`g0:42` opened the Audit pane with its `0`).
        self.seek_input.screen.set_focus(self.seek_input, scroll_visible=False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input is not self.seek_input:
            return  # the filter line: the app handles it
        event.stop()
        if self._go(event.value):
            self._close_seek()

    def _go(self, text: str) -> bool:
        reader = self.fleet.reader
        try:
            target = seek_target(text, reader.start, reader.end, reader.position)
        except SeekError as exc:
            self.notify(str(exc), severity="warning")
            return False
        self.fleet.seek(target)
        self.redraw()
        return True

    def _close_seek(self) -> None:
        self.seek_input.display = False
        self.focus_pane(self.visible_pane_id)

    def action_back(self) -> None:
        if getattr(self, "seek_input", None) is not None and self.seek_input.display:
            self._close_seek()
            return
        super().action_back()

    def seek_position(self) -> Optional[float]:
        return self.fleet.reader.position
