"""Accuracy of allreduce sums, offline: the switch path's quantizer (the library's own
`local_blocks`, `block_exponents`, `quantize`, `dequantize`) with one scale per call and
with one scale per block, and the host ring's float32 accumulation, against the exact
float64 sum of the same inputs; writes a markdown table (docs/accuracy.md).

    python -m benchmarks.accuracy [--ranks 4] [--count 65536] [--out docs/accuracy.md]

Data sets (each rank its own data, the same on every run):
  normal    standard normal, `count` elements
  blocks    a bucket of 11 segments of 4096 elements (4 switch blocks each), standard
            normal scaled by 1e-6, 1e-5, ..., 1e4 in turn: layers of very different
            magnitudes in one call
  gradients the gradients of examples/train_mlp.py's MLP (its defaults: 64-256-256-10,
            batch 64, seed 0) at step 0 and after 200 steps of SGD with the exact average,
            one rank per batch stream, cut into DDP-like buckets (parameters in reverse
            order, greedily up to the example's 0.1 MB bucket cap); one call per bucket
Algorithms: "switch, per call" is the quantizer with the call's one exponent (what the
switch path did before per-block scales; `one_scale_per_call` runs it for benchmarks);
"switch, per block" is the switch path as it is; "ring" sums each chunk in float32 in the
host ring's order (chunk c starts at rank c, then c+1, ...; netreduce/algorithms/ring.py)
and rounds once to the dtype. gloo's ring allreduce adds float32 the same way in its own
order: the "ring" column models it too. int32 is exact on every path (overflow is refused,
not wrapped).
"""
from __future__ import annotations

import argparse
import importlib.util
import textwrap
from pathlib import Path
from typing import Callable, Iterator

import ml_dtypes
import numpy as np

from netreduce.algorithms.switch import (block_exponents, call_exponent, dequantize,
                                         local_blocks, quantize)
from netreduce.dtypes import BFLOAT16, FLOAT16, FLOAT32, accumulator
from netreduce.tools.reference import rank_input

ROOT = Path(__file__).resolve().parents[1]
DTYPES = (np.dtype(np.int32), FLOAT32, FLOAT16, BFLOAT16)
SEGMENT = 4096                        # elements per magnitude in the "blocks" data set
POWERS = range(-6, 5)                 # 1e-6 .. 1e4
BUCKET_BYTES = 100_000                # examples/train_mlp.py's --bucket-cap-mb 0.1
WIDTH = 92                            # the docs' line width
READING = (
    "How to read it: the maxima come from elements whose sum nearly cancels (|S| much "
    "smaller than the inputs: every algorithm's absolute error is then large relative to S) "
    "and, through the switch, from elements far smaller than the largest |x| of their block "
    "(one scale per block: 1024 elements here; per call: the whole call), which come back "
    "with an absolute error bounded by that largest |x| (docs/library.md) -- a gradient "
    "element 2^-30 of its block's largest comes back as 0, a relative error of 1. The "
    "percentiles and medians show the typical element. Per block, layers of 1e-6 next to "
    "layers of 1e4 keep their precision; with one scale per call they lose it. The 16-bit "
    "dtypes are dominated by their own rounding of the result, on every path alike (float16 "
    "inputs below its smallest subnormal, 6e-8, are 0 before any sum: such elements drop "
    "out).")


def switch_sum(xs: list[np.ndarray], per_block: bool) -> np.ndarray:
    """The switch path's result for the ranks' inputs `xs` (float dtypes): quantized with
    the agreed per-block exponents, or with the call's one exponent (`call_exponent`, what
    `one_scale_per_call` runs)."""
    if per_block:
        exponents = block_exponents(len(xs), [local_blocks(x).blocks for x in xs])
    else:
        exponents = call_exponent(len(xs), [(float(x.min()), float(x.max())) for x in xs])
    total = np.zeros(xs[0].size, dtype=np.int64)
    wire = np.empty(xs[0].size, dtype=np.int32)
    for x in xs:
        quantize(x, exponents, wire)
        total += wire
    if np.any(np.abs(total) > np.iinfo(np.int32).max):
        raise AssertionError("an int32 sum wrapped: the exponents are wrong")
    out = np.empty(xs[0].size, dtype=xs[0].dtype)
    dequantize(total.astype(np.int32), exponents, 1, out, np.empty(out.nbytes, np.uint8))
    return out


def ring_sum(xs: list[np.ndarray]) -> np.ndarray:
    """The host ring's sum: chunk c of n, accumulated in the accumulator dtype from rank c
    on around the ring, rounded once to the dtype."""
    n = len(xs)
    acc = accumulator(xs[0].dtype)
    out = np.empty(xs[0].size, dtype=xs[0].dtype)
    bounds = np.linspace(0, xs[0].size, n + 1).astype(int)
    for c in range(n):
        lo, hi = bounds[c], bounds[c + 1]
        total = xs[c][lo:hi].astype(acc)
        for k in range(1, n):
            total = total + xs[(c + k) % n][lo:hi].astype(acc)
        with np.errstate(over="ignore"):        # beyond a 16-bit dtype's range: +-inf
            out[lo:hi] = total
    return out


def int32_switch(xs: list[np.ndarray]) -> np.ndarray:
    """The switch path's int32 sum: the words as they are, added with int32 wrap-around
    (the call passed the overflow check: `rank_input`'s integers do for any 1024 ranks)."""
    return np.sum(xs, axis=0, dtype=np.int32)


def relative_errors(got: np.ndarray, exact: np.ndarray, top: float) -> np.ndarray:
    """|got - S| / |S| for the elements whose exact sum S is non-zero and within the
    dtype's range (`top`)."""
    keep = (exact != 0) & (np.abs(exact) <= top)
    return np.abs(got[keep].astype(np.float64) - exact[keep]) / np.abs(exact[keep])


ALGORITHMS: dict[str, Callable[[list[np.ndarray]], np.ndarray]] = {
    "switch, per call": lambda xs: switch_sum(xs, per_block=False),
    "switch, per block": lambda xs: switch_sum(xs, per_block=True),
    "ring (float32; gloo)": ring_sum,
}


def normal(ranks: int, count: int) -> Iterator[list[np.ndarray]]:
    yield [rank_input([7, r], count, "float32") for r in range(ranks)]


def blocks(ranks: int, count: int) -> Iterator[list[np.ndarray]]:
    scale = np.repeat(10.0 ** np.array(POWERS), SEGMENT)
    yield [(rank_input([8, r], scale.size, "float32") * scale).astype(np.float32)
           for r in range(ranks)]


def gradients(ranks: int, count: int) -> Iterator[list[np.ndarray]]:
    """The example's float32 gradients per rank, bucket by bucket (see the module doc)."""
    import torch
    spec = importlib.util.spec_from_file_location("train_mlp", ROOT / "examples/train_mlp.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    model = example.mlp(256)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    params = list(reversed(list(model.parameters())))     # DDP's bucket order
    for step in range(201):
        grads = []
        for r in range(ranks):
            model.zero_grad()
            x, y = example.batch(0, r, step, 64)
            loss_fn(model(x), y).backward()
            grads.append([p.grad.detach().numpy().astype(np.float32).ravel() for p in params])
        if step in (0, 200):
            for bucket in ddp_buckets([g.size for g in grads[0]]):
                yield [np.concatenate([g[i] for i in bucket]) for g in grads]
        for i, p in enumerate(params):
            p.grad = torch.from_numpy(np.mean([g[i] for g in grads], axis=0).reshape(p.shape))
        opt.step()


def ddp_buckets(sizes: list[int]) -> list[list[int]]:
    """Parameter indices per bucket: in order, greedily up to BUCKET_BYTES of float32 (a
    larger parameter alone)."""
    buckets: list[list[int]] = [[]]
    filled = 0
    for i, size in enumerate(sizes):
        if buckets[-1] and filled + 4 * size > BUCKET_BYTES:
            buckets.append([])
            filled = 0
        buckets[-1].append(i)
        filled += 4 * size
    return buckets


DATA: dict[str, Callable[[int, int], Iterator[list[np.ndarray]]]] = {
    "normal": normal, "blocks": blocks, "gradients": gradients}


def measure(ranks: int, count: int) -> list[tuple[str, str, list[str]]]:
    """Rows (data set, dtype, per algorithm "max / 99.9th percentile / median" relative
    error); each data set's
    float32 calls are cast to each float dtype (int32: uniform integers, exact)."""
    ints = [rank_input([7, r], count, "int32") for r in range(ranks)]
    exact = np.sum(ints, axis=0, dtype=np.int64)
    exactness = ["0 (exact)" if np.array_equal(run(ints), exact) else "WRONG"
                 for run in (int32_switch, int32_switch, ring_sum)]
    rows = [("uniform integers", "int32", exactness)]
    for name, make in DATA.items():
        calls = list(make(ranks, count))
        for dtype in DTYPES[1:]:
            top = float(ml_dtypes.finfo(dtype).max)
            errors: dict[str, list[np.ndarray]] = {a: [] for a in ALGORITHMS}
            for call in calls:
                xs = [x.astype(dtype) for x in call]
                exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
                for algo, run in ALGORITHMS.items():
                    errors[algo].append(relative_errors(run(xs), exact, top))
            cells = []
            for algo in ALGORITHMS:
                rel = np.concatenate(errors[algo])
                high, median = np.quantile(rel, [0.999, 0.5])
                cells.append(f"{rel.max():.2g} / {high:.2g} / {median:.2g}")
            rows.append((name, dtype.name, cells))
    return rows


def table(ranks: int, count: int, rows: list[tuple[str, str, list[str]]]) -> str:
    header = "| data | dtype | " + " | ".join(ALGORITHMS) + " |"
    lines = [header, "|" + " --- |" * (2 + len(ALGORITHMS))]
    lines += [f"| {name} | {dtype} | " + " | ".join(cells) + " |" for name, dtype, cells in rows]
    intro = (f"Max / 99.9th percentile / median of the relative error per element, "
             f"|result − S| / |S|, against the exact float64 sum S of the same inputs, "
             f"{ranks} ranks (elements with S = 0 or S beyond the dtype's range left out). "
             f"Generated by `python -m benchmarks.accuracy --ranks {ranks} --count {count}` with "
             f"the library's own quantizer.")
    method = (__doc__ or "").split("\n\n")[2:]
    return "\n".join(["# Accuracy: the switch's quantized sums vs the ring", "",
                      textwrap.fill(intro, WIDTH), "", *lines, "",
                      textwrap.fill(READING, WIDTH), "", "Method:", "", "```",
                      *method, "```", ""])


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--count", type=int, default=65536, help="elements of the normal data")
    p.add_argument("--out", type=Path, default=ROOT / "docs/accuracy.md")
    args = p.parse_args()
    text = table(args.ranks, args.count, measure(args.ranks, args.count))
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
