"""In-network allreduce: every rank sends its buffer once over the "inc" QPs, the switch adds
the n contributions packet by packet (docs/pipeline.md) and every rank receives the sum.

The plan, identical on every rank (the switch relies on it: packet k of every connection
carries the same piece of the tensor): ONE `Stream.transfer` per call on `streams["inc"]`
(none for a small call, which travels in its metadata: below),
sending the call's `count * 4` wire bytes from the start of our workspace to the
successor's receive area while as many bytes -- the sum -- arrive from the predecessor's
connection in our receive area. Before it, every call (refused or not, any algorithm) puts
one metadata message on "inc" on every rank (netreduce.meta), and a call refused by `check`
posts no data on any rank, so the message sequences never diverge.

Wire format: little-endian int32 ('<i4', the hosts' own order), which the switch adds with
int32 wrap-around, then a seal of n int32 words (rank r sends 1 at word r, 0 elsewhere) in
the same message sequence. The seal that comes back must be n ones: the switch summed
every rank's last packet. A switch that restarted during the call (it forwards the ring's
packets unaggregated until the ring is registered again) hands each rank its
predecessor's seal instead, and the call raises `SwitchNotAggregating` rather than return
a partial sum (a switch lost before the call is caught by its metadata exchange).
- int32 travels as it is and is exact. Overflow is refused, not wrapped: every rank
  publishes its data's min and max in the call's metadata, and when the sum of the per-rank
  maxima exceeds 2^31-1 or the sum of the minima is below -2^31, `check` raises
  `AllreduceOverflow` on every rank before any data moves (a small call's data travels in
  its records: before it is summed). The bound is conservative: it
  refuses every call where SOME element could overflow given those extremes (the element
  sums themselves may all fit).
- float32 travels quantized with one scale 2^e_b per block of the call, agreed by all
  ranks because each derives it from the same exchanged records (SwitchML-style, per
  block). A block is `block_elements(count)` consecutive elements: 1024 (4 KiB of wire
  words) up to 128 Ki elements, then the smallest power of two that keeps the call within
  128 blocks (32 Ki elements for a 16 MiB float32 call), so a rank's record carries one
  int8 per block, 128 bytes at most (`netreduce.meta.MAX_BLOCK_BYTES`). Each rank
  publishes F = floor(log2 M) of each block's largest |x| (`local_blocks`); with F_b the
  largest over ranks, M_b < 2^(F_b+1) is the largest |x| of block b over all ranks, and
  with c = ceil(log2 n): e_b = 30 - c - F_b (one less above 128 ranks, where rounding
  could otherwise reach 2^(31-c); `block_exponents`). Then q = rint(x * 2^e_b) satisfies
  n * max|q| <= 2^31 - 1, the switch's int32 sums cannot wrap, and the result is
  (sum of q) * 2^-e_b rounded to float32, bit-identical on every rank.
  Error bound, per element of block b, with S the exact sum of the n float32 inputs:
      |result - S| <= n * 2^-(e_b+1) * (1 + 2^-24) + 2^-24 * |S| + 2^-150
  -- n * 2^-(e_b+1) from rounding each rank's x * 2^e_b to an integer (<= n^2 * M_b * 2^-30
  by the choice of e_b: relative to the largest |x| in the element's BLOCK, not the call),
  the rest from rounding the exact quantized sum to float32 (relative 2^-24; 2^-150 where
  the result is subnormal). A block of 1e-6's next to one of 1e4's keeps its precision.
  A sum beyond float32's range is +-inf, as with any float32 sum (and so may be one within
  the bound of that range's edge). NaN and infinities cannot be quantized:
  `NotQuantizable` on every rank, before any data moves.
- float16 and bfloat16 travel like float32 (every value of theirs is a float32; the
  scales come from the same M_b, quantization happens in float32) as 4-byte int32 words, so
  the switch carries twice their bytes. The result is rounded once from float64 to float16,
  twice (through float32: ml_dtypes' conversion) to bfloat16, so its bound is the
  quantization term plus that rounding: for float16, with u = 2^-11,
      |result - S| <= (1 + u) * n * 2^-(e_b+1) + u * |S| + 2^-25
  and for bfloat16 (u = 2^-8) the float32 bound above, rounded once more:
      (1 + u) * (float32 bound) + u * |S| + 2^-134
  (`float_error_bound(..., dtype=)`). The quantization term is ~n^2 * M_b * 2^-30: far
  below the 16-bit rounding, whose relative 2^-11 / 2^-8 dominates. A sum beyond the
  dtype's range (float16: 65504) is +-inf.
- op="avg" (floating point) travels as the sum; the result is (sum of q) * 2^-e_b / n, formed
  in float64 (exact but for the division's 2^-53 when n is not a power of two) and rounded
  once: |result - S/n| <= the bound above with n * 2^-(e_b+1) / n for the quantization term
  (`float_error_bound`).

Small calls travel inside their metadata: a call of at most INLINE_BYTES (128) bytes of data
publishes the data itself as its record's block bytes (`netreduce.meta.INLINE`). The switch's
sum of the metadata banks, whose records lie in disjoint slots, is then every rank's data:
each rank adds the n contributions itself, in rank order, in int64 (int32, which `check`
bounds as above and which wraps like the switch) or float64 (floats: no quantization, the
sum divided by n for avg and rounded once to the dtype: within (n-1) * 2^-53 * sum|x| plus
that rounding, far inside the bound above), so every rank writes the same bits. Such a call
posts no data message: it is one pass through the switch instead of two (the records,
then data and seal), and a switch that stopped aggregating is caught by the records as
for any call (`SwitchNotAggregating`). Every rank of an agreed call decides alike, since
the choice depends only on the call's size and dtype.

One scale per call, the quantizer before per-block scales, is kept for benchmarks only
(`one_scale_per_call`; `netreduce bench --algos switch-call` runs it beside the per-block one
in the same boot): every rank publishes its call-wide min and max and no block exponents,
and e = 30 - c - F from the largest |x| of the whole call scales every element (the bound
above with M the call's largest |x|). Which one a call uses is read from the agreed records
(block exponents published or not), and ranks that disagree are refused on every rank.

Host passes: int32 inputs of IN_PLACE_BYTES and more are sent from the caller's memory,
registered in place (`netreduce.regcache`; `send` says how), smaller ones copied into the
send area; floats are quantized into it -- float32 in its min/max pass, ahead of the
agreement, each block with this rank's own exponent, then again in `send` only for the
blocks whose agreed exponent is another rank's (`_quantize_ahead`). One copy of the sum
into the caller's output once the transfer is complete (int32: plain; floats: to float64,
the exact * 2^-e_b, / n for avg, one rounding): the sum stays in the workspace, for a
switch loss right after the call returned (`netreduce.away`); for int32 and float32 the
min/max (per block) pass, quantize and dequantize are one native pass each
(`netreduce.hostpass`), else numpy passes per chunk with the block exponents broadcast
over rows of a block, bit for bit alike. A message arrives
only after the switch emitted every packet of it, i.e. after it had added every rank's
packets of it, ours included, exactly once; any later retransmission of our packets of that
message finds its slot emitted (answered from the slot) or reused (dropped as stale) -- its
payload is never added again.
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from typing import Iterator, Sequence

import numpy as np

from flowctl.link import Gather, LocalBuffer
from flowctl.stream import Outgoing
from netreduce.algorithms.base import CallContext, DataRange, Spare
import netreduce.hostpass as hostpass
from netreduce.dtypes import FLOAT32, HALVES
from netreduce.meta import MAX_BLOCK_BYTES, AllreduceMismatch, CallRejected, SwitchNotAggregating
from ring_setup.store_protocol import ranks_phrase

WIRE = np.dtype("<i4")
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
DTYPES = (np.dtype(np.int32), FLOAT32, *HALVES)
OPS = ("sum", "avg")      # avg: the sum, divided by n (floating point only: netreduce.meta)
ALIGN = 64
_CHUNK = 1 << 16          # elements quantized per numpy pass (bounded temporaries)


class AllreduceOverflow(CallRejected, OverflowError):
    """An int32 sum over the switch could overflow: refused on every rank before any sum is
    formed (a small call's data has travelled in its records, unsummed), nothing written."""


class NotQuantizable(CallRejected, ValueError):
    """Float data holding NaN or infinity cannot travel quantized: refused on every rank."""


INLINE_BYTES = MAX_BLOCK_BYTES   # calls of at most this many data bytes travel in their records
IN_PLACE_BYTES = 64 * 1024        # int32 inputs from this size on are sent from their memory
MAX_QUANTIZED_RANKS = 1 << 16     # far above any fabric's (nr_contract.spec: 32 racks x 32)
MIN_BLOCK = 1024          # elements: 4 KiB of wire words, one packet at the default MTU
NO_FLOOR = -128           # the published floor of an all-zero block (and of M < 2^-127)


def block_elements(count: int) -> int:
    """Elements per block of a float call of `count` elements: the smallest power of two
    >= MIN_BLOCK that cuts the call into at most MAX_BLOCK_BYTES (128) blocks (1024 up to
    128 Ki elements, then growing with the call: 32 Ki for 4 Mi elements). A power of two,
    so that blocks and `_CHUNK` nest."""
    need = -(-count // MAX_BLOCK_BYTES)
    return max(MIN_BLOCK, 1 << max(need - 1, 0).bit_length())


def local_blocks(array: np.ndarray) -> DataRange:
    """This rank's (lo, hi) -- NaN if any element is NaN -- and per block of
    `block_elements(array.size)` elements the floor F = floor(log2 M) of the block's
    largest |x| = M as int8 bytes, clamped to [NO_FLOOR, 127] (NO_FLOOR for M = 0 or
    M < 2^-127): always M < 2^(F+1), the one fact `block_exponents` relies on. One pass
    each for the per-block minima and maxima (as the call-wide min and max were)."""
    flat = array.reshape(-1)
    if flat.size == 0:
        return DataRange()
    block = block_elements(flat.size)
    if flat.dtype == FLOAT32 and hostpass.native(flat):
        lows, highs = hostpass.block_ranges(flat, block)
    else:
        starts = np.arange(0, flat.size, block)
        lows = np.minimum.reduceat(flat, starts).astype(np.float32)
        highs = np.maximum.reduceat(flat, starts).astype(np.float32)
    return blocks_range(lows, highs)


def blocks_range(lows: np.ndarray, highs: np.ndarray) -> DataRange:
    """The `local_blocks` record from the per-block minima and maxima (float32)."""
    return DataRange(float(lows.min()), float(highs.max()),
                     log2_floors(np.maximum(-lows, highs)).tobytes())


def log2_floors(absmax: np.ndarray) -> np.ndarray:
    """floor(log2 M) of each M of `absmax` (float32, >= 0, NaN/inf allowed: such a call is
    not quantized) as int8, clamped to [NO_FLOOR, 127], NO_FLOOR for M = 0 or M < 2^-127:
    always M < 2^(F+1)."""
    with np.errstate(invalid="ignore"):     # NaN/inf: the call is not quantized (`check`)
        _, exp = np.frexp(absmax)           # M < 2^exp, M >= 2^(exp-1) when M > 0
        return np.where(absmax > 0, exp - 1, NO_FLOOR).clip(NO_FLOOR, 127).astype(np.int8)


def block_exponents(world_size: int, blocks: Sequence[bytes]) -> np.ndarray:
    """The exponents e_b (int32, one per block) of the scales 2^e_b, agreed by every rank
    from every rank's `local_blocks` bytes (`blocks`, by rank): with F_b the largest floor
    published for block b (so every |x| of the block on every rank is below 2^(F_b+1)) and
    c = ceil(log2 n),
        e_b = 30 - c - F_b       for n <= 128,      e_b = 29 - c - F_b       for n > 128.
    Invariant: n * rint(M_b * 2^e_b) <= 2^31 - 1 for M_b the block's largest |x|, so no
    int32 sum of the q = rint(x * 2^e_b) can wrap. Why: M_b < 2^E with E = F_b + 1, and the
    largest float32 below 2^E is 2^E - 2^(E-24) (or less). For c <= 7,
    M_b * 2^e_b <= 2^(31-c) - 2^(7-c) with 2^(7-c) >= 1, so rint(M_b * 2^e_b) <= 2^(31-c) - 1
    and n * that <= 2^31 - 1. For c >= 8 that margin is below one half and rint may reach
    2^(31-c): one bit less, M_b * 2^e_b < 2^(30-c), rint <= 2^(30-c), n * that <= 2^30. In
    both cases n * 2^-(e_b+1) <= n^2 * M_b * 2^-29 (the module doc's bound, 2^-30 up to 128
    ranks) when M_b >= 2^-127 (else at most n^2 * 2^-157)."""
    floors = np.frombuffer(blocks[0], dtype=np.int8)
    for other in blocks[1:]:
        floors = np.maximum(floors, np.frombuffer(other, dtype=np.int8))
    return exponent_base(world_size) - floors.astype(np.int32)


def exponent_base(world_size: int) -> int:
    """e_b + F_b of `block_exponents`: 30 - c (29 - c above 128 ranks), c = ceil(log2 n)."""
    if not 1 <= world_size <= MAX_QUANTIZED_RANKS:
        raise ValueError(f"quantization for {world_size} ranks: 1..{MAX_QUANTIZED_RANKS} "
                         "supported")
    c = (world_size - 1).bit_length()
    return 30 - c - (c > 7)


def call_exponent(world_size: int, ranges: Sequence[tuple[float, float]]) -> np.ndarray:
    """One scale per call (`one_scale_per_call`): the exponent `block_exponents` gives a
    single block holding the largest |x| of every rank's (lo, hi) (`ranges`, finite), as a
    0-d array: `quantize` and `dequantize` then scale every element with it."""
    top = max(max(-lo, hi) for lo, hi in ranges)
    floor = log2_floors(np.array([top], dtype=np.float32))
    return block_exponents(world_size, [floor.tobytes()]).reshape(())


def _rows(count: int, exponents: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
    """Cover elements [0, count) in order by (lo, hi, column): at most `_CHUNK` elements
    lo..hi-1, cut into column.size equal rows that each lie in one block, `column` (shape
    (rows, 1)) holding each row's block exponent -- so one broadcasting numpy pass scales a
    whole piece (blocks and _CHUNK are powers of two: one divides the other). A 0-d
    `exponents` (`call_exponent`) scales every piece alike, one row each."""
    if exponents.ndim == 0:
        for lo in range(0, count, _CHUNK):
            yield lo, min(lo + _CHUNK, count), exponents.reshape(1, 1)
        return
    block = block_elements(count)
    width = min(block, _CHUNK)
    for lo in range(0, count, _CHUNK):
        hi = min(lo + _CHUNK, count)
        full = lo + (hi - lo) // width * width
        if full > lo:
            yield lo, full, exponents[np.arange(lo, full, width) // block, None]
        if hi > full:
            yield full, hi, exponents[full // block].reshape(1, 1)


def _block(count: int, exponents: np.ndarray) -> int:
    """Elements per exponent: `block_elements(count)`, or all of them for a 0-d one."""
    return block_elements(count) if exponents.ndim else max(count, 1)


def quantize(src: np.ndarray, exponents: np.ndarray, wire: np.ndarray) -> None:
    """wire = rint(x * 2^e_b) as int32 for each x of block b (`exponents`: one per block of
    `block_elements(src.size)`, or 0-d: one for all; `wire`: flat, src.size elements);
    x * 2^e_b is formed in float32, exactly (every float16 and bfloat16 is a float32, and
    the product's magnitude is below 2^31 / n by the choice of e_b; what float32 cannot
    hold is below one half and rounds to 0 either way)."""
    flat = src.reshape(-1)
    if flat.dtype == FLOAT32 and hostpass.native(flat, wire):
        hostpass.quantize_f32(flat, _block(flat.size, exponents), exponents, wire)
        return
    for lo, hi, column in _rows(flat.size, exponents):
        q = np.ldexp(flat[lo:hi].reshape(column.size, -1), column, dtype=np.float32)
        wire[lo:hi] = np.rint(q, out=q).reshape(-1)


def dequantize(summed: np.ndarray, exponents: np.ndarray, divisor: int, dst: np.ndarray,
               workspace: np.ndarray) -> None:
    """dst = s * 2^-e_b / divisor for each sum s of block b (`summed`: flat int32 sums),
    exact in float64 but for the division and rounded once to dst's dtype (+-inf beyond
    its range). A `dst` that is not contiguous is formed in `workspace` (bytes, at least
    dst.nbytes, free) and copied."""
    if dst.dtype == FLOAT32 and hostpass.native(summed, dst):
        hostpass.dequantize_f32(summed, _block(summed.size, exponents), exponents, divisor,
                                dst.reshape(-1))
        return
    flat = dst.reshape(-1) if dst.flags.c_contiguous else \
        workspace[:dst.nbytes].view(dst.dtype)
    with np.errstate(over="ignore"):
        for lo, hi, column in _rows(summed.size, exponents):
            sums = np.ldexp(summed[lo:hi].reshape(column.size, -1), -column, dtype=np.float64)
            if divisor != 1:
                np.divide(sums, divisor, out=sums)
            flat[lo:hi] = sums.reshape(-1)
    if not dst.flags.c_contiguous:
        np.copyto(dst, flat.reshape(dst.shape))


def wire_bytes(count: int, world_size: int) -> int:
    """Bytes each rank sends (and receives) in one call: the data, then the seal."""
    return (count + world_size) * WIRE.itemsize


def recv_offset(nbytes: int) -> int:
    """Where the sum lands in the workspace: after the send data, 64-byte aligned."""
    return -(-nbytes // ALIGN) * ALIGN


class SwitchAllreduce:
    """Sum (or avg) of int32, float32, float16 or bfloat16 through the aggregating switch
    (see the module doc)."""

    name = "switch"

    def __init__(self) -> None:
        self._per_call = 0                  # `one_scale_per_call` contexts open
        self._lock = threading.Lock()
        # workspace address -> (seq, input address, count, world size, exponents used):
        # the send area holds that call's input quantized ahead (`_quantize_ahead`)
        self._ahead: dict[int, tuple[int, int, int, int, np.ndarray]] = {}

    @property
    def per_block(self) -> bool:
        """False inside `one_scale_per_call` (benchmarks): floats publish no block
        exponents and travel with one scale per call."""
        return self._per_call == 0

    def count_per_call(self, step: int) -> None:
        with self._lock:
            self._per_call += step

    @staticmethod
    def supports(dtype: np.dtype, op: str) -> bool:
        return dtype in DTYPES and op in OPS

    def check_call(self, dtype: np.dtype, op: str) -> None:
        if dtype not in DTYPES:
            raise TypeError(f"allreduce: algo='switch' reduces int32, float32, float16 and "
                            f"bfloat16 only (the switch adds int32), not {dtype}: use "
                            f"algo='ring'")
        if op not in OPS:
            raise ValueError(f"allreduce: algo='switch' supports op='sum' and op='avg' only, "
                             f"not {op!r}: use algo='ring'")

    def workspace_bytes(self, count: int, dtype: np.dtype, world_size: int) -> int:
        return 2 * recv_offset(wire_bytes(count, world_size))

    def local_range(self, array: np.ndarray, spare: Spare | None = None) -> DataRange:
        """The record (module doc); a float32 call given `spare` is also quantized there
        in the same memory pass, each block with this rank's own exponent (`_ahead`)."""
        if spare is not None:
            with self._lock:
                self._ahead.pop(spare.memory.local().addr, None)
        if array.size == 0:
            return DataRange()
        inline = array.nbytes <= INLINE_BYTES
        if inline and array.dtype == np.int32:      # a few values: no pass to call
            values = array.ravel().tolist()
            lo, hi = min(values), max(values)
        elif array.dtype == np.int32 and hostpass.native(array):
            lo, hi = hostpass.range_int32(array)
        elif inline or array.dtype == np.int32 or not self.per_block:
            lo, hi = array.min(), array.max()
        elif spare is not None and array.dtype == FLOAT32 and hostpass.native(array) \
                and spare.nbytes >= array.nbytes:
            return self._quantize_ahead(array.reshape(-1), spare)
        else:
            return local_blocks(array)
        data = np.ascontiguousarray(array).tobytes() if inline else b""
        return DataRange(float(lo), float(hi), data, inline=inline)

    def _quantize_ahead(self, flat: np.ndarray, spare: Spare) -> DataRange:
        """`local_blocks(flat)` and, in the same memory pass, `flat` quantized into the
        send area of `spare.memory` with this rank's own block exponents, noted in `_ahead`
        for `send`. Invariant: a block's words are what `quantize` gives with the agreed
        exponent whenever that exponent is this rank's own (this rank published the
        block's largest floor), bit for bit (one C loop does both); `send` quantizes the
        other blocks again, and uses none of it unless the note names its call."""
        wire = spare.memory.view()[:flat.nbytes].view(WIRE)
        lows, highs, exps = hostpass.block_ranges_quantize(
            flat, block_elements(flat.size), exponent_base(spare.world_size), wire)
        with self._lock:
            self._ahead[spare.memory.local().addr] = (
                spare.seq, hostpass.address(flat), flat.size, spare.world_size, exps)
        return blocks_range(lows, highs)

    def _quantize(self, call: CallContext, src: np.ndarray, data: np.ndarray) -> None:
        """data = `src` quantized with the call's agreed exponents: only the blocks whose
        exponent differs from this rank's own when `_quantize_ahead` ran for this call."""
        exponents = self.exponents(call)
        with self._lock:
            ahead = self._ahead.pop(call.workspace.local().addr, None)
        flat = src.reshape(-1)
        if ahead is None or exponents.ndim == 0 or ahead[:4] != (
                call.seq, hostpass.address(flat), call.count, call.world_size):
            quantize(src, exponents, data)
            return
        hostpass.requantize_f32(flat, block_elements(call.count), exponents, ahead[4], data)

    def check(self, call: CallContext) -> None:
        if call.inline:
            self._check_inline(call)
        if call.dtype == np.int32:
            self._check_int32_sum(call)
        else:
            self._check_finite(call)
            if not call.inline:
                self._check_scales(call)

    @staticmethod
    def _check_scales(call: CallContext) -> None:
        per_block = [r for r, b in enumerate(call.blocks) if b]
        if per_block and len(per_block) < len(call.blocks):
            raise AllreduceMismatch(
                f"allreduce call #{call.seq}: ranks disagree on the quantization: one scale "
                f"per block on {ranks_phrase(per_block)}, one per call on the others "
                f"(`one_scale_per_call` is for benchmarks, entered by every rank alike); "
                f"nothing moved")

    @staticmethod
    def _check_inline(call: CallContext) -> None:
        nbytes = call.count * call.dtype.itemsize
        bad = [r for r, b in enumerate(call.blocks) if len(b) != nbytes]
        if bad:
            raise AllreduceMismatch(
                f"allreduce call #{call.seq}: the records of {ranks_phrase(bad)} carry "
                f"{sorted({len(call.blocks[r]) for r in bad})} data bytes, not the call's "
                f"{nbytes} ({call.dtype}[{call.count}]); nothing written")

    @staticmethod
    def _check_int32_sum(call: CallContext) -> None:
        top = sum(int(hi) for _, hi in call.ranges)
        bottom = sum(int(lo) for lo, _ in call.ranges)
        if top > INT32_MAX or bottom < INT32_MIN:
            raise AllreduceOverflow(
                f"allreduce call #{call.seq}: the int32 sum may overflow: the ranks' maxima add "
                f"up to {top} and their minima to {bottom}, outside [-2^31, 2^31-1]; the "
                f"switch adds wrapping int32, so the call was refused on every rank before any "
                f"sum was formed (the check is conservative: it bounds every element's sum by "
                f"those two sums). Use int64 with algo='ring', or scale the data")

    @staticmethod
    def _check_finite(call: CallContext) -> None:
        bad = [r for r, (lo, hi) in enumerate(call.ranges)
               if not (math.isfinite(lo) and math.isfinite(hi))]
        if bad:
            raise NotQuantizable(
                f"allreduce call #{call.seq}: algo='switch' quantizes {call.dtype} to int32 "
                f"and cannot carry NaN or infinity (in the data of {ranks_phrase(bad)}); nothing "
                f"moved. Use algo='ring'")

    def run(self, call: CallContext, src: np.ndarray, dst: np.ndarray) -> None:
        """A call whose data travel after its records: send, then deliver. A small call
        (`call.inline`) travelled in them: its sum is formed from the records
        (`inline_sum`), then the "inc" stream is settled (the records' acknowledgement:
        the output is written only once this rank's records are known delivered,
        docs/reliability.md), then the sum is written (`write_inline`)."""
        if call.inline:
            total = inline_sum(call.blocks, call.divisor, dst.dtype)
            call.streams["inc"].settle()
            write_inline(total, dst)
            return
        self.deliver(call, self.send(call, src), dst)

    @staticmethod
    def exponents(call: CallContext) -> np.ndarray:
        """A float call's scale exponents from its agreed records: one per block, or (no
        block exponents published: `one_scale_per_call`) one for the whole call, 0-d."""
        if any(call.blocks):
            return block_exponents(call.world_size, call.blocks)
        return call_exponent(call.world_size, call.ranges)

    @staticmethod
    def areas(call: CallContext) -> tuple[np.ndarray, np.ndarray]:
        """The call's wire words in the workspace: (what this rank sends: data then seal,
        what came back: the sums then the seal), int32 views."""
        nbytes = wire_bytes(call.count, call.world_size)
        at = recv_offset(nbytes)
        whole = call.workspace.view()
        return whole[:nbytes].view(WIRE), whole[at:at + nbytes].view(WIRE)

    def send(self, call: CallContext, src: np.ndarray) -> np.ndarray:
        """Put `src` on the wire (int32 as is, floats quantized) with the seal, move it
        through the switch and check the seal; returns the sums (a view of the workspace).
        The caller's output is not touched, nor its input ever written. An int32 input of
        at least IN_PLACE_BYTES, C-contiguous and registrable (`call.registered`), is sent
        from the caller's memory in place: the last message is one WRITE of two SGEs, the
        data's tail from the caller's region and the seal from the workspace, so the
        wire is byte for byte the copy's; the input is read until the transfer is
        settled (go-back-N re-reads it) and the call returns only then. Else the wire
        words are formed in the send area. On a good seal, the receive area holds the
        sums until the workspace is reused: what `netreduce.away` takes from a rank that
        completed the call, after it returned, if the switch is lost (neither the caller's
        input nor output is needed then: the caller may have overwritten both)."""
        nbytes = wire_bytes(call.count, call.world_size)
        at = recv_offset(nbytes)
        wire, summed = self.areas(call)
        data, seal = wire[:call.count], wire[call.count:]
        seal[:] = 0
        seal[call.rank] = 1
        summed[call.count:] = 0
        local = call.workspace.local()
        user = self._in_place(call, src)
        if user is not None:
            data_bytes = call.count * WIRE.itemsize
            source: LocalBuffer | Gather = Gather(
                (user, local.slice(data_bytes, nbytes - data_bytes)))
        else:
            if call.dtype == np.int32:
                np.copyto(data.reshape(src.shape), src)
            else:
                self._quantize(call, src, data)
            source = local.slice(0, nbytes)
        send = Outgoing(source, call.peer_workspace.slice(at, nbytes))
        call.streams["inc"].transfer(send, recv_nbytes=nbytes, then=call.then)
        sealed = summed[call.count:]
        if not (sealed == 1).all():
            raise SwitchNotAggregating(
                f"allreduce call #{call.seq}: rank {call.rank}: the seal that came back is "
                f"{sealed.tolist()}, not {call.world_size} ones: the switch did not add every "
                f"rank's last packet (the result is not used)")
        return summed[:call.count]

    @staticmethod
    def _in_place(call: CallContext, src: np.ndarray) -> LocalBuffer | None:
        """`src` registered in place, when the call sends it as it is (`send`)."""
        if call.registered is None or call.dtype != np.int32 \
                or src.nbytes < IN_PLACE_BYTES or not src.flags.c_contiguous:
            return None
        return call.registered(src)

    def deliver(self, call: CallContext, summed: np.ndarray, dst: np.ndarray) -> None:
        """Write the call's result into `dst` from `summed`, the wrapping int32 sums of every
        rank's wire words (from the switch, or from the host ring after a switch loss:
        the same words, so the same result bit for bit)."""
        if call.dtype == np.int32:
            np.copyto(dst, summed.reshape(dst.shape))
        else:
            dequantize(summed, self.exponents(call), call.divisor, dst, call.workspace.view())


def inline_sum(blocks: Sequence[bytes], divisor: int, dtype: np.dtype) -> np.ndarray:
    """The sum of a small call that travelled in its records, not yet in `dtype`:
    `blocks` holds every rank's data, by rank, of `dtype`; the n contributions are added
    in rank order, int32 in int64 then wrapped like the switch's sums (int32), floats in
    float64 and divided by `divisor` (float64, rounded once by `write_inline`; module
    doc). A function of the agreed records only: every rank writes the same bits."""
    parts = np.frombuffer(b"".join(blocks), dtype=dtype).reshape(len(blocks), -1)
    if dtype == np.int32:
        return np.add.reduce(parts, axis=0, dtype=np.int64).astype(np.int32)
    total = np.add.reduce(parts, axis=0, dtype=np.float64)
    if divisor != 1:
        np.divide(total, divisor, out=total)
    return total


def write_inline(total: np.ndarray, dst: np.ndarray) -> None:
    """Write a small call's `inline_sum` into the caller's output `dst` (the one place
    that does: rounded once to dst's dtype; int32 sums are wrapped already)."""
    if total.dtype == dst.dtype:
        dst[...] = total.reshape(dst.shape)
        return
    with np.errstate(over="ignore"):
        dst[...] = total.reshape(dst.shape)


SWITCH = SwitchAllreduce()


@contextmanager
def one_scale_per_call() -> Iterator[None]:
    """For benchmarks only, not an option of `allreduce`: within it, this process's float
    calls through the switch quantize with one scale for the whole call, as the switch path
    did before per-block scales (module doc), so that one run measures both
    (`netreduce bench --algos switch-call`). Every rank must enter it for the same calls
    (ranks that disagree get `AllreduceMismatch`, alike). It holds for every communicator of
    the process while any thread is inside: rank threads of one process (tests) may each
    enter it around the same call, since a call returns only after every rank published
    its records; a call made outside it by one of them while another is inside is not."""
    SWITCH.count_per_call(1)
    try:
        yield
    finally:
        SWITCH.count_per_call(-1)
