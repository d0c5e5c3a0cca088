"""Conformance vectors for the two roles of a two-tier fabric (docs/multirack.md): a ToR and
the spine, each driven frame by frame in the Vector/Step format of conformance.format.

Expected frames and counters come from the models (tests/conformance/tor_model.py,
spine_model.py; role_model.py what both share), written from docs/multirack.md's rules,
never from switch/dataplane/tor.py or spine.py: host-facing frames are the ranks'
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

import sys
from pathlib import Path
from typing import Callable

import numpy as np
from scapy.compat import raw
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from nr_contract.spec import PSN_MASK
from switch.dataplane import interswitch
from switch.dataplane.interswitch import Kind, ring_tag
from tests.conformance.format import ANY_PAYLOAD_LENGTH, Vector, to_json
from tests.conformance.role_model import (FAR_AHEAD, HALF_AHEAD, MANY_CARRIED, UPLINK, ack,
                                          arp_request, role)
from tests.conformance.spine_model import SpineModel
from tests.conformance.tor_model import TorModel
from tests.conformance.vectors import MTU, SEND_ONLY, flip, resigned
from tests.roce_layers import (WRITE_FIRST, WRITE_LAST, WRITE_LAST_IMM, WRITE_MIDDLE, WRITE_ONLY,
                               WRITE_ONLY_IMM, make_ring, write_frame)


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
