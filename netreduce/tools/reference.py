"""Deterministic per-rank inputs and the numpy reference of their sum, so that every rank of
a demo, benchmark or test checks its allreduce result alone: each rank builds every rank's
input from a seed and sums them with numpy.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from netreduce.algorithms.switch import (NO_FLOOR, block_elements, block_exponents,
                                         element_exponents, float_error_bound, local_blocks)
from netreduce.dtypes import HALVES, ROUNDING, accumulator, after_roundings

SWITCH_PER_CALL = "switch-call"     # the switch path with one scale per call (benchmarks:
#                                     netreduce.algorithms.switch.one_scale_per_call)


def rank_input(key: int | Sequence[int], count: int, dtype: str) -> np.ndarray:
    """The input seeded by `key` (e.g. [seed, rank]): int32 uniform in [-2^20, 2^20) (the
    sum of up to 1024 ranks passes the switch's conservative overflow check); float32
    standard normal, and float16 / bfloat16 ("float16", "bfloat16") that rounded."""
    rng = np.random.default_rng(key)
    if dtype == "int32":
        return rng.integers(-(2**20), 2**20, count, dtype=np.int32)
    normal = rng.standard_normal(count, dtype=np.float32)
    return normal if dtype == "float32" else normal.astype(np.dtype(dtype))


class Reference:
    """The result of `op` ("sum", or "avg": the sum / n) over `inputs` (one array per rank,
    int32, float32, float16 or bfloat16) and how far a result may be from it. int32: exactly
    numpy's (wrapping) sum. Floats: within the error bound of the algorithm that ran --
    "switch": its quantization bound with the per-block scales the switch path derives from
    the same inputs (`float_error_bound`; README "In-network allreduce:
    what travels, accuracy, overflow"); `SWITCH_PER_CALL`: the same with the call's one
    scale (the smallest of those exponents); "ring": n-1 additions in the accumulator dtype
    (float32 for all three), each rounding by at most u = 2^-24 of a partial sum no larger
    than m = sum(|x_i|), so |sum - S| <= n * u * m; an average divides that sum by n there,
    one more rounding of u * (|S| + n * u * m) / n; a 16-bit result is then rounded once to
    its dtype (`netreduce.dtypes.after_roundings`)."""

    def __init__(self, inputs: Iterable[np.ndarray], op: str = "sum") -> None:
        """`inputs` (at least one array, all of one shape and dtype) is consumed one array
        at a time: a generator keeps memory at a few arrays, whatever the number of ranks."""
        self.world_size = 0
        self.floors = np.zeros(0, dtype=np.int8)   # per block: the largest of the inputs'
        for x in inputs:
            if not self.world_size:
                self.dtype = x.dtype
                self.exact = x.dtype == np.int32
                self.want = np.zeros(x.shape, dtype=np.int32 if self.exact else np.float64)
                self.magnitude = np.zeros(0 if self.exact else x.shape)
                blocks = 0 if self.exact else -(-x.size // block_elements(x.size))
                self.floors = np.full(blocks, NO_FLOOR, dtype=np.int8)
            self.world_size += 1
            self.want += x                          # int32 wraps like numpy's int32 sum
            if not self.exact:
                self.magnitude += np.abs(x.astype(np.float64))
                self.floors = np.maximum(self.floors, np.frombuffer(local_blocks(x).blocks,
                                                                    dtype=np.int8))
        self.divisor = self.world_size if op == "avg" else 1
        if self.divisor != 1:
            self.want /= self.divisor

    def tolerance(self, algo: str) -> np.ndarray:
        """The largest |got - want| allowed per element (zeros for int32)."""
        if self.exact:
            return np.zeros(self.want.shape)
        if algo in ("switch", SWITCH_PER_CALL):
            e = element_exponents(self.exponents(algo), self.want.size).reshape(self.want.shape)
            return float_error_bound(self.world_size, e, self.want, self.divisor, self.dtype)
        u = ROUNDING[accumulator(self.dtype)][0]
        off = self.world_size * u * self.magnitude
        if self.divisor != 1:
            off = (off + u * (np.abs(self.want) * self.divisor + off)) / self.divisor
        if self.dtype in HALVES:
            return after_roundings(off, self.want, (ROUNDING[self.dtype],))
        return off

    def exponents(self, algo: str = "switch") -> np.ndarray:
        """The switch path's exponent of each block for these inputs (floats only): its own
        ("switch"), or the call's one exponent in every block (`SWITCH_PER_CALL`)."""
        exponents = block_exponents(self.world_size, [self.floors.tobytes()])
        if algo == SWITCH_PER_CALL and exponents.size:
            exponents = np.full_like(exponents, exponents.min())
        return exponents

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
            e = sorted(set(self.exponents(algo).tolist())) or [0]
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
