"""A rank later than the RC retry budget, and a link dark for longer, through the switch, in
the RC model with rank 0's controller (issue 40; netreduce/away.py, `_rebuild_at_once`):
the others' "inc" QPs fail, "inc" is built again at once and registered in place of the
old ring, and the call is redone through the switch once every rank met in the store.
The oracles: numpy sums, the retry budget and NOTICE_GRACE as configured."""
from __future__ import annotations

from typing import Any
from unittest import mock

import numpy as np
import pytest

import netreduce.rejoin
from netreduce.away import INC_POLL, NOTICE_GRACE
from tests.ranks import RankEngine
from tests.rcmodel.faultcost import VICTIM, dark_world, run_dark
from tests.rcmodel.scale import CONFIG

N, COUNT, CALLS, AT = 4, 1 << 14, 8, 4


def inputs() -> list[list[np.ndarray]]:
    rng = np.random.default_rng(41)
    return [[rng.integers(-1000, 1000, COUNT).astype(np.int32) for _ in range(CALLS)]
            for _ in range(N)]


def loop(world: Any, xs: list[list[np.ndarray]], algo: str, before: Any) -> list[Any]:
    """CALLS calls on every rank, each waited for (`before(comm, c)` runs before call c):
    every result checked against numpy; each rank's call end times and stats."""
    want = [sum(xs[r][c].astype(np.int64) for r in range(N)).astype(np.int32)
            for c in range(CALLS)]

    def body(comm: Any) -> Any:
        comm._engine = RankEngine(f"model rank {comm.rank}")
        ends = [world.sim.now]
        for c in range(CALLS):
            before(comm, c)
            work = comm.allreduce(xs[comm.rank][c], algo=algo, async_op=True)
            comm._engine.run_next()
            assert np.array_equal(work.wait(0), want[c]), f"rank {comm.rank}, call {c}"
            ends.append(world.sim.now)
        comm.close()
        return ends, comm.stats()

    results = run_dark(world, body)
    for r, got in enumerate(results):
        assert isinstance(got, tuple), (r, got)
    return results


@pytest.mark.parametrize("late,algo,in_flight", [(0.8, "switch", 1), (3.0, "switch", 2),
                                                 (3.0, "auto", 1)])
def test_a_rank_later_than_the_retry_budget_costs_its_lateness_on_the_switch(
        late: float, algo: str, in_flight: int) -> None:
    """Rank VICTIM `late` s late for call AT (past the 0.47 s retry budget): every call
    exact on every rank and every one through the switch (algo="switch" never refused),
    one fault, one rebuild, one call redone, no fallback; the call costs its lateness, or
    the budget and NOTICE_GRACE when that is longer (the others' QPs fail and wait for a
    notice that does not come), plus at most two polls of a waiting "inc" stream (a rank
    that came in meanwhile sees the notice there)."""
    world = dark_world(N, {}, in_flight=in_flight, controller=True)

    def before(comm: Any, c: int) -> None:
        if c == AT and comm.rank == VICTIM:
            world.turns.sleep(late)

    results = loop(world, inputs(), algo, before)
    cost = max(late, CONFIG.dark_budget + NOTICE_GRACE)
    for ends, stats in results:
        assert stats["calls"] == {"switch": CALLS}, stats
        assert stats["transport"] | {"ms_lost": 0} == \
            {"faults": 1, "rebuilds": 1, "redone": 1, "ms_lost": 0}, stats
        assert stats["switch"]["fallbacks"] == 0, stats
    ends = results[0][0]
    assert cost <= ends[AT + 1] - ends[AT] <= cost + 2 * INC_POLL, (ends, cost)


def test_a_link_dark_past_the_redo_leaves_the_switch_after_one_quick_rebuild() -> None:
    """Rank VICTIM's link dark for 3 s from call AT: the quick rebuild's redo through the
    switch fails too (the same call's second fault), so the ranks leave the switch as for
    its loss: the call is redone over the host ring after its rebuilds, every call exact;
    one quick rebuild and one fallback, the later calls over the host ring (rank 0's
    return after the back-off is put off past the run)."""
    dark: dict[str, float] = {}
    world = dark_world(N, dark, controller=True)

    def before(comm: Any, c: int) -> None:
        if c == AT and comm.rank == VICTIM:
            dark.update({"from": world.sim.now, "to": world.sim.now + 3.0})

    with mock.patch.object(netreduce.rejoin, "REJOIN_FIRST", 3600.0):
        results = loop(world, inputs(), "auto", before)
    for ends, stats in results:
        t = stats["transport"]
        assert stats["switch"]["fallbacks"] == 1 and stats["switch"]["returns"] == 0, stats
        assert stats["calls"] == {"switch": AT, "ring": CALLS - AT}, stats
        assert t["faults"] >= 2 and t["redone"] == t["faults"], stats
    assert results[0][0][AT + 1] - results[0][0][AT] >= 3.0, results[0][0]
