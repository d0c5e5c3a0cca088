"""Where each allreduce call runs: the one place a call's route is decided, and the counts.

`check_request(algo, dtype, op, switch)` checks a call's request where it is made (an
asynchronous call's too, before it is queued): it raises for explicit requests the call
cannot satisfy (an unknown algo, algo="switch" without a registered ring, or with a
dtype/op the switch does not add). Then each attempt of the call is routed in two steps,
both functions of what every rank holds alike, so every rank takes the same route and the
message sequences on the QPs never diverge (netreduce/algorithms/switch.py):
- `candidates(algo, dtype, op, switch, away)`, before any exchange: the algorithms the
  call may run. The workspace is sized for all of them, and the first one's
  `local_range` goes into the call's metadata.
- `route(algo, call, switch)`, after the metadata exchange and its agreement check: the
  algorithm that runs, from the requested `algo`, the agreed call (dtype, op, every rank's
  range) and whether the switch takes calls -- never from anything one rank alone knows.
  "auto" takes the switch when it is registered and can carry the call, else the ring,
  and says why (`Route.fallback`): the switch does not add the dtype (`DTYPE`) or the op
  (`OP`), or the data holds NaN or infinity, which quantization cannot carry
  (`NON_FINITE`). "auto" without a registered switch runs the ring: not a fallback.
  An explicit algorithm is never substituted: algo="switch" refuses what it cannot carry
  (`NotQuantizable`, `AllreduceOverflow`, alike on every rank).
  An int32 call whose sum may overflow is refused under "auto" too (`AllreduceOverflow`):
  the ring would wrap silently.

While the switch is away (it restarted or lost the ring: netreduce/away.py agrees on it
on every rank, docs/reliability.md) `away` is True alike on every rank: "auto" runs the
ring with the reason `AWAY`, algo="switch" is refused before any exchange
(`SwitchUnavailable`, a `CallRejected`: the communicator stays usable).

`CallStats` counts the routes taken (identical on every rank, since the routes are), and
the switch's departures and returns (`switch_event`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from netreduce.algorithms import Algorithm, CallContext, resolve
from netreduce.algorithms.ring import RING
from netreduce.algorithms.switch import DTYPES, SWITCH, NotQuantizable
from netreduce.meta import CallRejected
from netreduce.registration import SwitchStatus

AUTO = "auto"
DTYPE = "dtype"            # the switch does not add this dtype
OP = "op"                  # the switch does not reduce with this op
NON_FINITE = "non-finite"  # NaN or infinity in some rank's data: quantization cannot carry it
AWAY = "switch-away"       # the switch restarted or lost the ring, and is not back yet
FALLBACKS = {
    DTYPE: "the switch does not add this dtype",
    OP: "the switch reduces only op='sum' and op='avg'",
    NON_FINITE: "the data holds NaN or infinity, which the switch's quantization cannot carry",
    AWAY: "the switch restarted or lost the ring; calls run over the host ring until it is "
          "registered again",
}
# CallStats.switch_event kinds
EVENTS = ("fallbacks", "returns", "recovered")
FAULT_EVENTS = ("faults", "rebuilds", "redone", "ms_lost")   # netreduce.transport_fault


class SwitchUnavailable(CallRejected, RuntimeError):
    """algo="switch" while the switch is away (restarted or lost the ring; the communicator
    re-registers the ring when it answers again): refused alike on every rank, nothing
    moved, the communicator stays usable. algo="auto" runs such calls over the host ring."""


@dataclass(frozen=True)
class Route:
    """The algorithm a call runs and, when "auto" did not take a registered switch, why
    (a key of `FALLBACKS`; None otherwise)."""

    algorithm: Algorithm
    fallback: str | None = None


def check_request(algo: str, dtype: np.dtype, op: str, switch: SwitchStatus) -> None:
    """TypeError / ValueError, before any exchange, for an unknown `algo` or an explicit
    algorithm that cannot take a call of `dtype` and `op` (algo="switch" also needs the
    "inc" ring registered with a switch: `switch`)."""
    if algo == AUTO:
        return
    algorithm = resolve(algo)
    if algorithm is SWITCH and not switch.registered:
        raise ValueError(f"allreduce: algo='switch' needs the communicator's 'inc' ring "
                         f"registered with a switch, and it is not: {switch.note}")
    algorithm.check_call(dtype, op)


def candidates(algo: str, dtype: np.dtype, op: str, switch: SwitchStatus,
               away: str | None = None) -> tuple[Algorithm, ...]:
    """The algorithms a call of `dtype` and `op` with `algo` (a request `check_request`
    passed) may run, preferred first; `SwitchUnavailable` for algo="switch" while the
    switch is away (`away`: why, None while it aggregates)."""
    if algo == AUTO:
        on = switch.registered and away is None
        return (SWITCH, RING) if on and SWITCH.supports(dtype, op) else (RING,)
    algorithm = resolve(algo)
    if algorithm is SWITCH and away is not None:
        raise SwitchUnavailable(
            f"allreduce: algo='switch': the switch at {switch.controller} is away ({away}); "
            f"calls run over the host ring until the ring is registered with it again "
            f"(algo='auto' does that on its own; comm.stats() counts it); nothing moved")
    return (algorithm,)


def route(algo: str, call: CallContext, op: str, switch: bool, away: bool = False) -> Route:
    """The route of an agreed call (see the module doc): `algo` as every rank asked it,
    `call` with every rank's range, `op` the op's name, `switch` whether the switch takes
    calls, `away` whether a registered switch is away (both alike on every rank). Raises
    the switch's `CallRejected` for algo="switch" (and for an int32 overflow under
    "auto"), alike on every rank."""
    if algo != AUTO:
        algorithm = resolve(algo)
        algorithm.check(call)
        return Route(algorithm)
    if away:
        return Route(RING, AWAY)
    if not switch:
        return Route(RING)
    if not SWITCH.supports(call.dtype, op):
        return Route(RING, DTYPE if call.dtype not in DTYPES else OP)
    try:
        SWITCH.check(call)
    except NotQuantizable:
        return Route(RING, NON_FINITE)
    return Route(SWITCH)


class CallStats:
    """How many calls each algorithm ran and how many "auto" calls fell back to the ring,
    by reason; the same on every rank. Thread-safe (the progress thread counts, any thread
    reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ran: dict[str, int] = {}
        self._fallbacks: dict[str, int] = {}
        self._switch: dict[str, int] = dict.fromkeys(EVENTS, 0)
        self._transport: dict[str, int] = dict.fromkeys(FAULT_EVENTS, 0)
        self._lost_since: float | None = None   # the earliest detection not yet recovered

    def switch_event(self, kind: str, count: int = 1) -> dict[str, int]:
        """Count `count` events of `kind` (`EVENTS`: the switch went away; it came back; a
        call finished from a good rank's sum over the host ring after it went
        away); returns the switch counts after it."""
        with self._lock:
            self._switch[kind] += count
            return dict(self._switch)

    def fault_event(self, kind: str, count: int = 1) -> dict[str, int]:
        """Count `count` of `kind` (`FAULT_EVENTS`: transport faults settled, rings rebuilt,
        calls redone; "ms_lost": `fault_recovered`); returns the transport counts after
        it."""
        with self._lock:
            self._transport[kind] += count
            return dict(self._transport)

    def fault_rebuilt(self, fault: bool = True) -> dict[str, int]:
        """A transport fault settled by rebuilding a ring and redoing its call: rebuilds +1,
        and (`fault`: not counted already) faults and redone +1; the counts after it."""
        with self._lock:
            for kind in ("faults", "redone") if fault else ():
                self._transport[kind] += 1
            self._transport["rebuilds"] += 1
            return dict(self._transport)

    def fault_detected(self, at: float) -> None:
        """A transport fault settled here was detected at `at` (monotonic s: this rank's
        failed completion, or its settle's start): time is lost from the earliest such
        detection until `fault_recovered`, each instant counted once."""
        with self._lock:
            if self._lost_since is None or at < self._lost_since:
                self._lost_since = at

    def fault_recovered(self, now: float) -> None:
        """The call the faults detected interrupted completed at `now` (idle: the settle
        ended): add the time since the detection to "ms_lost"."""
        with self._lock:
            if self._lost_since is not None:
                self._transport["ms_lost"] += round(1000 * max(0.0, now - self._lost_since))
                self._lost_since = None

    def count(self, taken: Route) -> bool:
        """Count one routed call; True when it is the first fallback for its reason (the
        caller warns once per reason)."""
        with self._lock:
            name = taken.algorithm.name
            self._ran[name] = self._ran.get(name, 0) + 1
            if taken.fallback is None:
                return False
            seen = self._fallbacks.get(taken.fallback, 0)
            self._fallbacks[taken.fallback] = seen + 1
            return seen == 0

    def snapshot(self) -> dict[str, dict[str, int]]:
        """{"calls": {algorithm: calls routed to it}, "fallbacks": {reason: "auto" calls
        routed to the ring although a switch is registered}, "switch": {event: count},
        "transport": {event: count}}."""
        with self._lock:
            return {"calls": dict(self._ran), "fallbacks": dict(self._fallbacks),
                    "switch": dict(self._switch), "transport": dict(self._transport)}
