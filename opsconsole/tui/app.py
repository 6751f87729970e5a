"""The console app: header, tab bar of panes, filter line, footer; fed by a fleet."""

from __future__ import annotations

import asyncio
import importlib
import os
import time
from dataclasses import replace
from functools import lru_cache, partial
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterator,
    List,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    Type,
)

from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult, SystemCommand
from textual.command import CommandPalette, DiscoveryHit, Hit, Hits, Matcher, Provider
from textual.containers import Vertical
from textual.content import Content
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Footer, Input, TabbedContent, TabPane

from opsconsole import launch_gc
from opsconsole.audit_outcomes import OUTCOME_FAILED, OUTCOME_OK
from opsconsole.config import Config
from opsconsole.health.monitor import HealthMonitor
from opsconsole.launch_trace import mark
from opsconsole.model import STATE_FALLBACK, STATE_STALE, STATE_UP, NodeState, frozen
from opsconsole.tui import bars
from opsconsole.tui.formatting import printable
from opsconsole.tui.header import ConsoleHeader, header_text
from opsconsole.tui.keys import (
    APP_KEYS,
    KeySpec,
    bindings_from_specs,
    display_key,
    effective_key,
    keymap_from_config,
    pane_binding_specs,
    pane_key_specs,
)
from opsconsole.tui.pane import Pane
from opsconsole.tui.services import ConsoleServices
from opsconsole.tui.tab_labels import fit_tab_labels
from opsconsole.tui.themes import (
    DEFAULT_THEME,
    ThemePicker,
    choose_theme,
    drop_builtin_themes,
    load_console_themes,
    save_theme,
)

if TYPE_CHECKING:
    from opsconsole.actions.audit import AuditLog
    from opsconsole.tui.help import HelpRow  # the help screen's module loads with the first `?`


@frozen
class PaneEntry:
    """A pane of the registry: its id, title and key, and where its class is, imported when first shown.

    A console opens one pane; the others' modules (logs, checkpoints, health ...) and widgets cost
    launch time and memory only once someone looks at them. tests/test_tui_overview.py checks that
    each entry's words match its class's.
    """

    module: str
    class_name: str
    pane_id: str
    title: str
    key: str

    def load(self) -> Type[Pane]:
        return getattr(importlib.import_module(self.module), self.class_name)


# The pane registry: tab order, number keys and `pane.<id>` bindings all come from it.
PANES: List[PaneEntry] = [
    # key o: the first pane of a single-node console, and what enter on a node opens
    PaneEntry("opsconsole.tui.overview", "OverviewPane", "overview", "Overview", "o"),
    PaneEntry("opsconsole.tui.gpus", "GpusPane", "gpus", "GPUs", "1"),
    PaneEntry("opsconsole.tui.processes", "ProcessesPane", "processes", "Processes", "2"),
    PaneEntry("opsconsole.tui.host", "HostPane", "host", "Host", "3"),
    PaneEntry("opsconsole.tui.nodes", "NodesPane", "nodes", "Nodes", "4"),
    PaneEntry("opsconsole.tui.cluster", "ClusterGpusPane", "cluster", "Cluster GPUs", "5"),
    PaneEntry("opsconsole.tui.logs", "LogsPane", "logs", "Logs", "6"),
    PaneEntry("opsconsole.tui.checkpoints", "CheckpointsPane", "checkpoints", "Checkpoints", "7"),
    PaneEntry("opsconsole.tui.health", "HealthPane", "health", "Health", "8"),
    PaneEntry("opsconsole.tui.alerts", "AlertsPane", "alerts", "Alerts", "9"),
    PaneEntry("opsconsole.tui.audit", "AuditPane", "audit", "Audit", "0"),
]
PANE_IDS = {entry.pane_id: entry for entry in PANES}
# Keys of what the console keeps beside the panes (recording, incident report).
SERVICE_KEYS: Tuple[KeySpec, ...] = (
    KeySpec("app.record", "ctrl+r", "record", "Start / stop recording to a file", footer="Record"),
    KeySpec("app.report", "ctrl+e", "report", "Write an incident report (tar.gz)", footer="Report"),
)


class Panes(dict):
    """The console's panes by id. `panes[id]` makes a pane not made yet (imports its module and
    mounts it in its tab); `get` and `in` see only the panes made so far, so a redraw or a focus
    change never loads a pane nobody asked for."""

    def __init__(self, make: Callable[[str], Optional[Pane]]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, pane_id: str) -> Pane:
        pane = self._make(pane_id)
        if pane is None:
            raise KeyError(pane_id)
        return pane


# The app's own bindings (pane bindings live on the panes): known without importing any pane.
APP_KEY_SPECS: Tuple[KeySpec, ...] = APP_KEYS + SERVICE_KEYS + pane_key_specs(PANES)


@lru_cache(maxsize=1)
def all_key_specs() -> Tuple[KeySpec, ...]:
    """Every binding, the panes' own included (imports every pane: for help, palette and keymaps)."""
    return APP_KEY_SPECS + pane_binding_specs([entry.load() for entry in PANES])


def __getattr__(name: str):
    # KEY_SPECS stays importable by name, built on first use rather than at import.
    if name == "KEY_SPECS":
        return all_key_specs()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


MIN_WIDTH = 80
MIN_HEIGHT = 20
REDRAW_DELAY_S = 0.1  # fleet changes within this window make one redraw
PROGRESS_CHECK_S = 5.0  # how often the logs' progress is judged (hangs take minutes, stragglers a minute)
TICK_S = 1.0  # clock and frame ages move even when no frame arrives
LAUNCH_GC_S = 3.0  # the longest the launch goes without cyclic collections (launch_gc.py)
# The local node's host process list: read every poll while a pane shows it (or a recording runs),
# every HOST_PROCESSES_EVERY_HIDDEN-th poll otherwise (the health rules that read it judge a span).
HOST_PROCESS_PANES = frozenset(("processes", "host"))
HOST_PROCESSES_EVERY_HIDDEN = 5
MAX_HELD_KEYS = 64  # keys kept for a pane being shown (hold_keys_for)
FILTER_CLOSING = "filter closing"  # hold_keys_for's name for the keys typed behind the filter's enter
HOLD_KEYS_S = 2.0  # a pane that takes longer to be shown gets the keys typed meanwhile no longer


class FleetLike(Protocol):
    """What the console needs of a fleet: opsconsole.nodes.fleet.Fleet, the ReplayFleet of a recording,
    or a test fake. Optional extras read with getattr: `slurm_run` (a followed Slurm job), `problem`
    (what a replay could not read)."""

    def states(self) -> Dict[str, NodeState]: ...

    async def start(self, on_change: Callable[[NodeState], None]) -> None: ...

    async def stop(self) -> None: ...

    def totals(self, now: float): ...

    @property
    def names(self) -> List[str]: ...

    def link(self, name: str) -> Any:
        """Node `name`'s link, for actions, log tails and SFTP; KeyError when it has none (a replay)."""
        ...

    async def retry(self, name: str) -> bool:
        """Ask node `name` to try connecting again now; False when it cannot."""
        ...


# Keys that change something but are no registered action (T writes known_hosts): read-only hides them too.
READ_ONLY_HIDDEN_KEYS = frozenset({"node.trust_hostkey"})


def hidden_binding_ids(config: Config) -> FrozenSet[str]:
    """The bindings of the actions this console does not offer. Only a read-only console hides any
    (actions.registry.allowed), so the others start without importing every action's module."""
    if not config.console.read_only:
        return frozenset()
    from opsconsole.actions.registry import hidden_binding_ids as hidden_actions

    return hidden_actions(config) | READ_ONLY_HIDDEN_KEYS


def tab_id(pane_id: str) -> str:
    return "tab-" + pane_id


class TooSmall(Widget):
    """Shown instead of the layout when the terminal is under MIN_WIDTH x MIN_HEIGHT."""

    def render(self) -> Text:
        width, height = self.app.size
        return Text("terminal too small: need %dx%d, have %dx%d" % (MIN_WIDTH, MIN_HEIGHT, width, height))


class ConsoleCommands(Provider):
    """The command palette over the key registry (every binding is a command) and the themes."""

    def _commands(self) -> Iterator[Tuple[str, Callable[[], object], str]]:
        app = self.app
        assert isinstance(app, OpsConsole)
        visible = app.visible_pane_id
        for spec in app.key_specs:
            if spec.id in app.hidden_binding_ids:
                continue  # read-only: dangerous actions are absent, not just refused
            key = display_key(effective_key(spec, app.keymap))
            if not spec.scope:
                yield spec.description, partial(app.run_action, spec.action), "%s  (%s)" % (spec.id, key)
            elif spec.scope == visible:
                pane = app.panes[spec.scope]
                yield spec.description, partial(pane.run_action, spec.action), "%s  (%s)" % (spec.id, key)
        for name in sorted(app.available_themes):
            if name == "textual-ansi":
                continue
            yield "Theme: %s" % name, partial(app.pick_theme, name), "switch the colour theme (kept for the next start)"

    # The palette reads a str prompt or help as markup, and so does Matcher.highlight: a key from
    # [console.keys] or a theme's name holding "[/x]" raised MarkupError and took the console down.
    # Both go as Content, which is drawn as it is.

    async def discover(self) -> Hits:
        for text, command, help_text in self._commands():
            yield DiscoveryHit(Content(printable(text)), command, text=text, help=Content(printable(help_text)))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for text, command, help_text in self._commands():
            score = max(matcher.match(text), matcher.match(help_text))
            if score > 0:
                yield Hit(score, plain_highlight(matcher, text), command, text=text, help=Content(printable(help_text)))


def plain_highlight(matcher: Matcher, text: str) -> Content:
    """`text` with the letters `matcher` matched highlighted, as Matcher.highlight does, without markup."""
    content = Content(printable(text))
    _, offsets = matcher.fuzzy_search.match(matcher.query, text)
    for offset in offsets:
        if not text[offset].isspace():
            content = content.stylize(matcher.match_style, offset, offset + 1)
    return content


class OpsConsole(App[int]):
    """The console: one header, a tab per pane, a `/` filter line and a footer."""

    CSS_PATH = "app.tcss"
    TITLE = "opsconsole"
    BINDINGS = bindings_from_specs(APP_KEY_SPECS)
    extra_key_specs: Tuple[KeySpec, ...] = ()  # a subclass (the replay console) adds its own
    COMMANDS = App.COMMANDS | {ConsoleCommands}

    def __init__(self, config: Config, fleet: FleetLike, *, now: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.config = config
        self.fleet = fleet
        self.now = now
        self.node: Optional[str] = None  # the node drilled into; None = all nodes
        self.panes: Dict[str, Pane] = Panes(self.ensure_pane)
        # Checking [console.keys] needs every pane's bindings; without it no pane is imported here.
        self.keymap = keymap_from_config(config.console.keys, self.key_specs) if config.console.keys else {}
        self._pane_filters: Dict[str, str] = {}
        self._redraw_timer: Optional[Timer] = None
        self._first_frame_drawn = False  # the first frame with data (the benchmarks' launch measure)
        self._notes: List[Tuple[str, str]] = []  # (message, severity) to show once mounted
        self._audit: Optional[AuditLog] = None  # opened on the first action
        self.log_feed = None  # a LogFeed following [logs] paths once mounted
        self.services = ConsoleServices(config, now)
        self.health = HealthMonitor(config, now)  # rules on each fleet change; the Health pane and header read it
        self._action_flow = None  # made on first use (it imports every action)
        self._pane_mounts: Dict[str, asyncio.Future] = {}  # panes being mounted on first show (ensure_pane)
        self._keys_held_for: Optional[str] = None  # a pane being shown: keys wait until it has the focus
        self._held_keys: List[events.Key] = []  # typed meanwhile (on_event)
        self._filter_enter: Optional[events.Key] = None  # the `enter` that closes the filter line (on_event)
        self._first_pane: Optional[str] = None
        self._last_redraw = 0.0  # time.monotonic() of the last redraw
        self._drew_data = False  # a redraw has had a frame to draw
        self._first_draw_queued = False  # the first frame's redraw is queued (one for all the first states)
        self.hidden_binding_ids = hidden_binding_ids(config)  # read-only: absent from keys, help, palette
        # Mounted on the first `/`, above the footer: an Input on the first screen cost the launch
        # ~10 ms on the VM (its stylesheet's rules parsed and applied, its mount), hidden until then.
        self.filter_input = Input(placeholder="filter (enter keeps it, esc clears it)", id="filter")
        self._install_themes(config.console.theme)

    # --- set-up ------------------------------------------------------------

    def _install_themes(self, wanted: str) -> None:
        themes, problems = load_console_themes()  # shipped, then $XDG_CONFIG_HOME/opsconsole/themes
        for theme in themes:
            self.register_theme(theme)
        self._notes += [(problem, "error") for problem in problems]
        fallback = DEFAULT_THEME if DEFAULT_THEME in self.available_themes else "textual-dark"
        name, message = choose_theme(wanted, list(self.available_themes), fallback)
        if message:
            self._notes.append((message, "warning"))
        self._start_with_theme(name)
        drop_builtin_themes(self)

    def _start_with_theme(self, name: str) -> None:
        """Theme `name` before the app runs, without `self.theme = name`: its watcher leaves a
        refresh_css for the first message, which parses the whole stylesheet a second time and
        restyles every widget of the first screen (4 ms of the launch on the VM; an app that keeps
        Textual's default theme never pays it). Nothing is read or drawn yet, so the stylesheet takes
        the theme's variables before it is first parsed, and the app the classes and ANSI colours
        the watcher gives it; a theme picked later (pick_theme) goes through the watcher."""
        self.set_reactive(App.theme, name)
        theme = self.current_theme
        classes = {old: False for old in self.classes if old.startswith("-theme-")}
        classes.update({"-theme-" + theme.name: True, "-dark-mode": theme.dark, "-light-mode": not theme.dark})
        self.update_classes(classes, update=False)
        self._refresh_truecolor_filter(self.ansi_theme)
        self.stylesheet.set_variables(self.get_css_variables())

    def pick_theme(self, name: str) -> None:
        """A theme the user picked (ctrl+t, palette): used now and kept for the next start."""
        self.theme = name
        problem = save_theme(name)
        if problem:
            self.notify(problem, severity="warning", timeout=8)

    def get_system_commands(self, screen: Screen) -> Iterator[SystemCommand]:
        """Textual's palette commands less its "Quit", which doubled the console's (app.quit, listed with its key)."""
        return (command for command in super().get_system_commands(screen) if command.title != "Quit")

    def action_change_theme(self) -> None:
        """ctrl+t: the console's themes only (Textual's picker listed its own 20-odd)."""
        self.push_screen(CommandPalette(providers=[ThemePicker], placeholder="Search for themes…"))

    def compose(self) -> ComposeResult:
        with Vertical(id="main"):
            self.header = ConsoleHeader(id="header")
            yield self.header
            first = self.first_pane_id()
            with TabbedContent(id="panes", initial=tab_id(first)):
                for entry in PANES:
                    # Only the first pane is made now; the others when first shown (ensure_pane).
                    with TabPane("%s %s" % (entry.key, entry.title), id=tab_id(entry.pane_id)):
                        if entry.pane_id == first:
                            pane = entry.load()()
                            self.panes[entry.pane_id] = pane
                            yield pane
            # The filter line (self.filter_input) is mounted here on the first `/` (_mount_filter).
            yield Footer(compact=True)  # every key of a busy pane fits at 160 columns
        yield TooSmall(id="too-small")

    def get_default_screen(self) -> Screen:
        # No auto-focus on the first screen: Textual would focus the tab bar, restyle it, and the
        # pane's own widget would take the focus from it a moment later (on_mount), a second
        # restyle before the first frame. focus_pane gives it to the pane once; after that the
        # screen auto-focuses as any other (a modal closing with nothing focused, say).
        screen: Screen = Screen(id="_default")
        screen.AUTO_FOCUS = ""  # type: ignore[misc]
        return screen

    def on_resize(self, event: events.Resize) -> None:
        width, height = event.size
        # One class, set only when the terminal is too small: Textual's breakpoints gave the screen
        # a class at every start (-wide-enough), which restyled every widget once more.
        if self.screen_stack:
            self.screen_stack[0].set_class(width < MIN_WIDTH or height < MIN_HEIGHT, "-too-small")
        self.fit_tabs(width)

    def fit_tabs(self, width: int) -> None:
        """Tab labels that fit `width`: every pane stays in sight at 80 columns (tab_labels.py)."""
        tabs = getattr(self, "tabs", None)
        if tabs is None:
            return
        labels, compact = fit_tab_labels(PANES, width)
        for pane_id, label in labels.items():
            try:
                tab = tabs.get_tab(tab_id(pane_id))
            except Exception:  # a pane without a tab
                continue
            if str(tab.label) != label:
                tab.label = label
        tabs.set_class(compact, "-compact-tabs")

    def first_pane_id(self) -> str:
        """One node: its overview (GPUs, processes and host on one screen); several: every GPU."""
        if self._first_pane is None:
            self._first_pane = "overview" if self.node_count() == 1 else "gpus"
        return self._first_pane

    def node_count(self) -> int:
        """How many nodes the console watches (known before the first frame)."""
        return len(self.fleet.states())

    def ensure_pane(self, pane_id: str) -> Optional[Pane]:
        """The pane `pane_id`, imported and mounted in its tab the first time it is asked for.

        Synchronous, so a key, a drill or a test can show a pane in one call: the mount goes on
        in the message loop and the pane is drawn (and focused, if shown) once it is in place.
        """
        pane = self.panes.get(pane_id)
        entry = PANE_IDS.get(pane_id)
        if pane is None and entry is not None:
            pane = entry.load()()
            self.panes[pane_id] = pane
            mounted = self.query_one("#" + tab_id(pane_id), TabPane).mount(pane)
            self._pane_mounts[pane_id] = asyncio.ensure_future(self._draw_when_mounted(mounted, pane_id))
        return pane

    async def _draw_when_mounted(self, mounted, pane_id: str) -> None:
        await mounted
        self._pane_mounts.pop(pane_id, None)
        if getattr(self, "_exit", False):
            return
        if pane_id == self.visible_pane_id:
            self.redraw()
            self.focus_pane(pane_id)

    async def on_event(self, event: events.Event) -> None:
        # Between a key that shows another pane and that pane taking the focus (at once when it is
        # mounted, after its mount on a first show) nothing holds the focus, so a key typed in the
        # same burst (`v` right after `2`) would find no pane to take it: it waits (release_keys).
        # Caught as it comes in, and as it comes back unhandled from the widget that had the focus
        # when it was typed: a burst is handed to that widget before the first key's binding runs.
        if (
            isinstance(event, events.Key)
            and self._keys_held_for is not None
            and self.main_screen_shown()  # not a modal one
            and len(self._held_keys) < MAX_HELD_KEYS
            and event is not self._filter_enter  # on its way back to the app, where the input's binding runs
        ):
            self._held_keys.append(events.Key(event.key, event.character))
            return
        closing = (
            isinstance(event, events.Key)
            and event.key == "enter"
            and self.focused is self.filter_input
            and self.filter_input.has_class("-open")
        )
        if closing:
            self._filter_enter = event
        await super().on_event(event)
        if closing:
            # `enter` keeps the filter: the filter line closes when its Submitted comes back, after
            # the keys typed behind it were routed, so `marker<enter>/eyes` gave `/eyes` to the line
            # as text. They wait for the close, then find the pane and `/` opens the filter again.
            self.hold_keys_for(FILTER_CLOSING)

    def hold_keys_for(self, pane_id: str) -> None:
        """Keep the keys typed from now until pane `pane_id` has the focus (or HOLD_KEYS_S at most)."""
        self._keys_held_for = pane_id
        self.set_timer(HOLD_KEYS_S, partial(self.release_keys, pane_id))

    def release_keys(self, pane_id: str) -> None:
        """Pane `pane_id` can take keys now: the ones typed meanwhile go again, in their order."""
        if self._keys_held_for != pane_id:
            return
        self._keys_held_for = None
        keys, self._held_keys = self._held_keys, []
        for key in keys:
            self.post_message(key)

    @property
    def key_specs(self) -> Tuple[KeySpec, ...]:
        return all_key_specs() + self.extra_key_specs

    @property
    def action_flow(self):
        """The registered actions (opsconsole/actions/registry.py), loaded with the first pane that offers one."""
        if self._action_flow is None:
            from opsconsole.tui.action_flow import ActionFlow

            self._action_flow = ActionFlow(self)
        return self._action_flow

    async def on_mount(self) -> None:
        mark("app mounted")
        self.tabs = self.query_one("#panes", TabbedContent)
        self.fit_tabs(self.size.width)
        if self.keymap:
            self.set_keymap(self.keymap)
        for message, severity in self._notes:
            self.notify(message, severity=severity, timeout=10)
        self.services.announce = self.announce_alert
        self.services.report_problem = lambda message: self.notify(message, severity="warning", timeout=8)
        self.sync_host_process_reads()
        await self.fleet.start(self.on_fleet_change)  # polls run in their own tasks and threads
        self.redraw()
        self.focus_pane(self.visible_pane_id)
        self.screen_stack[0].AUTO_FOCUS = None  # type: ignore[misc]  # the app's again (get_default_screen)
        self.set_interval(TICK_S, self.tick)
        # Collections resume with the first frame with data (_say_first_frame_drawn); a console
        # whose nodes send none for a while gets them back after LAUNCH_GC_S all the same.
        self.set_timer(LAUNCH_GC_S, partial(launch_gc.resume, True))
        # The first screen is drawn before the log followers (and the Logs pane they feed) start.
        self.call_after_refresh(self.start_log_feed)

    async def start_log_feed(self) -> None:
        """Follow the [logs] paths into the Logs pane (nothing without them)."""
        if not (self.config.logs.paths or self.config.logs.node_paths) or getattr(self, "_exit", False):
            return
        from opsconsole.tui.logs import start_log_feed

        self.ensure_pane("logs")
        await asyncio.gather(*self._pane_mounts.values())
        self.log_feed = await start_log_feed(self)
        if self.log_feed is not None:
            self.set_interval(PROGRESS_CHECK_S, self.check_log_progress)

    def check_log_progress(self) -> None:
        """Hangs and stragglers from how the logs advance: shown under the Logs pane, and alerted."""
        if self.log_feed is None:
            return
        for finding, node in self.log_feed.check_progress(self.fleet.states()):
            self.services.observe_finding(finding, node)
        pane = self.panes.get("logs")
        if pane is not None:
            pane.redraw_findings()

    async def on_unmount(self) -> None:
        if self.log_feed is not None:
            await self.log_feed.stop()  # before the fleet: remote tails use its connections
        await self.fleet.stop()
        await self.services.close()

    # --- feeding -----------------------------------------------------------

    def on_fleet_change(self, state: NodeState) -> None:
        """Called by the fleet for every new state: history, alerts and recording take it; one redraw follows."""
        self.services.observe(state)
        self.services.observe_health([r for r in self.health.observe(state) if r.check != "node_reachable"])
        if not self._drew_data and state.frame is not None:
            # The first frame with data is drawn at once: the first screen waits for it. Once: the first
            # states of every node come together (a replay's start, a fleet's first tick), and a redraw
            # queued for each drew every node's rows N times (a 250-node recording took 66 s to open).
            if not self._first_draw_queued:
                self._first_draw_queued = True
                self.call_next(self.redraw)
        elif self._redraw_timer is None:
            # Later changes within REDRAW_DELAY_S make one redraw.
            self._redraw_timer = self.set_timer(REDRAW_DELAY_S, self._redraw_changes)

    def _redraw_changes(self) -> None:
        """The coalesced redraw of fleet changes, unless another redraw has drawn them since."""
        if self._redraw_timer is not None:
            self.redraw()

    def tick(self) -> None:
        """Once a second the clock and the ages move: a redraw, unless a frame's redraw has just
        drawn them (a local node's frames come each second too: one redraw a second, not two)."""
        if time.monotonic() - self._last_redraw >= 0.9 * TICK_S:
            self.redraw()

    def redraw(self) -> None:
        """Draw the header and the visible pane from the fleet's current states."""
        # This draws the changes a pending coalesced redraw waits for: it is not needed any more.
        # Under load the clock's tick came between the changes and their timer, and the same
        # changes were drawn twice. (A timer that fired just before has its call queued:
        # _redraw_changes then finds no pending redraw and draws nothing.)
        pending, self._redraw_timer = self._redraw_timer, None
        if pending is not None:
            pending.stop()
        self._last_redraw = time.monotonic()
        self._drew_data = self._drew_data or any(state.frame for state in self.fleet.states().values())
        self._first_draw_queued = False  # drawn; if it found no frame after all, the next one queues again
        if getattr(self, "_exit", False):
            return  # closing: the timer may still tick while the screen's widgets are removed
        states = self.fleet.states()
        now = self.now()
        palette = bars.palette_from_variables(self.theme_variables)
        totals = replace(self.fleet.totals(now), alerts=sum(self.services.alerts.counts().values()))
        text = header_text(
            self.config,
            states,
            totals,
            self.node,
            now,
            palette,
            health_failures=self.health.failing(),
            health_errors=self.health.erroring(),
            width=self.header.size.width or None,
            recording=self.services.recorder is not None,
        )
        self.header.show(text)
        pane = self.panes.get(self.visible_pane_id)
        if pane is not None:
            pane.show(states, self.node, now)
        if not self._first_frame_drawn and any(state.frame for state in states.values()):
            self._first_frame_drawn = True
            self.call_after_refresh(self._say_first_frame_drawn)

    def _say_first_frame_drawn(self) -> None:
        """The first frame with data is on screen: the launch trace's last mark, and the file
        benchmarks/startup.py and vs_nvitop.py wait for (OPSCONSOLE_FIRST_FRAME_FILE)."""
        mark("first frame drawn")
        path = os.environ.get("OPSCONSOLE_FIRST_FRAME_FILE")
        if path:
            open(path, "w").close()
        launch_gc.resume(freeze=True)  # its one full collection after the frame is on screen

    @property
    def visible_pane_id(self) -> str:
        active = self.tabs.active if hasattr(self, "tabs") else ""
        return active[len("tab-") :] if active.startswith("tab-") else self.first_pane_id()

    @on(TabbedContent.TabActivated)
    def pane_became_visible(self, event: TabbedContent.TabActivated) -> None:
        self.close_filter(clear=False)
        self.ensure_pane(self.visible_pane_id)  # a tab clicked before its pane was made
        self.sync_host_process_reads()
        self.redraw()
        self.focus_pane(self.visible_pane_id)

    def sync_host_process_reads(self) -> None:
        """Tell the local node how often to read its host process list: each poll while a pane
        shows it or a recording runs, else every HOST_PROCESSES_EVERY_HIDDEN-th (a GPU node's
        hundreds of processes are the probe's costliest read after NVML; the overview shows only
        GPU processes, which every poll reads)."""
        wanted = self.visible_pane_id in HOST_PROCESS_PANES or self.services.recorder is not None
        every = 1 if wanted else HOST_PROCESSES_EVERY_HIDDEN
        for name in self.fleet.names:
            link = self._link_of(name)  # None for a replay's nodes
            if hasattr(link, "host_processes_every"):
                link.host_processes_every = every  # type: ignore[union-attr]

    def focus_pane(self, pane_id: str) -> None:
        pane = self.panes.get(pane_id)
        if pane is None:
            return
        # The first widget of the pane that can take the focus and is shown (the focus chain skips
        # hidden ones: the Processes pane's other table, say). At once, not after the queued events
        # (Widget.focus waits): the keys typed right after closing the filter are the pane's.
        if pane_id in self._pane_mounts:
            return  # not in place yet: focused once mounted (_draw_when_mounted)
        screen = pane.screen
        for widget in screen.focus_chain:
            if pane in widget.ancestors:
                screen.set_focus(widget)
                break
        self.release_keys(pane_id)

    # Named for NodesPane.Drill, TrustHostKey and ConnectNow (Textual's handler names), so the
    # Nodes pane is imported only when it is shown.
    def on_nodes_pane_drill(self, message) -> None:
        self.node = message.node
        self.action_show_pane("overview")
        self.redraw()

    # --- host keys -----------------------------------------------------------

    def on_nodes_pane_trust_host_key(self, message) -> None:
        message.stop()
        self.ask_to_trust_host_key(message.node)

    async def on_nodes_pane_connect_now(self, message) -> None:
        message.stop()
        await self.connect_now(message.node)

    async def connect_now(self, name: str) -> None:
        """`c` on a node: one login attempt now. A node in `auth` or `hostkey` waits for this (or for
        the user's keys or known_hosts to change); one that is down skips the rest of its backoff."""
        state = self.fleet.states().get(name)
        if state is not None and state.state in (STATE_UP, STATE_STALE, STATE_FALLBACK):
            self.notify("%s is %s: already connected" % (name, state.state))
            return
        if not await self.fleet.retry(name):
            self.notify("%s: nothing to connect (a replayed or local node)" % name, severity="warning")
            return
        self.notify("%s: connecting now" % name)

    def ask_to_trust_host_key(self, name: str) -> None:
        """`T` on a node: the trust action (actions/trust_hostkey.py) plans it; the console shows the key
        and the known_hosts line and asks, or shows why not."""
        from opsconsole.actions.plan import Refused
        from opsconsole.actions.trust_hostkey import plan_trust_action
        from opsconsole.tui.confirm import ConfirmScreen

        try:
            plan = plan_trust_action(
                name, self.fleet.states().get(name), self._link_of(name), self.config.console.read_only, self.audit
            )
        except Refused as refusal:
            self.notify(str(refusal), severity="warning")
            return
        if plan.changed:
            self.push_screen(
                ConfirmScreen(
                    "HOST KEY CHANGED for %s: not trusted" % name,
                    changed_key_text(plan),
                    confirm_label=None,
                    cancel_label="Close",
                    danger=True,
                )
            )
            return
        self.push_screen(
            ConfirmScreen("Trust the host key of %s?" % name, trust_text(plan), confirm_label="Trust and connect"),
            callback=partial(self._trust_answered, plan),
        )

    async def _trust_answered(self, plan, confirmed: Optional[bool]) -> None:
        from opsconsole.actions.trust_hostkey import answer

        outcome, message = answer(plan, bool(confirmed), self.audit)
        if outcome == OUTCOME_FAILED:
            self.notify(message, severity="error", timeout=10)
            return
        self.notify(message)
        if outcome == OUTCOME_OK:
            await self.fleet.retry(plan.node)

    def _link_of(self, name: str) -> object:
        try:
            return self.fleet.link(name)
        except KeyError:
            return None

    def audit(self, action: str, node: str, detail: str, outcome: str) -> bool:
        """Write one audit record; a failure is shown, never raised. True when it was written."""
        if self._audit is None:
            from opsconsole.actions.audit import AuditLog, audit_path

            self._audit = AuditLog(audit_path(self.config.actions))
        problem = self._audit.write(action, node, detail, outcome)
        if problem:
            self.notify(problem, severity="error", timeout=10)
        return not problem

    # --- key registry --------------------------------------------------------

    def help_rows(self) -> List[HelpRow]:
        """Every binding as (id, key as typed after remapping, description); a pane key shared by
        several panes (table.sort) is one row naming them all."""
        rows: Dict[str, List] = {}
        titles = {cls.pane_id: cls.title for cls in PANES}
        for spec in self.key_specs:
            if spec.id in self.hidden_binding_ids:
                continue
            if spec.id in rows:
                rows[spec.id][3].append(titles[spec.scope])
                continue
            description = spec.description.split(": ", 1)[1] if spec.scope else spec.description
            scopes = [titles[spec.scope]] if spec.scope else []
            rows[spec.id] = [spec.id, display_key(effective_key(spec, self.keymap)), description, scopes]
        return [
            (binding_id, key, "%s (%s)" % (description, ", ".join(scopes)) if scopes else description)
            for binding_id, key, description, scopes in rows.values()
        ]

    # --- actions -------------------------------------------------------------

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: Optional[float] = None,
        markup: bool = True,
    ) -> None:
        """A toast, always as plain text: ours carry data (log excerpts, paths, commands) whose
        brackets would be read as markup ("[/src/pair.cc:553]" is a closing tag) and crash the draw."""
        super().notify(printable(message), title=printable(title), severity=severity, timeout=timeout, markup=False)

    def announce_alert(self, event) -> None:
        """A new alert event: a toast and the bell as configured; the Alerts pane lists it anyway."""
        alerting = self.config.alerting
        if event.state == "firing":
            if alerting.toast:
                self.notify(
                    event.message,
                    title="alert: " + event.rule,
                    severity="error" if event.severity == "critical" else "warning",
                    timeout=10,
                )
            if alerting.bell:
                self.bell()
        elif alerting.toast:
            self.notify(event.message, title="resolved: " + event.rule, timeout=5)

    def action_record(self) -> None:
        """Start recording what the console receives, or stop and say where it went."""
        if self.services.recorder is not None:
            path = self.services.stop_recording()
            self.notify("recording saved: %s (opsconsole replay %s)" % (path, path), timeout=15)
        else:
            try:
                path = self.services.start_recording(self.fleet.states())
            except Exception as exc:  # a read-only or full directory: say so, keep watching
                self.notify("cannot record: %s" % exc, severity="error", timeout=10)
                return
            self.notify("recording to %s (ctrl+r stops)" % path, timeout=8)
        self.sync_host_process_reads()
        self.redraw()

    def action_report(self) -> None:
        """Collect an incident report in the background and say where it was written."""
        self.notify("collecting an incident report ...", timeout=4)
        self.run_worker(self._write_report(), group="report", exclusive=True)

    async def _write_report(self) -> None:
        from opsconsole.report.builder import write_report
        from opsconsole.report.gather import gather

        try:
            inputs = await gather(self.config, fleet=self.fleet, health=self.health_results())
            path = await asyncio.get_running_loop().run_in_executor(
                None, write_report, inputs
            )  # private: 0600 in the state dir's reports/
        except Exception as exc:
            self.notify("report failed: %s" % exc, severity="error", timeout=10)
            return
        self.notify("incident report written: %s" % path, timeout=20)

    def health_results(self) -> list:
        """The latest health results the console holds (the Health pane's), for reports."""
        return self.health.latest()

    def action_show_pane(self, pane_id: str) -> None:
        # Not awaiting a first mount here: the app's loop runs the mount, and a key's action
        # that awaited it would hold that loop.
        if self.ensure_pane(pane_id) is not None:
            if pane_id != self.visible_pane_id:
                # Hiding the pane that holds the focus lets Textual move it to the next focusable
                # widget, which may be in that same pane (Processes has two tables), and a focused
                # widget's tab becomes active again: the key bounced back. Nothing holds focus while
                # the tab changes; the shown pane takes it (focus_pane) once it is drawn.
                self.tabs.screen.set_focus(None)
                self.hold_keys_for(pane_id)
            self.tabs.active = tab_id(pane_id)

    def _step_pane(self, step: int) -> None:
        ids = [entry.pane_id for entry in PANES]
        index = ids.index(self.visible_pane_id) if self.visible_pane_id in ids else 0
        self.action_show_pane(ids[(index + step) % len(ids)])

    def action_next_pane(self) -> None:
        self._step_pane(1)

    def action_previous_pane(self) -> None:
        self._step_pane(-1)

    def action_help(self) -> None:
        from opsconsole.tui.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.help_rows(), self.config.source or "the config file"))

    def check_action(self, action: str, parameters: Tuple[object, ...]) -> Optional[bool]:
        if action == "filter" and (isinstance(self.focused, Input) or not self.main_screen_shown()):
            return False  # typed into an input, or a modal screen is up: `/` is not the filter key there
        return super().check_action(action, parameters)

    def main_screen_shown(self) -> bool:
        """Whether the console's own screen is up (no help, palette or confirmation over it)."""
        return bool(self.screen_stack) and self.screen is self.screen_stack[0]

    async def _mount_filter(self) -> None:
        """Put the filter line in place (once): the next key event waits for this, so every key
        typed after `/` reaches it."""
        if not self.filter_input.is_attached:
            await self.query_one("#main", Vertical).mount(self.filter_input, before=self.query_one(Footer))

    async def action_filter(self) -> None:
        await self._mount_filter()
        self.filter_input.value = self._pane_filters.get(self.visible_pane_id, "")
        self.filter_input.add_class("-open")
        # Focus now, not after the queued events (Widget.focus defers it): every key typed in the
        # same burst as `/` (a paste, a laggy link) belongs to the filter, never to the pane's keys.
        self.filter_input.screen.set_focus(self.filter_input, scroll_visible=False)

    def action_back(self) -> None:
        if self.filter_input.has_class("-open"):
            self.close_filter(clear=True)
        elif self.node is not None:
            self.node = None
            self.action_show_pane("nodes")
            self.redraw()
        elif self._pane_filters.get(self.visible_pane_id):
            self._set_filter("")  # a filter kept with enter: esc clears it, as ? says

    async def action_quit(self) -> None:
        self.exit(0)

    def action_help_quit(self) -> None:
        """ctrl+c: say which keys quit. Textual's own toast is markup ("[b]ctrl+q[/b]"), and our
        toasts are plain text, so it showed its tags."""
        keys = [display_key(effective_key(spec, self.keymap)) for spec in self.key_specs if spec.action == "quit"]
        self.notify("press %s to quit" % " or ".join(keys + ["ctrl+q"]), title="Do you want to quit?")

    # --- filter ------------------------------------------------------------

    @on(Input.Changed, "#filter")
    def filter_changed(self, event: Input.Changed) -> None:
        if self.filter_input.has_class("-open"):
            self._set_filter(event.value)

    @on(Input.Submitted, "#filter")
    def filter_submitted(self, event: Input.Submitted) -> None:
        self.close_filter(clear=False)

    def _set_filter(self, text: str) -> None:
        pane_id = self.visible_pane_id
        self._pane_filters[pane_id] = text
        self.panes[pane_id].apply_filter(text)

    def close_filter(self, clear: bool) -> None:
        if not self.filter_input.has_class("-open"):
            return
        if clear:
            self._set_filter("")
        self.filter_input.remove_class("-open")
        self.focus_pane(self.visible_pane_id)
        self.release_keys(FILTER_CLOSING)


def _fields(rows: Sequence[Tuple[str, str]]) -> Text:
    text = Text()
    for label, value in rows:
        text.append("%-13s" % label, style="bold")
        text.append(value + "\n")
    return text


def trust_text(plan) -> Text:
    """The body of the trust confirmation: node, host, key, and the exact line and file."""
    host = plan.pattern + ("  (a jump host of %s)" % plan.node if plan.via_jump else "")
    text = _fields(
        [
            ("Node", plan.node),
            ("Host", host),
            ("Key type", plan.key_type),
            ("Fingerprint", plan.fingerprint),
            ("known_hosts", "no key for this host yet (unknown key)"),
        ]
    )
    text.append(
        "\nCompare the fingerprint with the node's own before trusting it "
        "(on the node: ssh-keygen -lf /etc/ssh/ssh_host_%s_key.pub).\n" % plan.key_type.replace("ssh-", "")
    )
    text.append("\nThis line will be appended to ")
    text.append(plan.known_hosts, style="bold")
    text.append(":\n")
    text.append(plan.line.rstrip("\n"), style="bold")
    text.append("\n\ny trusts it and connects · n / esc cancels", style="italic")
    return text


def changed_key_text(plan) -> Text:
    """The body shown for a CHANGED key: both fingerprints, and the command the user runs instead."""
    rows = [("Node", plan.node), ("Host", plan.pattern), ("Presented", "%s %s" % (plan.key_type, plan.fingerprint))]
    for entry in plan.old_keys:
        rows.append(
            ("Trusted", "%s %s  (%s line %d)" % (entry.key_type, entry.fingerprint, entry.path, entry.line_number))
        )
    text = _fields(rows)
    text.append("\nPOSSIBLE MAN-IN-THE-MIDDLE: ", style="bold red")
    text.append(
        "the host presented a key other than the one known_hosts holds. The console does not "
        "edit known_hosts for a changed key: the old key stays there, and nothing was written.\n"
    )
    text.append(
        "\nIf the change is expected (the node was reinstalled), check the new fingerprint with "
        "its admin, remove the old key yourself:\n"
    )
    for command in plan.remove_commands():
        text.append("  " + command + "\n", style="bold")
    text.append("then press T again to trust the new key.\n")
    text.append("\nesc closes", style="italic")
    return text


def run_console(
    config: Config,
    fleet: FleetLike,
    *,
    now: Callable[[], float] = time.time,
    console: Optional[Callable[..., "OpsConsole"]] = None,
) -> int:
    """Run the console until the user quits; returns the exit status.

    `console` is the app class, OpsConsole by default: the replay command passes its ReplayConsole.
    """
    app = (console or OpsConsole)(config, fleet, now=now)
    result = app.run()
    if app.return_code:
        return app.return_code
    return int(result or 0)
