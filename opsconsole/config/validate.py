"""A TOML document checked against the schema by msgspec; its errors said in the config's own words.

Each table is first brought to the schema's shapes where the file spells a setting differently (a
table of free names, a command as one string, one hostlist pattern, `for`), remembering where each
piece was written; unknown keys and non-finite numbers are found on the way (msgspec ignores the first
in dataclasses and has no option against the second). msgspec then converts the table, stopping at its
first problem, which is said again at the file line of its key; the first problem in file order is
raised. What types cannot say (hostlists, names that must be unique or must exist, argv placeholders)
follows in sections.py.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import Field, fields, is_dataclass
from functools import lru_cache
from typing import (
    Annotated,
    Any,
    Dict,
    List,
    Literal,
    NoReturn,
    Optional,
    Tuple,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

import msgspec

from opsconsole.config import schema, sections
from opsconsole.config.errors import ConfigError, KeyPath, format_path, quote, show, suggest
from opsconsole.config.locator import KeyLines
from opsconsole.config.schema import ARRAYS_OF_TABLES, REFUSED_KEYS, SECTIONS, TABLES, Config


def msgspec_type(kind: Any) -> Any:
    """`kind` with each schema `Limits` in it as the msgspec `Meta` it stands for (the same object
    when there is none)."""
    args = get_args(kind)
    if get_origin(kind) is Annotated:
        base, extras = msgspec_type(args[0]), args[1:]
        metas = tuple(msgspec.Meta(**m.constraints) if isinstance(m, schema.Limits) else m for m in extras)
        return Annotated[(base, *metas)]
    if not args or get_origin(kind) is Literal:
        return kind
    translated = tuple(msgspec_type(arg) for arg in args)
    if all(new is old for new, old in zip(translated, args)):
        return kind
    if get_origin(kind) is Union:
        return Union[translated]
    return kind.copy_with(translated)


def use_msgspec_meta() -> None:
    """Make every schema class's `Limits` msgspec `Meta` in its annotations, which msgspec.convert
    and hints() read. Once, when this module loads: the console imports it with the first config
    file, so one started without a file never loads msgspec (schema.Limits)."""
    for cls in [kind for kind in vars(schema).values() if isinstance(kind, type) and is_dataclass(kind)]:
        own = cls.__dict__.get("__annotations__")
        if own:
            cls.__annotations__ = {name: msgspec_type(kind) for name, kind in own.items()}


use_msgspec_meta()

# Values people try in order to switch host key checking off; they get a pointed answer.
CHECKING_OFF_WORDS = frozenset(
    "off no none false 0 disable disabled ignore insecure skip accept accept-any accept-all auto-add autoadd".split()
)


class Problems:
    """The problems found in one file, each at the line of its key; `raise_first()` raises the earliest."""

    def __init__(self, filename: str, lines: KeyLines) -> None:
        self.filename = filename
        self.lines = lines
        self.found: List[Tuple[int, int, KeyPath, str]] = []

    def add(self, path: KeyPath, message: str) -> None:
        self.found.append((self.lines.line_of(path), len(self.found), path, message))

    def error(self, path: KeyPath, message: str) -> ConfigError:
        return ConfigError(message, file=self.filename, line=self.lines.line_of(path), key=format_path(path))

    def fail(self, path: KeyPath, message: str) -> NoReturn:
        raise self.error(path, message)

    def raise_first(self) -> None:
        if self.found:
            _, _, path, message = min(self.found)
            self.fail(path, message)


def config_from_document(data: Dict[str, Any], filename: str, lines: KeyLines, home: Optional[str]) -> Config:
    """Validate parsed TOML into a Config, raising ConfigError for the first problem in the file."""
    problems = Problems(filename, lines)
    for name, value in data.items():
        if name not in SECTIONS:
            problems.add((name,), unknown_top_level(name, value))
    problems.raise_first()
    validated = {name: validate_section(name, value, problems) for name, value in data.items()}
    problems.raise_first()
    return sections.finish(validated, data, filename, home, problems.fail)


def unknown_top_level(name: str, value: Any) -> str:
    if isinstance(value, dict) or (isinstance(value, list) and value and all(isinstance(v, dict) for v in value)):
        return "unknown section" + suggest(name, SECTIONS)
    owners = [section for section, keys in SECTIONS.items() if name in keys]
    if owners:
        where = f"[[{owners[0]}]]" if owners[0] in ARRAYS_OF_TABLES else f"[{owners[0]}]"
        return f"unknown top-level key; it belongs under {where}"
    return "unknown top-level key" + suggest(name, SECTIONS)


# --- one table: the file's spellings to the schema's shapes, then msgspec ----------------------------


def validate_section(section: str, value: Any, problems: Problems) -> Any:
    """The section as schema objects (a tuple of them for [[arrays]]); None after a problem."""
    if section in TABLES:
        return validate_table(TABLES[section], (section,), value, problems)
    if not isinstance(value, list):
        problems.add((section,), "expected an array of tables ([[%s]]), got %s" % (section, show(value)))
        return None
    entries = [validate_table(ARRAYS_OF_TABLES[section], (section, i), v, problems) for i, v in enumerate(value)]
    return None if None in entries else tuple(entries)


def validate_table(cls: type, path: KeyPath, value: Any, problems: Problems) -> Any:
    if not isinstance(value, dict):
        problems.add(path, "expected a table, got %s" % show(value))
        return None
    written_at: Dict[KeyPath, KeyPath] = {}
    before = len(problems.found)
    shaped = to_schema_shapes(cls, path, value, written_at, problems)
    if len(problems.found) > before:
        return None
    try:
        return msgspec.convert(shaped, cls, strict=True)
    except msgspec.ValidationError as exc:
        where, message = describe(cls, shaped, str(exc))
        problems.add(file_path(path + where, written_at), message)
        return None


def to_schema_shapes(
    cls: type, path: KeyPath, value: Dict[str, Any], written_at: Dict[KeyPath, KeyPath], problems: Problems
) -> Dict[str, Any]:
    """The table with the schema's names and shapes; `written_at` gets where moved pieces were written."""
    by_key = {f.metadata.get("alias", f.name): f for f in fields(cls)}
    shaped: Dict[str, Any] = {}
    for key, raw in value.items():
        key_path = path + (key,)
        f = by_key.get(key)
        if f is None:
            refused = REFUSED_KEYS.get((str(path[0]), key))
            problems.add(key_path, refused or "unknown key" + suggest(key, by_key))
            continue
        if f.name != key:
            written_at[path + (f.name,)] = key_path
        if isinstance(raw, float) and not math.isfinite(raw) and number_type(cls, f.name) is float:
            problems.add(key_path, "expected a finite number, got %s" % show(raw))
            continue
        if f.metadata.get("table"):
            if not isinstance(raw, dict):
                problems.add(key_path, "expected %s, got %s" % (f.metadata["table"], show(raw)))
                continue
            raw = tuple(raw.items())
            for index, (name, _) in enumerate(raw):
                written_at[key_path + (index,)] = written_at[key_path + (index, 1)] = key_path + (name,)
        elif isinstance(raw, str) and (f.metadata.get("argv") or f.name == "hosts"):
            if f.name == "hosts":
                raw = (raw,)  # one pattern
            else:
                try:
                    raw = tuple(shlex.split(raw))
                except ValueError as exc:
                    problems.add(key_path, "cannot split the command: %s" % exc)
                    continue
            for index in range(len(raw)):
                written_at[key_path + (index,)] = key_path
        shaped[f.name] = raw
    if cls is schema.AlertRuleConfig and "name" not in value:  # a rule is named after what it says
        shaped["name"] = "%s %s %s" % tuple(value.get(key, "") for key in ("metric", "comparison", "threshold"))
    return shaped


def file_path(loc: KeyPath, written_at: Dict[KeyPath, KeyPath]) -> KeyPath:
    """Where the piece at schema path `loc` was written in the file."""
    for end in range(len(loc), 0, -1):
        moved = written_at.get(loc[:end])
        if moved is not None:
            return moved + loc[end:]
    return loc


# --- msgspec's first problem in our words ----------------------------------------------------------------


def describe(cls: type, table: Dict[str, Any], error: str) -> Tuple[KeyPath, str]:
    """(path within the table, message) for msgspec's error text, e.g. "Expected `int` >= 1 - at `$.port`"."""
    match = re.fullmatch(r"(.*) - at `\$(.*)`", error, re.S)
    text, at = (match.group(1), match.group(2)) if match else (error, "")
    loc: KeyPath = tuple(int(i) if i else k for k, i in re.findall(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]", at))
    missing = re.match(r"Object missing required field `(\w+)`", text)
    if missing:
        f = field_named(cls, missing.group(1))
        example = f.metadata.get("example") if f is not None else None
        key = f.metadata.get("alias", f.name) if f is not None else missing.group(1)
        return loc, 'missing required key "%s"' % key + (' (e.g. "%s")' % example if example else "")
    value = value_at(table, loc)
    if not loc:
        return loc, "expected a table, got %s" % show(value)
    f = field_named(cls, str(loc[0]))
    if f is None:
        return loc, "invalid value %s (%s)" % (show(value), text)
    meta, rest = f.metadata, loc[1:]
    expects = meta.get("expects")
    if f.name == "hosts":
        return loc[:1], "expected %s, got %s" % (expects, show(value_at(table, loc[:1])))
    if meta.get("table"):
        rest = rest[2:]  # (pair index, 1): the value, said at its name
        if not rest and expects:
            return loc, "expected %s, got %s" % (expects, blank_or_shown(value))
    in_array = bool(rest)
    choices = choices_of(cls, f.name)
    if "matching regex" in text:
        if in_array:
            return loc, "expected an array of strings, got %s in it" % blank_or_shown(value)
        if expects and isinstance(value, str) and value.strip():
            return loc, "expected %s, got %s" % (expects, show(value))
        return loc, "expected a string, got %s" % blank_or_shown(value)
    if choices and (text.startswith("Invalid enum value") or text.startswith("Expected `str")):
        return loc, choice_message(f, choices, value)
    wrong_type = re.match(r"Expected `(\w+)( \| null)?`, got `", text)
    if wrong_type:
        expected = wrong_type.group(1)
        if in_array:
            return loc, "expected an array of strings, got %s in it" % show(value)
        return loc, "expected %s, got %s" % (TYPE_WORDS.get(expected, expected), show(value))
    bound = re.match(r"Expected `\w+( \| null)?` (>=|>|<=|<) ", text)
    if bound or text.startswith("Number out of range"):
        if number_type(cls, f.name) is float and not bound:
            return loc, "expected a finite number, got %s" % show(value)
        constraint = meta_of(cls, f.name)
        op = bound.group(2) if bound else (">=" if isinstance(value, (int, float)) and value < 0 else "<=")
        if constraint.extra and constraint.extra.get("between"):
            return loc, "must be between %s and %s, got %s" % (show(constraint.ge), show(constraint.le), show(value))
        if op == ">":
            return loc, "must be greater than %s, got %s" % (show(constraint.gt), show(value))
        if op == ">=":
            return loc, "must be at least %s, got %s" % (show(constraint.ge), show(value))
        return loc, "must be at most %s, got %s" % (show(constraint.le), show(value))
    return loc, "invalid value %s (%s)" % (show(value), text)


TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean (true or false)",
    "str": "a string",
    "array": "an array of strings",
    "object": "a table",
}


def blank_or_shown(value: Any) -> str:
    return "an empty string" if isinstance(value, str) and not value.strip() else show(value)


def value_at(table: Any, loc: KeyPath) -> Any:
    for part in loc:
        try:
            table = table[part]
        except (KeyError, IndexError, TypeError):
            return None
    return table


def field_named(cls: type, name: str) -> Optional[Field]:  # type: ignore[type-arg]
    for f in fields(cls):
        if f.name == name:
            return f
    return None


@lru_cache(maxsize=None)
def hints(cls: type) -> Dict[str, Any]:
    return get_type_hints(cls, include_extras=True)


def unwrapped(cls: type, name: str) -> Tuple[Any, Tuple[Any, ...]]:
    """A field's type without Optional and Annotated, and the Annotated metadata."""
    kind, extras = hints(cls)[name], ()
    if get_origin(kind) is Union:
        kind = next(arg for arg in get_args(kind) if arg is not type(None))
    if get_origin(kind) is Annotated:
        kind, extras = get_args(kind)[0], get_args(kind)[1:]
    return kind, extras


def number_type(cls: type, name: str) -> Any:
    return unwrapped(cls, name)[0]


def meta_of(cls: type, name: str) -> msgspec.Meta:
    return next((m for m in unwrapped(cls, name)[1] if isinstance(m, msgspec.Meta)), msgspec.Meta())


def choices_of(cls: type, name: str) -> Tuple[str, ...]:
    kind = unwrapped(cls, name)[0]
    return get_args(kind) if get_origin(kind) is Literal else ()


def choice_message(f: Field, choices: Tuple[str, ...], value: Any) -> str:  # type: ignore[type-arg]
    if f.name == "host_key_policy" and (
        value is False or (isinstance(value, str) and value.strip().lower() in CHECKING_OFF_WORDS)
    ):
        return 'host key checking cannot be disabled; use "strict" or "accept-new"'
    near = (
        ""  # the choices are in the message already; a close one is named when they are words ("=>" is no typo of ">")
    )
    if isinstance(value, str) and all(re.fullmatch(r"[\w.-]+", c) for c in choices):
        near = suggest(value, choices) if suggest(value, choices).startswith("; did you mean") else ""
    if f.name == "metric":
        return ("unknown metric %s" if isinstance(value, str) else "expected a metric name, got %s") % show(
            value
        ) + near
    spelled = [quote(c) for c in choices]
    expected = " or ".join(spelled) if len(spelled) <= 2 else "one of " + ", ".join(spelled)
    return "expected %s, got %s" % (expected, show(value)) + near
