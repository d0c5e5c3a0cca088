"""B1: rxe keeps up to 129 PSNs unacknowledged per QP, so the slot bound is 2 x 129.

rxe_req.c (rxe_requester) stops sending only when
``psn_compare(qp->req.psn, qp->comp.psn + RXE_MAX_UNACKED_PSNS) > 0`` with
RXE_MAX_UNACKED_PSNS = 128: PSNs comp.psn .. comp.psn + 128 (129 of them) may be in flight.
The scenario below is reachable under that rule, on the real AggregationPipeline, with 2
ranks whose flow-control window exceeds 129 packets: with N = 256 (what the old bound of
128 accepted) rank B's retransmission of k = 128 is dropped as stale and B stalls forever;
the registration now refuses N = 256 for that ring, and with the N it asks for (512) the
same packets complete.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from nr_contract import spec as contract
from nr_contract.spec import required_slots
from switch.dataplane.pipeline import AggregationPipeline
from tests.roce_layers import WRITE_MIDDLE, ip_ports, make_ring, wrapping_sum, write_frame

MTU = 256
SPEC = make_ring(2, mtu=MTU, msg_size=64 * MTU, window=4)        # 256 packets of window
A, B = 0, 1


def data(rank: int, k: int) -> np.ndarray:
    return np.random.default_rng([rank, k]).integers(-2**31, 2**31, MTU // 4, dtype=np.int32)


def run_scenario(slots: int) -> tuple[list[str], list[bytes]]:
    """The counters B's retransmission of k = 128 bumps, and the frames it draws.

    1. A and B send k = 0..255; all are emitted. B's connection's result at 128 is lost
       (A's responder NAKs 129 and drops the rest: B's comp.psn stays at 128).
    2. A's results all arrived, so B acknowledged A up to 255: A's comp.psn = 256 and rxe
       lets A send 256 .. 256 + 128 = 384 (129 PSNs). B, at comp.psn 128, has 128..255
       outstanding (128 PSNs): it may also send 256, which it does.
    3. B goes back to 128 (NAK or timer) and retransmits it.
    """
    pipe = AggregationPipeline()
    ports = ip_ports(SPEC)
    pipe.register_ring(SPEC, ports, slots)
    out: list[tuple[int, bytes]] = []

    def send(rank: int, k: int) -> None:
        c = SPEC.connections[rank]
        frame = bytearray(write_frame(c, k, WRITE_MIDDLE, data(rank, k)))
        assert pipe.process(memoryview(frame), ports[c.src_ip],
                            lambda port, parts: out.append((port, b"".join(parts))))

    for k in range(256):
        send(A, k)
        send(B, k)
    send(B, 256)
    for k in range(256, 385):
        send(A, k)
    before = pipe.counters()["ring"]["connections"][B]["counters"]
    out.clear()
    send(B, 128)
    after = pipe.counters()["ring"]["connections"][B]["counters"]
    bumped = [name for name in after if after[name] != before[name] and name != "packets"]
    return bumped, [frame for _, frame in out]


def test_rxe_allows_129_unacknowledged_psns() -> None:
    assert contract.RXE_MAX_INFLIGHT == 129
    assert contract.inflight_packets(SPEC) == 129


def test_registration_refuses_256_slots_when_129_packets_can_be_in_flight() -> None:
    assert required_slots(SPEC) == 512
    with pytest.raises(ValueError, match=r"256 slots < 2 x 129 packets in flight \(window 4 x "
                                         r"64 packets per message, capped at rxe's 129\): "
                                         r"needs 512"):
        AggregationPipeline().register_ring(SPEC, ip_ports(SPEC), 256)


def test_with_the_required_slots_the_lost_result_is_served_again() -> None:
    bumped, frames = run_scenario(required_slots(SPEC))
    total = wrapping_sum([data(A, 128), data(B, 128)])
    assert bumped == ["retransmits_served"]
    assert frames == [write_frame(SPEC.connections[B], 128, WRITE_MIDDLE, total)]


def test_with_256_slots_the_retransmission_is_stale_and_b_would_stall(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the bound of 128 let through: A's 384 re-opened slot 128 before B had its
    result, so nothing can ever answer B's retransmissions (rxe's retry_cnt 7: forever)."""
    monkeypatch.setattr(contract, "RXE_MAX_INFLIGHT", 128)
    assert required_slots(SPEC) == 256
    bumped, frames = run_scenario(256)
    assert (bumped, frames) == (["drop_stale"], [])


def test_flow_windows_of_at_most_128_packets_keep_256_slots() -> None:
    """The defaults (window 2 x 64 packets) and everything below 129 are unchanged."""
    for window, ppm, want in ((2, 64, 256), (1, 128, 256), (2, 4, 16), (3, 5, 32), (1, 1, 2)):
        spec = dataclasses.replace(SPEC, window=window, msg_size=ppm * MTU)
        assert required_slots(spec) == want, (window, ppm)
