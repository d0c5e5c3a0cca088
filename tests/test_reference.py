"""netreduce.tools.reference: deterministic inputs and the numpy reference results are checked by."""
from __future__ import annotations

import numpy as np

from netreduce.algorithms.switch import (block_exponents, element_exponents, float_error_bound,
                                         local_blocks)
from netreduce.tools.reference import Reference, rank_input


def test_inputs_are_deterministic_and_int32_sums_of_1024_ranks_fit() -> None:
    a, b = rank_input([1, 0], 1000, "int32"), rank_input([1, 0], 1000, "int32")
    assert a.dtype == np.int32 and np.array_equal(a, b)
    assert not np.array_equal(a, rank_input([1, 1], 1000, "int32"))
    assert 1024 * int(np.abs(a).max()) <= 2**31
    assert rank_input([1, 0], 7, "float32").dtype == np.float32


def test_int32_must_be_exact() -> None:
    xs = [rank_input([2, r], 100, "int32") for r in range(3)]
    ref = Reference(iter(xs))
    good = xs[0] + xs[1] + xs[2]
    assert ref.failure(good, "switch") is None and ref.describe(good, "switch") == "exact"
    bad = good.copy()
    bad[[3, 50]] += 1
    assert ref.failure(bad, "ring") == (
        f"2 of 100 elements wrong, first at [3, 50]: got {bad[[3, 50]].tolist()}, want "
        f"{good[[3, 50]].tolist()}")


def test_float32_tolerance_is_the_bound_of_the_algorithm_that_ran() -> None:
    xs = [rank_input([3, r], 100, "float32") for r in range(4)]
    ref = Reference(iter(xs))
    wide = np.stack(xs).astype(np.float64)
    exact = wide.sum(axis=0)
    e = block_exponents(4, [local_blocks(x).blocks for x in xs])
    assert np.array_equal(ref.tolerance("switch"),
                          float_error_bound(4, element_exponents(e, 100), exact))
    assert np.allclose(ref.tolerance("ring"), 4 * 2.0**-24 * np.abs(wide).sum(axis=0))
    got = exact.astype(np.float32)
    assert ref.failure(got, "switch") is None
    assert ref.describe(got, "switch").endswith(f"within the switch quantization 2^{e[0]} bound")
    off = got + np.float32(1e-3)
    assert ref.failure(off, "ring").startswith("100 of 100 elements wrong")


def test_an_average_is_the_sum_over_n_within_the_divided_bound() -> None:
    xs = [rank_input([4, r], 100, "float32") for r in range(3)]
    ref = Reference(iter(xs), op="avg")
    wide = np.stack(xs).astype(np.float64)
    exact = wide.sum(axis=0) / 3
    assert np.array_equal(ref.want, exact)
    e = element_exponents(block_exponents(3, [local_blocks(x).blocks for x in xs]), 100)
    assert np.array_equal(ref.tolerance("switch"), float_error_bound(3, e, exact, divisor=3))
    summed = 3 * 2.0**-24 * np.abs(wide).sum(axis=0)
    assert np.allclose(ref.tolerance("ring"), (summed + 2.0**-24 * (3 * np.abs(exact) + summed)) / 3)
    assert ref.failure(exact.astype(np.float32), "ring") is None
    assert ref.failure((wide.sum(axis=0)).astype(np.float32), "switch") is not None   # a sum
