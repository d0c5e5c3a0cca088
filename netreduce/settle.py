"""What the ranks agree on after the switch stopped aggregating (netreduce/away.py runs it):
the settle plan from every rank's position, the switch calls each rank keeps until every
rank completed them, and the record of a settled call being finished over the host ring.
Invariant (docs/reliability.md): every rank's position is k* or k* + 1 -- a rank can
complete call k+1 through the switch only after every rank started it, i.e. completed k."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from flowctl.stream import Stream
from netreduce.algorithms import CallContext
from netreduce.algorithms.ring import RING
from netreduce.algorithms.switch import SWITCH
from netreduce.errors import SwitchFailure
from netreduce.meta import CallMeta


@dataclass(frozen=True)
class SettlePlan:
    """What every rank does alike after positions `positions` (by rank)."""

    call: int                 # k*: the lowest position
    recover: bool             # k*'s sum is handed from a good rank over the host ring
    behind: tuple[int, ...]   # ranks at k* (they had not completed it)

    def describe(self) -> str:
        if self.recover:
            return (f"call #{self.call} is finished from a good rank's sum over the "
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


@dataclass(frozen=True)
class KeptCall:
    """A call routed through the switch, kept until every rank completed it (started the
    next call; with calls in flight: posted the next call's data, docs/reliability.md): its
    context (workspace and wire words, the successor's workspace) and this rank's record
    of it (a small call's data: `context.inline`)."""

    context: CallContext
    record: CallMeta


@dataclass(frozen=True)
class Recovery:
    """Settled call k* to finish over the host ring (`AwayProtocol._recover`), kept until
    every rank started the next call, so that a host-ring fault that interrupts it redoes
    it (netreduce/transport_fault.py): what this rank contributes (`words`: the giver's
    good sum, zeros elsewhere; copied before the first attempt, as the host ring sums in
    place over the workspace's send area), what the switch gave it with a good seal
    (`expected`) and the giver; `context` None: a small call, finished from its records,
    `record` this rank's (as it began the call: sent again by every attempt)."""

    call: int
    context: CallContext | None = None
    words: np.ndarray | None = None
    expected: np.ndarray | None = None
    giver: int = 0
    record: CallMeta | None = None

    @classmethod
    def handing(cls, plan: SettlePlan, switch_call: CallContext, expected: np.ndarray | None,
                rank: int) -> "Recovery":
        """The `Recovery` of `switch_call` (k* of `plan`) on `rank`: the lowest rank past it
        (it had a good seal) contributes the sum the switch gave it (`expected`, copied from
        its workspace before any recovery ring wrote there), every other rank zeros, so the
        ring's wrapping int32 sum is that sum, bit for bit, whichever kept workspace of the
        calls in flight held it."""
        giver = min(set(range(switch_call.world_size)) - set(plan.behind))
        words = expected if rank == giver else None
        if words is None:
            words = np.zeros(switch_call.count, dtype=SWITCH.areas(switch_call)[0].dtype)
        return cls(plan.call, switch_call, words, expected, giver)


def hand_sum(rec: Recovery, streams: Mapping[str, Stream], rank: int,
             controller: str | None) -> np.ndarray:
    """The sum of `rec.context` handed to every rank over the host ring of `streams`
    (`Recovery.handing`). Every rank with a good seal checks that the switch (at
    `controller`) gave it the same (SwitchFailure otherwise). Redoable: it reads only what
    `rec` holds."""
    assert rec.context is not None and rec.words is not None
    summed = np.empty(rec.context.count, dtype=rec.words.dtype)
    RING.run(replace(rec.context, dtype=rec.words.dtype, op=np.add, divisor=1,
                     streams=streams), rec.words, summed)
    expected = rec.expected
    if expected is not None and not np.array_equal(expected, summed):
        bad = int(np.flatnonzero(expected != summed)[0])
        raise SwitchFailure(
            f"netreduce: rank {rank}: allreduce call #{rec.context.seq}: the sum the switch "
            f"at {controller} returned with a good seal differs from the one it returned to "
            f"rank {rec.giver} (first at element {bad}: {expected[bad]} vs {summed[bad]}): "
            f"the result returned was wrong")
    return summed
