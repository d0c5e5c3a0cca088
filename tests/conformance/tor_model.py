"""The ToR's model (docs/multirack.md, docs/pipeline.md): per slot the counted
contributions of the rack's requesters, the partial it sends up with the leaving
connections' headers, the total the spine sends down and the results it yields (own and
entering connections), served retransmissions, skips, every outcome counted. A vector's
author drives it step by step; it derives every expected frame and counter. Written from
the documentation's rules, never from switch/dataplane/tor.py."""
from __future__ import annotations

import json
from typing import Any, Callable, Optional, Sequence

import numpy as np

from nr_contract.spec import (CONN_COUNTERS, PSN_MASK, RING_COUNTERS, TOR_COUNTERS,
                              TRANSIT_COUNTERS, RingSpec, inflight_packets, required_slots)
from switch.dataplane import interswitch
from switch.dataplane.interswitch import Kind
from tests.conformance.format import Step
from tests.conformance.role_model import (EXT, PSN_HALF, SPINE, TOR_INTERSWITCH, UPLINK, Held,
                                          RoleModel, endpoint_dict, header_of, tor_endpoint, wire)
from tests.conformance.vectors import empty_frame, port_of_ip
from tests.roce_layers import RETH_OPS, wrapping_sum


class TorModel(RoleModel):
    """ToR `tor` of a ring over lab hosts 0..n-1 (rank r on port r + 1) placed in `racks`.

    Per slot it keeps what pipeline.md and multirack.md say a slot holds: tag, the counted
    contributions of the rack's requesters, the total (payload and entering headers) once
    accepted, emitted; next_emit; and the counters of every outcome.
    """

    def __init__(self, name: str, description: str, *, tor: int, racks: Sequence[int],
                 slots: int = 16, spec: Optional[RingSpec] = None, requires: Sequence[str] = ()):
        super().__init__(name, description, racks, slots, spec, requires)
        self.tor = tor
        self.W = inflight_packets(self.spec)
        assert 2 * self.W == required_slots(self.spec) <= slots, "rule 7 needs N >= 2W, W 2^i"
        conns = self.spec.connections
        self.local = self.rack(tor)
        self.port = {r: port_of_ip(conns[r].src_ip) for r in range(self.n)}
        # results an emission sends: local requesters with a local responder, then entering
        self.lanes = [r for r in self.local if r not in self.leaving(tor)] + self.entering(tor)
        self.me = tor_endpoint(tor)
        macs = {c.src_mac: self.port[c.rank] if racks[c.rank] == tor else UPLINK for c in conns}
        self.setup = {
            "role": "tor",
            "config": {"tor_id": tor, "uplink": UPLINK, "me": endpoint_dict(self.me),
                       "spine": endpoint_dict(SPINE)},
            "ports": sorted({self.port[r] for r in self.local} | {UPLINK}),
            "macs": {**macs, SPINE.mac: UPLINK},
            "rings": [{"spec": json.loads(self.spec.to_json()), "slots": slots,
                       "racks": list(racks),
                       "local_ports": {conns[r].src_ip: self.port[r] for r in self.local}}]}
        self.shift = dict.fromkeys(range(self.n), 0)    # re-cuts seen of each rank's stream
        self.slot_tag: list[Optional[int]] = [None] * slots
        self.held: list[dict[int, Held]] = [{} for _ in range(slots)]
        self.total_of: list[Optional[tuple[np.ndarray, dict[int, Held]]]] = [None] * slots
        self.emitted = [False] * slots
        self.next_emit = 0
        self.ring = dict.fromkeys(RING_COUNTERS, 0)
        self.conn = {r: dict.fromkeys(CONN_COUNTERS, 0) for r in self.local}
        self.tor_counts = dict.fromkeys(TOR_COUNTERS, 0)
        self.transit_counts = {r: dict.fromkeys(TRANSIT_COUNTERS, 0) for r in self.entering(tor)}
        self.inter = dict.fromkeys(TOR_INTERSWITCH, 0)

    def complete(self, *ks: int, total: bool = False) -> None:
        """Each local rank contributes to each k (rank order), the total following if `total`."""
        for k in ks:
            for r in self.local:
                self.write(r, k)
            if total:
                self.total(k)

    def responder_port(self, rank: int) -> int:
        return UPLINK if rank in self.leaving(self.tor) else self.port[(rank + 1) % self.n]

    # -- a local requester's packet -----------------------------------------------------------
    def write(self, rank: int, k: int, *, data: Optional[np.ndarray | bytes] = None,
              port: Optional[int] = None, mangle: Callable[[bytes], bytes] = bytes,
              drop: str = "", expect: str = "", note: str = "", **kw: Any) -> None:
        """Rank's packet k arrives (on its port unless `port`), mangled by `mangle`; `drop`:
        the verification drop the author states it hits; `expect`: the outcome the model
        must find."""
        p = self.packet(rank, k, data, **kw)
        sent = mangle(self.frame(rank, k, p))
        p.header = header_of(sent, len(p.raw))
        out: list[tuple[int, bytes]] = []
        if (self.port[rank] if port is None else port) != self.port[rank]:
            outcome = "drop_wrong_port"
        else:
            outcome = drop or self._offer(rank, k, p, out)
        assert not expect or expect == outcome, f"{self.name}: {expect} != model's {outcome}"
        conn = self.conn[rank]
        conn["packets"] += 1
        conn[outcome] += 1
        self.ring[outcome] += 1
        if outcome == "aggregated" and p.opcode in RETH_OPS:
            conn["messages"] += 1
        self.steps.append(Step(self.port[rank] if port is None else port, sent, tuple(out),
                               note or f"rank {rank} k={k}: {outcome}"))

    def empty(self, rank: int, j: int, *, recut: bool, note: str = "") -> None:
        """Rank's empty WRITE_ONLY_WITH_IMMEDIATE at relative PSN j (rxe's re-cut stream,
        rule 7a): on to its responder untouched; `recut`: it moves the rank's later packets
        one PSN on (the author gives them `psn=`)."""
        frame = empty_frame(self.spec.connections[rank], j)
        conn = self.conn[rank]
        conn["packets"] += 1
        conn["empties_forwarded"] += 1
        conn["recuts"] += recut
        self.shift[rank] += recut
        self.ring["empties_forwarded"] += 1
        self.steps.append(Step(self.port[rank], frame, ((self.responder_port(rank), frame),),
                               note or f"rank {rank} empty at j={j}: forwarded"))

    def _offer(self, rank: int, k: int, p: Held, out: list[tuple[int, bytes]]) -> str:
        i = k % self.N
        if self.slot_tag[i] == k:
            first = next(iter(self.held[i].values()))
            if len(p.data) != len(first.data) or p.opcode != first.opcode:
                return "drop_mismatch"
            if rank in self.held[i]:
                if self.total_of[i] is not None:                       # rule 4
                    out.append((self.responder_port(rank),
                                self.frame(rank, k, p, self.total_of[i][0])))
                    return "retransmits_served"
                self._recover(k, out)                                  # rule 3
                return "drop_duplicate"
        else:
            ahead = (k - self.next_emit) & PSN_MASK
            if ahead >= PSN_HALF:
                return "drop_stale"
            if ahead >= self.N:
                self._skip(k, out)                                     # rule 7
                if (k - self.next_emit) & PSN_MASK >= self.N:
                    return "drop_overrun"
            self.slot_tag[i], self.held[i], self.total_of[i] = k, {}, None
            self.emitted[i] = False
        self.held[i][rank] = p                                         # rule 1
        if len(self.held[i]) == len(self.local):                       # rule 2
            out.append((UPLINK, self.partial(k)))
            self.tor_counts["partials_sent"] += 1
        return "aggregated"

    def partial(self, k: int) -> bytes:
        held = self.held[k % self.N]
        payload = wire(wrapping_sum([held[r].data for r in self.local]))
        return interswitch.encode(self.me, SPINE, Kind.PARTIAL, self.tor, self.tag, k, payload,
                                  [(r, held[r].header) for r in self.leaving(self.tor)])

    def _complete_without_total(self, k: int) -> bool:
        i = k % self.N
        return (self.slot_tag[i] == k and len(self.held[i]) == len(self.local)
                and self.total_of[i] is None)

    def _recover(self, k: int, out: list[tuple[int, bytes]]) -> None:
        """Rules 3, 5 (gap) and 6: the partials of next_emit and of k, if they lack a total."""
        for slot_k in dict.fromkeys([self.next_emit, k]):
            if self._complete_without_total(slot_k):
                out.append((UPLINK, self.partial(slot_k)))
                self.tor_counts["partials_resent"] += 1

    def _skip(self, k: int, out: list[tuple[int, bytes]]) -> None:
        """Rule 7: slots next_emit .. k - 2W without a total are emptied, those with one
        emitted; emission then goes on in order of k from the new next_emit."""
        while (k - 2 * self.W - self.next_emit) & PSN_MASK < PSN_HALF:
            i = self.next_emit % self.N
            if self.slot_tag[i] == self.next_emit and self.total_of[i] is not None:
                self._emit_in_order(out)
                continue
            self.slot_tag[i] = None
            self.next_emit = (self.next_emit + 1) & PSN_MASK
            self.tor_counts["slots_skipped"] += 1
        self._emit_in_order(out)

    def _emit_in_order(self, out: list[tuple[int, bytes]]) -> None:
        while True:
            k = self.next_emit
            i = k % self.N
            total = self.total_of[i]
            if self.slot_tag[i] != k or total is None or self.emitted[i]:
                return
            for r in self.lanes:
                p = self.held[i][r] if r in self.local else total[1][r]
                psn = (self.spec.connections[r].psn0 + self.shift[r] + k) & PSN_MASK
                out.append((self.port[(r + 1) % self.n], self.frame(r, k, p, total[0], psn)))
            self.emitted[i] = True
            self.ring["completed"] += 1
            self.ring["results_sent"] += len(self.lanes)
            self.next_emit = (k + 1) & PSN_MASK

    # -- from the spine, and transit ------------------------------------------------------------
    def total_frame(self, k: int, *, data: Optional[np.ndarray | bytes] = None,
                    carried: Optional[dict[int, dict[str, Any]]] = None,
                    raw_carried: Optional[list[tuple[int, bytes]]] = None,
                    kind: Kind = Kind.TOTAL, tor: Optional[int] = None,
                    ring: Optional[int] = None) -> tuple[bytes, np.ndarray, dict[int, Held]]:
        """The spine's total for k: (frame, payload, entering headers it carries)."""
        i = k % self.N
        remote = {r: self.packet(r, k, **(carried or {}).get(r, {}))
                  for r in range(self.n) if self.racks[r] != self.tor}
        if data is None:
            held = self.held[i] if self.slot_tag[i] == k else {}
            data = wrapping_sum([held[r].data if r in held else self.packet(r, k).data
                                 for r in self.local] + [p.data for p in remote.values()])
        payload = data if isinstance(data, bytes) else wire(data)
        entering = {r: remote[r] for r in self.entering(self.tor)}
        headers = raw_carried if raw_carried is not None else \
            [(r, p.header) for r, p in entering.items()]
        frame = interswitch.encode(SPINE, self.me, kind, self.tor if tor is None else tor,
                                   self.tag if ring is None else ring, k, payload, headers)
        return frame, np.frombuffer(payload, "<i4").astype(np.int32), entering

    def total(self, k: int, *, port: int = UPLINK, mangle: Callable[[bytes], bytes] = bytes,
              corrupt: bool = False, expect: str = "", note: str = "",
              **frame_kw: Any) -> None:
        """The spine's total for k arrives on `port` (`corrupt`: mangled so decode refuses it)."""
        frame, payload, entering = self.total_frame(k, **frame_kw)
        msg = interswitch.decode(memoryview(frame))
        out: list[tuple[int, bytes]] = []
        outcome = self.first_refusal(msg, corrupt)
        if not outcome:
            if port != UPLINK or msg.kind != Kind.TOTAL or msg.tor != self.tor:
                outcome = "drop_total_misdirected"
            else:
                outcome = self._accept(k, payload, [(r, bytes(h)) for r, h in msg.carried],
                                       entering, out)
        self.record(outcome, expect,
                    self.inter if outcome in TOR_INTERSWITCH else self.tor_counts, port,
                    mangle(frame), out, note or f"total k={k}: {outcome}")

    def _accept(self, k: int, payload: np.ndarray, carried: list[tuple[int, bytes]],
                entering: dict[int, Held], out: list[tuple[int, bytes]]) -> str:
        """Rule 5."""
        i = k % self.N
        if self.slot_tag[i] != k or len(self.held[i]) != len(self.local):
            return "drop_total_unexpected"
        if self.total_of[i] is not None:
            return "drop_total_duplicate"
        first = next(iter(self.held[i].values()))
        if len(payload) != len(first.data):
            return "drop_total_length"
        hlen = 54 + EXT[first.opcode]
        if sorted(r for r, _ in carried) != sorted(entering) or \
                any(len(h) != hlen or h[42] != first.opcode for _, h in carried):
            return "drop_total_headers"
        assert all(h == entering[r].header for r, h in carried), "give headers by `carried`"
        self.total_of[i] = (payload, entering)
        if k == self.next_emit:
            self._emit_in_order(out)
        else:
            self._recover(self.next_emit, out)
        return "totals"

    def transit_empty(self, rank: int, j: int, *, recut: bool, note: str = "") -> None:
        """Entering rank's empty WRITE_ONLY_WITH_IMMEDIATE at relative PSN j, sent up by its
        own ToR: forwarded to its responder; `recut`: its later results here move one PSN
        on (rule 7a); the partials of next_emit and k = j - re-cuts so far resent as rule 6."""
        frame = empty_frame(self.spec.connections[rank], j)
        out = [(self.port[(rank + 1) % self.n], frame)]
        self.transit_counts[rank]["forwarded"] += 1
        self._recover((j - self.shift[rank]) & PSN_MASK, out)
        self.shift[rank] += recut
        self.steps.append(Step(UPLINK, frame, tuple(out),
                               note or f"transit: rank {rank} empty at j={j}"))

    def transit(self, rank: int, k: int, *, port: int = UPLINK,
                mangle: Callable[[bytes], bytes] = bytes, note: str = "") -> None:
        """Rank's (entering) packet k, a retransmission its own ToR served, arrives."""
        p = self.packet(rank, k)
        frame = mangle(self.frame(rank, k, p, self.total_frame(k)[1]))
        out: list[tuple[int, bytes]] = []
        if port == UPLINK:
            out.append((self.port[(rank + 1) % self.n], frame))
            self.transit_counts[rank]["forwarded"] += 1
            self._recover(k, out)
        else:
            self.transit_counts[rank]["drop_wrong_port"] += 1
        self.steps.append(Step(port, frame, tuple(out), note or f"transit rank {rank} k={k}"))

    def counters(self) -> dict[str, Any]:
        return {"interswitch": dict(self.inter), "rings": {self.spec.ring_id: {
            "next_emit": self.next_emit, "counters": dict(self.ring),
            "connections": [{"rank": r, "counters": dict(c)} for r, c in self.conn.items()],
            "tor": dict(self.tor_counts),
            "transit": [{"rank": r, "counters": dict(c)}
                        for r, c in self.transit_counts.items()]}}}
