"""The link the ring actually gets, measured in forwarding mode: every rank RDMA-WRITEs M
bytes to its successor at the same time over the communicator's host "ring" QPs, which are
never registered with the switch, so it only forwards them. M / duration is the per-rank
WRITE throughput B, the ceiling of in-network allreduce (time >= M / B).

It needs two pieces the Communicator keeps to itself (the hook a public API would give:
`Communicator.register(nbytes)` and `Communicator.stream("ring")`): the device's memory
registration and the "ring" stream. Every rank runs the same transfers on that stream, so
its message sequence stays the same on every rank, as the allreduce metadata needs.
"""
from __future__ import annotations

import numpy as np

from flowctl.link import RemoteBuffer
from flowctl.stream import Outgoing, Stream
from netreduce.comm import Communicator
from netreduce.workspace import RegisteredMemory


def pattern(rank: int, nbytes: int) -> np.ndarray:
    """The bytes rank `rank` sends: distinct per rank, so a misplaced WRITE shows."""
    return ((np.arange(nbytes, dtype=np.uint32) * (2 * rank + 1) + 7 * rank) & 0xFF).astype(
        np.uint8)


class LinkProbe:
    """One registered region of 2 x `max_bytes`: the first half is sent, the second half is
    where the predecessor's WRITEs land. Collective: every rank builds it together (the
    successor's landing address travels by an int64 sum-allreduce used as an all-gather)."""

    def __init__(self, comm: Communicator, max_bytes: int) -> None:
        n, rank = comm.world_size, comm.rank
        self._stream: Stream = comm._streams["ring"]
        self._memory: RegisteredMemory = comm._host.register(2 * max_bytes)
        self._max = max_bytes
        self._nbytes = 0
        view = self._memory.view()
        view[:max_bytes] = pattern(rank, max_bytes)
        self._expected = pattern((rank - 1) % n, max_bytes)
        landing = self._memory.remote().slice(max_bytes, max_bytes)
        table = np.zeros((n, 3), dtype=np.int64)
        table[rank] = (landing.addr, landing.rkey, landing.nbytes)
        comm.allreduce(table, algo="ring")
        addr, rkey, nbytes = (int(v) for v in table[(rank + 1) % n])
        self._successor = RemoteBuffer(addr, rkey, nbytes)

    def prepare(self, nbytes: int) -> None:
        """Clear the landing zone (before the barrier, so no WRITE of the job can be lost)."""
        if not 0 < nbytes <= self._max:
            raise ValueError(f"bench: link job of {nbytes} bytes (probe built for "
                             f"{self._max})")
        self._nbytes = nbytes
        self._memory.view()[self._max:self._max + nbytes] = 0

    def run(self) -> None:
        """Write to the successor while the predecessor writes to us, until both are done."""
        n = self._nbytes
        self._stream.transfer(Outgoing(self._memory.local().slice(0, n),
                                       self._successor.slice(0, n)), recv_nbytes=n)

    def wrong(self) -> int:
        """How many of the predecessor's bytes did not arrive as sent (0: intact)."""
        got = self._memory.view()[self._max:self._max + self._nbytes]
        return int(np.count_nonzero(got != self._expected[:self._nbytes]))

    def close(self) -> None:
        self._memory.close()
