"""k one-armed aggregators on a shared network in the RC model (tests/rcmodel/aggregators.py):
real host code, the real pipeline as the aggregator; each call exact against numpy and its
simulated time against a closed form written here (independent of the module's), and the
module's formula against the same closed form."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.rcmodel.aggregators import formula_time_us
from tests.rcmodel.fabric import LATENCY_S, LINK_BPS
from tests.rcmodel.scale import CONFIG, inputs
from tests.rcmodel.world import World

HEADERS = 58 + 4                     # Ethernet..BTH and the ICRC of every packet


def closed_form_us(size: int, n: int, k: int) -> float:
    """The call's bytes over the slower of a host's link and its share of the aggregators'
    (bytes x max(1/R, n/(k R))), for the metadata bank (256 B per rank) and then the data
    and its seal (4 B per rank), plus each transfer's round trip of four links, and the ACK's
    four links: the bandwidth and latency terms only (a packet's store-and-forward left out,
    hence the tolerance of the test)."""
    total = 0.0
    for nbytes in (256 * n, size + 4 * n):
        wire = nbytes + -(-nbytes // CONFIG.mtu) * HEADERS
        total += wire * 8 / LINK_BPS * max(1, n / k) + 4 * LATENCY_S
    return (total + 4 * LATENCY_S) * 1e6


def one_call(n: int, k: int, size: int) -> float:
    world = World(n, CONFIG, seed=n, aggregator_bps=k * LINK_BPS, max_ranks=n,
                  max_events=20_000_000)
    count = size // 4
    want = sum(inputs(r, count).astype(np.int64) for r in range(n)).astype(np.int32)

    def body(comm: Any) -> Any:
        return comm.allreduce(inputs(comm.rank, count), algo="switch"), world.sim.now

    results = world.run(body)
    assert all(np.array_equal(out, want) for out, _ in results), results[0]
    assert world.switch_counters()["counters"]["completed"] > 0      # the aggregator summed
    return max(t for _, t in results) * 1e6


@pytest.mark.parametrize("n, k, size", [(8, 1, 1 << 20), (8, 2, 1 << 20), (8, 4, 1 << 20),
                                        (8, 8, 1 << 20), (16, 16, 1 << 20), (16, 4, 1 << 18)])
def test_a_call_through_k_aggregators_takes_the_closed_forms_time(n: int, k: int,
                                                                  size: int) -> None:
    """Within 10 % above the closed form (up to n/k = 8: the credit window's ACKs, routed
    via the aggregators too, queue behind the contributions; at 16 ranks on one
    aggregator the model's call is 19 % slower, docs/scale.md); the module's formula, which
    adds each transfer's store-and-forward, within 5 % of the closed form."""
    sim = one_call(n, k, size)
    oracle = closed_form_us(size, n, k)
    assert oracle <= sim <= oracle * 1.10, (sim, oracle)
    assert oracle <= formula_time_us(size, n, k) <= oracle * 1.05


def test_k_equal_n_is_bounded_by_the_hosts_links_alone() -> None:
    """k = n: the aggregators' links carry what the hosts' do; the call costs what an
    in-path switch's does plus two links each way (the closed form's latency terms)."""
    for n in (8, 64, 1024):
        assert formula_time_us(4 << 20, n, n) == pytest.approx(
            closed_form_us(4 << 20, n, n), rel=0.01)
        assert formula_time_us(4 << 20, n, 1) / formula_time_us(4 << 20, n, n) \
            == pytest.approx(n, rel=0.03)
