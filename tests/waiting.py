"""Waiting on a condition instead of sleeping a fixed time: one helper for every test.

A wait returns as soon as its condition holds, so its timeout is only an upper bound (reached when
something is broken) and can be generous on a loaded machine. The condition's first truthy value is
returned, so a test can wait for a thing and use it.
"""

import asyncio
import time
from typing import Any, Callable, Optional, TypeVar

T = TypeVar("T")

WAIT_S = 30.0  # the upper bound of a wait: each returns as soon as its condition holds
POLL_S = 0.05


async def wait_for(
    predicate: Callable[[], T],
    what: str = "the condition",
    *,
    timeout: float = WAIT_S,
    pilot: Optional[Any] = None,
    interval: float = POLL_S,
) -> T:
    """Poll `predicate` until it returns a truthy value (returned), or fail the test after `timeout` s.

    With a Textual `pilot`, each poll is a `pilot.pause(interval)`: pending messages are processed
    and the screen refreshed between polls, so a predicate on widgets sees what the app has done.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("gave up after %g s waiting for %s" % (timeout, what))
        if pilot is not None:
            await pilot.pause(interval)
        else:
            await asyncio.sleep(interval)


def wait_for_sync(
    predicate: Callable[[], T],
    what: str = "the condition",
    *,
    timeout: float = WAIT_S,
    interval: float = 0.1,
) -> T:
    """`wait_for` for code outside an event loop (subprocesses, servers, files)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("gave up after %g s waiting for %s" % (timeout, what))
        time.sleep(interval)


def pane_shown(app: Any, pane_id: str) -> bool:
    """Whether the console shows pane `pane_id` mounted, drawn and holding the focus (a predicate to wait for).

    A pane is made on its first show (OpsConsole.ensure_pane): it is mounted in the app's loop, drawn,
    then given the focus, messages after the key that showed it. Keys typed from then on are its own.
    """
    pane = app.panes.get(pane_id)
    focused = app.focused
    return (
        app.visible_pane_id == pane_id
        and pane_id not in app._pane_mounts
        and pane is not None
        and focused is not None
        and pane in focused.ancestors
    )
