"""Calls in flight (issue 41): asynchronous calls with K = in_flight outstanding, whole
communicators on the in-process fake fabric (tests/fakefabric.py: ranks are threads, the
fake switch sums each message of the registered "inc" ring); results against numpy sums,
the wire order observed on the fake links themselves."""
from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

import netreduce.rejoin as rejoin
import netreduce.transport_fault as tf
from netreduce import Communicator
from flowctl.link import RemoteBuffer
from netreduce import CommunicatorError, PeerFailure
from netreduce.inflight import in_flight_setting
from netreduce.meta import IN_FLIGHT, AllreduceMismatch, CallMeta, CallRejected, check_agreement
from tests.fakefabric import FakeController, FakeFabric, FakeHost, FakeLink
from tests.ranks import run_ranks
from tests.test_faults import die

N = 3
COUNT = 100             # int32: one 412-byte data message per call at CFG's 1 KiB messages
CALLS = 8


@pytest.fixture(autouse=True)
def k4(monkeypatch: pytest.MonkeyPatch) -> None:
    """K = 4 calls in flight on every rank; quick back-offs for the fault tests."""
    monkeypatch.setenv("NR_IN_FLIGHT", "4")
    monkeypatch.setattr(tf, "BACKOFF_FIRST", 0.01)
    monkeypatch.setattr(rejoin, "REJOIN_FIRST", 0.3)
    monkeypatch.setattr(rejoin, "REJOIN_POLL", 0.1)


SMALL = 5               # call 5 is small (10 int32): it travels in its records (INLINE)


def data(rank: int, call: int) -> np.ndarray:
    x = np.arange(COUNT, dtype=np.int32) * (rank + 1) + 1000 * call
    return x[:10] if call == SMALL else x


def want(call: int) -> list[int]:
    return sum(data(r, call).astype(np.int64) for r in range(N)).astype(np.int32).tolist()


def async_job(calls: int, algo: dict[int, str] | None = None,
              args: Any = None, before: Any = None) -> Any:
    """Each rank submits `calls` async int32 sums at once (out= a fresh array), then waits
    for them all; per call (result or exception, the output array untouched-check), the
    order the Works completed in, and the stats. `args(rank, call)` may replace a call's
    input; `before(comm, host)` runs first."""
    def body(comm: Communicator, host: FakeHost) -> Any:
        if before is not None:
            before(comm, host)
        done: list[int] = []
        lock = threading.Lock()
        works, outs = [], []
        for c in range(calls):
            x = data(comm.rank, c) if args is None else args(comm.rank, c)
            y = np.full(x.shape, -7, dtype=np.int32)
            w = comm.allreduce(x, out=y, algo=(algo or {}).get(c, "auto"), async_op=True)
            w.add_done_callback(lambda _, c=c: (lock.acquire(), done.append(c), lock.release()))
            works.append(w)
            outs.append(y)
        got: list[Any] = []
        for w, y in zip(works, outs):
            try:
                w.wait(30)
                got.append(y.tolist())
            except CallRejected as exc:
                got.append((exc, bool(np.all(y == -7))))
        return got, done, comm.stats()
    return body


def check_exact(results: list[Any], calls: int, skip: tuple[int, ...] = ()) -> None:
    for r, res in enumerate(results):
        assert not isinstance(res, BaseException), (r, res)
        got, done, _ = res
        assert done == list(range(calls)), (r, done)           # completion in issue order
        for c in range(calls):
            if c not in skip:
                assert got[c] == want(c), (r, c)


def test_k4_async_calls_through_the_fake_switch_are_numpy_exact_in_order() -> None:
    """Every call exact and complete in issue order, the ranks' records going ahead (some
    calls' records posted behind the previous call's data); two calls over the host ring
    and a small (inline) one among them keep their place."""
    fabric = FakeFabric()
    algo = {3: "ring", 6: "ring"}
    results = run_ranks(N, async_job(CALLS, algo), fabric=fabric,
                        controller=FakeController(fabric))
    check_exact(results, CALLS)
    for _, _, stats in results:
        assert stats["calls"] == {"switch": CALLS - 2, "ring": 2}, stats


def test_in_flight_setting_takes_the_argument_the_environment_and_refuses_bad_values(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert in_flight_setting(None) == 4
    assert in_flight_setting(2) == 2
    monkeypatch.delenv("NR_IN_FLIGHT")
    assert in_flight_setting(None) == 1
    for bad in (0, -3):
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            in_flight_setting(bad)
    monkeypatch.setenv("NR_IN_FLIGHT", "many")
    with pytest.raises(ValueError, match="'many'"):
        in_flight_setting(None)


def test_a_refused_call_among_k4_fake_calls_in_flight_refuses_alone() -> None:
    """Call 3 (algo="switch") would overflow int32 and call 5 disagrees in shape on rank
    1: each is refused alike on every rank, its output untouched; every other call is
    exact, in order, and the communicator stays usable."""
    def args(rank: int, call: int) -> np.ndarray:
        if call == 3:
            return np.full(COUNT, 2**30, dtype=np.int32)
        if call == 5 and rank == 1:
            return data(rank, call)[:-2]
        return data(rank, call)

    fabric = FakeFabric()
    results = run_ranks(N, async_job(CALLS, {3: "switch"}, args), fabric=fabric,
                        controller=FakeController(fabric))
    check_exact(results, CALLS, skip=(3, 5))
    for got, _, stats in results:
        (over, untouched3), (mismatch, untouched5) = got[3], got[5]
        assert "may overflow" in str(over) and untouched3
        assert isinstance(mismatch, AllreduceMismatch) and untouched5
        assert stats["calls"] == {"switch": CALLS - 2}, stats
    assert len({str(got[3][0]) for got, _, _ in results}) == 1


def test_a_fake_switch_lost_with_k4_calls_in_flight_recovers_every_call_once() -> None:
    """The fake switch dies while it emits call 2's data (message 5 on "inc": records and
    data alternate, one message each): rank 0's successor gets the sum, the others their
    predecessor's data, while calls 3.. are queued with call 3's records already behind
    call 2's data. Every call exact, once, in order; the ranks fall back and return."""
    fabric = FakeFabric()
    controller = FakeController(fabric)
    fabric.switch.cut = lambda ring, index: 1 if index == 5 else None

    def later(comm: Communicator, host: FakeHost) -> None:
        time.sleep(0.05)

    results = run_ranks(N, async_job(CALLS, before=later), fabric=fabric,
                        controller=controller)
    check_exact(results, CALLS)
    for _, _, stats in results:
        assert stats["switch"]["fallbacks"] == 1 and stats["switch"]["recovered"] == 1, stats


def test_an_inc_fault_on_fake_qps_with_k4_calls_in_flight_recovers_every_call_once() -> None:
    """Rank 1's "inc" QPs fail a WRITE in call 2 (its records behind call 1's data, or
    its data): every call exact, once, in order; one fault. No rank had completed the
    call: "inc" rebuilt at once, the call redone through the switch, no fallback; else
    (the threads' timing decides) a good rank's sum handed over, the switch left."""
    fabric = FakeFabric()
    controller = FakeController(fabric)

    def fail(comm: Communicator, host: FakeHost) -> None:
        if comm.rank == 1:
            host.rings["inc"].fail_at = host.rings["inc"].delivered + 4

    results = run_ranks(N, async_job(CALLS, before=fail), fabric=fabric,
                        controller=controller)
    check_exact(results, CALLS)
    for _, _, stats in results:
        switch, t = stats["switch"], stats["transport"]
        assert t["faults"] == 1 and switch["fallbacks"] + t["rebuilds"] == 1, stats
        assert switch["fallbacks"] == switch["recovered"], stats
        assert switch["fallbacks"] or stats["calls"] == {"switch": CALLS}, stats


def observe_rank0_inc(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, int]], Any]:
    """Rank 0's fake "inc" link, observed: ("post", message index) and ("arrived", index)
    in the order they happened; the `before` hook that names the link (rank 0's)."""
    events: list[tuple[str, int]] = []
    links: dict[int, Any] = {}
    post, poll = FakeLink.post_write, FakeLink.poll_recvs

    def post_write(self: FakeLink, index: int, src: Any, dst: Any) -> None:
        if self.qps is links.get(0):
            events.append(("post", index))
        post(self, index, src, dst)

    def poll_recvs(self: FakeLink, max_count: int) -> Any:
        got = poll(self, max_count)
        if self.qps is links.get(0):
            events.extend(("arrived", c.index) for c in got)
        return got

    monkeypatch.setattr(FakeLink, "post_write", post_write)
    monkeypatch.setattr(FakeLink, "poll_recvs", poll_recvs)

    def record_link(comm: Communicator, host: FakeHost) -> None:
        links[comm.rank] = host.rings["inc"]
    return events, record_link


def early(events: list[tuple[str, int]], records: list[int]) -> list[int]:
    """The calls c whose next call's records (message records[c + 1]) were posted before
    c's data (the message after records[c]) arrived."""
    return [c for c in range(len(records) - 1) if records[c + 1] == records[c] + 2
            and events.index(("post", records[c + 1])) < events.index(("arrived",
                                                                       records[c] + 1))]


@pytest.mark.parametrize("k", [1, 4])
def test_the_next_calls_records_leave_before_this_calls_data_complete_on_the_fake_links(
        k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Observed on rank 0's fake "inc" link (each call's records and data one message each).
    With K = 4 the records of call c+1 are posted before the sum of call c's data has
    arrived (K = 1: only after)."""
    monkeypatch.setenv("NR_IN_FLIGHT", str(k))
    events, record_link = observe_rank0_inc(monkeypatch)
    fabric = FakeFabric()
    results = run_ranks(N, async_job(CALLS, before=record_link), fabric=fabric,
                        controller=FakeController(fabric))
    check_exact(results, CALLS)
    # messages: call c's records, then its data (none for the small call SMALL)
    ahead = early(events, [2 * c - (c > SMALL) for c in range(CALLS)])
    if k == 1:
        assert ahead == []
    else:
        assert len(ahead) >= CALLS - 4, (ahead, events)


def test_jobs_submitted_with_their_first_call_send_its_records_ahead_on_the_fake_links(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The DDP hook's way (`comm.submit(job, what, first=(array, op, algo))`): each job
    averages its float32 buffer in place with a synchronous call on the progress thread;
    the records of the next job's call go ahead, every average within float32 rounding."""
    events, record_link = observe_rank0_inc(monkeypatch)
    fabric = FakeFabric()

    def body(comm: Communicator, host: FakeHost) -> Any:
        record_link(comm, host)
        xs = [data(comm.rank, c).astype(np.float32) for c in range(4)]
        works = [comm.submit(lambda x=x: comm.allreduce(x, op="avg"), f"job {c}",
                             first=(x, "avg", "auto")) for c, x in enumerate(xs)]
        return [w.wait(30).tolist() for w in works]

    results = run_ranks(N, body, fabric=fabric, controller=FakeController(fabric))
    for got in results:
        assert not isinstance(got, BaseException), got
        for c in range(4):
            assert np.allclose(got[c], np.array(want(c)) / N, rtol=1e-6), c
    assert len(early(events, [0, 2, 4, 6])) >= 2, events


def test_a_rank_dying_with_k4_fake_calls_in_flight_is_named_and_the_rest_fail_alike() -> None:
    """Rank 2 completes calls 0 and 1, then dies; the others have calls 0..5 issued, call
    2's records already behind call 1's data: calls 0 and 1 exact, call 2 `PeerFailure`
    naming rank 2, the calls after it `CommunicatorError` (the communicator unusable)."""
    fabric = FakeFabric()

    def body(comm: Communicator, host: FakeHost) -> Any:
        calls = 2 if comm.rank == 2 else 6
        works = [comm.allreduce(data(comm.rank, c), async_op=True) for c in range(calls)]
        got: list[Any] = []
        for w in works:
            try:
                got.append(w.wait(30).tolist())
            except CommunicatorError as exc:
                got.append(exc)
        if comm.rank == 2:
            die(comm)
        return got

    results = run_ranks(N, body, fabric=fabric, controller=FakeController(fabric))
    assert results[2] == [want(0), want(1)]
    for r in (0, 1):
        got = results[r]
        assert got[:2] == [want(0), want(1)], r
        assert isinstance(got[2], PeerFailure) and got[2].ranks == [2], got[2]
        assert all(type(e) is CommunicatorError and "unusable" in str(e) for e in got[3:]), got


def test_ranks_that_disagree_on_calls_in_flight_are_refused_alike() -> None:
    def record(rank: int, flags: int) -> CallMeta:
        return CallMeta(rank, 0, 10, "int32", "sum", "auto", RemoteBuffer(0, 0, 0),
                        flags=flags)
    with pytest.raises(AllreduceMismatch, match=r"in_flight > 1 on rank 1, 1 on the others"):
        check_agreement([record(0, 0), record(1, IN_FLIGHT), record(2, 0)])
    check_agreement([record(r, IN_FLIGHT) for r in range(3)])


def test_a_host_ring_fault_on_fake_qps_amid_k4_calls_in_flight_recovers_every_call_once() -> None:
    """Call 3 runs algo="ring" amid switch calls (its records behind call 2's data); rank
    1's third "ring" WRITE of it fails: a transport fault, settled (the ranks leave the
    switch, rebuild the host ring, redo call 3); every call exact, once, in order."""
    fabric = FakeFabric()

    def fail(comm: Communicator, host: FakeHost) -> None:
        if comm.rank == 1:
            host.rings["ring"].fail_at = host.rings["ring"].delivered + 2

    results = run_ranks(N, async_job(CALLS, {3: "ring"}, before=fail), fabric=fabric,
                        controller=FakeController(fabric))
    check_exact(results, CALLS)
    for _, _, stats in results:
        t = stats["transport"]
        assert (t["faults"], t["rebuilds"], t["redone"]) == (1, 1, 1), t
        assert stats["switch"]["fallbacks"] == 1, stats


def test_k4_fake_calls_in_place_on_one_buffer_each_reduce_the_previous_result() -> None:
    """Three async in-place calls on the same float32 buffer: each reduces what the one
    before returned (x, then n x sum, then n^2 x sum), so no call's records may be taken
    from the buffer before the call ahead of it wrote its result there."""
    fabric = FakeFabric()

    def body(comm: Communicator, host: FakeHost) -> Any:
        x = np.random.default_rng(comm.rank).standard_normal(COUNT).astype(np.float32) * 1000
        works = [comm.allreduce(x, async_op=True) for _ in range(3)]
        for w in works:
            w.wait(30)
        return x

    results = run_ranks(N, body, fabric=fabric, controller=FakeController(fabric))
    total = sum(np.random.default_rng(r).standard_normal(COUNT).astype(np.float32) * 1000
                for r in range(N))
    for x in results:
        assert not isinstance(x, BaseException), x
        assert np.allclose(x, total.astype(np.float64) * N * N, rtol=1e-4, atol=1e-2), x[:4]
