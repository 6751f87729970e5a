"""`opsconsole replay` shows a replayed alert but never runs the alert hook for it.

The hook (`[alerting] hook`) is a command outside the console: a pager, a chat webhook. Replaying
an incident with one's usual config ran it for every alert of the recording ("earlier": false), so
looking at last night's incident paged on-call again. The replay now shows the alert (header,
Alerts pane) and sends nothing. The real console in tmux on the shipped H200 recording (a bf16
training loop at 100 % utilisation), with a rule that fires on it and a hook that writes a file.
"""

from __future__ import annotations

import shlex
import stat

from tests.test_tui_tmux import REPO, console_command, tmux  # noqa: F401

RECORDING = REPO / "examples" / "h200-training.opsrec"


def test_a_replayed_alert_is_shown_and_the_hook_is_not_run(tmux, tmp_path):  # noqa: F811
    called = tmp_path / "hook-called"
    hook = tmp_path / "hook.sh"
    hook.write_text("#!/bin/sh\ncat >> %s\n" % shlex.quote(str(called)))
    hook.chmod(stat.S_IRWXU)
    config = tmp_path / "console.toml"
    config.write_text(
        '[alerting]\nhook = ["%s"]\n\n[[alerts]]\nmetric = "gpu.utilization"\ncomparison = ">"\n'
        'threshold = 50\nseverity = "warning"\n' % hook
    )
    tmux.start(console_command(tmp_path, "replay", "--config", str(config), "--speed", "16", str(RECORDING)))
    tmux.wait_for("REPLAY", "alerts 1")  # the rule fired on the replayed frames
    tmux.keys("9")
    tmux.wait_for("gpu.utilization > 50", "firing")
    tmux.wait_for("END", timeout=60.0)  # the whole recording played: every alert of it has fired
    assert not called.exists(), called.read_text()
