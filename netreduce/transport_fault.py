"""Transport faults (issue 40): a QP in the error state, a work completion with an error
status, costs one call's time, never the job. docs/transport-faults.md has
the table of what each costs.

By connection:
- "inc" (through the switch): `AwayProtocol.on_inc` takes a failed completion there, when
  no switch-away notice explains it, for the switch's loss of the ring; the switch-away
  protocol settles it (docs/reliability.md, "Switch restarts"): the call is finished from
  a good rank's sum or redone over the host ring, later calls run there, and after
  the back-off the "inc" ring is built again (fresh QPs and PSNs through the store) and
  registered again (the old ring unregistered; lease, owner and quota as before).
- "ring" (the host ring): `FaultRecovery`, below.

The host ring's protocol, alike on every rank:
1. Notice: the rank whose completion failed publishes a notice of the next epoch through
   the store, naming itself, the ring and the status (`fault_reason`). The epochs are the
   switch-away protocol's (one sequence, settled in order; `AwayProtocol.settle` hands a
   host-ring fault's epoch to `FaultRecovery.settle`). A rank waiting on "ring" leaves the
   wait for any notice (`RingFault`, the stream's liveness check): the epoch of a notice
   some rank left a "ring" transfer for (a peer's records failed on "inc" after it got
   them) is settled here too, the stream being `interrupted`. An idle rank settles it on
   its progress thread.
2. Settle epoch e: every rank publishes its position (the call it has not completed; idle:
   its next call); k* is the lowest. Every position is k* or k*+1: a rank completes call
   k+1 only after every rank started it (its metadata exchange needs every record). While
   the switch aggregates, the ranks leave it as for its loss (`AwayProtocol.fall_back`:
   the records of call k*+1 went through "inc", where the ranks past k* are a message
   ahead) and rank 0 registers a fresh "inc" ring after the back-off.
3. Bound: after FAULT_ATTEMPTS epochs settled for the same call k*, every rank raises
   `TransportFault` naming the connections, the statuses seen and the attempts; else it
   backs off (`backoff`), so a fault that keeps coming back fails within `fault_bound`.
4. Rebuild: every rank destroys its "ring" QPs (no late WRITE of the old ones lands) and
   creates new ones, whose QPNs and PSNs travel through the store; connected, every rank
   waits for every other before anything is sent.
5. Redo call k* from its untouched input: a rank at k* runs it again (its input is intact
   until the ring algorithm copies the result out, at the end of a completed call:
   netreduce/algorithms/ring.py); a rank at k*+1 completed k* and returned its result, so
   it runs k* again from the copy of its input kept for that (`keep`: a host-ring call's
   input is copied before it runs and kept until every rank started the next call), into
   a scratch array: its caller's result is not written again, and the copy stays intact
   for a later epoch's redo (that one completed here, not everywhere). Exactly once: an output is written
   only by the attempt that completed the call, from every rank's original input. A
   switch call being finished from the kept wire words (`AwayProtocol.resuming`) is
   finished so again on every rank instead.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import replace
from typing import Any, Callable, Protocol

import numpy as np

from flowctl.plan import FlowConfig
from flowctl.stream import CompletionError, Stream
from netreduce.errors import TransportFault
from netreduce.rings import Host, RingQPsLike, connect_ring
from netreduce.routing import CallStats
from netreduce.workspace import RegisteredMemory
from ring_setup.endpoints import HostEndpoint, RingEndpoint
from ring_setup.rendezvous import Rendezvous

logger = logging.getLogger(__name__)

FAULT_ATTEMPTS = 8      # epochs settled for one call before it fails on every rank: a
                        # link dark for 20 s heals (fault_bound: 35 s at the defaults)
BACKOFF_FIRST = 0.5     # s before the second attempt of a call; doubled for each next one
BACKOFF_MAX = 8.0       # s: the longest back-off
_REASON = re.compile(r"^rank (\d+): transport fault on '(ring|inc)': ")


def fault_reason(ring: str, exc: BaseException) -> str:
    """What a rank publishes (after "rank R: ") for a failed completion on `ring`."""
    return f"transport fault on {ring!r}: {exc}"


def faulted_ring(reason: str) -> str | None:
    """The ring a notice's `reason` names a transport fault of (None: not a fault)."""
    m = _REASON.match(reason)
    return m.group(2) if m else None


def ring_of(exc: CompletionError) -> str:
    """The ring of the stream a failed completion came from (its label, rings.connect_ring)."""
    return "inc" if exc.label.endswith("ring 'inc'") else "ring"


def backoff(attempt: int) -> float:
    """Seconds to wait before attempt `attempt` (1: the first) of a call after a fault."""
    return 0.0 if attempt <= 1 else min(BACKOFF_FIRST * 2 ** (attempt - 2), BACKOFF_MAX)


def fault_bound(config: FlowConfig) -> float:
    """Seconds a fault that keeps coming back costs before `TransportFault` (without the
    store's and the rebuilds' own time): every attempt's back-off and retry budget."""
    return sum(backoff(a) + config.dark_budget for a in range(1, FAULT_ATTEMPTS + 1))


class RingFault(Exception):
    """A notice this rank has not settled (a host-ring fault, the switch's loss, a fault on
    "inc") arrived while it waited on the host ring (internal: the communicator settles it
    and redoes the call; the ring is rebuilt, as the stream was left mid-transfer)."""


class Epochs(Protocol):
    """The notice epochs settled, shared with the switch-away protocol (AwayProtocol)."""

    epoch: int
    settling: int           # the epoch being settled (its notice does not end a wait)
    endpoints: list[HostEndpoint]

    @property
    def aggregating(self) -> bool: ...
    def fall_back(self, epoch: int, reason: str, call: int) -> None: ...
    def resuming(self, call: int) -> bool: ...


class FaultRecovery:
    """One rank's side of the host ring's fault protocol (module doc): the "ring" QPs and
    stream (rebuilt in `settle`), the last host-ring call's kept input, the attempts and
    statuses of the call being recovered. `settle`, `keep` and `forget` run under the
    communicator's call lock; `liveness` on the stream's waits."""

    def __init__(self, *, rendezvous: Rendezvous, host: Host, control: RegisteredMemory,
                 config: FlowConfig, streams: dict[str, Stream], qps: RingQPsLike | None,
                 epochs: Epochs, stats: CallStats,
                 redo: Callable[[Any, int], None]) -> None:
        self._rendezvous, self.rank = rendezvous, rendezvous.rank
        self._host, self._control, self._config = host, control, config
        self._streams, self._qps, self._epochs = streams, qps, epochs
        self._stats, self._redo = stats, redo
        self._kept: tuple[int, Any] | None = None     # (seq, the call on a copy of its input)
        self._seen: dict[int, list[str]] = {}         # call -> the faults settled for it
        streams["ring"].liveness = self.liveness

    def liveness(self) -> None:
        """The "ring" stream's liveness check: the peers' (PeerFailed), then whether some
        rank published a notice this rank has not settled nor is settling (RingFault): a
        rank waiting here for a peer that left the call for a notice (its WRITE on "inc"
        failed) leaves the wait to settle it too, as a wait on "inc" does."""
        self._rendezvous.check_peers()
        epoch = self._rendezvous.notice_epoch
        if epoch > max(self._epochs.epoch, self._epochs.settling):
            raise RingFault(self._rendezvous.notices[epoch])

    def seen(self, exc: BaseException) -> str:
        """What this rank publishes for `exc`, an error that ended its attempt of a call."""
        if isinstance(exc, CompletionError):
            return fault_reason(ring_of(exc), exc)
        return str(exc)

    def keep(self, seq: int, call: Any) -> None:
        """Host-ring call `seq` (a `comm._Call`) is about to run: keep a copy of its input
        until every rank started the next call (a rank ahead redoes it from there)."""
        if self._kept is None or self._kept[0] != seq:
            copy = call.array.copy()
            self._kept = (seq, replace(call, array=copy, target=copy, result=None))

    def forget(self, seq: int) -> None:
        """Every rank started call `seq`: the inputs and faults of earlier calls are done."""
        if self._kept is not None and self._kept[0] < seq:
            self._kept = None
        for call in [c for c in self._seen if c < seq]:
            del self._seen[call]

    def settle(self, epoch: int, position: int, reason: str) -> int:
        """Settle notice `epoch` (module doc, steps 2-5) with this rank's `position`: a
        host-ring fault, or any notice some rank left a "ring" wait for
        (`AwayProtocol.settle`). Returns k* once it is redone here if this rank was past
        it; the caller redoes k* when this rank is at it, or every rank finishes it from
        the kept data when the fault interrupted that (`Epochs.resuming`)."""
        t0 = time.monotonic()
        positions = [p["position"] for p in self._rendezvous.gather(
            f"fault.{epoch}", {"position": position}, self._config.collective_timeout,
            waiting_for=f"settled a transport fault (epoch {epoch})")]
        k = min(positions)
        if max(positions) > k + 1:
            raise self._failure(reason, f"positions {positions} span more than two calls")
        seen = self._seen.setdefault(k, [])
        seen.append(reason)
        if len(seen) > FAULT_ATTEMPTS:
            raise self._failure(reason, f"call #{k} faulted {len(seen)} times: " +
                                "; ".join(seen))
        self._stats.fault_detected(t0)
        if self._epochs.aggregating:    # the records of call k* + 1 went through "inc"
            self._epochs.fall_back(epoch, reason, k)
        self._rebuild(epoch)
        self._epochs.epoch = epoch
        time.sleep(backoff(len(seen)))
        resuming = self._epochs.resuming(k)
        if position > k and not resuming:
            kept = self._kept
            if kept is None or kept[0] != k:
                raise RuntimeError(f"netreduce: rank {self.rank}: {reason}: this rank "
                                   f"completed call #{k} but keeps no copy of its input")
            # into a scratch output: the kept input must survive a redo that completes
            # here but not on every rank (the next epoch redoes it again from that input)
            self._redo(replace(kept[1], target=np.empty_like(kept[1].array)), k)
        # a fault on "inc" is counted by fall_back
        counts = self._stats.fault_rebuilt(fault=faulted_ring(reason) == "ring")
        if self.rank == 0:
            logger.warning("netreduce: %s; epoch %d: the host ring's QPs were rebuilt "
                           "(attempt %d of call #%d, positions %s), the call is %s "
                           "(transport counts: %s)", reason, epoch, len(seen), k, positions,
                           "finished again from a good rank's kept sum" if resuming
                           else "redone from its input",
                           ", ".join(f"{k} {v}" for k, v in counts.items()))
        return k

    def _rebuild(self, epoch: int) -> None:
        """Steps 4: fresh "ring" QPs and PSNs, exchanged and connected through the store."""
        if self._qps is not None:
            try:
                self._qps.close()
            except Exception as exc:    # noqa: BLE001 - in ERROR, unused: leaking it is safe
                logger.warning("netreduce: rank %d: the old 'ring' QPs could not be "
                               "destroyed: %s", self.rank, exc)
        timeout = self._config.collective_timeout
        qps = self._host.create_ring("ring", self._config)
        theirs = self._rendezvous.gather(f"ring.{epoch}", qps.local().to_dict(), timeout,
                                         waiting_for=f"rebuilt 'ring' (epoch {epoch})")
        endpoints = [replace(ep, rings={**ep.rings, "ring": RingEndpoint.from_dict(d)})
                     for ep, d in zip(self._epochs.endpoints, theirs)]
        self._streams["ring"] = connect_ring(qps, "ring", self._config, endpoints, self.rank,
                                             self._control, self.liveness)
        self._qps, self._epochs.endpoints = qps, endpoints
        self._rendezvous.gather(f"ring-ready.{epoch}", True, timeout,
                                waiting_for=f"connected 'ring' (epoch {epoch})")

    def _failure(self, reason: str, why: str) -> TransportFault:
        return TransportFault(f"netreduce: rank {self.rank}: {reason}; not recovered: {why}; "
                              f"the communicator is unusable (netreduce.finalize(), then "
                              f"netreduce.init() a new one)")
