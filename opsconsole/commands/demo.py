"""`opsconsole demo`: start a real small torch run on the CPU that fails with a NaN, and watch it.

The run writes rank logs named as in the seed chapter and checkpoints in its
CheckpointManager layout into a fresh directory, with a config.toml pointing the console at
them; the console opens on the local node plus, where the shipped H200 recording exists, a
node that replays it (named "...-replay").
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RECORDING_GLOB = "*.opsrec"


def register(commands, add_node_options) -> None:
    parser = commands.add_parser(
        "demo",
        help="start a small real training run that fails, and open the console on it",
        description="Start a real small torch training run on the CPU (logs, checkpoints, then a NaN loss) "
        "and open the console on it.",
    )
    parser.add_argument("--dir", metavar="DIR", help="where the run writes (default: a new temporary directory)")
    parser.add_argument("--ranks", type=int, default=2, help="training processes (2)")
    parser.add_argument("--fail-at-epoch", type=int, default=6, help="epoch at which the data turns bad (0: never)")
    parser.add_argument(
        "--no-console", action="store_true", help="only run the training, wait for it, and print where its files are"
    )
    parser.add_argument("--no-replay", action="store_true", help="leave the shipped H200 recording out")
    parser.set_defaults(handler=command_demo)


def demo_config_text(directory: Path) -> str:
    logs = directory / "logs" / "train_*_rank*_*.log"
    return (
        "# Written by `opsconsole demo`: the console on the demo run.\n"
        "[console]\ninterval = 1.0\n\n"
        "[logs]\npaths = [%s]\n\n"
        "[[checkpoints]]\npath = %s\n" % (_toml_string(str(logs)), _toml_string(str(directory / "checkpoints")))
    )


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def shipped_recording() -> Optional[Path]:
    found = sorted(EXAMPLES.glob(RECORDING_GLOB)) if EXAMPLES.is_dir() else []
    return found[0] if found else None


def start_training(directory: Path, ranks: int, fail_at_epoch: int) -> subprocess.Popen:
    """The training run as a child in its own session (so it can be stopped as a group)."""
    out = open(directory / "train.out", "ab")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "opsconsole.demo.train",
            "--dir",
            str(directory),
            "--ranks",
            str(ranks),
            "--fail-at-epoch",
            str(fail_at_epoch),
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop_training(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)  # the run's GracefulKiller saves a checkpoint and exits
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def demo_links(config, recording: Optional[Path]) -> List:
    """The local node, and the shipped recording played as a node named after it."""
    from opsconsole.nodes.fleet import build_link
    from opsconsole.recording.replay_link import ReplayLink

    links = [build_link(node, config, None) for node in config.nodes]
    if recording is not None:
        links.append(ReplayLink(recording.stem + "-replay", str(recording)))
    return links


def command_demo(args: argparse.Namespace) -> int:
    from opsconsole.commands._arguments import UsageError, console_theme
    from opsconsole.config import load_config

    if args.ranks < 1:
        raise UsageError("--ranks must be at least 1")
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise UsageError(
            "demo: torch is not installed here (./scripts/console demo installs it, or: pip install torch==2.13.0)"
        )
    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="opsconsole-demo-"))
    try:
        directory.mkdir(parents=True, exist_ok=True)
        config_path = directory / "config.toml"
        config_path.write_text(demo_config_text(directory))
    except OSError as exc:
        raise UsageError("%s: %s" % (directory, exc.strerror or exc)) from None
    config = load_config(str(config_path))
    if not args.no_console:
        config = console_theme(config, args)  # --theme checked (and the kept pick applied) before training starts
    proc = start_training(directory, args.ranks, args.fail_at_epoch)
    print("demo run in %s (config %s)" % (directory, config_path), file=sys.stderr)
    try:
        if args.no_console:
            code = proc.wait()
            print(
                "training exited with status %d; logs in %s, checkpoints in %s"
                % (code, directory / "logs", directory / "checkpoints"),
                file=sys.stderr,
            )
            return 0
        from opsconsole.nodes.fleet import Fleet
        from opsconsole.tui.app import run_console

        recording = None if args.no_replay else shipped_recording()
        fleet = Fleet(config, links=demo_links(config, recording))
        status = run_console(config, fleet)
        print(
            "demo files kept in %s; rerun the console on them: opsconsole --config %s" % (directory, config_path),
            file=sys.stderr,
        )
        return status
    finally:
        stop_training(proc)  # the files stay for the user to look at
