"""Two-tier aggregation (docs/multirack.md): the inter-switch format, the ToR and spine rules one
by one, the fabric controller, and whole message sequences through a simulated fabric with
loss, duplication, reordering and corruption on host and ToR-spine links."""
from __future__ import annotations

import dataclasses
import random
import struct
import zlib

import numpy as np
import pytest
from scapy.compat import raw
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from nr_contract.client import ControllerClient, ControllerError
from switch.control.fabric import FabricTarget, SpineTarget, TorTarget
from switch.control.config import ControllerConfig
from switch.control.service import serve
from switch.dataplane import interswitch
from switch.dataplane.interswitch import Corrupt, Kind, ring_tag
from switch.dataplane.spine import SpineConfig, SpinePipeline
from switch.dataplane.tor import TorConfig, TorPipeline
from tests.fabricsim import SPINE, UPLINK, Faults, Sim, tor_endpoint
from tests.roce_layers import WRITE_ONLY, make_ring, wrapping_sum, write_frame

# -- the inter-switch packet ------------------------------------------------------------------


def test_interswitch_frame_is_what_scapy_builds_and_decodes_back() -> None:
    payload = np.arange(-8, 8, dtype="<i4").tobytes()
    frame = interswitch.encode(tor_endpoint(2), SPINE, Kind.PARTIAL, 2, 0xDEADBEEF, 0x123456,
                               payload)
    head = struct.pack("!BBBBIIHH", 1, 1, 2, 0, 0xDEADBEEF, 0x123456, len(payload), 0)
    crc = struct.pack("<I", zlib.crc32(head + payload))
    want = raw(Ether(src=tor_endpoint(2).mac, dst=SPINE.mac)
               / IP(src=tor_endpoint(2).ip, dst=SPINE.ip, flags="DF", ttl=64, id=0)
               / UDP(sport=4792, dport=4792, chksum=0) / Raw(head + payload + crc))
    assert frame == want
    msg = interswitch.decode(memoryview(frame))
    assert (msg.kind, msg.tor, msg.ring, msg.k, bytes(msg.payload)) == \
        (Kind.PARTIAL, 2, 0xDEADBEEF, 0x123456, payload)


def test_carried_headers_travel_after_the_payload() -> None:
    carried = [(3, bytes(range(70))), (300, b"\xaa" * 58)]
    frame = interswitch.encode(SPINE, tor_endpoint(1), Kind.TOTAL, 1, 9, 4, bytes(8), carried)
    head = struct.pack("!BBBBIIHH", 1, 2, 1, 2, 9, 4, 8, 0)
    body = head + bytes(8) + b"".join(struct.pack("!HH", r, len(h)) + h for r, h in carried)
    assert frame[interswitch.OFF:] == body + struct.pack("<I", zlib.crc32(body))
    msg = interswitch.decode(memoryview(frame))
    assert [(r, bytes(h)) for r, h in msg.carried] == carried and bytes(msg.payload) == bytes(8)


def test_every_single_bit_flip_of_a_message_is_refused() -> None:
    frame = interswitch.encode(tor_endpoint(0), SPINE, Kind.TOTAL, 0, 7, 5, bytes(range(64)),
                               [(1, bytes(range(58)))])
    for bit in range(8 * interswitch.OFF, 8 * len(frame)):
        bad = bytearray(frame)
        bad[bit // 8] ^= 1 << bit % 8
        with pytest.raises(Corrupt):
            interswitch.decode(memoryview(bad))


@pytest.mark.parametrize("field,value,match", [
    ("version", 2, "version 2"), ("kind", 3, "kind 3"), ("length", 62, "length 62"),
    ("length", 60, "4 bytes after the carried headers"), ("carried", 1, "do not fit"),
])
def test_a_message_with_a_bad_field_and_a_good_crc_is_refused(field: str, value: int,
                                                               match: str) -> None:
    fields = dict(version=1, kind=1, tor=0, carried=0, ring=7, k=5, length=64, reserved=0)
    fields[field] = value
    head = struct.pack("!BBBBIIHH", *fields.values())
    body = head + bytes(64)
    frame = raw(Ether() / IP() / UDP(sport=4792, dport=4792, chksum=0)
                / Raw(body + struct.pack("<I", zlib.crc32(body))))
    with pytest.raises(Corrupt, match=match):
        interswitch.decode(memoryview(frame))


# -- the rules, one by one, on a 2 x 2 fabric ---------------------------------------------------

def contribution(sim: Sim, rank: int, k: int, data: np.ndarray) -> bytes:
    return write_frame(sim.spec.connections[rank], k, WRITE_ONLY, data)


def partial_of(out: list[tuple[int, bytes]]) -> bytes:
    (port, frame), = out
    assert port == UPLINK and interswitch.decode(memoryview(frame)).kind == Kind.PARTIAL
    return frame


def tor_counts(sim: Sim, j: int) -> dict[str, int]:
    return sim.switches[f"tor{j}"].pipeline.counters()["mr"]["tor"]


def spine_lane(sim: Sim, j: int) -> dict[str, int]:
    return sim.switches["spine"].pipeline.counters()["mr"]["per_tor"][str(j)]


def pick(counters: dict[str, int], *names: str) -> list[int]:
    return [counters[n] for n in names]


@pytest.fixture
def sim() -> Sim:
    return Sim([2, 2], elements=64)


def test_one_partial_per_rack_one_total_per_tor_results_in_order(sim: Sim) -> None:
    tor0, tor1, spine = (sim.switches[n] for n in ("tor0", "tor1", "spine"))
    data = [np.full(64, r + 1, dtype=np.int32) * (1 << 29) for r in range(4)]  # wraps
    assert tor0.receive(contribution(sim, 0, 0, data[0]), 1) == []
    p0 = partial_of(tor0.receive(contribution(sim, 1, 0, data[1]), 2))
    assert np.array_equal(np.frombuffer(interswitch.decode(memoryview(p0)).payload, "<i4"),
                          wrapping_sum(data[:2]))
    tor1.receive(contribution(sim, 2, 0, data[2]), 1)
    p1 = partial_of(tor1.receive(contribution(sim, 3, 0, data[3]), 2))
    assert spine.receive(p0, 1) == []
    totals = spine.receive(p1, 2)
    assert [p for p, _ in totals] == [1, 2]
    total = wrapping_sum(data)
    # rank 0 -> 1 stays in rack 0; rank 1 -> 2 and 3 -> 0 cross: their headers ride along
    assert [(r, bytes(h)) for r, h in interswitch.decode(memoryview(p0)).carried] == \
        [(1, contribution(sim, 1, 0, data[1])[:70])]
    assert [r for r, _ in interswitch.decode(memoryview(totals[0][1])).carried] == [3]
    assert [r for r, _ in interswitch.decode(memoryview(totals[1][1])).carried] == [1]
    assert tor0.receive(totals[0][1], UPLINK) == [(2, contribution(sim, 0, 0, total)),
                                                  (1, contribution(sim, 3, 0, total))]
    assert tor1.receive(totals[1][1], UPLINK) == [(2, contribution(sim, 2, 0, total)),
                                                  (1, contribution(sim, 1, 0, total))]
    assert pick(tor_counts(sim, 0), "partials_sent", "partials_resent", "totals") == [1, 0, 1]
    assert spine_lane(sim, 0)["partials"] == spine_lane(sim, 1)["partials"] == 1


def test_retransmission_before_the_total_resends_the_partial_and_spine_dedups(sim: Sim) -> None:
    tor0, tor1, spine = (sim.switches[n] for n in ("tor0", "tor1", "spine"))
    d = np.arange(64, dtype=np.int32)
    tor0.receive(contribution(sim, 0, 0, d), 1)
    p0 = partial_of(tor0.receive(contribution(sim, 1, 0, d), 2))
    again = partial_of(tor0.receive(contribution(sim, 0, 0, d * 7), 1))   # not added
    assert again == p0
    assert tor_counts(sim, 0)["partials_resent"] == 1
    assert tor0.pipeline.counters()["mr"]["counters"]["drop_duplicate"] == 1
    assert spine.receive(p0, 1) == [] and spine.receive(again, 1) == []
    assert pick(spine_lane(sim, 0), "partials", "drop_duplicate") == [1, 1]
    tor1.receive(contribution(sim, 2, 0, d), 1)
    totals = spine.receive(partial_of(tor1.receive(contribution(sim, 3, 0, d), 2)), 2)
    assert len(totals) == 2
    # the total to tor0 was lost: tor0's next resend gets it back, to tor0 only
    resent = spine.receive(p0, 1)
    assert resent == [totals[0]]
    assert spine_lane(sim, 0)["totals_resent"] == 1
    out = tor0.receive(resent[0][1], UPLINK)
    assert out == [(2, contribution(sim, 0, 0, 4 * d)), (1, contribution(sim, 3, 0, 4 * d))]
    assert tor0.receive(totals[0][1], UPLINK) == []                        # a duplicate total
    assert tor_counts(sim, 0)["drop_total_duplicate"] == 1
    # a retransmission now is served from the total, up the uplink for rank 1 -> 2
    assert tor0.receive(contribution(sim, 1, 0, d), 2) == [(UPLINK, contribution(sim, 1, 0, 4 * d))]
    assert tor0.pipeline.counters()["mr"]["counters"]["retransmits_served"] == 1


def test_totals_out_of_order_are_emitted_in_order(sim: Sim) -> None:
    tor0 = sim.switches["tor0"]
    d = np.ones(64, dtype=np.int32)
    for k in (0, 1):
        tor0.receive(contribution(sim, 0, k, d), 1)
        tor0.receive(contribution(sim, 1, k, d), 2)
    # a gap: k=0's total may be lost, so its partial goes up again
    partial0 = tor0.receive(total(sim, 1, 40), UPLINK)
    assert interswitch.decode(memoryview(partial_of(partial0))).k == 0
    out = tor0.receive(total(sim, 0, 30), UPLINK)
    assert [f for _, f in out] == [contribution(sim, r, k, np.full(64, v, np.int32))
                                   for k, v in ((0, 30), (1, 40)) for r in (0, 3)]


def total(sim: Sim, k: int, value: int, carried: list[int] | None = None) -> bytes:
    """The spine's total for k to tor0, carrying rank 3's header (or `carried` ranks')."""
    headers = [(r, contribution(sim, r, k, np.zeros(64, np.int32))[:70])
               for r in ([3] if carried is None else carried)]
    return interswitch.encode(SPINE, tor_endpoint(0), Kind.TOTAL, 0, ring_tag("mr"), k,
                              np.full(64, value, "<i4").tobytes(), headers)


@pytest.mark.parametrize("carried", [[], [2], [3, 3]], ids=["none", "wrong-rank", "twice"])
def test_a_total_without_exactly_the_entering_headers_is_refused(sim: Sim,
                                                                  carried: list[int]) -> None:
    tor0 = sim.switches["tor0"]
    for r in (0, 1):
        tor0.receive(contribution(sim, r, 0, np.ones(64, np.int32)), r + 1)
    assert tor0.receive(total(sim, 0, 5, carried), UPLINK) == []
    assert tor_counts(sim, 0)["drop_total_headers"] == 1
    assert len(tor0.receive(total(sim, 0, 5), UPLINK)) == 2


def test_corrupt_or_misdirected_messages_are_counted_never_added(sim: Sim) -> None:
    tor0, spine = sim.switches["tor0"], sim.switches["spine"]
    d = np.ones(64, dtype=np.int32)
    tor0.receive(contribution(sim, 0, 0, d), 1)
    p0 = bytearray(partial_of(tor0.receive(contribution(sim, 1, 0, d), 2)))
    good = bytes(p0)
    p0[interswitch.PAYLOAD_OFF] ^= 0x10
    assert spine.receive(bytes(p0), 1) == []
    assert spine.pipeline.interswitch["drop_corrupt"] == 1
    assert spine.receive(good, 2) == []                                   # tor0's, on tor1's port
    assert spine_lane(sim, 0)["drop_wrong_port"] == 1 and spine_lane(sim, 0)["partials"] == 0
    assert spine.receive(good, 1) == [] and spine_lane(sim, 0)["partials"] == 1
    assert tor0.receive(total(sim, 0, 0), 1) == []                      # from a host port
    assert tor_counts(sim, 0)["drop_total_misdirected"] == 1
    bad = bytearray(total(sim, 0, 0))
    bad[-1] ^= 1
    assert tor0.receive(bytes(bad), UPLINK) == []
    assert tor0.pipeline.interswitch["drop_corrupt"] == 1
    assert tor_counts(sim, 0)["totals"] == 0


def test_transit_comes_only_from_the_uplink(sim: Sim) -> None:
    tor1 = sim.switches["tor1"]
    result = contribution(sim, 1, 0, np.ones(64, dtype=np.int32))        # rank 1 -> rank 2
    assert tor1.receive(result, 2) == []                                  # from a host port
    assert tor1.receive(result, UPLINK) == [(1, result)]
    transit, = tor1.pipeline.counters()["mr"]["transit"]
    assert transit == {"rank": 1, "out_port": 1,
                       "counters": {"forwarded": 1, "drop_wrong_port": 1}}


def test_the_spine_passes_transit_only_from_the_requesters_tor(sim: Sim) -> None:
    """A host of another rack forging rank 1's frames to rank 2 (rack 0 -> rack 1): its ToR
    forwards them up like any unknown frame, and the spine drops them, since that
    connection's frames may come only from tor0's port; tor0's own (a served
    retransmission) pass to L2 forwarding."""
    spine = sim.switches["spine"]
    forged = contribution(sim, 1, 0, np.full(64, 7, dtype=np.int32))      # rank 1 -> rank 2
    assert spine.pipeline.process(memoryview(forged), 1, lambda port, parts: None) is False
    for other_rack_port in (2, 3):
        assert spine.pipeline.process(memoryview(forged), other_rack_port,
                                      lambda port, parts: None) is True
    assert spine.pipeline.interswitch["drop_spoofed_transit"] == 2
    unrelated = contribution(sim, 0, 0, np.ones(64, dtype=np.int32))      # rank 0 -> 1: in rack
    assert spine.pipeline.process(memoryview(unrelated), 2, lambda port, parts: None) is False
    sim.fabric.unregister_ring("mr")
    assert spine.pipeline.process(memoryview(forged), 2, lambda port, parts: None) is False


# -- the fabric controller --------------------------------------------------------------------

def fabric(racks: list[list[int]]) -> tuple[FabricTarget, list[TorPipeline], SpinePipeline]:
    """ToRs whose host ports hold lab hosts `racks[j]` (port i+1 = i-th of them)."""
    tors = [TorPipeline(TorConfig(j, UPLINK, tor_endpoint(j), SPINE)) for j in range(len(racks))]
    spine = SpinePipeline(SpineConfig(SPINE, {j: (j + 1, tor_endpoint(j))
                                              for j in range(len(racks))}))
    macs = [{f"02:4e:52:00:00:{h + 1:02x}": i + 1 for i, h in enumerate(hosts)}
            for hosts in racks]
    target = FabricTarget([TorTarget(t, lambda m, j=j: macs[j].get(m, UPLINK))
                           for j, t in enumerate(tors)], SpineTarget(spine))
    return target, tors, spine


def test_fabric_splits_a_ring_over_the_racks_on_its_path() -> None:
    target, tors, spine = fabric([[0, 1], [2, 3], [4]])
    spec = make_ring(4)
    reply = target.register_ring(spec, 256)
    assert reply["racks"] == {"10.77.0.1": 0, "10.77.0.2": 0, "10.77.0.3": 1, "10.77.0.4": 1}
    assert reply["ports"] == {"10.77.0.1": 1, "10.77.0.2": 2, "10.77.0.3": 1, "10.77.0.4": 2}
    assert list(tors[2].counters()) == []                        # rack 2 is not on the path
    assert spine.counters()["ring"]["tors"] == [0, 1]
    assert target.register_ring(spec, 256) == reply             # idempotent
    with pytest.raises(ValueError, match="registered differently"):
        target.register_ring(spec, 512)
    counters = target.counters()
    assert set(counters["rings"]["ring"]["switches"]) == {"tor0", "tor1", "spine"}
    target.unregister_ring("ring")
    assert [t.counters() for t in tors] == [{}, {}, {}] and spine.counters() == {}
    with pytest.raises(KeyError):
        target.unregister_ring("ring")


def test_a_ring_in_one_rack_is_aggregated_there_alone() -> None:
    target, tors, spine = fabric([[0, 1, 2], [3]])
    spec = make_ring(3)
    target.register_ring(spec, 256)
    assert spine.counters() == {} and tors[0].counters()["ring"]["tor"] is None
    out: list = []
    data = [np.full(64, r, dtype=np.int32) for r in range(3)]
    for r in range(3):
        tors[0].process(memoryview(bytearray(write_frame(spec.connections[r], 0, WRITE_ONLY,
                                                         data[r]))),
                        r + 1, lambda p, parts: out.append((p, b"".join(parts))))
    assert out == [((r + 1) % 3 + 1, write_frame(spec.connections[r], 0, WRITE_ONLY,
                                                  wrapping_sum(data))) for r in range(3)]


@pytest.mark.parametrize("racks,match", [
    ([[0, 1], [2]], r"rank 3 \(10.77.0.4, MAC 02:4e:52:00:00:04\) is in no rack"),
    ([[0, 1, 2, 3], [3]], r"rank 3 .* is in racks \[0, 1\]"),
])
def test_fabric_refuses_a_rank_placed_badly(racks: list[list[int]], match: str) -> None:
    target, tors, _ = fabric(racks)
    with pytest.raises(ValueError, match=match):
        target.register_ring(make_ring(4), 256)
    assert [t.counters() for t in tors] == [{}] * len(racks)


def test_a_refusal_by_the_spine_rolls_back_every_tor() -> None:
    target, tors, spine = fabric([[0, 1], [2, 3]])
    other = make_ring(2, ring_id="other", hosts=[0, 2], qpn_base=0x200)
    target.register_ring(other, 256)
    spine.register_ring("sneaky", [0, 1], 256, 256, {})              # the spine alone has it
    spec = make_ring(4, ring_id="sneaky")
    with pytest.raises(ValueError, match="refused by spine: ring sneaky is already "
                                         "registered differently"):
        target.register_ring(spec, 128)
    assert [sorted(t.counters()) for t in tors] == [["other"], ["other"]]


def test_fabric_controller_over_grpc() -> None:
    target, tors, _ = fabric([[0, 1], [2]])
    server, port = serve(target, "127.0.0.1:0", config=ControllerConfig(insecure=True))
    try:
        with ControllerClient(f"127.0.0.1:{port}") as client:
            assert client.ping()["target"] == "fabric"
            reply = client.register_ring(make_ring(3))
            assert (reply["ring_id"], reply["slots"]) == ("ring", 256)
            with pytest.raises(ControllerError,
                               match="FAILED_PRECONDITION: .*rank 3 .*no rack"):
                client.register_ring(make_ring(4, ring_id="big", qpn_base=0x300))
            rings = client.counters()["rings"]
            assert set(rings) == {"ring"}
            # each tier's counters reach the hosts under dotted names (tier_counters)
            counts = rings["ring"]["counters"]
            assert counts["tor0.aggregated"] == counts["tor1.partials_sent"] == 0, counts
            assert {"spine.completed", "spine.per_tor.0.partials",
                    "spine.per_tor.1.partials"} <= set(counts), counts
            # rack placement is the fabric's own view (the typed reply carries ring, slots, ports)
            assert target.counters()["rings"]["ring"]["racks"] == [0, 0, 1]
    finally:
        server.stop(None)


# -- whole message sequences through the simulated fabric ------------------------------------

def check_counts(sim: Sim, racks: list) -> None:
    """Every contribution and partial added exactly once; one partial per slot per ToR."""
    K = sim.hosts[0].packets
    rings = sim.fabric.counters()["rings"]["mr"]["switches"]
    for j, n in enumerate(r if isinstance(r, int) else len(r) for r in racks):
        tor = rings[f"tor{j}"]
        assert tor["counters"]["aggregated"] == n * K          # never double-added
        skipped = tor["tor"]["slots_skipped"]                  # only when totals are lost
        # a ToR whose last totals were lost catches up with the next call's traffic
        assert tor["counters"]["completed"] + skipped == tor["next_emit"] >= K - sim.W
        assert tor["counters"]["drop_overrun"] <= skipped * sim.hosts[0].window
        assert tor["tor"]["partials_sent"] == K
        assert tor["tor"]["totals"] >= tor["counters"]["completed"]
    spine = rings["spine"]
    R = len(racks)
    assert spine["counters"]["partials"] == R * K and spine["counters"]["completed"] == K
    assert spine["counters"]["totals_sent"] == R * K + spine["counters"]["totals_resent"]
    assert spine["counters"]["drop_overrun"] == 0


def check_results(sim: Sim) -> None:
    for rank, got in enumerate(sim.results()):
        assert np.array_equal(got, sim.expected), f"rank {rank}: result differs from numpy"
    assert sim.results_checked >= len(sim.hosts) * sim.hosts[0].packets


@pytest.mark.parametrize("rack_sizes", [[2, 2], [3, 3], [3, 2], [1, 1, 1]],
                         ids=["2x2", "2x3", "uneven-5", "3x1"])
def test_fabric_without_faults_one_partial_up_one_total_down_per_slot(rack_sizes: list[int]
                                                                      ) -> None:
    sim = Sim(rack_sizes, elements=1000 + 3)                    # last packet shorter
    wire = sim.data[1].astype("<i4").tobytes()
    for k, (_, off, length, _) in enumerate(sim.hosts[1].layout[:6]):
        assert sim.hosts[1].frames[k] == sim.hosts[1].frame(k, wire[off:off + length], scapy=True)
    sim.run()
    check_results(sim)
    check_counts(sim, rack_sizes)
    K = sim.hosts[0].packets
    for j in range(len(rack_sizes)):
        tor = sim.fabric.counters()["rings"]["mr"]["switches"][f"tor{j}"]["tor"]
        assert pick(tor, "partials_sent", "partials_resent", "slots_skipped", "totals") == \
            [K, 0, 0, K]
        assert sim.fabric.counters()["rings"]["mr"]["switches"][f"tor{j}"]["next_emit"] == K
    for j, traffic in sim.uplink_traffic().items():
        # per slot: one partial up, one total down; no data packet crosses (the headers of
        # the connections between racks ride in them); the hosts' ACKs do
        assert traffic["up"] == {"partial": K, "ack": K}, f"rack {j}"
        assert traffic["down"] == {"total": K, "ack": K}, f"rack {j}"
    assert sim.max_lead <= 2 * sim.W - 1


LOSSY = Faults(loss=0.05, dup=0.05, reorder=0.2)


@pytest.mark.parametrize("where", ["hosts", "uplinks", "both"])
@pytest.mark.parametrize("rack_sizes,seed", [([2, 2], 1), ([3, 3], 2), ([3, 2], 3),
                                              ([[0, 3, 4], [1], [2, 5]], 4)],
                         ids=["2x2", "2x3", "uneven-5", "interleaved"])
def test_fabric_heals_loss_duplication_reordering(rack_sizes: list, seed: int,
                                                  where: str) -> None:
    corrupt = dataclasses.replace(LOSSY, corrupt=0.05)
    sim = Sim(rack_sizes, elements=1500, seed=seed,
              host_faults=LOSSY if where != "uplinks" else Faults(),
              uplink_faults=corrupt if where != "hosts" else Faults())
    sim.run()
    check_results(sim)
    check_counts(sim, rack_sizes)
    for tier in {"hosts": ["hosts"], "uplinks": ["uplinks"], "both": ["hosts", "uplinks"]}[where]:
        links = [st for (a, b), st in sim.stats.items()
                 if ("spine" in (a[0], b[0])) == (tier == "uplinks")]
        assert sum(st.lost + st.duplicated + st.delayed for st in links) > 0, \
            f"no faults on {tier}"
    switches = sim.fabric.counters()["rings"]["mr"]["switches"]
    resent = sum(c["tor"]["partials_resent"] for n, c in switches.items() if n != "spine")
    assert sum(h.retransmissions for h in sim.hosts) + resent > 0     # something healed
    corrupted = sum(st.corrupted for st in sim.stats.values())
    dropped = sum(c["drop_corrupt"] for c in sim.fabric.counters()["interswitch"].values())
    assert dropped == corrupted and (corrupted > 0) == (where != "hosts")


@pytest.mark.parametrize("rack_sizes", [[1] * 5, [2, 2], [1, 3]], ids=["5x1", "2x2", "1+3"])
def test_lost_totals_heal_even_when_the_racks_results_come_from_elsewhere(
        rack_sizes: list[int]) -> None:
    """A rank alone in its rack gets its acknowledgements through other ToRs' results, so
    its own ToR's missing total is noticed by served retransmissions (transit) and overruns."""
    sim = Sim(rack_sizes, elements=64 * 80, seed=11,
              uplink_faults=Faults(loss=0.3, kinds=("total",)))
    sim.run()
    check_results(sim)
    check_counts(sim, rack_sizes)
    resent = sum(c["tor"]["partials_resent"] for n, c in
                 sim.fabric.counters()["rings"]["mr"]["switches"].items() if n != "spine")
    assert resent > 0


def test_a_tor_whose_total_never_comes_skips_the_slot_once_every_host_is_past_it() -> None:
    """Every copy of k=3's total to tor1 is lost: the hosts get k=3 through the other ToRs
    and served retransmissions; tor1 moves on when a local packet proves every host
    acknowledged k=3 (k >= next_emit + N), and the run completes exactly."""
    def lose(src: tuple[str, int], frame: bytes) -> bool:
        return src == ("spine", 2) and interswitch.is_interswitch(frame) \
            and interswitch.decode(memoryview(frame)).k == 3
    sim = Sim([1, 1, 1], elements=64 * 40, drop=lose)
    sim.run()
    check_results(sim)
    tor1 = sim.fabric.counters()["rings"]["mr"]["switches"]["tor1"]
    assert tor1["tor"]["slots_skipped"] == 1 and tor1["tor"]["totals"] == 39
    assert tor1["counters"]["completed"] == 39 and tor1["next_emit"] == 40
    assert tor1["counters"]["drop_overrun"] == 0          # the packet that proved it is taken


def test_racks_of_interleaved_ranks_carry_one_header_per_connection_between_racks() -> None:
    partials: list[bytes] = []

    def record(src: tuple[str, int], frame: bytes) -> bool:
        if src == ("tor0", UPLINK) and interswitch.is_interswitch(frame):
            partials.append(frame)
        return False                                             # lose nothing
    sim = Sim([[0, 2, 4], [1, 3, 5]], elements=64 * 16, drop=record)  # all connections cross
    sim.run()
    check_results(sim)
    check_counts(sim, [[0, 2, 4], [1, 3, 5]])
    K = sim.hosts[0].packets
    for traffic in sim.uplink_traffic().values():
        assert traffic["up"] == {"partial": K, "ack": 3 * K}
        assert traffic["down"] == {"total": K, "ack": 3 * K}
    assert len(partials) == K
    assert [r for r, _ in interswitch.decode(memoryview(partials[0])).carried] == [0, 2, 4]


def test_slot_reuse_bound_is_reached_and_holds_with_n_equal_2w() -> None:
    """N = 2W slots; many times around the pool under loss: a rank stuck at k never lets
    another send past k + 2W - 1 (asserted on every send), and the bound is reached."""
    sim = Sim([2, 3], elements=64 * 120, window_msgs=2, seed=7,
              host_faults=Faults(loss=0.03, reorder=0.3), uplink_faults=LOSSY)
    assert sim.slots == 2 * sim.W == 8
    sim.run()
    check_results(sim)
    check_counts(sim, [2, 3])
    assert sim.hosts[0].packets >= 10 * sim.slots
    assert sim.max_lead == 2 * sim.W - 1


def test_eight_racks_of_eight_ranks_and_the_traffic_they_report() -> None:
    rack_sizes = [8] * 8
    sim = Sim(rack_sizes, elements=64 * 24, seed=5)
    sim.run()
    check_results(sim)
    check_counts(sim, rack_sizes)
    K = sim.hosts[0].packets
    per_link = sim.uplink_traffic()
    for j in range(8):
        assert per_link[j]["up"] == {"partial": K, "ack": K}
        assert per_link[j]["down"] == {"total": K, "ack": K}
    spine_bytes = sim.uplink_bytes()
    payload = 64 * 24 * 4                                     # bytes per rank
    # per spine link and direction: the payload once, in partials or totals, each with
    # its headers, CRC and one carried RoCE header (4 + 70 or 58 B, FIRST or LAST_IMM)
    carried = sum(4 + 54 + (16 if op == 6 else 4) for op, *_ in sim.hosts[0].layout)
    for kind in ("partial", "total"):
        assert spine_bytes[kind] == 8 * (K * (58 + 4) + payload + carried)
    host_bytes = sum(st.bytes["write"] for (a, b), st in sim.stats.items() if a[0] == "host")
    print(f"\n8 x 8 ranks, {payload} B per rank, {K} packets: bytes on the 16 spine link "
          f"directions {spine_bytes}; per direction {sum(spine_bytes.values()) / 16:.0f} "
          f"({sum(spine_bytes.values()) / 16 / payload:.2f} x the data); hosts sent "
          f"{host_bytes / 64:.0f} B each")


def test_eight_racks_of_eight_ranks_heal_faults_everywhere_with_a_wider_window() -> None:
    faults = Faults(loss=0.05, dup=0.05, reorder=0.3, corrupt=0.05)
    sim = Sim([8] * 8, elements=64 * 60, seed=9, window_msgs=4, msg_size=1024,
              host_faults=faults, uplink_faults=faults)
    assert (sim.W, sim.slots) == (16, 32)
    sim.run()
    check_results(sim)
    check_counts(sim, [8] * 8)
    assert sim.max_lead <= 2 * sim.W - 1


def test_tor_refuses_a_connection_another_ring_has_and_bad_local_ports() -> None:
    target, tors, _ = fabric([[0, 1], [2, 3]])
    target.register_ring(make_ring(4, ring_id="a"), 256)
    b = make_ring(4, ring_id="b")                                # the same QPs
    with pytest.raises(ValueError, match="ring b refused by tor0: ring b: connection of rank "
                                         "0 is already registered by ring a"):
        target.register_ring(b, 256)
    with pytest.raises(ValueError, match="a local rank on the uplink port 100"):
        tors[0].register_ring(b, {"10.77.0.1": UPLINK})
    with pytest.raises(ValueError, match="not a non-empty subset"):
        tors[0].register_ring(b, {"10.77.0.9": 1})
    assert sorted(tors[0].counters()) == sorted(tors[1].counters()) == ["a"]
    assert target.limits() == {"path_mtus": [256, 512, 1024, 2048, 4096], "max_slots": 1024,
                               "max_ranks": 64}
    # A switch that takes less (a BMv2 spine: path MTU 256, 256 slots) narrows the fabric's
    # limits to what every switch takes, so netreduce.init() fits rings to all of them.
    target.spine.limits = lambda: {"path_mtus": [256], "max_slots": 256}    # type: ignore
    assert target.limits() == {"path_mtus": [256], "max_slots": 256, "max_ranks": 64}
    # ... and the rings it holds (BMv2 ToRs and spine: 4; a switch process's Ping: its own)
    target.tors[1].limits = lambda: {"path_mtus": [256], "max_rings": 64}     # type: ignore
    target.spine.limits = lambda: {"max_slots": 256, "max_rings": 4}        # type: ignore
    assert target.limits() == {"path_mtus": [256], "max_slots": 256, "max_ranks": 64,
                               "max_rings": 4}


def test_random_fabrics_under_random_faults() -> None:
    """60 random placements (2-4 racks of any ranks), windows, sizes and fault mixes: exact,
    never double-added, the slot bound kept (regression guard for liveness: a deadlock
    here shows as 'no progress')."""
    rng = random.Random(2026)
    for _ in range(60):
        n = rng.randint(2, 9)
        ranks = rng.sample(range(n), n)
        count = rng.randint(2, min(n, 4))
        racks = [sorted(ranks[j::count]) for j in range(count)]
        faults = [Faults(loss=rng.choice([0, .05, .2]), dup=rng.choice([0, .1]),
                         reorder=rng.choice([0, .3, .6]), corrupt=rng.choice([0, .1]),
                         kinds=kinds)
                  for kinds in (Faults.kinds, rng.choice([Faults.kinds, ("total",),
                                                          ("partial",)]))]
        sim = Sim(racks, elements=rng.randint(1, 64 * 40), window_msgs=rng.choice([1, 2, 4]),
                  seed=rng.randrange(10**6), host_faults=faults[0], uplink_faults=faults[1])
        sim.run(max_events=1_000_000)
        check_results(sim)
        check_counts(sim, racks)
