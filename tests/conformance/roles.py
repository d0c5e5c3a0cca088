"""Conformance vectors for the two roles of a two-tier fabric (docs/multirack.md): a ToR and
the spine, each driven frame by frame in the Vector/Step format of conformance.format.

Expected frames and counters come from the models below, written from docs/multirack.md's
rules, never from switch/dataplane/tor.py or spine.py: host-facing frames are the ranks'
scapy-built packets (`write_frame`) with the numpy wrapping sum as payload, partials and
totals are `interswitch.encode` of the model's sums and carried headers. The vector's
author states each verification drop a mangled frame must hit (`drop=`) and may state the
outcome the model must agree with (`expect=`); everything else (partials, resends,
results, skips, served retransmissions, every counter) the model derives.

Setup of a role vector (JSON-able; `role_harness.tor_args` / `spine_args` turn it into the
pipelines' arguments, exactly those TorSwitch/SpineSwitch pass):
  ToR:   {"role": "tor", "config": TorConfig {"tor_id", "uplink", "me": {"mac", "ip"},
          "spine": {"mac", "ip"}}, "ports", "macs" (MAC -> port: local hosts on their
          ports, every other MAC of the ring and the spine's on the uplink),
          "rings": [{"spec", "slots", "racks" (each rank's ToR id, as RegisterRingRequest
          carries it), "local_ports" ({IP: port} of this rack's ranks: register_ring's
          argument)}]}
  spine: {"role": "spine", "config": SpineConfig {"me", "tors": [{"tor_id", "port", "mac",
          "ip"}]}, "ports", "macs", "rings": [{"ring_id", "tor_ids", "slots", "mtu",
          "routes": [[rank, responder's ToR]], "transit": [{"src_ip", "dst_ip", "dst_qpn",
          "tor"}] (conn_key's fields -> the requester's ToR), "spec", "racks"}]}
Limits kept so a P4 program can run the same vectors: path MTU 256, payloads of 256 B
(vectors with others require ANY_PAYLOAD_LENGTH), one ring, slots a power of two <= 16,
contiguous racks (one carried header per message) unless tagged MANY_CARRIED.

JSON: `.venv/bin/python -m tests.conformance.roles OUT`.
"""
from __future__ import annotations

import functools
import json
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
from scapy.compat import raw
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from nr_contract.spec import (CONN_COUNTERS, LANE_OUTCOMES, PSN_MASK, RING_COUNTERS, TOR_COUNTERS,
                              TRANSIT_COUNTERS, Connection, RingSpec, inflight_packets,
                              required_slots)
from switch.dataplane import interswitch
from switch.dataplane.interswitch import Endpoint, Kind, ring_tag
from tests.conformance.format import ANY_PAYLOAD_LENGTH, Step, Vector, to_json
from tests.conformance.vectors import (BROADCAST, MTU, SEND_ONLY, empty_frame, flip, port_of_ip,
                                       resigned)
from tests.roce_layers import (RETH_OPS, WRITE_FIRST, WRITE_LAST, WRITE_LAST_IMM, WRITE_MIDDLE,
                               WRITE_ONLY, WRITE_ONLY_IMM, make_ring, wrapping_sum, write_frame)

MANY_CARRIED = "many_carried"     # a partial or total carries more than one RoCE header
UPLINK = 100                      # every ToR's uplink port (the lab's)
SPINE = Endpoint("02:4e:53:00:00:fe", "10.78.0.254")
PSN_HALF = 1 << 23
FAR_AHEAD = 1 << 22
HALF_AHEAD = 0x800000             # a relative PSN this far from next_emit is behind it
TOR_INTERSWITCH = ("drop_corrupt", "drop_unknown_ring")
SPINE_INTERSWITCH = ("drop_corrupt", "drop_unknown_ring", "drop_unknown_tor",
                     "drop_spoofed_transit")
# RoCE header bytes after the BTH, per WRITE opcode (RETH 16, ImmDt 4)
EXT = {WRITE_FIRST: 16, WRITE_MIDDLE: 0, WRITE_LAST: 0, WRITE_LAST_IMM: 4, WRITE_ONLY: 16,
       WRITE_ONLY_IMM: 20}


def tor_endpoint(j: int) -> Endpoint:
    return Endpoint(f"02:4e:53:00:00:{j + 1:02x}", f"10.78.0.{j + 1}")


def endpoint_dict(e: Endpoint) -> dict[str, str]:
    return {"mac": e.mac, "ip": e.ip}


def header_of(frame: bytes, plen: int) -> bytes:
    """The RoCE header (Ethernet up to the payload) of a WRITE frame, UDP checksum 0 (as a
    switch keeps it)."""
    head = bytearray(frame[:len(frame) - plen - 4])
    head[40:42] = bytes(2)
    return bytes(head)


def wire(data: np.ndarray) -> bytes:
    return data.astype("<i4").tobytes()


def l2_out(macs: dict[str, int], ports: Sequence[int], frame: bytes, in_port: int
           ) -> list[int]:
    """The data plane's L2 forwarding: a known unicast MAC's port (nothing if that is the
    port it came in by), else every other port."""
    dst = Ether(frame).dst
    if dst in macs and not int(dst[:2], 16) & 1:
        return [macs[dst]] if macs[dst] != in_port else []
    return [p for p in ports if p != in_port]


def ack(c: Connection) -> bytes:
    """The responder's ACK on connection c (to its requester)."""
    return raw(Ether(src=c.dst_mac, dst=c.src_mac) / IP(src=c.dst_ip, dst=c.src_ip)
               / UDP(sport=0xC001, dport=4791, chksum=0)
               / BTH(opcode=0x11, dqpn=c.src_qpn, psn=c.psn0) / AETH(syndrome=0x1F))


def arp_request(c: Connection) -> bytes:
    """The requester's broadcast ARP request for its responder."""
    return raw(Ether(src=c.src_mac, dst=BROADCAST) / ARP(psrc=c.src_ip, pdst=c.dst_ip))


@dataclass
class Held:
    """A counted contribution (or a header carried for a remote rank): what builds results."""

    opcode: int
    data: np.ndarray
    kw: dict[str, Any]
    header: bytes
    raw: bytes           # the payload as sent (data's bytes, unless a bad length)


class _Model:
    """What both roles' models share: the ring, its racks, each rank's packet at k."""

    def __init__(self, name: str, description: str, racks: Sequence[int], slots: int,
                 spec: Optional[RingSpec], requires: Sequence[str]):
        self.name, self.description = name, description
        self.requires = frozenset(requires)
        self.spec = spec or make_ring(len(racks), msg_size=MTU, window=2)
        self.racks = list(racks)
        self.n = len(racks)
        self.N = slots
        self.tag = ring_tag(self.spec.ring_id)
        self.steps: list[Step] = []
        self.plan: dict[int, tuple[int, dict[str, Any]]] = {}     # k -> opcode, kw of all ranks
        self.setup: dict[str, Any] = {}

    def op(self, k: int, opcode: int, **kw: Any) -> None:
        """Every rank's packet at k has this opcode and these write_frame arguments."""
        self.plan[k] = (opcode, kw)

    def rack(self, j: int) -> list[int]:
        return [r for r in range(self.n) if self.racks[r] == j]

    def leaving(self, j: int) -> list[int]:
        return [r for r in self.rack(j) if self.racks[(r + 1) % self.n] != j]

    def entering(self, j: int) -> list[int]:
        return [r for r in range(self.n)
                if self.racks[r] != j and self.racks[(r + 1) % self.n] == j]

    def payload(self, rank: int, k: int) -> np.ndarray:
        seed = [zlib.crc32(self.spec.ring_id.encode()), rank, k]
        data = np.random.default_rng(seed).integers(-2**31, 2**31, MTU // 4, dtype=np.int32)
        data[:2] = (2**31 - 1, -2**31)                   # sums must wrap
        return data

    def packet(self, rank: int, k: int, data: Optional[np.ndarray | bytes] = None,
               **override: Any) -> Held:
        """Rank's packet at k (the plan, `override` on top: `op=`, write_frame kwargs)."""
        opcode, kw = self.plan.get(k, (WRITE_ONLY, {}))
        opcode = override.pop("op", opcode)
        kw = {"ip_id": (rank << 8 | k) & 0xFFFF, **kw, **override}
        data = self.payload(rank, k) if data is None else data
        raw_data = data if isinstance(data, bytes) else wire(data)
        frame = write_frame(self.spec.connections[rank], k, opcode, raw_data, **kw)
        return Held(opcode, np.frombuffer(raw_data[:len(raw_data) & ~3], "<i4").astype(np.int32),
                    kw, header_of(frame, len(raw_data)), raw_data)

    def frame(self, rank: int, k: int, p: Held, data: Optional[np.ndarray] = None,
              psn: Optional[int] = None) -> bytes:
        """Rank's packet p at k with payload `data` (default: its own) and PSN `psn`
        (default: its own)."""
        kw = p.kw if psn is None else {**p.kw, "psn": psn}
        return write_frame(self.spec.connections[rank], k, p.opcode,
                           p.raw if data is None else data, **kw)

    def forward(self, frame: bytes, in_port: int, note: str) -> None:
        """A frame the role does not own: L2 forwarding, byte for byte."""
        outs = l2_out(self.setup["macs"], self.setup["ports"], frame, in_port)
        self.steps.append(Step(in_port, frame, tuple((p, frame) for p in outs),
                               f"forwarded: {note}"))

    def vector(self) -> Vector:
        return Vector(self.name, self.description, self.setup, tuple(self.steps),
                      self.counters(), self.requires)

    def counters(self) -> dict[str, Any]:
        raise NotImplementedError


class TorModel(_Model):
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
        if corrupt:
            outcome = "drop_corrupt"
        elif msg.ring != self.tag:
            outcome = "drop_unknown_ring"
        elif port != UPLINK or msg.kind != Kind.TOTAL or msg.tor != self.tor:
            outcome = "drop_total_misdirected"
        else:
            outcome = self._accept(k, payload, [(r, bytes(h)) for r, h in msg.carried],
                                   entering, out)
        assert not expect or expect == outcome, f"{self.name}: {expect} != model's {outcome}"
        (self.inter if outcome in TOR_INTERSWITCH else self.tor_counts)[outcome] += 1
        self.steps.append(Step(port, mangle(frame), tuple(out),
                               note or f"total k={k}: {outcome}"))

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


class SpineModel(_Model):
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
        if corrupt:
            outcome = "drop_corrupt"
        elif msg.ring != self.tag:
            outcome = "drop_unknown_ring"
        elif tor not in self.tor_ids:
            outcome = "drop_unknown_tor"
        elif port != self.tor_port[tor] or msg.kind != Kind.PARTIAL:
            outcome = "drop_wrong_port"
        else:
            outcome = self._offer(tor, k, np.frombuffer(msg.payload, "<i4").astype(np.int32),
                                  [(r, bytes(h)) for r, h in msg.carried], out)
        assert not expect or expect == outcome, f"{self.name}: {expect} != model's {outcome}"
        (self.inter if outcome in SPINE_INTERSWITCH else self.lane[tor])[outcome] += 1
        self.steps.append(Step(port, mangle(frame), tuple(out),
                               note or f"tor{tor} partial k={k}: {outcome}"))

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


def role(model: Callable[..., _Model], description: str, **setup: Any
         ) -> Callable[[Callable[[Any], None]], Callable[[], Vector]]:
    """A scenario: the function (its name, the vector's) drives a `model` built with
    `description` and `setup`; calling the result gives the vector."""
    def wrap(steps: Callable[[Any], None]) -> Callable[[], Vector]:
        @functools.wraps(steps)
        def make() -> Vector:
            s = model(steps.__name__, description, **setup)
            steps(s)
            return s.vector()
        return make
    return wrap


# -- the ToR's vectors ---------------------------------------------------------------------------

RACKS_2X2 = [0, 0, 1, 1]      # tor0: ranks 0, 1 (leaving 1 -> 2, entering 3 -> 0)
RACKS_1_2_1 = [0, 1, 1, 2]    # tor1: ranks 1, 2 (leaving 2 -> 3, entering 0 -> 1)


@role(TorModel, "ToR 0 of 2 x 2: the rack's completion sends one partial up carrying the "
            "leaving connection's header (rank 1 -> 2); the total brings rank 3's header "
            "and yields the results of 0 -> 1 (own) and 3 -> 0 (entering), every opcode",
            tor=0, racks=RACKS_2X2, spec=make_ring(4, msg_size=4 * MTU, window=1))
def tor_partial_up_total_down(s: TorModel) -> None:
    ops = [(WRITE_FIRST, {"reth": (0x1000, 0x99, 3 * MTU)}), (WRITE_MIDDLE, {}),
           (WRITE_LAST_IMM, {"ackreq": True, "imm": 0x77}),
           (WRITE_ONLY_IMM, {"ackreq": True, "reth": (0x9000, 0x99, MTU), "imm": 0x78}),
           (WRITE_ONLY, {"reth": (0xA000, 0x99, MTU)}),
           (WRITE_FIRST, {"reth": (0xB000, 0x99, 2 * MTU)}), (WRITE_LAST, {"ackreq": True})]
    for k, (op, kw) in enumerate(ops):
        s.op(k, op, **kw)
        first, second = (0, 1) if k % 2 else (1, 0)
        s.write(first, k, expect="aggregated")
        s.write(second, k, expect="aggregated", note=f"rank {second} k={k}: rack complete, "
                                                      "partial up")
        s.total(k, expect="totals", note=f"total k={k}: results of 0 -> 1 and 3 -> 0")


@role(TorModel, "ToR 1 of racks 0 | 1 2 | 3: slot 1 completes locally before slot 0 (its "
            "partial goes up at once); totals 2 then 1 arrive before 0: each is a gap, "
            "so next_emit's partial is resent; total 0 releases 0, 1, 2 in order of k; "
            "a gap while next_emit is not locally complete resends nothing",
            tor=1, racks=RACKS_1_2_1)
def tor_out_of_order_totals_and_gap(s: TorModel) -> None:
    s.write(1, 1)
    s.write(2, 1, note="slot 1 complete before slot 0: its partial goes up now")
    s.write(2, 0)
    s.write(1, 0)
    s.write(1, 2)
    s.write(2, 2)
    s.total(2, expect="totals", note="total 2 (a gap): partial 0 resent")
    s.total(1, expect="totals", note="total 1 (a gap): partial 0 resent again")
    s.total(0, expect="totals", note="total 0: results of 0, 1, 2 in order")
    s.write(1, 4)
    s.write(2, 4)
    s.total(4, expect="totals", note="total 4 while slot 3 is empty: nothing to resend")
    s.write(2, 3)
    s.write(1, 3)
    s.total(3, expect="totals", note="total 3: results of 3 then 4")


@role(TorModel, "rule 3: a held contribution that comes again is never added twice; while "
            "its slot has no total the partials of next_emit and of its slot are resent "
            "(when locally complete), byte for byte as first sent",
            tor=0, racks=RACKS_2X2)
def tor_duplicates(s: TorModel) -> None:
    s.write(0, 0)
    s.write(0, 0, data=np.full(64, 12345, np.int32), expect="drop_duplicate",
            note="duplicate with another payload, slot incomplete: nothing resent")
    s.write(1, 0)
    s.write(0, 1)
    s.write(0, 1, ip_id=0x4242, expect="drop_duplicate",
            note="duplicate into incomplete slot 1: next_emit 0's partial resent")
    s.write(1, 1)
    s.write(1, 1, ip_id=0x4343, ackreq=True, expect="drop_duplicate",
            note="duplicate into complete slot 1: partials 0 and 1 resent")
    s.total(0)
    s.write(0, 1, data=np.zeros(64, np.int32), expect="drop_duplicate",
            note="next_emit is 1 now: partial 1 alone resent")
    s.total(1, note="total 1: results built from the first contributions")


@role(TorModel, "rule 4: a retransmission into a slot whose total is here gets the result "
            "on its own connection with its own header, even before the slot's turn "
            "to be emitted; a leaving connection's (1 -> 2) goes up the uplink; a "
            "corrupted one or a fragment is not served",
            tor=0, racks=RACKS_2X2)
def tor_retransmissions_served(s: TorModel) -> None:
    s.complete(0, 1)
    s.total(1, note="total 1 before 0 (a gap): partial 0 resent")
    s.write(0, 1, ip_id=0x100, ackreq=True, expect="retransmits_served",
            note="rank 0 k=1 served before emission, to rank 1's port")
    s.write(1, 1, ip_id=0x101, expect="retransmits_served",
            note="rank 1 k=1 (leaving) served up the uplink")
    s.total(0, note="total 0: results of 0 then 1")
    s.write(1, 0, ip_id=0x200, ackreq=True, expect="retransmits_served")
    s.write(0, 0, ip_id=0x201, expect="retransmits_served")
    s.write(1, 0, mangle=flip(-5), drop="drop_bad_icrc", note="corrupted: not served")
    s.write(0, 0, mangle=resigned(flags="MF"), drop="drop_fragment", note="fragment: not served")


@role(TorModel, "rule 7a: rxe re-cuts a stream (docs/roce.md): an empty WRITE_ONLY of a "
            "local requester goes on untouched to its responder (the leaving one's up the "
            "uplink) and moves its later packets one PSN on; a repeat does not. Partials "
            "carry each contribution's own header; results leave at psn0 + re-cuts + k "
            "(an entering lane's re-cuts are the empties that passed here as transit), a "
            "slot contributed before a re-cut and emitted after it too; served "
            "retransmissions keep their own PSN",
            tor=0, racks=RACKS_2X2)
def tor_recut_streams(s: TorModel) -> None:
    psn0 = [c.psn0 for c in s.spec.connections]

    def on(rank: int, k: int, shift: int) -> int:
        return (psn0[rank] + k + shift) & PSN_MASK

    s.complete(0, total=True)
    s.empty(1, 1, recut=True, note="leaving rank 1 re-cuts at j=1: up the uplink")
    s.empty(0, 1, recut=True, note="rank 0 re-cuts at j=1: to rank 1's port")
    s.empty(0, 1, recut=False, note="rank 0's empty again: forwarded, no second re-cut")
    s.write(0, 1, psn=on(0, 1, 1), expect="aggregated")
    s.write(1, 1, psn=on(1, 1, 1), expect="aggregated",
            note="rank 1 k=1 one PSN on: the partial carries that PSN")
    s.transit_empty(3, 1, recut=True, note="entering rank 3's re-cut passes: to rank 0")
    s.total(1, carried={3: {"psn": on(3, 1, 1)}}, expect="totals",
            note="total 1: results at psn0 + 1 + 1 for ranks 0 and 3")
    s.write(0, 1, psn=on(0, 1, 1), ip_id=0x300, expect="retransmits_served")
    s.write(1, 1, psn=on(1, 1, 1), ip_id=0x301, expect="retransmits_served")
    s.write(0, 2, psn=on(0, 2, 1), expect="aggregated", note="rank 0 k=2 before a re-cut")
    s.empty(0, 4, recut=True, note="rank 0 re-cuts again at j=4")
    s.write(1, 2, psn=on(1, 2, 1), expect="aggregated")
    s.total(2, expect="totals", note="total 2: rank 0's result at psn0 + 2 + 2, not at the "
                                     "PSN it contributed with")


@role(TorModel, "rule 5's refusals, each leaving the slot untouched: a total for a slot "
            "never opened or not locally complete (unexpected), without exactly the "
            "entering connections' headers, from a host port, of kind partial, for "
            "another ToR id, of an unknown ring; then a good total, then it again "
            "(duplicate)", tor=0, racks=RACKS_2X2)
def tor_bad_totals(s: TorModel) -> None:
    s.complete(0)
    s.total(1, expect="drop_total_unexpected", note="slot 1 never opened")
    s.write(0, 1)
    s.total(1, expect="drop_total_unexpected", note="slot 1 not locally complete")
    s.total(0, raw_carried=[], expect="drop_total_headers", note="no header")
    s.total(0, raw_carried=[(2, s.packet(2, 0).header)], expect="drop_total_headers",
            note="rank 2's header (2 -> 3 is not entering)")
    s.total(0, raw_carried=[(3, s.packet(3, 0, op=WRITE_MIDDLE).header)],
            expect="drop_total_headers", note="rank 3's header of another opcode and length")
    s.total(0, raw_carried=[(3, s.packet(3, 0, op=WRITE_FIRST).header)],
            expect="drop_total_headers", note="rank 3's header, same length, other opcode")
    s.total(0, port=1, expect="drop_total_misdirected", note="from a host port")
    s.total(0, kind=Kind.PARTIAL, expect="drop_total_misdirected", note="a partial")
    s.total(0, tor=1, expect="drop_total_misdirected", note="for ToR 1")
    s.total(0, ring=ring_tag("another ring"), expect="drop_unknown_ring")
    s.total(0, expect="totals")
    s.total(0, data=np.ones(64, np.int32), expect="drop_total_duplicate",
            note="the total again, another payload: nothing")
    s.write(1, 1)
    s.total(1, expect="totals")


@role(TorModel, "a contribution whose payload is not a multiple of 4, longer than the path "
            "MTU or cut short is dropped (drop_bad_length); a total whose payload length "
            "is not the slot's (128 B, 260 B for 256 B contributions) is refused "
            "(drop_total_length); the right ones are then taken",
            tor=1, racks=RACKS_1_2_1, requires=[ANY_PAYLOAD_LENGTH])
def tor_wrong_lengths(s: TorModel) -> None:
    s.write(1, 0, data=bytes(254), drop="drop_bad_length", note="254 B")
    s.write(1, 0, data=bytes(MTU + 4), drop="drop_bad_length", note="260 B")
    s.write(1, 0, mangle=lambda f: f[:-8], drop="drop_bad_length",
            note="frame 8 bytes shorter than its UDP length")
    s.write(1, 0)
    s.write(2, 0)
    s.total(0, data=np.ones(32, np.int32), expect="drop_total_length")
    s.total(0, data=np.ones(65, np.int32), expect="drop_total_length")
    s.total(0, expect="totals")


@role(TorModel, "rule 6: an entering connection's packet (3 -> 0, a retransmission served by "
            "rank 3's ToR) from the uplink leaves by rank 0's port untouched (even "
            "corrupted: not the ToR's to check), and resends the partials of next_emit "
            "and of its k while they lack a total; from a host port it is dropped",
            tor=0, racks=RACKS_2X2)
def tor_transit(s: TorModel) -> None:
    s.transit(3, 0, note="transit k=0, slot empty: forwarded only")
    s.complete(0)
    s.transit(3, 0, note="transit k=0, slot 0 has no total: forwarded, partial 0 resent")
    s.transit(3, 0, port=2, note="transit from a host port: dropped")
    s.write(0, 1)
    s.write(1, 1)
    s.transit(3, 1, mangle=flip(-5), note="corrupted transit k=1: forwarded, partials 0, 1 "
                                          "resent")
    s.total(0)
    s.total(1)
    s.transit(3, 1, note="transit k=1 after the total: forwarded only")


@role(TorModel, "rule 7, N = 2W = 4: totals 0 and 2 are lost, 1 arrives; a local packet "
            "k=6 >= next_emit + N empties slot 0, emits 1, empties 2 (slots_skipped 2) "
            "and is taken; a late contribution to a skipped slot is stale, a late total "
            "for it unexpected; a retransmission of emitted k=1 is still served",
            tor=0, racks=RACKS_2X2, slots=4)
def tor_rule7_skip(s: TorModel) -> None:
    s.complete(0, 1, 2, 3)
    s.total(1, note="total 1 (a gap): partial 0 resent")
    s.write(0, 6, expect="aggregated",
            note="k=6: skips 0, emits 1, skips 2; next_emit 3, then taken")
    s.write(1, 0, expect="drop_stale", note="late contribution to skipped k=0")
    s.total(2, expect="drop_total_unexpected", note="late total for skipped k=2")
    s.write(0, 1, expect="retransmits_served", note="emitted k=1 still held: served")
    s.write(1, 3, expect="drop_duplicate", note="k=3 has no total: partial 3 resent")
    s.total(3, expect="totals")
    s.write(1, 6, note="slot of k=6 complete: partial up")


@role(TorModel, "rule 7 then rule 5's order: N = 2W = 4; total 0 lost, total 1 here; a "
            "local packet k=4 skips slot 0 only (k - 2W = 0), which makes next_emit 1, "
            "whose total is here: results go out in order of k, as after any total",
            tor=0, racks=RACKS_2X2, slots=4)
def tor_skip_lands_on_ready_slot(s: TorModel) -> None:
    s.complete(0, 1)
    s.total(1, note="total 1 (a gap): partial 0 resent")
    s.write(0, 4, expect="aggregated", note="k=4: skips 0; next_emit 1 is ready: emitted")
    s.write(1, 4)


@role(TorModel, "N = 2W = 4: a contribution older than a re-used slot, or 2^23 behind, is "
            "stale; one N or more ahead is never an overrun at a ToR (rule 7 frees the "
            "slots up to k - 2W first, here k=4's unfinished slot)",
            tor=0, racks=RACKS_2X2, slots=4)
def tor_stale_and_no_overrun(s: TorModel) -> None:
    s.complete(0, 1, 2, 3, total=True)
    s.write(0, 4)
    s.write(1, 0, expect="drop_stale", note="k=0, its slot now holds k=4")
    s.write(1, HALF_AHEAD + 4, expect="drop_stale", note="2^23 past next_emit: behind it")
    s.write(0, 8, expect="aggregated", note="k=8 = next_emit + N: slot of k=4 skipped, taken")
    s.write(1, 4, expect="drop_stale", note="k=4 was skipped")
    s.write(0, 5)
    s.write(1, 5)
    s.total(5)


@role(TorModel, "rule 7 far ahead: a local packet 2^22 past next_emit (a host's valid "
            "PSN, or a hostile one) skips every k up to k - 2W but visits each slot once: "
            "the ToR's cost is bounded by N, not by the gap",
            tor=0, racks=RACKS_2X2, slots=4)
def tor_skip_far_ahead(s: TorModel) -> None:
    s.complete(0, 1, total=True)
    s.write(0, FAR_AHEAD, expect="aggregated", note="k=2^22: skips 1 .. 2^22 - 4, taken")
    s.write(1, FAR_AHEAD)
    s.total(FAR_AHEAD - 1, expect="drop_total_unexpected", note="skipped: never partialled")


@role(TorModel, "pipeline.md's host-facing checks apply at the ToR: a corrupted payload, "
            "RETH or ICRC, a bad IPv4 checksum, a fragment, SEND, the wrong port (another "
            "host's or the uplink), another opcode than the slot's: dropped, never summed",
            tor=0, racks=RACKS_2X2)
def tor_host_link_corruption(s: TorModel) -> None:
    s.op(0, WRITE_FIRST, reth=(0x4000, 7, 2 * MTU))
    s.write(0, 0, mangle=flip(-5), drop="drop_bad_icrc", note="payload byte flipped")
    s.write(0, 0, mangle=flip(60, 0x80), drop="drop_bad_icrc", note="RETH bit flipped")
    s.write(0, 0, mangle=flip(-1), drop="drop_bad_icrc", note="ICRC flipped")
    s.write(0, 0, mangle=flip(25), drop="drop_bad_ipcsum", note="IPv4 checksum flipped")
    s.write(0, 0, mangle=resigned(flags="MF"), drop="drop_fragment", note="MF set")
    s.write(0, 0, op=SEND_ONLY, drop="drop_bad_opcode", note="SEND ONLY")
    s.write(0, 0, port=2, note="on rank 1's port")
    s.write(0, 0, port=UPLINK, note="on the uplink")
    s.write(0, 0)
    s.write(1, 0, op=WRITE_MIDDLE, expect="drop_mismatch", note="rank 1 with another opcode")
    s.write(1, 0, mangle=flip(100, 0x40), drop="drop_bad_icrc", note="rank 1's payload bad")
    s.write(1, 0, expect="aggregated")
    s.total(0)


@role(TorModel, "totals damaged on the spine link (payload, CRC, carried header, k, UDP "
            "length, truncated) fail decode: drop_corrupt, never taken; the good one is",
            tor=0, racks=RACKS_2X2)
def tor_corrupt_interswitch(s: TorModel) -> None:
    s.complete(0)
    off = interswitch.PAYLOAD_OFF
    for mangle, what in [(flip(off + 7), "payload"), (flip(-2), "CRC32"),
                         (flip(off + MTU + 30), "carried header"), (flip(off - 6), "k"),
                         (flip(39), "UDP length"), (lambda f: f[:-1], "truncated")]:
        s.total(0, mangle=mangle, corrupt=True, note=f"total 0, {what} damaged")
    s.total(0, expect="totals")


@role(TorModel, "ToR 0 of interleaved racks 0 1 0 1: each partial carries two headers "
            "(0 -> 1, 2 -> 3), each total two (1 -> 2, 3 -> 0); no connection stays in "
            "the rack, so every result comes from a carried header; a total with a "
            "header twice or one missing is refused",
            tor=0, racks=[0, 1, 0, 1], requires=[MANY_CARRIED])
def tor_many_carried(s: TorModel) -> None:
    for k in range(2):
        s.write(2, k)
        s.write(0, k)
    s.total(0, raw_carried=[(1, s.packet(1, 0).header)] * 2, expect="drop_total_headers",
            note="rank 1's header twice")
    s.total(0, raw_carried=[(3, s.packet(3, 0).header)], expect="drop_total_headers",
            note="rank 1's header missing")
    s.total(0, raw_carried=[(1, s.packet(1, 0).header)] + [(3, s.packet(3, 0).header)] * 2,
            expect="drop_total_headers", note="rank 3's header twice")
    s.total(0, expect="totals")
    s.total(1, carried={3: {"ip_id": 0x3333, "ackreq": True}}, expect="totals",
            note="total 1: rank 3's result carries its own IP ID and AckReq")
    s.write(2, 1, ip_id=0x99, expect="retransmits_served", note="2 -> 3 up the uplink")
    s.transit(1, 1)


@role(TorModel, "ACKs, ARP, TCP and other QPs pass by L2 unchanged: between "
            "hosts of the rack, to remote hosts up the uplink, from the uplink down; "
            "touching no counter", tor=0, racks=RACKS_2X2)
def tor_forwarding(s: TorModel) -> None:
    c0, c1 = s.spec.connections[0], s.spec.connections[1]
    s.forward(ack(c0), 2, "ACK from rank 1 to rank 0")
    s.forward(ack(c1), UPLINK, "ACK from rank 2 to rank 1, down the uplink")
    s.forward(arp_request(c0), 1, "ARP request, flooded")
    s.forward(raw(Ether(src=c1.src_mac, dst=c1.dst_mac) / IP(src=c1.src_ip, dst=c1.dst_ip)
                  / TCP(sport=40000, dport=18515) / Raw(bytes(32))), 2, "TCP up the uplink")
    other = make_ring(4, qpn_base=0x70).connections[0]
    s.forward(write_frame(other, 0, WRITE_ONLY, bytes(MTU)), 1, "a QP of no ring")
    s.forward(raw(Ether(src=c0.src_mac, dst="02:4e:52:00:00:77") / IP() / UDP()), 1,
              "unknown MAC, flooded")
    s.forward(raw(Ether(src=c0.src_mac, dst="01:00:5e:00:00:01") / IP(dst="224.0.0.1") / UDP()),
              1, "multicast, flooded")


# -- the spine's vectors -------------------------------------------------------------------------

@role(SpineModel, "2 x 2: each ToR's partial is added once; when both are in, one total "
            "goes to each ToR with the header routed to it (rank 3's to ToR 0, rank 1's "
            "to ToR 1); slots complete in any order (3 before 2), next_total follows",
            racks=RACKS_2X2, spec=make_ring(4, msg_size=4 * MTU, window=1))
def spine_partials_and_totals(s: SpineModel) -> None:
    ops = [(WRITE_FIRST, {"reth": (0x1000, 5, 4 * MTU)}), (WRITE_MIDDLE, {}),
           (WRITE_MIDDLE, {}), (WRITE_LAST_IMM, {"ackreq": True}),
           (WRITE_ONLY_IMM, {"ackreq": True, "reth": (0x2000, 5, MTU)})]
    for k, (op, kw) in enumerate(ops):
        s.op(k, op, **kw)
    for k in (0, 1):
        s.partial(k % 2, k)
        s.partial(1 - k % 2, k, note=f"tor{1 - k % 2} partial k={k}: totals to both")
    s.partial(0, 3)
    s.partial(0, 2)
    s.partial(1, 3, note="slot 3 totalled before 2: next_total stays 2")
    s.partial(1, 2, note="slot 2 totalled: next_total 4")
    s.partial(1, 4)
    s.partial(0, 4)


@role(SpineModel, "racks 0 0 | 1 | 2: three partials per slot, a total to each ToR carrying "
            "the one header entering it (3 -> 0, 1 -> 2, 2 -> 3)",
            racks=[0, 0, 1, 2])
def spine_three_tors(s: SpineModel) -> None:
    for k in range(3):
        for j in ((0, 1, 2), (2, 0, 1), (1, 2, 0))[k]:
            s.partial(j, k)


@role(SpineModel, "a partial again before its slot's total is dropped (not added twice, "
            "whatever its payload); after the total it brings the total back to that "
            "ToR only (totals_resent), with that ToR's routed headers",
            racks=RACKS_2X2)
def spine_duplicate_partials(s: SpineModel) -> None:
    s.partial(0, 0)
    s.partial(0, 0, data=np.ones(64, np.int32), expect="drop_duplicate")
    s.partial(1, 0, expect="partials")
    s.partial(1, 0, expect="totals_resent", note="tor1 again: the total to tor1 only")
    s.partial(0, 0, expect="totals_resent", note="tor0 again: the total to tor0 only")
    s.partial(1, 1)
    s.partial(1, 1, expect="drop_duplicate")
    s.partial(0, 1)


@role(SpineModel, "a partial from another ToR's port or a total sent to the spine "
            "(drop_wrong_port, the named ToR's lane), of an unknown ring or naming a ToR "
            "not in the ring (interswitch counters) is not added",
            racks=RACKS_2X2)
def spine_wrong_port_unknown_ring_and_tor(s: SpineModel) -> None:
    s.partial(0, 0, port=2, expect="drop_wrong_port", note="tor0's partial on tor1's port")
    s.partial(0, 0, kind=Kind.TOTAL, expect="drop_wrong_port", note="kind total")
    s.partial(0, 0, ring=ring_tag("nobody"), expect="drop_unknown_ring")
    s.partial(5, 0, port=1, expect="drop_unknown_tor")
    s.partial(0, 0)
    s.partial(1, 0, port=1, expect="drop_wrong_port", note="tor1's partial on tor0's port")
    s.partial(1, 0)


@role(SpineModel, "N = 4: a partial N ahead of next_total is an overrun; once slots are "
            "totalled they are re-used; a partial for a k whose slot moved on, or 2^23 "
            "behind, is stale", racks=RACKS_2X2, slots=4)
def spine_overrun_and_stale(s: SpineModel) -> None:
    s.partial(0, 4, expect="drop_overrun")
    s.complete(0, 1, 2, 3)
    s.partial(1, 4, expect="partials")
    s.partial(0, 0, expect="drop_stale", note="k=0: its slot now holds 4")
    s.partial(0, 8, expect="drop_overrun", note="k=8 = next_total + N")
    s.partial(0, HALF_AHEAD + 4, expect="drop_stale")
    s.partial(0, 4)


@role(SpineModel, "a partial carrying a header with nowhere to go (rank 0 -> 1 stays in rack "
            "0) or bound for its own ToR (rank 3 -> 0 from tor0) is a mismatch",
            racks=RACKS_2X2)
def spine_mismatch(s: SpineModel) -> None:
    s.partial(0, 0, carried=[0], expect="drop_mismatch")
    s.partial(0, 0, carried=[3], expect="drop_mismatch")
    s.partial(1, 0, carried=[1], expect="drop_mismatch")
    s.complete(0)


@role(SpineModel, "a partial of another length than its slot's (128 B after 256 B), or longer "
            "than the path MTU (260 B), is a mismatch; a slot of 128 B partials is fine",
            racks=RACKS_2X2, requires=[ANY_PAYLOAD_LENGTH])
def spine_mismatched_length(s: SpineModel) -> None:
    s.partial(0, 0)
    s.partial(1, 0, data=np.ones(32, np.int32), expect="drop_mismatch")
    s.partial(1, 0, data=np.ones(65, np.int32), expect="drop_mismatch")
    s.partial(1, 0)
    s.partial(1, 1, data=np.arange(32, dtype=np.int32))
    s.partial(0, 1, data=np.full(32, -7, np.int32))


@role(SpineModel, "partials damaged on a ToR link (payload, CRC, carried header, ToR id, "
            "version) fail decode (drop_corrupt) and are never added",
            racks=RACKS_2X2)
def spine_corrupt(s: SpineModel) -> None:
    off = interswitch.OFF
    for mangle, what in [(flip(off + 16 + 9), "payload"), (flip(-1, 0x80), "CRC32"),
                         (flip(off + 16 + MTU + 10), "carried header"), (flip(off + 2), "tor"),
                         (flip(off), "version")]:
        s.partial(0, 0, mangle=mangle, corrupt=True, note=f"tor0 k=0, {what} damaged")
    s.partial(0, 0)
    s.partial(1, 0, mangle=flip(off + 16), corrupt=True)
    s.partial(1, 0)


@role(SpineModel, "a connection between racks passes the spine only from its requester's "
            "ToR (L2 to the responder's); from another port it is spoofed and dropped; "
            "a connection inside a rack, ACKs, ARP and unknown MACs are L2's",
            racks=RACKS_2X2)
def spine_transit_and_forwarding(s: SpineModel) -> None:
    s.roce(1, 0, 1, "1 -> 2 from tor0")
    s.roce(1, 0, 2, "1 -> 2 from tor1's port")
    s.roce(3, 2, 2, "3 -> 0 from tor1")
    s.roce(3, 2, 1, "3 -> 0 from tor0's port")
    s.roce(0, 0, 2, "0 -> 1 (inside rack 0) from tor1's port")
    c = s.spec.connections[1]
    for frame, port, what in [(ack(c), 2, "ACK from rank 2 to rank 1"),
                              (arp_request(c), 1, "ARP request, flooded"),
                              (raw(Ether(src=c.src_mac, dst="02:4e:52:00:00:99") / IP() / TCP()),
                               1, "unknown MAC, flooded")]:
        s.forward(frame, port, what)


@role(SpineModel, "interleaved racks 0 1 0 1: each partial carries two headers, each total "
            "the two routed to its ToR (to tor0: 1 -> 2, 3 -> 0; to tor1: 0 -> 1, 2 -> 3)",
            racks=[0, 1, 0, 1], requires=[MANY_CARRIED])
def spine_many_carried(s: SpineModel) -> None:
    for k in range(2):
        s.partial(k, k)
        s.partial(1 - k, k)
    s.partial(0, 1, expect="totals_resent")


SCENARIOS: tuple[Callable[[], Vector], ...] = (
    tor_partial_up_total_down, tor_out_of_order_totals_and_gap, tor_duplicates,
    tor_retransmissions_served, tor_recut_streams, tor_bad_totals, tor_wrong_lengths, tor_transit, tor_rule7_skip,
    tor_skip_lands_on_ready_slot, tor_stale_and_no_overrun, tor_skip_far_ahead,
    tor_host_link_corruption, tor_corrupt_interswitch, tor_many_carried, tor_forwarding,
    spine_partials_and_totals,
    spine_three_tors, spine_duplicate_partials, spine_wrong_port_unknown_ring_and_tor,
    spine_overrun_and_stale, spine_mismatch, spine_mismatched_length, spine_corrupt,
    spine_transit_and_forwarding, spine_many_carried)


def all_role_vectors() -> list[Vector]:
    return [make() for make in SCENARIOS]


if __name__ == "__main__":
    TEXT = to_json(all_role_vectors())
    Path(sys.argv[1]).write_text(TEXT) if sys.argv[1:] else print(TEXT)
