"""benchmarks/accuracy.py (the docs/accuracy.md table): its models of the three paths, on small
data (the full table takes minutes: `python -m benchmarks.accuracy`)."""
from __future__ import annotations

import numpy as np

from netreduce.dtypes import BFLOAT16
from benchmarks.accuracy import (ALGORITHMS, ddp_buckets, int32_switch, relative_errors, ring_sum,
                            switch_sum, table)


def test_per_block_scales_keep_small_blocks_that_one_scale_per_call_loses() -> None:
    rng = np.random.default_rng(5)
    scale = np.repeat([1e-6, 1e4], 1024)
    xs = [(rng.standard_normal(scale.size) * scale).astype(np.float32) for _ in range(4)]
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    top = float(np.finfo(np.float32).max)
    per_block = relative_errors(switch_sum(xs, per_block=True), exact, top)
    per_call = relative_errors(switch_sum(xs, per_block=False), exact, top)
    assert np.median(per_block[:1024]) < 1e-6 < 1e-2 < np.median(per_call[:1024])
    whole = np.arange(-1024, 1024, dtype=np.float32)          # 2^20 * x: integers, exact
    assert np.array_equal(switch_sum([whole, whole], per_block=True), 2 * whole)


def test_the_ring_adds_float32_from_each_chunks_first_rank_and_rounds_once() -> None:
    xs = [np.full(3, v, dtype=BFLOAT16) for v in (1.0, 2.0**-8, 2.0**-8)]
    # (1 + 2^-8) + 2^-8 in float32 is 1 + 2^-7, a bfloat16; in bfloat16 each sum ties to 1
    assert ring_sum(xs).astype(np.float64).tolist() == [1 + 2.0**-7] * 3
    ints = [np.array([2**30, -5], dtype=np.int32), np.array([2**30 - 1, 5], dtype=np.int32)]
    assert ring_sum(ints).tolist() == int32_switch(ints).tolist() == [2**31 - 1, 0]


def test_buckets_fill_greedily_up_to_the_cap_and_the_table_names_every_algorithm() -> None:
    assert ddp_buckets([10, 30_000, 5, 5]) == [[0], [1], [2, 3]]
    text = table(4, 8, [("normal", "float32", ["a", "b", "c"])])
    assert "| data | dtype | " + " | ".join(ALGORITHMS) + " |" in text
    assert "| normal | float32 | a | b | c |" in text
