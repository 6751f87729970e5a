"""Config text to a validated Config: TOML read, then checked against the schema."""

from __future__ import annotations

from typing import Optional

from opsconsole.config.errors import ConfigError
from opsconsole.config.schema import Config


def parse_config(text: str, filename: str, *, home: Optional[str] = None) -> Config:
    """Parse and validate TOML text; `filename` is only used in error messages."""
    # Loaded on the first file read (tomllib, the locator, the validation): a console started
    # without a config file needs none of them.
    from opsconsole.config.locator import KeyLines
    from opsconsole.config.toml import read_toml
    from opsconsole.config.validate import config_from_document

    data = read_toml(text, filename)
    try:
        return config_from_document(data, filename, KeyLines(text), home)
    except RecursionError:
        raise ConfigError("arrays or tables nested too deep", file=filename, key="syntax") from None
