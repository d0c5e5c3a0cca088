"""Whole allreduce calls on the RC model's World, and the packet counts an oracle expects of
them: each rank's seeded int32 input, numpy's sum of all ranks' inputs, and how many RoCE
packets and messages a transfer takes under a FlowConfig's message plan (counted from the
config's sizes, not from flowctl's planner)."""
from __future__ import annotations

from typing import Any

import numpy as np

from flowctl import FlowConfig
from tests.rcmodel.world import World


def data(rank: int, count: int, dtype: str = "int32") -> np.ndarray:
    """Rank `rank`'s input of `count` elements: integers in [-1000, 1000), seeded."""
    return np.random.default_rng([rank, count]).integers(-1000, 1000, count).astype(dtype)


def want(n: int, count: int, dtype: str = "int32") -> np.ndarray:
    """numpy's sum of the `n` ranks' inputs."""
    return np.sum([data(r, count, dtype) for r in range(n)], axis=0, dtype=dtype)


def allreduce(world: World, count: int, algo: str, dtype: str = "int32") -> list[Any]:
    """One call of `algo` on every rank of `world`; each rank's result or exception."""
    return world.run(lambda comm: comm.allreduce(data(comm.rank, count, dtype), algo=algo))


def packets(nbytes: int, cfg: FlowConfig) -> int:
    """RoCE packets of one transfer of `nbytes` under `cfg`'s message plan."""
    full, rest = divmod(nbytes, cfg.msg_size)
    return full * cfg.packets_per_message + -(-rest // cfg.mtu)


def messages(nbytes: int, cfg: FlowConfig) -> int:
    """RDMA messages (one ACK each) of one transfer of `nbytes` under `cfg`."""
    return -(-nbytes // cfg.msg_size)
