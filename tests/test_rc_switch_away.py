"""Property: a switch that restarts at any moment -- its pipeline state lost, every frame
dropped while it is down, then everything forwarded unaggregated -- under 1 % loss in
every direction costs time, never a result: every call on every rank returns the exact
sum (int32) or the switch path's own float32 result (bit for bit what the switch would
have given when it is finished from the wire words; within the ring's bound when run
again over the ring), nothing raises, and no output is written twice. Runs on the RC
model (tests/rcmodel, docs/rcmodel.md): real Communicators (the whole settle protocol of
netreduce/away.py), real Streams, the real switch pipeline, model rxe.

The model has no controller, so the switch never comes back here: the return (a fresh
"inc" ring registered again) is tested on the in-process fabric (tests/test_switch_away.py)
and in the lab (tests/lab/test_faults.py).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import contextlib
from typing import Iterator
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import netreduce.algorithms.switch as switch_algorithm
import netreduce.away as away_module
from flowctl import FlowConfig
from netreduce.algorithms.ring import RingAllreduce
from netreduce.algorithms.switch import INLINE_BYTES, SwitchAllreduce
from netreduce.meta import RECORD_STRIDE
from netreduce.tools.reference import Reference
from tests.rcmodel.fabric import KINDS, FaultRates, Faults
from tests.rcmodel.rxe import QPAttr
from tests.rcmodel.world import World

CONFIGS = [(256, 1024, 4), (256, 64 * 256, 2), (512, 2048, 3)]
SENTINEL = -7


def data(rank: int, call: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([rank, call, count])
    if dtype == "int32":
        return rng.integers(-2**20, 2**20, count, dtype=np.int32)
    return rng.standard_normal(count).astype(np.float32)


@contextlib.contextmanager
def counting_writes() -> Iterator[Counter]:
    """How many times each output array is written by an algorithm (by id), meanwhile."""
    count: Counter = Counter()
    deliver, run = SwitchAllreduce.deliver, RingAllreduce.run
    inline = switch_algorithm.write_inline

    def counted_deliver(self: Any, call: Any, summed: Any, dst: np.ndarray) -> None:
        count[id(dst)] += 1
        deliver(self, call, summed, dst)

    def counted_run(self: Any, call: Any, src: Any, dst: np.ndarray) -> None:
        count[id(dst)] += 1
        run(self, call, src, dst)

    def counted_inline(total: np.ndarray, dst: np.ndarray) -> None:
        count[id(dst)] += 1
        inline(total, dst)
    with mock.patch.object(SwitchAllreduce, "deliver", counted_deliver), \
            mock.patch.object(RingAllreduce, "run", counted_run), \
            mock.patch.object(switch_algorithm, "write_inline", counted_inline), \
            mock.patch.object(away_module, "write_inline", counted_inline):
        yield count


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    mtu, msg_size, window = draw(st.sampled_from(CONFIGS))
    n = draw(st.integers(2, 4))
    # in call i's last slot, after j of its n results: some ranks get a good seal
    seal = st.tuples(st.just("seal"), st.integers(0, 3), st.integers(1, n - 1))
    return {
        "n": n,
        "config": FlowConfig(mtu=mtu, msg_size=msg_size, window=window, recv_depth=32,
                             collective_timeout=30.0),
        "seed": draw(st.integers(0, 2**32)),
        "calls": draw(st.lists(st.tuples(st.sampled_from(["int32", "int32", "float32"]),
                                         st.one_of(st.integers(1, 32), st.integers(33, 6000))),
                               min_size=2, max_size=4)),
        # when the switch dies: at a simulated time (the calls take ~0.1 ms to ~0.1 s), or
        # right after its k-th emitted frame (the rest of that step's frames lost)
        "at": draw(st.one_of(st.floats(0, 1).map(lambda u: ("at", 1e-5 * 10 ** (4 * u))),
                             st.integers(1, 300).map(lambda k: ("after_results", k)),
                             seal, seal)),
        "down": draw(st.sampled_from([0.0, 1e-4, 3e-3, 0.05])),
    }


def packets(nbytes: int, config: FlowConfig) -> int:
    """Packets of `nbytes` sent on a stream: messages of msg_size, packets of mtu."""
    full, rest = divmod(nbytes, config.msg_size)
    return full * -(-config.msg_size // config.mtu) + -(-rest // config.mtu)


def seal_slot(s: dict[str, Any], i: int) -> int:
    """The switch's slot count at call i's last slot (its seal, or its records' last slot
    for a small call, which travels in them): every call puts its metadata (n records)
    and, all calls here being switch calls, its data and seal on "inc", unless small."""
    n, cfg = s["n"], s["config"]
    return sum(packets(n * RECORD_STRIDE, cfg)
               + (packets(4 * (count + n), cfg) if 4 * count > INLINE_BYTES else 0)
               for _, count in s["calls"][:i + 1])


def run(s: dict[str, Any], writes: Counter) -> tuple[list[Any], World]:
    n, calls = s["n"], s["calls"]
    faults = Faults({kind: FaultRates(loss=0.01) for kind in KINDS}, seed=s["seed"])
    world = World(n, s["config"], faults=faults, attr=QPAttr(mtu=s["config"].mtu, timeout=8),
                  seed=s["seed"], max_time=300)
    how, *when = s["at"]
    if how == "seal":                   # in call i's last slot, after j of its n results
        i = min(when[0], len(calls) - 1)
        how, when = "in_slot", [(seal_slot(s, i), when[1])]
    world.fabric.restart_switch(down_for=s["down"], **{how: when[0]})
    outs: list[Any] = [None] * n

    def body(comm: Any) -> Any:
        got = []
        for i, (dtype, count) in enumerate(calls):
            x = data(comm.rank, i, count, dtype)
            y = np.full(count, SENTINEL, dtype=x.dtype)
            writes[id(y)] = 0         # (an id of an array freed before may come back)
            comm.allreduce(x, out=y)
            assert np.array_equal(x, data(comm.rank, i, count, dtype)), "input changed"
            assert writes[id(y)] == 1, f"call {i}: output written {writes[id(y)]} times"
            got.append((y, comm.last_algo))
        comm.close()          # a rank whose last call had a good seal may settle it there
        return got, comm.stats()
    return world.run(body), world


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenarios())
def test_a_switch_restart_anywhere_costs_time_never_a_result(s: dict[str, Any]) -> None:
    with counting_writes() as writes:
        results, world = run(s, writes)
    n, calls = s["n"], s["calls"]
    for r, got in enumerate(results):
        assert not isinstance(got, BaseException), f"rank {r}: {got!r}"
    stats = [got[1] for got in results]
    assert stats == [stats[0]] * n, stats                    # every rank alike
    for i, (dtype, count) in enumerate(calls):
        algo = results[0][0][i][1]
        assert all(got[0][i][1] == algo for got in results), (i, results)
        ref = Reference(data(r, i, count, dtype) for r in range(n))
        ys = [got[0][i][0] for got in results]
        for y in ys:
            assert ref.failure(y, algo) is None, (i, algo, ref.failure(y, algo))
        assert all(y.tobytes() == ys[0].tobytes() for y in ys), f"call {i} differs by rank"
    switch = stats[0]["switch"]
    event(f"fallbacks={switch['fallbacks']} recovered={switch['recovered']}")
    assert switch["fallbacks"] <= 1 and switch["returns"] == 0, switch
    assert switch["recovered"] <= switch["fallbacks"], switch


@pytest.mark.parametrize("small", [False, True])
def test_a_switch_that_dies_while_it_emits_a_call_gives_its_result_bit_for_bit(
        small: bool) -> None:
    """3 ranks, int32 then float32 under 1 % loss; the switch dies while it emits the
    float32 call's last slot, after 2 of its 3 results: the ranks with a good seal return
    the switch's sum, the other one gets the sum of every rank's wire words over the
    ring. A small call (7 elements) travels in its records, one per packet here: the
    switch dies after 1 of the 3 results of their last packet (after 2, the one rank left
    gets its predecessor's raw packet, which holds that packet's only record: the right
    bytes). The rank that met a zero record sends its record again around the ring with
    the others. Every rank's float32 result is bit for bit the one an undisturbed switch
    gives."""
    cfg = FlowConfig(mtu=256, msg_size=1024, window=4, recv_depth=32, collective_timeout=30.0)
    calls = [("int32", 1000), ("float32", 7 if small else 3000)]
    for seed in range(3):
        s = {"n": 3, "config": cfg, "seed": seed, "calls": calls, "down": 3e-3,
             "at": ("seal", 1, 1 if small else 2)}
        with counting_writes() as writes:
            restarted, world = run(s, writes)
            calm, _ = run({**s, "at": ("at", 1e9)}, writes)
        assert world.fabric.restarts == 1
        for got, want in zip(restarted, calm):
            assert not isinstance(got, BaseException), got
            assert got[1]["switch"] == {"fallbacks": 1, "returns": 0, "recovered": 1}, got[1]
            assert [algo for _, algo in got[0]] == ["switch", "switch"]
            for (y, _), (w, _) in zip(got[0], want[0]):
                assert y.tobytes() == w.tobytes()
