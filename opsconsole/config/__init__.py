"""Config: TOML into validated frozen dataclasses; errors name file, line and key.

By concern: `schema` declares every section once (types, defaults, ranges; the dataclasses the rest
of the code reads), `files` finds and reads the file, `toml` and `locator` turn text into data and
key paths back into lines, `validate` checks a document against the schema (msgspec) and says its
errors in the config's words, `sections` checks what types cannot say (hostlists, names, argv templates).
"""

from opsconsole.config.errors import ConfigError
from opsconsole.config.files import ENV_CONFIG, MAX_CONFIG_BYTES, load_config
from opsconsole.config.parse import parse_config
from opsconsole.config.schema import (
    ARRAY_SECTIONS,
    DEFAULT_CONFIG,
    DRAIN_PLACEHOLDERS,
    GPU_RESET_PLACEHOLDERS,
    HOST_KEY_POLICIES,
    MAX_AGE_S,
    MAX_INTERVAL_S,
    MAX_RECORD_MB,
    MAX_TIMEOUT_S,
    MIN_INTERVAL_S,
    MIN_POLL_S,
    SECTIONS,
    ActionsConfig,
    AlertingConfig,
    AlertRuleConfig,
    CheckpointDirConfig,
    Config,
    ConsoleConfig,
    HealthConfig,
    HistoryConfig,
    LogsConfig,
    NodeConfig,
    RecordConfig,
    SourceConfig,
    SshConfig,
)

__all__ = [
    "ARRAY_SECTIONS",
    "DEFAULT_CONFIG",
    "DRAIN_PLACEHOLDERS",
    "ENV_CONFIG",
    "GPU_RESET_PLACEHOLDERS",
    "HOST_KEY_POLICIES",
    "MAX_AGE_S",
    "MAX_CONFIG_BYTES",
    "MAX_INTERVAL_S",
    "MAX_RECORD_MB",
    "MAX_TIMEOUT_S",
    "MIN_INTERVAL_S",
    "MIN_POLL_S",
    "SECTIONS",
    "ActionsConfig",
    "AlertRuleConfig",
    "AlertingConfig",
    "CheckpointDirConfig",
    "Config",
    "ConfigError",
    "ConsoleConfig",
    "HealthConfig",
    "HistoryConfig",
    "LogsConfig",
    "NodeConfig",
    "RecordConfig",
    "SourceConfig",
    "SshConfig",
    "load_config",
    "parse_config",
]
