"""One health check's outcome, as the console, `opsconsole check --json` and alerts see it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

STATUS_PASS = "pass"
STATUS_WARN = "warn"
STATUS_FAIL = "fail"
STATUS_ERROR = "error"  # the check could not run
STATUSES = (STATUS_PASS, STATUS_WARN, STATUS_FAIL, STATUS_ERROR)


@dataclass(frozen=True)
class HealthResult:
    check: str  # check id, e.g. "gpu_temperature", "disk_free", "gpu_sanity.fp64_matmul"
    node: str
    status: str  # one of STATUSES
    message: str
    gpu: Optional[int] = None  # GPU index where the check is per GPU
    evidence: Tuple[Tuple[str, str], ...] = ()  # (name, value read) pairs
    remedy: str = ""
    time: float = 0.0  # epoch seconds when it was evaluated
    duration_s: Optional[float] = None  # for on-demand tests
