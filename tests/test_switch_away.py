"""A switch that restarts or loses the ring costs one call's time, never the job (issue 24,
docs/reliability.md): the agreement's pure parts, and whole communicators on the
in-process fabric (ranks are threads, the rendezvous is real TCP, the fake switch
aggregates whole messages and can die while it emits a message's sums)."""
from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import pytest

import netreduce.rejoin as rejoin
from flowctl import FlowConfig
from netreduce import Communicator
from netreduce.rejoin import Backoff
from netreduce.routing import FAULT_EVENTS, SwitchUnavailable
from netreduce.settle import SettlePlan, settle_plan
from ring_setup.rendezvous import Rendezvous, RendezvousConfig
from ring_setup.store_server import StoreServer
from tests.fakefabric import FakeController, FakeFabric, FakeHost
from tests.processes import free_port
from tests.ranks import run_ranks

CFG = FlowConfig(mtu=256, msg_size=1024, window=4, recv_depth=64, collective_timeout=20.0)
COUNT = 40          # int32: data + a 3-rank seal = 172 bytes, one message on "inc" (not
#                     inline: more than INLINE_BYTES)


@pytest.fixture(autouse=True)
def quick_rejoin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rejoin, "REJOIN_FIRST", 0.3)
    monkeypatch.setattr(rejoin, "REJOIN_POLL", 0.1)


def test_the_plan_recovers_only_when_some_rank_completed_the_call() -> None:
    assert settle_plan([4, 4, 4]) == SettlePlan(4, False, (0, 1, 2))
    assert settle_plan([4, 5, 4]) == SettlePlan(4, True, (0, 2))
    assert settle_plan([5, 5, 4]) == SettlePlan(4, True, (2,))
    with pytest.raises(ValueError, match=r"positions \[4, 6, 5\] span more than two calls"):
        settle_plan([4, 6, 5])


def test_the_back_off_doubles_while_the_switch_flaps_and_resets_once_stable() -> None:
    now = [0.0]
    b = Backoff(clock=lambda: now[0])
    assert b.lost() == 0.3              # (the fixture's REJOIN_FIRST)
    b.returned()
    now[0] = 10.0
    assert b.lost() == 0.6              # lost again 10 s after the return: a flap
    assert b.failed() == 1.2            # a registration that failed doubles it too
    b.returned()
    now[0] = 10.0 + rejoin.STABLE + 1
    assert b.lost() == 0.3              # a minute on the switch: not a flap
    for _ in range(40):
        b.failed()
    assert b.delay == rejoin.REJOIN_MAX


def test_a_notice_reaches_every_watch_at_once_and_breaks_nothing() -> None:
    port, n = free_port(), 2
    ranks = [Rendezvous(RendezvousConfig(r, n, "127.0.0.1", port, timeout=10,
                                         secret=b"secret-of-the-away-tests")) for r in range(n)]
    ranks[0].join()
    ranks[1].join()
    seen: list[tuple[int, int, str]] = []
    for r in ranks:
        r.watch()
        r.on_notice(lambda e, why, r=r: seen.append((r.rank, e, why)))
    t0 = time.monotonic()
    ranks[1].notice(1, "rank 1: the seal came back wrong")
    ranks[0].notice(1, "rank 0: a later reason of the same epoch")
    while len(seen) < 2 and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    assert time.monotonic() - t0 < 0.9          # answered at once, not after WATCH_INTERVAL
    assert sorted(seen) == [(0, 1, "rank 1: the seal came back wrong"),
                            (1, 1, "rank 1: the seal came back wrong")]
    assert [r.notice_epoch for r in ranks] == [1, 1]
    for r in ranks:
        r.check_peers()                          # a notice is not a failure
    got = [None, None]

    import threading

    def gather(r: Rendezvous) -> None:
        got[r.rank] = r.gather("away.1", {"position": 7 + r.rank}, 5, waiting_for="settled")
    threads = [threading.Thread(target=gather, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == [[{"position": 7}, {"position": 8}]] * 2
    for r in ranks[::-1]:
        threading.Thread(target=r.close, args=(5,)).start()


def test_the_store_refuses_a_malformed_notice() -> None:
    server = StoreServer(0, 1, "127.0.0.1", b"secret-of-the-away-tests")
    try:
        for bad in (0, -1, "1", True, 1 << 21):
            with pytest.raises(Exception, match="a notice's epoch is a number in 1"):
                server._handle({"op": "notice", "epoch": bad, "reason": "x"}, 0)
    finally:
        server.stop(0)


def data(rank: int, call: int) -> np.ndarray:
    return (np.arange(COUNT, dtype=np.int32) * (rank + 1) + 1000 * call)


def want(n: int, call: int) -> list[int]:
    return sum(data(r, call).astype(np.int64) for r in range(n)).astype(np.int32).tolist()


def job(calls: int, before: Any = None, idle: dict[int, float] | None = None):
    """Each rank runs `calls` auto calls of `data(rank, call)` (out= a fresh array: a
    double write would show), `before(comm, call)` first; returns per call the result,
    the algorithm and the fallback reason, then the stats."""
    def body(comm: Communicator, host: FakeHost) -> Any:
        out = []
        for c in range(calls):
            if before is not None:
                before(comm, c)
            x = data(comm.rank, c)
            y = np.full(COUNT, -7, dtype=np.int32)
            comm.allreduce(x, out=y)
            assert np.array_equal(x, data(comm.rank, c)), "the input changed"
            out.append((y.tolist(), comm.last_algo, comm.last_fallback))
            if idle and c in idle:
                time.sleep(idle[c])
        return out, comm.stats()
    return body


def wait_back(comm: Communicator, c: int) -> None:
    """From call 3 on, give rank 0's Rejoiner time to see the controller answer."""
    if c == 3:
        time.sleep(0.6)


def restart_before_call_1(controller: FakeController) -> Any:
    """A job's `before`: rank 0 restarts the fake switch before call 1 (every rank then
    waits a little), and from then on each rank waits for the switch as `wait_back` does."""
    def before(comm: Communicator, c: int) -> None:
        if c == 1 and comm.rank == 0:
            controller.restart()
        if c == 1:
            time.sleep(0.5)
        wait_back(comm, c)
    return before


@pytest.mark.parametrize("lease_ms", [0, 300])
def test_a_fake_switch_restarted_between_calls_costs_nothing_and_the_ring_returns(
        lease_ms: int, caplog: pytest.LogCaptureFixture) -> None:
    """lease_ms=0: call 1's metadata comes back unaggregated on every rank; 300: the lease
    keepers (ranks 0 and 1) hear NOT_FOUND first and every rank settles while idle. Every
    call exact; from call 1 over the ring until rank 0's Ping answers and the next call
    rebuilds "inc" and registers it again (a new ring id), all ranks alike; then through
    the switch."""
    fabric = FakeFabric()
    controller = FakeController(fabric, lease_ms=lease_ms)

    before = restart_before_call_1(controller)

    caplog.set_level(logging.WARNING, "netreduce")
    results = run_ranks(3, job(6, before), cfg=CFG, fabric=fabric, controller=controller,
                        controller_ranks=(0, 1))
    routes = []
    for r, got in enumerate(results):
        assert not isinstance(got, BaseException), (r, got)
        calls, stats = got
        assert [y for y, _, _ in calls] == [want(3, c) for c in range(6)]
        routes.append([(a, f) for _, a, f in calls])
        back = 1 + routes[-1][1:].index(("switch", None))   # the first call through it again
        assert routes[-1] == [("switch", None)] + [("ring", "switch-away")] * (back - 1) \
            + [("switch", None)] * (6 - back), routes[-1]
        assert stats == {"calls": {"switch": 7 - back, "ring": back - 1},
                         "fallbacks": {"switch-away": back - 1},
                         "switch": {"fallbacks": 1, "returns": 1, "recovered": 0},
                         "transport": dict.fromkeys(FAULT_EVENTS, 0)}
    assert routes == [routes[0]] * 3 and 2 <= back <= 4, routes
    first, second = controller.registered
    assert first.ring_id != second.ring_id
    assert {c.dst_qpn for c in first.connections}.isdisjoint(c.dst_qpn for c in
                                                             second.connections)
    assert controller.unregistered[-1] == second.ring_id
    if lease_ms:
        assert second.ring_id in controller.renewed    # the new ring's lease is kept
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("netreduce")]
    fell = [m for m in lines if "stopped aggregating ring" in m]
    returned = [m for m in lines if m.startswith("netreduce: back on the switch")]
    assert len(fell) == 1 and len(returned) == 1, lines
    assert f"ring {first.ring_id}" in fell[0] and "fallback 1 at call #1" in fell[0], fell
    assert "call #1 on runs over the host ring" in fell[0], fell
    assert f"ring {second.ring_id} registered at call #{back - 1}" in returned[0], returned
    assert f"calls from #{back} on aggregate in the network again" in returned[0], returned
    assert "returns 1" in returned[0], returned


@pytest.mark.parametrize("idle", [False, True])
def test_a_fake_switch_lost_while_it_emits_a_call_finishes_it_from_the_wire_words(
        idle: bool) -> None:
    """The switch dies while it emits call 1's sums: rank 0's successor gets the sum (a
    good seal: it returns), the other two their predecessor's raw data (a bad seal). Rank
    1 then idles (settled on its progress thread) or goes on to call 2 (settled inside
    it, then call 2 redone over the ring). Either way every rank's call 1 is exact --
    the ranks without a good seal write the sum of every rank's kept wire words, summed
    over the host ring -- and nobody's output is written twice."""
    fabric = FakeFabric()
    controller = FakeController(fabric)
    fabric.switch.cut = lambda ring, index: 1 if index == 3 else None   # call 1's data

    results = run_ranks(3, job(4, wait_back, {1: 1.0} if idle else None), cfg=CFG,
                        fabric=fabric, controller=controller, controller_ranks=(0, 1))
    routes = []
    for r, got in enumerate(results):
        assert not isinstance(got, BaseException), (r, got)
        calls, stats = got
        assert [y for y, _, _ in calls] == [want(3, c) for c in range(4)]
        routes.append([a for _, a, _ in calls])
        assert routes[-1][:3] == ["switch", "switch", "ring"], (r, calls)
        assert stats["switch"] == {"fallbacks": 1, "returns": 1, "recovered": 1}, stats
    assert routes == [routes[0]] * 3 and routes[0][3] in ("ring", "switch"), routes
    assert len(controller.registered) == 2


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_a_fake_switch_lost_while_it_emits_a_small_calls_records_finishes_it_from_them(
        dtype: str) -> None:
    """A small call travels in its records, one message on "inc" (INLINE). The switch
    dies while it emits call 1's records: rank 0's successor gets every record (its call
    is complete: it returns), the other two their predecessor's own bank. Every rank sends
    its record of call 1 again around the host ring; the two write the result from those,
    the first checks that the switch gave it the same. Every rank's call 1 holds the same
    bits (the float64 sum in rank order, rounded once), nobody's output is written twice,
    and call 2 on runs over the ring until the switch is back."""
    fabric = FakeFabric()
    controller = FakeController(fabric)
    fabric.switch.cut = lambda ring, index: 1 if index == 1 else None   # call 1's records

    def small(rank: int, call: int) -> np.ndarray:
        return (np.arange(5) * (rank + 1) + 0.1 * rank + 1000 * call).astype(dtype)

    def body(comm: Communicator, host: FakeHost) -> Any:
        out = []
        for c in range(4):
            x = small(comm.rank, c)
            y = np.full(x.shape, -7, dtype=x.dtype)
            assert comm.allreduce(x, out=y) is y
            assert np.array_equal(x, small(comm.rank, c)), "the input changed"
            out.append((y.tobytes(), comm.last_algo))
        return out, comm.stats()["switch"]

    results = run_ranks(3, body, cfg=CFG, fabric=fabric, controller=controller,
                        controller_ranks=(0, 1))
    wanted = [np.add.reduce(np.stack([small(r, c) for r in range(3)]).astype(np.float64),
                            axis=0).astype(dtype).tobytes() for c in range(4)]
    for r, got in enumerate(results):
        assert not isinstance(got, BaseException), (r, got)
        calls, stats = got
        assert [y for y, _ in calls[:2]] == wanted[:2], r        # the switch's, recovered
        assert [a for _, a in calls[:3]] == ["switch", "switch", "ring"], (r, calls)
        assert stats["fallbacks"] == 1 and stats["recovered"] == 1, stats
        if dtype == "int32":
            assert [y for y, _ in calls] == wanted, r                  # exact on every route


def test_algo_switch_while_the_fake_switch_is_away_is_refused_alike_and_leaves_it_usable(
        ) -> None:
    fabric = FakeFabric()
    controller = FakeController(fabric)

    def body(comm: Communicator, host: FakeHost) -> Any:
        comm.allreduce(np.ones(COUNT, dtype=np.int32), algo="switch")
        if comm.rank == 0:
            controller.restart()
        time.sleep(0.3)
        x = np.ones(COUNT, dtype=np.int32)
        errors = []
        for _ in range(2):          # in flight (its metadata comes back raw), then before it
            try:
                comm.allreduce(x, algo="switch")
            except SwitchUnavailable as exc:
                errors.append(str(exc))
        assert x.tolist() == [1] * COUNT
        comm.allreduce(x)
        return errors, x.tolist(), comm.last_algo

    for errors, x, algo in run_ranks(3, body, cfg=CFG, fabric=fabric, controller=controller):
        assert len(errors) == 2 and all(
            e.startswith("allreduce: algo='switch': the switch at fake-controller:1 is away (")
            and "nothing moved" in e for e in errors), errors
        assert (x, algo) == ([3] * COUNT, "ring")


def test_the_wire_words_survive_the_next_call_growing_the_workspace() -> None:
    """Like the test above, but the good rank's next call is large enough to grow its
    workspace before its metadata exchange: the old buffer (its wire words of call 1,
    where its predecessor's recovery ring writes) stays registered until the settle."""
    fabric = FakeFabric()
    controller = FakeController(fabric)
    fabric.switch.cut = lambda ring, index: 1 if index == 3 else None   # call 1's data
    big = 40_000                                  # 160 KB of int32: past the 64 KiB start

    def body(comm: Communicator, host: FakeHost) -> Any:
        out = []
        for c, count in enumerate((COUNT, COUNT, big)):
            x = (np.arange(count, dtype=np.int32) * (comm.rank + 1) + 1000 * c)
            y = comm.allreduce(x, out=np.zeros_like(x))
            out.append((y.tolist() == (np.arange(count) * 6 + 3000 * c).tolist(),
                        comm.last_algo))
        return out, comm.stats()["switch"]

    for got in run_ranks(3, body, cfg=CFG, fabric=fabric, controller=controller):
        assert not isinstance(got, BaseException), got
        assert got == ([(True, "switch"), (True, "switch"), (True, "ring")],
                       {"fallbacks": 1, "returns": 0, "recovered": 1}), got


def test_the_inc_ring_keeps_its_own_address_when_rebuilt_on_the_fake_fabric() -> None:
    """Every rank's "inc" ring on a second address (as routed through a one-armed
    aggregator, docs/switch.md), the host ring on the host's: both registrations of the
    ring (before and after the switch's restart) name the "inc" addresses, and every call
    is exact."""
    fabric = FakeFabric()
    controller = FakeController(fabric)
    inc_ip = "10.98.0.{}".format

    before = restart_before_call_1(controller)

    results = run_ranks(3, job(5, before), cfg=CFG, fabric=fabric, controller=controller,
                        ring_addrs=lambda rank: {"inc": inc_ip(rank + 1)})
    for r, got in enumerate(results):
        assert not isinstance(got, BaseException), (r, got)
        assert [y for y, _, _ in got[0]] == [want(3, c) for c in range(5)]
    assert len(controller.registered) == 2
    for spec in controller.registered:
        assert [(c.src_ip, c.dst_ip) for c in spec.connections] == \
            [(inc_ip(r + 1), inc_ip((r + 1) % 3 + 1)) for r in range(3)]
