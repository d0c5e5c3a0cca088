"""The main job: one allreduce per rank, checked against numpy, with its goodput.

    netreduce launch --hosts 4 -- netreduce demo [--size BYTES] [--dtype int32|float32]
        [--algo auto|switch|ring] [--iters N] [--seed S]      (= python -m netreduce.tools.demo)

Every rank builds its tensor from (seed, rank) alone, so each computes the expected sum of
all ranks' tensors locally. After one untimed warm-up call (it registers the workspace),
`--iters` timed calls run back to back; every result is checked (int32: exact; float32:
within the documented bound of the algorithm that ran, see README), and each rank exits
non-zero on a mismatch. Rank 0 prints the check and the goodput: algbw = bytes / time of
its median call, busbw = algbw * 2(n-1)/n (the NCCL convention, for comparison).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import netreduce
from netreduce.tools.reference import Reference, rank_input
from nr_contract.distribution import HelpFormatter

DEFAULT_SIZE = 16 * 2**20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size", type=int, default=DEFAULT_SIZE,
                   help="bytes per rank, rounded down to whole elements (default %(default)s "
                        "= 16 MiB)")
    p.add_argument("--dtype", choices=["int32", "float32"], default="int32",
                   help="the elements' type: int32 must come back exact, float32 within the "
                        "bound of the algorithm that ran (README, \"Guarantees\")")
    p.add_argument("--algo", choices=["auto", "switch", "ring"], default="auto",
                   help="auto: the switch when the ring is registered with one (and it "
                        "takes the call), else the host ring; switch or ring: that one")
    p.add_argument("--iters", type=int, default=3,
                   help="timed calls, after one untimed warm-up call")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of the inputs: rank R's tensor comes from (seed, R)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="netreduce demo", description=__doc__,
                                formatter_class=HelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.iters < 1:
        print("netreduce demo: --iters must be at least 1", file=sys.stderr)
        return 2
    count = max(1, args.size // 4)

    netreduce.log_to_stderr()
    comm = netreduce.init()
    n, rank = comm.world_size, comm.rank
    x = rank_input([args.seed, rank], count, args.dtype)
    reference = Reference(rank_input([args.seed, r], count, args.dtype) for r in range(n))
    out = np.empty_like(x)
    times = []
    for i in range(1 + args.iters):
        t0 = time.perf_counter()
        comm.allreduce(x, algo=args.algo, out=out)
        if i:
            times.append(time.perf_counter() - t0)
        algo = str(comm.last_algo)
        failure = reference.failure(out, algo)
        if failure is not None:
            print(f"result check: FAIL on rank {rank}, call {i} (algo={algo}): {failure}",
                  flush=True)
            return 1
    if rank == 0:
        algbw = x.nbytes * 8 / statistics.median(times) / 1e9
        print(f"allreduce {args.dtype}[{count}] ({x.nbytes / 2**20:.2f} MiB) x {args.iters}, "
              f"algo={args.algo} -> {algo}: {', '.join(f'{t:.3f}' for t in times)} s",
              flush=True)
        print(f"result check: OK ({count} elements, {reference.describe(out, algo)})",
              flush=True)
        print(f"algbw {algbw:.4f} Gbit/s (busbw {algbw * 2 * (n - 1) / n:.4f}) over {n} "
              f"ranks, algo={algo}", flush=True)
    netreduce.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
