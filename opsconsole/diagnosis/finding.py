"""A recognised failure signature in a log: what it is, why it happens, what to do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, Optional

Severity = Literal["critical", "error", "warning"]
SEVERITY_CRITICAL: Final = "critical"  # the run is dead or will die
SEVERITY_ERROR: Final = "error"
SEVERITY_WARNING: Final = "warning"


@dataclass(frozen=True)
class Category:
    """One entry of the knowledge base (ids as in the logs issue: cuda_oom, nccl_timeout, ...)."""

    id: str
    title: str
    severity: Severity
    cause: str
    remedy: str


@dataclass(frozen=True)
class Finding:
    """One line of one log matched to a category."""

    line: int  # 1-based line number in the input
    category: str  # Category.id
    severity: Severity
    title: str
    cause: str
    remedy: str
    excerpt: str  # the matching line (and, where useful, its neighbours), trimmed
    source: Optional[str] = None  # LogSource.key or the file name
    rank: Optional[int] = None
    time: Optional[float] = None
    weak: bool = False  # only indirect evidence (an exit code, a launcher's report): never outranks direct evidence
    exception: Optional[str] = None  # app_error: "IndexError: index out of range in self"
    frame: Optional[str] = None  # app_error: the innermost frame outside site-packages, "path:line in func"
    evidence: Optional[str] = None  # host_oom: "seen" (the OOM killer's own line; SIGKILL alone is rank_crashed)
    # Where it was handled (Diagnoser.handled()): "line 9: <the step or recovery line after it>"; else None.
    handled_by: Optional[str] = None
