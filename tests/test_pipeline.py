"""AggregationPipeline on scapy-crafted RoCE packets: sums, ordering, drops, registration."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

import numpy as np
import pytest
from scapy.compat import raw
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from nr_contract.spec import CONN_COUNTERS, RING_COUNTERS, RingSpec
from switch.dataplane.pipeline import AggregationPipeline
from tests.roce_layers import (WRITE_FIRST, WRITE_LAST, WRITE_LAST_IMM, WRITE_MIDDLE, WRITE_ONLY,
                               WRITE_ONLY_IMM, icrc_ok, ip_ports, lab_port, make_ring, wrapping_sum,
                               write_frame)

INT32_EXTREMES = np.array([2**31 - 1, -2**31, -1, 1], dtype=np.int32)


def payload(seed: int, nbytes: int) -> np.ndarray:
    """Random int32s that start with the extremes, so sums wrap."""
    p = np.random.default_rng(seed).integers(-2**31, 2**31, nbytes // 4, dtype=np.int32)
    p[:4] = INT32_EXTREMES[:len(p[:4])]
    return p


class Rig:
    """A pipeline with `spec` registered on the lab ports; records what each send emits."""

    def __init__(self, spec: RingSpec, slots: int = 256):
        self.spec = spec
        self.pipe = AggregationPipeline()
        self.pipe.register_ring(spec, ip_ports(spec), slots)

    def send(self, frame: bytes, port: int) -> tuple[bool, list[tuple[int, bytes]]]:
        out: list[tuple[int, bytes]] = []
        buf = bytearray(frame)                      # the dataplane re-uses its buffer
        took = self.pipe.process(memoryview(buf), port,
                                 lambda p, parts: out.append((p, b"".join(parts))))
        buf[:] = bytes(len(buf))
        return took, out

    def push(self, rank: int, k: int, opcode: int, data: np.ndarray | bytes,
             port: Optional[int] = None, **kw: Any) -> list[tuple[int, bytes]]:
        """Rank's packet k into the switch (from its own port by default): what came out."""
        c = self.spec.connections[rank]
        took, out = self.send(write_frame(c, k, opcode, data, **kw),
                              ip_ports(self.spec)[c.src_ip] if port is None else port)
        assert took
        return out

    def result(self, rank: int, k: int, opcode: int, total: np.ndarray,
               **kw: Any) -> tuple[int, bytes]:
        """What the switch must send for rank's connection at k: its packet, payload = total."""
        c = self.spec.connections[rank]
        return ip_ports(self.spec)[c.dst_ip], write_frame(c, k, opcode, total, **kw)

    def ring_counters(self) -> dict[str, int]:
        return self.pipe.counters()[self.spec.ring_id]["counters"]

    def conn_counters(self, rank: int) -> dict[str, int]:
        return self.pipe.counters()[self.spec.ring_id]["connections"][rank]["counters"]


# two messages at MTU 1024: 3.5 KiB FIRST/MIDDLE/MIDDLE/LAST_WITH_IMM, then a 768 B ONLY_WITH_IMM
MESSAGES = [(WRITE_FIRST, 1024), (WRITE_MIDDLE, 1024), (WRITE_MIDDLE, 1024),
            (WRITE_LAST_IMM, 512), (WRITE_ONLY_IMM, 768)]


def message_kw(k: int) -> dict[str, Any]:
    last = k in (3, 4)
    return {"ackreq": last, "ip_id": 100 + k,
            "reth": (0x7F0000000000 + 0x10000 * (k // 4), 0x77, 3584 if k < 4 else 768)}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_ring_sums_multi_packet_messages(n: int) -> None:
    rig = Rig(make_ring(n, mtu=1024, msg_size=4096, window=2))
    for k, (opcode, size) in enumerate(MESSAGES):
        data = [payload(100 * k + r, size) for r in range(n)]
        order = [(r + k) % n for r in range(n)]             # every rank completes some slot
        for r in order[:-1]:
            assert rig.push(r, k, opcode, data[r], **message_kw(k)) == []
        out = rig.push(order[-1], k, opcode, data[order[-1]], **message_kw(k))
        total = wrapping_sum(data)
        assert out == [rig.result(r, k, opcode, total, **message_kw(k)) for r in range(n)]
        assert all(icrc_ok(f) for _, f in out)
        sent = np.frombuffer(Ether(out[0][1])[Raw].load, "<i4")
        assert sent.tobytes() == total.astype("<i4").tobytes()
    assert rig.ring_counters() == {**dict.fromkeys(RING_COUNTERS, 0), "aggregated": 5 * n,
                                   "completed": 5, "results_sent": 5 * n}
    conn = rig.pipe.counters()["ring"]["connections"][n - 1]
    assert conn["counters"] == {**dict.fromkeys(CONN_COUNTERS, 0), "packets": 5,
                                "messages": 2, "aggregated": 5}
    assert conn["reth"] == {"va": 0x7F0000010000, "rkey": 0x77, "dma_len": 768}


def test_duplicate_is_never_added_twice() -> None:
    rig = Rig(make_ring(3))
    data = [payload(r, 256) for r in range(3)]
    rig.push(0, 0, WRITE_ONLY, data[0])
    assert rig.push(0, 0, WRITE_ONLY, payload(99, 256)) == []      # retransmission, not summed
    rig.push(1, 0, WRITE_ONLY, data[1])
    out = rig.push(2, 0, WRITE_ONLY, data[2])
    assert out == [rig.result(r, 0, WRITE_ONLY, wrapping_sum(data)) for r in range(3)]
    assert rig.ring_counters()["drop_duplicate"] == rig.conn_counters(0)["drop_duplicate"] == 1


def test_retransmission_to_emitted_slot_is_answered_on_its_own_connection() -> None:
    rig = Rig(make_ring(3))
    data = [payload(r, 256) for r in range(3)]
    for r in range(3):
        rig.push(r, 0, WRITE_ONLY_IMM, data[r])
    out = rig.push(1, 0, WRITE_ONLY_IMM, data[1], ip_id=4242, ackreq=True)
    assert out == [rig.result(1, 0, WRITE_ONLY_IMM, wrapping_sum(data), ip_id=4242, ackreq=True)]
    assert out[0][0] == lab_port(2) and icrc_ok(out[0][1])
    assert rig.ring_counters()["retransmits_served"] == 1
    assert rig.conn_counters(1)["retransmits_served"] == 1
    assert rig.ring_counters()["results_sent"] == 3


def test_out_of_order_completion_waits_for_the_gap() -> None:
    rig = Rig(make_ring(2))
    data = {(r, k): payload(10 * k + r, 256) for r in range(2) for k in range(3)}
    ops = [WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST]
    rig.push(0, 0, ops[0], data[0, 0])
    for k in (1, 2):
        for r in range(2):
            assert rig.push(r, k, ops[k], data[r, k]) == []
    out = rig.push(1, 0, ops[0], data[1, 0])
    want = [rig.result(r, k, ops[k], wrapping_sum([data[0, k], data[1, k]]))
            for k in range(3) for r in range(2)]
    assert out == want
    assert rig.pipe.counters()["ring"]["next_emit"] == 3


def test_overrun_and_stale_packets_are_dropped() -> None:
    rig = Rig(make_ring(2, mtu=256, msg_size=256, window=1), slots=2)
    d = payload(1, 256)
    rig.push(0, 0, WRITE_ONLY, d)
    assert rig.push(0, 2, WRITE_ONLY, d) == []                     # slot 0 still waits for k=0
    assert rig.ring_counters()["drop_overrun"] == 1
    assert len(rig.push(1, 0, WRITE_ONLY, d)) == 2
    rig.push(0, 2, WRITE_ONLY, d)                                  # slot 0 re-used for k=2
    assert rig.push(1, 0, WRITE_ONLY, d) == []                     # too old now
    assert rig.push(1, 6, WRITE_ONLY, d) == []                     # N or more past next_emit
    assert rig.ring_counters()["drop_stale"] == rig.conn_counters(1)["drop_stale"] == 1
    assert rig.ring_counters()["drop_overrun"] == 2
    assert rig.ring_counters()["aggregated"] == 3


def test_psn_wraps_at_24_bits() -> None:
    rig = Rig(make_ring(2, psn0=[0xFFFFFE, 0xFFFFFD]))
    for k in range(4):
        data = [payload(k * 2 + r, 256) for r in range(2)]
        rig.push(0, k, WRITE_MIDDLE, data[0])
        out = rig.push(1, k, WRITE_MIDDLE, data[1])
        assert out == [rig.result(r, k, WRITE_MIDDLE, wrapping_sum(data)) for r in range(2)]
    assert Ether(out[0][1])[BTH].psn == 1 and Ether(out[1][1])[BTH].psn == 0


def test_traffic_the_switch_was_not_told_about_is_forwarded() -> None:
    spec = make_ring(2)
    rig = Rig(spec)
    c = spec.connections[0]
    other_qp = dataclasses.replace(c, dst_qpn=0x999)
    stranger = dataclasses.replace(c, src_ip="10.77.0.9")
    frames = [
        raw(Ether(src=c.dst_mac, dst=c.src_mac) / IP(src=c.dst_ip, dst=c.src_ip)
            / UDP(sport=0xC001, dport=4791, chksum=0) / BTH(opcode=0x11, dqpn=c.src_qpn, psn=0)
            / AETH(syndrome=0x1F, msn=1)),
        raw(Ether(src=c.src_mac, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=c.src_ip, pdst=c.dst_ip)),
        raw(Ether(src=c.src_mac, dst=c.dst_mac) / IP(src=c.src_ip, dst=c.dst_ip)
            / TCP(sport=4791, dport=4791) / Raw(bytes(300))),
        write_frame(other_qp, 0, WRITE_ONLY, payload(0, 256)),
        write_frame(stranger, 0, WRITE_ONLY, payload(0, 256)),
    ]
    ports = [lab_port(1)] + [lab_port(0)] * 4      # the ACK from its responder's port
    for f, port in zip(frames, ports):
        assert rig.send(f, port) == (False, [])
    assert rig.conn_counters(0) == dict.fromkeys(CONN_COUNTERS, 0)


def test_a_response_from_another_port_than_the_responders_is_dropped() -> None:
    rig = Rig(make_ring(3))
    c = rig.spec.connections[0]
    ack = raw(Ether(src=c.dst_mac, dst=c.src_mac) / IP(src=c.dst_ip, dst=c.src_ip)
              / UDP(sport=0xC001, dport=4791, chksum=0) / BTH(opcode=0x11, dqpn=c.src_qpn, psn=5)
              / AETH(syndrome=0x1F, msn=1))
    assert rig.send(ack, lab_port(1)) == (False, [])       # rank 1 is rank 0's responder
    assert rig.send(ack, lab_port(0)) == (True, [])
    assert rig.send(ack, lab_port(2)) == (True, [])
    assert rig.conn_counters(0)["drop_wrong_port"] == 2
    assert rig.conn_counters(0)["packets"] == 2


def test_packet_from_the_wrong_port_is_dropped() -> None:
    rig = Rig(make_ring(3))
    assert rig.push(0, 0, WRITE_ONLY, payload(0, 256), port=lab_port(1)) == []
    assert rig.conn_counters(0)["drop_wrong_port"] == 1
    assert rig.ring_counters()["aggregated"] == 0


@pytest.mark.parametrize("opcode", [0x04, 0x00, 0x0C])        # SEND_ONLY, SEND_FIRST, READ_REQ
def test_opcode_other_than_rc_write_is_dropped(opcode: int) -> None:
    rig = Rig(make_ring(2))
    assert rig.push(0, 0, opcode, bytes(256)) == []
    assert rig.ring_counters()["drop_bad_opcode"] == 1


@pytest.mark.parametrize("data,kw", [
    (bytes(254), {}),                                 # not a multiple of 4
    (bytes(252), {"pad": 2}),                         # pad != 0
    (bytes(260), {}),                                 # longer than the path MTU (256)
], ids=["odd-length", "pad", "over-mtu"])
def test_bad_length_is_dropped(data: bytes, kw: dict[str, Any]) -> None:
    rig = Rig(make_ring(2))
    assert rig.push(0, 0, WRITE_MIDDLE, data, **kw) == []
    assert rig.ring_counters()["drop_bad_length"] == rig.conn_counters(0)["drop_bad_length"] == 1


def test_truncated_frame_is_dropped() -> None:
    rig = Rig(make_ring(2))
    frame = write_frame(rig.spec.connections[0], 0, WRITE_MIDDLE, bytes(256))
    assert rig.send(frame[:-8], lab_port(0)) == (True, [])
    assert rig.ring_counters()["drop_bad_length"] == 1


@pytest.mark.parametrize("opcode,size", [(WRITE_LAST, 256), (WRITE_MIDDLE, 128)])
def test_contribution_unlike_the_slots_first_is_dropped(opcode: int, size: int) -> None:
    rig = Rig(make_ring(3))
    rig.push(0, 0, WRITE_MIDDLE, bytes(256))
    assert rig.push(1, 0, opcode, bytes(size)) == []
    assert rig.ring_counters()["drop_mismatch"] == 1
    assert rig.ring_counters()["aggregated"] == 1


def test_two_rings_on_the_same_hosts_stay_apart() -> None:
    a, b = make_ring(2, ring_id="a"), make_ring(2, ring_id="b", qpn_base=0x40)
    pipe = AggregationPipeline()
    pipe.register_ring(a, ip_ports(a))
    pipe.register_ring(b, ip_ports(b))
    out: list[tuple[int, bytes]] = []
    emit = lambda p, parts: out.append((p, b"".join(parts)))  # noqa: E731
    da, db = [payload(r, 256) for r in range(2)], [payload(10 + r, 256) for r in range(2)]
    for spec, data in ((a, da), (b, db)):
        pipe.process(memoryview(write_frame(spec.connections[0], 0, WRITE_ONLY, data[0])), 1, emit)
    assert out == []
    pipe.process(memoryview(write_frame(b.connections[1], 0, WRITE_ONLY, db[1])), 2, emit)
    assert [f for _, f in out] == [write_frame(c, 0, WRITE_ONLY, wrapping_sum(db))
                                   for c in b.connections]
    assert pipe.counters()["a"]["counters"]["completed"] == 0


def test_unregistered_ring_traffic_is_forwarded() -> None:
    rig = Rig(make_ring(2))
    rig.pipe.unregister_ring("ring")
    frame = write_frame(rig.spec.connections[0], 0, WRITE_ONLY, bytes(256))
    assert rig.send(frame, lab_port(0)) == (False, [])
    assert rig.pipe.counters() == {}
    with pytest.raises(KeyError, match="not registered"):
        rig.pipe.unregister_ring("ring")


@pytest.mark.parametrize("change,slots,match", [
    ({}, 256, r"256 slots < 2 x 129 packets in flight \(window 4 x 256 .*129\): needs 512"),
    ({"window": 4, "msg_size": 1024}, 16, r"16 slots < 2 x 16 packets in flight"),
    ({}, 384, "power of two"),
    ({}, 2048, "power of two <= 1024"),
    ({"mtu": 300, "msg_size": 1200}, 256, "path MTU 300"),
], ids=["rxe-window", "flow-window", "not-pow2", "too-many", "mtu"])
def test_registration_checks_slots_and_mtu(change: dict[str, Any], slots: int, match: str) -> None:
    spec = dataclasses.replace(make_ring(2, msg_size=65536, window=4), **change)
    with pytest.raises(ValueError, match=match):
        AggregationPipeline().register_ring(spec, ip_ports(spec), slots)


def test_small_window_needs_only_twice_its_packets() -> None:
    spec = make_ring(2, mtu=256, msg_size=1024, window=2)        # 8 packets in flight
    AggregationPipeline().register_ring(spec, ip_ports(spec), 16)


def test_registration_rejects_more_than_32_ranks() -> None:
    spec = make_ring(33, hosts=[h % 4 for h in range(33)])
    with pytest.raises(ValueError, match="33 ranks, need 2..32"):
        AggregationPipeline().register_ring(spec, ip_ports(spec))


def test_registration_rejects_a_connection_another_ring_has() -> None:
    pipe = AggregationPipeline()
    a = make_ring(2, ring_id="a")
    pipe.register_ring(a, ip_ports(a))
    b = make_ring(3, ring_id="b")                                 # rank 0 -> 1 is a's too
    with pytest.raises(ValueError, match="already registered by ring a"):
        pipe.register_ring(b, ip_ports(b))
    assert list(pipe.counters()) == ["a"]


def test_registration_needs_a_port_for_every_rank() -> None:
    spec = make_ring(3)
    ports = ip_ports(spec)
    del ports["10.77.0.2"]
    with pytest.raises(ValueError, match="no switch port for 10.77.0.2"):
        AggregationPipeline().register_ring(spec, ports)


def test_registering_the_same_ring_twice_is_idempotent_but_not_a_different_one() -> None:
    spec = make_ring(2)
    rig = Rig(spec)
    rig.push(0, 0, WRITE_ONLY, bytes(256))
    rig.pipe.register_ring(spec, ip_ports(spec), 256)
    assert rig.ring_counters()["aggregated"] == 1                 # state kept
    with pytest.raises(ValueError, match="already registered differently"):
        rig.pipe.register_ring(spec, ip_ports(spec), 512)


def test_counters_are_json() -> None:
    rig = Rig(make_ring(2))
    rig.push(0, 0, WRITE_FIRST, bytes(256))
    snap = json.loads(json.dumps(rig.pipe.counters()))
    ring = snap["ring"]
    assert (ring["world_size"], ring["slots"], ring["next_emit"]) == (2, 256, 0)
    c0 = ring["connections"][0]
    assert (c0["rank"], c0["src_ip"], c0["dst_ip"], c0["in_port"], c0["out_port"]) == \
        (0, "10.77.0.1", "10.77.0.2", 1, 2)
    assert c0["counters"]["messages"] == 1 and c0["reth"]["dma_len"] == 1024
