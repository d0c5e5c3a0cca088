"""The packet-level RC model (tests/rcmodel, docs/rcmodel.md): rxe's behaviours one by one,
whole allreduce calls through the real switch pipeline, B1 end to end, and the model
against the lab's recorded counters (tests/rcmodel/lab_calls.json)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from flowctl import FlowConfig, StallError
from netreduce.meta import RECORD_STRIDE
from netreduce.routing import SwitchUnavailable
from nr_contract import spec as contract
from nr_contract.spec import PSN_MASK, Connection
from ring_setup.endpoints import ring_spec
from switch.dataplane import pipeline
from switch.dataplane.packets import BTH_OFF, conn_key, parse
from tests.rcmodel.calls import allreduce, data, messages, packets, want
from tests.rcmodel.fabric import FaultRates, Faults
from tests.rcmodel.outcomes import assert_every_rank_failed_fast
from tests.rcmodel.rxe import MAX_UNACKED_PSNS, QPAttr
from tests.rcmodel.world import World

CFG = FlowConfig(mtu=256, msg_size=1024, window=4, recv_depth=64, collective_timeout=2.0)
LAB_CALLS = Path(__file__).parent / "rcmodel" / "lab_calls.json"


class Capture:
    """A Faults.drop hook that records frames and drops those `rule` picks."""

    def __init__(self, rule: Callable[[str, bytes], bool] = lambda kind, frame: False) -> None:
        self.rule = rule
        self.frames: list[tuple[str, bytes]] = []

    def __call__(self, kind: str, frame: bytes) -> bool:
        self.frames.append((kind, frame))
        return self.rule(kind, frame)


class LoseFirst:
    """A Faults.drop hook that loses the first `copies` frames `match(kind, frame)` picks."""

    def __init__(self, copies: int, match: Callable[[str, bytes], bool]) -> None:
        self.left, self.match = copies, match

    def __call__(self, kind: str, frame: bytes) -> bool:
        if self.left and self.match(kind, frame):
            self.left -= 1
            return True
        return False


def psn_of(frame: bytes) -> int:
    fields = parse(frame)
    assert fields is not None
    return fields[4]


def dest_qp(frame: bytes) -> int:
    fields = parse(frame)
    assert fields is not None
    return fields[0] & PSN_MASK


def on_conn(frame: bytes, c: Connection) -> bool:
    """Is `frame` a packet of connection c (its requests: c's key ⟨SrcIP, DstIP, DestQP⟩)?
    QPNs alone are ambiguous: every rxe device numbers its QPs from 17."""
    fields = parse(frame)
    return fields is not None and fields[0] == conn_key(c.src_ip, c.dst_ip, c.dst_qpn)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_lossless_switch_call_counts_every_packet_once(n: int) -> None:
    count = 5000
    world = World(n, CFG)
    assert all(np.array_equal(r, want(n, count)) for r in allreduce(world, count, "switch"))
    meta = n * RECORD_STRIDE
    data = 4 * (count + n)                                  # the data, then the n-word seal
    requests = packets(meta, CFG) + packets(data, CFG)
    acks = messages(meta, CFG) + messages(data, CFG)
    for dev in world.rxe_counters():
        assert dev == {"sent_pkts": requests + acks, "rcvd_pkts": requests + acks,
                       "ack_deferred": acks, "rdma_recvs": acks}
    ring = world.switch_counters()
    assert ring["counters"]["aggregated"] == n * requests
    assert ring["counters"]["completed"] == requests
    assert ring["counters"]["results_sent"] == n * requests
    assert [c["counters"]["messages"] for c in ring["connections"]] == [acks] * n


def test_the_host_ring_is_forwarded_by_the_switch_unaggregated() -> None:
    n, count = 3, 4000
    world = World(n, CFG)
    assert all(np.array_equal(r, want(n, count)) for r in allreduce(world, count, "ring"))
    ring = world.switch_counters()["counters"]
    meta = packets(n * RECORD_STRIDE, CFG)                    # the call's metadata, aggregated
    assert (ring["aggregated"], ring["completed"]) == (n * meta, meta)
    assert world.fabric.counts["result"] > 2 * (n - 1) * packets(4 * count // n, CFG)


@pytest.mark.parametrize("algo", ["switch", "ring"])
def test_several_calls_under_loss_duplication_and_reordering_everywhere(algo: str) -> None:
    n, counts = 4, [7, 3000, 1]
    world = World(n, CFG, faults=Faults.everywhere(loss=0.05, duplicate=0.05, delay=0.3,
                                                   seed=11))
    results = world.run(lambda comm: [comm.allreduce(data(comm.rank, c), algo=algo)
                                      for c in counts])
    for got in results:
        assert [g.tolist() for g in got] == [want(n, c).tolist() for c in counts]
    assert all(world.fabric.lost[kind] > 0 for kind in ("contribution", "result", "ack"))
    assert sum(d["completer_retry_err"] for d in world.rxe_counters()) > 0


def test_ackreq_on_the_last_packet_and_after_65_unacknowledged_ones() -> None:
    """rxe_req.c init_req_packet: `noack_pkts++ > RXE_MAX_PKT_PER_ACK` (64)."""
    cfg = FlowConfig(mtu=256, msg_size=256 * 256, window=1, recv_depth=8, collective_timeout=2.0)
    capture = Capture()
    world = World(2, cfg, slots=512, faults=Faults(drop=capture))
    count = 200 * 256 // 4 - 2                 # one message, 200 packets with the 2-word seal
    assert all(np.array_equal(r, want(2, count)) for r in allreduce(world, count, "switch"))
    c = world.spec.connections[0]
    sent = [((psn_of(f) - c.psn0) & PSN_MASK, bool(f[BTH_OFF + 8] & 0x80))
            for kind, f in capture.frames if kind == "contribution" and on_conn(f, c)]
    meta = packets(2 * RECORD_STRIDE, cfg)                      # its last one: an AckReq
    assert [k for k, _ in sent] == list(range(meta + 200))      # the metadata, then 200
    assert [k - meta for k, ackreq in sent if ackreq] == [-1, 65, 131, 197, 199]
    assert world.rxe_counters()[0]["ack_deferred"] == 5         # one ACK per AckReq


def test_no_more_than_129_psns_are_ever_unacknowledged() -> None:
    """rxe_req.c: the requester stops when psn_compare(psn, comp.psn + 128) > 0. With
    every ACK of rank 0's data lost, rank 0 sends PSNs meta..meta+128 (after the `meta`
    packets of the call's metadata) and then only retries them (rxe's timer,
    completer_retry_err) until the collective timeout: the first rank to see nothing move
    for 1 s raises StallError, the other PeerFailure naming it."""
    cfg = FlowConfig(mtu=256, msg_size=256 * 256, window=1, recv_depth=8, collective_timeout=1.0)
    holder: dict[str, World] = {}
    meta = packets(2 * RECORD_STRIDE, cfg)

    def lose_rank0_data_acks(kind: str, frame: bytes) -> bool:
        c = holder["world"].spec.connections[0]
        return kind == "ack" and frame[:6] == bytes.fromhex(c.src_mac.replace(":", "")) \
            and psn_of(frame) != (c.psn0 + meta - 1) & PSN_MASK
    capture = Capture(lose_rank0_data_acks)
    world = holder["world"] = World(2, cfg, slots=512, faults=Faults(drop=capture))
    results = allreduce(world, 300 * 64, "switch")
    assert_every_rank_failed_fast(results, StallError)
    c = world.spec.connections[0]
    ks = {(psn_of(f) - c.psn0) & PSN_MASK for kind, f in capture.frames
          if kind == "contribution" and on_conn(f, c)}
    assert ks == set(range(meta + MAX_UNACKED_PSNS))
    assert world.rxe_counters()[0]["completer_retry_err"] >= 10


def test_a_lost_packet_draws_one_nak_then_silence_and_go_back_n() -> None:
    """rxe_resp.c check_psn: one NAK PSN sequence error, later packets dropped silently;
    rxe_comp.c: the NAK acknowledges what precedes it and the requester goes back."""
    n, count = 2, 2000

    def packet_3_of_rank_0(kind: str, frame: bytes) -> bool:
        c = ring_spec(world.endpoints, "ring", "ring", CFG).connections[0]
        return kind == "result" and on_conn(frame, c) and (psn_of(frame) - c.psn0) \
            & PSN_MASK == 3
    world = World(n, CFG, faults=Faults(drop=LoseFirst(1, packet_3_of_rank_0)))
    assert all(np.array_equal(r, want(n, count)) for r in allreduce(world, count, "ring"))
    rx0, rx1 = world.rxe_counters()
    assert (rx1["out_of_seq_request"], rx0["rcvd_seq_err"], rx0["completer_retry_err"]) == \
        (1, 1, 1)
    assert "duplicate_request" not in rx1                       # dropped, not executed


def test_a_lost_ack_makes_duplicates_that_are_re_acked_not_re_executed() -> None:
    """rxe_resp.c duplicate_request: a duplicate WRITE is ACKed again (ack_psn - 1) and
    not executed: the receive completions stay one per message."""
    n, count = 2, 200                    # every ring transfer: one 400-byte message

    def ack_to_rank_0(kind: str, frame: bytes) -> bool:
        c = ring_spec(world.endpoints, "ring", "ring", CFG).connections[0]
        return kind == "ack" and frame[:6] == bytes.fromhex(c.src_mac.replace(":", "")) \
            and dest_qp(frame) == c.src_qpn
    world = World(n, CFG, faults=Faults(drop=LoseFirst(1, ack_to_rank_0)))
    assert all(np.array_equal(r, want(n, count)) for r in allreduce(world, count, "ring"))
    rx0, rx1 = world.rxe_counters()
    assert rx0["completer_retry_err"] == 1 and rx1["duplicate_request"] >= 1
    lossless = World(n, CFG)
    allreduce(lossless, count, "ring")
    base0, base1 = lossless.rxe_counters()
    assert rx1["rdma_recvs"] == base1["rdma_recvs"]
    assert rx0["ack_deferred"] == base0["ack_deferred"] - 1 + rx1["duplicate_request"]


@pytest.mark.parametrize("algo", ["switch", "ring"])
def test_psns_wrap_at_2_to_the_24(algo: str) -> None:
    n, count = 3, 3000
    psn0s = {(r, ring): PSN_MASK - 5 for r in range(n) for ring in ("ring", "inc")}
    capture = Capture()
    world = World(n, CFG, psn0s=psn0s, faults=Faults(drop=capture))
    assert all(np.array_equal(r, want(n, count)) for r in allreduce(world, count, algo))
    psns = {psn_of(f) for kind, f in capture.frames if kind == "contribution"}
    assert PSN_MASK in psns and 0 in psns and 40 in psns


def test_retries_running_out_complete_with_retry_exc_err() -> None:
    """rxe_comp.c: retry_cnt 1, nothing ever answered: the WQE completes with
    IBV_WC_RETRY_EXC_ERR; that transport fault on "inc" is settled as the switch's loss
    (netreduce/transport_fault.py), so the algo="switch" call is refused alike on every
    rank, naming it."""
    world = World(2, CFG, attr=QPAttr(mtu=CFG.mtu, retry_cnt=1),
                  faults=Faults(drop=lambda kind, frame: kind == "result"))
    results = allreduce(world, 100, "switch")
    for r in results:
        assert isinstance(r, SwitchUnavailable), results
        assert "transport fault on 'inc'" in str(r)
        assert "failed: transport retry counter exceeded (status 12" in str(r)
    assert [d["retry_exceeded_err"] for d in world.rxe_counters()] == [1, 1]


# --- B1 end to end: window 4 x 64 packets, 129 PSNs in flight --------------------------
B1_CFG = FlowConfig(mtu=256, msg_size=64 * 256, window=4, recv_depth=16, collective_timeout=1.0)
B1_COUNT = 512 * 64                       # 512 data packets per rank


def b1_world(slots: int) -> World:
    """2 ranks; the result of B's (rank 1's) connection at k = 128 (the data packet with
    PSN offset 128 after a one-packet metadata message: meta - 1 + 128) is lost twice: once when emitted, once
    when served to B's first retransmission (after A's NAK), so B's next try comes from its
    retransmit timer, when A has long sent k + 256 = 384."""
    meta = packets(2 * RECORD_STRIDE, B1_CFG)

    def result_128_of_b(kind: str, frame: bytes) -> bool:
        c = world.spec.connections[1]
        return kind == "result" and on_conn(frame, c) and (psn_of(frame) - c.psn0) \
            & PSN_MASK == meta - 1 + 128
    world = World(2, B1_CFG, slots=slots, faults=Faults(drop=LoseFirst(2, result_128_of_b)))
    return world


def test_b1_registration_refuses_256_slots_for_129_packets_in_flight() -> None:
    with pytest.raises(ValueError, match=r"256 slots < 2 x 129 .*needs 512"):
        b1_world(256)


def test_b1_with_the_slots_it_needs_the_lost_result_is_served_again() -> None:
    world = b1_world(contract.required_slots(World(2, B1_CFG, switch=False).spec))
    assert world.slots == 512
    assert all(np.array_equal(r, want(2, B1_COUNT)) for r in allreduce(world, B1_COUNT,
                                                                         "switch"))
    conn_b = world.switch_counters()["connections"][1]["counters"]
    assert conn_b["retransmits_served"] >= 2 and conn_b["drop_stale"] == 0


def test_b1_with_the_old_bound_of_128_b_stalls_forever(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(contract, "RXE_MAX_INFLIGHT", 128)
    world = b1_world(256)                        # what the bound of 128 accepted
    results = allreduce(world, B1_COUNT, "switch")
    assert_every_rank_failed_fast(results, StallError)
    conn_b = world.switch_counters()["connections"][1]["counters"]
    assert conn_b["drop_stale"] >= 1             # B's retransmissions of 128 find 384


def test_the_model_catches_a_switch_that_does_not_serve_retransmissions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant 3 (a retransmission reaching an emitted slot gets the result back) is
    what recovers a lost result: a pipeline without it leaves B stalled, and the model
    says so with a StallError (the other rank: PeerFailure naming the stalled one) instead
    of a wrong sum or a hang."""
    real_offer = pipeline.AggregatorPool.offer

    def offer_without_serving(pool: pipeline.AggregatorPool, rank: int, k: int,
                              *args: Any) -> str:
        i = k & pool.slots - 1
        if pool.tag[i] == k and pool.bitmap[i] >> rank & 1 and pool.emitted[i]:
            return "drop_duplicate"
        return real_offer(pool, rank, k, *args)
    monkeypatch.setattr(pipeline.AggregatorPool, "offer", offer_without_serving)
    results = allreduce(b1_world(512), B1_COUNT, "switch")
    assert_every_rank_failed_fast(results, StallError)


def test_the_model_catches_a_switch_that_counts_a_duplicate_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant 2 broken on purpose (a duplicate contribution before emission is added
    again) on the data packets: duplicated contributions then give wrong sums, which the
    model shows. (The same fault in the metadata message or the seal's packet is caught by
    the host code itself: SwitchFailure, no sum returned.)"""
    real_offer = pipeline.AggregatorPool.offer
    n, count = 3, 5000
    meta = packets(n * RECORD_STRIDE, CFG)            # k < meta: the call's metadata message
    last = meta + packets(4 * (count + n), CFG) - 1   # the packet that carries the seal

    def offer_twice(pool: pipeline.AggregatorPool, rank: int, k: int, *args: Any) -> str:
        i = k & pool.slots - 1
        again = meta <= k < last and pool.tag[i] == k and pool.bitmap[i] >> rank & 1 \
            and not pool.emitted[i]
        if again:
            pool.bitmap[i] &= ~(1 << rank)
        outcome = real_offer(pool, rank, k, *args)
        if again and not pool.emitted[i]:
            pool._payloads[i][rank] *= 2            # noqa: SLF001 - added twice
        return outcome
    monkeypatch.setattr(pipeline.AggregatorPool, "offer", offer_twice)
    faults = Faults({"contribution": FaultRates(duplicate=0.3, delay=0.5)}, seed=1)
    results = allreduce(World(n, CFG, faults=faults), count, "switch")
    assert all(isinstance(r, np.ndarray) for r in results), results    # the seal held
    assert not any(np.array_equal(r, want(n, count)) for r in results)


# --- the model against the lab --------------------------------------------------------
def lab_records() -> dict[str, list[dict[str, Any]]]:
    by_call: dict[str, list[dict[str, Any]]] = {}
    for rec in json.loads(LAB_CALLS.read_text())["records"]:
        by_call.setdefault(rec["call"], []).append(rec)
    return by_call


def test_the_model_matches_the_lab_on_the_recorded_calls() -> None:
    """tests/rcmodel/lab_record.py in a 2-host lab (defaults: MTU 4096, 256 KiB messages,
    window 2, no netem). A lab call can meet spurious retransmit timeouts (rxe's 67 ms
    timer under TCG, `completer_retry_err`; the first recording met 1-3 per call, the
    current one none), so each lab figure is split with the lab's own counters into the
    lossless part and the retransmissions, and the lossless part must
    equal the model's lossless run exactly: switch counters, requests sent and received,
    receive completions, ACKs. For rank r and its peer p (2 ranks, nothing lost):
      sent_pkts(r) = requests(r) + [duplicate_request(p) + drop_duplicate(conn r)]
                     + ack_deferred(p)
      rcvd_pkts(r) = requests received(r) + duplicate_request(r) + ack_deferred(r)
      ack_deferred(r) = ACKs(r) + duplicate_request(p) + e, 0 <= e <= completer_retry_err(r)
    (e: rxe's noack_pkts keeps counting across a retry, so a retransmitted MIDDLE packet
    may carry AckReq; the model does the same, but cannot know when the lab's timer
    fired)."""
    records = lab_records()
    first = records["switch-1MiB"][0]
    cfg = FlowConfig(mtu=first["mtu"], msg_size=first["msg_size"], window=first["window"])
    world = World(first["world_size"], cfg)
    for call, recs in records.items():
        rec0 = next(r for r in recs if r["rank"] == 0)
        before = world.rxe_counters()
        sw_before = world.switch_counters()
        results = world.run(lambda comm: comm.allreduce(
            data(comm.rank, rec0["count"], rec0["dtype"]), algo=rec0["algo"]))
        assert not any(isinstance(r, Exception) for r in results), results
        model = [{k: v - b.get(k, 0) for k, v in after.items()}
                 for after, b in zip(world.rxe_counters(), before)]
        sw = world.switch_counters()
        lab_sw = rec0["switch"]
        for name in ("aggregated", "completed", "results_sent"):
            assert sw["counters"][name] - sw_before["counters"][name] == \
                lab_sw["ring"].get(name, 0), (call, name)
        for r, (conn, conn0) in enumerate(zip(sw["connections"], sw_before["connections"])):
            for name in ("aggregated", "messages"):
                assert conn["counters"][name] - conn0["counters"][name] == \
                    lab_sw["connections"][r].get(name, 0), (call, r, name)
        lab = {rec["rank"]: rec["rxe"] for rec in recs}
        for r in range(2):
            p, m, lr, lp = 1 - r, model[r], lab[r], lab[1 - r]
            dup_r, dup_p = lr.get("duplicate_request", 0), lp.get("duplicate_request", 0)
            requests = m["sent_pkts"] - model[p]["ack_deferred"]
            dropped = lab_sw["connections"][r].get("drop_duplicate", 0)
            assert lr["sent_pkts"] == requests + dup_p + dropped + lp["ack_deferred"], (call, r)
            received = m["rcvd_pkts"] - m["ack_deferred"]
            assert lr["rcvd_pkts"] == received + dup_r + lr["ack_deferred"], (call, r)
            assert lr["rdma_recvs"] == m["rdma_recvs"], (call, r)
            extra = lr["ack_deferred"] - m["ack_deferred"] - dup_p
            assert 0 <= extra <= lr.get("completer_retry_err", 0), (call, r, extra)
