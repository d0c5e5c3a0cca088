"""The spine role of a two-tier fabric (docs/multirack.md): sum the racks' partials.

Per ring, N slots (slot = k mod N, k the relative PSN the partials carry); per slot a
bitmap of the ToRs whose partial it holds, their wrapping int32 sum and the RoCE headers
their partials carried (connections between racks). When every ToR of the ring has sent
its partial for k, the total goes down once to each of them, with the headers of the
connections entering that ToR's rack. A partial
that comes again (its ToR saw a retransmission and has no total yet) is never added twice:
if the slot is totalled the total goes back to that ToR only, else it is dropped. A RoCE
frame of a registered connection between racks (a retransmission its requester's ToR
served) passes only from that ToR's port: from any other it is a spoof from another rack
and is dropped (`drop_spoofed_transit`), so a ToR's uplink, which hears only the spine,
carries no forged transit. Every other frame is not the spine's business (`process`
returns False: L2 forwards it; the hosts' ACKs travel that way).
Invariants: a ToR's partial counts once per slot; a slot is re-used only for a k within
[next_total, next_total + N), so whatever it held before was totalled (docs/multirack.md,
"Slot reuse across tiers").
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from nr_contract.spec import LANE_OUTCOMES, MAX_SLOTS, PATH_MTUS, PSN_MASK
from switch.dataplane import interswitch
from switch.dataplane.interswitch import Endpoint, Kind, ring_tag
from switch.dataplane.packets import parse
from switch.dataplane.pipeline import EMPTY, PSN_HALF

if TYPE_CHECKING:
    from switch.dataplane.ports import Emit

_WIRE_I32 = np.dtype("<i4")


@dataclass(frozen=True)
class SpineConfig:
    """The spine's addresses and, per ToR id, the spine port it hangs on and its addresses."""

    me: Endpoint
    tors: dict[int, tuple[int, Endpoint]]


@dataclass(frozen=True)
class Lane:
    """One ToR of a ring as the spine sees it."""

    tor_id: int
    port: int
    addr: Endpoint


class SpinePool:
    """The N slots of one ring at the spine, one lane per ToR of the ring.

    Invariant: slot i holds k = tag[i] (≡ i mod N) or is empty; bitmap[i] names the lanes
    whose partial is in sums[i], each added once; totalled[i] once the bitmap was full
    (the total went down then, once per lane); `next_total` is the first k not totalled.
    """

    def __init__(self, ring: int, lanes: Sequence[Lane], slots: int, mtu: int, me: Endpoint,
                 routes: dict[int, int]):
        self.ring = ring
        self.lanes = tuple(lanes)
        lane_of = {lane.tor_id: x for x, lane in enumerate(lanes)}
        self._route = {rank: lane_of[tor] for rank, tor in routes.items()}   # -> lane
        self.slots = slots
        self.mtu = mtu
        self.me = me
        self.next_total = 0
        self.completed = 0
        self.totals_sent = 0
        self._mask = slots - 1
        self._full = (1 << len(lanes)) - 1
        self.tag = [EMPTY] * slots
        self.bitmap = [0] * slots
        self.totalled = [False] * slots
        self.plen = [0] * slots
        self.carried: list[list[list[tuple[int, bytes]]]] = [[[] for _ in lanes]
                                                             for _ in range(slots)]
        self._sums = np.zeros((slots, mtu // 4), dtype=_WIRE_I32)
        self.counts = [dict.fromkeys(LANE_OUTCOMES, 0) for _ in lanes]

    def offer(self, lane: int, k: int, msg: interswitch.Message, emit: Emit) -> str:
        """Lane's partial for k (arrived on its port); returns the lane counter it bumps."""
        payload = msg.payload
        if len(payload) > self.mtu or any(self._route.get(r, lane) == lane
                                          for r, _ in msg.carried):
            return "drop_mismatch"          # too long, or a header with nowhere to go
        i = k & self._mask
        if self.tag[i] == k:
            if len(payload) != self.plen[i]:
                return "drop_mismatch"
            if self.bitmap[i] >> lane & 1:
                if not self.totalled[i]:
                    return "drop_duplicate"
                self._send_total(k, i, [lane], emit)
                return "totals_resent"
        else:
            ahead = (k - self.next_total) & PSN_MASK
            if ahead >= self.slots:
                return "drop_overrun" if ahead < PSN_HALF else "drop_stale"
            # In the window, so whatever slot i held (k - N or older) was totalled.
            self.tag[i] = k
            self.bitmap[i] = 0
            self.totalled[i] = False
            self.plen[i] = len(payload)
        row = self._sums[i][:len(payload) >> 2]
        part = np.frombuffer(payload, dtype=_WIRE_I32)
        if self.bitmap[i]:
            np.add(row, part, out=row)             # wraps, like the hosts' int32
        else:
            row[:] = part
        self.carried[i][lane] = [(r, bytes(h)) for r, h in msg.carried]
        self.bitmap[i] |= 1 << lane
        if self.bitmap[i] == self._full:
            self._total(k, i, emit)
        return "partials"

    def _total(self, k: int, i: int, emit: Emit) -> None:
        """Slot i (k) is full: its total goes down to every lane; next_total moves on."""
        self.totalled[i] = True
        self.completed += 1
        self._send_total(k, i, range(len(self.lanes)), emit)
        while self.tag[self.next_total & self._mask] == self.next_total \
                and self.totalled[self.next_total & self._mask]:
            self.next_total = (self.next_total + 1) & PSN_MASK

    def _send_total(self, k: int, i: int, lanes: Sequence[int], emit: Emit) -> None:
        """The total of slot i to each of `lanes`, with the headers routed to that lane."""
        payload = memoryview(self._sums[i]).cast("B")[:self.plen[i]]
        everything = [entry for held in self.carried[i] for entry in held]
        for lane in lanes:
            to = self.lanes[lane]
            carried = [(r, h) for r, h in everything if self._route[r] == lane]
            head, tail = interswitch.frame_parts(self.me, to.addr, Kind.TOTAL, to.tor_id,
                                                 self.ring, k, payload, carried)
            emit(to.port, (head, payload, tail))
            self.totals_sent += 1


def check_spine_ring(config: SpineConfig, ring_id: str, tor_ids: Sequence[int], slots: int,
                     mtu: int, routes: dict[int, int], transit: dict[int, int] | None
                     ) -> tuple[tuple[int, ...], dict[int, int]]:
    """(ToR ids, transit) of a registration every spine target can take; ValueError says
    why not (a target may refuse more: switch/control/bmv2_spine.py)."""
    transit = dict(transit or {})
    if set(transit.values()) - set(tor_ids):
        raise ValueError(f"ring {ring_id}: transit from outside ToRs {list(tor_ids)}")
    tors = tuple(tor_ids)
    if set(routes.values()) - set(tors):
        raise ValueError(f"ring {ring_id}: routes {routes} lead outside ToRs {list(tors)}")
    unknown = sorted(set(tors) - set(config.tors))
    if unknown:
        raise ValueError(f"ring {ring_id}: ToR(s) {unknown} not cabled to this spine")
    if not 2 <= len(set(tors)) == len(tors) <= 32:
        raise ValueError(f"ring {ring_id}: ToRs {list(tors)}: need 2..32 distinct")
    if slots & (slots - 1) or not 0 < slots <= MAX_SLOTS or mtu not in PATH_MTUS:
        raise ValueError(f"ring {ring_id}: {slots} slots / path MTU {mtu}")
    return tors, transit


@dataclass(frozen=True)
class _SpineRing:
    ring_id: str
    tor_ids: tuple[int, ...]
    slots: int
    mtu: int
    routes: dict[int, int]
    pool: SpinePool
    transit: dict[int, int]      # conn_key of a connection between racks -> requester's ToR


class SpinePipeline:
    """The spine: rings by tag, their pools; `process` is the data-plane hook.

    Control methods serialise on a lock and publish by replacing dicts (as the pipeline).
    """

    def __init__(self, config: SpineConfig):
        self.config = config
        self._rings: dict[int, _SpineRing] = {}      # by ring_tag
        self._transit: dict[int, int] = {}           # conn_key -> the only port it may enter by
        self._lock = threading.Lock()
        self.interswitch = {"drop_corrupt": 0, "drop_unknown_ring": 0, "drop_unknown_tor": 0,
                            "drop_spoofed_transit": 0}

    def register_ring(self, ring_id: str, tor_ids: Sequence[int], slots: int, mtu: int,
                      routes: dict[int, int], transit: dict[int, int] | None = None) -> None:
        """Aggregate ring `ring_id` over the partials of `tor_ids` (idempotent if the same).

        `routes`: rank -> the ToR of its responder, for each connection between racks (the
        header its partial carries goes down in that ToR's total). `transit`: the
        `packets.conn_key` of each connection between racks -> its requester's ToR, the only
        one whose port its frames may come from.
        """
        tors, transit = check_spine_ring(self.config, ring_id, tor_ids, slots, mtu, routes,
                                         transit)
        tag = ring_tag(ring_id)
        with self._lock:
            old = self._rings.get(tag)
            if old is not None:
                if (old.ring_id, old.tor_ids, old.slots, old.mtu, old.routes, old.transit) == \
                        (ring_id, tors, slots, mtu, routes, transit):
                    return
                if old.ring_id == ring_id:
                    raise ValueError(f"ring {ring_id} is already registered differently")
                raise ValueError(f"ring {ring_id}: its 32-bit tag {tag:#x} is ring "
                                 f"{old.ring_id}'s; choose another ring id")
            pool = SpinePool(tag, [Lane(t, *self.config.tors[t]) for t in tors], slots, mtu,
                             self.config.me, routes)
            taken = set(transit) & set(self._transit)
            if taken:
                raise ValueError(f"ring {ring_id}: a connection between racks is already "
                                 "another ring's")
            self._rings = {**self._rings, tag: _SpineRing(ring_id, tors, slots, mtu,
                                                          dict(routes), pool, transit)}
            self._transit = {**self._transit, **{k: self.config.tors[t][0]
                                                 for k, t in transit.items()}}

    def unregister_ring(self, ring_id: str) -> None:
        with self._lock:
            tag = ring_tag(ring_id)
            if tag not in self._rings or self._rings[tag].ring_id != ring_id:
                raise KeyError(f"ring {ring_id} is not registered at the spine")
            gone = self._rings[tag].transit
            self._rings = {t: r for t, r in self._rings.items() if t != tag}
            self._transit = {k: p for k, p in self._transit.items() if k not in gone}

    def _spoofed_transit(self, frame: memoryview, in_port: int) -> bool:
        """Whether `frame` is a registered connection between racks that came by another
        port than its requester's ToR's (then it is counted, and dropped by the caller)."""
        transit = self._transit
        if not transit:
            return False
        fields = parse(frame)
        if fields is None:
            return False
        port = transit.get(fields[0])
        if port is None or port == in_port:
            return False
        self.interswitch["drop_spoofed_transit"] += 1
        return True

    def counters(self) -> dict[str, Any]:
        """Per ring: slots, next_total, completed, totals_sent, per ToR its outcome counters."""
        return {r.ring_id: {"tors": list(r.tor_ids), "slots": r.slots,
                            "next_total": r.pool.next_total,
                            "counters": {"completed": r.pool.completed,
                                         "totals_sent": r.pool.totals_sent,
                                         **{name: sum(c[name] for c in r.pool.counts)
                                            for name in LANE_OUTCOMES}},
                            "per_tor": {str(t): dict(c)
                                        for t, c in zip(r.tor_ids, r.pool.counts)}}
                for r in self._rings.values()}

    def process(self, frame: memoryview, in_port: int, emit: Emit) -> bool:
        """Partials in, totals out; a spoofed transit frame dropped; False for anything else
        (forwarded by L2)."""
        if not interswitch.is_interswitch(frame):
            return self._spoofed_transit(frame, in_port)
        try:
            msg = interswitch.decode(frame)
        except interswitch.Corrupt:
            self.interswitch["drop_corrupt"] += 1
            return True
        ring = self._rings.get(msg.ring)
        if ring is None:
            self.interswitch["drop_unknown_ring"] += 1
            return True
        if msg.tor not in ring.tor_ids:
            self.interswitch["drop_unknown_tor"] += 1
            return True
        lane = ring.tor_ids.index(msg.tor)
        pool = ring.pool
        if in_port != pool.lanes[lane].port or msg.kind != Kind.PARTIAL:
            outcome = "drop_wrong_port"
        else:
            outcome = pool.offer(lane, msg.k, msg, emit)
        pool.counts[lane][outcome] += 1
        return True
