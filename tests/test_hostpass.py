"""netreduce/hostpass.py (the native passes, netreduce/native/hostpass.c) against numpy
oracles written here, bit for bit: the int32 and per-block float32 min/max, quantize
(float32 x * 2^e rounded half to even) and dequantize (float64 s * 2^-e / d, rounded once
to float32), at the edges: ties, subnormals, signed zeros, the largest exponents, NaN."""
from __future__ import annotations

import os

import numpy as np
import pytest

from netreduce import hostpass

if not hostpass.AVAILABLE:
    if os.environ.get("CI") == "true":      # scripts/install.sh builds it: never skip in CI
        raise RuntimeError(f"{hostpass.LIBRARY} is not built under CI=true "
                           "(scripts/install.sh runs make -C netreduce/native)")
    pytest.skip("make -C netreduce/native has not been run", allow_module_level=True)


def oracle_quantize(x: np.ndarray, block: int, exps: np.ndarray) -> np.ndarray:
    e = np.repeat(exps, block)[:x.size].astype(np.float64)
    return np.rint(x.astype(np.float64) * np.exp2(e)).astype(np.int32)


def oracle_dequantize(s: np.ndarray, block: int, exps: np.ndarray, d: int) -> np.ndarray:
    e = np.repeat(exps, block)[:s.size].astype(np.float64)
    return (s.astype(np.float64) * np.exp2(-e) / d).astype(np.float32)


def test_range_int32_is_numpys_min_and_max() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 7, 64, 1001, 1 << 16):
        x = rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
        assert hostpass.range_int32(x) == (int(x.min()), int(x.max()))
    edge = np.array([2**31 - 1, -2**31, 0], dtype=np.int32)
    assert hostpass.range_int32(edge) == (-2**31, 2**31 - 1)
    for n in (31, 32, 33, 95):              # the extremes in every lane and in the tail
        for at in range(n):
            x = np.zeros(n, np.int32)
            x[at], x[(at + 1) % n] = -2**31, 2**31 - 1
            assert hostpass.range_int32(x) == (-2**31, 2**31 - 1), (n, at)
    with pytest.raises(ValueError, match="empty"):
        hostpass.range_int32(np.empty(0, np.int32))
    with pytest.raises(TypeError, match="C-contiguous int32"):
        hostpass.range_int32(np.arange(10, dtype=np.int32)[::2])
    unaligned = np.frombuffer(bytes(41), dtype=np.int32, offset=1)
    assert not hostpass.native(unaligned)
    with pytest.raises(TypeError, match="aligned: False"):
        hostpass.range_int32(unaligned)


def test_block_ranges_are_numpys_reduceat_with_nan_propagated() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal(5000).astype(np.float32)
    x[1234] = np.nan
    x[4100] = np.inf
    for block in (1, 3, 1024, 4096, 8192):
        starts = np.arange(0, x.size, block)
        lows, highs = hostpass.block_ranges(x, block)
        np.testing.assert_array_equal(lows, np.minimum.reduceat(x, starts))
        np.testing.assert_array_equal(highs, np.maximum.reduceat(x, starts))
    with pytest.raises(ValueError, match="blocks of 0"):
        hostpass.block_ranges(x, 0)


def test_quantize_rounds_half_to_even_bit_for_bit() -> None:
    # ties (0.5, 1.5, 2.5, -2.5), a subnormal, signed zeros, values near 2^30
    x = np.array([0.5, 1.5, 2.5, -2.5, -0.5, 1e-45, -0.0, 0.0, 3.75, 2**30 - 64.0,
                  -(2**30 - 64.0), 1.0000001], dtype=np.float32)
    for e in (0, 1, -1, 3):        # src * 2^e = x again where float32 holds x * 2^-e
        exps = np.array([e], dtype=np.int32)
        wire = np.empty(x.size, np.int32)
        src = (x * np.float32(2.0**-e)).astype(np.float32)
        hostpass.quantize_f32(src, x.size, exps, wire)
        np.testing.assert_array_equal(wire, oracle_quantize(src, x.size, exps))
    assert oracle_quantize(x[:5], 5, np.zeros(1, np.int32)).tolist() == [0, 2, 2, -2, 0]


def test_quantize_and_dequantize_per_block_match_the_oracles() -> None:
    rng = np.random.default_rng(5)
    for n, block in ((1, 1024), (3000, 1024), (1 << 17, 1 << 15), (10_000, 4096)):
        blocks = -(-n // block)
        exps = rng.integers(-20, 159, blocks).astype(np.int32)     # 158: an all-zero block
        scale = np.repeat(np.exp2(-exps.astype(np.float64) + 29), block)[:n]
        x = (rng.uniform(-1, 1, n) * scale).astype(np.float32)
        wire = np.empty(n, np.int32)
        hostpass.quantize_f32(x, block, exps, wire)
        np.testing.assert_array_equal(wire, oracle_quantize(x, block, exps))
        for d in (1, 3, 7):
            out = np.empty(n, np.float32)
            hostpass.dequantize_f32(wire, block, exps, d, out)
            np.testing.assert_array_equal(out.view(np.int32),
                                          oracle_dequantize(wire, block, exps, d).view(np.int32))


def test_dequantize_overflows_to_infinity_like_numpy() -> None:
    s = np.array([2**31 - 1, -2**31, 1], dtype=np.int32)
    exps = np.array([-100], dtype=np.int32)
    out = np.empty(3, np.float32)
    with np.errstate(over="ignore"):
        want = oracle_dequantize(s, 3, exps, 1)
    hostpass.dequantize_f32(s, 3, exps, 1, out)
    assert out[0] == np.inf and out[1] == -np.inf
    np.testing.assert_array_equal(out, want)


def test_bad_arguments_are_refused() -> None:
    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="2 exponents for 10 elements"):
        hostpass.quantize_f32(x, 4, np.zeros(2, np.int32), np.empty(10, np.int32))
    with pytest.raises(ValueError, match="9 elements where 10"):
        hostpass.quantize_f32(x, 10, np.zeros(1, np.int32), np.empty(9, np.int32))
    with pytest.raises(TypeError, match="float32"):
        hostpass.dequantize_f32(np.zeros(10, np.int32), 10, np.zeros(1, np.int32), 1,
                                np.empty(10, np.float64))
    with pytest.raises(ValueError, match="divisor 0"):
        hostpass.dequantize_f32(np.zeros(10, np.int32), 10, np.zeros(1, np.int32), 0,
                                np.empty(10, np.float32))


def test_a_built_library_counts_no_fallback() -> None:
    x = np.arange(10, dtype=np.int32)
    assert hostpass.native(x) and hostpass.fallbacks() == 0
    assert not hostpass.native(x[::2]) and hostpass.fallbacks() == 0   # by design, not counted
