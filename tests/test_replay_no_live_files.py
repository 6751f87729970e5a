"""`opsconsole replay --config` shows the recording, not this machine's log files and checkpoints as they are now.

The config's [logs] and [[checkpoints]] name files of this machine. Followed in a replay, today's
log lines stood in the Logs pane beside a recording of another day (labelled with this host, their
findings alerted on the recording's clock), and the Checkpoints pane listed today's directories.
The real console in tmux, replaying the shipped H200 recording with a config whose log holds a
CUDA OOM and whose checkpoint directory holds a checkpoint.
"""

from __future__ import annotations

from tests.test_tui_tmux import REPO, console_command, tmux  # noqa: F401

RECORDING = REPO / "examples" / "h200-training.opsrec"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."


def test_a_replay_follows_no_log_of_this_machine_and_lists_no_checkpoint_dir(tmux, tmp_path):  # noqa: F811
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "train_here_rank0_1.log").write_text("step 1 loss 2.3\n" + OOM + "\n")
    checkpoints = tmp_path / "ckpt"
    checkpoints.mkdir()
    (checkpoints / "model_epoch_1.pt").write_bytes(b"not read here")
    config = tmp_path / "console.toml"
    config.write_text('[logs]\npaths = ["%s/*.log"]\n\n[[checkpoints]]\npath = "%s"\n' % (logs, checkpoints))
    tmux.start(console_command(tmp_path, "replay", "--config", str(config), str(RECORDING)))
    tmux.wait_for("REPLAY", "nodes 1")
    tmux.keys("6")
    screen = tmux.wait_for("Logs: a replay follows no log file")
    assert "CUDA out of memory" not in screen and "alerts 0" in screen
    tmux.keys("7")
    screen = tmux.wait_for("a replay lists no checkpoint directory")
    assert "model_epoch_1.pt" not in screen and str(checkpoints) not in screen
