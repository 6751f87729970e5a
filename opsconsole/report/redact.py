"""Secrets taken out of what an incident report carries, by key and by value, so the report can be shared.

A report holds text we did not write: the config (argv arrays, comments, commented-out lines),
process command lines and environment entries, log tails, nvidia-smi output. A secret in any of
it must not leave the machine, so every text member goes through `redact_text` and every JSON
member through `redact_json`. A redacted value becomes REDACTED and the key, flag, header name,
URL host or token kind around it stays, so the report still says what was configured.

What counts as a secret:

- a value whose name says so (`password = "..."`, `WANDB_API_KEY=...`, `"token": "..."`,
  `X-Api-Key: ...`, `--api-key VALUE`, `--token=VALUE`): the name's last part (split at `-`, `_`,
  `.` and camelCase) is key, apikey, token, secret, password, passwd, pass, passphrase, auth,
  credential(s), sig, signature, cookie, webhook or dsn, or ends in password/passwd/secret/token/apikey.
  Names that only point at a secret (`token_file`, `--password-file`, `--key-size`) end in another
  word, so their value stays; so do `--max-tokens`, `--tokenizer` and `PWD`.
- tokens of a well-known shape wherever they stand: Slack `xox?-`, GitHub `ghp_`/`github_pat_`,
  GitLab `glpat-`, `sk-...`, Hugging Face `hf_`, AWS `AKIA`/`ASIA` key ids, JWTs (`eyJ...`),
  PEM private key blocks.
- `Authorization:` credentials (the scheme stays: `Bearer <redacted>`), and `Bearer <token>`.
- in URLs: the password of userinfo (`https://user:<redacted>@host`; without a colon all of it,
  unless it is a short login name like `git@`),
  values of query parameters with a secret name (token, key, sig, signature, access_token, ...),
  and webhook paths (Slack `hooks.slack.com/services/...`, `/webhooks/...`, `/hooks/...`).
- `-p` is ambiguous (`ssh -p 22`, `make -p`, `mkdir -p DIR`, `sshpass -p PASSWORD`, `mysql -pPASSWORD`).
  Decided, by the last program named before the flag: under sshpass or a mysql/mariadb client
  `-p VALUE` and `-pVALUE` are redacted; under mkdir, cp, tar, rsync, scp, ssh, ps and the like
  nothing is; elsewhere `-p VALUE` is redacted unless VALUE is a number (`8`, `3e-4`), a port
  mapping (`8080:80`), a path (has a `/`, starts with `~` or `.`) or another flag (so `tool -p
  name` loses `name`: a redacted word costs less than a leaked password). `redis-cli -a VALUE` is
  redacted too; `-u`/`--user NAME:PASSWORD` keeps NAME.

The marker is `<redacted>`, not `[REDACTED]`: brackets wrap words in a TOML array, and a marker
that looked like wrapping would be redacted again. An unquoted value runs to whitespace, a quote or
`&`; a token of a known shape needs its usual length (`sk-` and 16 more characters), so `sk-learn`
and `task-1` stay.

All functions are pure, total (never raise, whatever the text: control characters and lone
surrogates included) and idempotent (redacting twice gives what redacting once gave).
Words are split at whitespace, not shell quotes (a stray quote in a log line must not hide a flag);
a value that opens a quote runs to the closing quote on its line.
"""

from __future__ import annotations

import re
from typing import Any, List, Optional, Sequence, Tuple

REDACTED = "<redacted>"
_NOT_REDACTED = "(?!%s)" % re.escape(REDACTED)  # a value already redacted is left as it is

# --- names that say "secret" ----------------------------------------------------------------------

_SECRET_LAST_WORDS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "pass",
        "passphrase",
        "auth",
        "credential",
        "credentials",
        "sig",
        "signature",
        "cookie",
        "webhook",
        "dsn",
        "secretkey",
        "accesskey",
        "privatekey",
        "authkey",
    }
)
_QUALIFIERS = frozenset({"api", "access", "auth", "secret", "private", "bearer", "refresh", "session"})
_SECRET_ENDINGS = ("password", "passwd", "secret", "token", "apikey")
_NAME_PARTS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def name_parts(name: str) -> List[str]:
    """`--wandb-api-key` -> [wandb, api, key]; `keyStorePassword` -> [key, store, password]."""
    return [part.lower() for part in _NAME_PARTS.findall(name)]


def is_secret_name(name: str) -> bool:
    """Whether a key, flag, header or variable named `name` holds a secret (see the module's rules)."""
    parts = name_parts(name)
    while parts and parts[-1].isdigit():  # PASSWORD2 is a password
        parts.pop()
    if not parts:
        return False
    last = parts[-1]
    if last in ("secrets", "passwords", "credentials"):
        return True
    if last in ("keys", "tokens"):
        return len(parts) > 1 and parts[-2] in _QUALIFIERS  # api_keys, access_tokens; but max_tokens and keys stay
    if "webhook" in parts and last in ("url", "uri"):
        return True
    return last in _SECRET_LAST_WORDS or last.endswith(_SECRET_ENDINGS)


# --- values of a well-known shape -------------------------------------------------------------------

_PEM_BLOCK = re.compile(
    r"(-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----)(?:(?!-----END)[\s\S])*?(-----END [A-Z0-9 ]{0,40}PRIVATE KEY-----|\Z)"
)
_KNOWN_TOKEN = re.compile(
    r"(?<![A-Za-z0-9_-])(?:"
    r"xox[abposr]-[A-Za-z0-9-]{3,}|xapp-[A-Za-z0-9-]{10,}"
    r"|gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{16,}"
    r"|sk-[A-Za-z0-9_-]{16,}"
    r"|hf_[A-Za-z0-9]{16,}"
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
    r")"
)
# `Authorization: Bearer x`, `Proxy-Authorization=Basic x`, `"authorization": "token x"`: the
# credential is one word, or Digest's `name="value", ...` list.
_AUTH_SCHEMES = r"(?:bearer|basic|token|digest|negotiate|ntlm|apikey|key)"
_AUTHORIZATION = re.compile(
    r"(?i)(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*(?=([\"']?))\2)"  # the quote taken for good
    r"(" + _AUTH_SCHEMES + r"\s+)?" + _NOT_REDACTED + r"(?!" + _AUTH_SCHEMES + r"(?:\s|$))"
    r"((?:[^\s\"',]+|(?<==)\"[^\"\n]*\"|,[ \t]*)+)"
)
# A bearer token alone: it has a digit or a symbol, or is long (so "Bearer authentication" stays).
_BEARER = re.compile(
    r"(?i)(\bbearer\s+)"
    + _NOT_REDACTED
    + r"(?!-)"
    + r"((?=[A-Za-z]*[0-9._~+/-])[A-Za-z0-9._~+/-]{8,}=*|[A-Za-z]{20,}=*)"
)
# `name=value`, `name = "value"`, `"name": "value"`, `X-Api-Key: value`; the name must say secret.
# Found as name and separator first, the value measured only for a secret name: `A: TOKEN=x` is
# seen as A (no secret), then TOKEN; and no value is scanned once per name before it.
_NAME_AND_SEPARATOR = re.compile(r"(?<![\w.])([\"']?)([A-Za-z_][\w.-]{0,80})\1(\s*[:=]\s*)(?=\S)")
# A value: quoted (to its closing quote, else to the end of the line), else up to whitespace, a
# quote or `&` (a query's separator).
_VALUE = re.compile(r"\"(?:[^\"\\\n]|\\.)*\"|'[^'\n]*'|[^\s\"'&]+|[\"'][^\n]*")

# --- URLs ---------------------------------------------------------------------------------------------

_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]{0,30}://[^\s\"'<>`]+")
_URL_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)([^/?#]*)@")  # to the last @: a password may hold one
_LOGIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,19}$")  # `git@`: a user name alone is no secret
_QUERY_PARAM = re.compile(r"([?&;])([^=&#;]*)=([^&#;]*)")
_SECRET_QUERY_NAMES = frozenset({"code", "awsaccesskeyid", "access_token", "refresh_token", "id_token"})
# Paths whose segments after the marker are the webhook's secret.
_WEBHOOK_PATH = re.compile(
    r"(?i)((?:hooks\.slack\.com/(?:services|workflows|triggers)|/api/webhooks|/webhooks?|/webhookb2|/hooks)/)"
    r"([^\s\"'?#<>`]+)"
)
_BARE_SLACK_HOOK = re.compile(r"(?i)(hooks\.slack\.com/(?:services|workflows|triggers)/)([^\s\"'?#<>`]+)")


def _secret_query_name(name: str) -> bool:
    lowered = name.lower()
    return lowered in _SECRET_QUERY_NAMES or is_secret_name(name)


def redact_url(url: str) -> str:
    """One URL with its password, secret query values and webhook path replaced; host and path stay."""

    def userinfo(match: "re.Match[str]") -> str:
        info = match.group(2)
        if info == REDACTED:
            return match.group(0)
        user, colon, _ = info.partition(":")
        if colon:
            return match.group(1) + user + ":" + REDACTED + "@"
        return match.group(0) if not info or _LOGIN_NAME.match(info) else match.group(1) + REDACTED + "@"

    url = _URL_USERINFO.sub(userinfo, url, count=1)
    url = _WEBHOOK_PATH.sub(lambda m: m.group(1) + REDACTED, url)

    def parameter(match: "re.Match[str]") -> str:
        separator, name, value = match.groups()
        return separator + name + "=" + (REDACTED if value and _secret_query_name(name) else value)

    return _QUERY_PARAM.sub(parameter, url)


# --- flags in argv and in command lines ----------------------------------------------------------------

_FLAG = re.compile(r"^(--?)([A-Za-z][\w.-]*)$")
_FLAG_WITH_VALUE = re.compile(r"^(--?[A-Za-z][\w.-]*)=(.*)$", re.DOTALL)
_NUMBER = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")
_PORT_MAPPING = re.compile(r"^[\d.:\[\]]+(?:/(?:tcp|udp|sctp))?$")
# Programs whose -p (attached or not) is a password, and the other short flags that are one.
_DASH_P_PASSWORD_PROGRAMS = frozenset(
    {
        "sshpass",
        "mysql",
        "mysqldump",
        "mysqladmin",
        "mysqlimport",
        "mysqlshow",
        "mysqlcheck",
        "mysqlpump",
        "mariadb",
        "mariadb-dump",
        "mariadb-admin",
    }
)
_OTHER_PASSWORD_FLAGS = {"redis-cli": "-a"}
# Programs whose -p is no secret: a switch (mkdir -p DIR), a pid (ps -p 7) or a port (ssh -p 22).
_DASH_P_PLAIN_PROGRAMS = frozenset({"mkdir", "cp", "mv", "install", "tar", "rsync", "scp", "ln", "ps", "xargs", "ssh"})
_KNOWN_PROGRAMS = _DASH_P_PASSWORD_PROGRAMS | _DASH_P_PLAIN_PROGRAMS | frozenset(_OTHER_PASSWORD_FLAGS)
_USER_FLAGS = frozenset({"-u", "--user", "-U", "--proxy-user"})
_WRAPPING_LEAD = "\"'([{"
_WRAPPING_TRAIL = "\"'`,;:)]}"


def _program_name(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _is_flag(word: str) -> bool:
    return _FLAG.match(word) is not None or _FLAG_WITH_VALUE.match(word) is not None


def _dash_p_value_is_harmless(value: str) -> bool:
    return (
        _program_name(value) in _KNOWN_PROGRAMS
        or _NUMBER.match(value) is not None
        or _PORT_MAPPING.match(value) is not None
        or "/" in value
        or value.startswith(("~", ".", "-"))
        or value == REDACTED
    )


# An action on word i: ("whole", i) the word is a secret; ("from", i, offset) the word is one from `offset`.
Action = Tuple[str, int, int]


def secret_words(words: Sequence[str]) -> List[Action]:
    """Which of `words` (argv, or a line's words without their quotes and brackets) are secrets, or end in one."""
    actions: List[Action] = []
    program = ""  # the last word that names a program whose -p we know
    values = set()  # words taken as a flag's value: never a flag or a program themselves
    for index, word in enumerate(words):
        if index in values:
            continue
        following = words[index + 1] if index + 1 < len(words) else ""
        takes_next = following != "" and not following.startswith("--")
        with_value = _FLAG_WITH_VALUE.match(word)
        if word.startswith("-p") and len(word) > 2 and word[2] != "=" and program in _DASH_P_PASSWORD_PROGRAMS:
            actions.append(("from", index, 2))  # mysql -pPASSWORD, sshpass -pPASSWORD
        elif with_value:
            flag, value = with_value.groups()
            if value and (is_secret_name(flag) or (flag == "-p" and program in _DASH_P_PASSWORD_PROGRAMS)):
                actions.append(("from", index, len(flag) + 1))
            elif flag in _USER_FLAGS and ":" in value and not value.rpartition(":")[2].isdigit():
                actions.append(("from", index, len(flag) + 1 + value.index(":") + 1))
        elif _FLAG.match(word):
            if word == "-p":
                if program in _DASH_P_PLAIN_PROGRAMS or not takes_next:
                    continue
                if program in _DASH_P_PASSWORD_PROGRAMS or not _dash_p_value_is_harmless(following):
                    actions.append(("whole", index + 1, 0))
                    values.add(index + 1)
            elif word in _USER_FLAGS:
                if takes_next and ":" in following and not following.rpartition(":")[2].isdigit():
                    actions.append(("from", index + 1, following.index(":") + 1))
                    values.add(index + 1)
            elif _OTHER_PASSWORD_FLAGS.get(program) == word:
                if takes_next:
                    actions.append(("whole", index + 1, 0))
                values.add(index + 1)
            elif len(word) > 2 and takes_next and is_secret_name(word):
                actions.append(("whole", index + 1, 0))
                values.add(index + 1)
        elif _program_name(word) in _KNOWN_PROGRAMS:
            program = _program_name(word)
    return actions


def redact_argv(argv: Sequence[str]) -> List[str]:
    """An argv array with flag values and every secret inside its elements replaced."""
    out = [str(arg) for arg in argv]
    for kind, index, offset in secret_words(out):
        if out[index][offset:].strip("\"'") not in ("", REDACTED):
            out[index] = out[index][:offset] + REDACTED
    return [redact_text(arg) for arg in out]


_WORD = re.compile(r"\S+")


def _redact_line_words(line: str) -> str:
    """The flag rules over one line's whitespace-separated words; spacing and punctuation kept."""
    spans = []  # (start, end) of each word's core: the word without wrapping quotes, brackets, commas
    for match in _WORD.finditer(line):
        word = match.group(0)
        lead = len(word) - len(word.lstrip(_WRAPPING_LEAD))
        core = word[lead:].rstrip(_WRAPPING_TRAIL) if lead < len(word) else ""
        spans.append((match.start() + lead, match.start() + lead + len(core), match))
    cores = [line[start:end] for start, end, _ in spans]
    replacements = []  # (start, end) spans of the line to replace, in order
    for kind, index, offset in secret_words(cores):
        start, end, match = spans[index]
        start += offset
        word = match.group(0)
        quote = word[0] if word[0] in "\"'" else None
        if kind == "whole" and quote and quote not in word[1:]:
            closing = line.find(quote, match.end())  # a quoted value with spaces: to its closing quote
            end = closing if closing != -1 else end
        if line[start:end].strip("\"'") not in ("", REDACTED):
            replacements.append((start, end))
    if not replacements:
        return line
    out, position = [], 0
    for start, end in sorted(replacements):
        if start < position:
            continue
        out.append(line[position:start])
        out.append(REDACTED)
        position = end
    out.append(line[position:])
    return "".join(out)


# --- text --------------------------------------------------------------------------------------------


# `key: model.weight` in a log is no secret; `api-key: ...`, `"key": ...` and `key=...` are.
_TOO_PLAIN_BEFORE_A_COLON = frozenset({"key", "pass", "sig", "auth", "signature"})


def _redact_named_values(line: str) -> str:
    out, copied, position = [], 0, 0
    while True:
        match = _NAME_AND_SEPARATOR.search(line, position)
        if match is None:
            break
        quote, name, separator = match.groups()
        position = match.end(2)
        if not is_secret_name(name) or (":" in separator and not quote and name.lower() in _TOO_PLAIN_BEFORE_A_COLON):
            continue
        value = _VALUE.match(line, match.end())
        if value is None:
            continue
        text = value.group(0)
        bare = text.strip("\"'")
        if bare == "" or bare.startswith(REDACTED) or text in "[{":
            position = value.end()
            continue
        wrapped = text[0] if text[0] in "\"'" and len(text) > 1 and text[-1] == text[0] else ""
        out.append(line[copied : value.start()])
        out.append(wrapped + REDACTED + wrapped)
        copied = position = value.end()
    out.append(line[copied:])
    return "".join(out)


def redact_line(line: str) -> str:
    """One line of any text (a command line, a log line, a comment) with every secret in it replaced."""
    line = _URL.sub(lambda m: redact_url(m.group(0)), line)
    line = _redact_named_values(line)  # before the rules that could cut a name in two
    line = _AUTHORIZATION.sub(lambda m: m.group(1) + (m.group(3) or "") + REDACTED, line)
    line = _BEARER.sub(lambda m: m.group(1) + REDACTED, line)
    line = _BARE_SLACK_HOOK.sub(lambda m: m.group(1) + REDACTED, line)
    line = _KNOWN_TOKEN.sub(REDACTED, line)
    return _redact_line_words(line)  # last: it may cut a word that the rules above read as a name


def redact_text(text: str) -> str:
    """Any text, line by line, with every secret the rules know replaced; never raises."""
    if not isinstance(text, str):
        text = str(text)
    text = _PEM_BLOCK.sub(lambda m: m.group(1) + "\n" + REDACTED + "\n" + (m.group(2) or ""), text)
    return "\n".join(redact_line(line) for line in text.split("\n"))


def redact_json(value: Any, depth: int = 0) -> Any:
    """A JSON-able document with every string redacted and the value of every secret-named key replaced."""
    if depth > 64:
        return REDACTED  # deeper than any document we write: not worth the risk of walking it
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {
            key: (
                REDACTED
                if isinstance(key, str)
                and is_secret_name(key)
                and isinstance(item, (str, int, float))
                and not isinstance(item, bool)
                else redact_json(item, depth + 1)
            )
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_json(item, depth + 1) for item in value]
    return value


# --- the config file ---------------------------------------------------------------------------------

_KEY_LINE = re.compile(r"^(\s*)([A-Za-z0-9_.\"'-]+)(\s*=\s*)(.*)$")
# Lossless: every character of the text is in exactly one token (a stray quote is one of its own).
_TOML_TOKEN = re.compile(
    r'"""[\s\S]*?(?:"""|\Z)|\'\'\'[\s\S]*?(?:\'\'\'|\Z)|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*|[^"\'#]+|[\s\S]'
)
_TOML_VALUE_THEN_COMMENT = re.compile(r'^("(?:[^"\\]|\\.)*"|\'[^\']*\'|[^#]*?)(\s*#.*)?$')
_KEY_BEFORE_ARRAY = re.compile(r"([A-Za-z0-9_.-]+)[\"']?\s*=\s*\[\s*$")
_COMMENT_MARKS = re.compile(r"^[\s#]*")
_ARRAY_GAP = re.compile(r"^(?:\s|,|#[^\n]*)*$")


def _redact_config_arrays(text: str) -> str:
    """Every run of string literals in the config (an argv array, on one line or many) through redact_argv."""
    tokens = [m.group(0) for m in _TOML_TOKEN.finditer(text)]
    runs: List[List[int]] = []
    current: Optional[List[int]] = None
    for index, token in enumerate(tokens):
        if len(token) > 1 and token[0] in "\"'" and token[-1] == token[0] and not token.startswith(('"""', "'''")):
            if current is None:
                current = []
                runs.append(current)
            current.append(index)
        elif not _ARRAY_GAP.match(token):
            current = None
    for run in runs:
        before = tokens[run[0] - 1] if run[0] > 0 else ""
        key = _KEY_BEFORE_ARRAY.search(before)
        if key and is_secret_name(key.group(1)):  # api_keys = ["a", "b"]
            for i in run:
                tokens[i] = tokens[i][0] + REDACTED + tokens[i][0]
            continue
        values = [tokens[i][1:-1] for i in run]
        for i, old, new in zip(run, values, redact_argv(values)):
            if new != old:
                tokens[i] = tokens[i][0] + new + tokens[i][0]
    return "".join(tokens)


def redact_config_line(line: str) -> str:
    """One TOML line: a secret-named key's value replaced, commented-out lines too, then the text rules."""
    commented = _COMMENT_MARKS.match(line).group(0)
    if "#" in commented:  # a commented-out line is a line too: `# password = "..."`
        return commented + redact_config_line(line[len(commented) :])
    match = _KEY_LINE.match(line)
    if match:
        indent, key, equals, value = match.groups()
        scalar = value.strip() and value.strip()[0] not in "[{"  # arrays and tables: their strings were done
        if scalar and is_secret_name(key.strip("\"'")) and value.strip().strip("\"'") != REDACTED:
            trailing = _TOML_VALUE_THEN_COMMENT.match(value)
            comment = redact_line(trailing.group(2) or "") if trailing else ""
            return redact_line('%s%s%s"%s"' % (indent, key, equals, REDACTED)) + comment
    return redact_line(line)


def redact_config_text(text: str) -> str:
    """`text` (TOML, possibly invalid) with secrets by key and by value replaced, comments included."""
    if not isinstance(text, str):
        text = str(text)
    text = _PEM_BLOCK.sub(lambda m: m.group(1) + "\n" + REDACTED + "\n" + (m.group(2) or ""), text)
    text = _redact_config_arrays(text)
    return "\n".join(redact_config_line(line) for line in text.split("\n"))
