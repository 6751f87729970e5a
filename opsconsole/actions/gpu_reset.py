"""GPU reset: pre-checks, the command from `[actions] gpu_reset_command`, then the GPU read again.

Pre-checks (all must pass; a warning is shown but does not stop it):
- the node is live and its latest frame has the GPU (a GPU that fell off the bus is a warning:
  a reset may not bring it back, a reboot may be needed);
- no compute process on that GPU in the frame: resetting kills the job's CUDA context;
- MIG off: with MIG on, the GPU and compute instances must be destroyed first;
- root, or `sudo -n true` works (the command then runs with `sudo -n` in front).

`python -m opsconsole.actions.gpu_reset --dry-run --index 0` runs the pre-checks on this
machine and prints them with the command that would run; it never resets anything.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from opsconsole.actions.argv_template import fill_template
from opsconsole.actions.runner import CommandResult, remote_link, run_local, run_remote
from opsconsole.model import GpuSample, NodeState

CHECK_PASS, CHECK_WARN, CHECK_FAIL = "pass", "warn", "fail"
PRIVILEGE_TIMEOUT_S = 10.0
SUDO_PREFIX = ("sudo", "-n", "--")


@dataclass(frozen=True)
class Precheck:
    """One pre-check: its name, pass / warn / fail, and what it found."""

    name: str
    status: str
    message: str


@dataclass(frozen=True)
class PrecheckReport:
    checks: Tuple[Precheck, ...]
    use_sudo: bool = False

    @property
    def refused(self) -> bool:
        return any(check.status == CHECK_FAIL for check in self.checks)

    def refusal(self) -> str:
        """One line: the failed checks' messages."""
        return "; ".join(c.message for c in self.checks if c.status == CHECK_FAIL)

    def lines(self) -> List[str]:
        return ["%-4s  %-18s %s" % (c.status, c.name, c.message) for c in self.checks]


def gpu_of(state: Optional[NodeState], index: int) -> Optional[GpuSample]:
    if state is None or state.frame is None:
        return None
    for gpu in state.frame.gpus:
        if gpu.index == index:
            return gpu
    return None


def frame_prechecks(state: Optional[NodeState], index: int) -> List[Precheck]:
    """The checks read from the node's latest frame: node live, GPU there, no compute processes, MIG off."""
    checks: List[Precheck] = []
    name = state.name if state is not None else "the node"
    if state is None or state.frame is None:
        return [Precheck("node", CHECK_FAIL, "no frame from %s yet" % name)]
    if not state.is_live:
        checks.append(Precheck("node", CHECK_FAIL, "%s is %s: its frame is not current" % (name, state.state)))
    else:
        checks.append(Precheck("node", CHECK_PASS, "%s is %s" % (name, state.state)))
    gpu = gpu_of(state, index)
    if gpu is None:
        shown = ", ".join(str(g.index) for g in state.frame.gpus) or "none"
        checks.append(Precheck("gpu", CHECK_FAIL, "%s reported no GPU %d (GPUs: %s)" % (name, index, shown)))
        return checks
    label = "GPU %d %s" % (index, " ".join(part for part in (gpu.name, gpu.pci_bus_id) if part))
    if gpu.lost:
        checks.append(
            Precheck("gpu", CHECK_WARN, "%s fell off the bus; a reset may not bring it back (reboot)" % label)
        )
    else:
        checks.append(Precheck("gpu", CHECK_PASS, label.strip()))
    users = [p for p in state.frame.processes if p.gpu_index == index or (gpu.uuid and p.gpu_uuid == gpu.uuid)]
    if users:
        shown = ", ".join("%d (%s)" % (p.pid, p.name or "?") for p in users[:5]) + (" ..." if len(users) > 5 else "")
        checks.append(
            Precheck(
                "compute processes",
                CHECK_FAIL,
                "%d on GPU %d: %s; stop them first (a reset kills their CUDA context)" % (len(users), index, shown),
            )
        )
    else:
        checks.append(Precheck("compute processes", CHECK_PASS, "none on GPU %d" % index))
    if gpu.mig_mode is True:
        checks.append(
            Precheck(
                "MIG",
                CHECK_FAIL,
                "MIG mode is on: destroy the compute and GPU instances first "
                "(nvidia-smi mig -dci -i %d; nvidia-smi mig -dgi -i %d)" % (index, index),
            )
        )
    elif gpu.mig_mode is None:
        checks.append(Precheck("MIG", CHECK_WARN, "MIG state not reported"))
    else:
        checks.append(Precheck("MIG", CHECK_PASS, "MIG off"))
    return checks


async def privilege_precheck(link: Any, timeout: float = PRIVILEGE_TIMEOUT_S) -> Tuple[Precheck, bool]:
    """(check, use sudo): root on the node, or `sudo -n true` working there."""
    remote = remote_link(link)

    async def run(argv: Sequence[str]) -> CommandResult:
        return await (run_remote(remote, argv, timeout) if remote is not None else run_local(argv, timeout))

    if remote is None:
        is_root = os.geteuid() == 0
    else:
        who = await run(["id", "-u"])
        if who.error is not None:
            return Precheck("privileges", CHECK_FAIL, "cannot tell the user on the node: %s" % who.error), False
        is_root = who.exit_status == 0 and who.stdout.strip() == "0"
    if is_root:
        return Precheck("privileges", CHECK_PASS, "root"), False
    sudo = await run(["sudo", "-n", "true"])
    if sudo.ok:
        return Precheck("privileges", CHECK_PASS, "not root; sudo -n works: the command runs with sudo -n"), True
    why = sudo.error or (sudo.stderr.strip().splitlines() or ["exit %s" % sudo.exit_status])[-1]
    return Precheck("privileges", CHECK_FAIL, "not root and sudo -n is not available (%s)" % why[:160]), False


async def run_prechecks(state: Optional[NodeState], index: int, link: Any) -> PrecheckReport:
    """Every pre-check; the privilege one (a command on the node) only when the frame ones pass."""
    checks = frame_prechecks(state, index)
    if any(check.status == CHECK_FAIL for check in checks):
        return PrecheckReport(tuple(checks))
    privilege, use_sudo = await privilege_precheck(link)
    return PrecheckReport(tuple(checks) + (privilege,), use_sudo)


def reset_argv(template: Sequence[str], node: str, gpu: GpuSample, use_sudo: bool) -> List[str]:
    """The exact reset command for this GPU (raises ValueError for a value that cannot be trusted)."""
    argv = fill_template(
        template,
        {
            "index": str(gpu.index),
            "uuid": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
            "node": node,
        },
    )
    return list(SUDO_PREFIX) + argv if use_sudo else argv


# --- python -m opsconsole.actions.gpu_reset --dry-run -------------------------------------------


def _local_state() -> NodeState:
    from opsconsole.probe.agent import Probe

    probe = Probe(node_name=socket.gethostname(), top=0)  # GPUs and their processes only
    probe.prime(0.1)
    frame = probe.poll()
    now = time.time()
    return NodeState(name=frame.node, state="up", frame=frame, received_at=now, since=now)


def dry_run(index: int, template: Sequence[str], state: Optional[NodeState] = None) -> int:
    """Print this machine's pre-checks for GPU `index` and the command; 0 allowed, 1 refused.

    `state`: the node as read (tests pass one built from captures); None reads this machine.
    """
    state = state if state is not None else _local_state()
    report = asyncio.run(run_prechecks(state, index, None))
    frame = state.frame
    print(
        "GPU reset pre-checks on %s, GPU %d (gpu source %s, driver %s)"
        % (state.name, index, frame.gpu_source if frame else "?", (frame.driver_version if frame else None) or "?")
    )
    for line in report.lines():
        print("  " + line)
    gpu = gpu_of(state, index)
    if gpu is not None:
        try:
            print(
                "command (not run): "
                + " ".join(_shown(word) for word in reset_argv(template, state.name, gpu, report.use_sudo))
            )
        except ValueError as exc:
            print("command: cannot be built: %s" % exc)
    print("verdict: reset would be %s" % ("REFUSED: " + report.refusal() if report.refused else "allowed"))
    print("dry run: nothing was reset")
    return 1 if report.refused else 0


def _shown(word: str) -> str:
    import shlex

    return shlex.quote(word)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opsconsole.actions.gpu_reset",
        description="GPU reset pre-checks on this machine (dry run only).",
    )
    parser.add_argument("--dry-run", action="store_true", help="run only the pre-checks (required)")
    parser.add_argument("--index", type=int, required=True, help="GPU index")
    parser.add_argument("--config", help="config file (for [actions] gpu_reset_command)")
    args = parser.parse_args(argv)
    if not args.dry_run:
        print(
            "refusing: this entry point only runs the pre-checks (--dry-run); reset a GPU from the console",
            file=sys.stderr,
        )
        return 2
    from opsconsole.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    return dry_run(args.index, config.actions.gpu_reset_command)


if __name__ == "__main__":
    sys.exit(main())
