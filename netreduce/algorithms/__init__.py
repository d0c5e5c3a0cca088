"""Allreduce algorithms behind `Communicator.allreduce(..., algo=...)` (seam: `base.py`;
which one a call runs: `netreduce.routing`)."""
from __future__ import annotations

from netreduce.algorithms.base import Algorithm, CallContext
from netreduce.algorithms.ring import RING
from netreduce.algorithms.switch import SWITCH

ALGORITHMS: dict[str, Algorithm] = {"switch": SWITCH, "ring": RING}
ALGOS = (*ALGORITHMS, "auto")

__all__ = ["ALGOS", "ALGORITHMS", "Algorithm", "CallContext", "resolve"]


def resolve(algo: str) -> Algorithm:
    """The algorithm named `algo` ("switch" or "ring"); ValueError for any other name."""
    try:
        return ALGORITHMS[algo]
    except KeyError:
        raise ValueError(f"allreduce: unknown algo {algo!r} (choose from "
                         f"{', '.join(ALGOS)})") from None
