"""A transient transport fault costs one call's time, never the job (issue 40,
docs/transport-faults.md): whole communicators on the in-process fabric
(ranks are threads, the rendezvous real TCP), where one rank's QPs fail a WRITE with a
retry error and go to ERROR at a chosen point of a call; results against numpy sums."""
from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest

import netreduce.rejoin as rejoin
import netreduce.transport_fault as tf
from flowctl import FlowConfig
from netreduce import Communicator
from netreduce.errors import TransportFault
from netreduce.transport_fault import backoff, fault_bound, faulted_ring
from tests.fakefabric import FakeController, FakeFabric, FakeHost
from tests.ranks import run_ranks

CFG = FlowConfig(mtu=256, msg_size=1024, window=4, recv_depth=64, collective_timeout=20.0)
COUNT = 700         # int32: 2800 bytes, several messages per ring step on 3 ranks
N = 3
CALLS = 5
FAULTY = 1          # the rank whose QPs fail


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tf, "BACKOFF_FIRST", 0.01)
    monkeypatch.setattr(rejoin, "REJOIN_FIRST", 0.3)
    monkeypatch.setattr(rejoin, "REJOIN_POLL", 0.1)


def data(rank: int, call: int) -> np.ndarray:
    return np.arange(COUNT, dtype=np.int32) * (rank + 1) + 1000 * call


def want(call: int) -> list[int]:
    return sum(data(r, call).astype(np.int64) for r in range(N)).astype(np.int32).tolist()


def test_the_bound_and_back_off_are_closed_forms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tf, "BACKOFF_FIRST", 0.5)
    assert [backoff(a) for a in range(1, 8)] == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    cfg = FlowConfig(retry_cnt=6, ack_timeout=14)
    # 8 attempts, each one retry budget (7 x 67.1 ms), back-offs 0 + 0.5 + 1 + 2 + 4 + 8 + 8 + 8
    assert fault_bound(cfg) == pytest.approx(31.5 + 8 * 7 * 0.067108864)
    assert faulted_ring("rank 2: transport fault on 'ring': flowctl: ...") == "ring"
    assert faulted_ring("rank 0: transport fault on 'inc': x") == "inc"
    assert faulted_ring("rank 0: the switch lost ring nr-1") is None


def job(fault_at: str | None, in_place: bool, calls: int = CALLS, fault_call: int = 2,
        again: int = 0, idle_after: float = 0.0) -> Any:
    """Each rank runs `calls` int32 sum calls over the host ring; in call `fault_call`
    rank FAULTY's "ring" QPs fail the WRITE `fault_at` ("first", "middle" or "last" of
    those it sends in a call, measured on call 0) and the QPs rebuilt for the next
    `again` attempts fail too. Returns the results, the writes of a call and the stats."""
    def body(comm: Communicator, host: FakeHost) -> Any:
        out, per_call = [], 0
        for c in range(calls):
            qps = host.rings["ring"]
            before = qps.delivered
            if c == fault_call and comm.rank == FAULTY and fault_at is not None:
                qps.fail_at = before + {"first": 0, "middle": per_call // 2,
                                        "last": per_call - 1}[fault_at]
                host.faults["ring"] = [0] * again
            x = data(comm.rank, c)
            if in_place:
                comm.allreduce(x)
                out.append(x.tolist())
            else:
                y = np.full(COUNT, -7, dtype=np.int32)
                comm.allreduce(x, out=y)
                assert np.array_equal(x, data(comm.rank, c)), "the input changed"
                out.append(y.tolist())
            if c == 0:
                per_call = host.rings["ring"].delivered - before
            if c == fault_call and idle_after:
                time.sleep(idle_after)
        return out, per_call, comm.stats()
    return body


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("fault_at", ["first", "middle", "last"])
def test_a_host_ring_fault_on_fake_qps_costs_one_call_and_every_call_is_exact(
        fault_at: str, in_place: bool, caplog: pytest.LogCaptureFixture) -> None:
    """first: rank 1's first WRITE of call 2 is its metadata record (before the metadata);
    middle: during the reduce-scatter or all-gather; last: its last all-gather WRITE, so
    rank 1's successor lacks one chunk while the others complete call 2 and go on (they
    redo call 2 from its kept input, into scratch). Every call exact on every rank, the
    fault settled once (one rebuild, one call redone), named in rank 0's log."""
    caplog.set_level(logging.WARNING, "netreduce")
    results = run_ranks(N, job(fault_at, in_place), cfg=CFG)
    for r, got in enumerate(results):
        assert not isinstance(got, BaseException), (r, got)
        calls, per_call, stats = got
        assert calls == [want(c) for c in range(CALLS)], r
        assert stats["calls"] == {"ring": CALLS}
        transport = stats["transport"]
        assert {k: transport[k] for k in ("faults", "rebuilds", "redone")} == \
            {"faults": 1, "rebuilds": 1, "redone": 1}, (r, transport)
        assert 0 <= transport["ms_lost"] < 5000
    assert per_call >= 4        # the record and 2 (n - 1) ring steps
    lines = [m.getMessage() for m in caplog.records if "transport fault" in m.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"netreduce: rank {FAULTY}: transport fault on 'ring': "), lines
    assert "transport retry counter exceeded" in lines[0] and "call #2" in lines[0], lines
    assert "the host ring's QPs were rebuilt (attempt 1 of call #2" in lines[0], lines


def test_a_fault_on_fake_qps_right_after_a_call_is_redone_by_an_idle_rank_too() -> None:
    """Rank 1's last WRITE of call 1 fails; the ranks that completed it idle 0.5 s: they
    settle on their progress threads, the one ahead redoing call 1 from its kept input."""
    results = run_ranks(N, job("last", True, calls=4, fault_call=1, idle_after=0.5),
                        cfg=CFG)
    for r, got in enumerate(results):
        assert not isinstance(got, BaseException), (r, got)
        assert got[0] == [want(c) for c in range(4)]
        assert got[2]["transport"]["faults"] == 1


def test_a_fault_on_fake_qps_that_keeps_coming_back_fails_every_rank_alike() -> None:
    """The rebuilt QPs fail too, FAULT_ATTEMPTS times: every rank raises TransportFault
    naming the ring, the status and the attempts (no PeerFailure), within the bound, and
    closes."""
    t0 = time.monotonic()
    results = run_ranks(N, job("middle", False, again=tf.FAULT_ATTEMPTS), cfg=CFG)
    took = time.monotonic() - t0
    for r, got in enumerate(results):
        assert isinstance(got, TransportFault), (r, got)
        text = str(got)
        assert text.startswith(f"netreduce: rank {r}: rank {FAULTY}: transport fault on "
                               f"'ring': "), text
        assert f"call #2 faulted {tf.FAULT_ATTEMPTS + 1} times" in text, text
        assert text.count("transport retry counter exceeded") == tf.FAULT_ATTEMPTS + 2, text
        assert "the communicator is unusable" in text
    assert took < 30


def test_an_inc_fault_on_fake_qps_rebuilds_inc_at_once_and_redoes_the_call_on_the_switch(
        ) -> None:
    """Rank 1's "inc" QPs fail in call 1 (through the fake switch), no switch-away notice:
    the "inc" ring is rebuilt at once and registered in place of the old one (unregistered),
    call 1 is redone through the switch (algo="switch": never refused); every call exact,
    through the switch; one fault, one rebuild, one call redone, no fallback."""
    fabric = FakeFabric()
    controller = FakeController(fabric)
    calls = 4

    def body(comm: Communicator, host: FakeHost) -> Any:
        out = []
        for c in range(calls):
            if c == 1 and comm.rank == FAULTY:
                host.rings["inc"].fail_at = host.rings["inc"].delivered + 1
            x = data(comm.rank, c)
            comm.allreduce(x, algo="switch")
            out.append(x.tolist())
        return out, comm.stats()

    for r, got in enumerate(run_ranks(N, body, cfg=CFG, fabric=fabric, controller=controller)):
        assert not isinstance(got, BaseException), (r, got)
        out, stats = got
        assert out == [want(c) for c in range(calls)], r
        assert stats["calls"] == {"switch": calls}, stats
        assert stats["switch"]["fallbacks"] == 0, stats
        t = stats["transport"]
        assert (t["faults"], t["rebuilds"], t["redone"]) == (1, 1, 1), t
    first, second = controller.registered
    assert first.ring_id != second.ring_id
    assert first.ring_id in controller.unregistered


def test_a_host_ring_fault_on_fake_qps_while_the_switch_aggregates_leaves_and_returns() -> None:
    """Call 2 runs algo="ring" while the fake switch aggregates (its records through
    "inc"); rank 1's last WRITE of it fails, so the others may complete it and send call
    3's records through the switch. The ranks leave the switch (as for its loss), rebuild the
    host ring, redo call 2 (the ones ahead from its kept input), then return to the switch
    after the back-off; every call exact."""
    fabric = FakeFabric()
    controller = FakeController(fabric)
    calls, per_call = 7, [0]

    def body(comm: Communicator, host: FakeHost) -> Any:
        out = []
        for c in range(calls):
            qps = host.rings["ring"]
            before = qps.delivered
            if c == 2 and comm.rank == FAULTY:
                qps.fail_at = before + per_call[0] - 1
            if c == 4:
                time.sleep(0.6)
            x = data(comm.rank, c)
            comm.allreduce(x, algo="ring" if c in (1, 2) else "auto")
            if c == 1:
                per_call[0] = host.rings["ring"].delivered - before
            out.append((x.tolist(), comm.last_algo))
        return out, comm.stats()

    left_and_returned(run_ranks(N, body, cfg=CFG, fabric=fabric, controller=controller),
                      calls)


def left_and_returned(results: list[Any], calls: int) -> None:
    """Every rank: every call exact, the first and last through the switch, one fallback
    and one return, one fault settled (one rebuild, one call redone)."""
    for r, got in enumerate(results):
        assert not isinstance(got, BaseException), (r, got)
        out, stats = got
        assert [y for y, _ in out] == [want(c) for c in range(calls)], r
        assert out[0][1] == "switch" and out[-1][1] == "switch", out
        assert stats["switch"]["fallbacks"] == 1 and stats["switch"]["returns"] == 1, stats
        t = stats["transport"]
        assert (t["faults"], t["rebuilds"], t["redone"]) == (1, 1, 1), t
