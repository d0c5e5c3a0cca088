"""The routing point (netreduce/routing.py), pure: which algorithm an agreed call runs, from
the requested algo, the call's agreed fields and every rank's range only."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowctl.link import RemoteBuffer
from netreduce.algorithms import CallContext
from netreduce.algorithms.ring import RING
from netreduce.algorithms.switch import SWITCH, AllreduceOverflow, NotQuantizable
from netreduce.registration import SwitchStatus
from netreduce.routing import (DTYPE, FALLBACKS, FAULT_EVENTS, NON_FINITE, OP, CallStats, Route,
                               SwitchUnavailable, candidates, check_request, route)

REGISTERED = SwitchStatus(controller="ctl:1", ring_id="nr-test", slots=256)
NONE = SwitchStatus()


def call(dtype: str = "float32", ranges: tuple[tuple[float, float], ...] = ((-1.0, 2.0),) * 3,
         rank: int = 0, op: np.ufunc = np.add) -> CallContext:
    """An agreed call as rank `rank` sees it (the workspace and streams are never touched by
    routing)."""
    return CallContext(rank=rank, world_size=len(ranges), seq=7, count=10,
                       dtype=np.dtype(dtype), op=op, divisor=1, ranges=ranges, workspace=None,  # type: ignore[arg-type]
                       peer_workspace=RemoteBuffer(0, 0, 0), streams={})


def test_auto_takes_the_switch_when_it_can_carry_the_call() -> None:
    assert route("auto", call(), "sum", switch=True) == Route(SWITCH)
    assert route("auto", call("int32", ((0, 5),) * 3), "sum", switch=True) == Route(SWITCH)


def test_auto_without_a_switch_runs_the_ring_and_that_is_no_fallback() -> None:
    assert route("auto", call(), "sum", switch=False) == Route(RING, None)
    assert route("auto", call("float64"), "max", switch=False) == Route(RING, None)


@pytest.mark.parametrize("dtype, op, ranges, reason", [
    ("float32", "sum", ((1.0, 2.0), (math.nan, math.nan), (0.0, 1.0)), NON_FINITE),
    ("float32", "sum", ((1.0, math.inf), (0.0, 1.0), (0.0, 1.0)), NON_FINITE),
    ("float32", "sum", ((-math.inf, 0.0), (0.0, 1.0), (0.0, 1.0)), NON_FINITE),
    ("float64", "sum", ((0.0, 0.0),) * 3, DTYPE),
    ("int64", "sum", ((0.0, 0.0),) * 3, DTYPE),
    ("int32", "max", ((0.0, 0.0),) * 3, OP),
    ("float32", "min", ((0.0, 0.0),) * 3, OP),
])
def test_auto_routes_what_the_switch_cannot_carry_to_the_ring_saying_why(
        dtype: str, op: str, ranges: tuple, reason: str) -> None:
    taken = route("auto", call(dtype, ranges), op, switch=True)
    assert taken == Route(RING, reason) and reason in FALLBACKS


def test_explicit_algorithms_are_never_substituted() -> None:
    nan = call(ranges=((0.0, 1.0), (math.nan, math.nan)))
    with pytest.raises(NotQuantizable, match=r"call #7: .*in the data of rank 1"):
        route("switch", nan, "sum", switch=True)
    assert route("ring", nan, "sum", switch=True) == Route(RING)
    assert route("switch", call(), "sum", switch=True) == Route(SWITCH)


def test_an_int32_sum_that_may_overflow_is_refused_under_auto_too() -> None:
    """The ring would wrap silently: "auto" does not trade a refusal for a wrong sum."""
    for algo in ("auto", "switch"):
        with pytest.raises(AllreduceOverflow):
            route(algo, call("int32", ((0, 2**30),) * 2), "sum", switch=True)


def test_candidates_size_the_workspace_for_every_route_the_call_may_take() -> None:
    f32, f64 = np.dtype("float32"), np.dtype("float64")
    assert candidates("auto", f32, "sum", REGISTERED) == (SWITCH, RING)
    assert candidates("auto", f32, "max", REGISTERED) == (RING,)
    assert candidates("auto", f64, "sum", REGISTERED) == (RING,)
    assert candidates("auto", f32, "sum", NONE) == (RING,)
    assert candidates("ring", f32, "sum", REGISTERED) == (RING,)
    assert candidates("switch", f32, "sum", REGISTERED) == (SWITCH,)
    assert candidates("auto", f32, "sum", REGISTERED, away="restarted") == (RING,)
    with pytest.raises(SwitchUnavailable, match="the switch at ctl:1 is away \\(restarted\\)"):
        candidates("switch", f32, "sum", REGISTERED, away="restarted")


def test_a_request_the_call_cannot_satisfy_is_refused_before_any_exchange() -> None:
    f32, f64 = np.dtype("float32"), np.dtype("float64")
    for algo, status in (("auto", NONE), ("auto", REGISTERED), ("ring", NONE),
                         ("switch", REGISTERED)):
        check_request(algo, f32, "sum", status)
    with pytest.raises(TypeError, match="reduces int32, float32, float16 and bfloat16 only"):
        check_request("switch", f64, "sum", REGISTERED)
    with pytest.raises(ValueError, match="supports op='sum' and op='avg' only, not 'max'"):
        check_request("switch", f32, "max", REGISTERED)
    with pytest.raises(ValueError, match="needs the communicator's 'inc' ring registered"):
        check_request("switch", f32, "sum", NONE)
    with pytest.raises(ValueError, match="unknown algo 'tree'"):
        check_request("tree", f32, "sum", REGISTERED)


finite_or_not = st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False),
                          st.sampled_from([math.nan, math.inf, -math.inf]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(finite_or_not, finite_or_not), min_size=2, max_size=9),
       st.booleans())
def test_every_rank_routes_alike_from_the_exchanged_ranges(ranges: list, switch: bool) -> None:
    """The route is a function of the agreed records: each rank (its own rank, workspace and
    streams differ) takes the same one, and "auto" falls back exactly when some rank's data
    holds NaN or infinity."""
    agreed = tuple((min(a, b), max(a, b)) if not (math.isnan(a) or math.isnan(b))
                   else (math.nan, math.nan) for a, b in ranges)
    routes = {route("auto", call(ranges=agreed, rank=r), "sum", switch)
              for r in range(len(agreed))}
    (taken,) = routes
    bad = not all(math.isfinite(v) for pair in agreed for v in pair)
    if not switch:
        assert taken == Route(RING)
    else:
        assert taken == (Route(RING, NON_FINITE) if bad else Route(SWITCH))


def test_stats_count_routes_and_fallbacks_and_flag_each_reason_once() -> None:
    stats = CallStats()
    firsts = [stats.count(r) for r in (Route(SWITCH), Route(RING, NON_FINITE), Route(RING),
                                       Route(RING, NON_FINITE), Route(RING, DTYPE))]
    assert firsts == [False, True, False, False, True]
    assert stats.snapshot() == {"calls": {"switch": 1, "ring": 4},
                                "fallbacks": {NON_FINITE: 2, DTYPE: 1},
                                "switch": {"fallbacks": 0, "returns": 0, "recovered": 0},
                                "transport": dict.fromkeys(FAULT_EVENTS, 0)}
    snap = stats.snapshot()
    snap["calls"]["switch"] = 99                     # a copy: the counters are untouched
    assert stats.snapshot()["calls"]["switch"] == 1
