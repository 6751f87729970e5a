"""Incident reports: redaction, the Markdown summary, the archive's members, and the command end to end."""

import json
import subprocess
import sys
import tarfile

import pytest

from opsconsole.diagnosis.finding import Finding
from opsconsole.health.result import HealthResult
from opsconsole.model import STATE_DOWN, NodeState
from opsconsole.report.builder import ReportInputs, summary_markdown, write_report
from opsconsole.report.redact import REDACTED, redact_config_text
from tests.recording_frames import node_state


@pytest.mark.parametrize(
    "line, expected",
    [
        ('token = "abc123"', 'token = "%s"' % REDACTED),
        ('bearer_token = "abc"  # from the vault', 'bearer_token = "%s"  # from the vault' % REDACTED),
        ('bearer_token_file = "/etc/prom/token"', 'bearer_token_file = "/etc/prom/token"'),
        ('password="x"', 'password="%s"' % REDACTED),
        ('url = "https://admin:s3cret@prom.example:9090"', 'url = "https://%s@prom.example:9090"' % REDACTED),
        ('hook = ["/bin/notify", "https://hooks.slack.com/services/T0?token=zzz"]',
         'hook = ["/bin/notify", "https://hooks.slack.com/services/T0?%s"]' % REDACTED),
        ('# token = "kept comment"', '# token = "kept comment"'),
        ('host = "gpu01"', 'host = "gpu01"'),
        ('identity = "~/.ssh/id_ed25519"', 'identity = "~/.ssh/id_ed25519"'),
    ],
)
def test_redaction(line, expected):
    assert redact_config_text(line) == expected


def sample_inputs():
    up = node_state(0, 5)
    down = NodeState(name="gpu009", state=STATE_DOWN, reason="connection refused")
    health = [
        HealthResult(check="gpu_temperature", node="gpu000", gpu=3, status="fail", message="GPU 3 at 91 °C",
                     remedy="check cooling and airflow"),
        HealthResult(check="disk_free", node="gpu000", status="pass", message="/ 40 % free"),
    ]
    finding = Finding(line=120, category="nan_inf", severity="critical", title="Loss became NaN/Inf",
                      cause="learning rate too high or bad data", remedy="lower the learning rate; check the data",
                      excerpt="2026-12-02 18:30:05,123 - ERROR - loss contains NaN!")
    return ReportInputs(
        states={"gpu000": up, "gpu009": down}, created=up.received_at, config_text='token = "t"\n',
        config_source="/etc/opsconsole.toml", health=health,
        findings={"gpu000:/logs/train_gpu000_rank0_1.log": ("nan_inf", [finding, finding])},
        log_tails={("gpu000", "/logs/train_gpu000_rank0_1.log"): ["line one", "line two"]},
        smi={"gpu000": "==============NVSMI LOG==============\n"}, problems=["nvidia-smi -q: gpu009: node down"],
    )


def test_summary_names_nodes_failures_findings_and_remedies():
    text = summary_markdown(sample_inputs())
    assert "| gpu009 | down | connection refused |" in text
    assert "**FAIL** gpu_temperature on gpu000 GPU 3: GPU 3 at 91 °C" in text
    assert "remedy: check cooling and airflow" in text
    assert "Root cause: **nan_inf**" in text
    assert "2 lines, first at line 120" in text
    assert "loss contains NaN!" in text
    assert "nvidia-smi -q: gpu009: node down" in text


def test_archive_holds_every_member(tmp_path):
    path = write_report(sample_inputs(), str(tmp_path / "out"))
    assert path.endswith(".tar.gz") and not (tmp_path / "out" / (path + ".partial")).exists()
    with tarfile.open(path) as tar:
        names = {m.name.split("/", 1)[1]: m for m in tar.getmembers()}
        read = lambda name: tar.extractfile(names[name]).read().decode()  # noqa: E731
        assert set(names) >= {"summary.md", "snapshot.json", "health.json", "findings.json", "config.toml",
                              "errors.txt", "nvidia-smi/gpu000.txt", "logs/gpu000/logs__train_gpu000_rank0_1.log"}
        assert REDACTED in read("config.toml") and '"t"' not in read("config.toml")
        snapshot = json.loads(read("snapshot.json"))
        assert {n["name"] for n in snapshot["nodes"]} == {"gpu000", "gpu009"}
        assert json.loads(read("health.json"))["results"][0]["status"] == "fail"
        assert json.loads(read("findings.json"))[0]["root_cause"] == "nan_inf"
        assert read("logs/gpu000/logs__train_gpu000_rank0_1.log") == "line one\nline two\n"


def test_report_command_on_the_local_node_with_a_log_and_a_secret(tmp_path):
    log = tmp_path / "train_vm_rank0_20261202_120000.log"
    log.write_text("2026-12-02 12:00:00,000 - INFO - Epoch 1 step 10/40 loss 0.5\n"
                   "2026-12-02 12:00:01,000 - ERROR - loss contains NaN!\n")
    config = tmp_path / "c.toml"
    config.write_text('[logs]\npaths = ["%s/train_*.log"]\n[alerting]\nhook = ["/bin/true", "https://x/?token=abc"]\n'
                      % tmp_path)
    out = tmp_path / "reports"
    done = subprocess.run([sys.executable, "-m", "opsconsole", "report", "--config", str(config), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip()
    with tarfile.open(path) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers()}
        summary = tar.extractfile(members["summary.md"]).read().decode()
        config_text = tar.extractfile(members["config.toml"]).read().decode()
        logs = [n for n in members if n.startswith("logs/local/")]
        health = json.loads(tar.extractfile(members["health.json"]).read())["results"]
    assert "| local | up |" in summary
    # The health rules were judged on the collected state: the local node is reachable.
    assert (health[0]["check"], health[0]["status"]) == ("node_reachable", "pass")
    assert "No health results were collected." not in summary
    assert "token=abc" not in config_text
    assert len(logs) == 1
