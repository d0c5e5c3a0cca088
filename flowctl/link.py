"""What the flow-control stream needs from one rank's place in a QP ring.

A `Link` is the pair of RC QPs a rank holds in a ring: it posts RDMA WRITE WITH IMMEDIATE
to its successor and receives them from its predecessor. `ring_setup.verbs.verbs_link.VerbsLink` is the
pyverbs implementation; tests drive the stream through an in-process one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Self


@dataclass(frozen=True)
class _Span:
    """[addr, addr + nbytes) of registered memory, accessed under `key`."""

    addr: int
    key: int
    nbytes: int

    def slice(self, offset: int, nbytes: int) -> Self:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"flowctl: slice [{offset}, {offset + nbytes}) outside a "
                             f"{self.nbytes}-byte buffer")
        return type(self)(self.addr + offset, self.key, nbytes)


class LocalBuffer(_Span):
    """Local memory a WRITE is read from; `key` is its L_Key."""

    @property
    def lkey(self) -> int:
        return self.key


#: the most parts a WRITE reads (its SGEs); the send QPs are created with this many
#: (ring_setup/verbs/host.py: a NIC refuses a longer list with EINVAL at the post)
MAX_SGES = 2


@dataclass(frozen=True)
class Gather:
    """Local memory read as one: `parts` (LocalBuffers, possibly of different regions) one
    after the other, a WRITE's scatter-gather list. Invariant: no part is empty; a slice
    lying in one part is that part's LocalBuffer (a plain WRITE), one that spans parts a
    Gather of their pieces (one WRITE with several SGEs: the same bytes on the wire); at
    most MAX_SGES parts."""

    parts: tuple[LocalBuffer, ...]
    nbytes: int = field(init=False, repr=False, compare=False)    # the parts' sum

    def __post_init__(self) -> None:
        if not self.parts or any(p.nbytes == 0 for p in self.parts):
            raise ValueError(f"flowctl: a gather list needs non-empty parts, not "
                             f"{[p.nbytes for p in self.parts]} bytes")
        if len(self.parts) > MAX_SGES:
            raise ValueError(f"flowctl: a gather list of {len(self.parts)} parts; a WRITE "
                             f"reads at most {MAX_SGES}")
        object.__setattr__(self, "nbytes", sum(p.nbytes for p in self.parts))

    def slice(self, offset: int, nbytes: int) -> "LocalBuffer | Gather":
        if offset < 0 or nbytes <= 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"flowctl: slice [{offset}, {offset + nbytes}) outside a "
                             f"{self.nbytes}-byte gather list")
        pieces = []
        for part in self.parts:
            if offset < part.nbytes and nbytes > 0:
                take = min(part.nbytes - offset, nbytes)
                pieces.append(part.slice(offset, take))
                nbytes -= take
            offset = max(0, offset - part.nbytes)
        return pieces[0] if len(pieces) == 1 else Gather(tuple(pieces))


def sges(src: LocalBuffer | Gather) -> tuple[LocalBuffer, ...]:
    """The scatter-gather entries a WRITE of `src` reads, in order."""
    return src.parts if isinstance(src, Gather) else (src,)


class RemoteBuffer(_Span):
    """A peer's memory a WRITE lands in; `key` is its R_Key."""

    @property
    def rkey(self) -> int:
        return self.key


@dataclass(frozen=True)
class Completion:
    """One work completion. `index`: for a send, the message index it was posted with; for
    a receive, the immediate (the sender's message index mod 2^32). `empty`: a receive
    that wrote no bytes (a zero-length WRITE WITH IMMEDIATE; no message is empty)."""

    index: int
    ok: bool
    status: str = "success"
    empty: bool = False


class Link(Protocol):
    """One rank's QP pair in a ring (successor and predecessor are ranks)."""

    successor: int
    predecessor: int

    def post_write(self, index: int, src: LocalBuffer | Gather, dst: RemoteBuffer) -> None:
        """Post one signaled RDMA WRITE WITH IMMEDIATE (imm = index mod 2^32) of src.nbytes
        (a `Gather`: its parts' bytes in order, one SGE each)."""
        ...

    def post_recvs(self, count: int) -> None:
        """Post `count` receive work requests on the QP from the predecessor."""
        ...

    def poll_sends(self, max_count: int) -> list[Completion]:
        ...

    def poll_recvs(self, max_count: int) -> list[Completion]:
        ...

    def arm(self) -> None:
        """Ask for an event at the next completion on either QP (completions already queued
        raise none: poll after arming, before `wait`)."""
        ...

    def wait(self, timeout: float) -> None:
        """Sleep until an armed event fires or `timeout` seconds pass (spurious returns are
        allowed: the caller polls again)."""
        ...

    def diagnostics(self) -> str:
        """QP states and device counters, for error messages."""
        ...
