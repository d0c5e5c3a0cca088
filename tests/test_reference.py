"""netreduce.tools.reference: deterministic inputs, and the tolerances results are checked by,
against the documented closed forms (README "Guarantees", docs/library.md) worked out by
hand for inputs chosen so that every figure is known: dyadic values whose sums float64 holds
exactly (checked with fractions), each block's largest |x| placed on purpose."""
from __future__ import annotations

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from netreduce.tools.reference import SWITCH_PER_CALL, Reference, block_size, rank_input


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


def test_blocks_are_the_documented_ones() -> None:
    """docs/library.md: 1024 elements up to 128 Ki elements, then at most 128 blocks, of
    the next power of two: 2 Ki elements for 1 MiB of float32, 32 Ki for 16 MiB."""
    assert [block_size(c) for c in (1, 1024, 1025, 128 * 1024)] == [1024] * 4
    assert block_size(128 * 1024 + 1) == 2048
    assert block_size(2**20 // 4) == 2048 and block_size(16 * 2**20 // 4) == 32768
    assert block_size(2**30) == 2**23


N, COUNT = 4, 2000        # two blocks: elements 0..1023 and 1024..1999


def dyadic_inputs(dtype: str = "float32") -> list[np.ndarray]:
    """4 ranks of multiples of 1/8 in [-1, 1) (exact in every dtype and in float64 sums);
    block 0's largest |x| is 3.0 (rank 2, element 5), block 1's is 0.25 (every rank's)."""
    xs = []
    for r in range(N):
        x = ((np.arange(COUNT) * (r + 3)) % 16 - 8) / 8.0
        x[1024:] = np.where(np.arange(976) % 2, 0.25, -0.125)
        if r == 2:
            x[5] = -3.0
        xs.append(x.astype(np.dtype(dtype)))
    return xs


def exact_sum(xs: list[np.ndarray]) -> np.ndarray:
    """The exact sum per element, with fractions: the float64 the reference holds must be it."""
    sums = [sum((Fraction(float(x[i])) for x in xs), Fraction(0)) for i in range(COUNT)]
    assert all(s == Fraction(float(s)) for s in sums)
    return np.array([float(s) for s in sums])


def quantization(n: int, e: np.ndarray) -> np.ndarray:
    """n * 2^-(e+1), per element from its block's exponent (block 0: e[0], block 1: e[1])."""
    return n * 2.0 ** -(np.repeat(e, [1024, COUNT - 1024]) + 1.0)


def test_the_switch_tolerance_is_the_readme_bound_from_each_blocks_largest_x() -> None:
    """README: |result - S| <= n 2^-(e+1) (1 + 2^-24) + 2^-24 |S| + 2^-150 with
    e = 30 - ceil(log2 n) - floor(log2 M), M the largest |x| of the element's block over
    every rank: block 0, M = 3: e = 30 - 2 - 1 = 27; block 1, M = 0.25: e = 30 - 2 + 2 = 30.
    One scale per call: the call's M = 3 everywhere."""
    xs = dyadic_inputs()
    ref = Reference(iter(xs))
    s = exact_sum(xs)
    assert np.array_equal(ref.want, s)
    assert ref.exponents().tolist() == [27, 30]
    assert np.array_equal(ref.tolerance("switch"),
                          quantization(4, np.array([27, 30])) * (1 + 2.0**-24)
                          + 2.0**-24 * np.abs(s) + 2.0**-150)
    assert ref.exponents(SWITCH_PER_CALL).tolist() == [27, 27]
    assert np.array_equal(ref.tolerance(SWITCH_PER_CALL),
                          quantization(4, np.array([27, 27])) * (1 + 2.0**-24)
                          + 2.0**-24 * np.abs(s) + 2.0**-150)
    assert ref.failure(s.astype(np.float32), "switch") is None
    assert ref.describe(s.astype(np.float32), "switch") == \
        "max error 0, within the switch quantization 2^27..2^30 (per block) bound"
    inside = s + ref.tolerance("switch") / 2          # within the bound passes, past it not
    assert not ref.wrong(inside, "switch").size
    past = inside.copy()
    past[[7, 1500]] += ref.tolerance("switch")[[7, 1500]]
    assert ref.wrong(past, "switch").tolist() == [7, 1500]


@pytest.mark.parametrize("n, e", [(1, 30), (2, 29), (3, 28), (128, 23), (129, 21), (256, 21),
                                  (257, 20), (1024, 19)])
def test_the_exponent_takes_ceil_log2_n_and_one_bit_more_over_128_ranks(n: int, e: int) -> None:
    """M = 1 (floor(log2 M) = 0): e = 30 - ceil(log2 n), minus 1 above 128 ranks."""
    assert Reference(np.ones(3, dtype=np.float32) for _ in range(n)).exponents().tolist() == [e]


def test_a_block_of_zeros_must_come_back_zero() -> None:
    """M = 0: nothing to round, the bound is 2^-150 (a result of zero)."""
    ref = Reference(np.zeros(10, dtype=np.float32) for _ in range(3))
    assert np.array_equal(ref.tolerance("switch"), np.full(10, 2.0**-150))
    assert ref.failure(np.zeros(10, dtype=np.float32), "switch") is None


def test_an_average_is_the_sum_over_n_within_the_divided_bound() -> None:
    """docs/library.md: |result - S/n| obeys the bound with 2^-(e+1) for the quantization
    term (n 2^-(e+1) / n); over the ring, the sum's n u m plus the division's rounding,
    divided by n."""
    xs = dyadic_inputs()
    ref = Reference(iter(xs), op="avg")
    s = exact_sum(xs)
    assert np.array_equal(ref.want, s / 4)
    assert np.array_equal(ref.tolerance("switch"),
                          quantization(1, np.array([27, 30])) * (1 + 2.0**-24)
                          + 2.0**-24 * np.abs(s / 4) + 2.0**-150)
    m = np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)
    summed = 4 * 2.0**-24 * m
    assert np.array_equal(ref.tolerance("ring"), (summed + 2.0**-24 * (np.abs(s) + summed)) / 4)
    assert ref.failure((s / 4).astype(np.float32), "ring") is None
    assert ref.failure(s.astype(np.float32), "switch") is not None      # a sum, not the avg


def test_the_ring_tolerance_is_n_roundings_of_the_largest_partial_sum() -> None:
    xs = [rank_input([3, r], 100, "float32") for r in range(4)]
    ref = Reference(iter(xs))
    wide = np.stack(xs).astype(np.float64)
    assert np.array_equal(ref.tolerance("ring"), 4 * 2.0**-24 * np.abs(wide).sum(axis=0))
    off = wide.sum(axis=0).astype(np.float32) + np.float32(1e-3)
    assert ref.failure(off, "ring").startswith("100 of 100 elements wrong")
    assert ref.describe(wide.sum(axis=0), "ring").endswith("within the float32 ring rounding bound")


def test_16_bit_results_are_rounded_once_more() -> None:
    """docs/library.md: float16 |result - S| <= (1 + 2^-11) n 2^-(e+1) + 2^-11 |S| + 2^-25;
    bfloat16 (1 + 2^-8) (the float32 bound) + 2^-8 |S| + 2^-134; over the ring the float32
    accumulation's n u m, rounded once to the dtype likewise."""
    half, brain = dyadic_inputs("float16"), dyadic_inputs("bfloat16")
    s = exact_sum(half)
    q = quantization(4, np.array([27, 30]))
    f32 = q * (1 + 2.0**-24) + 2.0**-24 * np.abs(s) + 2.0**-150
    assert np.array_equal(Reference(iter(half)).tolerance("switch"),
                          (1 + 2.0**-11) * q + 2.0**-11 * np.abs(s) + 2.0**-25)
    assert np.array_equal(Reference(iter(brain)).tolerance("switch"),
                          (1 + 2.0**-8) * f32 + 2.0**-8 * np.abs(s) + 2.0**-134)
    ring = 4 * 2.0**-24 * np.sum([np.abs(x.astype(np.float64)) for x in half], axis=0)
    assert np.array_equal(Reference(iter(half)).tolerance("ring"),
                          (1 + 2.0**-11) * ring + 2.0**-11 * np.abs(s) + 2.0**-25)
    assert Reference(iter(brain)).failure(s.astype(ml_dtypes.bfloat16), "switch") is None
