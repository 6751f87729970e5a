"""Draining a node in Slurm with a reason: `scontrol update NodeName=X State=DRAIN Reason=...`.

X is Slurm's name for the machine, found from the host the node reports (nodes.slurm.slurm_name_of),
not the console's label for it: `local` or a `[[nodes]] name` would drain whatever Slurm calls so.

It runs on the console's machine (the login node has the Slurm client), as argv: the
reason stays one word, spaces included, and scontrol reads `Reason=text with spaces` as
one value. A reason must be one printable line: scontrol stores it as it is, and Slurm
tools print it in tables.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Any, List, Optional, Sequence, Tuple

from opsconsole.actions.argv_template import VALUE_PATTERNS, fill_template
from opsconsole.actions.plan import Refused

MAX_REASON_CHARS = 200


def check_reason(reason: str) -> str:
    """The reason, stripped; ValueError (one line) when it is empty, too long or not one printable line."""
    text = (reason or "").strip()
    if not text:
        raise ValueError("a drain needs a reason")
    if len(text) > MAX_REASON_CHARS:
        raise ValueError("the reason is %d characters; keep it under %d" % (len(text), MAX_REASON_CHARS))
    bad = [ch for ch in text if not ch.isprintable()]
    if bad:
        raise ValueError("the reason must be one printable line (found %r)" % bad[0])
    return text


def drain_argv(template: Sequence[str], node: str, reason: str) -> List[str]:
    """The exact drain command for `node`; ValueError for a bad node name or reason."""
    if not VALUE_PATTERNS["node"].fullmatch(node or ""):
        raise ValueError("%r is not a Slurm node name" % node)
    return fill_template(template, {"node": node, "reason": check_reason(reason)})


def host_names(node: str, state: Any, config: Any) -> List[str]:
    """How the node names its own host (its last frame's hostname) first, then how the console
    reaches it (`[[nodes]] host`); the local node without a frame yet: this machine's name."""
    names: List[str] = []
    frame = getattr(state, "frame", None)
    hostname = getattr(getattr(frame, "host", None), "hostname", None)
    if isinstance(hostname, str) and hostname:
        names.append(hostname)
    for entry in getattr(config, "nodes", ()) or ():
        if entry.name == node:
            if entry.host:
                names.append(entry.host)
            elif entry.local and not names:
                import socket

                names.append(socket.gethostname())
    return names


async def slurm_node(node: str, state: Any, config: Any) -> Tuple[str, str]:
    """(Slurm's NodeName, the host that matched) for console node `node`; Refused when Slurm has no
    node there or several (see nodes.slurm.slurm_name_of). scontrol runs in a thread: it can take seconds."""
    from opsconsole.nodes.slurm import SlurmUnavailable, slurm_name_of

    hosts = host_names(node, state, config)
    try:
        return await asyncio.get_running_loop().run_in_executor(None, slurm_name_of, node, hosts)
    except SlurmUnavailable as exc:
        raise Refused("%s not drained: %s" % (node, exc)) from None


def unavailable(template: Sequence[str]) -> Optional[str]:
    """Why draining cannot work here (its program is not on PATH), None when it can."""
    program = template[0] if template else ""
    if not program:
        return "no drain command configured"
    if shutil.which(program) is None:
        return "drain needs %s, which is not on this machine's PATH (no Slurm here?)" % program
    return None
