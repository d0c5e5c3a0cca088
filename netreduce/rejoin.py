"""Rank 0's way back to the switch after a fallback (netreduce/away.py, step 5): how long
it waits (`Backoff`: doubled while the switch flaps) and the background task that waits,
unregisters the lost ring and Pings the controller until it answers (`Rejoiner`). The
module's figures are read at each step (tests shorten them)."""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from netreduce.registration import Controller, unregister

logger = logging.getLogger(__name__)

REJOIN_FIRST = 5.0      # s after a fallback before rank 0 first asks the controller again
REJOIN_MAX = 300.0      # s: the longest back-off
REJOIN_POLL = 2.0       # s between Pings while the controller does not answer
STABLE = 60.0           # s back on the switch after which a new loss is not a flap
SILENT_WARNING = 60.0   # s of an unanswered controller before rank 0 warns (once)


class Backoff:
    """How long rank 0 waits after a fallback before it asks the controller again:
    REJOIN_FIRST, doubled (up to REJOIN_MAX) when the switch was lost again within STABLE
    seconds of the last return (it flaps), back to REJOIN_FIRST otherwise; also doubled
    after a registration that failed. So a flapping switch sees at most one registration
    per back-off."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.delay = REJOIN_FIRST
        self._returned: float | None = None
        # (the module's figures are read at each step: tests shorten them)

    def lost(self) -> float:
        """The switch went away: the delay before the next attempt."""
        if self._returned is not None and self._clock() - self._returned < STABLE:
            self.delay = min(2 * self.delay, REJOIN_MAX)
        else:
            self.delay = REJOIN_FIRST
        return self.delay

    def failed(self) -> float:
        """A registration attempt failed: the delay before the next one."""
        self.delay = min(2 * self.delay, REJOIN_MAX)
        return self.delay

    def returned(self) -> None:
        self._returned = self._clock()


class Rejoiner:
    """Rank 0's background task after a fallback: waits `delay` s, unregisters the lost
    ring (best effort: the switch may hold it still if it only lost the lease), then Pings
    the controller every REJOIN_POLL s until it answers and sets `ready`. Warns once when
    the controller stays silent SILENT_WARNING s (the job keeps running over the ring)."""

    def __init__(self, controller: Controller, delay: float, lost_ring: str | None) -> None:
        self._controller, self._delay, self._lost = controller, delay, lost_ring
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nr-rejoin", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._stop.wait(self._delay):
            return
        poll = REJOIN_POLL
        if self._lost is not None:
            unregister(self._controller, self._lost, quiet=True)
        since, warned = time.monotonic(), False
        while not self._stop.is_set():
            try:
                self._controller.ping()
            except Exception as exc:        # noqa: BLE001 - any failure: not back yet
                if not warned and time.monotonic() - since > SILENT_WARNING:
                    warned = True
                    logger.warning("netreduce: warning: the switch controller at %s has not "
                                   "answered for %.0f s: calls keep running over the host "
                                   "ring (%s)", self._controller.addr,
                                   time.monotonic() - since, exc)
                self._stop.wait(poll)
                continue
            self.ready.set()
            return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
