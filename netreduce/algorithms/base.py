"""The seam between the communicator and its allreduce algorithms.

An algorithm says how much workspace a call needs and runs the call on data the
communicator has already copied to the start of the workspace (`count` elements), leaving
the result there. It may use the streams of the communicator's QP rings ("ring" for host
algorithms; "inc" is reserved for in-network aggregation: on it every rank must post the
identical message sequence) and the successor's workspace, whose address the per-call
metadata exchange delivered.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

import numpy as np

from flowctl.link import RemoteBuffer
from flowctl.stream import Stream
from netreduce.workspace import RegisteredMemory


@dataclass(frozen=True)
class CallContext:
    """One agreed allreduce call, as an algorithm sees it."""

    rank: int
    world_size: int
    count: int
    dtype: np.dtype
    op: np.ufunc
    workspace: RegisteredMemory     # data: `count` elements at offset 0 (input in, result out)
    peer_workspace: RemoteBuffer    # the successor's workspace for this call
    streams: Mapping[str, Stream]   # by ring name


class Algorithm(Protocol):
    name: str

    def workspace_bytes(self, count: int, itemsize: int, world_size: int) -> int: ...
    def run(self, call: CallContext) -> None: ...
