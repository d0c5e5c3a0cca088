"""Per-call metadata: what each rank is about to reduce (and, where its algorithm needs it,
the range of its data), gathered by every rank before any data moves, so that disagreeing
calls fail with the same message everywhere and every rank derives the same call parameters
(the switch's quantization scale, its overflow check) from the same records.

Each rank's control region holds two banks (call parity) of `world_size` fixed-size records
and a send area as large as a bank. The exchange is an all-gather, done one of two ways:
- through the switch, when the communicator's "inc" ring is registered with one: every rank
  writes a whole bank -- zeros, with its own record in its own slot -- on the "inc" stream
  into its successor's bank, and the switch adds the n banks word by word. The slots are
  disjoint, so the wrapping int32 sum IS the concatenation of the records: one pass through
  the switch instead of n - 1 hops. Every rank sends this same message on every call, so
  the "inc" message sequence stays identical on every rank whatever the call;
- else around the host ring's stream: at step j rank r forwards the record of rank
  (r - j) mod n into the same slot of its successor's bank.
Records have a fixed size (RECORD_STRIDE, 256 bytes: an 86-byte header and room for
MAX_BLOCK_BYTES = 128 bytes of per-block facts, the switch's exponents), whatever the call:
the message sizes on "inc" must not depend on anything one rank alone knows (e.g. a count
the ranks disagree on), so every call exchanges n * RECORD_STRIDE bytes per rank through
the switch (4 ranks: 1 KiB; one packet at MTU 4096, four at BMv2's 256).
A small call through the switch (at most MAX_BLOCK_BYTES of data) carries its data in the
record's block bytes (flag INLINE): the exchange is then the whole call, one pass through
the switch (netreduce/algorithms/switch.py).
Two banks suffice: a rank posts call k+2's records only after it read call k+1's, i.e.
after it finished reading call k's (through the switch, a bank is written only once every
rank has contributed), also when they travel behind call k+1's data (calls in flight).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Mapping, Protocol

import numpy as np

from flowctl.link import LocalBuffer, RemoteBuffer
from flowctl.stream import Outgoing, SequenceError, Stream
from netreduce.dtypes import FLOATS, SUPPORTED_DTYPES
from ring_setup.store_protocol import ranks_phrase

# op -> the ufunc that folds two contributions; "avg" folds like "sum", and the algorithm
# divides the sum by the number of ranks when it forms the result (`CallContext.divisor`)
OPS: dict[str, np.ufunc] = {"sum": np.add, "avg": np.add, "max": np.maximum,
                            "min": np.minimum}

_MAGIC = b"NRM4"
_RECORD = struct.Struct("<4sIQQ8s8s8sQQIddHB")   # then the `blocks` bytes
MAX_BLOCK_BYTES = 128     # per-block facts a record carries (the switch: one exponent a block)
RECORD_STRIDE = 256       # fixed (see the module doc): _RECORD.size (87) + MAX_BLOCK_BYTES fit
REJOIN = 1                # CallMeta.flags, rank 0's: the switch answers again, rejoin it in
#                           this call (netreduce/away.py, docs/reliability.md)
INLINE = 2                # CallMeta.flags: `blocks` holds the rank's data itself, a small call
#                           whose records are its whole exchange (algorithms/switch.py)
IN_FLIGHT = 4             # CallMeta.flags: the rank keeps calls in flight (its calls' workspaces
#                           alternate; alike on every rank: netreduce/comm.py)
AHEAD = 8                 # CallMeta.flags: posted behind the previous call's data, before this
#                           rank completed that call (netreduce/comm.py)


class CallRejected(Exception):
    """An allreduce call refused on every rank alike, before any data moved (a small call's
    data travels in its records: before any of it is summed), nothing written: raised from
    the exchanged records only (which every rank holds alike), so the communicator stays
    usable. Every subclass keeps that invariant."""


class SwitchNotAggregating(SequenceError):
    """What came back through the switch is not the sum of every rank's contribution: the
    switch forwarded a registered ring's packets unaggregated (it restarted or lost the
    ring). The message names the call; the communicator adds which switch."""


class AllreduceMismatch(CallRejected, RuntimeError):
    """The ranks called allreduce with different arguments (raised on every rank alike)."""


def check_dtype(dtype: np.dtype) -> np.dtype:
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"allreduce: dtype {dtype} is not supported (supported: "
                        f"{', '.join(d.name for d in SUPPORTED_DTYPES)})")
    return dtype


def check_op(op: str, dtype: np.dtype) -> np.ufunc:
    """The ufunc of `op` for `dtype`; ValueError for an unknown op, or "avg" of integers
    (torch's ReduceOp.AVG takes floating point only: an integer average would round)."""
    try:
        ufunc = OPS[op]
    except KeyError:
        raise ValueError(f"allreduce: op {op!r} is not supported (supported: "
                         f"{', '.join(OPS)})") from None
    if op == "avg" and dtype not in FLOATS:
        raise ValueError(f"allreduce: op='avg' takes floating-point arrays, not {dtype} (an "
                         f"integer average would round): use op='sum' and divide")
    return ufunc


@dataclass(frozen=True)
class CallMeta:
    """One rank's description of one allreduce call, and where its workspace is."""

    rank: int
    seq: int              # calls this rank has started on the communicator, from 0
    count: int
    dtype: str            # numpy dtype name (8 bytes at most: "bfloat16")
    op: str
    algo: str             # as the caller asked it: "auto", "switch" or "ring"
    workspace: RemoteBuffer
    lo: float = 0.0       # this rank's smallest and largest element, for algorithms that
    hi: float = 0.0       # need them (Algorithm.local_range; exact for int32 and float32)
    blocks: bytes = b""   # per-block facts of this rank's data (Algorithm.local_range; the
    #                       switch: one exponent per block), MAX_BLOCK_BYTES at most
    flags: int = 0        # REJOIN (rank 0's record only), INLINE

    def pack(self) -> bytes:
        """The record: at most RECORD_STRIDE bytes; ValueError for too many `blocks`."""
        if len(self.blocks) > MAX_BLOCK_BYTES:
            raise ValueError(f"a call record carries {MAX_BLOCK_BYTES} block bytes at most, "
                             f"not {len(self.blocks)}")
        return _RECORD.pack(_MAGIC, self.rank, self.seq, self.count, self.dtype.encode(),
                            self.op.encode(), self.algo.encode(), self.workspace.addr,
                            self.workspace.nbytes, self.workspace.rkey, self.lo, self.hi,
                            len(self.blocks), self.flags) + self.blocks

    @classmethod
    def unpack(cls, raw: bytes | memoryview, at: int = 0) -> "CallMeta":
        """The record at offset `at` of `raw` (ValueError: not a record)."""
        (magic, rank, seq, count, dtype, op, algo, addr, nbytes, rkey, lo, hi,
         size, flags) = _RECORD.unpack_from(raw, at)
        if magic != _MAGIC:
            raise ValueError(f"not a call record (magic {magic!r})")
        if size > MAX_BLOCK_BYTES:
            raise ValueError(f"a call record with {size} block bytes (at most {MAX_BLOCK_BYTES})")
        text = [s.rstrip(b"\0").decode() for s in (dtype, op, algo)]
        blocks = bytes(raw[at + _RECORD.size:at + _RECORD.size + size])
        return cls(rank, seq, count, *text, RemoteBuffer(addr, rkey, nbytes), lo, hi, blocks,
                   flags)

    def describe(self) -> str:
        return f"{self.dtype}[{self.count}] op={self.op} algo={self.algo}"


def control_bytes(world_size: int) -> int:
    """Size of a rank's control region: two banks of one record per rank, a send area."""
    return 3 * world_size * RECORD_STRIDE


class ControlRegion(Protocol):
    def local(self) -> LocalBuffer: ...
    def view(self) -> np.ndarray: ...


class MetaExchange:
    """All-gathers one `CallMeta` per rank (see the module doc): through the switch on the
    "inc" stream when the call says so (`through_switch`: the "inc" ring is registered and
    the switch is not away, alike on every rank), else around the host ring on the "ring"
    stream. `streams` is read at each call (the "inc" stream is replaced when the ring is
    registered again)."""

    def __init__(self, streams: Mapping[str, Stream], control: ControlRegion,
                 successor_control: RemoteBuffer, rank: int, world_size: int,
                 through_switch: bool) -> None:
        self.streams = streams
        self.control = control
        self.successor_control = successor_control
        self.rank, self.world_size = rank, world_size
        self.through_switch = through_switch      # the default of `exchange`
        size = world_size * RECORD_STRIDE         # the send area into a bank, by seq parity
        self._bank_writes = tuple(
            Outgoing(control.local().slice(self._send_area, size),
                     successor_control.slice(self._slot(parity, 0), size)) for parity in (0, 1))

    def _slot(self, seq: int, rank: int) -> int:
        """Where `rank`'s record of call `seq` is in a control region (bank: seq parity)."""
        return ((seq % 2) * self.world_size + rank) * RECORD_STRIDE

    @property
    def _send_area(self) -> int:
        """The bank-sized area the switch exchange sends from, after the two banks."""
        return 2 * self.world_size * RECORD_STRIDE

    def exchange(self, mine: CallMeta, through_switch: bool | None = None,
                 settle: bool = True) -> list[CallMeta]:
        """Every rank's record of this call, by rank. Through the switch with `settle`
        False, it returns once the bank arrived, before the switch's successor has
        acknowledged this rank's records: the caller settles the "inc" stream (or its next
        transfer does) before the next exchange rewrites the send area."""
        n, r, seq = self.world_size, self.rank, mine.seq
        if through_switch is None:
            through_switch = self.through_switch
        if through_switch:
            self.streams["inc"].transfer(self.outgoing(mine), recv_nbytes=n * RECORD_STRIDE,
                                         settle=settle)
            return self.records(seq, True)
        view = self.control.view()
        local = self.control.local()
        record = np.frombuffer(mine.pack(), dtype=np.uint8)
        stream = self.streams["ring"]
        at = self._slot(seq, r)
        view[at:at + RECORD_STRIDE] = 0
        view[at:at + record.size] = record
        for j in range(n - 1):
            at = self._slot(seq, (r - j) % n)
            stream.transfer(Outgoing(local.slice(at, RECORD_STRIDE),
                                     self.successor_control.slice(at, RECORD_STRIDE)),
                            recv_nbytes=RECORD_STRIDE)
        return self.records(seq, False)

    def outgoing(self, mine: CallMeta) -> Outgoing:
        """This rank's records of a call through the switch, written into the send area as
        the bank-sized message to post on "inc" (by `exchange`, or behind the previous
        call's data: `collect` then receives the bank). The send area must be settled."""
        n, r = self.world_size, self.rank
        send, size, record = self._send_area, n * RECORD_STRIDE, mine.pack()
        bank = bytearray(size)
        bank[r * RECORD_STRIDE:r * RECORD_STRIDE + len(record)] = record
        self.control.view().data[send:send + size] = bank    # one memcpy, the GIL kept
        return self._bank_writes[mine.seq % 2]

    def collect(self, seq: int) -> list[CallMeta]:
        """The bank of call `seq` through the switch, whose records this rank posted
        already (`outgoing`, behind the previous call's data): received unsettled."""
        self.streams["inc"].transfer(None, recv_nbytes=self.world_size * RECORD_STRIDE,
                                     settle=False)
        return self.records(seq, True)

    def records(self, seq: int, through_switch: bool) -> list[CallMeta]:
        """Every rank's record of call `seq` as its bank holds them, checked."""
        n, r, bank = self.world_size, self.rank, self.control.view().data
        records = []
        for q in range(n):
            try:
                record = CallMeta.unpack(bank, self._slot(seq, q))
            except ValueError as exc:
                if through_switch:
                    raise SwitchNotAggregating(
                        f"allreduce: rank {r}: call #{seq}: the metadata bank that came back "
                        f"through the switch lacks the record of rank {q} ({exc})") from exc
                raise SequenceError(f"allreduce: rank {r}: call #{seq}: the record of rank {q} "
                                    f"is unreadable: {exc}") from exc
            if record.rank != q:
                raise SequenceError(f"allreduce: rank {r}: call #{seq}: slot {q} holds the "
                                    f"record of rank {record.rank}")
            records.append(record)
        return records


def check_agreement(records: list[CallMeta]) -> None:
    """Raise `AllreduceMismatch` unless all records describe the same call. The message
    depends only on the records, which every rank holds alike, so every rank raises the
    same message."""
    def call_of(m: CallMeta) -> tuple:
        return m.seq, m.count, m.dtype, m.op, m.algo, m.flags & (INLINE | IN_FLIGHT)
    first = call_of(records[0])
    if all(call_of(m) == first for m in records):
        return
    seqs = sorted({m.seq for m in records})
    if len(seqs) > 1:
        raise AllreduceMismatch("allreduce: ranks are out of step: " + "; ".join(
            f"{ranks_phrase([m.rank for m in records if m.seq == s])} at call #{s}" for s in seqs))
    groups: dict[str, list[int]] = {}
    for m in records:
        groups.setdefault(m.describe(), []).append(m.rank)
    if len(groups) > 1:
        raise AllreduceMismatch(f"allreduce call #{seqs[0]}: ranks disagree: " + "; ".join(
            f"{desc} on {ranks_phrase(ranks)}" for desc, ranks in groups.items()))
    keeping = [m.rank for m in records if m.flags & IN_FLIGHT]
    if 0 < len(keeping) < len(records):
        raise AllreduceMismatch(
            f"allreduce call #{seqs[0]}: ranks disagree on calls in flight: in_flight > 1 on "
            f"{ranks_phrase(keeping)}, 1 on the others (set in_flight / $NR_IN_FLIGHT alike)")
    inline = [m.rank for m in records if m.flags & INLINE]
    if 0 < len(inline) < len(records):
        raise AllreduceMismatch(
            f"allreduce call #{seqs[0]}: ranks disagree on where the data travels: in the "
            f"records on {ranks_phrase(inline)}, after them on the others (different "
            f"netreduce versions?)")
