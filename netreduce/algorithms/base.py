"""The seam between the communicator and its allreduce algorithms.

An algorithm says whether it can reduce a dtype with an op, how much workspace a call
needs and what a rank must tell the others about its data (`local_range`, carried by the
per-call metadata); it may refuse an agreed call (`check`) and runs it (`run`): it reads
the caller's input, works in its workspace, and writes the result to the caller's output
(which may be the input itself) only after its last read of the input. It may use the
streams of the communicator's QP rings ("ring" for host algorithms; "inc" for in-network
aggregation: on it every rank must post the identical message sequence, and with a switch
the metadata exchange posts there too) and the successor's workspace, whose address the
per-call metadata exchange delivered.

Call order, identical on every rank: `check_call` (before any exchange, for an explicit
algo), metadata exchange and agreement, `check` (raises `CallRejected` alike on every rank,
nothing moved; under algo="auto" `netreduce.routing` takes the ring instead where the
switch's `check` says the data cannot travel), `run`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple, Protocol

import numpy as np

from flowctl.link import LocalBuffer, RemoteBuffer
from flowctl.stream import Outgoing, Stream
from netreduce.workspace import RegisteredMemory


class Spare(NamedTuple):
    """Memory a call's `local_range` may write ahead of its agreement (the switch's
    quantize ahead): the first `nbytes` of `memory`, the call's workspace, hold nothing a
    kept call needs (netreduce.away.AwayProtocol.free_below); `seq` and `world_size`: the
    call's."""

    memory: RegisteredMemory
    nbytes: int
    seq: int
    world_size: int


class DataRange(NamedTuple):
    """What a rank publishes about its data in the call's metadata (`netreduce.meta.CallMeta`
    lo, hi, blocks): what the algorithm's `check` and `run` need to agree on."""

    lo: float = 0.0
    hi: float = 0.0
    blocks: bytes = b""        # per-block facts, at most netreduce.meta.MAX_BLOCK_BYTES
    inline: bool = False       # `blocks` is the data itself (a small call: no data transfer)


@dataclass(frozen=True)
class CallContext:
    """One agreed allreduce call, as an algorithm sees it."""

    rank: int
    world_size: int
    seq: int                        # the call's number on the communicator (from 0)
    count: int
    dtype: np.dtype
    op: np.ufunc                    # folds two contributions
    divisor: int                    # the result is the reduction / divisor (op="avg": n)
    ranges: tuple[tuple[float, float], ...]   # every rank's `local_range` (lo, hi), by rank
    workspace: RegisteredMemory     # this call's, `workspace_bytes` large, the algorithm's own
    peer_workspace: RemoteBuffer    # the successor's workspace for this call
    streams: Mapping[str, Stream]   # by ring name
    blocks: tuple[bytes, ...] = ()  # every rank's `local_range(...).blocks`, by rank
    inline: bool = False            # every rank's `blocks` is its data (`DataRange.inline`)
    then: Outgoing | None = None    # posted on "inc" behind this call's data, unsettled:
    #                                 the next call's records (calls in flight, comm.py)
    # the caller's array registered in place (netreduce.regcache), None where it cannot be
    registered: Callable[[np.ndarray], LocalBuffer | None] | None = None


class Algorithm(Protocol):
    name: str

    def check_call(self, dtype: np.dtype, op: str) -> None:
        """Raise TypeError / ValueError unless the algorithm reduces `dtype` with `op`."""
        ...

    def workspace_bytes(self, count: int, dtype: np.dtype, world_size: int) -> int: ...

    def local_range(self, array: np.ndarray, spare: Spare | None = None) -> DataRange:
        """What this rank publishes in the call's metadata; it may also write into
        `spare` what its `run` of the same call would write first."""
        ...

    def check(self, call: CallContext) -> None:
        """Raise a `netreduce.meta.CallRejected` to refuse the call: a function of the
        call's agreed fields and `ranges` only, so every rank decides alike."""
        ...

    def run(self, call: CallContext, src: np.ndarray, dst: np.ndarray) -> None:
        """Reduce `src` (this rank's `count` elements) over the ranks into `dst` (same shape
        and dtype; may be `src`), divided by `call.divisor` before the result's last
        rounding to `dtype`."""
        ...
