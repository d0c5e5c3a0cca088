"""Allreduce algorithms behind `Communicator.allreduce(..., algo=...)` (seam: `base.py`)."""
from __future__ import annotations

import numpy as np

from netreduce.algorithms.base import Algorithm, CallContext
from netreduce.algorithms.ring import RING
from netreduce.algorithms.switch import SWITCH
from netreduce.registration import SwitchStatus

ALGORITHMS: dict[str, Algorithm] = {"switch": SWITCH, "ring": RING}
ALGOS = (*ALGORITHMS, "auto")

__all__ = ["ALGOS", "ALGORITHMS", "Algorithm", "CallContext", "choose", "resolve"]


def resolve(algo: str) -> Algorithm:
    """The algorithm named `algo` ("switch" or "ring"); ValueError for any other name."""
    try:
        return ALGORITHMS[algo]
    except KeyError:
        raise ValueError(f"allreduce: unknown algo {algo!r} (choose from "
                         f"{', '.join(ALGOS)})") from None


def choose(algo: str, dtype: np.dtype, op: str, switch: SwitchStatus) -> Algorithm:
    """The algorithm a call of `dtype` and `op` with `algo` runs, or TypeError / ValueError
    (before any exchange). "auto" picks the switch when the communicator's "inc" ring is
    registered with one (`switch`) and the switch reduces `dtype` with `op`, else the ring;
    the returned algorithm's `name` says which."""
    if algo == "auto":
        return SWITCH if switch.registered and SWITCH.supports(dtype, op) else RING
    algorithm = resolve(algo)
    if algorithm is SWITCH and not switch.registered:
        raise ValueError(f"allreduce: algo='switch' needs the communicator's 'inc' ring "
                         f"registered with a switch, and it is not: {switch.note}")
    algorithm.check_call(dtype, op)
    return algorithm
