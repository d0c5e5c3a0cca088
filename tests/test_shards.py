"""k aggregators sharing one call (issue 42 item 3, netreduce/shards.py): the split, and
4 ranks over 2 fake aggregators (one fake fabric and controller each: tests/fakefabric.py)
checked against numpy, with one aggregator lost mid-job."""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pytest

from netreduce.comm import Communicator
from netreduce.connect import connect
from netreduce.shards import Aggregator, ShardedCommunicator, aggregators, split
from ring_setup.rendezvous import Rendezvous, RendezvousConfig
from tests.lab.allreduce_worker import switch_ring_counters
from tests.fakefabric import SOFTWARE_LIMITS, FakeController, FakeFabric, FakeHost
from tests.processes import free_port
from tests.ranks import CFG, rank_data, run_threads

N = 4
SIZES = [1, 7, 1000, 1024, 2049, 3 * 1024 + 5, 100_003]


@pytest.mark.parametrize("count,weights,align", [
    (10, [1, 1], 1), (11, [1, 1], 1), (100_003, [3, 1], 1024), (1, [1, 1, 1], 1),
    (5000, [1, 2, 1, 1], 1024), (2**22, [1, 1], 32768)])
def test_the_split_is_contiguous_aligned_and_proportional(count: int, weights: list[int],
                                                          align: int) -> None:
    ranges = split(count, weights, align)
    assert ranges[0][0] == 0 and ranges[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    total = sum(weights)
    for j, (lo, hi) in enumerate(ranges):
        assert hi >= lo
        assert hi == count or hi % align == 0
        ideal = count * sum(weights[:j + 1]) / total        # closed form: the ideal boundary
        assert abs(hi - ideal) <= align / 2 + 1 or hi == count


def test_two_controllers_need_two_inc_addresses_and_one_is_the_single_switch() -> None:
    assert aggregators("a:1", None) is None
    assert aggregators("a:1,b:2", "10.78.0.0/24, 10.78.1.0/24") == [
        Aggregator("a:1", "10.78.0.0/24"), Aggregator("b:2", "10.78.1.0/24")]
    with pytest.raises(ValueError, match="need as many 'inc' addresses"):
        aggregators("a:1,b:2", "10.78.0.0/24")
    with pytest.raises(ValueError, match="need as many"):
        aggregators("a:1,", "x,y")


def run_sharded(body: Callable[[ShardedCommunicator], Any],
                controllers: list[FakeController]) -> list[Any]:
    """N ranks as threads, each a ShardedCommunicator over one fake fabric per controller."""
    port = free_port()
    aggs = [Aggregator(f"fake-{j}:1", f"10.78.{j}.0/24") for j in range(len(controllers))]
    out: list[Any] = [None] * N

    def create(rank: int, world_size: int, master_addr: str, master_port: int, *,
               switch: str, inc_addr: str, port_exchange: Any, **_: Any) -> Communicator:
        j = int(switch.split("-")[1].split(":")[0])
        rdzv = Rendezvous(RendezvousConfig(rank, world_size, master_addr, master_port,
                                           timeout=10, secret=b"secret-of-the-comm-tests"))
        rdzv.join(port_exchange)
        host = FakeHost(controllers[j].fabric, rank)
        return connect(rdzv, host, CFG, controllers[j] if rank == 0 else None)

    def worker(rank: int) -> None:
        try:
            comm = ShardedCommunicator.create(aggs, rank, N, "127.0.0.1", port, connect=create)
        except Exception as exc:        # noqa: BLE001 - the test inspects it
            out[rank] = exc
            return
        try:
            out[rank] = body(comm)
        except Exception as exc:        # noqa: BLE001
            out[rank] = exc
        finally:
            comm.close(timeout=5)

    run_threads(N, worker, timeout=120)
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out


def controller(capacity: int | None) -> FakeController:
    limits = dict(SOFTWARE_LIMITS) if capacity is None else {**SOFTWARE_LIMITS,
                                                             "capacity": capacity}
    return FakeController(FakeFabric(), limits=limits)


def float_bound(inputs: list[np.ndarray], exact: np.ndarray) -> np.ndarray:
    """The documented per-element bound of the UNSHARDED call (netreduce/algorithms/switch.py):
    blocks of the whole call's size, e_b = 30 - ceil(log2 n) - floor(log2 M_b)."""
    count = exact.size
    block = max(1024, 1 << max(-(-count // 128) - 1, 0).bit_length())
    m = np.max(np.abs(np.stack(inputs)), axis=0).astype(np.float64)
    pad = -count % block
    mb = np.concatenate([m, np.zeros(pad)]).reshape(-1, block).max(axis=1)
    f = np.floor(np.log2(np.where(mb > 0, mb, 2.0**-127)))
    e = 30 - math.ceil(math.log2(len(inputs))) - f
    per = np.repeat(len(inputs) * 2.0 ** -(e + 1) * (1 + 2.0**-24), block)[:count]
    return per + 2.0**-24 * np.abs(exact) + 2.0**-150


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_two_fake_aggregators_share_every_size_exactly_in_proportion(dtype: str) -> None:
    """Sizes 1 .. 100003 elements (not divisible by 2 or by the block), in place and out of
    place, one asynchronous, weights 3:1 published by the controllers: exact vs numpy (float32 within the
    unsharded call's bound), aggregator j carries its share of the bytes."""
    ctls = [controller(3), controller(1)]

    def body(comm: ShardedCommunicator) -> Any:
        got = []
        for i, size in enumerate(SIZES):
            x = rank_data(comm.rank, size, dtype)
            out = None if i % 2 else np.empty_like(x)
            res = comm.allreduce(x, out=out, async_op=i == 3)     # one through a Work
            got.append((res.wait() if i == 3 else res).copy())
        return comm.weights, comm.stats(), got

    results = run_sharded(body, ctls)
    weights, stats, _ = results[0]
    assert weights == [3, 1]
    for i, size in enumerate(SIZES):
        inputs = [rank_data(r, size, dtype) for r in range(N)]
        exact = np.sum(np.stack(inputs).astype(np.float64), axis=0)
        for r in range(N):
            got = results[r][2][i]
            if dtype == "int32":
                np.testing.assert_array_equal(got, exact.astype(np.int32))
            else:
                assert np.all(np.abs(got - exact) <= float_bound(inputs, exact)), (r, size)
    per = [a["bytes"] for a in stats["aggregators"]]
    assert all(a["ring_bytes"] == 0 and a["fallbacks"] == 0 for a in stats["aggregators"])
    assert sum(per) == 4 * sum(SIZES)
    assert per[0] / sum(per) == pytest.approx(0.75, abs=0.03)   # 3:1, boundaries aligned
    assert all(r[1] == stats for r in results)                  # the same on every rank


def test_one_fake_aggregator_lost_runs_its_shard_on_the_host_ring_and_stays_exact() -> None:
    """Equal shares (no capacity published); aggregator 1 restarts before call 2: its shard
    of that call and after runs over its host ring, aggregator 0's stay on it, every result
    exact; the lab worker's counters of each aggregator's ring (allreduce_worker.py: once a
    KeyError for the lost one) are aggregator 0's and none for aggregator 1."""
    ctls = [controller(None), controller(None)]
    size, calls = 4097, 4

    def body(comm: ShardedCommunicator) -> Any:
        out = []
        for c in range(calls):
            if c == 2 and comm.rank == 0:
                ctls[1].restart()
            x = rank_data(comm.rank, size, "int32") + c
            out.append(comm.allreduce(x).copy())
        rings = [switch_ring_counters(shard, ctl) for shard, ctl in zip(comm.shards, ctls)]
        return comm.weights, comm.stats(), out, (comm.last_algo, comm.last_fallback), rings

    results = run_sharded(body, ctls)
    weights, stats, _, last, rings = results[0]
    assert rings == [ctls[0].ring_counters["counters"], None]
    assert weights == [1, 1]
    assert last == ("switch+ring", "switch-away")       # aggregator 1 not back yet
    for c in range(calls):
        want = sum(rank_data(r, size, "int32") + c for r in range(N))
        for r in range(N):
            np.testing.assert_array_equal(results[r][2][c], want)
    first, second = stats["aggregators"]
    assert first["fallbacks"] == 0 and first["calls"] == calls and first["ring_bytes"] == 0
    assert second["fallbacks"] == 1 and second["ring_bytes"] > 0
    assert first["bytes"] + second["bytes"] + second["ring_bytes"] == 4 * size * calls
