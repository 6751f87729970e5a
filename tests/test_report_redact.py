"""Redaction of incident reports by key and by value: tables of what goes and what stays, and fuzzers.

The reported leaks (issue 16) are rows here: an alert hook's argv with `--token`, a Slack webhook
URL, `sshpass -p`, a commented-out `# password = ...` line, a process command line with
`--wandb-api-key=...`.
"""

import re
import string

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from opsconsole.report.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_config_text,
    redact_json,
    redact_text,
)

R = REDACTED

# (text, redacted text): free text, command lines, log lines.
TEXT_CASES = [
    # command lines (the reported snapshot.json leak)
    ("python train.py --wandb-api-key=abcd1234ef --lr 3e-4", "python train.py --wandb-api-key=%s --lr 3e-4" % R),
    ("python train.py --wandb-api-key abcd1234ef --lr 3e-4", "python train.py --wandb-api-key %s --lr 3e-4" % R),
    (
        "tool --api_key=k1 --api-key k2 --token t --secret s --key k --passwd p --password=q",
        "tool --api_key=%s --api-key %s --token %s --secret %s --key %s --passwd %s --password=%s" % ((R,) * 7),
    ),
    (
        "app --hf-token x --client-secret y --access-token z",
        "app --hf-token %s --client-secret %s --access-token %s" % ((R,) * 3),
    ),
    (
        "java -Djavax.net.ssl.keyStorePassword=changeit -jar x.jar",
        "java -Djavax.net.ssl.keyStorePassword=%s -jar x.jar" % R,
    ),
    ('tool --password "my secret phrase" --next', 'tool --password "%s" --next' % R),
    ("tool --token --verbose", "tool --token --verbose"),  # a flag after the flag is no value
    # -p: the program decides, else the value's shape
    ("sshpass -p hunter2 ssh gpu01", "sshpass -p %s ssh gpu01" % R),
    ("sshpass -p 1234 ssh gpu01", "sshpass -p %s ssh gpu01" % R),
    ("/usr/bin/sshpass -phunter2 ssh gpu01", "/usr/bin/sshpass -p%s ssh gpu01" % R),
    ("mysql -u root -phunter2 db", "mysql -u root -p%s db" % R),
    ("sudo mysql -p1234 db", "sudo mysql -p%s db" % R),
    ("tool -p hunter2", "tool -p %s" % R),
    ("redis-cli -a hunter2 ping", "redis-cli -a %s ping" % R),
    ("curl -u bob:pw https://x/", "curl -u bob:%s https://x/" % R),
    ("curl --user=bob:pw https://x/", "curl --user=bob:%s https://x/" % R),
    # environment assignments and named values
    ("WANDB_API_KEY=abc HF_TOKEN=def python x.py", "WANDB_API_KEY=%s HF_TOKEN=%s python x.py" % (R, R)),
    ("export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI", "export AWS_SECRET_ACCESS_KEY=%s" % R),
    ("DB_PASSWORD='a b' PGPASSWORD=x MY_SECRET=y", "DB_PASSWORD='%s' PGPASSWORD=%s MY_SECRET=%s" % (R, R, R)),
    ('{"password": "x y", "user": "bob"}', '{"password": "%s", "user": "bob"}' % R),
    ("X-Api-Key: abcdef", "X-Api-Key: %s" % R),
    ("token: abcdef", "token: %s" % R),
    # Authorization
    ('curl -H "Authorization: Bearer abc.def" https://api.x/', 'curl -H "Authorization: Bearer %s" https://api.x/' % R),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic %s" % R),
    ('authorization="token gho_abc"', 'authorization="token %s"' % R),
    ('Authorization: Digest username="bob", response="6629fae4"', "Authorization: Digest %s" % R),
    ("sent Bearer eyJhbGciOi.x1", "sent Bearer %s" % R),
    # URLs
    ("https://admin:s3cret@prom.example:9090/api", "https://admin:%s@prom.example:9090/api" % R),
    ("https://user:p@ss@host/x", "https://user:%s@host/x" % R),
    ("https://0123456789abcdef0123456789abcdef@o1.ingest.sentry.io/5", "https://%s@o1.ingest.sentry.io/5" % R),
    ("https://x/cb?code=abc&page=2&access_token=t#f", "https://x/cb?code=%s&page=2&access_token=%s#f" % (R, R)),
    (
        "https://b.blob.core.windows.net/c?sv=2020&sig=abc%2Bdef&se=2026",
        "https://b.blob.core.windows.net/c?sv=2020&sig=%s&se=2026" % R,
    ),
    (
        "https://s3/x?X-Amz-Credential=AK%2F1&X-Amz-Signature=ff",
        "https://s3/x?X-Amz-Credential=%s&X-Amz-Signature=%s" % (R, R),
    ),
    ("https://hooks.slack.com/services/T000/B000/XXXX", "https://hooks.slack.com/services/%s" % R),
    ("post to hooks.slack.com/services/T000/B000/XXXX now", "post to hooks.slack.com/services/%s now" % R),
    ("https://discord.com/api/webhooks/1234/abcDEF", "https://discord.com/api/webhooks/%s" % R),
    ("https://ci.example/webhook/s3cr3tpath?x=1", "https://ci.example/webhook/%s?x=1" % R),
    ("https://mm.example/hooks/xyz123", "https://mm.example/hooks/%s" % R),
    # tokens of a known shape, wherever they stand
    ("slack xoxb-123-abc and xoxp-1-2-3", "slack %s and %s" % (R, R)),
    ("ghp_" + "a" * 36, R),
    ("github_pat_" + "B" * 30, R),
    ("glpat-" + "c" * 20, R),
    ("key sk-proj-" + "d" * 24, "key %s" % R),
    ("hf_" + "e" * 34, R),
    ("id AKIAIOSFODNN7EXAMPLE.", "id %s." % R),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sig_part", "jwt %s" % R),
    (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\nNzaC1\n-----END OPENSSH PRIVATE KEY-----\nafter",
        "-----BEGIN OPENSSH PRIVATE KEY-----\n%s\n-----END OPENSSH PRIVATE KEY-----\nafter" % R,
    ),
    ("-----BEGIN RSA PRIVATE KEY-----\ncut off", "-----BEGIN RSA PRIVATE KEY-----\n%s\n" % R),
]

# Ordinary things that must come through as they are.
KEPT = [
    "NVIDIA H200 GPU-5e3a1b2c-0000-1111-2222-333344445555 80GB HBM3",
    "python train.py --lr 3e-4 --batch-size 8 --out /scratch/run42/ckpt --max-tokens 2048 --tokenizer gpt2",
    "ssh -p 2222 gpu01",
    "make -p 8",
    "mkdir -p /scratch/run42/ckpt",
    "docker run -u 1000:1000 -p 8080:80 -p 127.0.0.1:9000:9000/tcp img",
    "torchrun --nproc-per-node 8 --key-size 2048 --password-file /etc/pw --token-file ~/.tok train.py",
    "PWD=/home/alice OLDPWD=/ CUDA_VISIBLE_DEVICES=0,1 NCCL_IB_DISABLE=1",
    "ssh://git@github.com/org/repo.git",
    "https://prom.example:9090/api/v1/query?query=up&time=1700000000",
    'bearer_token_file = "/etc/prom/token"',
    "Bearer tokens are sent in a header; Bearer authentication",
    "Missing key(s) in state_dict: \"layer.0.weight\"; Loading key: model.weight; KeyError: 'x'",
    "tar -pxf archive.tar; cp -p a b",
    "2026-12-02 18:30:05,123 - ERROR - loss contains NaN! step=120 loss=nan",
    "task-abcdefghijklmnopqrstu disk-usage sk-learn",
    "/etc/opsconsole/hooks/notify.sh",
]


@pytest.mark.parametrize("text, expected", TEXT_CASES)
def test_redact_text(text, expected):
    assert redact_text(text) == expected
    assert redact_text(expected) == expected  # idempotent


@pytest.mark.parametrize("text", KEPT)
def test_ordinary_text_is_kept(text):
    assert redact_text(text) == text


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["notify", "--token", "xoxb-123-abc"], ["notify", "--token", R]),
        (["notify", "--token=abc"], ["notify", "--token=%s" % R]),
        (["sshpass", "-p", "hunter2", "ssh", "-p", "22", "gpu01"], ["sshpass", "-p", R, "ssh", "-p", "22", "gpu01"]),
        (["mkdir", "-p", "run42"], ["mkdir", "-p", "run42"]),
        (["ssh", "-p", "22", "gpu01"], ["ssh", "-p", "22", "gpu01"]),
        (
            ["/bin/notify", "https://hooks.slack.com/services/T000/B000/XXXX"],
            ["/bin/notify", "https://hooks.slack.com/services/%s" % R],
        ),
        (["curl", "-H", "Authorization: Bearer abcdefgh1"], ["curl", "-H", "Authorization: Bearer %s" % R]),
        (["env", "HF_TOKEN=abc", "python", "x.py"], ["env", "HF_TOKEN=%s" % R, "python", "x.py"]),
        (["bash", "-c", "sshpass -p hunter2 ssh gpu01"], ["bash", "-c", "sshpass -p %s ssh gpu01" % R]),
        (["tool", "--password", "has space"], ["tool", "--password", R]),
        (["tool", "--token", ""], ["tool", "--token", ""]),
    ],
)
def test_redact_argv(argv, expected):
    assert redact_argv(argv) == expected


CONFIG = """\
[alerting]
hook = ["notify", "--token", "xoxb-123-abc"]
webhook_hook = [
  "/bin/notify",  # posts to Slack
  "https://hooks.slack.com/services/T000/B000/XXXX",
]
ssh_hook = ["sshpass", "-p", "hunter2", "ssh", "gpu01"]
# password = "hunter2"
  ## api_key="k-123"  # old
#hook = ["notify", "--api-key", "abc123"]
token = "t"  # from the vault
password = "a #b"
creds = { user = "bob", password = "x" }
api_keys = [
  "k1",
  "k2",
]
[sources.prometheus]
url = "https://admin:s3cret@prom.example:9090"
bearer_token_file = "/etc/prom/token"
identity = "~/.ssh/id_ed25519"
host = "gpu01"
"""

CONFIG_REDACTED = """\
[alerting]
hook = ["notify", "--token", "{R}"]
webhook_hook = [
  "/bin/notify",  # posts to Slack
  "https://hooks.slack.com/services/{R}",
]
ssh_hook = ["sshpass", "-p", "{R}", "ssh", "gpu01"]
# password = "{R}"
  ## api_key="{R}"  # old
#hook = ["notify", "--api-key", "{R}"]
token = "{R}"  # from the vault
password = "{R}"
creds = {{ user = "bob", password = "{R}" }}
api_keys = [
  "{R}",
  "{R}",
]
[sources.prometheus]
url = "https://admin:{R}@prom.example:9090"
bearer_token_file = "/etc/prom/token"
identity = "~/.ssh/id_ed25519"
host = "gpu01"
""".format(R=R)


def test_config_argv_arrays_comments_and_keys():
    assert redact_config_text(CONFIG) == CONFIG_REDACTED
    assert redact_config_text(CONFIG_REDACTED) == CONFIG_REDACTED


def test_redacted_config_is_still_toml():
    import tomllib

    assert tomllib.loads(redact_config_text(CONFIG))["sources"]["prometheus"]["host"] == "gpu01"


def test_json_documents():
    document = {
        "nodes": [
            {
                "name": "gpu01",
                "reason": "auth failed for https://u:pw@x/",
                "processes": [
                    {
                        "pid": 7,
                        "command": "python train.py --wandb-api-key=abcd1234",
                        "gpu_memory_bytes": 5,
                        "watched_env": ["NCCL_IB_DISABLE=1", "HF_TOKEN=hf_" + "x" * 30],
                    }
                ],
                "password": "hunter2",
                "auth": {"token": 5},
                "ok": True,
            }
        ]
    }
    node = redact_json(document)["nodes"][0]
    assert node["reason"] == "auth failed for https://u:%s@x/" % R
    assert node["processes"][0]["command"] == "python train.py --wandb-api-key=%s" % R
    assert node["processes"][0]["watched_env"] == ["NCCL_IB_DISABLE=1", "HF_TOKEN=%s" % R]
    assert node["processes"][0]["gpu_memory_bytes"] == 5 and node["ok"] is True
    assert node["password"] == R and node["auth"] == {"token": R}


@pytest.mark.parametrize(
    "name, secret",
    [
        ("password", True),
        ("WANDB_API_KEY", True),
        ("keyStorePassword", True),
        ("PASSWORD2", True),
        ("api_keys", True),
        ("--hf-token", True),
        ("webhook_url", True),
        ("bearer_token_file", False),
        ("max_tokens", False),
        ("tokenizer", False),
        ("PWD", False),
        ("author", False),
        ("monkey", False),
        ("key_size", False),
        ("", False),
    ],
)
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


# --- fuzz ------------------------------------------------------------------------------------------------

_SECRET_BODY = st.text(string.ascii_letters + string.digits, min_size=12, max_size=40)
# Each kind: how a secret (made of the body) is written in text. The secret is what must never appear.
_KINDS = [
    lambda s: ("--token " + s, s),
    lambda s: ("--api-key=" + s, s),
    lambda s: ("--password '" + s + "'", s),
    lambda s: ("sshpass -p " + s, s),
    lambda s: ("mysql -p" + s, s),
    lambda s: ("WANDB_API_KEY=" + s, s),
    lambda s: ('"client_secret": "' + s + '"', s),
    lambda s: ("Authorization: Bearer " + s, s),
    lambda s: ("Authorization: Basic " + s, s),
    lambda s: ("https://user:" + s + "@host.example/x", s),
    lambda s: ("https://host.example/cb?a=1&access_token=" + s + "&b=2", s),
    lambda s: ("https://host.example/x?sig=" + s, s),
    lambda s: ("https://hooks.slack.com/services/T0/B0/" + s, s),
    lambda s: ("https://discord.com/api/webhooks/1/" + s, s),
    lambda s: ("https://ci.example/webhook/" + s, s),
    lambda s: ("xoxb-" + s, "xoxb-" + s),
    lambda s: ("ghp_" + s + "abcd", "ghp_" + s + "abcd"),
    lambda s: ("glpat-" + s + "abcd", "glpat-" + s + "abcd"),
    lambda s: ("sk-" + s + "abcd", "sk-" + s + "abcd"),
    lambda s: ("hf_" + s + "abcd", "hf_" + s + "abcd"),
    lambda s: ("AKIA" + (s.upper() * 2)[:16], "AKIA" + (s.upper() * 2)[:16]),
    lambda s: ("eyJ" + s + ".eyJ" + s + "." + s, "eyJ" + s + ".eyJ" + s),
]
# Surrounding text: words, punctuation, other flags, anything but what could glue onto the secret.
_AROUND = st.lists(
    st.one_of(
        st.text(string.ascii_letters + string.digits + "/:.,=()[]{}#!?", max_size=12),
        st.sampled_from(["--lr", "3e-4", "-p", "8", "python", "train.py", "'", '"', "&&", "|", "#"]),
    ),
    max_size=6,
).map(" ".join)


@settings(max_examples=250)
@given(kind=st.sampled_from(range(len(_KINDS))), body=_SECRET_BODY, before=_AROUND, after=_AROUND, config=st.booleans())
def test_fuzz_an_embedded_secret_never_survives(kind, body, before, after, config):
    text, secret = _KINDS[kind](body)
    assume(secret not in before and secret not in after)
    line = before + " " + text + "\n" + after if config else before + " " + text + " " + after
    redacted = redact_config_text(line) if config else redact_text(line)
    assert secret not in redacted
    assert (redact_config_text(redacted) if config else redact_text(redacted)) == redacted


@settings(max_examples=200)
@given(
    argv=st.lists(
        st.one_of(
            st.sampled_from(["--token", "-p", "sshpass", "mysql", "--api-key=x", "--user", ""]), st.text(max_size=20)
        ),
        max_size=8,
    )
)
def test_fuzz_argv_is_total_and_keeps_its_length(argv):
    redacted = redact_argv(argv)
    assert len(redacted) == len(argv)
    assert redact_argv(redacted) == redacted


# Arbitrary text, leaning on the characters the rules look at, control characters and lone surrogates.
_HOSTILE = st.lists(
    st.one_of(
        st.characters(),
        st.sampled_from(list("\"'#=:&?/@-_ \n\t\x00\x1b\ud800\udcff[]{}<>")),
        st.sampled_from(
            [
                "--token",
                "-p",
                "sshpass",
                "mysql",
                "https://",
                "Authorization:",
                "Bearer ",
                "password",
                "xoxb-",
                "eyJ",
                "-----BEGIN RSA PRIVATE KEY-----",
                "hooks.slack.com/services/",
                "-----END RSA PRIVATE KEY-----",
                REDACTED,
            ]
        ),
    ),
    max_size=40,
).map("".join)


@settings(max_examples=300)
@given(text=_HOSTILE)
def test_fuzz_redaction_never_raises_and_is_idempotent(text):
    once = redact_text(text)
    assert redact_text(once) == once
    config_once = redact_config_text(text)
    assert redact_config_text(config_once) == config_once


def test_redaction_of_long_hostile_lines_is_linear_enough():
    # Patterns that could backtrack: many token prefixes, quotes and flags on one long line.
    pieces = ("eyJ" + "a" * 9 + ".", '"password": "', "--token ", "https://a:", "a=", "Authorization: ", "-----BEGIN ")
    for piece in pieces:
        text = piece * 5000
        assert isinstance(redact_text(text), str)
        assert re.search(r"\S", redact_config_text(text))
