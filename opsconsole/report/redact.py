"""The config as the user wrote it, with secrets taken out, for an incident report that gets shared.

Redacted: values of keys that name a secret (token, password, secret, key material,
webhook, auth), credentials inside URLs (user:password@), and query strings of URLs
(webhook tokens travel there). Comments are kept; a redacted value says so.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"
_SECRET_KEY = re.compile(r"(token|passw|secret|api[_-]?key|webhook|auth|credential|private)", re.IGNORECASE)
_KEY_LINE = re.compile(r"^(\s*)([A-Za-z0-9_.\"'-]+)(\s*=\s*)(.*)$")
_URL_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^/\s@\"']+@", re.IGNORECASE)
_URL_QUERY = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^\s\"'?]+)\?[^\s\"']*", re.IGNORECASE)
# Key names that only point at a file holding a secret: the path is not the secret.
_FILE_POINTER = re.compile(r"(_file|_path)$")


def redact_line(line: str) -> str:
    match = _KEY_LINE.match(line)
    if match and not line.lstrip().startswith("#"):
        indent, key, equals, value = match.groups()
        name = key.strip("\"'")
        if _SECRET_KEY.search(name) and not _FILE_POINTER.search(name):
            trailing = re.search(r"\s+#.*$", value)
            comment = trailing.group(0) if trailing else ""
            return '%s%s%s"%s"%s' % (indent, key, equals, REDACTED, comment)
    line = _URL_USERINFO.sub(r"\1" + REDACTED + "@", line)
    return _URL_QUERY.sub(r"\1?" + REDACTED, line)


def redact_config_text(text: str) -> str:
    """`text` (TOML) line by line with secret values and URL credentials replaced."""
    return "\n".join(redact_line(line) for line in text.split("\n"))
