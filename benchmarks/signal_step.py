"""What checking a process on its node costs a signal: the checked signal step beside a bare `kill`.

Over a real sshd on 127.0.0.1 (one SshLink, connected once), each round starts a `sleep` and
signals it twice over: once with `kill -s TERM -- PID` run as a command (what signals did before
the check), once with probe/checked_signal.py as the console now sends it (`python3 -I -` with its
bundle on stdin, which reads /proc/PID/stat and status and signals through a pidfd). The two are
interleaved in the same run; the medians and their ratio are printed, with the bundle's size. The
step on this machine (in the console's process, for the local node) is timed the same way against
os.kill.

    .venv/bin/python benchmarks/signal_step.py [--rounds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsconsole.actions.runner import run_remote  # noqa: E402
from opsconsole.actions.signals import deliver_signal, identity_in_frame, signal_argv  # noqa: E402
from opsconsole.config import NodeConfig, SshConfig  # noqa: E402
from opsconsole.model import NodeFrame, ProcessSample  # noqa: E402
from opsconsole.nodes.bundle import helper_bundle  # noqa: E402
from opsconsole.nodes.local import LocalLink  # noqa: E402
from opsconsole.probe.procs import ProcessTable  # noqa: E402


def sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)


def identity_of(proc: subprocess.Popen, table: ProcessTable):
    rows = tuple(p for p in table.join([ProcessSample(pid=proc.pid)]) if p.state is not None)
    frame = NodeFrame(node="bench", time=time.time(), seq=1, top_processes=rows)
    return identity_in_frame(frame, proc.pid)


async def measure(rounds: int, work: Path) -> dict:
    from opsconsole.nodes.ssh import SshLink
    from tests.sshd import ClientEnv, SshdFactory, sshd_missing_reason

    if sshd_missing_reason():
        return {"skipped": sshd_missing_reason()}
    client = ClientEnv(work / "home")
    os.environ["HOME"] = str(client.home)
    os.environ.pop("SSH_AUTH_SOCK", None)
    factory = SshdFactory(work / "servers", client)
    server = factory.start()
    link = SshLink(
        NodeConfig(name="bench", host=server.address, port=server.port, python=sys.executable), SshConfig(), 1.0
    )
    local = LocalLink(NodeConfig(name="local", local=True), 1.0)
    table = ProcessTable(use_psutil=False)
    times = {"kill_ssh": [], "checked_ssh": [], "os_kill": [], "checked_here": []}
    try:
        await link.connection()
        for round_ in range(rounds + 3):  # the first 3: warm-up
            procs = [sleeper() for _ in range(4)]
            while any(not open("/proc/%d/stat" % p.pid).read().split("(")[1].startswith("sleep)") for p in procs):
                time.sleep(0.01)  # each has exec'd (a forked child is still its parent's program)
            ids = [identity_of(p, table) for p in procs]
            started = time.perf_counter()
            bare = await run_remote(link, signal_argv("TERM", procs[0].pid), 30)
            kill_ssh = time.perf_counter() - started
            started = time.perf_counter()
            checked = await deliver_signal("TERM", procs[1].pid, link, 30, ids[1])
            checked_ssh = time.perf_counter() - started
            started = time.perf_counter()
            os.kill(procs[2].pid, signal.SIGTERM)
            os_kill = time.perf_counter() - started
            started = time.perf_counter()
            here = await deliver_signal("TERM", procs[3].pid, local, 30, ids[3])
            checked_here = time.perf_counter() - started
            assert bare.ok and checked.ok and here.ok, (bare, checked, here)
            for proc in procs:
                assert proc.wait(10) == -signal.SIGTERM
            if round_ >= 3:
                for key, value in zip(times, (kill_ssh, checked_ssh, os_kill, checked_here)):
                    times[key].append(value)
    finally:
        await link.close()
        factory.close()
    medians = {key: statistics.median(values) * 1000 for key, values in times.items()}
    medians["bundle_bytes"] = len(helper_bundle("checked_signal", "proc_read").encode())
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        result = asyncio.run(measure(args.rounds, Path(folder)))
    if "skipped" in result:
        print("skipped: %s" % result["skipped"])
        return 0
    print("signal over SSH (127.0.0.1), median of %d:" % args.rounds)
    print("  kill -s TERM -- PID (before)     %7.2f ms" % result["kill_ssh"])
    print(
        "  checked step, %5d B bundle       %7.2f ms   %.2fx"
        % (result["bundle_bytes"], result["checked_ssh"], result["checked_ssh"] / result["kill_ssh"])
    )
    print("signal on this machine:")
    print("  os.kill (before)                 %7.3f ms" % result["os_kill"])
    print(
        "  checked step (pidfd)             %7.3f ms   %.1fx"
        % (result["checked_here"], result["checked_here"] / result["os_kill"])
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
