"""Reconnect delays: capped exponential backoff with full jitter."""

from __future__ import annotations

import random
from typing import Optional


class Backoff:
    """Delays for successive reconnect attempts: uniform in [0, min(maximum, initial * 2**n)].

    Full jitter (each delay drawn from zero up to the exponential cap) spreads the
    reconnects of a whole fleet that lost the same switch, so they do not arrive at
    the login node's sshd in waves. `reset()` after a connection that worked.
    """

    def __init__(self, initial: float = 1.0, maximum: float = 60.0, rng: Optional[random.Random] = None) -> None:
        if initial <= 0 or maximum <= 0:
            raise ValueError("backoff delays must be positive")
        self.initial = float(initial)
        self.maximum = float(max(initial, maximum))
        self.rng = rng or random.Random()
        self.attempt = 0

    def cap(self) -> float:
        """The upper bound of the next delay."""
        # min() before the power would overflow: 2**1100 is not a float.
        exponent = min(self.attempt, 64)
        return min(self.maximum, self.initial * (2.0**exponent))

    def next_delay(self) -> float:
        """The delay before the next attempt; each call counts one more failure."""
        delay = self.cap() * self.rng.random()
        self.attempt += 1
        return delay

    def reset(self) -> None:
        """Start again from the initial delay (after a successful connection)."""
        self.attempt = 0
