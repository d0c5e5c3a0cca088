"""Host ring allreduce: reduce-scatter then all-gather over the "ring" QPs, 2(n-1) steps.

The input is copied to the start of the workspace ("data", in the accumulator dtype:
float32 for float16 and bfloat16, else the input's own), reduced there, and the result
copied out (16-bit floats: rounded once, from the float32 result; op="avg": divided by n in
the accumulator dtype first). Everything travels in the accumulator dtype, so a 16-bit call
moves the bytes of a float32 one. The `count` elements are cut into n chunks (sizes differ
by at most one element; some are empty when count < n). With r the rank and all chunk
numbers mod n:
- reduce-scatter step s (0..n-2): send chunk r-s to the successor's staging slot s, receive
  chunk r-s-1 into our staging slot s and fold it into our chunk r-s-1 message by message
  as it arrives. Afterwards rank r holds the final chunk r+1.
- all-gather step t (0..n-2): send chunk r+1-t into the same place of the successor's data,
  receive chunk r-t straight into our data.
Every chunk's final value is computed on one rank and copied to the others, so all ranks
end with bit-identical results (float sums included).

Why nothing is overwritten while still in use: each reduce-scatter step has its own staging
slot, so a fast predecessor cannot clobber a slot we have not folded yet; in the all-gather
the chunk a predecessor writes into our data is one we have already sent on (its final
value depends on our contribution to it). A rank finishes a call only after its successor
finished the reduce-scatter of that call, so the next call cannot clobber a slot either.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

from flowctl.plan import Message
from flowctl.stream import Outgoing
from netreduce.algorithms.base import CallContext, DataRange
from netreduce.dtypes import accumulator

ALIGN = 64


@dataclass(frozen=True)
class RingLayout:
    """Where the ring algorithm keeps things in the workspace: the data (`count` elements)
    at 0, then `world_size - 1` staging slots, each as large as the largest chunk."""

    count: int
    itemsize: int
    world_size: int

    @cached_property
    def bounds(self) -> list[int]:
        """Chunk c holds elements [bounds[c], bounds[c + 1])."""
        base, extra = divmod(self.count, self.world_size)
        out = [0]
        for c in range(self.world_size):
            out.append(out[-1] + base + (c < extra))
        return out

    def chunk_offset(self, c: int) -> int:
        return self.bounds[c] * self.itemsize

    def chunk_bytes(self, c: int) -> int:
        return (self.bounds[c + 1] - self.bounds[c]) * self.itemsize

    @property
    def slot_bytes(self) -> int:
        return -(-self.count // self.world_size) * self.itemsize

    @property
    def staging_offset(self) -> int:
        return -(-self.count * self.itemsize // ALIGN) * ALIGN

    def slot_offset(self, step: int) -> int:
        return self.staging_offset + step * self.slot_bytes

    @property
    def nbytes(self) -> int:
        return self.slot_offset(self.world_size - 1)


def _folder(op: np.ufunc, target: np.ndarray, staged: np.ndarray,
            itemsize: int) -> Callable[[Message], None]:
    """Folds each arrived message of `staged` into the same elements of `target`."""
    def fold(m: Message) -> None:
        lo, hi = m.offset // itemsize, (m.offset + m.length) // itemsize
        op(target[lo:hi], staged[lo:hi], out=target[lo:hi])
    return fold


class RingAllreduce:
    """Every dtype and op of `netreduce.meta`; needs nothing beyond the agreed call."""

    name = "ring"

    def check_call(self, dtype: np.dtype, op: str) -> None:
        return None

    def local_range(self, array: np.ndarray, spare: Spare | None = None) -> DataRange:
        return DataRange()

    def check(self, call: CallContext) -> None:
        return None

    def workspace_bytes(self, count: int, dtype: np.dtype, world_size: int) -> int:
        return RingLayout(count, accumulator(dtype).itemsize, world_size).nbytes

    def run(self, call: CallContext, src: np.ndarray, dst: np.ndarray) -> None:
        n, r = call.world_size, call.rank
        acc = accumulator(call.dtype)
        layout = RingLayout(call.count, acc.itemsize, n)
        stream = call.streams["ring"]
        whole = call.workspace.view()
        data = whole[:call.count * acc.itemsize].view(acc)
        np.copyto(data.reshape(src.shape), src)
        local, peer = call.workspace.local(), call.peer_workspace
        bounds = layout.bounds

        for s in range(n - 1):                                  # reduce-scatter
            send_c, recv_c = (r - s) % n, (r - s - 1) % n
            size, slot = layout.chunk_bytes(send_c), layout.slot_offset(s)
            recv_size = layout.chunk_bytes(recv_c)
            staged = whole[slot:slot + recv_size].view(acc)
            target = data[bounds[recv_c]:bounds[recv_c + 1]]
            stream.transfer(Outgoing(local.slice(layout.chunk_offset(send_c), size),
                                     peer.slice(slot, size)),
                            recv_nbytes=recv_size,
                            on_arrival=_folder(call.op, target, staged, acc.itemsize))

        for t in range(n - 1):                                  # all-gather
            send_c, recv_c = (r + 1 - t) % n, (r - t) % n
            offset, size = layout.chunk_offset(send_c), layout.chunk_bytes(send_c)
            stream.transfer(Outgoing(local.slice(offset, size), peer.slice(offset, size)),
                            recv_nbytes=layout.chunk_bytes(recv_c))
        if call.divisor != 1:                   # op="avg": every rank divides the same sums
            np.divide(data, call.divisor, out=data)
        np.copyto(dst, data.reshape(dst.shape))


RING = RingAllreduce()
