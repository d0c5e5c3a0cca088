"""A third tier, in the model only: the pod switch between a pod's ToRs and the top spine.

The two-tier protocol (docs/multirack.md) generalised one level, role by role: toward its
ToRs a pod switch IS a spine (it adds their partials per slot, once per ToR, and sends each
ToR the total with the headers of the connections entering that ToR's rack); toward the top
spine it IS a ToR (when every ToR of the pod has sent its partial for k, ONE pod partial
goes up, carrying the headers of the connections that leave the pod; the top spine's total
for k is the slot's result). The top spine is the real `SpinePipeline` with pods as its
lanes; the ToRs are the real `TorPipeline`s, whose "spine" is their pod switch. Nothing of
switch/dataplane changes: a ToR cannot tell a pod switch from a spine.

Rules, each the counterpart of a rule the two-tier roles already keep:
- partial from ToR lane j for k (the spine's rule): added once per lane (bitmap), window
  [next_total, next_total + N); a repeat from a lane whose bit is set gets the total back
  when the slot has it (`totals_resent`), else makes the pod send its own partial up again
  (`partials_resent`: the ToR's rule 3, since a repeat means some host has no result yet);
- the slot full -> one pod partial up (the ToR's rule 2), carried headers = those of the
  connections leaving the pod; headers of connections between racks of the pod stay here;
- the top's total for k (the ToR's rule 5): exactly the pod's entering headers, a slot
  locally complete and not yet totalled -> every lane gets the total with the headers
  routed to its rack (kept ones and carried ones); next_total moves over totalled slots; a
  total for k past next_total makes the pod re-send next_total's partial (the ToR's
  recover: next_total's total may have been lost);
- a partial for k >= next_total + N (the ToR's rule 7, `RackPool._skip_acknowledged`): its
  ToR's hosts sent k, so they had k - W acknowledged, so the top totalled k - W, so every
  rank sent k - W, so every host had k - 2W acknowledged: slots up to k - 2W are emptied
  (those with a total already sent stay as they are) and next_total moves past them.
No timer anywhere; every loss heals through the hosts' retransmissions, as in two tiers.
What this model does not do that a real pod switch would: the control plane (the fabric
controller registers three kinds of switch), transit filtering (frames of connections
between racks are forwarded by static MAC only: no `drop_spoofed_transit` here), the
conformance vectors and a P4 twin. The bound N >= 2W is argued above, not proved as
multirack.md proves it for two tiers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from nr_contract.spec import PSN_MASK
from switch.dataplane import interswitch
from switch.dataplane.interswitch import Endpoint, Kind, ring_tag
from switch.dataplane.pipeline import EMPTY, PSN_HALF

if TYPE_CHECKING:
    from switch.dataplane.ports import Emit

_WIRE_I32 = np.dtype("<i4")
POD_COUNTERS = ("partials", "partials_sent", "partials_resent", "totals", "totals_resent",
                "slots_skipped", "drop_duplicate", "drop_mismatch", "drop_overrun",
                "drop_stale", "drop_wrong_port", "drop_total_unexpected",
                "drop_total_duplicate", "drop_total_length", "drop_total_headers",
                "drop_total_misdirected", "drop_corrupt", "drop_unknown_ring")


@dataclass(frozen=True)
class PodConfig:
    """Where a pod switch sits: its id (its lane at the top), uplink port, addresses, and
    per ToR id of the pod the port it hangs on and its addresses."""

    pod_id: int
    uplink: int
    me: Endpoint
    top: Endpoint
    tors: dict[int, tuple[int, Endpoint]]


class PodPool:
    """One ring's N slots at a pod switch (see the module doc for the rules).

    Invariant: slot i holds k = tag[i] (≡ i mod N) or is empty; bitmap[i] names the lanes
    (the pod's ToRs) whose partial is in the sum, each once; sent[i] once the pod partial
    went up; totalled[i] once the top's total replaced the sum (and went down to every
    lane); next_total is the first k not totalled or skipped.
    """

    def __init__(self, config: PodConfig, ring: int, tor_ids: Sequence[int], slots: int,
                 mtu: int, window: int, routes: dict[int, int], leaving: Sequence[int],
                 entering: Sequence[int]):
        self.config, self.ring, self.slots, self.mtu = config, ring, slots, mtu
        self.tor_ids = tuple(tor_ids)
        self.ports = [config.tors[t][0] for t in tor_ids]
        self._window = window
        self._lane_of = {t: x for x, t in enumerate(tor_ids)}
        self._route = {r: self._lane_of[t] for r, t in routes.items()}   # header -> lane
        self._leaving = frozenset(leaving)      # ranks whose header goes up (responder out)
        self._entering = frozenset(entering)    # ranks whose header the top sends down
        self._mask = slots - 1
        self._full = (1 << len(tor_ids)) - 1
        self.next_total = 0
        self.tag = [EMPTY] * slots
        self.bitmap = [0] * slots
        self.sent = [False] * slots
        self.totalled = [False] * slots
        self.plen = [0] * slots
        self.kept: list[list[tuple[int, bytes]]] = [[] for _ in range(slots)]
        self.down: list[list[tuple[int, bytes]]] = [[] for _ in range(slots)]
        self._sums = np.zeros((slots, mtu // 4), dtype=_WIRE_I32)
        self.counts = dict.fromkeys(POD_COUNTERS, 0)

    # -- from a ToR ------------------------------------------------------------------------
    def partial(self, lane: int, k: int, msg: interswitch.Message, emit: Emit) -> str:
        payload = msg.payload
        if len(payload) > self.mtu or any((r in self._leaving) == (r in self._route)
                                          or r in self._entering for r, _ in msg.carried):
            return "drop_mismatch"
        i = k & self._mask
        if self.tag[i] == k:
            if len(payload) != self.plen[i]:
                return "drop_mismatch"
            if self.bitmap[i] >> lane & 1:
                if self.totalled[i]:
                    self._send_totals(k, i, [lane], emit)
                    return "totals_resent"
                if self.sent[i]:
                    self._send_partial(k, i, emit)
                    self.counts["partials_resent"] += 1
                return "drop_duplicate"
        else:
            ahead = (k - self.next_total) & PSN_MASK
            if ahead >= self.slots and ahead < PSN_HALF:
                self._skip_acknowledged(k)
                ahead = (k - self.next_total) & PSN_MASK
            if ahead >= self.slots:
                return "drop_overrun" if ahead < PSN_HALF else "drop_stale"
            self.tag[i], self.bitmap[i] = k, 0
            self.sent[i] = self.totalled[i] = False
            self.plen[i] = len(payload)
            self.kept[i] = []
        row = self._sums[i][:len(payload) >> 2]
        part = np.frombuffer(payload, dtype=_WIRE_I32)
        if self.bitmap[i]:
            np.add(row, part, out=row)
        else:
            row[:] = part
        self.kept[i] += [(r, bytes(h)) for r, h in msg.carried]
        self.bitmap[i] |= 1 << lane
        if self.bitmap[i] == self._full:
            self._send_partial(k, i, emit)
            self.sent[i] = True
            self.counts["partials_sent"] += 1
        return "partials"

    def _skip_acknowledged(self, k: int) -> None:
        """Empty the slots up to k - 2W that have no total (no host needs them: module doc)
        and move next_total past them; at most N slots are visited."""
        last = (k - 2 * self._window) & PSN_MASK
        for _ in range(self.slots):
            if (last - self.next_total) & PSN_MASK >= PSN_HALF:
                return
            i = self.next_total & self._mask
            if not (self.tag[i] == self.next_total and self.totalled[i]):
                self.tag[i] = EMPTY
                self.counts["slots_skipped"] += 1
            self.next_total = (self.next_total + 1) & PSN_MASK
        behind = (last - self.next_total + 1) & PSN_MASK
        if behind < PSN_HALF:
            self.counts["slots_skipped"] += behind
            self.next_total = (last + 1) & PSN_MASK

    def _send_partial(self, k: int, i: int, emit: Emit) -> None:
        c = self.config
        payload = memoryview(self._sums[i]).cast("B")[:self.plen[i]]
        carried = [(r, h) for r, h in self.kept[i] if r in self._leaving]
        head, tail = interswitch.frame_parts(c.me, c.top, Kind.PARTIAL, c.pod_id, self.ring,
                                             k, payload, carried)
        emit(c.uplink, (head, payload, tail))

    # -- from the top spine ----------------------------------------------------------------
    def total(self, k: int, msg: interswitch.Message, emit: Emit) -> str:
        i = k & self._mask
        if self.tag[i] != k or self.bitmap[i] != self._full:
            return "drop_total_unexpected"
        if self.totalled[i]:
            return "drop_total_duplicate"
        if len(msg.payload) != self.plen[i]:
            return "drop_total_length"
        carried = [(r, bytes(h)) for r, h in msg.carried]
        if {r for r, _ in carried} != self._entering or len(carried) != len(self._entering):
            return "drop_total_headers"
        self._sums[i][:self.plen[i] >> 2] = np.frombuffer(msg.payload, dtype=_WIRE_I32)
        self.down[i] = [(r, h) for r, h in self.kept[i] if r in self._route] + carried
        self.totalled[i] = True
        self._send_totals(k, i, range(len(self.tor_ids)), emit)
        if k != self.next_total:                    # next_total's total may have been lost
            j = self.next_total & self._mask
            if self.tag[j] == self.next_total and self.sent[j] and not self.totalled[j]:
                self._send_partial(self.next_total, j, emit)
                self.counts["partials_resent"] += 1
        while self.tag[self.next_total & self._mask] == self.next_total \
                and self.totalled[self.next_total & self._mask]:
            self.next_total = (self.next_total + 1) & PSN_MASK
        return "totals"

    def _send_totals(self, k: int, i: int, lanes: Sequence[int], emit: Emit) -> None:
        c = self.config
        payload = memoryview(self._sums[i]).cast("B")[:self.plen[i]]
        for lane in lanes:
            tor = self.tor_ids[lane]
            carried = [(r, h) for r, h in self.down[i] if self._route.get(r) == lane]
            head, tail = interswitch.frame_parts(c.me, c.tors[tor][1], Kind.TOTAL, tor,
                                                 self.ring, k, payload, carried)
            emit(self.ports[lane], (head, payload, tail))


class PodPipeline:
    """A pod switch: rings by tag, their pools; `process` is the data-plane hook (partials
    from its ToRs, totals from the top; anything else is forwarded by L2)."""

    def __init__(self, config: PodConfig):
        self.config = config
        self.rings: dict[int, tuple[str, PodPool]] = {}

    def register_ring(self, ring_id: str, tor_ids: Sequence[int], slots: int, mtu: int,
                      window: int, routes: dict[int, int], leaving: Sequence[int],
                      entering: Sequence[int]) -> None:
        """`routes`: rank -> its responder's ToR, for every connection whose responder is
        in this pod and whose requester is in another rack (of this pod: its header stays
        here; of another pod: it comes down with the top's total); `leaving`/`entering`:
        the ranks whose connections leave / enter the pod (their headers go up / come down
        from the top)."""
        if not 1 <= len(tor_ids) <= 32 or set(tor_ids) - set(self.config.tors):
            raise ValueError(f"ring {ring_id}: ToRs {list(tor_ids)} of pod "
                             f"{self.config.pod_id}: need 1..32 cabled here")
        self.rings[ring_tag(ring_id)] = (ring_id, PodPool(
            self.config, ring_tag(ring_id), tor_ids, slots, mtu, window, routes, leaving,
            entering))

    def process(self, frame: memoryview, in_port: int, emit: Emit) -> bool:
        if not interswitch.is_interswitch(frame):
            return False
        try:
            msg = interswitch.decode(frame)
        except interswitch.Corrupt:
            return True                 # counted nowhere: the model never corrupts frames
        ring = self.rings.get(msg.ring)
        if ring is None:
            return True
        pool = ring[1]
        if msg.kind == Kind.TOTAL:
            ok = in_port == self.config.uplink and msg.tor == self.config.pod_id
            outcome = pool.total(msg.k, msg, emit) if ok else "drop_total_misdirected"
        else:
            lane = pool._lane_of.get(msg.tor)
            ok = lane is not None and in_port == pool.ports[lane]
            outcome = pool.partial(lane, msg.k, msg, emit) if ok else "drop_wrong_port"
        pool.counts[outcome] += 1
        return True

    def counters(self) -> dict[str, Any]:
        return {rid: {"next_total": pool.next_total, "counters": dict(pool.counts)}
                for rid, pool in self.rings.values()}
