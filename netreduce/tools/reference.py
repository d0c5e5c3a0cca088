"""Deterministic per-rank inputs and the numpy reference of their sum, so that every rank of
a demo, benchmark or test checks its allreduce result alone: each rank builds every rank's
input from a seed and sums them with numpy.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from netreduce.algorithms.switch import float_error_bound, quantization_exponent


def rank_input(key: int | Sequence[int], count: int, dtype: str) -> np.ndarray:
    """The input seeded by `key` (e.g. [seed, rank]): int32 uniform in [-2^20, 2^20) (the
    sum of up to 1024 ranks passes the switch's conservative overflow check), float32
    standard normal."""
    rng = np.random.default_rng(key)
    if dtype == "int32":
        return rng.integers(-(2**20), 2**20, count, dtype=np.int32)
    return rng.standard_normal(count, dtype=np.float32)


class Reference:
    """The result of `op` ("sum", or "avg": the sum / n) over `inputs` (one array per rank,
    int32 or float32) and how far a result may be from it. int32: exactly numpy's (wrapping)
    sum. float32: within the error bound of the algorithm that ran -- "switch": its
    quantization bound (`float_error_bound`; README "In-network allreduce: what travels,
    accuracy, overflow"); "ring": n-1 float32 additions, each rounding by at most 2^-24 of a
    partial sum no larger than m = sum(|x_i|), so |sum - S| <= n * 2^-24 * m; an average
    divides that sum by n in float32, one more rounding of 2^-24 of (|S| + n * 2^-24 * m)/n."""

    def __init__(self, inputs: Iterable[np.ndarray], op: str = "sum") -> None:
        """`inputs` (at least one array, all of one shape and dtype) is consumed one array
        at a time: a generator keeps memory at a few arrays, whatever the number of ranks."""
        self.world_size = 0
        self.absmax = 0.0
        for x in inputs:
            if not self.world_size:
                self.exact = x.dtype == np.int32
                self.want = np.zeros(x.shape, dtype=np.int32 if self.exact else np.float64)
                self.magnitude = np.zeros(0 if self.exact else x.shape)
            self.world_size += 1
            self.want += x                          # int32 wraps like numpy's int32 sum
            if not self.exact:
                self.magnitude += np.abs(x)
                self.absmax = max(self.absmax, float(np.abs(x).max(initial=0.0)))
        self.divisor = self.world_size if op == "avg" else 1
        if self.divisor != 1:
            self.want /= self.divisor

    def tolerance(self, algo: str) -> np.ndarray:
        """The largest |got - want| allowed per element (zeros for int32)."""
        if self.exact:
            return np.zeros(self.want.shape)
        if algo == "switch":
            e = quantization_exponent(self.world_size, self.absmax)
            return float_error_bound(self.world_size, e, self.want, self.divisor)
        summed = self.world_size * 2.0**-24 * self.magnitude
        if self.divisor == 1:
            return summed
        return (summed + 2.0**-24 * (np.abs(self.want) * self.divisor + summed)) / self.divisor

    def wrong(self, got: np.ndarray, algo: str) -> np.ndarray:
        """Indices of the elements of `got` outside the tolerance."""
        if self.exact:
            return np.flatnonzero(got != self.want)
        return np.flatnonzero(np.abs(got - self.want) > self.tolerance(algo))

    def describe(self, got: np.ndarray, algo: str) -> str:
        """How `got` compares: "exact", or its largest error and the bound's kind."""
        if self.exact:
            return "exact"
        err = float(np.abs(got - self.want).max(initial=0.0))
        kind = (f"switch quantization 2^{quantization_exponent(self.world_size, self.absmax)}"
                if algo == "switch" else "float32 rounding")
        return f"max error {err:.3g}, within the {kind} bound"

    def failure(self, got: np.ndarray, algo: str) -> str | None:
        """None when `got` passes, else what is wrong (count, first places, got vs want)."""
        bad = self.wrong(got, algo)
        if not bad.size:
            return None
        first = bad[:5]
        return (f"{bad.size} of {got.size} elements wrong, first at {first.tolist()}: got "
                f"{got[first].tolist()}, want {self.want[first].tolist()}")
