"""PyTorch integration: a DDP comm hook and one rendezvous with torch's store.

    import torch.distributed as dist, netreduce, netreduce.torch
    dist.init_process_group("gloo")               # torchrun or netreduce.tools.launch set the env
    comm = netreduce.init()                       # its store's port travels through torch's
    model = DistributedDataParallel(model)
    model.register_comm_hook(comm, netreduce.torch.allreduce_hook)

`allreduce_hook` averages each gradient bucket through netreduce (algo="auto": in the
network when the communicator's ring is registered with a switch, else the host ring),
asynchronously: it returns at once and the call runs on the communicator's progress
thread in the order DDP issued it, overlapping the rest of the backward pass.
`bf16_allreduce_hook` is torch's `bf16_compress_hook` (ddp_comm_hooks.default_hooks) with
netreduce reducing: every rank's bucket is rounded to bfloat16 before the reduction, the
bfloat16 average comes back into the bucket. It saves no wire bytes today (the switch adds
int32 words, the ring moves float32): it gives torch's bf16-compressed numerics, not speed.
(Not named `bf16_compress_hook`: DDP refuses a hook of that __name__ unless torch has
CUDA 11+ and NCCL 2.10+, or XPU and XCCL, whatever the hook does.)

Non-finite gradients: a float32 bucket holding NaN or Inf cannot travel quantized through
the switch. Under algo="auto" the communicator routes that call over the host ring
itself (`netreduce.routing`, alike on every rank), which sums NaN/Inf as gloo would;
under HookState(algo="switch") the switch refuses it (`NotQuantizable`, on every rank
before any data moves) and the hook reduces the bucket over the ring. Either way the hook
warns (`NonFiniteGradientWarning`, every time, naming the bucket and the rank): so the
averaged gradients hold NaN/Inf exactly where DDP over gloo would put them, and AMP's
GradScaler or the user's own check sees them and skips the step.

A switch that restarts or loses the ring (docs/reliability.md, "Switch restarts") costs the
step its time, never the step: the communicator finishes the call in flight over the host
ring and runs later buckets there until the ring is registered again; under
HookState(algo="switch") a bucket refused meanwhile (`SwitchUnavailable`, alike on every
rank) is reduced over the ring too.

Supported torch: the `torch` extra's range (pyproject.toml), whose lower bound is the
version CI tests. The backend is registered with torch's public
`dist.Backend.register_backend(name, func, devices=["cpu"])`; but torch has no public way
for a process group written in Python to hand what torch calls from C++ (DDP's parameter
checks) to another backend: `ProcessGroup._register_backend` / `_set_default_backend` /
`BackendType` do it (torch's own tests of Python process groups use them). Importing this
module checks that the installed torch has them (`require_process_group_hooks`): a torch
without them fails here, naming itself and the supported range, not inside DDP.

One rendezvous: torch owns MASTER_PORT when a process group is initialised (its TCPStore
serves there on rank 0) or when torchrun started the process (its agent's store serves
there). netreduce's own store (liveness, aborts: ring_setup.rendezvous) then serves on a
port the kernel picks on rank 0, which every rank reads from torch's store
(`netreduce.torch_store`): no second fixed port, no collision.
"""

import atexit
import importlib.metadata
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from flowctl.plan import FlowConfig
from netreduce.algorithms.switch import NotQuantizable
from netreduce.api import get_communicator
from netreduce.comm import Communicator
from netreduce.progress import Work
from netreduce.shards import ShardedCommunicator, create_communicator
from netreduce.routing import NON_FINITE, SwitchUnavailable
from netreduce.torch_store import store_port_exchange
from nr_contract.distribution import DISTRIBUTION
from ring_setup.rendezvous import RendezvousConfig

#: torch.distributed.ProcessGroup's private members the backend needs (see the module doc)
PROCESS_GROUP_HOOKS = ("_register_backend", "_set_default_backend", "BackendType")
AnyCommunicator = Communicator | ShardedCommunicator     # k > 1 aggregators: the latter


def supported_torch() -> str:
    """The installed distribution's torch requirement (its `torch` extra), e.g. 'torch>=2.13'."""
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:     # a source tree, never installed
        requires = []
    return next((r.split(";")[0].strip() for r in requires if r.startswith("torch")),
                "the torch extra of pyproject.toml")


def require_process_group_hooks(process_group: type = dist.ProcessGroup) -> None:
    """ImportError unless `process_group` has every member of PROCESS_GROUP_HOOKS."""
    missing = [name for name in PROCESS_GROUP_HOOKS if not hasattr(process_group, name)]
    if missing:
        raise ImportError(
            f"netreduce.torch: torch {torch.__version__} has no "
            f"{', '.join('torch.distributed.ProcessGroup.' + m for m in missing)} (private "
            f"members the 'netreduce' backend hands gloo its share with); supported: "
            f"{supported_torch()}")


require_process_group_hooks()


class NonFiniteGradientWarning(UserWarning):
    """A gradient bucket held NaN or Inf and was reduced over the host ring instead."""


warnings.filterwarnings("always", category=NonFiniteGradientWarning)   # loud: every bucket


@dataclass(frozen=True)
class HookState:
    """What the hooks reduce with: `comm` (None: the default communicator) and `algo`
    ("auto", "switch" or "ring", as `allreduce` takes it)."""

    comm: AnyCommunicator | None = None
    algo: str = "auto"


def _resolve(state: HookState | AnyCommunicator | None) -> tuple[AnyCommunicator, str]:
    if isinstance(state, HookState):
        return state.comm or get_communicator(), state.algo
    return state or get_communicator(), "auto"


def _average(comm: AnyCommunicator, tensor: torch.Tensor, index: int, algo: str) -> None:
    """Average `tensor` (DDP bucket `index`) over all ranks in place; a NaN/Inf bucket goes
    over the host ring, with a warning (see the module doc)."""
    try:
        comm.allreduce(tensor, op="avg", algo=algo)
        non_finite = comm.last_fallback == NON_FINITE
    except NotQuantizable:            # algo="switch" refuses what "auto" would route
        comm.allreduce(tensor, op="avg", algo="ring")
        non_finite = True
    except SwitchUnavailable:         # the switch is away (restarting): the ring meanwhile
        comm.allreduce(tensor, op="avg", algo="ring")
        non_finite = False
    if non_finite:
        warnings.warn(f"netreduce: rank {comm.rank}: DDP gradient bucket {index} "
                      f"({tensor.numel()} x {tensor.dtype}) holds NaN or Inf, which the "
                      f"switch cannot carry: reduced over the host ring instead",
                      NonFiniteGradientWarning, stacklevel=3)


def average_bucket(comm: AnyCommunicator, bucket: Any, algo: str = "auto") -> torch.Tensor:
    """Average `bucket.buffer()` over all ranks in place and return it."""
    buffer = bucket.buffer()
    _average(comm, buffer, bucket.index(), algo)
    return buffer


def average_bucket_bf16(comm: AnyCommunicator, bucket: Any, algo: str = "auto") -> torch.Tensor:
    """torch's bf16_compress_hook's numerics: `bucket.buffer()` rounded to bfloat16 on every
    rank (what each rank contributes), averaged over all ranks as bfloat16 (netreduce's
    op="avg": the sum, divided by n, rounded once to bfloat16), and the average written back
    into the buffer in its own dtype (exactly: every bfloat16 is a float32). Returns the
    buffer. torch's hook divides each rank's bfloat16 by n before the sum and gloo rounds
    every partial sum to bfloat16; here the only roundings are the contributions' and the
    result's (plus the switch's quantization, ~n^2 * 2^-30 of the block's largest |x|)."""
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16)
    _average(comm, compressed, bucket.index(), algo)
    return buffer.copy_(compressed)


def _ddp_future(work: Work) -> torch.futures.Future[torch.Tensor]:
    """A future DDP waits on from C++: its value is the work's tensor, or it fails with the
    work's error, raised by a callback so that torch marks the future failed (DDP then
    reports "Got the following error when running the callback: PeerFailure: netreduce:
    rank ..."); a future given the exception as its value (`set_exception`) would reach DDP
    as "Unable to cast <the message> to Tensor"."""
    done: torch.futures.Future[None] = torch.futures.Future()
    work.add_done_callback(lambda _: done.set_result(None))
    return done.then(lambda _: work.wait())


def allreduce_hook(state: HookState | AnyCommunicator | None,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook (`model.register_comm_hook(state, allreduce_hook)`; state None or a
    Communicator: that communicator, algo="auto"): queue the bucket's average on the
    communicator's progress thread and return its future at once."""
    # (annotations evaluated, not postponed: DDP checks them against dist.GradBucket)
    comm, algo = _resolve(state)
    return _ddp_future(comm.submit(lambda: average_bucket(comm, bucket, algo),
                                   f"DDP gradient bucket {bucket.index()}",
                                   first=(bucket.buffer(), "avg", algo)))


def bf16_allreduce_hook(state: HookState | AnyCommunicator | None,
                        bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's `bf16_compress_hook` reduced by netreduce (`average_bucket_bf16`; state as
    `allreduce_hook` takes it): queued on the progress thread -- the cast to bfloat16, the
    average, the cast back -- and its future returned at once."""
    comm, algo = _resolve(state)
    return _ddp_future(comm.submit(lambda: average_bucket_bf16(comm, bucket, algo),
                                   f"DDP gradient bucket {bucket.index()} (bfloat16)"))


def allreduce_hook_sync(state: HookState | AnyCommunicator | None,
                        bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The same average, done before returning (no overlap with the backward pass): to
    measure what the asynchronous hook hides."""
    comm, algo = _resolve(state)
    work = Work(f"DDP gradient bucket {bucket.index()}")
    try:
        work.finish(result=average_bucket(comm, bucket, algo))
    except Exception as exc:        # noqa: BLE001 - DDP raises it from the future
        work.finish(error=exc)
    return _ddp_future(work)


class _TorchWork(dist.Work):
    """A netreduce `Work` as torch.distributed's: its future's value is the tensor list."""

    def __init__(self, work: Work, tensors: list[torch.Tensor]) -> None:
        super().__init__()
        self._work, self._tensors = work, tensors

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._work.wait(None if timeout is None or not timeout else timeout.total_seconds())
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self) -> torch.futures.Future[list[torch.Tensor]]:
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()

        def complete(work: Work) -> None:
            error = work.exception()
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(self._tensors)
        self._work.add_done_callback(complete)
        return future


_NETREDUCE_OPS = {"SUM": "sum", "MAX": "max", "MIN": "min", "AVG": "avg"}
_NETREDUCE_DTYPES = (torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
                     torch.float64)


class ProcessGroupNetreduce(dist.ProcessGroup):
    """`dist.init_process_group("netreduce")` (after `import netreduce.torch`).

    Invariant: `all_reduce` of one contiguous CPU tensor of a dtype netreduce reduces, with
    SUM, MAX, MIN or (floating point) AVG, runs through netreduce (algo="auto":
    the switch when the ring is registered with one and it reduces dtype and op), queued
    on the communicator's progress thread in issue order; every other call -- the other
    collectives, other ops, dtypes or layouts, several tensors -- goes to a gloo process
    group on the same store, which is also this group's backend for what torch calls
    from C++ (DDP's parameter checks). The communicator's store port travels through
    torch's store (`store_port_exchange`). The group's `timeout` (init_process_group's,
    torch's default 30 min) is the communicator's `FlowConfig.collective_timeout`: how long
    a call waits without any progress while every peer is alive (a dead peer is reported
    within about a second whatever it is); gloo's calls get the same."""

    def __init__(self, store: dist.Store, rank: int, world_size: int,
                 timeout: timedelta) -> None:
        super().__init__(rank, world_size)
        self._gloo = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        # private (PROCESS_GROUP_HOOKS, checked at import): gloo serves torch's C++ callers
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                               self._gloo)
        self._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        self._gloo_work: dist.Work | None = None
        config = RendezvousConfig.resolve(rank, world_size, master_port=0)
        self.comm = create_communicator(
            rank, world_size, config=FlowConfig(collective_timeout=timeout.total_seconds()),
            port_exchange=store_port_exchange(config, store))
        atexit.register(self.comm.close)

    def getBackendName(self) -> str:
        return "netreduce"

    def _to_gloo(self, work: dist.Work) -> dist.Work:
        """Keep the latest gloo Work referenced from Python until the next one replaces it.

        torch's gloo worker drops its reference to a finished Work while holding its queue
        lock; when that is the last reference to a tensor owned by Python, the drop needs
        the GIL, and a thread holding the GIL while it enqueues the next gloo call then
        waits for that lock forever (tests/test_torch.py hung so, once, in CI). With this
        reference the last one always goes away here, under the GIL."""
        self._gloo_work = work
        return work

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        """gloo's broadcast, called from Python (its binding releases the GIL)."""
        return self._to_gloo(self._gloo.broadcast(tensors, opts) if opts is not None
                             else self._gloo.broadcast(tensors))

    def _netreduce_op(self, tensors: list[torch.Tensor], opts: Any) -> str | None:
        """netreduce's op for this allreduce, or None when gloo must do it."""
        reduce_op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        op = next((name for name in _NETREDUCE_OPS
                   if reduce_op == getattr(dist.ReduceOp, name)), None)
        if len(tensors) != 1 or op is None:
            return None
        t = tensors[0]
        if t.device.type != "cpu" or t.layout is not torch.strided or not t.is_contiguous() \
                or t.dtype not in _NETREDUCE_DTYPES or (op == "AVG" and not t.is_floating_point()):
            return None
        return op

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        op = self._netreduce_op(tensors, opts)
        if op is None:
            return self._to_gloo(self._gloo.allreduce(tensors, opts) if opts is not None
                                 else self._gloo.allreduce(tensors))
        tensor, comm = tensors[0], self.comm

        def job() -> list[torch.Tensor]:
            comm.allreduce(tensor, op=_NETREDUCE_OPS[op])
            return tensors
        return _TorchWork(comm.submit(job, f"dist.all_reduce {op} {tensor.dtype}"
                                           f"[{tensor.numel()}]"), tensors)


def _create_process_group(store: dist.Store, rank: int, world_size: int,
                          timeout: timedelta) -> ProcessGroupNetreduce:
    return ProcessGroupNetreduce(store, rank, world_size, timeout)


if "netreduce" not in dist.Backend.backend_list:
    dist.Backend.register_backend("netreduce", _create_process_group, devices=["cpu"])
