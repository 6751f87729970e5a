"""Incident reports: the Markdown summary, the archive's members (redacted), where and how privately it is
written, and the command end to end. The redaction rules themselves: tests/test_report_redact.py."""

import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from dataclasses import replace

import pytest

from opsconsole.diagnosis.run import diagnose_run_lines
from opsconsole.health.result import HealthResult
from opsconsole.model import STATE_DOWN, NodeState, ProcessSample
from opsconsole.report.builder import (
    ReportDestinationError,
    ReportInputs,
    default_report_dir,
    report_files,
    summary_markdown,
    write_report,
)
from opsconsole.report.redact import REDACTED
from tests.recording_frames import node_state

NAN_LINES = [
    "2026-12-02 18:30:00,000 - INFO - Epoch 1 step 10/40 loss 0.5",
    "2026-12-02 18:30:05,123 - ERROR - loss contains NaN!",
    "2026-12-02 18:30:06,123 - ERROR - loss contains NaN!",
]


def sample_inputs():
    up = node_state(0, 5)
    down = NodeState(name="gpu009", state=STATE_DOWN, reason="connection refused")
    health = [
        HealthResult(
            check="gpu_temperature",
            node="gpu000",
            gpu=3,
            status="fail",
            message="GPU 3 at 91 °C",
            remedy="check cooling and airflow",
        ),
        HealthResult(check="disk_free", node="gpu000", status="pass", message="/ 40 % free"),
    ]
    tails = {("gpu000", "/logs/train_gpu000_rank0_1.log"): NAN_LINES}
    return ReportInputs(
        states={"gpu000": up, "gpu009": down},
        created=up.received_at,
        config_text='token = "t"\n',
        config_source="/etc/opsconsole.toml",
        health=health,
        run=diagnose_run_lines(tails),
        log_tails=tails,
        smi={"gpu000": "==============NVSMI LOG==============\n"},
        problems=["nvidia-smi -q: gpu009: node down"],
    )


def test_summary_names_nodes_failures_findings_and_remedies():
    text = summary_markdown(sample_inputs())
    assert "| gpu009 | down | connection refused |" in text
    assert "**FAIL** gpu_temperature on gpu000 GPU 3: GPU 3 at 91 °C" in text
    assert "remedy: check cooling and airflow" in text
    assert "Root cause: **NaN/Inf in loss or gradients** [nan_inf, error], started on rank 0" in text
    assert "2 lines, first at line 2" in text
    assert "loss contains NaN!" in text
    assert "nvidia-smi -q: gpu009: node down" in text


def test_archive_holds_every_member(tmp_path):
    path = write_report(sample_inputs(), str(tmp_path))
    assert path.endswith(".tar.gz") and os.path.dirname(path) == str(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [os.path.basename(path)]  # no temporary file left
    with tarfile.open(path) as tar:
        names = {m.name.split("/", 1)[1]: m for m in tar.getmembers()}
        read = lambda name: tar.extractfile(names[name]).read().decode()  # noqa: E731
        assert set(names) >= {
            "summary.md",
            "snapshot.json",
            "health.json",
            "findings.json",
            "config.toml",
            "errors.txt",
            "nvidia-smi/gpu000.txt",
            "logs/gpu000/logs__train_gpu000_rank0_1.log",
        }
        assert REDACTED in read("config.toml") and '"t"' not in read("config.toml")
        snapshot = json.loads(read("snapshot.json"))
        assert {n["name"] for n in snapshot["nodes"]} == {"gpu000", "gpu009"}
        assert json.loads(read("health.json"))["results"][0]["status"] == "fail"
        assert json.loads(read("findings.json"))["run"]["root_cause"] == "nan_inf"
        assert read("logs/gpu000/logs__train_gpu000_rank0_1.log") == "\n".join(NAN_LINES) + "\n"


def test_report_command_on_the_local_node_with_a_log_and_a_secret(tmp_path):
    log = tmp_path / "train_vm_rank0_20261202_120000.log"
    log.write_text(
        "2026-12-02 12:00:00,000 - INFO - Epoch 1 step 10/40 loss 0.5\n"
        "2026-12-02 12:00:01,000 - ERROR - loss contains NaN!\n"
    )
    config = tmp_path / "c.toml"
    config.write_text(
        '[logs]\npaths = ["%s/train_*.log"]\n[alerting]\nhook = ["/bin/true", "https://x/?token=abc"]\n'
        '# hook = ["notify", "--token", "xoxb-123-abc"]\n' % tmp_path
    )
    state = tmp_path / "state"
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "report", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, XDG_STATE_HOME=str(state)),
    )
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip()
    # Not the current directory: the private reports directory, 0700, the report 0600.
    assert os.path.dirname(path) == str(state / "opsconsole" / "reports")
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
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
    assert "token=abc" not in config_text and "xoxb-123-abc" not in config_text
    assert len(logs) == 1


RUN = os.path.join(os.path.dirname(__file__), "data", "report_run")  # real gloo output: see its README.md


def test_report_gives_the_runs_one_verdict_then_each_logs_findings(tmp_path):
    """Per-file root causes contradicted the run: rank 0's file said nan_inf, rank 1's nccl_remote (gloo's peer
    closed), while `diagnose --run` and the console say nan_inf on rank 0. The report now says what they say."""
    logs = tmp_path / "logs"
    shutil.copytree(RUN, logs, ignore=shutil.ignore_patterns("*.md"))
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "report", "--logs", str(logs / "*.log"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    run = subprocess.run(
        [sys.executable, "-m", "opsconsole", "diagnose", "--run", "--json", str(logs)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    verdict = json.loads(run.stdout)
    assert (verdict["root_cause"], verdict["rank"]) == ("nan_inf", 0)
    with tarfile.open(done.stdout.strip()) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers()}
        summary = tar.extractfile(members["summary.md"]).read().decode()
        findings = json.loads(tar.extractfile(members["findings.json"]).read())
    rank0 = "local:%s" % (logs / "train_gpu01_rank0_20261204.log")
    rank1 = "local:%s" % (logs / "train_gpu02_rank1_20261204.log")
    section = summary.split("## Findings in the logs", 1)[1]
    # One verdict, the same as diagnose --run's, before any file's findings; no file has a root cause of its own.
    assert section.count("Root cause") == 1
    assert (
        "Root cause: **NaN/Inf in loss or gradients** [nan_inf, error], started on rank 0, in %s line %d:"
        % (
            rank0,
            verdict["line"],
        )
        in section
    )
    assert (
        section.index("Root cause")
        < section.index("### %s (rank 0)" % rank0)
        < section.index("### %s (rank 1)" % rank1)
    )
    rank1_part = section.split("### %s (rank 1)" % rank1, 1)[1]
    assert "**A peer rank failed (gloo connection lost)** (nccl_remote, error; 1 line, first at line 11)" in rank1_part
    assert "Connection closed by peer" in rank1_part
    assert "rank 1 said a peer closed its connection: consequences, not the cause" in section
    assert {k: findings["run"][k] for k in ("root_cause", "rank", "line")} == {
        "root_cause": "nan_inf",
        "rank": 0,
        "line": verdict["line"],
    }
    assert findings["run"]["file"] == rank0
    by_file = {entry["file"]: [f["category"] for f in entry["findings"]] for entry in findings["files"]}
    assert by_file == {rank0: ["nan_inf"], rank1: ["nccl_remote"]}
    assert all("root_cause" not in entry for entry in findings["files"])


# --- secrets by value in every member (the reported leaks) -----------------------------------------------


def leaky_inputs():
    inputs = sample_inputs()
    up = inputs.states["gpu000"]
    train = ProcessSample(
        pid=4242,
        name="python",
        user="alice",
        gpu_index=0,
        command="python train.py --wandb-api-key=abcd1234efgh5678 --lr 3e-4 --out /scratch/run42/ckpt",
        watched_env=("NCCL_IB_DISABLE=1",),
    )
    helper = ProcessSample(pid=4243, name="sshpass", command="sshpass -p hunter2 ssh gpu01")
    frame = replace(up.frame, processes=(train,), top_processes=(helper,))
    inputs.states["gpu000"] = replace(up, frame=frame, reason="webhook https://hooks.slack.com/services/T000/B000/XXXX")
    inputs.config_text = (
        '[alerting]\nhook = ["notify", "--token", "xoxb-123-abc"]\n'
        'ssh_hook = ["sshpass", "-p", "hunter2", "ssh", "gpu01"]\n'
        '# password = "commented-out-pw"\n'
        'webhook = "https://hooks.slack.com/services/T000/B000/XXXX"\n'
    )
    inputs.log_tails = {
        ("gpu000", "/logs/train.log"): ["export HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz", "step 1 loss 0.5"],
    }
    inputs.problems.append("hook failed: curl -H 'Authorization: Bearer sekrit-bearer-1' https://x/")
    return inputs


SECRETS = [
    "xoxb-123-abc",
    "hunter2",
    "commented-out-pw",
    "T000/B000/XXXX",
    "abcd1234efgh5678",
    "hf_abcdefghijklmnopqrstuvwxyz",
    "sekrit-bearer-1",
]


def test_no_member_of_the_report_carries_a_secret():
    files = report_files(leaky_inputs())
    for name, data in files.items():
        text = data.decode()
        for secret in SECRETS:
            assert secret not in text, (name, secret)
    snapshot = json.loads(files["snapshot.json"])
    node = next(n for n in snapshot["nodes"] if n["name"] == "gpu000")
    # What makes the report useful stays: the flags, the program, the other arguments.
    assert (
        node["processes"][0]["command"]
        == "python train.py --wandb-api-key=%s --lr 3e-4 --out /scratch/run42/ckpt" % REDACTED
    )
    assert node["top_processes"][0]["command"] == "sshpass -p %s ssh gpu01" % REDACTED
    assert node["processes"][0]["watched_env"] == ["NCCL_IB_DISABLE=1"]
    config = files["config.toml"].decode()
    assert 'hook = ["notify", "--token", "%s"]' % REDACTED in config
    assert '# password = "%s"' % REDACTED in config
    assert "step 1 loss 0.5" in files["logs/gpu000/logs__train.log"].decode()


def test_text_that_cannot_be_encoded_or_drawn_still_makes_a_report():
    inputs = sample_inputs()
    down = inputs.states["gpu009"]
    inputs.states["gpu009"] = replace(down, reason="bad name \udcff\x1b]52;c;AAAA\x07 \ud800")
    summary = report_files(inputs)["summary.md"].decode()
    assert "\x1b" not in summary and "bad name" in summary


# --- where the report goes, and how privately -------------------------------------------------------------


def modes(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_default_is_a_private_file_in_a_private_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    old_umask = os.umask(0)  # the mode is set when the file is made, not left to the umask
    try:
        path = write_report(sample_inputs())
    finally:
        os.umask(old_umask)
    directory = tmp_path / "state" / "opsconsole" / "reports"
    assert os.path.dirname(path) == str(directory) == default_report_dir()
    assert modes(directory) == 0o700 and modes(path) == 0o600
    with tarfile.open(path) as tar:
        assert {member.mode for member in tar.getmembers()} == {0o600}
    assert sorted(p.name for p in directory.iterdir()) == [os.path.basename(path)]


def test_a_loose_reports_directory_of_ours_is_tightened(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    directory = tmp_path / "opsconsole" / "reports"
    directory.mkdir(parents=True)
    directory.chmod(0o755)
    write_report(sample_inputs())
    assert modes(directory) == 0o700


def test_two_reports_in_one_second_both_stay(tmp_path):
    inputs = sample_inputs()
    first = write_report(inputs, str(tmp_path))
    second = write_report(inputs, str(tmp_path))
    assert first != second and second.endswith("-2.tar.gz")
    assert os.path.exists(first) and os.path.exists(second)


def test_out_as_a_new_file(tmp_path):
    out = tmp_path / "incident.tar.gz"
    assert write_report(sample_inputs(), str(out)) == str(out)
    assert modes(out) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["incident.tar.gz"]


@pytest.mark.parametrize("out", ["missing/x", "missing/x.tar.gz", "missing/", "x"])
def test_out_never_creates_a_directory(tmp_path, out):
    with pytest.raises(ReportDestinationError, match="(does not exist|no such directory)"):
        write_report(sample_inputs(), str(tmp_path / out) + ("/" if out.endswith("/") else ""))
    assert list(tmp_path.iterdir()) == []


def test_out_never_overwrites_a_file(tmp_path):
    out = tmp_path / "incident.tar.gz"
    out.write_bytes(b"keep me")
    with pytest.raises(ReportDestinationError, match="exists; not overwritten"):
        write_report(sample_inputs(), str(out))
    assert out.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["incident.tar.gz"]


def test_report_command_with_a_missing_out_directory_is_one_line_and_exit_2(tmp_path):
    from opsconsole.cli import main

    missing = tmp_path / "nonexistent" / "x"
    proc = subprocess.run(
        [sys.executable, "-m", "opsconsole", "report", "--out", str(missing)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "no such directory" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "nonexistent").exists()
    assert main(["report", "--out", str(tmp_path / "nonexistent" / "x.tar.gz")]) == 2
    assert not (tmp_path / "nonexistent").exists()
