"""What one principal may take of the controller at a time: calls per second (`RateLimit`)
and calls at the target at once (`TargetTurns`).

Invariant: a principal beyond either is refused at once (the caller answers
RESOURCE_EXHAUSTED), and no other principal's share is touched. Both are thread-safe.
"""
from __future__ import annotations

import threading
from typing import Callable


class RateLimit:
    """A token bucket per principal: `rate` calls per second, bursts of 2 x rate
    (0: no limit)."""

    def __init__(self, rate: float, clock: Callable[[], float]):
        self.rate = rate
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}    # principal -> (tokens, when)
        self._lock = threading.Lock()

    def take(self, principal: str) -> bool:
        if not self.rate:
            return True
        with self._lock:
            now = self.clock()
            tokens, when = self._buckets.get(principal, (2 * self.rate, now))
            tokens = min(2 * self.rate, tokens + (now - when) * self.rate)
            ok = tokens >= 1
            self._buckets[principal] = (tokens - 1 if ok else tokens, now)
        return ok


class TargetTurns:
    """At most `cap` calls of one principal at the target at once: its slow calls hold at
    most that many of the server's workers, never another principal's turn."""

    def __init__(self, cap: int):
        self.cap = cap
        self._busy: dict[str, int] = {}          # principal -> its calls at the target now
        self._lock = threading.Lock()

    def take(self, principal: str) -> bool:
        """A turn for `principal` (True), to be given back, or False when it has `cap`."""
        with self._lock:
            if self._busy.get(principal, 0) >= self.cap:
                return False
            self._busy[principal] = self._busy.get(principal, 0) + 1
            return True

    def give_back(self, principal: str) -> None:
        with self._lock:
            self._busy[principal] -= 1
            if not self._busy[principal]:
                del self._busy[principal]
