"""Alert rules (for durations, hysteresis), health and finding sources, and the command hook."""

import asyncio
import json
import sys
import time
from dataclasses import replace

import pytest

from opsconsole.alerts.engine import EVENT_FIRING, EVENT_RESOLVED, AlertEngine
from opsconsole.alerts.hook import deliver
from opsconsole.alerts.rules import AlertRule, builtin_rules
from opsconsole.diagnosis.finding import Finding
from opsconsole.health.result import HealthResult
from opsconsole.model import STATE_DOWN, STATE_UP, NodeState
from tests.test_history import h200_frame


def state_with_temperature(temp):
    frame = h200_frame()
    return NodeState(
        name="gpu01", state=STATE_UP, frame=replace(frame, gpus=(replace(frame.gpus[0], temperature=temp),))
    )


HOT = AlertRule("hot", "gpu.temperature", ">", 85, for_s=30, severity="critical")


@pytest.mark.parametrize(
    "rule, series, expected",
    [
        # (time, temperature) -> events as (time, state)
        (HOT, [(0, 90), (10, 90), (29, 90)], []),  # not yet held for 30 s
        (HOT, [(0, 90), (30, 91)], [(30, EVENT_FIRING)]),
        (HOT, [(0, 90), (20, 80), (40, 90), (69, 90), (70, 90)], [(70, EVENT_FIRING)]),  # a dip restarts the clock
        # hysteresis: clear level 85 - 4.25 = 80.75; 84 and 85 do not resolve
        (HOT, [(0, 90), (30, 90), (40, 84), (50, 86), (60, 85), (70, 80)], [(30, EVENT_FIRING), (70, EVENT_RESOLVED)]),
        (
            HOT,
            [(0, 90), (30, 90), (40, 70), (50, 90), (80, 90)],
            [(30, EVENT_FIRING), (40, EVENT_RESOLVED), (80, EVENT_FIRING)],
        ),
        (AlertRule("hot0", "gpu.temperature", ">", 85), [(0, 86)], [(0, EVENT_FIRING)]),  # no `for`: at once
        (
            AlertRule("hot0", "gpu.temperature", ">", 85, clear=60),
            [(0, 86), (1, 70), (2, 59)],
            [(0, EVENT_FIRING), (2, EVENT_RESOLVED)],
        ),
        (
            AlertRule("cold", "gpu.temperature", "<", 20),
            [(0, 19), (1, 20.5), (2, 21.1)],
            [(0, EVENT_FIRING), (2, EVENT_RESOLVED)],
        ),
    ],
)
def test_rule_for_durations_and_hysteresis(rule, series, expected):
    engine = AlertEngine([rule])
    events = []
    for t, temp in series:
        events += [(e.time, e.state) for e in engine.observe(state_with_temperature(temp), now=float(t))]
    assert events == [(float(t), s) for t, s in expected]


def test_a_value_hovering_at_the_threshold_does_not_flap():
    engine = AlertEngine([AlertRule("hot", "gpu.temperature", ">", 85)])
    events = []
    for t in range(100):
        events += engine.observe(state_with_temperature(85.5 if t % 2 else 84.5), now=float(t))
    assert [e.state for e in events] == [EVENT_FIRING]


def test_missing_readings_keep_the_alert_as_it_is():
    engine = AlertEngine([HOT])
    engine.observe(state_with_temperature(95), now=0.0)
    engine.observe(state_with_temperature(95), now=30.0)
    assert engine.observe(NodeState(name="gpu01", state=STATE_DOWN, frame=None), now=40.0) == []
    assert engine.observe(state_with_temperature(None), now=50.0) == []
    assert [e.rule for e in engine.firing()] == ["hot"]
    assert engine.counts() == {"critical": 1}


def test_builtin_rules_use_the_seed_thresholds():
    rules = {r.name: r for r in builtin_rules()}
    assert rules["gpu_hot"].threshold == 85
    assert rules["disk_full"].threshold == 10
    assert rules["host_memory"].threshold == 90
    frame = h200_frame()
    host = replace(frame.host, mem_used=int(frame.host.mem_total * 0.95))
    state = NodeState(name="n", state=STATE_UP, frame=replace(frame, host=host))
    engine = AlertEngine(builtin_rules())
    assert engine.observe(state, now=0.0) == []
    fired = engine.observe(state, now=60.0)
    assert [e.rule for e in fired] == ["host_memory"]
    assert "node.memory_percent 95" in fired[0].message


def test_node_unreachable_for_30_s():
    engine = AlertEngine(builtin_rules())
    down = NodeState(name="n", state=STATE_DOWN, reason="connection refused")
    assert engine.observe(down, now=0.0) == []
    assert [e.rule for e in engine.observe(down, now=31.0)] == ["node_unreachable"]
    up = state_with_temperature(40)
    assert [(e.rule, e.state) for e in engine.observe(replace(up, name="n"), now=40.0)] == [
        ("node_unreachable", EVENT_RESOLVED)
    ]


def test_health_failures_fire_and_passes_resolve():
    engine = AlertEngine([])
    fail = HealthResult(check="disk_free", node="n", status="fail", message="/ has 3 % free")
    assert [(e.rule, e.state, e.severity) for e in engine.observe_health([fail], now=1.0)] == [
        ("health.disk_free", EVENT_FIRING, "critical")
    ]
    assert engine.observe_health([fail], now=2.0) == []  # still failing: no new event
    ok = replace(fail, status="pass", message="/ has 40 % free")
    assert [(e.rule, e.state) for e in engine.observe_health([ok], now=3.0)] == [("health.disk_free", EVENT_RESOLVED)]


def test_findings_fire_once_per_category_and_source():
    engine = AlertEngine([])
    finding = Finding(
        line=7,
        category="nan_inf",
        severity="critical",
        title="Loss became NaN",
        cause="",
        remedy="",
        excerpt="loss=nan",
        source="n:/logs/train_n_rank0_1.log",
        rank=0,
    )
    first = engine.observe_finding(finding, "n", now=1.0)
    assert [e.rule for e in first] == ["finding.nan_inf"]
    assert "rank 0" in first[0].message
    assert engine.observe_finding(replace(finding, line=9), "n", now=2.0) == []
    assert [e.rule for e in engine.firing()] == ["finding.nan_inf"]


def test_history_is_bounded():
    engine = AlertEngine([AlertRule("hot", "gpu.temperature", ">", 85, clear=50)], history_size=5)
    for t in range(20):
        engine.observe(state_with_temperature(90 if t % 2 == 0 else 40), now=float(t))
    assert len(engine.history) == 5


async def test_hook_receives_the_alert_as_json(tmp_path):
    out = tmp_path / "got.json"
    script = "import sys; open(%r, 'w').write(sys.stdin.read())" % str(out)
    result = await deliver([sys.executable, "-c", script], {"rule": "gpu_hot", "node": "n"}, timeout=10)
    assert result.ok, result.message
    assert json.loads(out.read_text()) == {"rule": "gpu_hot", "node": "n"}


async def test_a_hanging_hook_is_killed_and_reported_without_blocking(tmp_path):
    script = "import time; time.sleep(60)"
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    task = asyncio.create_task(ticker())
    started = time.monotonic()
    result = await deliver([sys.executable, "-c", script], {"rule": "x"}, timeout=0.5)
    task.cancel()
    assert not result.ok
    assert "timed out after 0.5 s" in result.message
    assert time.monotonic() - started < 30  # it was killed, not waited for
    assert ticks >= 3  # the event loop kept running meanwhile


async def test_a_failing_or_missing_hook_is_reported(tmp_path):
    failing = await deliver(
        [sys.executable, "-c", "import sys; sys.stderr.write('no webhook url\\n'); sys.exit(3)"], {}, timeout=10
    )
    assert (failing.ok, failing.returncode) == (False, 3)
    assert failing.message == "exit 3: no webhook url"
    missing = await deliver([str(tmp_path / "no-such-hook")], {}, timeout=10)
    assert not missing.ok and missing.message.startswith("cannot start")


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '[[alerts]]\nmetric = "gpu.temprature"\ncomparison = ">"\nthreshold = 80\n',
            'x.toml:2: alerts[0].metric: unknown metric "gpu.temprature"; did you mean "gpu.temperature"?',
        ),
        (
            '[[alerts]]\nmetric = "gpu.temperature"\ncomparison = "=>"\nthreshold = 80\n',
            'x.toml:3: alerts[0].comparison: expected one of ">", ">=", "<", "<=", "==", "!=", got "=>"',
        ),
        (
            '[[alerts]]\nmetric = "gpu.temperature"\ncomparison = ">"\n',
            'x.toml:1: alerts[0]: missing required key "threshold"',
        ),
        (
            '[[alerts]]\nmetric = "gpu.temperature"\ncomparison = ">"\nthreshold = 80\nfor = -1\n',
            "x.toml:5: alerts[0].for: must be at least 0, got -1",
        ),
        (
            '[[alerts]]\nmetric = "gpu.temperature"\ncomparison = ">"\nthreshold = 80\nseverity = "urgent"\n',
            'x.toml:5: alerts[0].severity: expected one of "info", "warning", "critical", got "urgent"',
        ),
        (
            '[alerting]\nhook = "/bin/pager"\n',
            'x.toml:2: alerting.hook: expected an array of strings, got "/bin/pager"',
        ),
        ("[history]\nsize = 1\n", "x.toml:2: history.size: must be between 2 and 100000, got 1"),
    ],
)
def test_alert_config_errors_name_file_line_and_key(text, message):
    from opsconsole.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as caught:
        parse_config(text, "x.toml")
    assert str(caught.value) == message


def test_alert_rules_from_config():
    from opsconsole.alerts.rules import rules_from_config
    from opsconsole.config import parse_config

    config = parse_config(
        '[[alerts]]\nname = "idle"\nmetric = "gpu.utilization"\ncomparison = "<"\n'
        "threshold = 5\nfor = 300\n[alerting]\nbuiltin_rules = false\n",
        "x.toml",
    )
    rules = rules_from_config(config)
    assert [(r.name, r.metric, r.comparison, r.threshold, r.for_s) for r in rules] == [
        ("idle", "gpu.utilization", "<", 5.0, 300.0)
    ]
    default = rules_from_config(parse_config("", "x.toml"))
    assert "gpu_hot" in [r.name for r in default]


# --- acknowledging, silencing, findings from before the start ------------------------------------


def test_an_acknowledged_alert_is_listed_but_neither_counted_nor_announced_until_taken_back():
    clock = [100.0]
    engine = AlertEngine([AlertRule("hot", "gpu.temperature", ">", 85, clear=50)])
    engine.clock = lambda: clock[0]
    [fired] = engine.observe(state_with_temperature(90), now=100.0)
    assert engine.counts() == {"warning": 1} and engine.announces(fired, 100.0)
    assert engine.acknowledge(fired.key) is True
    assert engine.counts() == {} and engine.quiet_reason(fired.key, 100.0) == "acknowledged"
    # It flaps: resolved, firing again; still acknowledged, so not announced again.
    engine.observe(state_with_temperature(40), now=110.0)
    [again] = engine.observe(state_with_temperature(95), now=120.0)
    assert again.state == EVENT_FIRING and not engine.announces(again, 120.0)
    assert [e.key for e in engine.firing()] == [fired.key]  # still listed as firing
    assert engine.acknowledge(fired.key) is False  # taken back
    assert engine.counts() == {"warning": 1} and engine.announces(again, 120.0)


def test_a_silence_lasts_until_its_time_then_the_alert_speaks_again():
    clock = [1000.0]
    engine = AlertEngine([AlertRule("hot", "gpu.temperature", ">", 85, clear=50)])
    engine.clock = lambda: clock[0]
    [fired] = engine.observe(state_with_temperature(90), now=1000.0)
    engine.silence(fired.key, 1000.0 + 900)
    assert engine.counts() == {} and not engine.announces(fired, 1000.0)
    assert engine.silenced_until(fired.key, 1899.0) == 1900.0
    clock[0] = 1900.0
    assert engine.silenced_until(fired.key, 1900.0) is None and engine.counts() == {"warning": 1}
    engine.silence(fired.key, 5000.0)
    engine.silence(fired.key, None)  # lifted
    assert engine.announces(fired, 1900.0)


def test_findings_from_before_the_start_are_listed_once_and_a_new_one_still_fires():
    engine = AlertEngine([])
    old = Finding(
        line=7,
        category="cuda_oom",
        severity="critical",
        title="CUDA out of memory",
        cause="",
        remedy="",
        excerpt="torch.OutOfMemoryError",
        source="n:/logs/rank0.log",
        rank=0,
        time=50.0,
    )
    [listed] = engine.observe_finding(old, "n", now=1000.0, earlier=True)
    assert listed.earlier and listed.time == 50.0 and not engine.announces(listed, 1000.0)
    assert engine.observe_finding(replace(old, line=9), "n", now=1000.0, earlier=True) == []  # once per source
    assert engine.firing() == [] and engine.counts() == {}
    [new] = engine.observe_finding(replace(old, line=30, time=1100.0), "n", now=1100.0)
    assert not new.earlier and engine.announces(new, 1100.0) and engine.counts() == {"critical": 1}
    assert new.to_json()["earlier"] is False and listed.to_json()["earlier"] is True
