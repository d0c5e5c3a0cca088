"""netreduce's rendezvous through torch's store: when torch owns MASTER_PORT (an initialised
process group's TCPStore, or torchrun's agent store), rank 0 serves netreduce's own store on
a port the kernel picks and passes that port through torch's store.

Kept apart from `netreduce.torch` so that `netreduce.comm` can use it without importing the
API layer (no import circle): it depends on torch.distributed and the rendezvous only.
"""
from __future__ import annotations

from datetime import timedelta
import torch.distributed as dist

from ring_setup.rendezvous import PortExchange, RendezvousConfig
from ring_setup.store_protocol import RendezvousError

_COUNT_KEY = "netreduce/inits/{}"       # per rank: how many communicators it created
_PORT_KEY = "netreduce/store_port/{}"   # the k-th communicator's store "PORT SECRET"


def _torch_store(config: RendezvousConfig) -> dist.Store:
    """The initialised process group's store, else a client of torchrun's agent store at
    MASTER_ADDR:MASTER_PORT."""
    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    return dist.TCPStore(config.master_addr, config.master_port, is_master=False,
                         timeout=timedelta(seconds=config.timeout))


def store_port_exchange(config: RendezvousConfig,
                        store: dist.Store | None = None) -> PortExchange:
    """`Rendezvous.join`'s exchange of the store's port and the job's secret through torch's
    store: each rank counts its communicators in the store; rank 0 sets the key of its k-th
    (inits are collective, so every rank's k-th is the same communicator) to its store's port
    and secret; the others wait for it (torch's store timeout). Whoever may read torch's
    store may then join netreduce's: the job's trust domain is torch's. `store`: torch's
    store (default: see `_torch_store`)."""
    store = store if store is not None else _torch_store(config)
    key = _PORT_KEY.format(store.add(_COUNT_KEY.format(config.rank), 1))

    def exchange(mine: tuple[int, str] | None) -> tuple[int, str]:
        try:
            if mine is not None:
                store.set(key, f"{mine[0]} {mine[1]}")
                return mine
            port, secret = store.get(key).decode().split(" ", 1)
            return int(port), secret
        except (RuntimeError, ValueError) as exc:   # torch's DistStoreError is a RuntimeError
            raise RendezvousError(f"rendezvous: rank {config.rank}: cannot pass netreduce's "
                                  f"store port through torch's store ({key!r} at "
                                  f"{config.where}): {exc}") from exc
    return exchange
