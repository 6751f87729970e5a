"""TOML text to data; a syntax error becomes one ConfigError with tomllib's line and column."""

from __future__ import annotations

import ast
import re
import sys
from typing import Any, Dict, Tuple

from opsconsole.config.errors import ConfigError, format_path

if sys.version_info >= (3, 11):
    import tomllib as tomllib  # (re-exported: the locator reads quoted keys with it)
else:  # Python < 3.11
    import tomli as tomllib


def read_toml(text: str, filename: str) -> Dict[str, Any]:
    """The document as tomllib reads it; `filename` only names it in errors."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line, message = syntax_error_position(exc, text)
        raise ConfigError(message, file=filename, line=line, key="syntax") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError("arrays or tables nested too deep", file=filename, key="syntax") from None
    except ValueError:  # not a TOMLDecodeError: an integer of more than 4300 digits
        raise ConfigError("invalid value: a number too long to read", file=filename, key="syntax") from None


def syntax_error_position(exc: Exception, text: str) -> Tuple[int, str]:
    """Turn tomllib's "msg (at line X, column Y)" into (X, "msg (column Y)")."""
    raw = str(exc)
    line = getattr(exc, "lineno", None)  # Python 3.14 has these attributes
    column = getattr(exc, "colno", None)
    message = getattr(exc, "msg", None)
    if message is None:
        match = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", raw, re.S)
        if match:
            message, line, column = match.group(1), int(match.group(2)), int(match.group(3))
        else:
            match = re.fullmatch(r"(.*) \(at end of document\)", raw, re.S)
            message = match.group(1) if match else raw
    if line is None:
        line = max(1, len(text.splitlines()))
    message = tidy_toml_message(message)
    if column is not None:
        message += f" (column {column})"
    return int(line), message


def tidy_toml_message(message: str) -> str:
    # "Cannot declare ('console', 'keys') twice" reads better as "[console.keys]".
    def table_name(match: "re.Match[str]") -> str:
        try:
            parts = ast.literal_eval(match.group(1))
        except (ValueError, SyntaxError):
            return match.group(0)
        if isinstance(parts, str):
            parts = (parts,)
        return "[" + format_path(tuple(parts)) + "]"

    message = re.sub(r"(\((?:'[^']*'(?:, )?)+,?\))", table_name, message)
    if len(message) > 1 and message[0].isupper() and message[1].islower():
        message = message[0].lower() + message[1:]
    return message
