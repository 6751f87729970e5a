"""The outcomes an audit record can have (its "outcome" field).

Apart from actions/audit.py (the writer) so that the packages below actions in the layers
(checkpoints' deletion, which audits each unit it deletes) name outcomes without importing actions.
"""

from typing import Final, Literal

Outcome = Literal["confirmed", "cancelled", "refused", "failed", "attempt", "ok"]

OUTCOME_CONFIRMED: Final = "confirmed"
OUTCOME_CANCELLED: Final = "cancelled"
OUTCOME_REFUSED: Final = "refused"
OUTCOME_FAILED: Final = "failed"  # confirmed, but carrying it out did not work
# Actions run by the action runner write two records: the attempt (fsynced before the
# command starts) and its result, linked by "id". An attempt without a result is a crash.
OUTCOME_ATTEMPT: Final = "attempt"
OUTCOME_OK: Final = "ok"  # the command ran and exited 0 (or the signal was delivered)

OUTCOMES: tuple[Outcome, ...] = (
    OUTCOME_CONFIRMED,
    OUTCOME_CANCELLED,
    OUTCOME_REFUSED,
    OUTCOME_FAILED,
    OUTCOME_ATTEMPT,
    OUTCOME_OK,
)
