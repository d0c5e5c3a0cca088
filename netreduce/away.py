"""The switch went away: what the ranks agree on, and when rank 0 asks to come back.

The communicator (netreduce/comm.py) runs the protocol; this module holds its pure parts
(docs/reliability.md tells the whole story):
- `SwitchAway`, raised inside a call on "inc" when the switch stopped aggregating (the
  seal or the metadata came back unaggregated, or another rank published a switch-away
  notice through the store while this rank waited on "inc").
- `settle_plan`: from every rank's position (the first call it could not complete through
  the switch; an idle rank: its next call), the call k* that all ranks settle and whether
  its wire words must be summed over the host ring (some rank completed k* with a good
  seal, so every rank sent its wire words of k* and none may compute k* twice).
- `Backoff` and `Rejoiner`: rank 0 asks the controller again (Ping) only after a back-off
  that doubles when the switch flaps, and flags its next call's metadata (`meta.REJOIN`)
  once the controller answers; every rank then rebuilds and registers "inc" in that call.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from netreduce.registration import Controller, unregister

logger = logging.getLogger(__name__)

REJOIN_FIRST = 5.0      # s after a fallback before rank 0 first asks the controller again
REJOIN_MAX = 300.0      # s: the longest back-off
REJOIN_POLL = 2.0       # s between Pings while the controller does not answer
STABLE = 60.0           # s back on the switch after which a new loss is not a flap
SILENT_WARNING = 60.0   # s of an unanswered controller before rank 0 warns (once)


class SwitchAway(Exception):
    """The switch stopped aggregating during this rank's call on "inc" (internal: the
    communicator settles and finishes the call over the host ring)."""


@dataclass(frozen=True)
class SettlePlan:
    """What every rank does alike after positions `positions` (by rank)."""

    call: int                 # k*: the lowest position
    recover: bool             # k*'s wire words are summed over the host ring
    behind: tuple[int, ...]   # ranks at k* (they had not completed it)

    def describe(self) -> str:
        if self.recover:
            return (f"call #{self.call} is finished from every rank's wire words over the "
                    f"host ring ({len(self.behind)} rank(s) had no good seal)")
        return f"call #{self.call} on runs over the host ring"


def settle_plan(positions: Sequence[int]) -> SettlePlan:
    """k* = min(positions); recover when some rank is past k* (it completed k* with a good
    seal). Invariant (docs/reliability.md): every position is k* or k* + 1 -- a rank can
    complete call k+1 only after every rank started it, i.e. completed k."""
    k = min(positions)
    if max(positions) > k + 1:
        raise ValueError(f"switch fallback: positions {list(positions)} span more than two "
                         f"calls (a rank cannot complete call k+1 while another is in k)")
    behind = tuple(r for r, p in enumerate(positions) if p == k)
    return SettlePlan(k, len(behind) < len(positions), behind)


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
