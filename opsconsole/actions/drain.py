"""Draining a node in Slurm with a reason: `scontrol update NodeName=X State=DRAIN Reason=...`.

It runs on the console's machine (the login node has the Slurm client), as argv: the
reason stays one word, spaces included, and scontrol reads `Reason=text with spaces` as
one value. A reason must be one printable line: scontrol stores it as it is, and Slurm
tools print it in tables.
"""

from __future__ import annotations

import shutil
from typing import List, Optional, Sequence

from opsconsole.actions.argv_template import VALUE_PATTERNS, fill_template

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


def unavailable(template: Sequence[str]) -> Optional[str]:
    """Why draining cannot work here (its program is not on PATH), None when it can."""
    program = template[0] if template else ""
    if not program:
        return "no drain command configured"
    if shutil.which(program) is None:
        return "drain needs %s, which is not on this machine's PATH (no Slurm here?)" % program
    return None
