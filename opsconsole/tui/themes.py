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
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

from textual.theme import Theme

DEFAULT_THEME = "opsconsole-dark"
SAVED_THEME_MAX = 200  # bytes read from the saved-theme file: a name is one short word


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

_COLOURS = ("primary", "secondary", "accent", "foreground", "background", "surface", "panel", "boost",
            "success", "warning", "error")
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
    """Read one theme file."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ThemeFileError("%s: %s" % (path, exc)) from None
    return theme_from_mapping(data, str(path))


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


def choose_theme(wanted: str, available: Sequence[str], fallback: str = DEFAULT_THEME) -> Tuple[str, Optional[str]]:
    """The theme to use for `wanted`, and a message naming the choices when it is not there."""
    if wanted in available:
        return wanted, None
    ours = [name for name in available if name.startswith("opsconsole-")]
    others = [name for name in available if not name.startswith("opsconsole-")]
    message = "unknown theme %r, using %s; available: %s" % (wanted, fallback, ", ".join(ours + others))
    return fallback, message
