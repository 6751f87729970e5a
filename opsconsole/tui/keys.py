"""The console's key registry: one list of bindings with ids, shared by keys, help and palette."""

from __future__ import annotations

import difflib
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from textual.binding import Binding

from opsconsole.config import ConfigError
from opsconsole.model import frozen


@frozen
class KeySpec:
    """One binding: a stable id (what `[console.keys]` names), its default key, action and words."""

    id: str
    key: str
    action: str
    description: str
    show: bool = True  # in the footer
    priority: bool = False  # checked before the focused widget (tab must beat focus cycling)
    scope: str = ""  # "" for the app; a pane id for a binding of that pane
    footer: str = ""  # the footer's word when the description is too long for it ("Record")


# App-wide bindings; pane bindings are made from the pane registry (see pane_key_specs).
APP_KEYS: Tuple[KeySpec, ...] = (
    KeySpec("app.quit", "q", "quit", "Quit"),
    KeySpec("app.help", "question_mark", "help", "Help: every key", footer="Help"),
    # Priority: `/` is handled in the order keys arrive, before the ones typed after it are sent
    # to the focused table (which would read them as its keys); OpsConsole.check_action lets it
    # through to a text input, where `/` is just a character.
    KeySpec("app.filter", "slash", "filter", "Filter the pane", priority=True, footer="Filter"),
    KeySpec("app.back", "escape", "back", "Back: close filter, leave drill-down", show=False),
    KeySpec("pane.next", "tab", "next_pane", "Next pane", show=False, priority=True),
    KeySpec("pane.previous", "shift+tab", "previous_pane", "Previous pane", show=False, priority=True),
    KeySpec("app.palette", "ctrl+p", "command_palette", "Command palette", show=False),
    KeySpec("app.theme", "ctrl+t", "change_theme", "Change theme", show=False),
)


# The replay console's own bindings (opsconsole.tui.replay binds them): one config serves the console
# and its replays, so [console.keys] may remap these in either.
REPLAY_KEYS: Tuple[KeySpec, ...] = (
    KeySpec("replay.pause", "space", "replay_pause", "Replay: pause / play"),
    KeySpec("replay.faster", "plus,equals_sign", "replay_faster", "Replay: faster"),
    KeySpec("replay.slower", "minus", "replay_slower", "Replay: slower"),
    KeySpec("replay.back", "left_square_bracket", "replay_step(-10)", "Replay: back 10 s"),
    KeySpec("replay.forward", "right_square_bracket", "replay_step(10)", "Replay: forward 10 s"),
    KeySpec("replay.back_minute", "left_curly_bracket", "replay_step(-60)", "Replay: back 1 min", show=False),
    KeySpec("replay.forward_minute", "right_curly_bracket", "replay_step(60)", "Replay: forward 1 min", show=False),
    KeySpec("replay.start", "less_than_sign", "replay_go('0%')", "Replay: to the start", show=False),
    KeySpec("replay.end", "greater_than_sign", "replay_go('100%')", "Replay: to the end", show=False),
    # Checked before the focused widget, as `/` is: the keys typed behind `g` are routed after the seek
    # line has the focus (ReplayConsole.check_action lets `g` through to an input or a modal screen).
    KeySpec("replay.goto", "g", "replay_goto", "Replay: go to a time (+30s, -5m, 2:25, 50%, 14:05)", priority=True),
)


def pane_key_specs(panes: Sequence[type]) -> Tuple[KeySpec, ...]:
    """A `pane.<id>` binding for each pane class that has a number key."""
    return tuple(
        KeySpec("pane." + pane.pane_id, pane.key, "show_pane(%r)" % pane.pane_id, "Show " + pane.title, show=False)
        for pane in panes
        if pane.key
    )


def pane_binding_specs(panes: Sequence[type]) -> Tuple[KeySpec, ...]:
    """The bindings panes declare themselves (with ids), so help, palette and keymap know them too."""
    specs: List[KeySpec] = []
    seen = set()
    for pane in panes:
        for cls in pane.__mro__:
            for binding in cls.__dict__.get("BINDINGS", ()):
                if not isinstance(binding, Binding) or not binding.id or (pane.pane_id, binding.id) in seen:
                    continue
                seen.add((pane.pane_id, binding.id))
                specs.append(
                    KeySpec(
                        binding.id,
                        binding.key,
                        binding.action,
                        "%s: %s" % (pane.title, binding.description or binding.action),
                        show=binding.show,
                        scope=pane.pane_id,
                    )
                )
    return tuple(specs)


def bindings_from_specs(specs: Iterable[KeySpec]) -> List[Binding]:
    """Textual Binding objects carrying the spec ids, so App.set_keymap can remap them."""
    return [
        # The footer shows the short word (a footer of whole sentences was cut at 160 columns); help, the
        # palette and the binding's tooltip keep the whole description.
        Binding(
            spec.key,
            spec.action,
            spec.footer or spec.description,
            show=spec.show,
            priority=spec.priority,
            id=spec.id,
            tooltip=spec.description if spec.footer else "",
        )
        for spec in specs
        if not spec.scope
    ]


def keymap_from_config(
    pairs: Iterable[Tuple[str, str]], specs: Sequence[KeySpec], source: Optional[str] = None
) -> Dict[str, str]:
    """`[console.keys]` pairs as a Textual keymap (binding id -> key).

    An id no binding has (a typo: the remap would do nothing) and a remap onto a key another binding
    already answers to (see key_collision) are ConfigErrors, refused like any config error (exit 2).
    """
    known = {spec.id for spec in specs} | {spec.id for spec in REPLAY_KEYS}
    keymap: Dict[str, str] = {}
    for binding_id, key in pairs:
        if binding_id not in known:
            raise ConfigError(unknown_binding(binding_id, known), file=source)
        keymap[binding_id] = key.strip()
    collision = key_collision(keymap, specs)
    if collision is not None:
        raise ConfigError(collision, file=source)
    return keymap


def unknown_binding(binding_id: str, known: Iterable[str]) -> str:
    """One line for an id no binding has, naming the closest known ids."""
    choices = sorted(known)
    # The near ones (a typo); else the nearest one that is still alike.
    close = difflib.get_close_matches(binding_id, choices, n=3, cutoff=0.8) or difflib.get_close_matches(
        binding_id, choices, n=1, cutoff=0.6
    )
    hint = "; the closest: %s" % ", ".join(close) if close else ""
    return 'console.keys: no binding "%s"%s (? lists every id)' % (binding_id, hint)


def _typed_keys(key: str) -> Set[str]:
    """The keys of a binding as typed (`?` and `question_mark` alike), each once."""
    return {display_key(part) for part in key.split(",") if part.strip()}


def key_collision(keymap: Mapping[str, str], specs: Sequence[KeySpec]) -> Optional[str]:
    """The first remap onto a key another binding answers to, in one line naming both; None when none.

    Two bindings collide when, after remapping, they share a key and either share a scope (the
    app, or one pane) or one is a pane's and the other the app's: an app key is live in every pane,
    and where a pane binds the same key the pane's binding wins (`"app.quit" = "x"` would not quit
    in Processes, where x is SIGTERM). Only a pair with a remapped binding is judged, so a swap that
    remaps both of its ids is fine.
    """
    for spec in specs:
        if spec.id not in keymap:
            continue
        mine = _typed_keys(keymap[spec.id])
        for other in specs:
            if other.id == spec.id:
                continue
            if spec.scope and other.scope and spec.scope != other.scope:
                continue  # keys of two different panes never meet
            shared = sorted(mine & _typed_keys(effective_key(other, keymap)))
            if shared:
                return (
                    'console.keys: "%s" = "%s" takes the key %s of %s (%s); remap that one too, or choose another key'
                    % (
                        spec.id,
                        keymap[spec.id],
                        shared[0],
                        other.id,
                        other.description,
                    )
                )
    return None


def effective_key(spec: KeySpec, keymap: Mapping[str, str]) -> str:
    """The key a binding answers to after remapping (the first, when several are given)."""
    return keymap.get(spec.id, spec.key)


_KEY_NAMES = {
    "question_mark": "?",
    "slash": "/",
    "escape": "esc",
    "full_stop": ".",
    "comma": ",",
    "minus": "-",
    "plus": "+",
    "space": "space",
}


def display_key(key: str) -> str:
    """A key as people type it: `question_mark` as `?`, `a,b` as `a / b`."""
    return " / ".join(_KEY_NAMES.get(part.strip(), part.strip()) for part in key.split(","))
