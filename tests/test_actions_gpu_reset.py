"""GPU reset end to end with a stub command from config (never a real GPU), pre-checks, quoting, dry run.

GPUs come from the real H200 captures; the stub is a script in the temp dir that records its
argv, run locally and over a real sshd. The reset command template is the config's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import pytest
from h200_fleet import idle_gpu, load_process, loaded_gpu

from opsconsole.actions import gpu_reset
from opsconsole.actions.audit import AuditLog
from opsconsole.actions.registry import TARGET_GPU, ActionContext, Refused, Target, plan_action, run_plan
from opsconsole.actions.runner import ActionRunner
from opsconsole.config import ActionsConfig, Config, ConsoleConfig, NodeConfig, SshConfig, parse_config
from opsconsole.model import STATE_UP, GpuSample, NodeFrame, NodeState, ProcessSample
from opsconsole.nodes.local import LocalLink
from tests.sshd import ssh_client, sshd_factory  # noqa: F401

# The node is this machine, as the console's embedded default is: its GPUs are ours to reset (with a stub).
THIS_MACHINE = LocalLink(NodeConfig(name="local", local=True), 1.0)

REPO = Path(__file__).resolve().parents[1]
FAST = SshConfig(
    connect_timeout=5.0, keepalive_interval=0.5, keepalive_count_max=2, backoff_initial=0.05, backoff_max=0.5
)

RECORDING_STUB = """#!{python}
import json, os, sys
out = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "argv.json")
json.dump(sys.argv[1:], open(out, "w"))
print("GPU 00000000:00:00.0 was successfully reset.")
"""


def recording_stub(folder: Path) -> Path:
    stub = folder / "fake-nvidia-smi"
    stub.write_text(RECORDING_STUB.format(python=sys.executable))
    stub.chmod(0o755)
    return stub


def recorded_argv(folder: Path):
    path = folder / "argv.json"
    return json.loads(path.read_text()) if path.exists() else None


class Node:
    """A live node whose every frame (received now) has these GPUs and compute processes."""

    def __init__(self, name: str, gpus: Sequence[GpuSample], processes: Sequence[ProcessSample] = ()) -> None:
        self.name, self.gpus, self.processes = name, tuple(gpus), tuple(processes)

    def state(self) -> NodeState:
        now = time.time()
        frame = NodeFrame(node=self.name, time=now, gpus=self.gpus, processes=self.processes, gpu_source="nvml")
        return NodeState(name=self.name, state=STATE_UP, frame=frame, received_at=now, since=now)


def config_with(tmp_path: Path, template_toml: str) -> Config:
    """The [actions] section parsed from TOML, as a user writes it."""
    text = '[actions]\naudit_log = "%s"\n%s\n' % (tmp_path / "audit.log", template_toml)
    parsed = parse_config(text, "test.toml")
    return replace(parsed, console=ConsoleConfig(interval=0.2))


def context(config: Config, get_state, link=THIS_MACHINE) -> ActionContext:
    return ActionContext(
        config=config, get_state=get_state, link=link, runner=ActionRunner(AuditLog(config.actions.audit_log))
    )


def audit_records(tmp_path: Path):
    path = tmp_path / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_reset_end_to_end_with_a_stub_from_config(tmp_path):
    stub = recording_stub(tmp_path)
    config = config_with(tmp_path, 'gpu_reset_command = ["%s", "--gpu-reset", "-i", "{index}", "--id={uuid}"]' % stub)
    node = Node("n1", [idle_gpu(0), loaded_gpu(1)], [load_process(gpu_index=1)])
    ctx = context(config, node.state)  # the health checks are opsconsole.health's own
    plan = await plan_action("gpu_reset", Target(TARGET_GPU, "n1", gpu=0), ctx)
    assert plan.word == "n1/0"
    assert plan.argv == (str(stub), "--gpu-reset", "-i", "0", "--id=" + idle_gpu(0).uuid)
    assert [(c.name, c.status) for c in plan.checks] == [
        ("node", "pass"),
        ("gpu", "pass"),
        ("compute processes", "pass"),
        ("MIG", "pass"),
        ("privileges", "pass"),
    ]
    assert recorded_argv(tmp_path) is None  # planning runs nothing
    report = await run_plan(plan, ctx)
    assert report.ok, report.lines
    assert recorded_argv(tmp_path) == ["--gpu-reset", "-i", "0", "--id=" + idle_gpu(0).uuid]
    assert "successfully reset" in report.output
    assert any(line.startswith("GPU 0 read again:") and "°C" in line for line in report.lines)
    health = [line for line in report.lines if line.startswith("health ")]
    assert any(line.startswith("health pass: gpu_temperature gpu 0 ") for line in health), health
    assert not any(" gpu 1 " in line for line in health)  # only the reset GPU's (and node-wide) results
    assert any("gpu_sanity" in line for line in health)  # the GPU suite ran too (here: no GPU, an error result)
    records = audit_records(tmp_path)
    assert [(r["action"], r["outcome"]) for r in records] == [("gpu_reset", "attempt"), ("gpu_reset", "ok")]
    assert records[0]["command"] == list(plan.argv) and records[0]["target"] == "gpu 0"


async def test_compute_processes_on_the_gpu_refuse_the_reset(tmp_path):
    stub = recording_stub(tmp_path)
    config = config_with(tmp_path, 'gpu_reset_command = ["%s", "-i", "{index}"]' % stub)
    node = Node("n1", [idle_gpu(0), loaded_gpu(1)], [load_process(gpu_index=1)])
    ctx = context(config, node.state)
    with pytest.raises(Refused) as refused:
        await plan_action("gpu_reset", Target(TARGET_GPU, "n1", gpu=1), ctx)
    assert "1 on GPU 1: %d (python3)" % load_process().pid in str(refused.value)
    assert recorded_argv(tmp_path) is None and audit_records(tmp_path) == []


def test_frame_prechecks_mig_lost_missing_and_not_live():
    state = Node(
        "n1",
        [replace(idle_gpu(0), mig_mode=True), replace(idle_gpu(1), lost=True), replace(idle_gpu(2), mig_mode=None)],
    ).state()
    by_gpu = {i: {c.name: (c.status, c.message) for c in gpu_reset.frame_prechecks(state, i)} for i in (0, 1, 2, 7)}
    assert by_gpu[0]["MIG"][0] == "fail" and "nvidia-smi mig -dci -i 0" in by_gpu[0]["MIG"][1]
    assert by_gpu[1]["gpu"][0] == "warn" and "fell off the bus" in by_gpu[1]["gpu"][1]
    assert by_gpu[2]["MIG"] == ("warn", "MIG state not reported")
    assert by_gpu[7]["gpu"] == ("fail", "n1 reported no GPU 7 (GPUs: 0, 1, 2)")
    stale = replace(state, state="stale")
    assert gpu_reset.frame_prechecks(stale, 0)[0].status == "fail"


@pytest.mark.parametrize(
    "field, value",
    [
        ("uuid", "GPU-1234abcd; rm -rf /"),
        ("uuid", "$(reboot)"),
        ("pci_bus_id", "00000000:19:00.0 --all"),
    ],
)
def test_hostile_frame_values_never_become_argv(field, value):
    gpu = replace(idle_gpu(0), **{field: value})
    template = ("nvidia-smi", "--gpu-reset", "-i", "{%s}" % field)
    with pytest.raises(ValueError, match="refusing the value"):
        gpu_reset.reset_argv(template, "n1", gpu, use_sudo=False)


def test_sudo_is_put_in_front_when_not_root():
    argv = gpu_reset.reset_argv(ActionsConfig().gpu_reset_command, "n1", idle_gpu(3), use_sudo=True)
    assert argv == ["sudo", "-n", "--", "nvidia-smi", "--gpu-reset", "-i", "3"]


@pytest.mark.parametrize("exit_status, expected", [(0, ("pass", True)), (1, ("fail", False))])
async def test_privilege_check_asks_sudo_n_when_not_root(tmp_path, monkeypatch, exit_status, expected):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sudo = bin_dir / "sudo"
    sudo.write_text(
        "#!/bin/sh\nprintf '%%s\\n' \"$*\" > %s/sudo-args\n[ %d = 0 ] || echo 'sudo: a password is required' >&2\nexit %d\n"
        % (tmp_path, exit_status, exit_status)
    )
    sudo.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
    monkeypatch.setattr(gpu_reset.os, "geteuid", lambda: 1000)
    check, use_sudo = await gpu_reset.privilege_precheck(None)
    assert (check.status, use_sudo) == expected
    assert (tmp_path / "sudo-args").read_text().strip() == "-n true"
    if exit_status:
        assert "a password is required" in check.message


@pytest.mark.sshd
async def test_reset_over_real_ssh_quotes_each_word(sshd_factory, tmp_path):
    from opsconsole.nodes.ssh import SshLink

    server = sshd_factory.start()
    stub = recording_stub(tmp_path)
    # A template word with spaces and shell characters stays one argv word on the node.
    config = config_with(tmp_path, 'gpu_reset_command = ["%s", "-i", "{index}", "--note=a b; echo owned > x"]' % stub)
    link = SshLink(NodeConfig(name="n1", host=server.address, port=server.port), FAST, 0.3)
    try:
        node = Node("n1", [idle_gpu(0)])
        ctx = context(config, node.state, link=link)
        plan = await plan_action("gpu_reset", Target(TARGET_GPU, "n1", gpu=0), ctx)
        assert "over SSH" in plan.where
        assert plan.checks[-1].message == "root"  # `id -u` over SSH said 0
        report = await run_plan(plan, ctx)
    finally:
        await link.close()
    assert report.ok, report.lines
    assert recorded_argv(tmp_path) == ["-i", "0", "--note=a b; echo owned > x"]
    assert not (Path(os.path.expanduser("~")) / "x").exists()


def test_dry_run_prints_the_prechecks_and_resets_nothing(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), HOME=str(tmp_path))
    env.pop("OPSCONSOLE_CONFIG", None)
    out = subprocess.run(
        [sys.executable, "-m", "opsconsole.actions.gpu_reset", "--dry-run", "--index", "0"],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=60,
    )
    assert "GPU reset pre-checks on" in out.stdout and "dry run: nothing was reset" in out.stdout
    # This machine has no GPU: the gpu check fails and the verdict says refused (exit 1).
    if "reported no GPU 0" in out.stdout:
        assert out.returncode == 1 and "REFUSED" in out.stdout
    else:
        assert out.returncode in (0, 1) and "command (not run): " in out.stdout
    refused = subprocess.run(
        [sys.executable, "-m", "opsconsole.actions.gpu_reset", "--index", "0"],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tmp_path),
        timeout=60,
    )
    assert refused.returncode == 2 and "only runs the pre-checks" in refused.stderr


def test_dry_run_on_a_captured_h200_frame_shows_the_command_and_runs_nothing(tmp_path, capsys):
    stub = recording_stub(tmp_path)
    state = Node("h200-box", [idle_gpu(0), loaded_gpu(1)], [load_process(gpu_index=1)]).state()
    assert gpu_reset.dry_run(0, (str(stub), "--gpu-reset", "-i", "{index}"), state) == 0
    shown = capsys.readouterr().out
    assert "command (not run): %s --gpu-reset -i 0" % stub in shown and "verdict: reset would be allowed" in shown
    assert gpu_reset.dry_run(1, ActionsConfig().gpu_reset_command, state) == 1
    shown = capsys.readouterr().out
    assert "REFUSED: 1 on GPU 1: %d (python3)" % load_process().pid in shown
    assert recorded_argv(tmp_path) is None


@pytest.mark.parametrize(
    "toml, message",
    [
        (
            'gpu_reset_command = ["nvidia-smi", "-i", "{gpu}"]',
            "unknown placeholder {gpu}; use {index}, {uuid}, {pci_bus_id}, {node}",
        ),
        ("gpu_reset_command = []", "expected a command, got an empty one"),
        ('gpu_reset_command = ["{index}"]', "the program (first word) cannot be a placeholder"),
        ('drain_command = ["scontrol", "Reason={why}"]', "unknown placeholder {why}; use {node}, {reason}"),
        ('gpu_reset_command = "nvidia-smi \\"-i"', "cannot split the command"),
        ("signal_escalation_s = 0", "must be greater than 0"),
    ],
)
def test_bad_action_config_is_one_clear_line(toml, message):
    from opsconsole.config import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_config("[actions]\n%s\n" % toml, "x.toml")
    assert str(err.value).startswith("x.toml:2: actions.")
    assert message in str(err.value)


def test_a_command_string_is_split_like_a_shell():
    cfg = parse_config('[actions]\ngpu_reset_command = "sudo -n nvidia-smi --gpu-reset -i {index}"\n', "x.toml")
    assert cfg.actions.gpu_reset_command == ("sudo", "-n", "nvidia-smi", "--gpu-reset", "-i", "{index}")


async def test_health_rerun_reports_a_hot_gpu_as_failed(tmp_path):
    hot = replace(loaded_gpu(0), temperature=95.0)
    config = config_with(tmp_path, "")
    ctx = context(config, Node("n1", [hot, idle_gpu(1)]).state)
    plan = await plan_action("health_rerun", Target("node", "n1"), ctx)
    assert plan.argv == ("opsconsole", "check", "--node", "n1")
    report = await run_plan(plan, ctx)
    assert not report.ok
    assert any(line.startswith("health fail: gpu_temperature gpu 0 ") for line in report.lines), report.lines
    assert any(line.startswith("health pass: gpu_temperature gpu 1 ") for line in report.lines)
    assert [r["outcome"] for r in audit_records(tmp_path)] == ["attempt", "failed"]
