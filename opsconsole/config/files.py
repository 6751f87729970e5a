"""Finding the config file (--config, $OPSCONSOLE_CONFIG, XDG) and reading it safely."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Mapping, Optional, Tuple

from opsconsole.config.errors import ConfigError
from opsconsole.config.parse import parse_config
from opsconsole.config.schema import DEFAULT_CONFIG, Config, expand_home
from opsconsole.file_kinds import file_kind

ENV_CONFIG = "OPSCONSOLE_CONFIG"


def load_config(cli_path: Optional[str] = None, env: Mapping[str, str] = os.environ) -> Config:
    """Find, read and validate the config; DEFAULT_CONFIG when there is no file at all."""
    found = locate_config(cli_path, env)
    if found is None:
        return DEFAULT_CONFIG
    shown, path = found
    data = read_config_bytes(path, shown)
    try:
        text = data.decode("utf-8-sig")  # tolerate the BOM some editors write
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError("file is not UTF-8 text", file=shown, line=line, key="syntax") from None
    return parse_config(text, shown, home=env.get("HOME"))


MAX_CONFIG_BYTES = 1024 * 1024  # a config is a few kB; /dev/zero or a log given by mistake is refused


def read_config_bytes(path: Path, shown: str) -> bytes:
    """The file's bytes, at most MAX_CONFIG_BYTES; a FIFO, device or directory is refused unopened.

    os.stat comes first (opening a FIFO would wait for a writer); the open is non-blocking and
    checked again with fstat, so a FIFO put there after the stat cannot hang the read either.
    """
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError("cannot read config: Is a directory", file=shown)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("cannot read config: not a regular file (%s)" % file_kind(info.st_mode), file=shown)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ConfigError("cannot read config: not a regular file", file=shown)
            chunks, size = [], 0
            while size <= MAX_CONFIG_BYTES:
                chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise ConfigError(f"cannot read config: {reason}", file=shown) from None
    if size > MAX_CONFIG_BYTES:
        raise ConfigError("cannot read config: larger than %d KiB" % (MAX_CONFIG_BYTES // 1024), file=shown)
    return b"".join(chunks)


def locate_config(cli_path: Optional[str], env: Mapping[str, str]) -> Optional[Tuple[str, Path]]:
    # Returns (path as the user gave it, path to open). Explicit paths are returned even
    # when missing so that reading them fails loudly instead of falling back to defaults.
    home = env.get("HOME") or None
    if cli_path is not None:
        if not cli_path:
            raise ConfigError("cannot read config: --config was given an empty path")
        return cli_path, Path(expand_home(cli_path, home))
    from_env = env.get(ENV_CONFIG)
    if from_env:
        return from_env, Path(expand_home(from_env, home))
    xdg = env.get("XDG_CONFIG_HOME")
    # The XDG spec says to ignore a relative XDG_CONFIG_HOME.
    if xdg and os.path.isabs(xdg):
        base = Path(xdg)
    else:
        base = Path(expand_home("~", home)) / ".config"
    path = base / "opsconsole" / "config.toml"
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        # Not known to be absent (a home the user may not look into, a name too long): reading it
        # says why, rather than a traceback here or a silent fall back to the defaults.
        return str(path), path
    return str(path), path
