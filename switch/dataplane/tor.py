"""The ToR role of a two-tier fabric (docs/multirack.md): aggregate the rack, ask the spine.

A `TorPipeline` is an `AggregationPipeline` (every host-facing check of docs/pipeline.md
applies unchanged to the rack's contributions) whose rings spanning several racks use a
`RackPool`: when the rack's requesters have all contributed to slot k, ONE partial goes up
the uplink; the spine's total for k becomes the slot's result, emitted in order as today
(each requester's own packet, payload = total, ICRC recomputed) for every connection whose
responder is in the rack: the rack's own requesters' packets, and for connections entering
the rack the requester's header that the partial of its ToR carried up and the spine's
total carried down. Connections whose responder is here but whose requester is not are
also *transit*: a retransmission served by the requester's ToR arrives on the uplink and
leaves by the responder's port, untouched.
Invariants: a rack's contribution counts once per slot (the pool's bitmap); a partial is
sent once when the slot becomes locally complete and again only on a sign that its total
went missing (a held contribution or an entering connection's served retransmission seen
while the slot has no total; the spine dedups); a total counts once; a slot is emptied
without its total only when every host is provably past it (`RackPool._skip_acknowledged`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from nr_contract.spec import (DEFAULT_SLOTS, MAX_RACKS, MAX_RANKS, PSN_MASK, TOR_COUNTERS,
                             TRANSIT_COUNTERS, Connection, RingSpec, required_slots)
from switch.dataplane import interswitch
from switch.dataplane.interswitch import Endpoint, Kind, ring_tag
from switch.dataplane.packets import (BTH_OFF, EXT_LEN, EXT_OFF, ONLY_WRITES, conn_key,
                                      icrc_state, parse, payload_len)
from switch.dataplane.pipeline import (EMPTY, PSN_HALF, AggregationPipeline, AggregatorPool,
                                       ConnEntry, Recut, connection_entries)

if TYPE_CHECKING:
    from switch.dataplane.ports import Emit



@dataclass(frozen=True)
class TorConfig:
    """Where a ToR sits: its id in the fabric, its uplink port, its and the spine's addresses."""

    tor_id: int
    uplink: int
    me: Endpoint
    spine: Endpoint


@dataclass(frozen=True)
class RackLanes:
    """A ring's connections as a ToR holds them, each in ring order: lanes are `local` (the
    rack's requesters: they contribute) then `entering` (requester elsewhere, responder
    here: their headers come with the total); `leaving` are the local ones whose
    responder is elsewhere (their headers ride up in the partial)."""

    local: tuple[Connection, ...]
    entering: tuple[Connection, ...]
    leaving: tuple[Connection, ...]


def check_tor_ring(config: TorConfig, spec: RingSpec, local_ports: dict[str, int]) -> RackLanes:
    """The rack's lanes of a registration every ToR target can take; ValueError says why not
    (a target may refuse more: switch/control/bmv2_tor.py)."""
    rid = spec.ring_id
    ips = {c.src_ip for c in spec.connections}
    if not local_ports or set(local_ports) - ips:
        raise ValueError(f"ring {rid}: local ranks {sorted(local_ports)} are not a "
                         f"non-empty subset of the ring's {sorted(ips)}")
    if config.uplink in local_ports.values():
        raise ValueError(f"ring {rid}: a local rank on the uplink port {config.uplink}")
    local = tuple(c for c in spec.connections if c.src_ip in local_ports)
    if len(local) > MAX_RANKS:
        raise ValueError(f"ring {rid}: {len(local)} ranks in rack {config.tor_id}, "
                         f"at most {MAX_RANKS}")
    return RackLanes(local,
                     tuple(c for c in spec.connections
                           if c.dst_ip in local_ports and c.src_ip not in local_ports),
                     tuple(c for c in local if c.dst_ip not in local_ports))


class RackPool(AggregatorPool):
    """One ring's slots at a ToR.

    Lanes: first the local requesters (they contribute; the bitmap is theirs), then the
    connections entering the rack (remote requester, local responder), whose headers come
    with the total. An emission sends the result of every connection whose responder is
    local (`result_lanes`); a connection leaving the rack gets its first result from the
    responder's ToR (its header rides up in the partial) and only retransmissions served
    here, up the uplink. The sum row of a slot holds the rack's partial from local
    completion until the total arrives (ready), then the total.
    """

    def __init__(self, conns: Sequence[Connection], contributing: int, ports: dict[str, int],
                 slots: int, mtu: int, window: int, config: TorConfig, ring: int):
        super().__init__(len(conns), slots, mtu, [ports[c.dst_ip] for c in conns],
                         [c.psn0 for c in conns])
        self._window = window        # W: packets a connection may have unacknowledged
        self._full = (1 << contributing) - 1
        self._lane = {c.rank: lane for lane, c in enumerate(conns[:contributing])}
        self._entering = {c.rank: lane for lane, c in enumerate(conns) if lane >= contributing}
        self._leaving = [(c.rank, lane) for lane, c in enumerate(conns[:contributing])
                         if ports[c.dst_ip] == config.uplink]
        self.result_lanes = tuple(lane for lane, c in enumerate(conns)
                                  if ports[c.dst_ip] != config.uplink)
        self._config = config
        self._ring = ring
        self.counts = dict.fromkeys(TOR_COUNTERS, 0)

    def recut_of(self, rank: int) -> Recut:
        return self.recuts[self._lane[rank] if rank in self._lane else self._entering[rank]]

    def offer(self, rank: int, k: int, frame: memoryview, hdr_end: int, plen: int,
              opcode: int, hcrc: int, emit: Emit) -> str:
        lane = self._lane[rank]
        outcome = super().offer(lane, k, frame, hdr_end, plen, opcode, hcrc, emit)
        if outcome == "drop_overrun" and self._skip_acknowledged(k, emit):
            outcome = super().offer(lane, k, frame, hdr_end, plen, opcode, hcrc, emit)
        return outcome

    def _skip_acknowledged(self, k: int, emit: Emit) -> bool:
        """A local packet k >= next_emit + N: skip the slots every host has acknowledged.

        Its sender had k - W acknowledged, so the total of k - W existed, so every rank had
        sent k - W, so every rank had k - 2W acknowledged: no host needs a result at or
        before k - 2W any more. This ToR can lag that far only when its total went missing
        while its ranks' results came from other ToRs (docs/multirack.md, "Lost totals");
        those slots are emptied (a late duplicate is then stale), the ready ones emitted,
        and so are the ready slots that follow without a gap once next_emit is past k - 2W.
        Visits at most N slots whatever the gap: a k that far ahead costs no more than
        one pass over the ring's slots. Returns whether k now fits the window.
        """
        last = (k - 2 * self._window) & PSN_MASK          # the last k every host is past
        for _ in range(self.slots):
            if (last - self.next_emit) & PSN_MASK >= PSN_HALF:
                break
            i = self.next_emit & self._mask
            if self.tag[i] == self.next_emit and self.ready[i]:
                self._emit_in_order(emit)
                continue
            self.tag[i] = EMPTY
            self.next_emit = (self.next_emit + 1) & PSN_MASK
            self.counts["slots_skipped"] += 1
        else:
            # Every slot was visited and emptied or emitted: what lies between next_emit and
            # `last` was never in the window, so no slot holds it.
            behind = (last - self.next_emit + 1) & PSN_MASK
            if behind < PSN_HALF:
                self.counts["slots_skipped"] += behind
                self.next_emit = (last + 1) & PSN_MASK
        self._emit_in_order(emit)
        return (k - self.next_emit) & PSN_MASK < self.slots

    def recover(self, k: int, emit: Emit) -> None:
        """The total for next_emit or k may have been lost on its way here: for each of them
        that is locally complete without one, send its partial again (the spine answers a
        totalled slot's repeat with the total, to this ToR only)."""
        for slot_k in (self.next_emit,) if k == self.next_emit else (self.next_emit, k):
            i = slot_k & self._mask
            if self.tag[i] == slot_k and self.bitmap[i] == self._full and not self.ready[i]:
                self._send_partial(slot_k, i, emit)
                self.counts["partials_resent"] += 1

    def _complete(self, k: int, i: int, emit: Emit) -> None:
        payloads, partial = self._cut[i]
        np.add.reduce(payloads[:len(self._lane)], axis=0, out=partial)
        self._send_partial(k, i, emit)
        self.counts["partials_sent"] += 1

    def _servable(self, i: int) -> bool:
        """A retransmission is served once the total is here, even before the slot's turn
        to be emitted: the hosts may be past slots whose total this ToR never got (rule 7
        frees those only once a local requester is N ahead, which needs this)."""
        return self.ready[i]

    def _duplicate(self, i: int, emit: Emit) -> str:
        """A retransmission while the partial is out and no total is back: send it again."""
        self.recover(self.tag[i], emit)
        return "drop_duplicate"

    def _send_partial(self, k: int, i: int, emit: Emit) -> None:
        c = self._config
        payload = self._sum_bytes[i][:self.plen[i]]
        carried = [(rank, self.headers[i][lane]) for rank, lane in self._leaving]
        head, tail = interswitch.frame_parts(c.me, c.spine, Kind.PARTIAL, c.tor_id, self._ring,
                                             k, payload, carried)
        emit(c.uplink, (head, payload, tail))

    def accept_total(self, k: int, msg: interswitch.Message, emit: Emit) -> str:
        """The spine's total for k: the slot's result; returns the counter it bumps."""
        i = k & self._mask
        if self.tag[i] != k or self.bitmap[i] != self._full:
            return "drop_total_unexpected"      # never partialled here (or long re-used)
        if self.ready[i]:
            return "drop_total_duplicate"
        if len(msg.payload) != self.plen[i]:
            return "drop_total_length"
        carried = dict(msg.carried)
        hdr_len = EXT_OFF + EXT_LEN[self.opcode[i]]
        if carried.keys() != self._entering.keys() or len(carried) != len(msg.carried) \
                or any(len(h) != hdr_len or h[BTH_OFF] != self.opcode[i]
                       for h in carried.values()):
            return "drop_total_headers"
        for rank, header in carried.items():
            lane = self._entering[rank]
            self.headers[i][lane] = bytes(header)
            self._hcrc[i][lane] = icrc_state(header, len(header))
        self._sum_bytes[i][:len(msg.payload)] = msg.payload
        self.ready[i] = True
        if k == self.next_emit:
            self._emit_in_order(emit)
        else:                                # a gap: next_emit's total may have been lost
            self.recover(self.next_emit, emit)
        return "totals"


@dataclass
class TransitEntry:
    """A connection whose responder is in this rack and whose requester is not. Its
    requester's ToR verified the empty WRITE_ONLY of a re-cut before sending it up; passing
    here it shifts `recut`, the entering lane's, which its results leave with (rule 7a)."""

    ring_id: str
    rank: int
    psn0: int
    out_port: int
    pool: AggregatorPool         # the ring's pool here (a RackPool unless all ranks are here)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TRANSIT_COUNTERS, 0))

    @property
    def recut(self) -> Recut:
        return self.pool.recut_of(self.rank)


class TorPipeline(AggregationPipeline):
    """A ToR: the aggregation pipeline for its rack's requesters, transit, the spine's totals.

    `register_ring` takes the local ranks' host ports; every other rank is behind the
    uplink. A ring entirely in the rack is aggregated here alone (the single-switch rules).
    """

    max_ranks = MAX_RANKS * MAX_RACKS

    def __init__(self, config: TorConfig):
        super().__init__()
        self.config = config
        self.transit: dict[int, TransitEntry] = {}     # copy-on-write like the table
        self._tags: dict[int, tuple[str, RackPool]] = {}   # ring_tag -> multi-rack ring
        self._transit_keys: dict[str, list[int]] = {}
        self.interswitch = {"drop_corrupt": 0, "drop_unknown_ring": 0}
        self._control = threading.Lock()   # one registration at a time (checks, then installs)

    def register_ring(self, spec: RingSpec, local_ports: dict[str, int],  # type: ignore[override]
                      slots: int = DEFAULT_SLOTS) -> None:
        """Install the rack's share of `spec`: `local_ports` maps local ranks' IPs to ports."""
        with self._control:
            self._register(spec, local_ports, slots)

    def _register(self, spec: RingSpec, local_ports: dict[str, int], slots: int) -> None:
        rid, uplink = spec.ring_id, self.config.uplink
        ips = {c.src_ip for c in spec.connections}
        entering = check_tor_ring(self.config, spec, local_ports).entering
        tag = ring_tag(rid)
        if self._tags.get(tag, (rid,))[0] != rid:
            raise ValueError(f"ring {rid}: its 32-bit tag {tag:#x} is ring "
                             f"{self._tags[tag][0]}'s; choose another ring id")
        if rid not in self._rings:                      # its connections must be free here
            for c in spec.connections:
                if c.src_ip in local_ports or c.dst_ip in local_ports:
                    key = conn_key(c.src_ip, c.dst_ip, c.dst_qpn)
                    other = self.transit.get(key) or self.table.entries.get(key)
                    if other is not None:
                        raise ValueError(f"ring {rid}: connection of rank {c.rank} is already "
                                         f"registered by ring {other.ring_id}")
        super().register_ring(spec, {ip: local_ports.get(ip, uplink) for ip in ips}, slots)
        with self._lock:
            if rid in self._transit_keys:
                return                                  # the same ring again
            pool = self._rings[rid].pool
            transit = {conn_key(c.src_ip, c.dst_ip, c.dst_qpn):
                       TransitEntry(rid, c.rank, c.psn0, local_ports[c.dst_ip], pool)
                       for c in entering}
            self.transit = {**self.transit, **transit}
            self._transit_keys[rid] = list(transit)
            if isinstance(pool, RackPool):
                self._tags = {**self._tags, tag: (rid, pool)}

    def _install(self, spec: RingSpec, ports: dict[str, int], slots: int
                 ) -> tuple[AggregatorPool, dict[int, ConnEntry]]:
        uplink = self.config.uplink
        local = [c for c in spec.connections if ports[c.src_ip] != uplink]
        if len(local) == spec.world_size:
            return super()._install(spec, ports, slots)
        entering = [c for c in spec.connections
                    if ports[c.src_ip] == uplink and ports[c.dst_ip] != uplink]
        pool = RackPool(local + entering, len(local), ports, slots, spec.mtu,
                        required_slots(spec) // 2, self.config, ring_tag(spec.ring_id))
        return pool, connection_entries(spec, local, ports, pool)

    def unregister_ring(self, ring_id: str) -> None:
        with self._control:
            super().unregister_ring(ring_id)
            with self._lock:
                gone = set(self._transit_keys.pop(ring_id, ()))
                self.transit = {k: e for k, e in self.transit.items() if k not in gone}
                self._tags = {t: r for t, r in self._tags.items() if r[0] != ring_id}

    def counters(self) -> dict[str, Any]:
        """AggregationPipeline.counters plus, per ring, its ToR and transit counters."""
        rings = self._rings
        out = super().counters()
        for rid, ring in out.items():
            pool = rings[rid].pool if rid in rings else None
            ring["tor"] = dict(pool.counts) if isinstance(pool, RackPool) else None
            ring["transit"] = [{"rank": e.rank, "out_port": e.out_port, "counters": dict(e.counts)}
                               for e in self.transit.values() if e.ring_id == rid]
        return out

    def process(self, frame: memoryview, in_port: int, emit: Emit) -> bool:
        """Host-facing rules first (AggregationPipeline), then the spine's totals, then transit."""
        if super().process(frame, in_port, emit):
            return True
        if interswitch.is_interswitch(frame):
            self._from_spine(frame, in_port, emit)
            return True
        fields = parse(frame)
        if fields is None:
            return False
        key, udp_len, opcode, pad, psn, _ = fields
        entry = self.transit.get(key)
        if entry is None:
            return False
        if in_port != self.config.uplink:
            entry.counts["drop_wrong_port"] += 1
        else:
            emit(entry.out_port, (frame,))
            entry.counts["forwarded"] += 1
            j = (psn - entry.psn0) & PSN_MASK
            k = (j - entry.recut.shift) & PSN_MASK
            if opcode in ONLY_WRITES and payload_len(udp_len, opcode, pad) == 0:
                entry.recut.follow(j)                   # a re-cut's empty packet (rule 7a)
            if isinstance(entry.pool, RackPool):   # a served retransmission: our total may
                entry.pool.recover(k, emit)        # have been lost
        return True

    def _from_spine(self, frame: memoryview, in_port: int, emit: Emit) -> None:
        try:
            msg = interswitch.decode(frame)
        except interswitch.Corrupt:
            self.interswitch["drop_corrupt"] += 1
            return
        ring = self._tags.get(msg.ring)
        if ring is None:
            self.interswitch["drop_unknown_ring"] += 1
            return
        pool = ring[1]
        if in_port != self.config.uplink or msg.kind != Kind.TOTAL \
                or msg.tor != self.config.tor_id:
            outcome = "drop_total_misdirected"
        else:
            outcome = pool.accept_total(msg.k, msg, emit)
        pool.counts[outcome] += 1
