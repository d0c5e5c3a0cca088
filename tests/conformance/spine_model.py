"""The spine's model (docs/multirack.md): per slot each ToR's partial added once, one total
to each ToR once every ToR's is in (with the carried headers routed to it), a duplicate
partial dropped before that and answered with its total again after, overrun and stale
slots, a ring's RoCE packets passing only from their requester's ToR's port, every outcome
counted. A vector's author drives it step by step; it derives every expected frame and
counter. Written from the documentation's rules, never from switch/dataplane/spine.py."""
from __future__ import annotations

import json
from typing import Any, Callable, Optional, Sequence

import numpy as np

from nr_contract.spec import LANE_OUTCOMES, PSN_MASK, RingSpec
from switch.dataplane import interswitch
from switch.dataplane.interswitch import Kind
from tests.conformance.format import Step
from tests.conformance.role_model import (PSN_HALF, SPINE, SPINE_INTERSWITCH, RoleModel,
                                          endpoint_dict, tor_endpoint, wire)
from tests.roce_layers import wrapping_sum


class SpineModel(RoleModel):
    """The spine of a ring placed in `racks`: ToR j on spine port j + 1."""

    def __init__(self, name: str, description: str, *, racks: Sequence[int], slots: int = 16,
                 spec: Optional[RingSpec] = None, requires: Sequence[str] = ()):
        super().__init__(name, description, racks, slots, spec, requires)
        self.tor_ids = sorted(set(racks))
        self.tor_port = {j: j + 1 for j in self.tor_ids}
        self.routes = {r: racks[(r + 1) % self.n] for r in range(self.n)
                       if racks[r] != racks[(r + 1) % self.n]}
        conns = self.spec.connections
        self.setup = {
            "role": "spine",
            "config": {"me": endpoint_dict(SPINE),
                       "tors": [{"tor_id": j, "port": self.tor_port[j],
                                 **endpoint_dict(tor_endpoint(j))} for j in self.tor_ids]},
            "ports": sorted(self.tor_port.values()),
            "macs": {**{c.src_mac: self.tor_port[racks[c.rank]] for c in conns},
                     **{tor_endpoint(j).mac: self.tor_port[j] for j in self.tor_ids}},
            "rings": [{"ring_id": self.spec.ring_id, "tor_ids": self.tor_ids, "slots": slots,
                       "mtu": self.spec.mtu, "routes": [[r, t] for r, t in self.routes.items()],
                       "transit": [{"src_ip": conns[r].src_ip, "dst_ip": conns[r].dst_ip,
                                    "dst_qpn": conns[r].dst_qpn, "tor": racks[r]}
                                   for r in self.routes],
                       "spec": json.loads(self.spec.to_json()), "racks": list(racks)}]}
        self.slot_tag: list[Optional[int]] = [None] * slots
        self.parts: list[dict[int, tuple[np.ndarray, list[tuple[int, bytes]]]]] = \
            [{} for _ in range(slots)]
        self.totalled = [False] * slots
        self.next_total = 0
        self.completed = self.totals_sent = 0
        self.lane = {j: dict.fromkeys(LANE_OUTCOMES, 0) for j in self.tor_ids}
        self.inter = dict.fromkeys(SPINE_INTERSWITCH, 0)

    def partial_frame(self, tor: int, k: int, *, data: Optional[np.ndarray | bytes] = None,
                      carried: Optional[Sequence[int]] = None, kind: Kind = Kind.PARTIAL,
                      ring: Optional[int] = None) -> bytes:
        """ToR tor's partial for k: its rack's sum, the headers of `carried` ranks (default:
        its leaving connections')."""
        if data is None:
            data = wrapping_sum([self.packet(r, k).data for r in self.rack(tor)]
                                or [self.payload(self.n, k)])      # a ToR of no rank of it
        payload = data if isinstance(data, bytes) else wire(data)
        ranks = self.leaving(tor) if carried is None else carried
        return interswitch.encode(tor_endpoint(tor), SPINE, kind, tor,
                                  self.tag if ring is None else ring, k, payload,
                                  [(r, self.packet(r, k).header) for r in ranks])

    def partial(self, tor: int, k: int, *, port: Optional[int] = None,
                mangle: Callable[[bytes], bytes] = bytes, corrupt: bool = False,
                expect: str = "", note: str = "", **frame_kw: Any) -> None:
        """ToR tor's partial for k arrives on `port` (default: that ToR's)."""
        frame = self.partial_frame(tor, k, **frame_kw)
        port = self.tor_port.get(tor, 1) if port is None else port
        msg = interswitch.decode(memoryview(frame))
        out: list[tuple[int, bytes]] = []
        outcome = self.first_refusal(msg, corrupt)
        if not outcome:
            if tor not in self.tor_ids:
                outcome = "drop_unknown_tor"
            elif port != self.tor_port[tor] or msg.kind != Kind.PARTIAL:
                outcome = "drop_wrong_port"
            else:
                outcome = self._offer(tor, k, np.frombuffer(msg.payload, "<i4").astype(np.int32),
                                      [(r, bytes(h)) for r, h in msg.carried], out)
        self.record(outcome, expect,
                    self.inter if outcome in SPINE_INTERSWITCH else self.lane[tor], port,
                    mangle(frame), out, note or f"tor{tor} partial k={k}: {outcome}")

    def _offer(self, tor: int, k: int, payload: np.ndarray, carried: list[tuple[int, bytes]],
               out: list[tuple[int, bytes]]) -> str:
        if 4 * len(payload) > self.spec.mtu or \
                any(self.routes.get(r, tor) == tor for r, _ in carried):
            return "drop_mismatch"
        i = k % self.N
        if self.slot_tag[i] == k:
            if len(payload) != len(next(iter(self.parts[i].values()))[0]):
                return "drop_mismatch"
            if tor in self.parts[i]:
                if not self.totalled[i]:
                    return "drop_duplicate"
                out.append(self._total(k, tor))
                return "totals_resent"
        else:
            ahead = (k - self.next_total) & PSN_MASK
            if ahead >= self.N:
                return "drop_overrun" if ahead < PSN_HALF else "drop_stale"
            self.slot_tag[i], self.parts[i], self.totalled[i] = k, {}, False
        self.parts[i][tor] = (payload, carried)
        if len(self.parts[i]) == len(self.tor_ids):
            self.totalled[i] = True
            self.completed += 1
            out += [self._total(k, j) for j in self.tor_ids]
            while self.slot_tag[self.next_total % self.N] == self.next_total \
                    and self.totalled[self.next_total % self.N]:
                self.next_total = (self.next_total + 1) & PSN_MASK
        return "partials"

    def _total(self, k: int, tor: int) -> tuple[int, bytes]:
        parts = self.parts[k % self.N]
        payload = wire(wrapping_sum([parts[j][0] for j in self.tor_ids]))
        carried = [(r, h) for j in self.tor_ids for r, h in parts[j][1]
                   if self.routes[r] == tor]
        self.totals_sent += 1
        return self.tor_port[tor], interswitch.encode(SPINE, tor_endpoint(tor), Kind.TOTAL, tor,
                                                      self.tag, k, payload, carried)

    def complete(self, *ks: int) -> None:
        """Each ToR's partial for each k, in ToR id order (the last one totals the slot)."""
        for k in ks:
            for j in self.tor_ids:
                self.partial(j, k)

    def roce(self, rank: int, k: int, in_port: int, note: str) -> None:
        """Rank's RoCE packet k (a retransmission served by its ToR, or a forgery) arrives:
        a connection between racks passes only from its requester's ToR's port."""
        frame = self.frame(rank, k, self.packet(rank, k))
        if rank in self.routes and in_port != self.tor_port[self.racks[rank]]:
            self.inter["drop_spoofed_transit"] += 1
            self.steps.append(Step(in_port, frame, (), f"spoofed transit: {note}"))
        else:
            self.forward(frame, in_port, note)

    def counters(self) -> dict[str, Any]:
        return {"interswitch": dict(self.inter), "rings": {self.spec.ring_id: {
            "next_total": self.next_total, "completed": self.completed,
            "totals_sent": self.totals_sent,
            "per_tor": {str(j): dict(c) for j, c in self.lane.items()}}}}
