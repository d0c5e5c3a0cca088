"""One rank of a lab allreduce test, run by `python -m netreduce.launch` (one per host).

    allreduce_worker.py correctness [--sizes N,N,...] [--timed N]
    allreduce_worker.py mismatch {count|dtype}
    allreduce_worker.py missing-rank --timeout S
    allreduce_worker.py stall --stall S
    allreduce_worker.py inc-spec

Prints "OK ..." lines the tests look for; a failed check exits non-zero with the reason.
Every rank's data is a function of its rank, so each rank computes the reference itself.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

import netreduce
from ring_setup.device import hw_counters


def rank_data(rank: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng(7919 * rank + count)
    if dtype == "int32":
        return rng.integers(-(2**20), 2**20, count, dtype=np.int32)
    return rng.standard_normal(count, dtype=np.float32)


def check(world: int, count: int, dtype: str, got: np.ndarray) -> None:
    """int32: exactly numpy's sum. float32: within the rounding of n-1 float32 additions of
    the float64 sum: |got - want| <= n * 2^-24 * sum(|x_i|) element-wise (n-1 would do)."""
    stack = np.stack([rank_data(r, count, dtype) for r in range(world)])
    if dtype == "int32":
        want = stack.sum(axis=0, dtype=np.int32)
        bad = np.flatnonzero(got != want)
    else:
        want = stack.astype(np.float64).sum(axis=0)
        bound = world * 2.0**-24 * np.abs(stack).astype(np.float64).sum(axis=0)
        bad = np.flatnonzero(np.abs(got - want) > bound)
    if bad.size:
        sys.exit(f"FAIL {dtype}[{count}]: {bad.size} bad elements, first {bad[:5].tolist()}: "
                 f"got {got[bad[:5]].tolist()}, want {want[bad[:5]].tolist()}")


def correctness(comm: netreduce.Communicator, sizes: list[int], timed: int) -> None:
    n = comm.world_size
    for count in sizes:
        for dtype in ("int32", "float32"):
            x = rank_data(comm.rank, count, dtype)
            if count % 2:                                  # odd sizes: in place
                t0 = time.perf_counter()
                got = comm.allreduce(x)
                dt = time.perf_counter() - t0
                assert got is x
            else:                                          # even sizes: into `out`
                out = np.empty_like(x)
                t0 = time.perf_counter()
                got = comm.allreduce(x, out=out)
                dt = time.perf_counter() - t0
                if not np.array_equal(x, rank_data(comm.rank, count, dtype)):
                    sys.exit(f"FAIL {dtype}[{count}]: the input changed although out= was given")
            check(n, count, dtype, got)
            if count == timed:
                nbytes = x.nbytes
                algbw = nbytes / dt
                print(f"TIME n={n} {dtype}[{count}] {nbytes / 2**20:.1f} MiB: {dt:.2f} s, "
                      f"algbw {algbw * 8 / 1e9:.4f} Gbit/s, busbw "
                      f"{algbw * 2 * (n - 1) / n * 8 / 1e9:.4f} Gbit/s", flush=True)
    print(f"COUNTERS {json.dumps(hw_counters(comm.device))}", flush=True)
    print(f"OK correctness n={n} sizes={sizes} algo={comm.last_algo}", flush=True)


def mismatch(comm: netreduce.Communicator, what: str) -> None:
    last = comm.rank == comm.world_size - 1
    count = 1000 + (1 if last and what == "count" else 0)
    dtype = np.float32 if last and what == "dtype" else np.int32
    x = np.ones(count, dtype=dtype)
    try:
        comm.allreduce(x)
    except netreduce.AllreduceMismatch as exc:
        print(f"ERROR {exc}", flush=True)
    else:
        sys.exit("FAIL: a mismatched allreduce succeeded")
    if not np.all(x == 1):
        sys.exit("FAIL: a mismatched allreduce changed the data")
    y = np.ones(10, dtype=np.int32)
    comm.allreduce(y)
    if not np.all(y == comm.world_size):
        sys.exit(f"FAIL: the allreduce after the mismatch gave {y.tolist()}")
    print("OK mismatch", flush=True)


def stall(comm: netreduce.Communicator, seconds: float) -> None:
    """The last rank never calls allreduce: the others must fail with a stall report."""
    if comm.rank == comm.world_size - 1:
        time.sleep(seconds + 5)
        print("OK idle", flush=True)
        return
    try:
        comm.allreduce(np.ones(1000, dtype=np.int32))
    except netreduce.FlowError as exc:
        print(f"ERROR {exc}", flush=True)
    else:
        sys.exit("FAIL: allreduce completed although a rank never called it")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["correctness", "mismatch", "missing-rank", "stall",
                                    "inc-spec"])
    p.add_argument("what", nargs="?", default="count")
    p.add_argument("--sizes", default="1,1000,256,4194304")
    p.add_argument("--timed", type=int, default=4194304)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--stall", type=float, default=30.0, help="stall timeout, seconds")
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    if args.mode == "missing-rank":
        if rank == world - 1:
            print("not joining", flush=True)
            return
        try:
            netreduce.init(timeout=args.timeout)
        except netreduce.RendezvousTimeout as exc:
            print(f"ERROR {exc}", flush=True)
            return
        sys.exit("FAIL: init succeeded without the last rank")

    comm = netreduce.init(timeout=args.timeout, stall_timeout=args.stall)
    print(f"joined {comm!r} ip={comm.inc_ring_spec().connections[rank].src_ip}", flush=True)
    if args.mode == "correctness":
        correctness(comm, [int(s) for s in args.sizes.split(",")], args.timed)
    elif args.mode == "mismatch":
        mismatch(comm, args.what)
    elif args.mode == "stall":
        stall(comm, args.stall)
    else:
        print(f"SPEC {comm.inc_ring_spec().to_json()}", flush=True)
    netreduce.finalize()


if __name__ == "__main__":
    main()
