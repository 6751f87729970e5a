"""Config: lookup order, parsing into dataclasses, one-line errors with file, line and key."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from opsconsole.config import (
    DEFAULT_CONFIG,
    SECTIONS,
    CheckpointDirConfig,
    Config,
    ConfigError,
    NodeConfig,
    load_config,
    parse_config,
)
from opsconsole.config.files import locate_config
from opsconsole.config.locator import KeyLines

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "config.example.toml"

THREE_NODES = """\
[console]
interval = 1

[[nodes]]
name = "a"
host = "a.example"

[[nodes]]
name = "b"
host = "b.example"
port = 2222

[[nodes]]
name = "c"
host = "c.example"
port = "22a"
"""

# (toml text, exact str(ConfigError)); the file is always called x.toml.
ERROR_CASES = [
    # wrong types
    ('[console]\ninterval = "fast"\n', 'x.toml:2: console.interval: expected a number, got "fast"'),
    ("[console]\ntheme = 3\n", "x.toml:2: console.theme: expected a string, got 3"),
    ('[console]\nread_only = "yes"\n', 'x.toml:2: console.read_only: expected a boolean (true or false), got "yes"'),
    ("console = 3\n", "x.toml:1: console: expected a table, got 3"),
    ('[console]\nkeys = "q"\n', 'x.toml:2: console.keys: expected a table, got "q"'),
    ('[console.keys]\nquit = "q"\nhelp = 4\n', "x.toml:3: console.keys.help: expected a key string, got 4"),
    ("[ssh]\nmax_logins = 2.5\n", "x.toml:2: ssh.max_logins: expected an integer, got 2.5"),
    ('[[nodes]]\nhost = "a"\nport = 22.0\n', "x.toml:3: nodes[0].port: expected an integer, got 22.0"),
    ("[console]\ninterval = 1979-05-27\n", "x.toml:2: console.interval: expected a number, got 1979-05-27"),
    ('[console]\ntheme = ["a"]\n', "x.toml:2: console.theme: expected a string, got an array"),
    ("[ssh]\nmax_logins = true\n", "x.toml:2: ssh.max_logins: expected an integer, got true"),
    ('[logs]\npaths = "/var/log/*.log"\n', 'x.toml:2: logs.paths: expected an array of strings, got "/var/log/*.log"'),
    ('[logs]\npaths = [\n  "a",\n  3,\n]\n', "x.toml:4: logs.paths[1]: expected an array of strings, got 3 in it"),
    (
        '[health]\ndisk_paths = ["/", ""]\n',
        "x.toml:2: health.disk_paths[1]: expected an array of strings, got an empty string in it",
    ),
    ('[[nodes]]\nhost = "a"\nuser = 7\n', "x.toml:3: nodes[0].user: expected a string, got 7"),
    ('[nodes]\nhost = "a"\n', "x.toml:1: nodes: expected an array of tables ([[nodes]]), got a table"),
    (THREE_NODES, 'x.toml:16: nodes[2].port: expected an integer, got "22a"'),
    ("[console]\ninterval = inf\n", "x.toml:2: console.interval: expected a finite number, got inf"),
    # unknown keys and sections
    ('[console]\ntheme = "x"\nintervall = 2\n', 'x.toml:3: console.intervall: unknown key; did you mean "interval"?'),
    ("[consol]\ninterval = 2\n", 'x.toml:1: consol: unknown section; did you mean "console"?'),
    ('[[node]]\nhost = "a"\n', 'x.toml:1: node: unknown section; did you mean "nodes"?'),
    ("[metrics]\nx = 1\n", "x.toml:1: metrics: unknown section; expected one of: " + ", ".join(SECTIONS)),
    ("interval = 2\n", "x.toml:1: interval: unknown top-level key; it belongs under [console]"),
    (
        "[ssh]\nzzz = 1\n",
        "x.toml:2: ssh.zzz: unknown key; expected one of: host_key_policy, known_hosts, "
        "max_logins, max_channels, connect_timeout, keepalive_interval, keepalive_count_max, backoff_initial, backoff_max",
    ),
    ('[[nodes]]\nhost = "a"\nprot = 22\n', 'x.toml:3: nodes[0].prot: unknown key; did you mean "port"?'),
    ('[console.kyes]\nquit = "q"\n', 'x.toml:1: console.kyes: unknown key; did you mean "keys"?'),
    # enums
    (
        '[ssh]\nhost_key_policy = "off"\n',
        'x.toml:2: ssh.host_key_policy: host key checking cannot be disabled; use "strict" or "accept-new"',
    ),
    (
        '[ssh]\nhost_key_policy = "no"\n',
        'x.toml:2: ssh.host_key_policy: host key checking cannot be disabled; use "strict" or "accept-new"',
    ),
    (
        "[ssh]\nhost_key_policy = false\n",
        'x.toml:2: ssh.host_key_policy: host key checking cannot be disabled; use "strict" or "accept-new"',
    ),
    (
        '[ssh]\nhost_key_policy = "stric"\n',
        'x.toml:2: ssh.host_key_policy: expected "strict" or "accept-new", got "stric"; did you mean "strict"?',
    ),
    # ranges
    ("[console]\ninterval = 0\n", "x.toml:2: console.interval: must be at least 0.1, got 0"),
    ("[console]\ninterval = -0.5\n", "x.toml:2: console.interval: must be at least 0.1, got -0.5"),
    ("[console]\ninterval = 1e-300\n", "x.toml:2: console.interval: must be at least 0.1, got 1e-300"),
    ('[[nodes]]\nhost = "a"\nport = 70000\n', "x.toml:3: nodes[0].port: must be between 1 and 65535, got 70000"),
    ('[[nodes]]\nhost = "a"\nport = 0\n', "x.toml:3: nodes[0].port: must be between 1 and 65535, got 0"),
    ("[health]\ndisk_free_percent = 101\n", "x.toml:2: health.disk_free_percent: must be between 0 and 100, got 101"),
    ("[health]\nmemory_percent = -1\n", "x.toml:2: health.memory_percent: must be between 0 and 100, got -1"),
    ("[ssh]\nmax_logins = 0\n", "x.toml:2: ssh.max_logins: must be at least 1, got 0"),
    (
        "[ssh]\nbackoff_initial = 10\nbackoff_max = 5\n",
        "x.toml:3: ssh.backoff_max: must be at least backoff_initial (10), got 5",
    ),
    # nodes: names, hosts, hostlists
    (
        '[[nodes]]\nname = "a"\nhost = "h1"\n\n[[nodes]]\nname = "a"\nhost = "h2"\n',
        'x.toml:6: nodes[1].name: duplicate node name "a"; first defined by nodes[0]',
    ),
    (
        '[[nodes]]\nhost = "gpu02"\n[[nodes]]\nhosts = "gpu[01-03]"\n',
        'x.toml:4: nodes[1].hosts: duplicate node name "gpu02"; first defined by nodes[0]',
    ),
    ('[[nodes]]\nhosts = "gpu[01-02],gpu01"\n', 'x.toml:2: nodes[0].hosts: hostlist names "gpu01" twice'),
    ('[[nodes]]\nhosts = "gpu[01-"\n', 'x.toml:2: nodes[0].hosts: bad hostlist "gpu[01-": unbalanced brackets'),
    ('[[nodes]]\nhosts = "gpu[3-1]"\n', 'x.toml:2: nodes[0].hosts: bad hostlist "gpu[3-1]": start > stop'),
    ("[[nodes]]\nhosts = 5\n", "x.toml:2: nodes[0].hosts: expected a hostlist string or an array of strings, got 5"),
    (
        '[[nodes]]\nname = "gpus"\nhosts = "gpu[1-2]"\n',
        'x.toml:3: nodes[0].hosts: "name" and "hosts" cannot be used together; each host of "hosts" is named after itself',
    ),
    (
        '[[nodes]]\nhost = "a"\nhosts = "gpu[1-2]"\n',
        'x.toml:3: nodes[0].hosts: "host" and "hosts" cannot be used together',
    ),
    (
        '[[nodes]]\nhost = "a"\n\n[[nodes]]\nname = "b"\nuser = "ops"\n',
        'x.toml:4: nodes[1]: a node needs "host", "hosts" or "local = true"',
    ),
    (
        '[[nodes]]\nhost = "gpu[1-4]"\n',
        'x.toml:2: nodes[0].host: "gpu[1-4]" looks like a hostlist; use "hosts" for patterns',
    ),
    ('[[nodes]]\nhost = "a b"\n', 'x.toml:2: nodes[0].host: host names cannot contain whitespace, got "a b"'),
    (
        '[[nodes]]\nlocal = true\nhost = "a"\n',
        'x.toml:2: nodes[0].local: a local node has no host; remove "host" or "local"',
    ),
    (
        "[[nodes]]\nlocal = true\nport = 22\n",
        "x.toml:3: nodes[0].port: not used by a local node (it is reached without SSH)",
    ),
    (
        '[[nodes]]\nlocal = true\n[[nodes]]\nname = "me"\nlocal = true\n',
        "x.toml:5: nodes[1].local: only one node can be local; nodes[0] already is",
    ),
    ("nodes = []\n", "x.toml:1: nodes: expected at least one node (leave [[nodes]] out for the local node)"),
    (
        'nodes = [\n  {host = "a"},\n  {host = "b", port = "x"},\n]\n',
        'x.toml:3: nodes[1].port: expected an integer, got "x"',
    ),
    ('[[nodes]]\nhost = "a"\npython = ""\n', "x.toml:3: nodes[0].python: expected a string, got an empty string"),
    # checkpoints
    ('[[checkpoints]]\nnode = "local"\n', 'x.toml:1: checkpoints[0]: missing required key "path"'),
    (
        '[[nodes]]\nhost = "gpu01"\n[[checkpoints]]\npath = "/ck"\nnode = "gpu1"\n',
        'x.toml:5: checkpoints[0].node: no node is named "gpu1"; did you mean "gpu01"?',
    ),
    (
        '[[checkpoints]]\npath = "/ck"\nnode = "elsewhere"\n',
        'x.toml:3: checkpoints[0].node: no node is named "elsewhere"; expected one of: local',
    ),
    # sources: the schema's patterns, a refused key, a required key's example (each a form of msgspec's error text)
    ('[[sources]]\nurl = "ftp://p"\n', 'x.toml:2: sources[0].url: expected an http:// or https:// URL, got "ftp://p"'),
    (
        '[[sources]]\nurl = "http://p:9090"\nrate_window = "1 minute"\n',
        'x.toml:3: sources[0].rate_window: expected a Prometheus duration like "1m" or "30s", got "1 minute"',
    ),
    (
        '[[sources]]\nurl = "http://p:9090"\ngpu_label = "gpu-index"\n',
        'x.toml:3: sources[0].gpu_label: expected a Prometheus label name, got "gpu-index"',
    ),
    (
        '[[sources]]\nurl = "http://p:9090"\nnode_labels = ["ok", "bad label"]\n',
        'x.toml:3: sources[0].node_labels[1]: expected a Prometheus label name, got "bad label"',
    ),
    (
        '[[sources]]\nurl = "http://p:9090"\ninsecure_skip_verify = true\n',
        'x.toml:3: sources[0].insecure_skip_verify: TLS verification cannot be turned off; trust a private CA with "ca_file"',
    ),
    ('[[sources]]\nname = "p"\n', 'x.toml:1: sources[0]: missing required key "url" (e.g. "http://prometheus:9090")'),
    (
        '[[sources]]\nurl = "http://p:9090"\ntelemetry = "prom"\n',
        'x.toml:3: sources[0].telemetry: expected "ssh" or "prometheus", got "prom"',
    ),
    (
        '[[sources]]\nurl = "http://p:9090"\nca_file = "/ca.pem"\n',
        "x.toml:3: sources[0].ca_file: a CA file is only used with an https:// url",
    ),
    # tables of free names, enums given another type, optional bounds, nan where no bound catches it
    (
        '[logs.node_paths]\ngpu01 = ["/a", ""]\n',
        "x.toml:2: logs.node_paths.gpu01[1]: expected an array of strings, got an empty string in it",
    ),
    (
        '[logs]\nnode_paths = ["x"]\n',
        "x.toml:2: logs.node_paths: expected a table of node name = [globs], got an array",
    ),
    (
        '[[alerts]]\nmetric = 3\ncomparison = ">"\nthreshold = 1\n',
        "x.toml:2: alerts[0].metric: expected a metric name, got 3",
    ),
    ("[record]\nmax_age_s = 0\n", "x.toml:2: record.max_age_s: must be greater than 0, got 0"),
    (
        '[[alerts]]\nmetric = "gpu.xid"\ncomparison = ">"\nthreshold = nan\n',
        "x.toml:4: alerts[0].threshold: expected a finite number, got nan",
    ),
    (
        '[actions]\ndrain_command = "scontrol \'open"\n',
        "x.toml:2: actions.drain_command: cannot split the command: No closing quotation",
    ),
    # syntax errors keep tomllib's line
    ("[console]\ninterval = 2\ntheme = \n", "x.toml:3: syntax: invalid value (column 9)"),
    ("[console]\n[console]\n", "x.toml:2: syntax: cannot declare [console] twice (column 9)"),
    (
        '[[nodes]]\nhost = "a"\nport = 22a\n',
        "x.toml:3: syntax: expected newline or end of document after a statement (column 10)",
    ),
    # values holding line breaks stay on one line
    (
        '[console]\ntheme = 1\n[ssh]\nhost_key_policy = "str\\nict"\n',
        "x.toml:2: console.theme: expected a string, got 1",
    ),
    (
        '[ssh]\nhost_key_policy = "str\\nict"\n',
        'x.toml:2: ssh.host_key_policy: expected "strict" or "accept-new", got "str\\nict"; did you mean "strict"?',
    ),
    (
        '[[nodes]]\nhosts = "a\\u2028b"\n',
        'x.toml:2: nodes[0].hosts: bad hostlist "a\\u2028b": host names cannot contain whitespace',
    ),
    ('[console.keys]\n"bad\\nid" = 3\n', 'x.toml:2: console.keys."bad\\nid": expected a key string, got 3'),
]


@pytest.mark.parametrize("text, message", ERROR_CASES, ids=[m.split(": ", 1)[1][:50] for _, m in ERROR_CASES])
def test_config_error_message(text, message):
    with pytest.raises(ConfigError) as info:
        parse_config(text, "x.toml")
    got = str(info.value)
    assert got == message
    assert len(got.splitlines()) == 1


def test_error_carries_its_parts():
    with pytest.raises(ConfigError) as info:
        parse_config(THREE_NODES, "conf/cluster.toml")
    err = info.value
    assert (err.file, err.line, err.key) == ("conf/cluster.toml", 16, "nodes[2].port")
    assert err.message == 'expected an integer, got "22a"'
    assert str(err) == 'conf/cluster.toml:16: nodes[2].port: expected an integer, got "22a"'


def test_file_name_with_a_newline_stays_one_line():
    with pytest.raises(ConfigError) as info:
        parse_config("[console]\ninterval = 0\n", "odd\nname.toml")
    assert str(info.value) == "odd\\nname.toml:2: console.interval: must be at least 0.1, got 0"


# --- the key locator --------------------------------------------------------

LOCATOR_TEXT = '''\
# comment [not a table]
title = "x"                       # line 2
dotted.key.deep = 1               # line 3
[console]                         # line 4
interval = 2
"quoted key" = 'v'                # line 6
[console.keys]                    # line 7
quit = "q"
inline = { a = 1, b = { c = 2 } } # line 9
[[nodes]]                         # line 10
name = "n0"
[[nodes]]                         # line 12
name = "n1"
doc = """
[[nodes]]
fake = 1
"""
port = 22                         # line 18
[nodes.extra]                     # line 19: belongs to nodes[1]
k = 1
[[nodes]]                         # line 21
arr = [
  1,
  [2, 3],                         # line 24
  { z = "]" },                    # line 25
]
lit = \'\'\'a
b\'\'\'
after = true                      # line 29
[ ssh ]                           # line 30
"a.b" . c = 1                     # line 31
'''

LOCATOR_CASES = [
    (("title",), 2),
    (("dotted",), 3),
    (("dotted", "key", "deep"), 3),
    (("console",), 4),
    (("console", "interval"), 5),
    (("console", "quoted key"), 6),
    (("console", "keys"), 7),
    (("console", "keys", "quit"), 8),
    (("console", "keys", "inline", "b", "c"), 9),
    (("nodes",), 10),
    (("nodes", 0), 10),
    (("nodes", 0, "name"), 11),
    (("nodes", 1), 12),
    (("nodes", 1, "doc"), 14),
    (("nodes", 1, "port"), 18),  # the [[nodes]] inside the string is not a header
    (("nodes", 1, "extra"), 19),
    (("nodes", 1, "extra", "k"), 20),
    (("nodes", 2), 21),
    (("nodes", 2, "arr", 0), 23),
    (("nodes", 2, "arr", 1, 1), 24),
    (("nodes", 2, "arr", 2, "z"), 25),
    (("nodes", 2, "after"), 29),
    (("ssh",), 30),
    (("ssh", "a.b", "c"), 31),
    # fallbacks: the nearest enclosing table, then line 1
    (("nodes", 2, "missing"), 21),
    (("console", "keys", "nothing"), 7),
    (("nowhere", "at", "all"), 1),
    (("nodes", 7, "port"), 10),
]


@pytest.mark.parametrize("path, line", LOCATOR_CASES)
def test_locator_finds_line(path, line):
    import tomllib

    tomllib.loads(LOCATOR_TEXT)  # the fixture is valid TOML, like everything the locator sees
    assert KeyLines(LOCATOR_TEXT).line_of(path) == line


def test_locator_handles_crlf_and_no_trailing_newline():
    lines = KeyLines("[a]\r\nx = 1\r\n\r\n[[b]]\r\ny = 2")
    assert lines.line_of(("a", "x")) == 2
    assert lines.line_of(("b", 0, "y")) == 5


def test_locator_keeps_what_it_found_when_text_surprises_it():
    lines = KeyLines("[a]\nx = 1\n= broken\n[b]\n")
    assert lines.line_of(("a", "x")) == 2
    assert lines.line_of(("b",)) == 1  # after the surprise: falls back


# --- parsing good files -----------------------------------------------------


def test_full_config_parses_into_dataclasses():
    text = """
[console]
interval = 0.5
theme = "solar"
read_only = true
[console.keys]
quit = "ctrl+q"
filter = "/"

[[nodes]]
local = true

[[nodes]]
host = "localhost"

[[nodes]]
hosts = "gpu[001-003]"
port = 2222
user = "ops"
identity = "~/.ssh/id_gpu"
jump = "ops@bastion:22"
python = "/usr/bin/python3.11"

[ssh]
host_key_policy = "accept-new"
known_hosts = "~/kh"
max_logins = 4
max_channels = 6
connect_timeout = 3
keepalive_interval = 2
keepalive_count_max = 5
backoff_initial = 0.5
backoff_max = 30

[logs]
paths = ["/var/log/*.log", "~/train/*.out"]

[[checkpoints]]
path = "/ck"
node = "gpu002"

[[checkpoints]]
path = "/local/ck"

[health]
gpu_temperature_c = 80
disk_free_percent = 5
memory_percent = 95.5
disk_paths = ["/", "/scratch"]

[actions]
audit_log = "~/audit.log"
confirm = false
"""
    cfg = parse_config(text, "full.toml", home="/home/tester")
    assert cfg.source == "full.toml"
    assert cfg.console.interval == 0.5 and isinstance(cfg.console.interval, float)
    assert cfg.console.theme == "solar" and cfg.console.read_only is True
    assert cfg.console.keys == (("quit", "ctrl+q"), ("filter", "/"))
    assert cfg.nodes[0] == NodeConfig(name="local", local=True)
    # localhost stays an SSH node, named after its host
    assert cfg.nodes[1] == NodeConfig(name="localhost", host="localhost")
    shared = dict(
        port=2222, user="ops", identity="/home/tester/.ssh/id_gpu", jump="ops@bastion:22", python="/usr/bin/python3.11"
    )
    assert cfg.nodes[2:] == tuple(NodeConfig(name=h, host=h, **shared) for h in ("gpu001", "gpu002", "gpu003"))
    assert cfg.ssh.host_key_policy == "accept-new"
    assert cfg.ssh.known_hosts == "/home/tester/kh"
    assert (cfg.ssh.max_logins, cfg.ssh.max_channels, cfg.ssh.keepalive_count_max) == (4, 6, 5)
    assert (cfg.ssh.connect_timeout, cfg.ssh.keepalive_interval) == (3.0, 2.0)
    assert (cfg.ssh.backoff_initial, cfg.ssh.backoff_max) == (0.5, 30.0)
    assert cfg.logs.paths == ("/var/log/*.log", "~/train/*.out")  # globs on nodes: no local ~ expansion
    assert cfg.checkpoints == (CheckpointDirConfig(path="/ck", node="gpu002"), CheckpointDirConfig(path="/local/ck"))
    assert (cfg.health.gpu_temperature_c, cfg.health.disk_free_percent, cfg.health.memory_percent) == (80, 5, 95.5)
    assert cfg.health.disk_paths == ("/", "/scratch")
    assert cfg.actions.audit_log == "/home/tester/audit.log" and cfg.actions.confirm is False


def test_empty_file_gives_defaults_with_its_source():
    cfg = parse_config("", "empty.toml")
    assert cfg == Config(source="empty.toml")
    assert cfg.nodes == DEFAULT_CONFIG.nodes


def test_default_config_is_the_local_node_every_two_seconds():
    assert DEFAULT_CONFIG.source is None
    assert DEFAULT_CONFIG.console.interval == 2.0
    assert DEFAULT_CONFIG.nodes == (NodeConfig(name="local", local=True),)


def test_no_nodes_section_keeps_the_local_node():
    cfg = parse_config("[console]\ninterval = 5\n", "c.toml")
    assert cfg.nodes == (NodeConfig(name="local", local=True),)
    assert cfg.console.interval == 5.0


def test_hosts_may_be_an_array_of_patterns():
    cfg = parse_config('[[nodes]]\nhosts = ["a[1-2]", "b"]\nuser = "u"\n', "c.toml")
    assert [(n.name, n.host, n.user) for n in cfg.nodes] == [("a1", "a1", "u"), ("a2", "a2", "u"), ("b", "b", "u")]


def test_local_node_can_be_named_and_checkpoint_can_point_at_it():
    cfg = parse_config(
        '[[nodes]]\nname = "login"\nlocal = true\n[[checkpoints]]\npath = "/c"\nnode = "login"\n', "c.toml"
    )
    assert cfg.nodes == (NodeConfig(name="login", local=True),)
    assert cfg.checkpoints[0].node == "login"


def test_tilde_expansion_uses_home(monkeypatch):
    monkeypatch.setenv("HOME", "/home/fromenv")
    cfg = parse_config('[[nodes]]\nhost = "a"\nidentity = "~/.ssh/k"\n', "c.toml")
    assert cfg.nodes[0].identity == "/home/fromenv/.ssh/k"


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[console]\ninterval = 3\n")
    assert load_config(str(path), env={}).console.interval == 3.0


def test_not_utf8_reports_the_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(b'[console]\ntheme = "\xff"\n')
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env={})
    assert str(info.value) == f"{path}:2: syntax: file is not UTF-8 text"


# --- the example file -------------------------------------------------------


def test_example_config_parses():
    cfg = parse_config(EXAMPLE.read_text(encoding="utf-8"), str(EXAMPLE), home="/home/u")
    names = [n.name for n in cfg.nodes]
    assert names[:2] == ["login", "head"]
    assert names[2:19] == [f"gpu{i:03d}" for i in range(1, 17)] + ["gpu020"]
    assert names[-1] == "far"
    assert cfg.nodes[0].local is True
    assert cfg.nodes[-1].jump == "ops@bastion.example:2222"
    assert cfg.nodes[1].identity == "/home/u/.ssh/id_ed25519"
    assert cfg.checkpoints[0].node == "head"


def test_example_config_defaults_match_the_dataclasses():
    cfg = parse_config(EXAMPLE.read_text(encoding="utf-8"), "example")
    assert cfg.console == DEFAULT_CONFIG.console
    assert cfg.ssh == DEFAULT_CONFIG.ssh
    assert cfg.health == DEFAULT_CONFIG.health
    assert cfg.actions == DEFAULT_CONFIG.actions


@pytest.mark.parametrize("section, key", [(s, k) for s, keys in SECTIONS.items() for k in keys])
def test_example_config_mentions_every_key(section, key):
    text = EXAMPLE.read_text(encoding="utf-8")
    # Each key appears as a setting (maybe commented out), a [table] header, or in the [[nodes]] key list.
    setting = re.search(rf"^#?\s*{key}\s*(=|\s)", text, re.M)
    assert setting or f"[{section}.{key}]" in text, key


# --- where the file comes from ---------------------------------------------


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def three_files(tmp_path):
    cli = write(tmp_path / "cli.toml", "[console]\ninterval = 1\n")
    env_file = write(tmp_path / "env.toml", "[console]\ninterval = 2\n")
    xdg = write(tmp_path / "xdg" / "opsconsole" / "config.toml", "[console]\ninterval = 3\n")
    home_default = write(tmp_path / "home" / ".config" / "opsconsole" / "config.toml", "[console]\ninterval = 4\n")
    return dict(cli=cli, env=env_file, xdg=xdg, home=home_default, root=tmp_path)


def located(cli_path, env):
    """The file load_config would read (through its own lookup), None when there is none."""
    found = locate_config(cli_path, env)
    return None if found is None else found[1]


def test_cli_path_wins(three_files):
    env = {"OPSCONSOLE_CONFIG": str(three_files["env"]), "XDG_CONFIG_HOME": str(three_files["root"] / "xdg")}
    assert located(str(three_files["cli"]), env) == three_files["cli"]
    cfg = load_config(str(three_files["cli"]), env)
    assert cfg.console.interval == 1.0 and cfg.source == str(three_files["cli"])


def test_env_variable_beats_xdg(three_files):
    env = {"OPSCONSOLE_CONFIG": str(three_files["env"]), "XDG_CONFIG_HOME": str(three_files["root"] / "xdg")}
    assert located(None, env) == three_files["env"]
    assert load_config(None, env).console.interval == 2.0


def test_xdg_config_home(three_files):
    env = {"XDG_CONFIG_HOME": str(three_files["root"] / "xdg"), "HOME": str(three_files["root"] / "home")}
    assert located(None, env) == three_files["xdg"]
    assert load_config(None, env).console.interval == 3.0


@pytest.mark.parametrize("xdg", [None, "", "relative/dir"])
def test_xdg_defaults_to_home_config(three_files, xdg):
    env = {"HOME": str(three_files["root"] / "home")}
    if xdg is not None:
        env["XDG_CONFIG_HOME"] = xdg  # empty or relative: ignored, as the XDG spec says
    assert located(None, env) == three_files["home"]
    assert load_config(None, env).console.interval == 4.0


def test_empty_env_variable_is_ignored(three_files):
    env = {"OPSCONSOLE_CONFIG": "", "XDG_CONFIG_HOME": str(three_files["root"] / "xdg")}
    assert located(None, env) == three_files["xdg"]


def test_nothing_found_gives_default(tmp_path):
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "nothing")}
    assert located(None, env) is None
    assert load_config(None, env) is DEFAULT_CONFIG


def test_a_config_that_cannot_even_be_looked_for_is_an_error_that_says_why_not_a_traceback(tmp_path):
    # A name too long stands for any lookup that fails other than "absent" (a home the user may not
    # enter, HOME=/root under sudo -u): Path.exists raised it out of the CLI as a traceback.
    xdg = "/" + "a" * 300
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": xdg}
    with pytest.raises(ConfigError) as info:
        load_config(None, env)
    assert str(info.value) == f"{xdg}/opsconsole/config.toml: cannot read config: File name too long"
    run = subprocess.run(
        [sys.executable, "-m", "opsconsole", "check"],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "cannot read config: File name too long" in run.stderr


def test_missing_cli_path_is_an_error_not_the_default(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(str(missing), {"HOME": str(tmp_path)})
    assert str(info.value) == f"{missing}: cannot read config: No such file or directory"


def test_missing_env_path_is_an_error_shown_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config(None, {"OPSCONSOLE_CONFIG": "./conf/missing.toml", "HOME": str(tmp_path)})
    assert str(info.value) == "./conf/missing.toml: cannot read config: No such file or directory"


def test_cli_path_shown_as_given_in_parse_errors(tmp_path, monkeypatch):
    write(tmp_path / "c.toml", "[console]\ninterval = -1\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config("./c.toml", {})
    assert str(info.value) == "./c.toml:2: console.interval: must be at least 0.1, got -1"


def test_cli_path_with_tilde_uses_home(tmp_path):
    write(tmp_path / "my.toml", "[console]\ninterval = 7\n")
    cfg = load_config("~/my.toml", {"HOME": str(tmp_path)})
    assert cfg.console.interval == 7.0 and cfg.source == "~/my.toml"


def test_directory_is_unreadable(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path), {})
    assert str(info.value) == f"{tmp_path}: cannot read config: Is a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file(tmp_path):
    path = write(tmp_path / "locked.toml", "")
    path.chmod(0)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    assert str(info.value) == f"{path}: cannot read config: Permission denied"


def test_broken_xdg_file_is_an_error_not_the_default(tmp_path):
    write(tmp_path / "opsconsole" / "config.toml", "[console\n")
    with pytest.raises(ConfigError) as info:
        load_config(None, {"XDG_CONFIG_HOME": str(tmp_path)})
    assert str(info.value).startswith(f"{tmp_path}/opsconsole/config.toml:1: syntax: ")


def test_empty_cli_path_is_an_error():
    with pytest.raises(ConfigError, match="empty path"):
        load_config("", {})


# Built from lines: it holds both kinds of triple quote.
TRICKY_TOML = "\n".join(
    [
        "",
        '"\\u0041b" = 1',
        "[ \"a\".'b c' ]",
        's = """x\\',
        '  ""y"" """',
        's2 = """a"""""',
        "z = {}",
        "arr = [ # c",
        "  [1, [2]], # ]",
        "  {x = [3]}, \"]\" , ']',",
        "]",
        "d = 1979-05-27 07:32:00Z",
        "[[ t ]]",
        "[[t]]",
        'e = { "k.q" = 1 }',
        "f = '''it's ok'''''",
        "g = 3",
        "",
    ]
)


@pytest.mark.parametrize(
    "path, line",
    [
        (("Ab",), 2),  # escapes in quoted keys are decoded
        (("a", "b c"), 3),
        (("a", "b c", "s2"), 6),  # after a multi-line string with a line-ending backslash
        (("a", "b c", "z"), 7),
        (("a", "b c", "arr", 0, 1, 0), 9),
        (("a", "b c", "arr", 1, "x"), 10),
        (("a", "b c", "arr", 3), 10),
        (("a", "b c", "d"), 12),
        (("t", 0), 13),
        (("t", 1, "e", "k.q"), 15),
        (("t", 1, "g"), 17),  # after a literal string that ends in extra quotes
    ],
)
def test_locator_follows_tricky_toml(path, line):
    import tomllib

    tomllib.loads(TRICKY_TOML)
    assert KeyLines(TRICKY_TOML).line_of(path) == line
