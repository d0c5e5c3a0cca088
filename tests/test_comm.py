"""The communicator and the host ring allreduce on the in-process fabric: ranks are threads,
the rendezvous is real TCP on localhost, RDMA WRITEs are memmoves (tests/fakefabric.py)."""
from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np
import pytest

from flowctl import FlowConfig, StallError
from netreduce.algorithms.ring import RingLayout
from netreduce.comm import Communicator, CommunicatorError
from netreduce.meta import AllreduceMismatch
from nr_contract.spec import RingSpec
from tests.fakefabric import FakeFabric, FakeHost
from tests.ranks import rank_data, run_ranks


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("count", [1, 3, 257, 1000, 20_000])
def test_ring_allreduce_sums_like_numpy(n: int, count: int) -> None:
    def body(comm: Communicator, host: FakeHost) -> dict[str, np.ndarray]:
        got = {}
        for dtype in ("int32", "float32"):
            x = rank_data(comm.rank, count, dtype)
            assert comm.allreduce(x) is x
            got[dtype] = x
        return got

    results = run_ranks(n, body)
    assert not any(isinstance(r, Exception) for r in results), results
    ints = np.sum([rank_data(r, count, "int32") for r in range(n)], axis=0, dtype=np.int32)
    floats = np.sum([rank_data(r, count, "float32").astype(np.float64) for r in range(n)], axis=0)
    for res in results:
        assert np.array_equal(res["int32"], ints)
        assert np.allclose(res["float32"], floats, rtol=1e-5, atol=1e-5 * n)
        assert res["float32"].tobytes() == results[0]["float32"].tobytes()  # bit-identical


def test_out_argument_ops_dtypes_shapes_and_workspace_reuse() -> None:
    def body(comm: Communicator, host: FakeHost) -> list[Any]:
        r = comm.rank
        got: list[Any] = []
        x = np.arange(12, dtype=np.int64).reshape(3, 4) * (r + 1)
        out = np.empty_like(x)
        assert comm.allreduce(x, out=out) is out
        got.append((x.copy(), out))
        y = np.full(5, float(r), dtype=np.float64)
        got.append(comm.allreduce(y, op="max").copy())
        got.append(comm.allreduce(np.full(5, r, dtype=np.int32), op="min").copy())
        z = np.arange(40, dtype=np.float32)[::2]            # not contiguous
        got.append(comm.allreduce(z).copy())
        big = np.ones(50_000, dtype=np.int32)
        comm.allreduce(big)
        got.append(int(big.sum()))
        got.append(comm.allreduce(np.ones(2, dtype=np.int32)).copy())   # after growing
        got.append(comm.allreduce(np.zeros(0, dtype=np.float32)).shape)
        got.append(comm.allreduce(np.array(7, dtype=np.int32)).item())   # 0-d
        return got

    n = 3
    results = run_ranks(n, body)
    for r, got in enumerate(results):
        assert not isinstance(got, Exception), got
        (x, out), mx, mn, strided, big, small, empty, scalar = got
        assert np.array_equal(x, np.arange(12).reshape(3, 4) * (r + 1))   # input untouched
        assert np.array_equal(out, np.arange(12).reshape(3, 4) * 6)
        assert np.array_equal(mx, np.full(5, 2.0)) and np.array_equal(mn, np.zeros(5))
        assert np.array_equal(strided, np.arange(40, dtype=np.float32)[::2] * n)
        assert big == 50_000 * n and np.array_equal(small, [n, n])
        assert empty == (0,) and scalar == 7 * n


def test_auto_reports_the_algorithm_it_ran() -> None:
    def body(comm: Communicator, host: FakeHost) -> Any:
        assert comm.last_algo is None
        comm.allreduce(np.ones(4, dtype=np.float32), algo="auto")
        return comm.last_algo

    assert run_ranks(2, body) == ["ring", "ring"]


def test_messages_per_call_are_2_n_minus_1_steps_of_chunks() -> None:
    n, count = 4, 3000            # 750 int32 per chunk = 3000 B = 3 messages of <= 1024 B

    def body(comm: Communicator, host: FakeHost) -> int:
        before = host.rings["ring"].posted
        comm.allreduce(np.ones(count, dtype=np.int32))
        return host.rings["ring"].posted - before

    meta_messages = n - 1
    assert run_ranks(n, body) == [meta_messages + 2 * (n - 1) * 3] * n


def mismatch_body(bad_rank: int, bad: dict[str, Any]) -> Callable[[Communicator, FakeHost], Any]:
    def body(comm: Communicator, host: FakeHost) -> Any:
        kw = {"count": 100, "dtype": "int32"} | (bad if comm.rank == bad_rank else {})
        x = np.ones(kw["count"], dtype=kw["dtype"])
        try:
            comm.allreduce(x)
        except AllreduceMismatch as exc:
            err = str(exc)
        else:
            return "no error"
        untouched = bool(np.all(x == 1))
        y = np.ones(10, dtype=np.int32)           # the communicator is still usable
        comm.allreduce(y)
        return err, untouched, int(y[0])
    return body


@pytest.mark.parametrize("bad, words", [
    ({"count": 99}, "int32[100] op=sum algo=auto on ranks 0, 2; int32[99] op=sum algo=auto on rank 1"),
    ({"dtype": "float32"}, "int32[100] op=sum algo=auto on ranks 0, 2; float32[100] op=sum algo=auto on rank 1"),
])
def test_mismatched_calls_fail_alike_on_every_rank_and_change_nothing(bad: dict, words: str) -> None:
    results = run_ranks(3, mismatch_body(1, bad))
    assert all(not isinstance(r, Exception) and r != "no error" for r in results), results
    errors = {r[0] for r in results}
    assert errors == {f"allreduce call #0: ranks disagree: {words}"}
    assert all(r[1] and r[2] == 3 for r in results)


def test_bad_arguments_raise_before_any_exchange() -> None:
    def body(comm: Communicator, host: FakeHost) -> list[str]:
        before = host.rings["ring"].posted
        errors = []
        for call in (lambda: comm.allreduce(np.ones(3, dtype=np.complex64)),
                     lambda: comm.allreduce([1, 2, 3]),                        # type: ignore[arg-type]
                     lambda: comm.allreduce(np.ones(3, dtype=np.int32), op="avg"),
                     lambda: comm.allreduce(np.ones(3, dtype=np.int32), algo="tree"),
                     lambda: comm.allreduce(np.ones(3, dtype=np.int32), algo="switch"),
                     lambda: comm.allreduce(np.ones(3, dtype=np.int32), out=np.ones(4, np.int32))):
            try:
                call()
            except (TypeError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        assert host.rings["ring"].posted == before
        return errors

    errors = run_ranks(2, body)[0]
    assert errors[0] == ("TypeError: allreduce: dtype complex64 is not supported "
                         "(supported: int32, int64, float16, bfloat16, float32, float64)")
    assert errors[1] == "TypeError: allreduce: expected a numpy array or a CPU torch.Tensor as array, got list"
    assert errors[2] == ("ValueError: allreduce: op='avg' takes floating-point arrays, not "
                         "int32 (an integer average would round): use op='sum' and divide")
    assert "unknown algo 'tree'" in errors[3]
    assert errors[4] == ("ValueError: allreduce: algo='switch' needs the communicator's 'inc' "
                         "ring registered with a switch, and it is not: no address given "
                         "(netreduce.init(switch=HOST:PORT) or $NR_CONTROLLER)")
    assert "out must be a int32 array of shape (3,)" in errors[5]


def test_inc_ring_spec_describes_the_inc_qps_alike_everywhere() -> None:
    def body(comm: Communicator, host: FakeHost) -> Any:
        comm.allreduce(np.ones(1000, dtype=np.int32))
        assert host.rings["inc"].posted == 0          # nothing ever posted on "inc"
        return comm.inc_ring_spec(), host

    results = run_ranks(3, body)
    specs = [spec for spec, _ in results]
    hosts = [host for _, host in results]
    assert specs[0] == specs[1] == specs[2]
    spec = specs[0]
    assert isinstance(spec, RingSpec) and RingSpec.from_json(spec.to_json()) == spec
    assert (spec.world_size, spec.mtu, spec.msg_size, spec.window) == (3, 256, 1024, 4)
    for r, conn in enumerate(spec.connections):
        src, dst = hosts[r], hosts[(r + 1) % 3]
        assert (conn.src_ip, conn.dst_ip, conn.src_mac, conn.dst_mac) == (
            src.ip, dst.ip, src.mac, dst.mac)
        assert conn.src_qpn == src.rings["inc"].send_qpn
        assert conn.dst_qpn == dst.rings["inc"].recv_qpn
        assert conn.psn0 == src.rings["inc"].send_psn
        assert conn.src_qpn != src.rings["ring"].send_qpn


@pytest.mark.parametrize("caller", [0, 1])
def test_a_stall_breaks_the_communicator_with_a_clear_error(caller: int) -> None:
    """A call that makes no progress while every peer is alive (here: idle) raises
    StallError naming the rank, the ring and the timeout, and leaves the communicator
    unusable. One rank calls: two timing out at once, one could hear the other's abort
    first and raise a PeerFailure instead."""
    fabric = FakeFabric()
    cfg = FlowConfig(mtu=256, msg_size=1024, window=4, recv_depth=64, collective_timeout=0.5)
    both = threading.Barrier(2)

    def body(comm: Communicator, host: FakeHost) -> Any:
        comm.allreduce(np.ones(10, dtype=np.int32))
        both.wait()
        fabric.frozen = True
        errors = []
        if comm.rank == caller:
            for _ in range(2):
                try:
                    comm.allreduce(np.ones(10, dtype=np.int32))
                except (StallError, CommunicatorError) as exc:
                    errors.append(exc)
        both.wait()
        return errors

    stall, broken = run_ranks(2, body, cfg=cfg, fabric=fabric)[caller]
    assert isinstance(stall, StallError)
    assert f"rank {caller}, ring 'ring': nothing moved for 0.5s" in str(stall)
    assert isinstance(broken, CommunicatorError) and "unusable after an earlier error" in str(broken)


def test_ring_layout_invariants() -> None:
    for count in (0, 1, 5, 7, 1000):
        for n in (1, 2, 3, 4):
            lay = RingLayout(count, 4, n)
            assert lay.bounds[0] == 0 and lay.bounds[-1] == count
            sizes = [lay.bounds[c + 1] - lay.bounds[c] for c in range(n)]
            assert max(sizes) - min(sizes) <= 1 and max(sizes) * 4 == lay.slot_bytes
            assert lay.staging_offset >= count * 4 and lay.staging_offset % 64 == 0
            assert lay.nbytes == lay.staging_offset + (n - 1) * lay.slot_bytes
