"""Acknowledging and silencing alerts in the Alerts pane, and old log files that do not re-fire (Pilot)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import List

from tui_fakes import FROZEN_NOW, FakeFleet, single_node_states

from opsconsole.config import Config, LogsConfig, parse_config
from opsconsole.tui.alerts import duration_text, next_silence
from opsconsole.tui.app import OpsConsole
from tests.waiting import pane_shown, wait_for

SIZE = (160, 40)


def hottest(states) -> float:
    return max(g.temperature for s in states if s.frame for g in s.frame.gpus if g.temperature is not None)


def with_temperature(states, temperature: float, seq: int):
    """The hottest GPU (the only one above the rule's threshold) at `temperature`; the others as they are."""
    hot = hottest(states)
    return [
        replace(
            s,
            frame=replace(
                s.frame,
                seq=seq,
                gpus=tuple(replace(g, temperature=temperature) if g.temperature == hot else g for g in s.frame.gpus),
            ),
        )
        for s in states
    ]


def record_toasts(app: OpsConsole) -> None:
    """Keep every toast the console shows: app._notifications drops one once its timeout has passed
    (10 s for an alert's), which a loaded run outlasted (the first alert's toast was gone: counted 0)."""
    shown: List[SimpleNamespace] = []
    notify = app.notify

    def recording(message, *, title="", **kwargs):
        shown.append(SimpleNamespace(message=message, title=title))
        notify(message, title=title, **kwargs)

    app.notify = recording  # type: ignore[method-assign]
    app.shown_toasts = shown  # type: ignore[attr-defined]


def alert_toasts(app: OpsConsole):
    return [n for n in app.shown_toasts if n.title.startswith("alert: ")]


def row_texts(app: OpsConsole):
    table = app.panes["alerts"].table
    return [" | ".join(str(cell) for cell in table.get_row_at(i)) for i in range(table.row_count)]


async def test_acknowledged_and_silenced_alerts_are_listed_but_not_announced_again(tmp_path):
    states = single_node_states()
    hot = hottest(states)
    got = tmp_path / "hook.jsonl"
    hook = [sys.executable, "-c", "import sys; open(%r, 'a').write(sys.stdin.read() + '\\n')" % str(got)]
    config = parse_config(
        '[alerting]\nbuiltin_rules = false\nhook = %s\n[[alerts]]\nname = "warm"\n'
        'metric = "gpu.temperature"\ncomparison = ">"\nthreshold = %s\nclear = %s\n'
        'severity = "critical"\n' % (json.dumps(hook), hot - 1, hot - 10),
        "test.toml",
    )
    clock = [FROZEN_NOW]
    fleet = FakeFleet(states)
    app = OpsConsole(config, fleet, now=lambda: clock[0])
    record_toasts(app)
    seq = [10]

    async def flap():  # cool down (resolved), then hot again (firing)
        for temperature in (hot - 20, hot):
            seq[0] += 1
            for state in with_temperature(states, temperature, seq[0]):
                fleet.publish(state)
            # The engine hears each change at once; the pane and the header are drawn by the redraw
            # after the changes (coalesced, on a timer): waited for, not a fixed 0.2 s.
            await wait_for(drawn, "the change drawn", pilot=pilot)

    def drawn() -> bool:
        table = app.panes["alerts"].table
        return app._redraw_timer is None and table.row_count == len(app.services.alerts.history)

    async with app.run_test(size=SIZE) as pilot:
        await wait_for(lambda: len(alert_toasts(app)) == 1, "the first alert's toast", pilot=pilot)
        await wait_for(lambda: got.exists() and got.read_text().count('"firing"') == 1, "the hook", pilot=pilot)
        await pilot.press("9")
        # Made on its first show, then focused: a key before that waits for it (held by the app).
        await wait_for(lambda: pane_shown(app, "alerts"), "the Alerts pane", pilot=pilot)
        assert "alerts 1" in str(app.header.render())
        await pilot.press("a")
        await pilot.pause()
        assert "alerts 0" in str(app.header.render())
        assert "firing · ack" in row_texts(app)[0]
        assert "1 acknowledged" in str(app.panes["alerts"].status.render())
        await flap()
        assert len(alert_toasts(app)) == 1  # fired again, acknowledged: no toast, no hook
        assert got.read_text().count('"firing"') == 1
        assert [r.split(" | ")[1] for r in row_texts(app)[:3]] == ["firing · ack", "resolved · ack", "firing · ack"]

        await pilot.press("a")  # taken back
        await pilot.pause()
        assert "alerts 1" in str(app.header.render())
        await pilot.press("z")  # silenced 15 minutes
        # Its toast is a Notify message (App.notify posts it): waited for, not one pause.
        await wait_for(
            lambda: any("silenced for 15m" in n.message for n in app._notifications), "the toast", pilot=pilot
        )
        assert "silenced 15m" in row_texts(app)[0] and "alerts 0" in str(app.header.render())
        assert any("silenced for 15m" in n.message for n in app._notifications)
        await flap()
        assert len(alert_toasts(app)) == 1
        await pilot.press("z")  # longer: 1 h
        await pilot.pause()
        assert "silenced 1h" in row_texts(app)[0]
        await pilot.press("a")  # acknowledged while silenced: both are said
        await pilot.pause()
        assert "firing · ack · silenced 1h" in row_texts(app)[0], row_texts(app)[0]
        await pilot.press("a")  # the acknowledgement taken back: the silence stays, and shows
        await pilot.pause()
        assert "firing · silenced 1h" in row_texts(app)[0] and "alerts 0" in str(app.header.render())

        clock[0] += 3601  # the silence runs out: the next firing is announced
        await flap()
        assert "alerts 1" in str(app.header.render())
        await wait_for(lambda: len(alert_toasts(app)) == 2, "a toast after the silence ran out", pilot=pilot)
        await wait_for(lambda: got.read_text().count('"firing"') == 2, "the hook after the silence", pilot=pilot)


def test_silence_steps():
    assert [duration_text(s) for s in (60, 900, 3600, 5400, 8 * 3600)] == ["1m", "15m", "1h", "1h30m", "8h"]
    assert next_silence(None) == 900 and next_silence(890) == 3600 and next_silence(3500) == 8 * 3600
    assert next_silence(8 * 3600 - 30) is None and next_silence(100) == 3600  # the last step lifts it


OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "139.72 GiB of which 1.06 GiB is free."
)


def record(when: float, message: str) -> str:
    return "%s,000 - ERROR - %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)), message)


async def test_an_old_log_file_does_not_refire_its_alerts_at_start_but_a_new_line_does(tmp_path):
    log = tmp_path / "train_gpu01_rank0_1.log"
    unstamped = tmp_path / "train_gpu01_rank1_1.log"
    stamped_at = int(time.time()) - 86400
    log.write_text(record(stamped_at, OOM))  # yesterday's run
    unstamped.write_text("Traceback (most recent call last):\n" + OOM + "\n")  # no timestamp: present at start
    config = Config(logs=LogsConfig(paths=(str(tmp_path / "train_*.log"),)))
    app = OpsConsole(config, FakeFleet(single_node_states()), now=lambda: FROZEN_NOW)
    record_toasts(app)
    async with app.run_test(size=SIZE) as pilot:
        engine = app.services.alerts
        await wait_for(
            lambda: len([e for e in engine.history if e.earlier]) == 2, "both old findings listed", pilot=pilot
        )
        await pilot.pause(0.3)
        assert engine.counts() == {} and alert_toasts(app) == []
        await pilot.press("9")
        await wait_for(lambda: pane_shown(app, "alerts"), "the Alerts pane", pilot=pilot)
        assert all(" | earlier | " in row for row in row_texts(app))
        # The stamped line keeps yesterday's time; the unstamped one's time is not when it was read.
        times = sorted(row.split(" | ")[0] for row in row_texts(app))
        assert times == sorted(["before start", time.strftime("%H:%M:%S", time.localtime(stamped_at))]), times
        assert "2 from logs older than the start" in str(app.panes["alerts"].status.render())
        # The run goes on in the same file: a new OOM is a new alert.
        with open(log, "a") as handle:
            handle.write(record(time.time(), OOM))
        await wait_for(lambda: engine.counts() == {"critical": 1}, "the new line's alert", pilot=pilot)
        await wait_for(lambda: len(alert_toasts(app)) == 1, "its toast", pilot=pilot)
        await wait_for(lambda: "alerts 1" in str(app.header.render()), "the header's count (next tick)", pilot=pilot)
