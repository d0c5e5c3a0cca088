"""netreduce's rendezvous through torch's store: when torch owns MASTER_PORT (an initialised
process group's TCPStore, or torchrun's agent store), rank 0 serves netreduce's own store on
a port the kernel picks and passes that port through torch's store.

Kept apart from `netreduce.torch` so that `netreduce.comm` can use it without importing the
API layer (no import circle): it depends on torch.distributed and the rendezvous only.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Callable

import torch.distributed as dist

from ring_setup.rendezvous import RendezvousConfig, RendezvousError

_COUNT_KEY = "netreduce/inits/{}"       # per rank: how many communicators it created
_PORT_KEY = "netreduce/store_port/{}"   # the k-th communicator's store port


def _torch_store(config: RendezvousConfig) -> dist.Store:
    """The initialised process group's store, else a client of torchrun's agent store at
    MASTER_ADDR:MASTER_PORT."""
    if dist.is_available() and dist.is_initialized():
        return dist.distributed_c10d._get_default_store()
    return dist.TCPStore(config.master_addr, config.master_port, is_master=False,
                         timeout=timedelta(seconds=config.timeout))


def store_port_exchange(config: RendezvousConfig,
                        store: dist.Store | None = None) -> Callable[[int | None], int]:
    """`Rendezvous.join`'s port exchange through torch's store: each rank counts its
    communicators in the store; rank 0 sets the key of its k-th (inits are collective, so
    every rank's k-th is the same communicator) to its store's port; the others wait for
    it (torch's store timeout). `store`: torch's store (default: see `_torch_store`)."""
    store = store if store is not None else _torch_store(config)
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
