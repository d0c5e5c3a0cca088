"""Deterministic per-rank inputs and the numpy reference of their sum, so that every rank of
a demo, benchmark or test checks its allreduce result alone: each rank builds every rank's
input from a seed and sums them with numpy.

The tolerance of a float result is the documented closed form (README "Guarantees",
docs/library.md), computed from the inputs alone -- their sum in float64 and, per block,
the largest |x| over every rank, found with numpy -- and never from the code that quantizes
or sums: the reference is an oracle independent of what it checks.
"""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import ml_dtypes
import numpy as np

SWITCH_PER_CALL = "switch-call"     # the switch path with one scale per call (benchmarks:
#                                     netreduce.algorithms.switch.one_scale_per_call)

MIN_BLOCK = 1024    # docs/library.md: a block is 1024 consecutive elements ...
MAX_BLOCKS = 128    # ... and a larger call keeps at most 128 blocks, of a power of two each

#: what rounding y to nearest in a dtype may cost, |fl(y) - y| <= u * |y| + tiny, as (u,
#: tiny): u the unit roundoff, tiny half the spacing of the dtype's subnormals
ROUNDING = {np.dtype(np.float32): (2.0**-24, 2.0**-150),
            np.dtype(np.float16): (2.0**-11, 2.0**-25),
            np.dtype(ml_dtypes.bfloat16): (2.0**-8, 2.0**-134)}
FLOAT32 = np.dtype(np.float32)


def rank_input(key: int | Sequence[int], count: int, dtype: str) -> np.ndarray:
    """The input seeded by `key` (e.g. [seed, rank]): int32 uniform in [-2^20, 2^20) (the
    sum of up to 1024 ranks passes the switch's conservative overflow check); float32
    standard normal, and float16 / bfloat16 ("float16", "bfloat16") that rounded."""
    rng = np.random.default_rng(key)
    if dtype == "int32":
        return rng.integers(-(2**20), 2**20, count, dtype=np.int32)
    normal = rng.standard_normal(count, dtype=np.float32)
    return normal if dtype == "float32" else normal.astype(np.dtype(dtype))


def block_size(count: int) -> int:
    """Elements per block of a float call of `count` elements (docs/library.md): MIN_BLOCK
    up to MAX_BLOCKS * MIN_BLOCK elements, then the smallest power of two that keeps the
    call within MAX_BLOCKS blocks."""
    size = MIN_BLOCK
    while size * MAX_BLOCKS < count:
        size *= 2
    return size


def scale_exponents(world_size: int, block_max: np.ndarray) -> np.ndarray:
    """README "Guarantees": e = 30 - ceil(log2 n) - max(floor(log2 M), -128) for each
    block's largest |x| = M over all ranks, one less above 128 ranks; +inf where M = 0
    (nothing to round)."""
    m = np.asarray(block_max, dtype=np.float64)
    _, exp = np.frexp(m)                     # M in [2^(exp-1), 2^exp): floor(log2 M) = exp-1
    top = 30 - math.ceil(math.log2(world_size)) - (world_size > 128)
    return np.where(m > 0, top - np.maximum(exp - 1.0, -128.0), np.inf)


def rounded(off: np.ndarray, exact: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A bound on |fl(y) - exact| for y within `off` of `exact`, rounded to `dtype`:
    (1 + u) * off + u * |exact| + tiny (`ROUNDING`)."""
    u, tiny = ROUNDING[np.dtype(dtype)]
    return (1 + u) * off + u * np.abs(exact) + tiny


def switch_bound(world_size: int, e: np.ndarray, exact: np.ndarray, divisor: int,
                 dtype: np.dtype) -> np.ndarray:
    """The switch's documented bound on |result - exact| per element, `e` its block's
    exponent, `exact` the exact sum / `divisor` (README "Guarantees"; docs/library.md for
    avg and the 16-bit dtypes): with the quantization term q = n * 2^-(e+1) / divisor,
    float32: q * (1 + 2^-24) + 2^-24 * |S| + 2^-150; float16: that rounding with u = 2^-11
    instead, once from float64; bfloat16: the float32 bound rounded once more (u = 2^-8)."""
    with np.errstate(over="ignore"):
        q = world_size * np.exp2(-(e + 1.0)) / divisor
    dtype = np.dtype(dtype)
    if dtype == np.dtype(np.float16):
        return rounded(q, exact, dtype)
    f32 = rounded(q, exact, FLOAT32)
    return f32 if dtype == FLOAT32 else rounded(f32, exact, dtype)


class Reference:
    """The result of `op` ("sum", or "avg": the sum / n) over `inputs` (one array per rank,
    int32, float32, float16 or bfloat16) and how far a result may be from it. int32: exactly
    numpy's (wrapping) sum. Floats: the exact sum S is taken as the float64 sum of the
    inputs, and a result must be within the documented bound of the algorithm that ran --
    "switch": `switch_bound` with each block's exponent from its largest |x| over the ranks
    (`scale_exponents`); `SWITCH_PER_CALL`: the same with the call's one scale (its largest
    |x|); "ring": n-1 additions in float32 (the accumulator of all three dtypes), each
    rounding by at most u = 2^-24 of a partial sum no larger than m = sum(|x_i|), so
    |sum - S| <= n * u * m; an average divides that sum by n there, one more rounding of
    u * (|S| + n * u * m) / n; a 16-bit result is then rounded once to its dtype."""

    def __init__(self, inputs: Iterable[np.ndarray], op: str = "sum") -> None:
        """`inputs` (at least one array, all of one shape and dtype) is consumed one array
        at a time: a generator keeps memory at a few arrays, whatever the number of ranks."""
        self.world_size = 0
        for x in inputs:
            if not self.world_size:
                self.dtype = x.dtype
                self.exact = x.dtype == np.int32
                self.want = np.zeros(x.shape, dtype=np.int32 if self.exact else np.float64)
                self.magnitude = np.zeros(0 if self.exact else x.shape)
                self.block_max = np.zeros(0 if self.exact or not x.size
                                          else -(-x.size // block_size(x.size)))
            self.world_size += 1
            if self.exact:
                self.want += x                      # int32 wraps like numpy's int32 sum
                continue
            magnitude = np.abs(x.astype(np.float64))
            self.want += x
            self.magnitude += magnitude
            if x.size:
                starts = np.arange(0, x.size, block_size(x.size))
                self.block_max = np.maximum(self.block_max, np.maximum.reduceat(
                    magnitude.reshape(-1), starts))
        self.divisor = self.world_size if op == "avg" else 1
        if self.divisor != 1:
            self.want /= self.divisor

    def tolerance(self, algo: str) -> np.ndarray:
        """The largest |got - want| allowed per element (zeros for int32)."""
        if self.exact:
            return np.zeros(self.want.shape)
        if algo in ("switch", SWITCH_PER_CALL):
            e = np.repeat(self.exponents(algo), block_size(self.want.size))[:self.want.size]
            return switch_bound(self.world_size, e.reshape(self.want.shape), self.want,
                                self.divisor, self.dtype)
        u = ROUNDING[FLOAT32][0]
        off = self.world_size * u * self.magnitude
        if self.divisor != 1:
            off = (off + u * (np.abs(self.want) * self.divisor + off)) / self.divisor
        return off if self.dtype == FLOAT32 else rounded(off, self.want, self.dtype)

    def exponents(self, algo: str = "switch") -> np.ndarray:
        """The exponent of each block's scale 2^e for these inputs (floats only; +inf for a
        block of zeros): its own ("switch"), or the call's one in every block
        (`SWITCH_PER_CALL`)."""
        if algo == SWITCH_PER_CALL and self.block_max.size:
            return np.full(self.block_max.shape,
                           scale_exponents(self.world_size, self.block_max.max()))
        return scale_exponents(self.world_size, self.block_max)

    def wrong(self, got: np.ndarray, algo: str) -> np.ndarray:
        """Indices of the elements of `got` outside the tolerance."""
        if self.exact:
            return np.flatnonzero(got != self.want)
        return np.flatnonzero(np.abs(got.astype(np.float64) - self.want)
                              > self.tolerance(algo))

    def describe(self, got: np.ndarray, algo: str) -> str:
        """How `got` compares: "exact", or its largest error and the bound's kind."""
        if self.exact:
            return "exact"
        err = float(np.abs(got.astype(np.float64) - self.want).max(initial=0.0))
        if algo in ("switch", SWITCH_PER_CALL):
            e = sorted({int(x) for x in self.exponents(algo) if np.isfinite(x)}) or [0]
            scales = f"2^{e[0]}" if len(e) == 1 else f"2^{e[0]}..2^{e[-1]} (per block)"
            kind = f"switch quantization {scales}"
        else:
            kind = f"{self.dtype} ring rounding"
        return f"max error {err:.3g}, within the {kind} bound"

    def failure(self, got: np.ndarray, algo: str) -> str | None:
        """None when `got` passes, else what is wrong (count, first places, got vs want)."""
        bad = self.wrong(got, algo)
        if not bad.size:
            return None
        first = bad[:5]
        return (f"{bad.size} of {got.size} elements wrong, first at {first.tolist()}: got "
                f"{got[first].tolist()}, want {self.want[first].tolist()}")
