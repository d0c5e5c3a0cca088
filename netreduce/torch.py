"""PyTorch integration: a DDP comm hook and one rendezvous with torch's store.

    import torch.distributed as dist, netreduce, netreduce.torch
    dist.init_process_group("gloo")               # torchrun or netreduce.launch set the env
    comm = netreduce.init()                       # its store's port travels through torch's
    model = DistributedDataParallel(model)
    model.register_comm_hook(comm, netreduce.torch.allreduce_hook)

`allreduce_hook` averages each gradient bucket through netreduce (algo="auto": in the
network when the communicator's ring is registered with a switch, else the host ring),
asynchronously: it returns at once and the call runs on the communicator's progress
thread in the order DDP issued it, overlapping the rest of the backward pass.

Non-finite gradients: a float32 bucket holding NaN or Inf cannot travel quantized through
the switch (`NotQuantizable`, refused on every rank alike before any data moves). The
hook then reduces that bucket over the host ring, which sums NaN/Inf as gloo would, and
warns (`NonFiniteGradientWarning`, every time, naming the bucket and the rank): so the
averaged gradients hold NaN/Inf exactly where DDP over gloo would put them, and AMP's
GradScaler or the user's own check sees them and skips the step.

One rendezvous: torch owns MASTER_PORT when a process group is initialised (its TCPStore
serves there on rank 0) or when torchrun started the process (its agent's store serves
there). netreduce's own store (liveness, aborts: ring_setup.rendezvous) then serves on a
port the kernel picks on rank 0, which every rank reads from torch's store
(`store_port_exchange`): no second fixed port, no collision.
"""

import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from netreduce.algorithms.switch import NotQuantizable
from netreduce.api import get_communicator
from netreduce.comm import Communicator
from ring_setup.rendezvous import RendezvousConfig, RendezvousError

_COUNT_KEY = "netreduce/inits/{}"       # per rank: how many communicators it created
_PORT_KEY = "netreduce/store_port/{}"   # the k-th communicator's store port


class NonFiniteGradientWarning(UserWarning):
    """A gradient bucket held NaN or Inf and was reduced over the host ring instead."""


warnings.filterwarnings("always", category=NonFiniteGradientWarning)   # loud: every bucket


def _torch_store(config: RendezvousConfig) -> Any:
    """The initialised process group's store, else a client of torchrun's agent store at
    MASTER_ADDR:MASTER_PORT."""
    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    return dist.TCPStore(config.master_addr, config.master_port, is_master=False,
                         timeout=timedelta(seconds=config.timeout))


def store_port_exchange(config: RendezvousConfig) -> Callable[[int | None], int]:
    """`Rendezvous.join`'s port exchange through torch's store: each rank counts its
    communicators in the store; rank 0 sets the key of its k-th (inits are collective, so
    every rank's k-th is the same communicator) to its store's port; the others wait for
    it (torch's store timeout)."""
    store = _torch_store(config)
    key = _PORT_KEY.format(store.add(_COUNT_KEY.format(config.rank), 1))

    def exchange(port: int | None) -> int:
        try:
            if port is not None:
                store.set(key, str(port))
                return port
            return int(store.get(key))
        except (RuntimeError, ValueError) as exc:   # torch's DistStoreError is a RuntimeError
            raise RendezvousError(f"rendezvous: rank {config.rank}: cannot pass netreduce's "
                                  f"store port through torch's store ({key!r} at "
                                  f"{config.where}): {exc}") from exc
    return exchange


@dataclass(frozen=True)
class HookState:
    """What the hooks reduce with: `comm` (None: the default communicator) and `algo`
    ("auto", "switch" or "ring", as `allreduce` takes it)."""

    comm: Communicator | None = None
    algo: str = "auto"


def _resolve(state: HookState | Communicator | None) -> tuple[Communicator, str]:
    if isinstance(state, HookState):
        return state.comm or get_communicator(), state.algo
    return state or get_communicator(), "auto"


def average_bucket(comm: Communicator, bucket: Any, algo: str = "auto") -> torch.Tensor:
    """Average `bucket.buffer()` over all ranks in place (a NaN/Inf float32 bucket that
    the switch refuses goes over the host ring, with a warning: see the module doc) and
    return it."""
    buffer = bucket.buffer()
    try:
        comm.allreduce(buffer, algo=algo)
    except NotQuantizable as exc:
        warnings.warn(f"netreduce: rank {comm.rank}: DDP gradient bucket {bucket.index()} "
                      f"({buffer.numel()} x {buffer.dtype}) holds NaN or Inf, which the "
                      f"switch cannot carry: reduced over the host ring instead ({exc})",
                      NonFiniteGradientWarning, stacklevel=2)
        comm.allreduce(buffer, algo="ring")
    buffer.div_(comm.world_size)
    return buffer


def allreduce_hook(state: HookState | Communicator | None,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook (`model.register_comm_hook(state, allreduce_hook)`; state None or a
    Communicator: that communicator, algo="auto"): queue the bucket's average on the
    communicator's progress thread and return its future at once."""
    # (annotations evaluated, not postponed: DDP checks them against dist.GradBucket)
    comm, algo = _resolve(state)
    work = comm.submit(lambda: average_bucket(comm, bucket, algo),
                       f"DDP gradient bucket {bucket.index()}")
    return work.get_future()


def allreduce_hook_sync(state: HookState | Communicator | None,
                        bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The same average, done before returning (no overlap with the backward pass): to
    measure what the asynchronous hook hides."""
    comm, algo = _resolve(state)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    try:
        future.set_result(average_bucket(comm, bucket, algo))
    except Exception as exc:        # noqa: BLE001 - DDP raises it from the future
        future.set_exception(exc)
    return future

