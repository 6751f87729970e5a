"""The incident report of a replay (ctrl+e in `opsconsole replay`) reads nothing from this machine for the nodes.

A recording's nodes happened elsewhere or long ago. With a config that names a node as the
recording does (the embedded default's `local`, as every recording made with it has), the report
ran this machine's `nvidia-smi -q` and read this machine's log files under that name: on a
workstation replaying a cluster's recording, its own GPU and logs would stand in the report as
the recorded node's. Now a replay's report collects nothing from the nodes and says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

from opsconsole.config import load_config
from opsconsole.recording.replay import ReplayFleet
from opsconsole.tui.replay import ReplayConsole
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 1.20 GiB is free."
)


def record(tmp_path: Path, config: Path) -> Path:
    """A real recording of this machine (the local node) by `opsconsole record`."""
    out = tmp_path / "run.opsrec"
    done = subprocess.run(
        [sys.executable, "-m", "opsconsole", "record", "--config", str(config), "--out", str(out)]
        + ["--duration", "3", "--interval", "0.5"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return out


def member(archive: Path, suffix: str) -> str:
    with tarfile.open(archive) as tar:
        name = next(n for n in tar.getnames() if n.endswith(suffix))
        handle = tar.extractfile(name)
        assert handle is not None
        return handle.read().decode()


async def test_ctrl_e_in_a_replay_collects_nothing_from_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train_here_rank0_1.log").write_text(
        "step 1 loss 2.3\n" + OOM + "\n"
    )  # this machine's, not the recording's
    config_path = tmp_path / "console.toml"
    config_path.write_text(
        '[[nodes]]\nname = "local"\nlocal = true\n\n[logs]\npaths = ["%s/*.log"]\n\n[actions]\naudit_log = "%s"\n'
        % (logs, tmp_path / "audit.log")
    )
    recording = record(tmp_path, config_path)
    config = load_config(str(config_path))
    fleet = ReplayFleet(str(recording))
    app = ReplayConsole(config, fleet, now=fleet.now)
    reports = tmp_path / "state" / "opsconsole" / "reports"
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        assert "local" in fleet.states()  # the recorded node has the config's name
        await pilot.press("ctrl+e")
        archive = await wait_for(
            lambda: next(iter(sorted(reports.glob("*.tar.gz"))), None) if reports.is_dir() else None,
            "the report",
            pilot=pilot,
        )
    errors = member(archive, "errors.txt")
    findings = member(archive, "findings.json")
    assert "nvidia-smi" not in errors.replace("no nvidia-smi -q", "")  # nothing was looked for here
    assert "CUDA out of memory" not in findings and "cuda_oom" not in findings
    assert "a replay of a recording: nothing collected from the nodes" in errors
    assert "a replay of a recording: nothing collected" in member(archive, "summary.md")
    assert json.loads(member(archive, "snapshot.json"))["nodes"][0]["name"] == "local"


async def test_a_replays_report_says_so_and_ages_its_nodes_by_the_replays_clock(tmp_path, monkeypatch):
    """The shipped H200 recording is weeks old: its report's node table read 'up' with a frame age of
    weeks (the report's own time minus the recording's), and only 'Not collected' hinted at a replay."""
    from opsconsole.config import ActionsConfig, Config

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    shipped = ROOT / "examples" / "h200-training.opsrec"
    fleet = ReplayFleet(str(shipped))
    app = ReplayConsole(Config(actions=ActionsConfig(audit_log=str(tmp_path / "audit.log"))), fleet, now=fleet.now)
    reports = tmp_path / "state" / "opsconsole" / "reports"
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("space")  # held still
        await pilot.press("ctrl+e")
        archive = await wait_for(
            lambda: next(iter(sorted(reports.glob("*.tar.gz"))), None) if reports.is_dir() else None,
            "the report",
            pilot=pilot,
        )
    summary = member(archive, "summary.md")
    assert "**A replay** of the recording %s" % shipped in summary
    rows = [line for line in summary.splitlines() if line.startswith("| local |")]
    assert rows, summary
    age = rows[0].rstrip(" |").rsplit("| ", 1)[1]
    assert age.endswith("s") and "m" not in age and "h" not in age and "d" not in age, rows[0]  # seconds, by its clock
