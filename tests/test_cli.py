"""The `opsconsole` command line: snapshot as a real subprocess, exit codes, overrides, the table."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from opsconsole import __version__, units
from opsconsole.cli import build_parser, config_from_args, main
from opsconsole.config import DEFAULT_CONFIG, NodeConfig
from opsconsole.model import (
    STATE_DOWN,
    STATE_UP,
    GpuSample,
    HostSample,
    NodeFrame,
    NodeState,
    ProcessSample,
)
from opsconsole.snapshot_format import format_gpu_line, snapshot_document, snapshot_table

ROOT = Path(__file__).resolve().parents[1]
H200 = Path(__file__).parent / "fixtures" / "h200"
MIB = 1024 * 1024
SUBPROCESS_GUARD_S = 120  # only so a hang fails the test instead of blocking the run


@pytest.fixture
def clean_home(tmp_path):
    """An environment whose HOME is a fresh temp dir: no user config, no ~/.ssh of the real user."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("OPSCONSOLE_CONFIG", "XDG_CONFIG_HOME", "SSH_AUTH_SOCK")}
    env["HOME"] = str(home)
    return home, env


def run_cli(args, env, timeout=SUBPROCESS_GUARD_S):
    return subprocess.run(
        [sys.executable, "-m", "opsconsole", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
    )


def closed_loopback_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- real subprocesses -------------------------------------------------------


def test_snapshot_json_of_the_default_config_reports_this_machine_up(clean_home):
    _, env = clean_home
    result = run_cli(["snapshot", "--json"], env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    [node] = document["nodes"]
    assert node["name"] == "local" and node["state"] == STATE_UP and node["reason"] is None
    assert node["host"]["hostname"] == socket.gethostname()
    assert node["host"]["cpu_count"] == os.cpu_count()
    assert node["host"]["mem_total"] > 0
    assert node["gpu_source"] in ("nvml", "nvidia-smi", "none")
    assert isinstance(node["gpus"], list) and isinstance(node["top_processes"], list)
    assert node["age_s"] >= 0 and node["rtt_ms"] is None
    for key in ("address", "processes", "errors"):
        assert key in node


def test_snapshot_table_of_the_default_config_names_this_machine(clean_home):
    _, env = clean_home
    result = run_cli(["snapshot"], env)
    assert result.returncode == 0, result.stderr
    header = result.stdout.splitlines()[0].split()
    assert header[:3] == ["local", STATE_UP, socket.gethostname()]


def test_a_bad_config_file_exits_2_with_one_line_naming_file_and_line(clean_home, tmp_path):
    _, env = clean_home
    config = tmp_path / "cluster.toml"
    config.write_text('# my cluster\n\n[console]\ninterval = "fast"\n')
    for args in (["--config", str(config), "snapshot"], ["snapshot", "--config", str(config), "--json"]):
        result = run_cli(args, env)
        assert result.returncode == 2
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr
        assert lines[0].startswith("%s:4: console.interval:" % config)


def test_a_missing_config_file_exits_2(clean_home, tmp_path):
    _, env = clean_home
    missing = tmp_path / "nope.toml"
    result = run_cli(["snapshot", "--config", str(missing)], env)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and str(missing) in result.stderr


@pytest.mark.parametrize("pattern", ["gpu[01-", "gpu[05-01]", "gpu[a-b]"])
def test_a_bad_nodes_pattern_exits_2_with_one_line(clean_home, pattern):
    _, env = clean_home
    result = run_cli(["snapshot", "--nodes", pattern], env)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("opsconsole: --nodes %s:" % pattern)
    assert "Traceback" not in result.stderr


def test_bad_arguments_exit_2(clean_home):
    _, env = clean_home
    assert run_cli(["snapshot", "--timeout", "soon"], env).returncode == 2
    assert run_cli(["--interval", "-1"], env).returncode == 2
    assert run_cli(["no-such-command"], env).returncode == 2


def test_version_and_help(clean_home):
    _, env = clean_home
    result = run_cli(["--version"], env)
    assert result.returncode == 0 and result.stdout.strip() == "opsconsole " + __version__
    result = run_cli(["--help"], env)
    assert result.returncode == 0 and "snapshot" in result.stdout


def test_nodes_that_are_down_are_reported_within_the_timeout(clean_home):
    pytest.importorskip("opsconsole.nodes.ssh")
    home, env = clean_home
    port = closed_loopback_port()
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700)
    # Aliases as a user would write them: the names --nodes expands to, all on loopback.
    (ssh_dir / "config").write_text("Host dead*\n    HostName 127.0.0.1\n    Port %d\n" % port)
    (ssh_dir / "known_hosts").write_text("")
    timeout = 3.0
    started = time.monotonic()
    result = run_cli(["snapshot", "--json", "--nodes", "dead[1-3]", "--timeout", str(timeout)], env)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    nodes = json.loads(result.stdout)["nodes"]
    assert [n["name"] for n in nodes] == ["dead1", "dead2", "dead3"]
    assert all(n["state"] not in (STATE_UP, "connecting") for n in nodes), nodes
    assert all(n["reason"] for n in nodes)
    assert all(n["host"] is None and n["gpus"] == [] for n in nodes)
    # Behaviour, not performance: the command honours its timeout (with room for interpreter start-up).
    assert elapsed < timeout + 30, elapsed


def test_headless_snapshot_does_not_import_textual(clean_home):
    _, env = clean_home
    code = (
        "import sys, io, contextlib\n"
        "from opsconsole.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = main(['snapshot', '--json'])\n"
        "assert rc == 0, rc\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'asyncssh')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=SUBPROCESS_GUARD_S
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- in-process: argument handling ------------------------------------------------


def parse(argv):
    return build_parser().parse_args(argv)


def test_options_before_and_after_the_subcommand_both_count():
    assert parse(["--config", "a.toml", "snapshot"]).config == "a.toml"
    assert parse(["snapshot", "--config", "b.toml"]).config == "b.toml"
    assert parse(["--nodes", "gpu[1-2]", "snapshot", "--json"]).nodes == "gpu[1-2]"
    args = parse([])
    assert args.command is None and args.handler.__name__ == "command_console"


def test_nodes_option_replaces_the_configured_nodes_with_ssh_nodes_of_default_settings():
    args = parse(["--nodes", "gpu[01-03],login1", "--interval", "0.5", "--read-only", "--theme", "light"])
    config = config_from_args(args, load=lambda path: DEFAULT_CONFIG)
    assert config.nodes == tuple(NodeConfig(name=n, host=n) for n in ["gpu01", "gpu02", "gpu03", "login1"])
    assert config.console.interval == 0.5
    assert config.console.read_only is True
    assert config.console.theme == "light"
    assert config.ssh == DEFAULT_CONFIG.ssh


def test_without_overrides_the_loaded_config_is_kept():
    config = config_from_args(parse(["snapshot"]), load=lambda path: DEFAULT_CONFIG)
    assert config == DEFAULT_CONFIG


def test_nodes_and_slurm_job_exclude_each_other(capsys):
    assert main(["--nodes", "a", "--slurm-job", "1"]) == 2
    assert "not allowed with" in capsys.readouterr().err


# --- the table and the JSON document on a frame from the H200 capture -------------


def h200_fixture_frame() -> NodeFrame:
    nvml = json.loads((H200 / "nvml.json").read_text())
    dev = nvml["devices"][0]
    load = json.loads((H200 / "under-load" / "load-procs.json").read_text())
    gpu = GpuSample(
        index=0,
        uuid=dev["uuid"],
        name=dev["name"],
        utilization_gpu=float(dev["util"]["gpu"]),
        memory_total=dev["mem"]["total"],
        memory_used=dev["mem"]["used"],
        temperature=float(dev["temp"]),
        power_draw_w=dev["power_mw"] / 1000.0,
        power_limit_w=dev["power_limit_mw"] / 1000.0,
    )
    proc = load["procs"][0]
    process = ProcessSample(
        pid=proc["pid"], name="python3", user="alice", gpu_index=0, gpu_memory_bytes=proc["usedGpuMemory"]
    )
    return NodeFrame(
        node="gpu01",
        time=time.time(),
        seq=7,
        host=HostSample(hostname="gpu01.cluster", cpu_count=192),
        gpus=(gpu,),
        processes=(process,),
        gpu_source="nvml",
        driver_version=nvml["driver"],
    )


def test_gpu_line_reads_like_gpustat_with_the_panes_units():
    frame = h200_fixture_frame()
    gpu, proc = frame.gpus[0], frame.processes[0]
    # gpustat's layout, each reading spelled as every pane spells it (opsconsole.units): GPU memory in GiB
    # as on the GPUs pane (it was MiB as nvidia-smi counts it), power as the GPUs pane's draw/limit.
    assert proc.gpu_memory_bytes == 22525509632  # 20.98 GiB
    expected = "[0] %s | %s, %4s | %14s | %9s | alice(%d) 21 GiB" % (
        gpu.name,
        units.format_temperature(gpu.temperature),
        units.format_percent(gpu.utilization_gpu),
        units.format_memory_pair(gpu.memory_used, gpu.memory_total),
        units.format_power_pair(gpu.power_draw_w, gpu.power_limit_w),
        proc.pid,
    )
    assert format_gpu_line(frame, gpu) == expected
    assert " GiB | " in expected and "/700 W |" in expected  # what the units spelled for this GPU


def test_table_has_a_header_per_node_a_line_per_gpu_and_the_reason_of_a_down_node():
    frame = h200_fixture_frame()
    now = frame.time + 1.5
    states = [
        NodeState(name="gpu01", state=STATE_UP, frame=frame, received_at=frame.time, address="gpu01:22"),
        NodeState(name="gpu02-long", state=STATE_DOWN, reason="connection refused (127.0.0.1:2222)"),
    ]
    lines = snapshot_table(states, now=now).splitlines()
    assert lines[0].split()[:3] == ["gpu01", STATE_UP, "gpu01.cluster"]
    assert lines[0].endswith("driver " + frame.driver_version)
    assert lines[0].startswith("gpu01" + " " * (len("gpu02-long") - len("gpu01")) + "  up")
    assert lines[1].startswith("[0] NVIDIA H200 |")
    assert lines[2].split()[:2] == ["gpu02-long", STATE_DOWN]
    assert lines[3] == "  down: connection refused (127.0.0.1:2222)"
    assert len(lines) == 4


def test_a_node_down_with_an_old_frame_shows_its_age_and_its_last_gpus():
    frame = h200_fixture_frame()
    state = NodeState(name="gpu01", state=STATE_DOWN, reason="connection lost", frame=frame, received_at=frame.time)
    lines = snapshot_table([state], now=frame.time + 42).splitlines()
    assert lines[0].endswith("(last frame 42s ago)")  # a duration as every pane spells one
    assert lines[1] == "  down: connection lost"
    assert lines[2].startswith("[0] ")


def test_json_document_carries_the_frame_as_the_model_wire_form():
    from opsconsole.model import from_wire, to_wire

    frame = h200_fixture_frame()
    state = NodeState(name="gpu01", state=STATE_UP, frame=frame, received_at=frame.time, rtt_ms=0.8)
    [node] = snapshot_document([state], now=frame.time + 2)["nodes"]
    assert node["age_s"] == pytest.approx(2.0)
    assert node["rtt_ms"] == 0.8
    assert node["gpus"] == to_wire(frame.gpus)
    assert node["processes"] == to_wire(frame.processes)
    assert from_wire(HostSample, node["host"]) == frame.host
    json.dumps(node)  # JSON-ready as it is
