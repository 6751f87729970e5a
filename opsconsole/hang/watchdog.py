"""NCCL watchdog lines across ranks (the rank that never reached the collective), for the hang tools.

The parsing and the verdict live in opsconsole.diagnosis.watchdog, where the Diagnoser feeds every
rank's lines into them (the diagnosis sits below hang in the layers); this is the hang package's
name for the same functions.
"""

from opsconsole.diagnosis.watchdog import (  # noqa: F401
    WatchdogLines,
    WatchdogReport,
    WatchdogVerdict,
    parse_watchdog_line,
    rank_list,
    verdict_text,
    watchdog_verdict,
)
