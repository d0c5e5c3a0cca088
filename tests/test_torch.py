"""torch tensors through the communicator, asynchronous calls, the DDP hook's averaging and
NaN fallback, and the rendezvous through torch's store, on the in-process fabric
(tests/fakefabric.py). DDP itself over real RDMA: tests/lab/test_torch.py."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

from netreduce.comm import Communicator, CommunicatorError, PeerFailure
from netreduce.dtypes import BFLOAT16
from netreduce.meta import AllreduceMismatch
from netreduce.tools.reference import Reference
from ring_setup.rendezvous import Rendezvous, RendezvousConfig
from tests.conftest import UNDER_CI
from tests.fakefabric import FakeController, FakeFabric, FakeHost
from tests.processes import free_port
from tests.ranks import CFG, rank_data, run_ranks

try:
    import torch
    import torch.distributed as dist
except ImportError:                     # pragma: no cover - CI installs the torch extra
    if UNDER_CI:
        raise
    pytest.skip("needs torch: pip install -e '.[torch]' (scripts/install.sh does)",
                allow_module_level=True)

import netreduce.torch as nrtorch     # noqa: E402 - after the torch check
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402


def test_import_netreduce_never_imports_torch() -> None:
    code = "import sys, netreduce, netreduce.api; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32, torch.float64])
def test_tensors_are_reduced_in_their_own_memory(dtype: torch.dtype) -> None:
    n, count = 3, 1000

    def body(comm: Communicator, host: FakeHost) -> Any:
        t = torch.from_numpy(rank_data(comm.rank, count, str(dtype).removeprefix("torch.")))
        ptr = t.data_ptr()
        assert comm.allreduce(t) is t and t.data_ptr() == ptr
        out = torch.empty_like(t)
        src = t.clone()
        assert comm.allreduce(src, out=out) is out
        assert torch.equal(src, t)                      # the input of an out= call: untouched
        return t.numpy().copy(), out.numpy().copy()

    results = run_ranks(n, body)
    name = str(dtype).removeprefix("torch.")
    want = np.sum([rank_data(r, count, name).astype(np.float64) for r in range(n)], axis=0)
    for once, twice in results:
        assert np.allclose(once, want, rtol=1e-5, atol=1e-4)
        assert np.allclose(twice, want * n, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_tensors_are_reduced_in_their_own_memory(dtype: torch.dtype) -> None:
    """float16 and bfloat16 tensors (bfloat16: viewed through ml_dtypes, torch gives numpy
    no bfloat16) through the switch, in place: the sums of small integers are exact."""
    n = 3
    fabric = FakeFabric()

    def body(comm: Communicator, host: FakeHost) -> Any:
        t = torch.arange(-8, 8, dtype=dtype) * (comm.rank + 1)
        ptr = t.data_ptr()
        assert comm.allreduce(t) is t and t.data_ptr() == ptr and comm.last_algo == "switch"
        avg = torch.full((5,), float(comm.rank), dtype=dtype)
        comm.allreduce(avg, op="avg", algo="ring")
        return t.clone(), avg

    for total, avg in run_ranks(n, body, fabric=fabric, controller=FakeController(fabric)):
        assert total.dtype == dtype and torch.equal(total, torch.arange(-8, 8, dtype=dtype) * 6)
        assert torch.equal(avg, torch.full((5,), 1.0, dtype=dtype))


def test_bad_tensors_get_clear_errors_before_any_exchange() -> None:
    def body(comm: Communicator, host: FakeHost) -> list[str]:
        before = host.rings["ring"].posted
        errors = []
        for bad in (torch.ones(4, 6).t(),                       # non-contiguous
                    torch.ones(4, dtype=torch.complex64),
                    torch.ones(4, dtype=torch.uint8),
                    torch.ones(4, device="meta"),               # not on the CPU
                    torch.ones(4).to_sparse()):
            try:
                comm.allreduce(bad)
            except (TypeError, ValueError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        try:
            comm.allreduce(torch.ones(4), out=torch.ones(4, dtype=torch.float64))
        except ValueError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        assert host.rings["ring"].posted == before
        return errors

    errors = run_ranks(2, body)[0]
    assert errors[0] == ("ValueError: allreduce: array is a non-contiguous tensor (shape "
                         "(6, 4), strides (1, 6)): reducing it in place needs contiguous "
                         "memory (.contiguous() makes a copy to reduce)")
    assert errors[1] == ("TypeError: allreduce: array has dtype torch.complex64, which is not "
                         "supported (supported: torch.int32, torch.int64, torch.float16, "
                         "torch.bfloat16, torch.float32, torch.float64)")
    assert "dtype torch.uint8, which is not supported" in errors[2]
    assert errors[3] == ("TypeError: allreduce: array is a tensor on device meta: netreduce "
                         "reduces CPU tensors only (copy it with .cpu() and back)")
    assert errors[4] == ("TypeError: allreduce: array is a torch.sparse_coo tensor: only dense "
                         "(strided) tensors are supported")
    assert errors[5] == "ValueError: allreduce: out must be a float32 array of shape (4,)"
    assert len(errors) == 6


def test_async_calls_complete_in_issue_order_with_the_sync_results() -> None:
    n, sizes = 3, (10, 5000, 1, 300)

    def body(comm: Communicator, host: FakeHost) -> Any:
        arrays = [torch.from_numpy(rank_data(comm.rank + 7 * i, c, "float32"))
                  for i, c in enumerate(sizes)]
        order: list[int] = []
        works = [comm.allreduce(a, async_op=True) for a in arrays]
        for i, w in enumerate(works):
            w.add_done_callback(lambda _w, i=i: order.append(i))
        futures = [w.get_future() for w in works]
        sync = comm.allreduce(np.full(4, comm.rank, dtype=np.int32))   # after all of them
        done_before_sync = all(w.is_completed() for w in works)
        got = [w.wait(timeout=10) for w in works]
        assert all(g is a for g, a in zip(got, arrays))
        assert [f.wait() is a for f, a in zip(futures, arrays)] == [True] * len(sizes)
        return [g.numpy().copy() for g in got], order, done_before_sync, sync.copy()

    for got, order, done_before_sync, sync in run_ranks(n, body):
        assert order == [0, 1, 2, 3] and done_before_sync
        assert np.array_equal(sync, np.full(4, 0 + 1 + 2))
        for i, (c, g) in enumerate(zip(sizes, got)):
            want = np.sum([rank_data(r + 7 * i, c, "float32").astype(np.float64)
                           for r in range(n)], axis=0)
            assert np.allclose(g, want, rtol=1e-5, atol=1e-5 * n)


def test_async_errors_surface_from_wait_with_the_sync_message() -> None:
    def body(comm: Communicator, host: FakeHost) -> Any:
        count = 100 if comm.rank == 0 else 99
        work = comm.allreduce(np.ones(count, dtype=np.int32), async_op=True)
        future = comm.allreduce(np.ones(count, dtype=np.int32), async_op=True).get_future()
        errors = []
        with pytest.raises(AllreduceMismatch) as first:
            work.wait()
        errors.append(str(first.value))
        with pytest.raises(AllreduceMismatch) as second:
            future.wait()
        errors.append(str(second.value))
        try:
            comm.allreduce(np.ones(count, dtype=np.int32))
        except AllreduceMismatch as exc:
            errors.append(str(exc))
        with pytest.raises(TypeError, match="dtype complex64 is not supported"):
            comm.allreduce(np.ones(3, np.complex64), async_op=True)   # raised at issue
        return errors

    for errors in run_ranks(2, body):
        assert errors == [f"allreduce call #{i}: ranks disagree: int32[100] op=sum algo=auto "
                          f"on rank 0; int32[99] op=sum algo=auto on rank 1" for i in range(3)]


def test_close_waits_then_cancels_what_cannot_finish() -> None:
    def body(comm: Communicator, host: FakeHost) -> Any:
        if comm.rank == 1:
            return None                    # never calls: rank 0's call cannot finish
        running = comm.allreduce(np.ones(10, dtype=np.int32), async_op=True)
        queued = comm.allreduce(np.ones(10, dtype=np.int32), async_op=True)
        start = time.monotonic()
        comm.close(timeout=1.0)
        took = time.monotonic() - start
        return running.exception(), queued.exception(), took

    running, queued, took = run_ranks(2, body)[0]
    assert isinstance(running, PeerFailure) and running.ranks == [0]
    assert ("rank 0: allreduce call #0 (int32[10] op=sum algo=auto) failed: rank 0: "
            "allreduce call (int32[10] op=sum algo=auto) was still running 1s after this "
            "rank closed the communicator") in str(running)
    assert isinstance(queued, CommunicatorError) and str(queued) == (
        "netreduce: rank 0: allreduce call (int32[10] op=sum algo=auto) cancelled: the "
        "communicator was closed before it started")
    assert took < 1.0 + 3.0


def in_threads(n: int, rank: Any) -> list[Any]:
    """`rank(r)` for r < n, each on a thread of its own: what each returned or raised."""
    out: list[Any] = [None] * n

    def run(r: int) -> None:
        try:
            out[r] = rank(r)
        except Exception as exc:      # noqa: BLE001 - the test inspects it
            out[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not any(isinstance(o, Exception) for o in out), out
    return out


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


def test_the_rendezvous_passes_its_port_through_torchs_store() -> None:
    n = 3
    torch_port = free_port()
    master = dist.TCPStore("127.0.0.1", torch_port, is_master=True,
                           timeout=timedelta(seconds=10), wait_for_workers=False)
    def rank(r: int) -> Any:
        config = RendezvousConfig(r, n, "127.0.0.1", torch_port, timeout=10)
        for generation in range(2):                 # a second init reads its own key
            rdzv = Rendezvous(config)
            try:
                rdzv.join(nrtorch.store_port_exchange(config))
                got = (rdzv.config.master_port, rdzv.all_gather("x", r * 10 + generation))
            finally:
                rdzv.close(timeout=5)
        return got

    out = in_threads(n, rank)
    ports = {o[0] for o in out}
    assert len(ports) == 1 and torch_port not in ports
    assert all(o[1] == [0 + 1, 10 + 1, 20 + 1] for o in out)
    del master


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


RDZV_UNDER_TORCHRUN = """
import os, sys
from netreduce.tensors import torch_store_in_use
from ring_setup.rendezvous import Rendezvous, RendezvousConfig
assert torch_store_in_use(), "torchrun's environment not recognised"
import netreduce.torch as nrtorch
config = RendezvousConfig.resolve()
rdzv = Rendezvous(config).join(nrtorch.store_port_exchange(config))
got = rdzv.all_gather("who", [config.rank, int(os.environ["LOCAL_RANK"])])
# one write per line: torchrun's ranks share stdout, unbuffered
os.write(1, f"RDZV {os.environ['MASTER_PORT']} {rdzv.config.master_port} {got}\\n".encode())
rdzv.close(timeout=10)
"""


def test_under_torchrun_the_store_port_goes_through_torchruns_store(tmp_path: Any) -> None:
    """Real torchrun (its agent's store on MASTER_PORT): netreduce's rendezvous does not
    bind MASTER_PORT, and every rank reaches rank 0's store."""
    script = tmp_path / "rdzv.py"
    script.write_text(RDZV_UNDER_TORCHRUN)
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                          "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                          "--master-port", str(port), str(script)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": "."})
    lines = sorted(line for line in out.stdout.splitlines() if line.startswith("RDZV"))
    assert out.returncode == 0 and len(lines) == 2, out.stdout + out.stderr
    ours = {line.split()[2] for line in lines}
    assert {line.split()[1] for line in lines} == {str(port)}
    assert len(ours) == 1 and ours != {str(port)}
    assert all(line.endswith("[[0, 0], [1, 1]]") for line in lines), lines


def test_the_netreduce_process_group_routes_allreduce_and_delegates_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ProcessGroupNetreduce on 2 rank threads (its communicator on the fake fabric and
    switch, its store port through the group's store): all_reduce SUM/AVG/MAX of float32
    and SUM of float16, AVG of bfloat16 through netreduce (the switch, the ring), int8 /
    PRODUCT / broadcast through gloo,
    DDP with no hook over it trains like DDP over gloo."""
    n = 2
    store = dist.HashStore()
    fabric = FakeFabric()
    controller = FakeController(fabric)
    seeding = threading.Lock()

    def create(rank: int, world_size: int, *, port_exchange: Any, **_: Any) -> Communicator:
        config = RendezvousConfig(rank, world_size, "127.0.0.1", 0, timeout=10)
        rdzv = Rendezvous(config).join(port_exchange)
        return Communicator.connect(rdzv, FakeHost(fabric, rank), CFG,
                                    controller if rank == 0 else None)
    monkeypatch.setattr(Communicator, "create", staticmethod(create))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    def rank(r: int) -> dict[str, Any]:
        pg = nrtorch.ProcessGroupNetreduce(store, r, n, timedelta(seconds=20))
        comm = pg.comm
        try:
            got: dict[str, Any] = {}

            def allreduce(t: torch.Tensor, op: Any) -> tuple[torch.Tensor, int]:
                opts = dist.AllreduceOptions()
                opts.reduceOp = op
                before = comm._calls
                pg.allreduce([t], opts).get_future().wait()
                return t, comm._calls - before
            got["sum"] = allreduce(torch.full((5,), float(r + 1)), dist.ReduceOp.SUM)
            got["sum_algo"] = comm.last_algo
            got["avg"] = allreduce(torch.full((5,), float(r + 1)), dist.ReduceOp.AVG)
            got["max64"] = allreduce(torch.full((3,), float(r), dtype=torch.float64),
                                     dist.ReduceOp.MAX)
            got["max_algo"] = comm.last_algo
            got["f16"] = allreduce(torch.full((3,), float(r + 1), dtype=torch.float16),
                                   dist.ReduceOp.SUM)
            got["bf16"] = allreduce(torch.full((3,), float(r + 1), dtype=torch.bfloat16),
                                    dist.ReduceOp.AVG)
            got["bf16_algo"] = comm.last_algo
            got["i8"] = allreduce(torch.full((3,), r + 1, dtype=torch.int8), dist.ReduceOp.SUM)
            got["prod"] = allreduce(torch.full((3,), float(r + 2)), dist.ReduceOp.PRODUCT)
            b = torch.full((2,), float(r))
            pg.broadcast([b]).wait()
            got["bcast"] = b
            with seeding:
                torch.manual_seed(0)
                model = torch.nn.Linear(4, 2)
            ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg)
            ddp(torch.full((3, 4), float(r + 1))).sum().backward()
            got["ddp"] = model.weight.grad.clone()
            return got
        finally:
            comm.close(timeout=5)

    out = in_threads(n, rank)
    for got in out:
        assert got["sum"][1] == 1 and torch.equal(got["sum"][0], torch.full((5,), 3.0))
        assert got["sum_algo"] == "switch" and got["max_algo"] == "ring"
        assert got["avg"][1] == 1 and torch.equal(got["avg"][0], torch.full((5,), 1.5))
        assert got["max64"][1] == 1 and torch.equal(got["max64"][0], torch.full((3,), 1.0,
                                                                                dtype=torch.float64))
        assert got["f16"][1] == 1 and torch.equal(got["f16"][0], torch.full((3,), 3.0,
                                                                             dtype=torch.float16))
        assert got["bf16"][1] == 1 and got["bf16_algo"] == "switch" and torch.equal(
            got["bf16"][0], torch.full((3,), 1.5, dtype=torch.bfloat16))
        assert got["i8"][1] == 0 and torch.equal(got["i8"][0], torch.full((3,), 3,
                                                                           dtype=torch.int8))
        assert got["prod"][1] == 0 and torch.equal(got["prod"][0], torch.full((3,), 6.0))
        assert torch.equal(got["bcast"], torch.zeros(2))
        # d/dW sum(W x + b) = sum of the rows of x: rank r's x is r + 1; averaged: 1.5 * 3
        assert torch.allclose(got["ddp"], torch.full((2, 4), 4.5))


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
