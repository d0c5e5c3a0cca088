"""Calls in flight in the RC model (tests/rcmodel/inflight.py): K asynchronous calls
outstanding, every result exact, the time per call against the closed form
`formula_in_flight_us` (K >= 2: the metadata round hidden behind the data)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings

from netreduce.tools.reference import Reference
from tests.ranks import RankEngine
from tests.rcmodel.fabric import KINDS, FaultRates, Faults
from tests.rcmodel.inflight import formula_in_flight_us, run
from tests.rcmodel.rxe import QPAttr
from tests.rcmodel.world import World
from tests.test_rc_switch_away import SENTINEL, counting_writes, data, scenarios, seal_slot


@pytest.mark.parametrize("n,size,k", [(4, 65536, 1), (4, 65536, 2), (4, 65536, 4),
                                      (4, 131072, 4), (4, 262144, 4), (64, 65536, 4)])
def test_model_calls_in_flight_follow_the_closed_form(n: int, size: int, k: int) -> None:
    p = run(n, size, k, calls=6)
    assert p.exact
    assert p.per_call_us == pytest.approx(formula_in_flight_us(size, n, k), rel=0.01)
    assert (k - 1) * p.per_call_us <= p.latency_us <= 1.05 * k * p.per_call_us


def test_model_k4_hides_the_metadata_round_at_64_kib() -> None:
    """At 64 KiB on 4 ranks the bank's round trip is ~12 % of a call: K = 4 hides it (10
    us of links, 0.9 us of its packet's store and forward)."""
    one, four = run(4, 65536, 1, calls=6), run(4, 65536, 4, calls=6)
    assert one.per_call_us - four.per_call_us == pytest.approx(10.87, rel=0.05)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_model_switch_restart_with_k4_calls_in_flight_costs_time_never_a_result(
        s: dict[str, Any]) -> None:
    """tests/test_rc_switch_away.py's property with every call asynchronous, all issued at
    once, K = 4 (the wire order is the same, so the restart points are too): 1 % loss,
    the switch restarts anywhere; every call exact (float32: within its algorithm's
    bound), written once, alike on every rank; at most one fallback."""
    n, calls = s["n"], s["calls"]
    faults = Faults({kind: FaultRates(loss=0.01) for kind in KINDS}, seed=s["seed"])
    world = World(n, s["config"], faults=faults, attr=QPAttr(mtu=s["config"].mtu, timeout=8),
                  seed=s["seed"], max_time=300, in_flight=4)
    how, *when = s["at"]
    if how == "seal":
        how, when = "in_slot", [(seal_slot(s, min(when[0], len(calls) - 1)), when[1])]
    world.fabric.restart_switch(down_for=s["down"], **{how: when[0]})

    def body(comm: Any) -> Any:
        engine = comm._engine = RankEngine(f"model rank {comm.rank}")
        issued = []
        for i, (dtype, count) in enumerate(calls):
            y = np.full(count, SENTINEL, dtype=dtype)
            writes[id(y)] = 0
            issued.append((comm.allreduce(data(comm.rank, i, count, dtype), out=y,
                                          async_op=True), y))
        got = []
        for work, y in issued:
            engine.run_next()
            work.wait(0)
            got.append((y, comm.last_algo, writes[id(y)]))
        comm.close()
        return got, comm.stats()

    with counting_writes() as writes:
        results = world.run(body)
    for r, res in enumerate(results):
        assert not isinstance(res, BaseException), f"rank {r}: {res!r}"
    stats = [res[1] for res in results]
    assert stats == [stats[0]] * n, stats
    for i, (dtype, count) in enumerate(calls):
        ref = Reference(data(r, i, count, dtype) for r in range(n))
        ys = [res[0][i] for res in results]
        assert {algo for _, algo, _ in ys} == {ys[0][1]} and {w for *_, w in ys} == {1}, ys
        assert all(ref.failure(y, algo) is None for y, algo, _ in ys), i
        assert all(y.tobytes() == ys[0][0].tobytes() for y, _, _ in ys), i
    switch = stats[0]["switch"]
    event(f"fallbacks={switch['fallbacks']} recovered={switch['recovered']}")
    assert switch["fallbacks"] <= 1, stats[0]
