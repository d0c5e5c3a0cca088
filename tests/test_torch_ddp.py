"""The DDP hooks on the in-process fabric (tests/fakefabric.py, its fake switch): buckets
averaged through the fake switch or, holding NaN, over the ring; the bf16 hook against
torch's bf16_compress_hook over gloo; real DDP over gloo process groups on rank threads
with the hooks, like DDP over gloo alone; a failed or refused bucket. DDP over real RDMA:
tests/lab/test_torch.py."""
from __future__ import annotations

import threading
import warnings
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

from netreduce.comm import Communicator
from netreduce.dtypes import BFLOAT16
from netreduce.tools.reference import Reference
from netreduce.shards import ShardedCommunicator
from tests.fakefabric import FakeController, FakeFabric, FakeHost
from tests.ranks import rank_data, run_ranks
from tests.test_shards import controller, run_sharded

import tests.torch_required  # noqa: F401,I001 - skips this module without torch: before it

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import netreduce.torch as nrtorch     # noqa: E402 - after the torch check
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402


class Bucket:
    """What the hook uses of torch.distributed.GradBucket."""

    def __init__(self, index: int, buffer: torch.Tensor) -> None:
        self._index, self._buffer = index, buffer

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer


def hook_data(rank: int, count: int, nan_rank: int | None) -> np.ndarray:
    x = rank_data(rank, count, "float32")
    if rank == nan_rank:
        x[5] = np.nan
        x[6] = np.inf
    return x


@pytest.mark.parametrize("hook", [nrtorch.allreduce_hook, nrtorch.allreduce_hook_sync])
@pytest.mark.parametrize("nan_rank", [None, 1])
@pytest.mark.parametrize("algo", ["auto", "switch"])
def test_the_hook_averages_buckets_through_the_fake_switch_and_nan_over_the_ring(
        hook: Any, nan_rank: int | None, algo: str) -> None:
    """algo="auto" routes a NaN bucket over the ring itself; under algo="switch" the hook
    does, after the switch's refusal: the same result and warning either way."""
    n, count = 3, 2000
    fabric = FakeFabric()

    def body(comm: Communicator, host: FakeHost) -> Any:
        bucket = Bucket(4, torch.from_numpy(hook_data(comm.rank, count, nan_rank)))
        value = hook(nrtorch.HookState(comm, algo), bucket).wait()
        other = hook(comm, Bucket(5, torch.ones(8))).wait()   # the next bucket: switch
        assert value is bucket.buffer() and comm.last_algo == "switch"
        return value.numpy().copy(), other.numpy().copy()

    with warnings.catch_warnings(record=True) as caught:     # process-wide: every thread
        warnings.simplefilter("always")
        results = run_ranks(n, body, fabric=fabric, controller=FakeController(fabric))
    warned = sorted(str(w.message) for w in caught
                    if w.category is nrtorch.NonFiniteGradientWarning)
    inputs = [hook_data(r, count, nan_rank).astype(np.float64) for r in range(n)]
    want = np.sum(inputs, axis=0) / n
    finite = np.isfinite(want)
    m = max(np.abs(x[np.isfinite(x)]).max() for x in inputs)
    for r, (value, other) in enumerate(results):
        assert np.array_equal(other, np.ones(8))
        assert value.tobytes() == results[0][0].tobytes()
        if nan_rank is None:
            assert warned == []
            # the README's bound on the sum, divided by n, plus the division's rounding
            bound = (n * n * m * 2.0 ** -30 * (1 + 2 ** -24) + 2 ** -24 * n * np.abs(want)) / n \
                + 2 ** -24 * np.abs(want) + 2 ** -149
            assert np.all(np.abs(value - want) <= bound)
        else:
            assert list(np.flatnonzero(~finite)) == [5, 6] and np.isnan(value[5]) \
                and np.isnan(value[6]) == np.isnan(want[6])
            assert np.allclose(value[finite], want[finite], rtol=1e-5, atol=1e-6)
            assert len(warned) == n
            assert warned[r].startswith(
                f"netreduce: rank {r}: DDP gradient bucket 4 (2000 x torch.float32) holds NaN "
                f"or Inf, which the switch cannot carry: reduced over the host ring instead")


def as_bfloat16(x: np.ndarray) -> np.ndarray:
    """`x` rounded to bfloat16 by torch (what `tensor.to(torch.bfloat16)` gives), as numpy."""
    return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(BFLOAT16)


def torchs_bf16_hook_over_gloo(xs: list[np.ndarray]) -> np.ndarray:
    """What torch's bf16_compress_hook over gloo computes: each rank's bucket rounded to
    bfloat16 and divided by n there, the n parts added in bfloat16 (every addition rounded)."""
    parts = [torch.from_numpy(x).to(torch.bfloat16).div_(len(xs)) for x in xs]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total.float().numpy()


def torch_bf16_compress_hook(state, bucket):  # type: ignore[no-untyped-def]
    """torch's own bf16_compress_hook, under another name: DDP refuses a hook named so
    without CUDA and NCCL (by its __name__), although gloo reduces bfloat16. (No
    annotations: DDP checks them, and this module's are postponed strings.)"""
    return default_hooks.bf16_compress_hook(state, bucket)


def mixed_magnitudes(rank: int, count: int, nan_rank: int | None) -> np.ndarray:
    """`hook_data`, its blocks of 1024 elements scaled by 1e-2, 1e-1, ... in turn."""
    scale = 10.0 ** (np.arange(count) // 1024 - 2)
    return (hook_data(rank, count, nan_rank) * scale).astype(np.float32)


@pytest.mark.parametrize("nan_rank", [None, 2])
@pytest.mark.parametrize("algo", ["auto", "ring"])
def test_the_bf16_hook_rounds_every_rank_to_bfloat16_then_averages(
        algo: str, nan_rank: int | None) -> None:
    """netreduce.torch.bf16_allreduce_hook on 3 ranks (n not a power of two): the float32
    bucket comes back holding bfloat16 values, the average of the ranks' bfloat16-rounded
    buckets within the switch's (algo="auto") or the ring's bfloat16 bound, and at least as
    close to it as torch's own hook over gloo; a NaN bucket goes over the ring (with a
    warning under "auto")."""
    n, count = 3, 5000
    fabric = FakeFabric()

    def body(comm: Communicator, host: FakeHost) -> Any:
        bucket = Bucket(7, torch.from_numpy(mixed_magnitudes(comm.rank, count, nan_rank)))
        value = nrtorch.bf16_allreduce_hook(nrtorch.HookState(comm, algo), bucket).wait()
        assert value is bucket.buffer() and value.dtype == torch.float32
        return value.numpy().copy(), comm.last_algo

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = run_ranks(n, body, fabric=fabric, controller=FakeController(fabric))
    warned = sorted(str(w.message) for w in caught
                    if w.category is nrtorch.NonFiniteGradientWarning)
    inputs = [as_bfloat16(mixed_magnitudes(r, count, nan_rank)) for r in range(n)]
    finite = np.all([np.isfinite(x.astype(np.float32)) for x in inputs], axis=0)
    reference = Reference([x[finite] for x in inputs], op="avg")
    ran = "ring" if algo == "ring" or nan_rank is not None else "switch"
    theirs = torchs_bf16_hook_over_gloo([mixed_magnitudes(r, count, nan_rank)
                                         for r in range(n)])
    for value, last in results:
        assert last == ran and value.tobytes() == results[0][0].tobytes()
        assert np.array_equal(value.astype(BFLOAT16).astype(np.float32), value,
                              equal_nan=True)                  # bfloat16 values
        assert np.array_equal(np.isfinite(value), finite)
        got = value[finite].astype(BFLOAT16)
        assert reference.failure(got, ran) is None, reference.failure(got, ran)
        ours = np.abs(value[finite] - reference.want)
        assert ours.max() <= np.abs(theirs[finite] - reference.want).max()
    if nan_rank is None or algo == "ring":       # asked for the ring: nothing to warn of
        assert warned == []
    else:
        assert len(warned) == n and warned[0].startswith(
            "netreduce: rank 0: DDP gradient bucket 7 (5000 x torch.bfloat16) holds NaN or "
            "Inf, which the switch cannot carry: reduced over the host ring instead")


def ddp_grads(comm: Communicator, pg: Any, seeding: threading.Lock, hook: Any = None,
              state: Any = None) -> list[torch.Tensor]:
    """One backward pass of a small model under DDP over `pg` (several buckets), with
    `hook` registered (with `state`) if given: the averaged gradients."""
    with seeding:                 # torch's RNG is process-wide: same init everywhere
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg,
                                                    bucket_cap_mb=0.001)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    x = torch.from_numpy(rank_data(comm.rank, 8 * 16, "float32").reshape(8, 16))
    ddp(x).square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def gloo_group(store: Any, rank: int, n: int) -> Any:
    """A process group over gloo for one rank thread (no default group: one per thread)."""
    pg = dist.ProcessGroup(store, rank, n)
    gloo = dist.ProcessGroupGloo(store, rank, n, timedelta(seconds=20))
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    return pg


def ddp_on_rank_threads(n: int, body: Any) -> list[Any]:
    """`body(comm, pg, seeding)` on n rank threads, each with a gloo process group (one
    store) and a communicator on one fake fabric and switch: what each returned."""
    store = dist.HashStore()
    fabric = FakeFabric()
    seeding = threading.Lock()

    def rank(comm: Communicator, host: FakeHost) -> Any:
        return body(comm, gloo_group(store, comm.rank, n), seeding)

    results = run_ranks(n, rank, fabric=fabric, controller=FakeController(fabric))
    assert not any(isinstance(r, Exception) for r in results), results
    return results


def test_ddp_with_the_hook_averages_like_ddp_over_gloo() -> None:
    """Real DDP (a gloo process group per rank thread, several buckets): one step with the
    asynchronous hook through the (fake) switch gives gloo's averaged gradients."""
    def body(comm: Communicator, pg: Any, seeding: threading.Lock) -> Any:
        want = ddp_grads(comm, pg, seeding)
        got = ddp_grads(comm, pg, seeding, nrtorch.allreduce_hook, nrtorch.HookState(comm))
        return want, got, comm.last_algo

    for want, got, algo in ddp_on_rank_threads(2, body):
        assert algo == "switch"
        for w, g in zip(want, got):
            assert torch.allclose(g, w, rtol=1e-5, atol=1e-6), (g, w)


def test_ddp_with_the_bf16_hook_averages_like_torchs_bf16_hook_over_gloo() -> None:
    """Real DDP on 2 rank threads: torch's own bf16_compress_hook over gloo against
    netreduce's, over the ring (bit for bit: with 2 ranks both round the exact sum of two
    bfloat16 halves once) and through the (fake) switch (within one bfloat16 rounding, or
    the quantization's 2^-20 of the largest gradient for the smallest ones)."""
    def body(comm: Communicator, pg: Any, seeding: threading.Lock) -> Any:
        want = ddp_grads(comm, pg, seeding, torch_bf16_compress_hook, pg)
        ring = ddp_grads(comm, pg, seeding, nrtorch.bf16_allreduce_hook,
                         nrtorch.HookState(comm, "ring"))
        switch = ddp_grads(comm, pg, seeding, nrtorch.bf16_allreduce_hook, comm)
        return want, ring, switch, comm.last_algo

    for want, ring, switch, algo in ddp_on_rank_threads(2, body):
        assert algo == "switch"
        for w, r, s in zip(want, ring, switch):
            assert torch.equal(r, w), (r, w)
            assert torch.equal(s.bfloat16().float(), s)
            top = float(w.abs().max())
            assert torch.all((s - w).abs() <= 2**-8 * w.abs() + 2**-20 * top), (s, w)


def test_a_failed_bucket_reaches_ddp_as_an_error_naming_the_cause() -> None:
    """The hook's future fails the way torch's C++ side sees (a failed callback), with the
    netreduce error's type and message; the next bucket reports the broken communicator."""
    def body(comm: Communicator, host: FakeHost) -> Any:
        count = 8 if comm.rank == 0 else 9
        errors = []
        for hook in (nrtorch.allreduce_hook, nrtorch.allreduce_hook_sync):
            with pytest.raises(RuntimeError) as caught:
                hook(comm, Bucket(3, torch.ones(count))).wait()
            errors.append(str(caught.value).split("\n")[0])
        return errors

    for errors in run_ranks(2, body):
        for i, error in enumerate(errors):
            assert error == ("Got the following error when running the callback: "
                             f"AllreduceMismatch: allreduce call #{i}: ranks disagree: "
                             "float32[8] op=avg algo=auto on rank 0; float32[9] op=avg "
                             "algo=auto on rank 1")


def test_a_bucket_refused_while_the_fake_switch_is_away_goes_over_the_ring() -> None:
    """Under HookState(algo="switch") a bucket issued while the switch is away (it
    restarted) is `SwitchUnavailable` on every rank: the hook reduces it over the ring,
    without a warning (the data is fine), and the step goes on."""
    n = 3
    fabric = FakeFabric()
    controller = FakeController(fabric)

    def body(comm: Communicator, host: FakeHost) -> Any:
        first = nrtorch.allreduce_hook(nrtorch.HookState(comm, "switch"),
                                       Bucket(0, torch.ones(8))).wait()
        if comm.rank == 0:
            controller.restart()
        out = []
        for i in (1, 2):        # in flight when the switch is found away, then refused
            bucket = Bucket(i, torch.full((8,), float(comm.rank + i)))
            out.append(nrtorch.allreduce_hook(nrtorch.HookState(comm, "switch"),
                                              bucket).wait().tolist())
        return first.tolist(), out, comm.last_algo, comm.stats()["switch"]["fallbacks"]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = run_ranks(n, body, fabric=fabric, controller=controller)
    assert not [w for w in caught if w.category is nrtorch.NonFiniteGradientWarning]
    for got in results:
        assert not isinstance(got, BaseException), got
        assert got == ([1.0] * 8, [[2.0] * 8, [3.0] * 8], "ring", 1)


@pytest.mark.parametrize("nan_rank", [None, 1])
@pytest.mark.parametrize("algo", ["auto", "switch"])
def test_the_hook_averages_buckets_over_two_fake_aggregators(algo: str,
                                                             nan_rank: int | None) -> None:
    """The DDP hook over a ShardedCommunicator (4 ranks, 2 fake aggregators: k = 2, each
    call split in two shards): a 5000-element bucket averaged within the unsharded switch
    bound; with NaN and Inf in shard 0, algo="auto" runs that shard over its host ring,
    algo="switch" has it refused while shard 1 completed -- the hook's re-run over the ring
    must see the bucket unchanged (once, a half-reduced bucket was reduced again) -- the
    NaN kept, the warning given once per rank, and the next bucket through both."""
    n, count = 4, 5000

    def body(comm: ShardedCommunicator) -> Any:
        bucket = Bucket(4, torch.from_numpy(hook_data(comm.rank, count, nan_rank)))
        value = nrtorch.allreduce_hook(nrtorch.HookState(comm, algo), bucket).wait()
        assert value is bucket.buffer()
        routed = comm.last_algo
        other = nrtorch.allreduce_hook(comm, Bucket(5, torch.ones(count))).wait()
        last = comm.last_algo
        ring = comm.allreduce(hook_data(comm.rank, count, nan_rank), op="avg", algo="ring")
        return value.numpy().copy(), routed, other.numpy().copy(), last, ring

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = run_sharded(body, [controller(None), controller(None)])
    warned = [w for w in caught if w.category is nrtorch.NonFiniteGradientWarning]
    inputs = [hook_data(r, count, nan_rank) for r in range(n)]
    want = np.sum(np.stack(inputs).astype(np.float64), axis=0) / n
    finite = np.isfinite(want)
    for value, routed, other, last, ring in results:
        assert np.array_equal(other, np.ones(count)) and last == "switch"
        assert value.tobytes() == results[0][0].tobytes()
        if nan_rank is None:
            assert routed == "switch" and not warned
            assert Reference(inputs, "avg").failure(value, "switch") is None
        else:
            assert routed == ("ring" if algo == "switch" else "switch+ring")
            # refused by shard 0: the ring's result over the untouched inputs, bit for bit
            assert algo == "auto" or value.tobytes() == ring.tobytes()
            assert np.isnan(value[5]) and np.isnan(value[6]) == np.isnan(want[6])
            assert np.allclose(value[finite], want[finite], rtol=1e-5, atol=1e-6)
            assert len(warned) == n
