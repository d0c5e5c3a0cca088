"""The RC model (tests/rcmodel, docs/rcmodel.md) on a two-tier fabric (rcmodel.tiers): the
real host code over model rxe, the real ToR and spine pipelines installed by the real
FabricTarget; whole calls, exact sums, and the traffic each ToR-spine link carried. And on
three tiers (rcmodel.pod: a pod switch between ToRs and the top spine, in the model only)."""
from __future__ import annotations

import numpy as np
import pytest

from flowctl import FlowConfig
from netreduce.meta import RECORD_STRIDE
from tests.rcmodel.calls import allreduce, data, packets, want
from tests.rcmodel.fabric import FaultRates, Faults
from tests.rcmodel.scale import formula_spine_link
from tests.rcmodel.world import World

CFG = FlowConfig(mtu=1024, msg_size=8192, window=2, recv_depth=64, collective_timeout=5.0)


def test_eight_racks_of_eight_ranks_report_their_spine_link_traffic(
        capsys: pytest.CaptureFixture[str]) -> None:
    """64 ranks, 8 per rack, int32 of 64 KiB: exact on every rank; each ToR sent one partial
    per slot up and got one total per slot down, so every spine link carries the same bytes
    up and down, about M (+ per-packet headers) per call, whatever the rack size."""
    n, count = 64, 16384
    world = World(n, CFG, racks=[8] * 8, slots=256, max_time=120.0)
    for got in allreduce(world, count, "switch"):
        assert np.array_equal(got, want(n, count))
    p = packets(n * RECORD_STRIDE, CFG) + packets(4 * (count + n), CFG)   # meta + data+seal
    ring = world.switch_counters()
    assert ring["racks"] == [j for j in range(8) for _ in range(8)]
    assert ring["counters"]["aggregated"] == n * p
    assert ring["counters"]["results_sent"] == n * p
    for j in range(8):
        tor = ring["switches"][f"tor{j}"]
        assert tor["tor"]["partials_sent"] == p and tor["tor"]["totals"] == p
    assert ring["switches"]["spine"]["counters"]["completed"] == p
    links = world.fabric.spine_link_bytes()
    up = {u for u, _ in links.values()}
    assert len(up) == 1 and all(u == d for u, d in links.values()), links
    per_link = up.pop()
    data_bytes = 4 * (count + n) + n * RECORD_STRIDE
    assert data_bytes < per_link < 1.25 * data_bytes, (per_link, data_bytes)
    with capsys.disabled():
        print(f"\n[rcmodel 8x8, {4 * count} B per rank] per ToR-spine link: {per_link} B up, "
              f"{per_link} B down ({per_link / data_bytes:.3f} x the bytes each rank sent); "
              f"host ring would carry 2(n-1)/n = {2 * 63 / 64:.2f} x per direction")


@pytest.mark.parametrize("algo", ["switch", "ring"])
def test_calls_heal_under_loss_on_host_and_spine_links(algo: str) -> None:
    n, counts = 5, [7, 3000, 1]
    world = World(n, CFG, racks=[3, 2],
                  faults=Faults.everywhere(loss=0.03, duplicate=0.03, delay=0.2, seed=5),
                  uplink_faults=FaultRates(loss=0.03, duplicate=0.03, delay=0.2))
    results = world.run(lambda comm: [comm.allreduce(data(comm.rank, c), algo=algo)
                                      for c in counts])
    for got in results:
        assert [g.tolist() for g in got] == [want(n, c).tolist() for c in counts]
    assert sum(world.fabric.lost.values()) > 0
    lost_up = sum(v for (a, b), v in world.fabric.lost.items() if "host" not in (a[0], b[0]))
    assert lost_up > 0                                 # the spine links lost frames too


def test_three_tiers_exact_one_partial_per_slot_per_pod_and_the_link_formula() -> None:
    """Pods of racks under a top spine (rcmodel.pod, a third tier in the model only), 2
    pods x 2 racks x 2 ranks: exact; every ToR sends one partial per slot to its pod, every
    pod one to the top, and every link between tiers carries, per direction, exactly what
    rcmodel.scale's formula says (the scale study's table leans on it)."""
    n, count = 8, 3000
    world = World(n, CFG, racks=[2] * 4, pods=[2, 2], slots=256)
    for got in allreduce(world, count, "switch"):
        assert np.array_equal(got, want(n, count))
    p = packets(n * RECORD_STRIDE, CFG) + packets(4 * (count + n), CFG)
    ring = world.switch_counters()
    assert ring["counters"]["aggregated"] == ring["counters"]["results_sent"] == n * p
    switches = ring["switches"]
    for j in range(4):
        assert switches[f"tor{j}"]["tor"]["partials_sent"] == p
    for pod in ("pod0", "pod1"):
        c = switches[pod]["counters"]
        assert c["partials_sent"] == c["totals"] == p and c["partials"] == 2 * p
        assert sum(v for k, v in c.items() if k.startswith("drop_")) == 0
    assert switches["spine0"]["counters"]["completed"] == p
    per_link = formula_spine_link(4 * count, n, config=CFG)
    links = world.fabric.uplink_bytes()
    assert links == {"tor-pod up": 4 * per_link, "tor-pod down": 4 * per_link,
                     "pod-spine up": 2 * per_link, "pod-spine down": 2 * per_link}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_three_tiers_heal_under_loss_duplication_and_reordering(seed: int) -> None:
    """Uneven pods (3+2 | 1 | 2+2 ranks) under 3 % loss, duplication and reordering on
    every link, host and between tiers: both algorithms exact, call after call."""
    racks, pods, counts = [3, 2, 1, 2, 2], [2, 1, 2], [1, 3000, 7, 20000]
    n = sum(racks)
    rates = FaultRates(loss=0.03, duplicate=0.03, delay=0.1)
    world = World(n, CFG, racks=racks, pods=pods, slots=32, max_time=600.0,
                  faults=Faults.everywhere(loss=0.03, duplicate=0.03, delay=0.1, seed=seed),
                  uplink_faults=rates)
    results = world.run(lambda comm: [comm.allreduce(data(comm.rank, c), algo=a)
                                      for c in counts for a in ("switch", "ring")])
    for got in results:
        assert not isinstance(got, BaseException), got
        assert [g.tolist() for g in got] == [want(n, c).tolist() for c in counts
                                             for _ in range(2)]
    between = sum(v for (a, b), v in world.fabric.lost.items() if "host" not in (a[0], b[0]))
    assert between > 0
    resent = sum(world.switch_counters()["switches"][f"pod{p}"]["counters"]["partials_resent"]
                 for p in range(3))
    assert resent > 0                            # the pods healed lost totals themselves
