"""Collecting a report's inputs from the fleet: states, log tails, diagnosis, health, nvidia-smi -q.

Everything is best effort with a time limit per node: what fails is written into the
report's errors, never raised, so a report of a broken cluster still gets made.

Commands and log reads go only where a node's own link says its commands run: this machine for
the local node, the node's SSH connection otherwise. A replay's nodes happened elsewhere or long
ago, and a node without a command channel has none: nothing is read for them here (this
machine's `nvidia-smi -q` and log files under a replayed node's name would describe another
machine).
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import shutil
from typing import Dict, List, Optional, Sequence, Tuple

from opsconsole.nodes.base import COMMANDS_SSH, command_channel, is_replayed
from opsconsole.report.builder import LOG_TAIL_LINES, ReportInputs

SMI_TIMEOUT_S = 20.0
CONFIG_MAX_CHARS = 1 << 20  # a config is a few kB; more is not read into a report
# Run on a remote node with the globs as one JSON argument: globbing and reading happen
# there, and no file name ever passes through a shell.
_REMOTE_TAIL = r"""
import glob, json, sys
out = {}
for pattern in json.loads(sys.argv[1]):
    for path in sorted(glob.glob(pattern))[:64]:
        try:
            with open(path, 'rb') as f:
                f.seek(0, 2); size = f.tell(); f.seek(max(0, size - %d))
                out[path] = f.read().decode('utf-8', 'replace').splitlines()[-%d:]
        except OSError as e:
            out[path] = ['<unreadable: %%s>' %% e.strerror]
print(json.dumps(out))
""" % (LOG_TAIL_LINES * 400, LOG_TAIL_LINES)


def tail_lines(path: str, count: int = LOG_TAIL_LINES, max_bytes: int = LOG_TAIL_LINES * 400) -> List[str]:
    """The last `count` lines of a file, reading at most `max_bytes` from its end."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        data = f.read()
    return data.decode("utf-8", "replace").splitlines()[-count:]


def local_log_tails(patterns: Sequence[str], problems: List[str]) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    for pattern in patterns:
        matched = sorted(glob.glob(os.path.expanduser(pattern)))
        if not matched:
            problems.append("logs: nothing matches %s on this machine" % pattern)
        for path in matched[:64]:
            try:
                out[path] = tail_lines(path)
            except OSError as exc:
                problems.append("logs: %s: %s" % (path, exc.strerror or exc))
    return out


async def _local_command(argv: List[str], timeout: float) -> Tuple[Optional[int], str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def node_command(link, argv: List[str], timeout: float) -> Tuple[Optional[int], str, str]:
    """Run argv on the node of `link`: over its SSH connection, or here for the local node."""
    if link is not None and hasattr(link, "run_command"):
        return await link.run_command(argv, timeout=timeout)
    return await _local_command(argv, timeout)


async def collect_smi(name: str, link, problems: List[str]) -> Optional[str]:
    is_remote = link is not None and hasattr(link, "run_command")
    if not is_remote and shutil.which("nvidia-smi") is None:
        problems.append("nvidia-smi -q: %s: nvidia-smi is not installed" % name)
        return None
    try:
        code, out, err = await node_command(link, ["nvidia-smi", "-q"], SMI_TIMEOUT_S)
    except Exception as exc:  # an unreachable node is a line in the report, not a failed report
        problems.append("nvidia-smi -q: %s: %s" % (name, str(exc) or type(exc).__name__))
        return None
    if code != 0:
        problems.append("nvidia-smi -q: %s: exit %s: %s" % (name, code, (err or out).strip()[:200]))
        return out or None
    return out


async def remote_log_tails(
    name: str, link, python: str, patterns: Sequence[str], problems: List[str]
) -> Dict[str, List[str]]:
    try:
        code, out, err = await link.run_command(
            [python, "-c", _REMOTE_TAIL, json.dumps(list(patterns))], timeout=SMI_TIMEOUT_S
        )
        if code != 0:
            raise RuntimeError("exit %s: %s" % (code, err.strip()[:200]))
        return json.loads(out)
    except Exception as exc:
        problems.append("logs: %s: %s" % (name, str(exc) or type(exc).__name__))
        return {}


def diagnose_tails(tails: Dict[Tuple[str, str], List[str]]):
    """Every log's tail read as one run: the verdict `diagnose --run` gives, not one root cause per file."""
    from opsconsole.diagnosis.run import diagnose_run_lines

    return diagnose_run_lines(tails)


async def gather(config, fleet=None, timeout: float = 10.0, health: Optional[Sequence] = None) -> ReportInputs:
    """Everything for a report; `fleet` is the console's running fleet, or None for a fresh snapshot.

    `health` is what the console's monitor holds; without it the health rules are judged on the
    states collected here.
    """
    problems: List[str] = []
    own_fleet = fleet is None
    if own_fleet:
        from opsconsole.health.runner import snapshot_for_checks
        from opsconsole.sources import fleet_with_sources

        fleet = fleet_with_sources(config)
        # Polled as `check` polls (a local node twice, for its rates): the report judges the same checks.
        states_list = await snapshot_for_checks(fleet, timeout)
        states = {s.name: s for s in states_list}
    else:
        states = fleet.states()
    if health is None:
        from opsconsole.health.runner import evaluate_state

        health = [result for state in states.values() for result in evaluate_state(state, config)]
    config_text = None
    if config.source:
        try:
            with open(config.source, encoding="utf-8", errors="replace") as f:
                config_text = f.read(CONFIG_MAX_CHARS + 1)
            if len(config_text) > CONFIG_MAX_CHARS:
                config_text = config_text[:CONFIG_MAX_CHARS]
                problems.append(
                    "config: %s: longer than %d characters; the rest is left out" % (config.source, CONFIG_MAX_CHARS)
                )
        except OSError as exc:
            problems.append("config: %s: %s" % (config.source, exc.strerror or exc))
    tails: Dict[Tuple[str, str], List[str]] = {}
    smi: Dict[str, str] = {}
    try:
        if is_replayed(fleet):
            problems.append(
                "a replay of a recording: nothing collected from the nodes (no log tail, no nvidia-smi -q); "
                "the report holds what the recording holds"
            )
        for node in config.nodes if not is_replayed(fleet) else ():
            state = states.get(node.name)
            link = None if node.local else _link(fleet, node.name)
            if not node.local and (is_replayed(link) or command_channel(link) != COMMANDS_SSH):
                problems.append("%s: no command channel to the node: nothing collected from it" % node.name)
                continue
            if state is not None and not state.is_live and not node.local:
                problems.append("%s: %s (%s): nothing collected from it" % (node.name, state.state, state.reason or ""))
                continue
            patterns = list(config.logs.paths)
            if node.local:
                for path, lines in local_log_tails(patterns, problems).items():
                    tails[(node.name, path)] = lines
            elif patterns and link is not None:
                for path, lines in (await remote_log_tails(node.name, link, node.python, patterns, problems)).items():
                    tails[(node.name, path)] = lines
            output = await collect_smi(node.name, link, problems)
            if output is not None:
                smi[node.name] = output
    finally:
        if own_fleet:
            await fleet.stop()
    replayed = is_replayed(fleet)
    return ReportInputs(
        replay_of=getattr(getattr(fleet, "reader", None), "path", "a recording") if replayed else None,
        replay_at=fleet.now() if replayed and callable(getattr(fleet, "now", None)) else None,
        states=states,
        config_text=config_text,
        config_source=config.source,
        health=list(health),
        run=diagnose_tails(tails),
        log_tails=tails,
        smi=smi,
        problems=problems,
    )


def _link(fleet, name: str):
    try:
        return fleet.link(name)
    except KeyError:
        return None
