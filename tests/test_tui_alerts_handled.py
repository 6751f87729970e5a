"""An exception that its rank is later shown to have handled does not keep an alert firing (Pilot, real LogHub,
Diagnoser and alert engine).

The log is real output of a training loop that catches a KeyError, logs it with logging.exception (a traceback)
and goes on training. Its lines reach the console in two writes: up to the traceback's exception line (the alert
fires: nothing says yet that it was handled), then the steps after it. The diagnosis then moves the exception to
"handled" (not a finding, not the root cause); its alert stayed firing in the header and the Alerts pane.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

from tui_fakes import FakeFleet, single_node_states

from opsconsole.alerts.engine import EVENT_FIRING, EVENT_RESOLVED
from opsconsole.config import Config, LogsConfig
from opsconsole.tui.app import OpsConsole
from tests.waiting import wait_for

SIZE = (160, 40)
RULE = "finding.app_error"
TRAINING = textwrap.dedent("""
    import logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(levelname)s - %(message)s")
    log = logging.getLogger("train")
    for step in range(4):
        if step == 1:
            try:
                {"a": 1}["input_ids"]
            except KeyError:
                log.exception("sample 17 has no input_ids, skipped")
        log.info("step %d loss: %.4f", step, 1.0 / (step + 1))
""")


def training_output() -> List[str]:
    done = subprocess.run([sys.executable, "-c", TRAINING], capture_output=True, timeout=60, check=True)
    return done.stderr.decode().splitlines()


def write(path: Path, lines: List[str]) -> None:
    """Append lines from another process, as a training rank would."""
    subprocess.run(
        [sys.executable, "-c", "import sys\nwith open(sys.argv[1], 'ab') as f:\n    f.write(sys.stdin.buffer.read())\n"]
        + [str(path)],
        input="".join(line + "\n" for line in lines).encode(),
        check=True,
    )


def alert_states(app: OpsConsole) -> List[str]:
    return [event.state for event in app.services.alerts.history if event.rule == RULE and not event.earlier]


async def test_the_alert_of_an_exception_later_shown_handled_is_withdrawn(tmp_path):
    output = training_output()
    end = next(i for i, line in enumerate(output) if line.startswith("KeyError: 'input_ids'"))
    assert any(line.endswith("step 1 loss: 0.5000") for line in output[end + 1 :]), output
    log = tmp_path / "train.log"
    log.write_text("")
    app = OpsConsole(Config(logs=LogsConfig(paths=(str(log),))), FakeFleet(single_node_states()))
    async with app.run_test(size=SIZE) as pilot:
        alerts = app.services.alerts
        await wait_for(lambda: app.panes["logs"].feed is not None, "the log feed", pilot=pilot)
        write(log, output[: end + 1])
        await wait_for(lambda: alert_states(app) == [EVENT_FIRING], "the exception's alert", pilot=pilot)
        assert [event.rule for event in alerts.firing()] == [RULE] and alerts.counts() == {"error": 1}
        write(log, output[end + 1 :])
        await wait_for(lambda: alert_states(app) == [EVENT_FIRING, EVENT_RESOLVED], "the alert withdrawn", pilot=pilot)
        feed = app.panes["logs"].feed
        assert [finding.category for finding in feed.diagnoser.handled()] == ["app_error"]
        assert not feed.diagnoser.findings() and feed.diagnoser.root_cause() is None
        assert alerts.firing() == [] and alerts.counts() == {}
        resolved = alerts.history[-1]
        assert "handled, the rank went on after it" in resolved.message and "step 1 loss" in resolved.message
        # The same exception again, not handled this time: it fires again.
        write(log, output[end - 3 : end + 1])
        await wait_for(
            lambda: alert_states(app) == [EVENT_FIRING, EVENT_RESOLVED, EVENT_FIRING], "the new alert", pilot=pilot
        )
        assert [event.rule for event in alerts.firing()] == [RULE]
