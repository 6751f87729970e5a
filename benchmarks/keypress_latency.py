"""How long a key press takes to act while one node hangs, against the same with no node hung.

Two real sshd on 127.0.0.1 (started here as tests/sshd.py does, client HOME in a temp dir),
the real Fleet in the real console (App.run_test). A press of `2` / `4` is timed from the
key event until the screen was refreshed showing that pane (the key's handling, the pane's
redraw and the refresh included). First N presses with both nodes streaming (the baseline), then
one node's sshd is SIGSTOPped and N more presses are timed while it goes stale, down and
its reconnects time out. Presses are spread by a random 20-80 ms so they meet frames,
keepalives and timeouts as they come. Prints median / p95 of both and their ratio.

    .venv/bin/python benchmarks/keypress_latency.py [--presses 80] [--interval 0.3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from textual import events  # noqa: E402

from opsconsole.config import Config, ConsoleConfig, NodeConfig, SshConfig  # noqa: E402
from opsconsole.model import STATE_UP  # noqa: E402
from opsconsole.nodes.fleet import Fleet  # noqa: E402
from opsconsole.tui.app import OpsConsole  # noqa: E402
from tests.sshd import ClientEnv, SshdFactory, sshd_missing_reason  # noqa: E402

KEYS = (("2", "processes"), ("4", "nodes"))
SSH = SshConfig(
    connect_timeout=3.0, keepalive_interval=0.5, keepalive_count_max=2, backoff_initial=0.2, backoff_max=1.0
)


def p95(values: List[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


async def time_presses(pilot, app: OpsConsole, count: int, rng: random.Random) -> List[float]:
    """Milliseconds from each key event until the screen was refreshed with the pane it names.

    The key goes in as a terminal driver delivers it (a Key message posted to the app),
    not through Pilot.press, which also waits for idle and for the tab underline animation.
    """
    loop = asyncio.get_running_loop()
    out = []
    for i in range(count):
        key, pane = KEYS[i % 2]
        started = time.perf_counter()
        app.post_message(events.Key(key, key))
        while app.visible_pane_id != pane:
            await asyncio.sleep(0)
        painted = loop.create_future()
        app.call_after_refresh(lambda: painted.done() or painted.set_result(None))
        await painted
        out.append((time.perf_counter() - started) * 1000.0)
        await asyncio.sleep(rng.uniform(0.02, 0.08))
    return out


async def run(args, servers) -> Tuple[List[float], List[float], List[str]]:
    healthy, hung = servers
    config = Config(
        console=ConsoleConfig(interval=args.interval),
        nodes=(
            NodeConfig(name="ok-node", host=healthy.address, port=healthy.port),
            NodeConfig(name="hung-node", host=hung.address, port=hung.port),
        ),
        ssh=SSH,
    )
    app = OpsConsole(config, Fleet(config))
    rng = random.Random(7)
    async with app.run_test(size=(140, 40)) as pilot:
        deadline = time.monotonic() + 60
        while not all(s.state == STATE_UP and s.frame.seq >= 2 for s in app.fleet.states().values()):
            if time.monotonic() > deadline:
                raise RuntimeError("nodes not up: %s" % {n: s.reason for n, s in app.fleet.states().items()})
            await pilot.pause(0.1)
        await time_presses(pilot, app, 6, rng)  # warm-up: first paint of each pane
        baseline = await time_presses(pilot, app, args.presses, rng)
        seq_before = app.fleet.states()["ok-node"].frame.seq
        hung.freeze()
        try:
            seen: List[str] = []
            states_task = asyncio.ensure_future(_watch(app, seen))
            frozen = await time_presses(pilot, app, args.presses, rng)
            states_task.cancel()
        finally:
            hung.thaw()
        seen.append("ok-node frames during the frozen run: %d" % (app.fleet.states()["ok-node"].frame.seq - seq_before))
    return baseline, frozen, seen


async def _watch(app: OpsConsole, seen: List[str]) -> None:
    while True:
        state = app.fleet.states()["hung-node"].state
        if not seen or seen[-1] != state:
            seen.append(state)
        await asyncio.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presses", type=int, default=80, help="presses per run (default 80)")
    parser.add_argument("--interval", type=float, default=0.3, help="probe interval in seconds (default 0.3)")
    args = parser.parse_args()
    missing = sshd_missing_reason()
    if missing:
        print("cannot run: " + missing)
        return 2
    with tempfile.TemporaryDirectory(prefix="keypress-") as tmp:
        os.environ["HOME"] = os.path.join(tmp, "home")  # no ~/.ssh/config or agent of the real user leaks in
        os.environ.pop("SSH_AUTH_SOCK", None)
        client = ClientEnv(Path(tmp) / "home")
        factory = SshdFactory(Path(tmp) / "servers", client)
        try:
            servers = (factory.start(), factory.start())
            baseline, frozen, seen = asyncio.run(run(args, servers))
        finally:
            factory.close()
    b_med, f_med = statistics.median(baseline), statistics.median(frozen)
    b_p95, f_p95 = p95(baseline), p95(frozen)
    print("key press to pane switched, %d presses each, probe interval %g s" % (args.presses, args.interval))
    print("  baseline (both nodes up)   median %6.1f ms  p95 %6.1f ms  max %6.1f ms" % (b_med, b_p95, max(baseline)))
    print("  one node frozen (SIGSTOP)  median %6.1f ms  p95 %6.1f ms  max %6.1f ms" % (f_med, f_p95, max(frozen)))
    print("  ratio frozen / baseline    median %.2f x     p95 %.2f x" % (f_med / b_med, f_p95 / b_p95))
    print("  hung-node during the frozen run: %s" % " -> ".join(seen[:-1]))
    print("  %s" % seen[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
