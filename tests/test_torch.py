"""torch tensors through the communicator, asynchronous calls, the rendezvous through
torch's store and the netreduce process group, on the in-process fabric
(tests/fakefabric.py). The DDP hooks: tests/test_torch_ddp.py; DDP over real RDMA:
tests/lab/test_torch.py."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import numpy as np
import pytest

import netreduce.shards as shards
from netreduce.comm import Communicator, CommunicatorError, PeerFailure
from netreduce.connect import connect
from netreduce.meta import AllreduceMismatch
from ring_setup.rendezvous import Rendezvous, RendezvousConfig
from tests.fakefabric import FakeController, FakeFabric, FakeHost
from tests.processes import free_port
from tests.ranks import CFG, rank_data, run_ranks

import tests.torch_required  # noqa: F401,I001 - skips this module without torch: before it

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import netreduce.torch as nrtorch     # noqa: E402 - after the torch check


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


def test_a_torch_without_the_private_hooks_is_refused_at_import_on_a_fake_class() -> None:
    """The installed torch has what the backend needs (this module imported it); a
    ProcessGroup class without them (a fake, as a torch that dropped them) is an ImportError
    naming the torch, each missing member and the supported range."""
    class NoHooks:
        BackendType = dist.ProcessGroup.BackendType

    nrtorch.require_process_group_hooks()
    with pytest.raises(ImportError) as refused:
        nrtorch.require_process_group_hooks(NoHooks)
    message = str(refused.value)
    assert f"torch {torch.__version__} has no torch.distributed.ProcessGroup._register_backend, " \
        "torch.distributed.ProcessGroup._set_default_backend (private" in message
    assert message.endswith("supported: " + nrtorch.supported_torch())
    assert nrtorch.supported_torch().startswith("torch>=")


def test_init_process_groups_timeout_reaches_the_communicator_on_a_fake_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """dist.init_process_group("netreduce", timeout=42 s), through torch's own path: the
    communicator is created with collective_timeout 42 s (a fake communicator: what
    netreduce.connect.create was given is the point; the knob's effect: tests/test_comm.py)."""
    given: dict[str, Any] = {}

    class FakeCommunicator:
        def close(self, timeout: float = 10.0) -> None:
            return None

    def create(rank: int, world_size: int, **kwargs: Any) -> FakeCommunicator:
        given.update(kwargs, rank=rank, world_size=world_size)
        return FakeCommunicator()
    monkeypatch.setattr(shards, "create", create)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("netreduce", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=42))
    try:
        assert dist.get_backend() == "netreduce"
    finally:
        dist.destroy_process_group()
    assert given["rank"] == 0 and given["world_size"] == 1
    assert given["config"].collective_timeout == 42.0


def ddp_gradient(pg: dist.ProcessGroup, r: int, seeding: threading.Lock) -> torch.Tensor:
    """One backward pass of DDP over `pg` on rank `r` (a Linear(4, 2) seeded alike on
    every rank, input r + 1): the weight's averaged gradient."""
    with seeding:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg)
    ddp(torch.full((3, 4), float(r + 1))).sum().backward()
    return model.weight.grad.clone()


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
        return connect(rdzv, FakeHost(fabric, rank), CFG,
                       controller if rank == 0 else None)
    monkeypatch.setattr(shards, "create", create)
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
            got["ddp"] = ddp_gradient(pg, r, seeding)
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




def test_the_netreduce_process_group_shards_allreduce_over_two_fake_aggregators(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """dist's "netreduce" group when $NR_CONTROLLER lists 2 controllers (k = 2): its
    communicator is a ShardedCommunicator over 2 fake aggregators (one fabric each), whose
    store ports pass through the group's store; all_reduce SUM of int32 exact and AVG of
    float32 within its bound, each aggregator carrying its half of the bytes; DDP over the
    group averages the gradients."""
    n, count = 2, 6000
    store = dist.HashStore()
    fabrics = [FakeFabric(), FakeFabric()]
    controllers = [FakeController(f) for f in fabrics]
    seeding = threading.Lock()

    def create(rank: int, world_size: int, master_addr: Any = None, master_port: Any = None,
               *, switch: str, port_exchange: Any, **_: Any) -> Communicator:
        j = ["fake-0:1", "fake-1:1"].index(switch)
        rdzv = Rendezvous(RendezvousConfig(rank, world_size, "127.0.0.1", 0,
                                           timeout=10)).join(port_exchange)
        return connect(rdzv, FakeHost(fabrics[j], rank), CFG,
                       controllers[j] if rank == 0 else None)
    monkeypatch.setattr(shards, "create", create)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("NR_CONTROLLER", "fake-0:1,fake-1:1")
    monkeypatch.setenv("NR_INC_ADDR", "10.78.0.0/24,10.78.1.0/24")

    def rank(r: int) -> dict[str, Any]:
        pg = nrtorch.ProcessGroupNetreduce(store, r, n, timedelta(seconds=20))
        comm = pg.comm
        try:
            got: dict[str, Any] = {"kind": type(comm).__name__}
            for name, t, op in (
                    ("sum", torch.from_numpy(rank_data(r, count, "int32")), dist.ReduceOp.SUM),
                    ("avg", torch.from_numpy(rank_data(r, count, "float32")),
                     dist.ReduceOp.AVG)):
                opts = dist.AllreduceOptions()
                opts.reduceOp = op
                pg.allreduce([t], opts).get_future().wait()
                got[name], got[name + "_algo"] = t.numpy().copy(), comm.last_algo
            got["bytes"] = [a["bytes"] for a in comm.stats()["aggregators"]]
            got["ddp"] = ddp_gradient(pg, r, seeding)
            return got
        finally:
            comm.close(timeout=5)

    out = in_threads(n, rank)
    inputs = {d: [rank_data(r, count, d) for r in range(n)] for d in ("int32", "float32")}
    for got in out:
        assert not isinstance(got, BaseException), got
        assert got["kind"] == "ShardedCommunicator"
        assert got["sum_algo"] == got["avg_algo"] == "switch"
        assert np.array_equal(got["sum"], np.sum(inputs["int32"], axis=0, dtype=np.int32))
        want = np.sum(np.stack(inputs["float32"]).astype(np.float64), axis=0) / n
        assert np.allclose(got["avg"], want, rtol=1e-6, atol=1e-6)
        # int32 split at 3000; float32 at a multiple of its 1024-element blocks: 3072
        assert got["bytes"] == [4 * (3000 + 3072), 4 * (3000 + 2928)], got["bytes"]
        assert torch.allclose(got["ddp"], torch.full((2, 4), 4.5))
