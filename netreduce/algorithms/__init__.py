"""Allreduce algorithms behind `Communicator.allreduce(..., algo=...)` (seam: `base.py`)."""
from __future__ import annotations

from netreduce.algorithms.base import Algorithm, CallContext
from netreduce.algorithms.ring import RING

ALGOS = ("ring", "switch", "auto")

__all__ = ["ALGOS", "Algorithm", "CallContext", "resolve"]


def resolve(algo: str) -> Algorithm:
    """The algorithm `algo` names; "auto" picks one (its `name` says which: ring, for now)."""
    if algo in ("ring", "auto"):
        return RING
    if algo == "switch":
        raise NotImplementedError("allreduce: algo='switch' (in-network aggregation over the "
                                  "'inc' QP ring) is not implemented yet; use algo='ring' or "
                                  "'auto'")
    raise ValueError(f"allreduce: unknown algo {algo!r} (choose from {', '.join(ALGOS)})")
