"""Hostile frames against the real switch process: a bounded property-based fuzz, spoofed
source MACs, forged ACKs, a flood of new MACs, and a fault in the aggregation code (issues 12
and 39)."""
from __future__ import annotations

import random
import socket
import struct
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.compat import raw
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from nr_contract.client import ControllerClient, ControllerError
from nr_contract.spec import RingSpec
from tests.hostile.netns import SwitchRig
from tests.roce_layers import WRITE_ONLY, lab_ip, lab_mac, make_ring, wrapping_sum, write_frame

MAC_TABLE_SIZE = 64
PAYLOAD_OFF = 14 + 20 + 8 + 12 + 16        # a WRITE_ONLY's payload: after Eth, IP, UDP, BTH, RETH
FUZZ_EXAMPLES = 600
FUZZ_SECONDS = 18.0         # the fuzz's time box: examples drawn past it send nothing ...
FUZZ_FLOOR = 100            # ... but at least this many must have sent their frames (600 in
#                             9 s on an idle 2-core machine)
VOLUME_FRAMES = 50_000


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SwitchRig]:
    r = SwitchRig(tmp_path_factory.mktemp("hostile-frames"),
                  extra_args=["--mac-table-size", str(MAC_TABLE_SIZE), "--mac-ageing", "600"])
    yield r
    r.close()


def probe(rig: SwitchRig, src: int, dst: int, tag: bytes) -> bool:
    """Does a plain frame from host `src` to host `dst` get through the switch?"""
    frame = (bytes.fromhex(lab_mac(dst).replace(":", "")) + bytes.fromhex(
        lab_mac(src).replace(":", "")) + b"\x88\xb5" + tag.ljust(46, b"\0"))
    rig.drain()
    rig.hosts[src + 1].send(frame)
    return bool(rig.hosts[dst + 1].receive(1, 3.0, lambda f: f == frame))


def aggregate(rig: SwitchRig, spec: RingSpec, k: int, seed: int) -> None:
    """Every rank sends packet k of the ring; every rank's successor gets the exact sum."""
    rng = np.random.default_rng(seed)
    payloads = [rng.integers(-2**31, 2**31, spec.mtu // 4, dtype=np.int64).astype(np.int32)
                for _ in range(spec.world_size)]
    want = wrapping_sum(payloads).astype("<i4").tobytes()
    rig.drain()
    for c, p in zip(spec.connections, payloads):
        rig.hosts[int(c.src_ip.rsplit(".", 1)[1])].send(write_frame(c, k, WRITE_ONLY, p))
    for c in spec.connections:
        at = rig.hosts[int(c.dst_ip.rsplit(".", 1)[1])]
        want_bth = (WRITE_ONLY, c.dst_qpn, (c.psn0 + k) & 0xFFFFFF)
        got = at.receive(1, 5.0, lambda f: len(f) > PAYLOAD_OFF and f[26:30] == socket.inet_aton(
            c.src_ip) and (f[42], *(x & 0xFFFFFF for x in struct.unpack_from("!II", f, 46)))
            == want_bth)
        assert got, f"rank {c.rank}'s result of packet {k} did not reach {c.dst_ip}"
        assert got[0][PAYLOAD_OFF:PAYLOAD_OFF + spec.mtu] == want


def switch_counters(client: ControllerClient) -> dict[str, int]:
    return client.counters(connections=False)["switch"]


# -- the fuzz --------------------------------------------------------------------------------
FUZZ_RING = make_ring(3, ring_id="fuzzed", qpn_base=0x500)


def _valid_frame(draw, conn_index: int) -> bytes:
    c = FUZZ_RING.connections[conn_index]
    return write_frame(c, draw(st.integers(0, 600)), draw(st.sampled_from([6, 7, 8, 9, 10, 11])),
                       bytes(draw(st.sampled_from([0, 4, 64, 252, 256]))),
                       pad=draw(st.integers(0, 3)))


@st.composite
def hostile_frame(draw) -> tuple[int, bytes]:
    """(host port, frame): random bytes, or a registered connection's frame cut short,
    with bytes flipped, or with one header field overwritten (IHL, ethertype, lengths,
    opcode, PadCnt, PSN, source MAC)."""
    port = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(["random", "truncated", "flipped", "field", "new_mac"]))
    if kind == "random":
        return port, draw(st.binary(min_size=14, max_size=1514))
    frame = bytearray(_valid_frame(draw, draw(st.integers(0, 2))))
    if kind == "truncated":
        return port, bytes(frame[:draw(st.integers(14, len(frame)))])
    if kind == "flipped":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(frame) - 1))
            frame[i] = draw(st.integers(0, 255))
        return port, bytes(frame)
    if kind == "new_mac":
        frame[6:12] = draw(st.binary(min_size=6, max_size=6))
        return port, bytes(frame)
    offset, size = draw(st.sampled_from([(12, 2), (14, 1), (16, 2), (23, 1), (36, 2), (38, 2),
                                         (42, 1), (43, 1), (46, 4), (50, 4), (62, 4)]))
    frame[offset:offset + size] = draw(st.binary(min_size=size, max_size=size))
    return port, bytes(frame)


def volume_pass(rig: SwitchRig, count: int, seed: int = 12) -> int:
    """`count` frames of the fuzzed ring, each cut short and/or with 1-4 random bytes
    overwritten, from random ports (many more than hypothesis can draw in the time)."""
    rng = random.Random(seed)
    templates = [write_frame(c, k, op, bytes(256)) for c in FUZZ_RING.connections
                 for k in (0, 1, 255, 256) for op in (6, 7, 8, 10)]
    sent = 0
    for i in range(count):
        frame = bytearray(rng.choice(templates))
        for _ in range(rng.randint(1, 4)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        cut = len(frame) if rng.random() < 0.7 else rng.randrange(14, len(frame))
        try:
            rig.hosts[rng.randint(1, 4)].send(bytes(frame[:cut]))
            sent += 1
        except OSError:
            pass
        if i % 2000 == 1999:
            rig.drain()
    return sent


def test_fuzzed_frames_leave_the_switch_forwarding_with_bounded_state(
        rig: SwitchRig, alice: ControllerClient) -> None:
    alice.register_ring(FUZZ_RING, lease_ms=600_000)
    rss0 = rig.rss_kib()
    sent, examples = [0], [0]
    t0 = time.monotonic()

    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(hostile_frame(), min_size=1, max_size=32))
    def fuzz(frames: list[tuple[int, bytes]]) -> None:
        if time.monotonic() - t0 > FUZZ_SECONDS:
            return
        examples[0] += 1
        for port, frame in frames:
            try:
                rig.hosts[port].send(frame)
                sent[0] += 1
            except OSError:
                pass                    # the kernel refused it: not the switch's business
        rig.drain()
        assert rig.alive(), rig.log()

    fuzz()
    assert examples[0] >= FUZZ_FLOOR, f"{examples[0]} fuzz examples in {FUZZ_SECONDS} s"
    volume = volume_pass(rig, VOLUME_FRAMES)
    elapsed = time.monotonic() - t0
    rig.settle()
    assert rig.alive(), rig.log()
    assert probe(rig, 0, 1, b"after the fuzz")
    got = alice.counters("fuzzed")
    ring = got["rings"]["fuzzed"]
    outcomes = sum(v for k, v in ring["counters"].items()
                   if k not in ("completed", "results_sent"))
    assert outcomes > 0
    assert got["switch"]["mac_table_learned"] <= MAC_TABLE_SIZE
    assert got["switch"]["pipeline_errors"] == 0
    growth = rig.rss_kib() - rss0
    assert growth < 32 << 10, f"switch RSS grew {growth} KiB over the fuzz"
    alice.unregister_ring("fuzzed")
    after = make_ring(3, ring_id="after-fuzz", qpn_base=0x600)
    alice.register_ring(after)
    aggregate(rig, after, 0, seed=1)
    alice.unregister_ring("after-fuzz")
    print(f"fuzz: {examples[0]} examples, {sent[0]} property-based + {volume} volume frames "
          f"in {elapsed:.1f} s, "
          f"RSS +{growth} KiB, "
          f"mac_learn_refused {got['switch']['mac_learn_refused']}, ring outcomes {outcomes}")


# -- regressions of issue 12 ---------------------------------------------------------------
def test_a_spoofed_source_mac_does_not_move_a_rings_port(rig: SwitchRig,
                                                         alice: ControllerClient) -> None:
    """Host a (port 1) sends frames carrying host c's MAC before and after c's ring is
    registered: the ring's ports come from --mac, c's data still reaches c, a's spoofed
    contribution is dropped as wrong-port, and the refusals are counted."""
    before = switch_counters(alice)["mac_learn_refused"]
    spec = make_ring(3, ring_id="spoofed", qpn_base=0x700)
    spoof = bytearray(write_frame(spec.connections[2], 0, WRITE_ONLY, bytes(256)))
    rig.hosts[1].send(bytes(spoof))                            # c's MAC and IP from a's port
    time.sleep(0.2)
    reply = alice.register_ring(spec)
    assert reply["ports"] == {lab_ip(0): 1, lab_ip(1): 2, lab_ip(2): 3}
    rig.hosts[1].send(bytes(spoof))                            # and once it is registered
    time.sleep(0.2)
    ring = alice.counters("spoofed")["rings"]["spoofed"]
    assert ring["connections"][2]["counters"]["drop_wrong_port"] == 1
    assert ring["counters"]["aggregated"] == 0
    assert switch_counters(alice)["mac_learn_refused"] == before + 2
    aggregate(rig, spec, 0, seed=2)                             # c still gets its sums
    alice.unregister_ring("spoofed")


def test_an_ack_passes_only_from_the_responders_port(rig: SwitchRig,
                                                    alice: ControllerClient) -> None:
    """Issue 39: an ACK or NAK of a registered connection reached its requester from any
    port (the port check covered its WRITEs only), so any host could acknowledge data the
    responder never got, or NAK the requester into resending. Now it passes only from the
    responder's port; from another rank's or a stranger's it is dropped and counted."""
    spec = make_ring(3, ring_id="acked", qpn_base=0xB00)
    alice.register_ring(spec)
    c = spec.connections[0]                        # host 0 -> host 1 (port 2)

    def answer(syndrome: int) -> bytes:
        return raw(Ether(src=c.dst_mac, dst=c.src_mac) / IP(src=c.dst_ip, dst=c.src_ip)
                   / UDP(sport=0xC001, dport=4791, chksum=0)
                   / BTH(opcode=0x11, dqpn=c.src_qpn, psn=c.psn0 + 7)
                   / AETH(syndrome=syndrome, msn=3))
    got = {}
    for frame, port in ((answer(0x1F), 3), (answer(0x60), 4), (answer(0x1F), 2)):
        rig.drain()
        rig.hosts[port].send(frame)
        got[port] = len(rig.hosts[1].receive(1, 1.5, lambda f: f == frame))
    assert got == {3: 0, 4: 0, 2: 1}, got
    conn = alice.counters("acked")["rings"]["acked"]["connections"][0]["counters"]
    assert (conn["drop_wrong_port"], conn["packets"]) == (2, 2)
    alice.unregister_ring("acked")


def test_a_ring_needs_every_mac_in_the_static_map(rig: SwitchRig,
                                                  alice: ControllerClient) -> None:
    """Host 3 is not in --mac: even after it was learned from its own frames, a ring with
    it is refused, naming the rank, the MAC and the missing --mac."""
    assert probe(rig, 3, 0, b"host 3 speaks")                  # learned on port 4
    with pytest.raises(ControllerError) as e:
        alice.register_ring(make_ring(4, ring_id="with-h3", qpn_base=0x800))
    assert (e.value.code, e.value.message) == (
        "FAILED_PRECONDITION", f"rank 3 ({lab_ip(3)}): MAC {lab_mac(3)} is not in the switch's "
        f"static port map (start the switch with --mac {lab_mac(3)}=PORT)")


def test_a_flood_of_new_macs_is_capped(rig: SwitchRig, alice: ControllerClient) -> None:
    before = switch_counters(alice)
    n = 3 * MAC_TABLE_SIZE
    for i in range(n):
        mac = struct.pack("!HI", 0x0200, 0xAB000000 + i)      # locally administered, unicast
        rig.hosts[4].send(bytes.fromhex("ffffffffffff") + mac + b"\x88\xb5" + bytes(46))
    time.sleep(0.5)
    rig.drain()
    after = switch_counters(alice)
    assert after["mac_table_learned"] == MAC_TABLE_SIZE
    assert after["mac_learn_refused"] - before["mac_learn_refused"] >= n - MAC_TABLE_SIZE
    assert probe(rig, 0, 2, b"static hosts still forward")


def test_a_fault_in_the_aggregation_code_stays_with_its_packet(tmp_path: Path) -> None:
    """The switch with a ring whose pool raises: each of its packets is dropped and counted
    (pipeline_errors), logged once with ring and connection; plain forwarding and another
    ring's aggregation go on."""
    rig = SwitchRig(tmp_path, module="tests.hostile.faulty_switch")
    try:
        with ControllerClient(rig.addr, timeout=10, token_file=rig.alice_tokens) as c:
            faulty = make_ring(3, ring_id="faulty", qpn_base=0x900)
            good = make_ring(3, ring_id="good", qpn_base=0xA00)
            c.register_ring(faulty)
            c.register_ring(good)
            for k in range(5):
                for conn in faulty.connections:
                    rig.hosts[conn.rank + 1].send(write_frame(conn, k, WRITE_ONLY, bytes(256)))
            time.sleep(0.3)
            assert rig.alive(), rig.log()
            assert switch_counters(c)["pipeline_errors"] == 15
            assert probe(rig, 1, 2, b"forwarding goes on")
            for k in range(3):
                aggregate(rig, good, k, seed=10 + k)
            assert c.counters("good")["rings"]["good"]["counters"]["completed"] == 3
        log = rig.log()
        assert log.count("pipeline error on connection") == 3, log     # once per connection
        assert (f"pipeline error on connection {lab_ip(0)} -> {lab_ip(1)} DestQP "
                f"{faulty.connections[0].dst_qpn} (ring 'faulty' rank 0) from port 1: "
                "RuntimeError: injected fault in AggregatorPool.offer") in log
    finally:
        rig.close()
