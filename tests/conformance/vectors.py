"""The conformance vectors, crafted with scapy from docs/pipeline.md (not from any switch).

Each scenario states, per input frame, its outcome (the counter it bumps) and which slots
it completes; expected frames are the ranks' own scapy-built packets with the payload
replaced by the numpy wrapping sum, and expected counters are the tally of the outcomes.
RoCE path MTU 256 (64 int32 per packet) everywhere, so a fixed 64-element P4 parser can
run every vector not tagged `any_payload_length`.

JSON for targets run elsewhere: `.venv/bin/python -m tests.conformance.vectors OUT`.
"""
from __future__ import annotations

import json
import sys
import zlib
from collections import defaultdict
from typing import Any, Callable, Optional, Sequence

import numpy as np
from scapy.compat import raw
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from nr_contract.spec import CONN_COUNTERS, RING_COUNTERS, Connection, RingSpec
from tests.conformance.format import ANY_PAYLOAD_LENGTH, Step, Vector, to_json
from tests.roce_layers import (RETH_OPS, WRITE_FIRST, WRITE_LAST, WRITE_LAST_IMM, WRITE_MIDDLE,
                               WRITE_ONLY, WRITE_ONLY_IMM, lab_port, mac_ports, make_ring,
                               wrapping_sum, write_frame)

MTU = 256
SEND_ONLY = 0x04
BROADCAST = "ff:ff:ff:ff:ff:ff"


def port_of_ip(ip: str) -> int:
    return lab_port(int(ip.rsplit(".", 1)[1]) - 1)


def flip(offset: int, mask: int = 0x01) -> Callable[[bytes], bytes]:
    """A mangle: the frame with the byte at `offset` (negative: from the end) xor `mask`."""
    def mangled(frame: bytes) -> bytes:
        out = bytearray(frame)
        out[offset] ^= mask
        return bytes(out)
    return mangled


def resigned(**ip_fields: Any) -> Callable[[bytes], bytes]:
    """A mangle: the frame with IPv4 fields changed and its checksum and ICRC recomputed
    (a well-formed packet of another shape, e.g. a fragment)."""
    def mangled(frame: bytes) -> bytes:
        pkt = Ether(frame)
        for name, value in ip_fields.items():
            setattr(pkt[IP], name, value)
        pkt[IP].chksum = None
        pkt[BTH].icrc = None
        return raw(pkt)
    return mangled


def udp_checksum(value: int) -> Callable[[bytes], bytes]:
    """A mangle: the frame with UDP checksum `value` (the ICRC masks it: still valid)."""
    def mangled(frame: bytes) -> bytes:
        return frame[:40] + value.to_bytes(2, "big") + frame[42:]
    return mangled


def empty_frame(c: Connection, j: int, opcode: int = WRITE_ONLY_IMM) -> bytes:
    """Connection c's empty WRITE_ONLY(_WITH_IMMEDIATE) at relative PSN j: what rxe sends
    when it re-cuts its stream after a retry race (docs/roce.md, pipeline.md rule 7a)."""
    return write_frame(c, j, opcode, b"", reth=(0x7F00AA000000 + j, 0x2A, 0), imm=0x900 + j,
                       ackreq=True)


class Scenario:
    """Builds one Vector step by step, keeping what each slot holds to predict results."""

    def __init__(self, name: str, description: str, rings: Sequence[tuple[RingSpec, int]],
                 hosts: int = 4, requires: Sequence[str] = ()):
        self.name, self.description, self.requires = name, description, frozenset(requires)
        self.rings = {spec.ring_id: spec for spec, _ in rings}
        self.macs = mac_ports(hosts)
        self.setup = {"ports": sorted(self.macs.values()), "macs": self.macs,
                      "rings": [{"spec": json.loads(s.to_json()), "slots": n} for s, n in rings]}
        self.steps: list[Step] = []
        # (ring, k) -> rank -> (opcode, payload, write_frame kwargs) of the counted contribution
        self.slots: dict[tuple[str, int], dict[int, tuple[int, np.ndarray, dict]]] = \
            defaultdict(dict)
        self.shift: dict[tuple[str, int], int] = defaultdict(int)   # (ring, rank): re-cuts
        self.tally = {rid: {"counters": dict.fromkeys(RING_COUNTERS, 0),
                            "connections": [dict.fromkeys(CONN_COUNTERS, 0)
                                            for _ in range(s.world_size)]}
                      for rid, s in self.rings.items()}

    def write(self, rank: int, k: int, opcode: int = WRITE_ONLY, size: int = MTU, *,
              ring: Optional[str] = None, outcome: str = "aggregated", emits: Sequence[int] = (),
              port: Optional[int] = None, data: Optional[np.ndarray | bytes] = None,
              mangle: Callable[[bytes], bytes] = bytes, note: str = "", **kw: Any) -> None:
        """Rank's WRITE packet k of `ring` (default: the first) arrives; it bumps `outcome`
        and completes the slots `emits`, whose results must leave in that order."""
        spec = self.rings[ring or next(iter(self.rings))]
        c = spec.connections[rank]
        if data is None:
            seed = [zlib.crc32(spec.ring_id.encode()), rank, k]
            data = np.random.default_rng(seed).integers(-2**31, 2**31, size // 4, dtype=np.int32)
            data[:2] = (2**31 - 1, -2**31)[:len(data[:2])]          # sums must wrap
        expect: list[tuple[int, bytes]] = []
        if outcome == "aggregated":
            self.slots[spec.ring_id, k][rank] = (opcode, data, kw)
        elif outcome == "retransmits_served":
            expect.append((port_of_ip(c.dst_ip),
                           write_frame(c, k, opcode, self._sum(spec, k), **kw)))
        for done in emits:
            expect += self._results(spec, done)
        self._count(spec, rank, outcome, opcode, len(emits))
        self.steps.append(Step(port_of_ip(c.src_ip) if port is None else port,
                               mangle(write_frame(c, k, opcode, data, **kw)), tuple(expect),
                               note or f"{spec.ring_id} rank {rank} k={k} op={opcode:#x}: "
                                       f"{outcome}" + (f", emits {list(emits)}" if emits else "")))

    def empty(self, rank: int, j: int, opcode: int = WRITE_ONLY_IMM, *, recut: bool,
              note: str = "") -> None:
        """Rank's empty WRITE_ONLY at relative PSN j (rxe's re-cut stream): passed on
        untouched to its responder; `recut`: it moves the rank's later packets one PSN on."""
        spec = self.rings[next(iter(self.rings))]
        c = spec.connections[rank]
        frame = empty_frame(c, j, opcode)
        self._count(spec, rank, "empties_forwarded", opcode, 0)
        self.tally[spec.ring_id]["connections"][rank]["recuts"] += recut
        self.shift[spec.ring_id, rank] += recut
        self.steps.append(Step(port_of_ip(c.src_ip), frame, ((port_of_ip(c.dst_ip), frame),),
                               note or f"rank {rank} empty at j={j}: forwarded"
                                       + (", re-cuts its stream" if recut else "")))

    def response(self, rank: int, in_port: int, syndrome: int = 0x1F, *,
                 outcome: Optional[str] = None) -> None:
        """An ACK (syndrome 0x1F) or NAK (0x60..) to rank's requester QP, sent from its
        responder's host address into `in_port`: from the responder's own port it passes by
        L2 untouched, from any other it is dropped (rule 2r, `drop_wrong_port`)."""
        spec = self.rings[next(iter(self.rings))]
        c = spec.connections[rank]
        frame = raw(Ether(src=c.dst_mac, dst=c.src_mac)
                    / IP(src=c.dst_ip, dst=c.src_ip, id=0x700 + len(self.steps))
                    / UDP(sport=0xC001, dport=4791, chksum=0)
                    / BTH(opcode=0x11, dqpn=c.src_qpn, psn=c.psn0 + 1)
                    / AETH(syndrome=syndrome, msn=1))
        kind = "ACK" if syndrome == 0x1F else f"NAK {syndrome:#x}"
        if in_port == port_of_ip(c.dst_ip):
            self.forward(frame, in_port, f"{kind} of rank {rank}'s connection from its "
                                         "responder's port")
            return
        self._count(spec, rank, outcome or "drop_wrong_port", 0x11, 0)
        self.steps.append(Step(in_port, frame, (), f"{kind} of rank {rank}'s connection from "
                                                   f"port {in_port}, not its responder's: dropped"))

    def forward(self, frame: bytes, in_port: int, note: str) -> None:
        """A frame no ring owns: L2 sends it unchanged to its MAC's port, or floods it."""
        dst = Ether(frame).dst
        ports = [self.macs[dst]] if dst in self.macs else \
            [p for p in self.setup["ports"] if p != in_port]
        self.steps.append(Step(in_port, frame, tuple((p, frame) for p in ports),
                               f"forwarded: {note}"))

    def vector(self) -> Vector:
        return Vector(self.name, self.description, self.setup, tuple(self.steps), self.tally,
                      self.requires)

    def _sum(self, spec: RingSpec, k: int) -> np.ndarray:
        held = self.slots[spec.ring_id, k]
        assert len(held) == spec.world_size, f"{self.name}: slot {k} is not complete"
        return wrapping_sum([p for _, p, _ in held.values()])

    def _results(self, spec: RingSpec, k: int) -> list[tuple[int, bytes]]:
        """Each rank's header at k, the payload the sum, the PSN psn0 + its re-cuts + k."""
        total = self._sum(spec, k)
        held = self.slots[spec.ring_id, k]
        return [(port_of_ip(c.dst_ip),
                 write_frame(c, k, held[c.rank][0], total, **{
                     **held[c.rank][2],
                     "psn": (c.psn0 + self.shift[spec.ring_id, c.rank] + k) & 0xFFFFFF}))
                for c in spec.connections]

    def _count(self, spec: RingSpec, rank: int, outcome: str, opcode: int, completed: int) -> None:
        t = self.tally[spec.ring_id]
        conn, ring = t["connections"][rank], t["counters"]
        conn["packets"] += 1
        conn[outcome] += 1
        ring[outcome] += 1
        if outcome == "aggregated" and opcode in RETH_OPS:
            conn["messages"] += 1
        ring["completed"] += completed
        ring["results_sent"] += completed * spec.world_size


def ring2_write_only_imm() -> Vector:
    s = Scenario("ring2_write_only_imm", "2 ranks, three 256 B WRITE_ONLY_WITH_IMM messages",
                 [(make_ring(2, msg_size=MTU), 256)], hosts=2)
    for k in range(3):
        kw = {"ackreq": True, "imm": 0x100 + k, "reth": (0x10000 * k, 7, MTU)}
        s.write(0, k, WRITE_ONLY_IMM, **kw)
        s.write(1, k, WRITE_ONLY_IMM, emits=[k], **kw)
    return s.vector()


def ring3_first_middle_last() -> Vector:
    s = Scenario("ring3_first_middle_last",
                 "3 ranks, a 1 KiB message FIRST/MIDDLE/MIDDLE/LAST_WITH_IMM then a 512 B "
                 "FIRST/LAST, ranks arriving in a different order for every packet",
                 [(make_ring(3, msg_size=4 * MTU), 256)], hosts=3)
    ops = [WRITE_FIRST, WRITE_MIDDLE, WRITE_MIDDLE, WRITE_LAST_IMM, WRITE_FIRST, WRITE_LAST]
    for k, op in enumerate(ops):
        kw = {"ackreq": op in (WRITE_LAST_IMM, WRITE_LAST), "ip_id": 0x500 + k,
              "reth": (0x7F0000000000 + 0x1000 * (k // 4), 0x99, 4 * MTU if k < 4 else 2 * MTU)}
        order = [(k + r) % 3 for r in range(3)]
        for r in order[:-1]:
            s.write(r, k, op, **kw)
        s.write(order[-1], k, op, emits=[k], **kw)
    return s.vector()


def ring4_out_of_order_completion() -> Vector:
    s = Scenario("ring4_out_of_order_completion",
                 "4 ranks, two FIRST/LAST messages; slots 3, 2, 1 complete before slot 0 and "
                 "wait; slot 0 completing releases 0, 1, 2, 3 in PSN order",
                 [(make_ring(4, msg_size=2 * MTU), 256)], hosts=4)
    ops = [WRITE_FIRST, WRITE_LAST, WRITE_FIRST, WRITE_LAST]
    for r in range(3):
        for k, op in enumerate(ops):
            s.write(r, k, op, ackreq=op == WRITE_LAST)
    for k in (3, 2, 1):
        s.write(3, k, ops[k], ackreq=ops[k] == WRITE_LAST)
    s.write(3, 0, WRITE_FIRST, emits=[0, 1, 2, 3])
    return s.vector()


def ring3_duplicates_and_retransmissions() -> Vector:
    s = Scenario("ring3_duplicates_and_retransmissions",
                 "a duplicate before emission is dropped (not added twice); after emission a "
                 "retransmission gets the result on its own connection only, with its own "
                 "header (new IP ID, AckReq); go-back-N over two emitted slots",
                 [(make_ring(3, msg_size=2 * MTU), 256)], hosts=3)
    s.write(0, 0, WRITE_FIRST)
    s.write(0, 0, WRITE_FIRST, outcome="drop_duplicate",
            data=np.full(64, 12345, dtype=np.int32), note="duplicate with another payload")
    s.write(1, 0, WRITE_FIRST)
    s.write(2, 0, WRITE_FIRST, emits=[0])
    s.write(1, 0, WRITE_FIRST, outcome="retransmits_served", ip_id=0x4242, ackreq=True)
    for r in range(3):
        s.write(r, 1, WRITE_LAST, ackreq=True, emits=[1] if r == 2 else [])
    s.write(2, 0, WRITE_FIRST, outcome="retransmits_served", ip_id=7)
    s.write(2, 1, WRITE_LAST, outcome="retransmits_served", ip_id=8, ackreq=True)
    s.write(0, 2, WRITE_FIRST)
    s.write(0, 2, WRITE_FIRST, outcome="drop_duplicate")
    return s.vector()


def ring2_overrun_and_stale() -> Vector:
    s = Scenario("ring2_overrun_and_stale",
                 "N = 2 slots (window 1 x 1 packet): a packet N ahead of an unemitted slot is "
                 "an overrun; once emitted the slot is re-used; a packet N or more past next_emit is "
                 "an overrun, one older than a re-used slot is stale",
                 [(make_ring(2, msg_size=MTU, window=1), 2)], hosts=2)
    s.write(0, 0)
    s.write(0, 2, outcome="drop_overrun")
    s.write(1, 0, emits=[0])
    s.write(0, 2)
    s.write(1, 0, outcome="drop_stale", note="k=0 after its slot moved on to k=2")
    s.write(1, 6, outcome="drop_overrun", note="k=6 is N or more past next_emit=1")
    s.write(1, 1)
    s.write(0, 1, emits=[1])
    s.write(1, 2, emits=[2])
    s.write(0, 4, note="slot 0 re-used again: k=2 was emitted")
    s.write(1, 3)
    s.write(0, 3, emits=[3])
    s.write(1, 4, emits=[4])
    return s.vector()


def ring2_psn_wrap() -> Vector:
    s = Scenario("ring2_psn_wrap", "initial PSNs 0xFFFFFE and 0xFFFFFF: relative PSNs run "
                 "on across the 24-bit wrap", [(make_ring(2, psn0=[0xFFFFFE, 0xFFFFFF]), 256)],
                 hosts=2)
    for k in range(4):
        s.write(1, k, WRITE_MIDDLE)
        s.write(0, k, WRITE_MIDDLE, emits=[k])
    return s.vector()


def ring3_bad_packets() -> Vector:
    s = Scenario("ring3_bad_packets",
                 "wrong ingress port, SEND instead of WRITE, and contributions unlike the "
                 "slot's first (other opcode) are dropped without touching the slot",
                 [(make_ring(3, msg_size=2 * MTU), 256)], hosts=3)
    s.write(0, 0, WRITE_FIRST, port=lab_port(2), outcome="drop_wrong_port")
    s.write(0, 0, SEND_ONLY, outcome="drop_bad_opcode")
    s.write(0, 0, WRITE_FIRST)
    s.write(1, 0, WRITE_ONLY, outcome="drop_mismatch")
    s.write(1, 0, WRITE_FIRST)
    s.write(2, 0, WRITE_FIRST, port=lab_port(0), outcome="drop_wrong_port")
    s.write(2, 0, WRITE_FIRST, emits=[0])
    return s.vector()


def forwarding_untouched() -> Vector:
    spec = make_ring(2)
    s = Scenario("forwarding_untouched", "ACKs, ARP, TCP, other QPs and unregistered hosts "
                 "pass by L2, byte for byte, and touch no counter", [(spec, 256)], hosts=3)
    c = spec.connections[0]
    s.forward(raw(Ether(src=c.dst_mac, dst=c.src_mac) / IP(src=c.dst_ip, dst=c.src_ip, id=3)
                  / UDP(sport=0xC001, dport=4791, chksum=0)
                  / BTH(opcode=0x11, dqpn=c.src_qpn, psn=c.psn0) / AETH(syndrome=0x1F, msn=1)),
              lab_port(1), "ACK from rank 1 to rank 0")
    s.forward(raw(Ether(src=c.src_mac, dst=BROADCAST) / ARP(psrc=c.src_ip, pdst=c.dst_ip)),
              lab_port(0), "ARP request, flooded")
    s.forward(raw(Ether(src=c.dst_mac, dst=c.src_mac)
                  / ARP(op=2, psrc=c.dst_ip, pdst=c.src_ip, hwsrc=c.dst_mac, hwdst=c.src_mac)),
              lab_port(1), "ARP reply")
    s.forward(raw(Ether(src=c.src_mac, dst=c.dst_mac) / IP(src=c.src_ip, dst=c.dst_ip)
                  / TCP(sport=40000, dport=18515) / Raw(bytes(64))), lab_port(0), "TCP")
    s.forward(raw(Ether(src=c.src_mac, dst=c.dst_mac) / IP(src=c.src_ip, dst=c.dst_ip,
                                                           chksum=0xBAD)
                  / TCP(sport=40001, dport=18515) / Raw(bytes(8))), lab_port(0),
              "TCP with a bad IPv4 checksum: not the switch's to judge")
    other = make_ring(2, qpn_base=0x70).connections[0]
    s.forward(write_frame(other, 0, WRITE_ONLY, bytes(MTU)), lab_port(0), "a QP of no ring")
    stranger = make_ring(3, hosts=[2, 0, 1]).connections[0]
    s.forward(write_frame(stranger, 0, WRITE_ONLY, bytes(MTU)), lab_port(2),
              "host 2, in no ring")
    return s.vector()


def ring3_responses_from_the_responder_only() -> Vector:
    spec = make_ring(3, msg_size=MTU)
    s = Scenario("ring3_responses_from_the_responder_only",
                 "ACKs and NAKs to a registered connection's requester pass untouched from "
                 "its responder's port only; the same frames from another rank's port or an "
                 "unregistered host's are dropped and counted (drop_wrong_port, rule 2r); "
                 "the ring still sums", [(spec, 256)], hosts=4)
    s.write(0, 0)
    s.response(0, lab_port(1))                        # h1 answers h0's WRITE
    s.response(0, lab_port(2))                        # forged by rank 2's host
    s.response(0, lab_port(3), 0x60)                  # a NAK forged by a host of no ring
    s.response(0, lab_port(1), 0x60)                  # the responder's own NAK
    s.write(1, 0)
    s.response(2, lab_port(1))                        # rank 2's responder is h0, not h1
    s.response(2, lab_port(0))
    s.write(2, 0, emits=[0])
    return s.vector()


def two_rings_same_hosts() -> Vector:
    a = make_ring(4, ring_id="a", msg_size=MTU)
    b = make_ring(2, ring_id="b", msg_size=MTU, hosts=[1, 0], qpn_base=0x60)
    s = Scenario("two_rings_same_hosts", "ring a over hosts 0-3 and ring b over hosts 1, 0 "
                 "with their own QPs, interleaved: each sums only its own",
                 [(a, 256), (b, 256)], hosts=4)
    for k in range(2):
        for r in range(4):
            s.write(r, k, ring="a", emits=[k] if r == 3 else [])
            if r < 2:
                s.write(r, k, ring="b", emits=[k] if r == 1 else [])
    return s.vector()


def ring2_bad_lengths() -> Vector:
    s = Scenario("ring2_bad_lengths", "payloads not a multiple of 4, with pad, longer than "
                 "the path MTU, or cut short are dropped", [(make_ring(2), 256)], hosts=2,
                 requires=[ANY_PAYLOAD_LENGTH])
    s.write(0, 0, WRITE_MIDDLE, data=bytes(254), outcome="drop_bad_length")
    s.write(0, 0, WRITE_MIDDLE, data=bytes(252), pad=2, outcome="drop_bad_length")
    s.write(0, 0, WRITE_MIDDLE, size=MTU + 4, outcome="drop_bad_length")
    s.write(0, 0, WRITE_MIDDLE, mangle=lambda f: f[:-8], outcome="drop_bad_length",
            note="frame 8 bytes shorter than its UDP length")
    s.write(0, 0, WRITE_MIDDLE)
    s.write(1, 0, WRITE_MIDDLE, emits=[0])
    return s.vector()


def ring3_short_last_packet() -> Vector:
    s = Scenario("ring3_short_last_packet", "a 640 B message: FIRST 256, MIDDLE 256, LAST 128; "
                 "a LAST of another length at the same PSN is a mismatch",
                 [(make_ring(3, msg_size=3 * MTU), 256)], hosts=3, requires=[ANY_PAYLOAD_LENGTH])
    for k, (op, size) in enumerate([(WRITE_FIRST, MTU), (WRITE_MIDDLE, MTU), (WRITE_LAST, 128)]):
        kw = {"reth": (0x1000, 5, 640), "ackreq": op == WRITE_LAST}
        s.write(0, k, op, size, **kw)
        s.write(1, k, op, size, **kw)
        if op == WRITE_LAST:
            s.write(2, k, op, 132, outcome="drop_mismatch", **kw)
        s.write(2, k, op, size, emits=[k], **kw)
    return s.vector()


def ring2_verify_before_adding() -> Vector:
    s = Scenario("ring2_verify_before_adding",
                 "contributions with a corrupted payload, RETH or ICRC (drop_bad_icrc), a bad "
                 "IPv4 checksum (drop_bad_ipcsum) or that are IPv4 fragments (drop_fragment) "
                 "are dropped and never summed, before and after their slot was emitted",
                 [(make_ring(2, msg_size=2 * MTU), 256)], hosts=2)
    s.write(0, 0, WRITE_FIRST, mangle=flip(-5), outcome="drop_bad_icrc",
            note="last payload byte flipped")
    s.write(0, 0, WRITE_FIRST, mangle=flip(60, 0x80), outcome="drop_bad_icrc",
            note="RETH VA bit flipped")
    s.write(0, 0, WRITE_FIRST, mangle=flip(-1), outcome="drop_bad_icrc", note="ICRC flipped")
    s.write(0, 0, WRITE_FIRST, mangle=flip(25), outcome="drop_bad_ipcsum",
            note="IPv4 checksum flipped (the ICRC masks it: still valid)")
    s.write(0, 0, WRITE_FIRST, mangle=flip(18), outcome="drop_bad_ipcsum",
            note="IPv4 ID flipped, checksum left")
    s.write(0, 0, WRITE_FIRST, mangle=resigned(flags="MF"), outcome="drop_fragment",
            note="MF set, checksum and ICRC valid")
    s.write(0, 0, WRITE_FIRST, mangle=resigned(flags=0, frag=32), outcome="drop_fragment",
            note="fragment offset 32, checksum and ICRC valid")
    s.write(0, 0, WRITE_FIRST)
    s.write(1, 0, WRITE_FIRST, mangle=flip(100, 0x40), outcome="drop_bad_icrc",
            note="rank 1's payload corrupted: not added, the slot stays incomplete")
    s.write(1, 0, WRITE_FIRST, emits=[0])
    s.write(1, 0, WRITE_FIRST, mangle=flip(-40), outcome="drop_bad_icrc",
            note="a corrupted retransmission of an emitted slot is not served")
    s.write(1, 0, WRITE_FIRST, mangle=resigned(flags="MF"), outcome="drop_fragment",
            note="nor a fragment")
    s.write(1, 0, WRITE_FIRST, outcome="retransmits_served", ip_id=9)
    return s.vector()


def ring2_udp_checksum_zero() -> Vector:
    s = Scenario("ring2_udp_checksum_zero",
                 "contributions with a UDP checksum set (rxe sends 0; the ICRC masks it): "
                 "results and served retransmissions carry UDP checksum 0",
                 [(make_ring(2, msg_size=MTU), 256)], hosts=2)
    for k in range(2):
        s.write(0, k, WRITE_ONLY, mangle=udp_checksum(0x1234 + k), ackreq=True)
        s.write(1, k, WRITE_ONLY, mangle=udp_checksum(0xFFFF), ackreq=True, emits=[k])
    s.write(0, 1, WRITE_ONLY, mangle=udp_checksum(0xBEEF), outcome="retransmits_served",
            ackreq=True)
    return s.vector()


def ring2_every_opcode_short_payloads() -> Vector:
    s = Scenario("ring2_every_opcode_short_payloads",
                 "every RDMA WRITE opcode with payloads of 0 to 256 B (multiples of 4)",
                 [(make_ring(2, msg_size=MTU), 256)], hosts=2, requires=[ANY_PAYLOAD_LENGTH])
    ops = [WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM]
    sizes = [0, 4, 8, 12, 28, 60, 64, 100, 124, 128, 252, 256]
    for k, size in enumerate(sizes):
        op = ops[k % len(ops)]
        kw = {"imm": 0xA0 + k, "reth": (0x1000 * k, 3, size)}
        s.write(0, k, op, size, **kw)
        s.write(1, k, op, size, emits=[k], **kw)
    return s.vector()


def ring3_recut_streams() -> Vector:
    s = Scenario("ring3_recut_streams",
                 "rxe re-cuts a stream (docs/roce.md): an empty WRITE_ONLY is passed on "
                 "untouched and moves its rank's later packets one PSN on (a repeat or an "
                 "older one does not); results leave at psn0 + re-cuts + k, a slot "
                 "contributed before a re-cut and emitted after it too; a served "
                 "retransmission keeps its own PSN",
                 [(make_ring(3, msg_size=2 * MTU), 256)], hosts=3)
    ops = [WRITE_FIRST, WRITE_LAST_IMM]
    psn0 = [c.psn0 for c in s.rings[next(iter(s.rings))].connections]

    def contribute(rank: int, k: int, shift: int, **kw: Any) -> None:
        s.write(rank, k, ops[k % 2], psn=(psn0[rank] + k + shift) & 0xFFFFFF,
                ackreq=k % 2 == 1, **kw)

    for k in (0, 1):
        for r in range(3):
            contribute(r, k, 0, emits=[k] if r == 2 else [])
    s.empty(1, 2, recut=True)
    s.empty(1, 2, WRITE_ONLY, recut=False, note="the same re-cut again (no immediate)")
    for k in (2, 3):
        contribute(0, k, 0)
        contribute(2, k, 0)
        contribute(1, k, 1, emits=[k])
    contribute(1, 2, 1, outcome="retransmits_served", ip_id=0x77)
    contribute(1, 4, 1)                   # message 2's FIRST, before a second re-cut
    s.empty(1, 6, recut=True)
    s.empty(1, 2, recut=False, note="an older re-cut's empty, late")
    contribute(0, 4, 0)
    contribute(2, 4, 0, emits=[4])        # rank 1's result at psn0 + 2 + 4
    contribute(1, 5, 2)
    contribute(0, 5, 0)
    contribute(2, 5, 0, emits=[5])
    contribute(1, 5, 2, outcome="retransmits_served")
    return s.vector()


SCENARIOS = (ring2_write_only_imm, ring3_first_middle_last, ring4_out_of_order_completion,
             ring3_duplicates_and_retransmissions, ring2_overrun_and_stale, ring2_psn_wrap,
             ring3_bad_packets, forwarding_untouched, ring3_responses_from_the_responder_only,
             two_rings_same_hosts, ring2_bad_lengths,
             ring3_short_last_packet, ring2_verify_before_adding, ring2_udp_checksum_zero,
             ring2_every_opcode_short_payloads, ring3_recut_streams)


def all_vectors() -> list[Vector]:
    return [make() for make in SCENARIOS]


def every_opcode_every_length() -> Vector:
    """Not one of SCENARIOS (hundreds of steps): test_conformance feeds it in bursts."""
    s = Scenario("every_opcode_every_length",
                 "every RDMA WRITE opcode with every payload length 0 .. 256 B (multiples "
                 "of 4; not an empty ONLY), two ranks: each result's bytes, ICRC included",
                 [(make_ring(2, msg_size=MTU), 256)], hosts=2, requires=[ANY_PAYLOAD_LENGTH])
    ops = [WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM]
    k = 0
    for op in ops:
        for size in range(0, MTU + 4, 4):
            if size == 0 and op in (WRITE_ONLY, WRITE_ONLY_IMM):
                continue                  # an empty one-packet WRITE re-cuts (its own vector)
            kw = {"imm": 0x5000 + k, "reth": (0x10000 + k, 0x77, size), "ackreq": k % 3 == 0,
                  "ip_id": k}
            s.write(0, k, op, size, **kw)
            s.write(1, k, op, size, emits=[k], **kw)
            k += 1
    return s.vector()


if __name__ == "__main__":
    out = to_json(all_vectors())
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(out)
    else:
        print(out)
