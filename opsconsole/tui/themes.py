"""Console themes: TOML files turned into Textual themes, the user's own folder, and the last choice kept.

The shipped themes live in the project's top-level `themes/` folder; an install maps that folder into
the package as `opsconsole.themes` (pyproject.toml, `package-dir`), and a source checkout reads it in
place. A user adds themes in `$XDG_CONFIG_HOME/opsconsole/themes/*.toml` (as k9s skins); a bad file
there is reported and skipped. The theme picked with ctrl+t or the palette is kept in
`$XDG_STATE_HOME/opsconsole/theme` and used at the next start unless --theme says otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.theme import BUILTIN_THEMES, Theme

from opsconsole.file_kinds import file_kind

DEFAULT_THEME = "opsconsole-dark"
SAVED_THEME_MAX = 200  # bytes read from the saved-theme file: a name is one short word
THEME_FILE_MAX = 64 * 1024  # a theme is a few dozen lines


def shipped_themes_dir() -> Path:
    """The shipped themes: the installed `opsconsole.themes` package, else the checkout's `themes/`."""
    candidates = []
    try:
        spec = importlib.util.find_spec("opsconsole.themes")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(location) for location in spec.submodule_search_locations]
    candidates.append(Path(__file__).resolve().parents[2] / "themes")  # a source checkout
    for candidate in candidates:
        if candidate.is_dir() and any(candidate.glob("*.toml")):
            return candidate
    return candidates[-1]


THEMES_DIR = shipped_themes_dir()


def user_themes_dir(env=os.environ) -> Path:
    """`$XDG_CONFIG_HOME/opsconsole/themes`, `~/.config/opsconsole/themes` without it."""
    config_home = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config_home) / "opsconsole" / "themes"


def saved_theme_path(env=os.environ) -> Path:
    """`$XDG_STATE_HOME/opsconsole/theme`: the theme last picked in the console."""
    state_home = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state_home) / "opsconsole" / "theme"


_COLOURS = (
    "primary",
    "secondary",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
    "success",
    "warning",
    "error",
)
_NUMBERS = ("luminosity_spread", "text_alpha")
# A theme's name becomes a CSS class (-theme-NAME) and a line of Textual's own theme picker, which
# reads it as markup: a name holding "[/x]" crashed the picker. Names are one word.
THEME_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_KNOWN = set(_COLOURS) | set(_NUMBERS) | {"name", "dark", "variables"}


class ThemeFileError(Exception):
    """A theme file that cannot be used, worded as `file: problem`."""


def theme_from_mapping(data: Dict[str, Any], source: str) -> Theme:
    """Build a Theme from a theme file's parsed TOML."""
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise ThemeFileError("%s: unknown key %s" % (source, ", ".join(unknown)))
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise ThemeFileError("%s: name must be a non-empty string" % source)
    if not THEME_NAME.match(name):
        raise ThemeFileError("%s: name %r must be letters, digits, - and _ only" % (source, name))
    if not isinstance(data.get("primary"), str):
        raise ThemeFileError("%s: primary colour is required" % source)
    kwargs: Dict[str, Any] = {"name": name, "dark": bool(data.get("dark", True))}
    for key in _COLOURS:
        if key in data:
            if not isinstance(data[key], str):
                raise ThemeFileError("%s: %s must be a colour string" % (source, key))
            kwargs[key] = data[key]
    for key in _NUMBERS:
        if key in data:
            kwargs[key] = float(data[key])
    variables = data.get("variables", {})
    if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
        raise ThemeFileError("%s: [variables] must map names to strings" % source)
    kwargs["variables"] = dict(variables)
    try:
        theme = Theme(**kwargs)
        theme.to_color_system()  # parses every colour now, so a typo fails here, not mid-render
    except Exception as exc:
        raise ThemeFileError("%s: %s" % (source, exc)) from None
    return theme


def load_theme_file(path: Path) -> Theme:
    """Read one theme file (a regular file of at most THEME_FILE_MAX bytes)."""
    try:
        with open(path, "rb", opener=_open_no_block) as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if not stat.S_ISREG(mode):  # a FIFO would block the start, a device never end
                raise ThemeFileError("%s: %s, not a theme file" % (path, file_kind(mode)))
            raw = handle.read(THEME_FILE_MAX + 1)
        if len(raw) > THEME_FILE_MAX:
            raise ThemeFileError("%s: larger than %d bytes" % (path, THEME_FILE_MAX))
        data = tomllib.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ThemeFileError("%s: %s" % (path, exc)) from None
    return theme_from_mapping(data, str(path))


def _open_no_block(path, flags):
    return os.open(path, flags | os.O_NONBLOCK)  # a FIFO opens at once, to be refused by its mode


def load_themes(directory: Path = THEMES_DIR) -> Tuple[List[Theme], List[str]]:
    """Every theme in `directory`, sorted by file name, and the problems of files that failed."""
    themes: List[Theme] = []
    problems: List[str] = []
    for path in sorted(directory.glob("*.toml")):
        try:
            themes.append(load_theme_file(path))
        except ThemeFileError as exc:
            problems.append(str(exc))
    return themes, problems


def load_console_themes(env=os.environ) -> Tuple[List[Theme], List[str]]:
    """The shipped themes, then the user's (a user theme of the same name replaces the shipped one),
    and the problems of files that were skipped."""
    themes, problems = load_themes(THEMES_DIR)
    user_dir = user_themes_dir(env)
    if user_dir.is_dir():
        mine, mine_problems = load_themes(user_dir)
        themes += mine
        problems += ["theme skipped: %s" % problem for problem in mine_problems]
    return themes, problems


def theme_names(env=os.environ) -> List[str]:
    """The names a console can use: the shipped ones first, then the user's."""
    return sorted(
        {theme.name for theme in load_console_themes(env)[0]},
        key=lambda name: (not name.startswith("opsconsole-"), name),
    )


def resolve_theme_name(wanted: str, names: Sequence[str]) -> Optional[str]:
    """`wanted` if it is a theme, `opsconsole-WANTED` for a short name ("light"), else None."""
    if wanted in names:
        return wanted
    if "opsconsole-" + wanted in names:
        return "opsconsole-" + wanted
    return None


def saved_theme(env=os.environ) -> Optional[str]:
    """The theme last picked in the console, None when none was (or the file is not a name)."""
    try:
        with open(saved_theme_path(env), "rb", opener=_open_no_block) as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return None
            raw = handle.read(SAVED_THEME_MAX + 1)
    except OSError:
        return None
    if len(raw) > SAVED_THEME_MAX:
        return None
    name = raw.decode("utf-8", "replace").strip()
    return name if THEME_NAME.match(name) else None


def save_theme(name: str, env=os.environ) -> Optional[str]:
    """Keep `name` as the theme for the next start; a problem worded for the user, None when saved."""
    path = saved_theme_path(env)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".%d.tmp" % os.getpid())
        partial.write_text(name + "\n", encoding="utf-8")
        os.replace(partial, path)  # whole or not at all: a crash never leaves half a name
    except OSError as exc:
        return "theme %s not kept for the next start: %s" % (name, exc)
    return None


def choose_theme(wanted: str, available: Sequence[str], fallback: str = DEFAULT_THEME) -> Tuple[str, Optional[str]]:
    """The theme to use for `wanted`, and a message naming the choices when it is not there."""
    if wanted in available:
        return wanted, None
    ours = [name for name in available if name.startswith("opsconsole-")]
    others = [name for name in available if not name.startswith("opsconsole-")]
    message = "unknown theme %r, using %s; available: %s" % (wanted, fallback, ", ".join(ours + others))
    return fallback, message


def drop_builtin_themes(app) -> None:
    """Leave only the console's themes registered, so ctrl+t and the palette list ours, not Textual's 20-odd."""
    ours = set(app.available_themes) - set(BUILTIN_THEMES)
    if app.theme not in ours:
        return  # nothing of ours loaded: Textual's stay, the console still draws
    for name in BUILTIN_THEMES:
        app.unregister_theme(name)


class ThemePicker(Provider):
    """ctrl+t: the console's themes (shipped and the user's); the one picked is kept for the next start."""

    def _names(self) -> List[str]:
        return sorted(self.app.available_themes)

    def _pick(self, name: str):
        pick = getattr(self.app, "pick_theme", None)
        return (lambda: pick(name)) if pick is not None else (lambda: setattr(self.app, "theme", name))

    async def discover(self) -> Hits:
        for name in self._names():
            yield DiscoveryHit(name, self._pick(name), text=name)  # names are [A-Za-z0-9_-]: no markup

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name in self._names():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), self._pick(name), text=name)
