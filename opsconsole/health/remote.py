"""Starting the probe's health mode (the GPU suite) on a node, over SSH or locally, and reading its results.

The suite travels in the probe bundle itself (opsconsole.nodes.bundle carries every module
of opsconsole/probe/): the same script, with its last statement starting
opsconsole.probe.health_mode.main instead of the agent, is fed on stdin to `python3 - ARGS`,
so nothing is installed or written on the node and the console and the node always run
the same code. A local node runs the same bundle in a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import time
from typing import Any, List, Optional, Sequence, Tuple

from opsconsole.config import HealthConfig
from opsconsole.health.result import STATUS_ERROR, STATUSES, HealthResult
from opsconsole.nodes.bundle import probe_bundle

AGENT_ENTRY = "from opsconsole.probe.agent import main\n"
HEALTH_ENTRY = "from opsconsole.probe.health_mode import main\n"
SUITE_CHECK = "gpu_sanity"
REMEDY_UNREACHABLE = "check the node's SSH connection and that its python3 has torch with CUDA"


def health_bundle() -> str:
    """The probe bundle whose entry point is the health mode instead of the agent."""
    bundle = probe_bundle()
    head, found, tail = bundle.rpartition(AGENT_ENTRY)
    if not found:
        raise RuntimeError("the probe bundle's entry point changed: cannot start its health mode")
    return head + HEALTH_ENTRY + tail


def suite_args(
    node: str, cfg: HealthConfig, gpus: Optional[Sequence[int]] = None, force: bool = False, level: int = 1
) -> List[str]:
    """The health mode's arguments (after `python3 -`)."""
    args = ["--json", "--level", str(level), "--node-name", node, "--memory-share", "%g" % cfg.gpu_test_memory_share]
    if gpus:
        args += ["--gpus", ",".join(str(int(g)) for g in gpus)]
    if force:
        args.append("--force")
    return args


def result_from_wire(data: Any, node: str) -> HealthResult:
    """A HealthResult from one JSON line of the health mode (raises ValueError when malformed)."""
    if not isinstance(data, dict) or not isinstance(data.get("check"), str):
        raise ValueError("not a result")
    status = data.get("status")
    if status not in STATUSES:
        raise ValueError("unknown status %r" % (status,))
    gpu = data.get("gpu")
    evidence = tuple(
        (str(pair[0]), str(pair[1]))
        for pair in data.get("evidence") or ()
        if isinstance(pair, (list, tuple)) and len(pair) == 2
    )
    duration = data.get("duration_s")
    return HealthResult(
        check=data["check"],
        node=node,
        status=status,
        message=str(data.get("message", "")),
        gpu=gpu if isinstance(gpu, int) and not isinstance(gpu, bool) else None,
        evidence=evidence,
        remedy=str(data.get("remedy", "")),
        time=float(data.get("time") or time.time()),
        duration_s=float(duration) if isinstance(duration, (int, float)) else None,
    )


def parse_suite_output(text: str, node: str, status: Optional[int], stderr: str = "") -> List[HealthResult]:
    """Results from the health mode's stdout; one `error` result saying why when there are none."""
    results = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue  # a warning a library printed on stdout
        try:
            results.append(result_from_wire(json.loads(line), node))
        except ValueError:
            continue
    if not results:
        last = [line for line in (stderr or text).splitlines() if line.strip()]
        why = last[-1].strip()[:300] if last else "no output"
        results.append(suite_error(node, "the GPU suite gave no results (exit %s): %s" % (status, why)))
    return results


def suite_error(node: str, message: str) -> HealthResult:
    return HealthResult(SUITE_CHECK, node, STATUS_ERROR, message, None, (), REMEDY_UNREACHABLE, time.time())


async def run_local_suite(python: str, args: Sequence[str], timeout: float) -> Tuple[Optional[int], str, str]:
    """Run the health bundle with a local interpreter: (exit status, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        *shlex.split(python),
        "-",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(health_bundle().encode("utf-8")), timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    return process.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


async def run_gpu_suite(
    node: str,
    cfg: HealthConfig,
    link: Any = None,
    python: str = "python3",
    gpus: Optional[Sequence[int]] = None,
    force: bool = False,
    level: int = 1,
) -> List[HealthResult]:
    """Run the GPU suite on `node`: over the link's SSH connection when it has one, else locally.

    Never raises for the node's faults: an unreachable node, a timeout or a missing torch
    come back as `error` results with the reason.
    """
    args = suite_args(node, cfg, gpus, force, level)
    timeout = cfg.gpu_test_timeout_s
    try:
        if link is not None and hasattr(link, "run_command"):
            argv = shlex.split(getattr(getattr(link, "node", None), "python", None) or python) + ["-"] + args
            status, out, err = await link.run_command(argv, timeout=timeout, input=health_bundle())
        else:
            status, out, err = await run_local_suite(python, args, timeout)
    except asyncio.CancelledError:
        raise
    except asyncio.TimeoutError:
        return [suite_error(node, "the GPU suite did not finish within %g s ([health] gpu_test_timeout_s)" % timeout)]
    except Exception as exc:  # LinkError, OSError (no interpreter) ...
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return [
            suite_error(node, "could not run the GPU suite: %s%s" % (type(exc).__name__, ": " + text if text else ""))
        ]
    return parse_suite_output(out, node, status, err)
