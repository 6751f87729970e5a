"""One health check's outcome, as the console, `opsconsole check --json` and alerts see it."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Final, Literal, Optional, Tuple

from opsconsole.model import frozen

HealthStatus = Literal["pass", "warn", "fail", "error", "skip"]
STATUS_PASS: Final = "pass"
STATUS_WARN: Final = "warn"
STATUS_FAIL: Final = "fail"
STATUS_ERROR: Final = "error"  # the check could not run
STATUS_SKIP: Final = "skip"  # nothing to check (the GPU suite on a node without a GPU)
STATUSES: Tuple[HealthStatus, ...] = (STATUS_PASS, STATUS_WARN, STATUS_FAIL, STATUS_ERROR, STATUS_SKIP)


@frozen
class HealthResult:
    """One health check's outcome on one node: its status, message and details."""

    check: str  # check id, e.g. "gpu_temperature", "disk_free", "gpu_sanity.fp64_matmul"
    node: str
    status: HealthStatus
    message: str
    gpu: Optional[int] = None  # GPU index where the check is per GPU
    evidence: Tuple[Tuple[str, str], ...] = ()  # (name, value read) pairs
    remedy: str = ""
    time: float = 0.0  # epoch seconds when it was evaluated
    duration_s: Optional[float] = None  # for on-demand tests


_FIELDS = ("check", "node", "status", "message", "gpu", "evidence", "remedy", "time", "duration_s")
# Fields added later (with defaults) that make_result does not name: filled with their defaults.
_EXTRA = {f.name: f.default for f in fields(HealthResult) if f.name not in _FIELDS and f.default is not MISSING}


def make_result(
    check: str,
    node: str,
    status: HealthStatus,
    message: str,
    gpu: Optional[int] = None,
    evidence: Tuple[Tuple[str, str], ...] = (),
    remedy: str = "",
    time: float = 0.0,
    duration_s: Optional[float] = None,
) -> HealthResult:
    """HealthResult(...) without the frozen __init__'s per-field object.__setattr__.

    The rules build ~80 results per 8-GPU node on every fleet change; the frozen __init__
    was a quarter of their cost. The dataclass has no __post_init__, so the object is the same.
    """
    result = object.__new__(HealthResult)
    values = {
        "check": check,
        "node": node,
        "status": status,
        "message": message,
        "gpu": gpu,
        "evidence": evidence,
        "remedy": remedy,
        "time": time,
        "duration_s": duration_s,
    }
    if _EXTRA:
        values.update(_EXTRA)
    object.__setattr__(result, "__dict__", values)
    return result
