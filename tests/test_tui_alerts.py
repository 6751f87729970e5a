"""Alerts, recording and reports in the running console (Pilot), on the real captured readings."""

from __future__ import annotations

import json
import sys
import tarfile
from dataclasses import replace

from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states  # noqa: E402

from opsconsole.config import parse_config  # noqa: E402
from opsconsole.recording.replay import RecordingReader  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402
from tests.waiting import pane_shown, wait_for  # noqa: E402

SIZE = (140, 40)


def hottest(states) -> float:
    return max(g.temperature for s in states if s.frame for g in s.frame.gpus if g.temperature is not None)


def console(text: str, states=None, now=lambda: FROZEN_NOW):
    states = states if states is not None else single_node_states()
    config = parse_config(text, "test.toml")
    fleet = FakeFleet(states)
    return OpsConsole(config, fleet, now=now), fleet


async def test_an_alert_fires_shows_in_the_header_the_pane_and_a_toast_and_runs_the_hook(tmp_path):
    states = single_node_states()
    threshold = hottest(states) - 1
    got = tmp_path / "hook.json"
    hook = [sys.executable, "-c", "import sys; open(%r, 'w').write(sys.stdin.read())" % str(got)]
    app, fleet = console(
        '[alerting]\nbuiltin_rules = false\nhook = %s\n[[alerts]]\nname = "warm"\nmetric = "gpu.temperature"\n'
        'comparison = ">"\nthreshold = %s\nseverity = "critical"\n' % (json.dumps(hook), threshold),
        states,
    )
    async with app.run_test(size=SIZE) as pilot:
        # The toast is a Notify message (App.notify posts it): waited for, not one pause.
        await wait_for(
            lambda: any("gpu.temperature" in n.message for n in app._notifications), "the alert's toast", pilot=pilot
        )
        assert app.services.alerts.counts() == {"critical": 1}
        assert "alerts 1" in str(app.header.render())
        toasts = [n.message for n in app._notifications]
        assert any("gpu.temperature" in m for m in toasts)
        await pilot.press("9")
        # Made on its first show, then drawn: waited for, not one pause.
        await wait_for(lambda: pane_shown(app, "alerts"), "the Alerts pane", pilot=pilot)
        table = app.panes["alerts"].table
        assert table.row_count == 1
        row = " ".join(str(c) for c in table.get_row_at(0))
        assert "firing" in row and "warm" in row
        # The hook is a Python process started for the alert: a loaded machine can take seconds.
        await wait_for(lambda: got.exists() and got.read_text(), "the hook's payload", pilot=pilot)
        payload = json.loads(got.read_text())
        assert payload["rule"] == "warm" and payload["state"] == "firing"

        # cooled down: resolved, and the header count goes back to 0
        cool = [
            replace(
                s,
                frame=replace(
                    s.frame,
                    seq=s.frame.seq + 1,
                    gpus=tuple(replace(g, temperature=threshold - 20) for g in s.frame.gpus),
                ),
            )
            for s in states
        ]
        for state in cool:
            fleet.publish(state)
        assert app.services.alerts.counts() == {}  # the engine hears each change as it comes
        # The header is drawn by the redraw after the changes (coalesced): waited for, not a fixed 0.3 s.
        await wait_for(lambda: "alerts 0" in str(app.header.render()), "the header's alerts 0", pilot=pilot)
        assert table.row_count == 2


async def test_a_hanging_hook_is_reported_and_the_console_keeps_working(tmp_path):
    states = single_node_states()
    hook = [sys.executable, "-c", "import time; time.sleep(30)"]
    app, fleet = console(
        '[alerting]\nbuiltin_rules = false\nhook_timeout_s = 0.5\nhook = %s\n[[alerts]]\nmetric = "gpu.temperature"\n'
        'comparison = ">"\nthreshold = 1\n' % json.dumps(hook),
        states,
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("3")  # keys act while the hook hangs
        assert app.visible_pane_id == "host"
        # The toast is a Notify message posted with the result (App.notify): both waited for.
        await wait_for(
            lambda: app.services.hook_results and any("alert hook failed" in n.message for n in app._notifications),
            "the hook's result and its toast",
            pilot=pilot,
        )
        assert "timed out after 0.5 s" in app.services.hook_results[-1].message
        assert any("alert hook failed" in n.message for n in app._notifications)


async def test_record_key_writes_a_recording_that_replays(tmp_path):
    clock = [FROZEN_NOW]
    app, fleet = console('[record]\ndirectory = "%s"\n' % tmp_path, now=lambda: clock[0])
    states = single_node_states()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+r")
        await wait_for(
            lambda: app.services.recorder is not None and "REC" in str(app.header.render()), "REC", pilot=pilot
        )
        assert app.services.recorder is not None
        assert "REC" in str(app.header.render())
        for step in range(1, 4):
            clock[0] += 1
            for state in states:
                fleet.publish(
                    replace(state, received_at=clock[0], frame=replace(state.frame, seq=state.frame.seq + step))
                )
            await pilot.pause()
        await pilot.press("ctrl+r")
        await wait_for(lambda: app.services.recorder is None, "the recording stopped", pilot=pilot)
        assert app.services.recorder is None
    files = list(tmp_path.glob("*.opsrec"))
    assert len(files) == 1
    reader = RecordingReader(str(files[0]))
    last = reader.seek(reader.end)
    assert last[states[0].name].frame.seq == states[0].frame.seq + 3
    reader.close()


async def test_report_key_writes_an_incident_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    reports_dir = tmp_path / "state" / "opsconsole" / "reports"
    app, fleet = console("")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+e")
        await wait_for(lambda: list(reports_dir.glob("opsconsole-report-*.tar.gz")), "the report", pilot=pilot)
    reports = list(reports_dir.glob("opsconsole-report-*.tar.gz"))
    assert len(reports) == 1 and not list(tmp_path.glob("opsconsole-report-*"))  # never the working directory
    assert reports[0].stat().st_mode & 0o777 == 0o600 and reports_dir.stat().st_mode & 0o777 == 0o700
    with tarfile.open(reports[0]) as tar:
        names = [m.name.split("/", 1)[1] for m in tar.getmembers()]
    assert "summary.md" in names and "snapshot.json" in names


async def test_acknowledge_and_silence_with_no_alert_say_so():
    """a / z on an empty Alerts pane: a toast that says what they act on (a bell alone was silent in tmux)."""
    app, _ = console("")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("9")
        for key, words in (("a", "a acknowledges"), ("z", "z silences")):
            await pilot.press(key)
            await wait_for(
                lambda: any(words in str(n.message) for n in app._notifications), "the %s toast" % key, pilot=pilot
            )
