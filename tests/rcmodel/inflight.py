"""Calls in flight in the RC model (issue 41): K asynchronous int32 calls outstanding, as
nccl-tests' aggregated iterations, with the real host code on the simulated clock -- the
curves of `netreduce bench --in-flight K` without the VM, to 1024 ranks.

    nice -n 10 python -m tests.rcmodel.inflight --ranks 4 64 1024 --sizes 65536 262144

The model schedules one thread per rank (rcmodel.sim.Turns), so each rank runs its
progress engine's jobs itself (`RankEngine`): it keeps K calls submitted, runs the oldest,
submits the next; the call the engine runs sees the next one queued, as the progress thread
does. Reported per configuration: the simulated time per call in steady state (the
stream's pace: bytes / time = its throughput; the last call, with no records behind its
data, left out) and each call's latency from its submission (about K times that), every
result checked against numpy.

`formula_in_flight_us`, the closed form: with K >= 2 the next call's records travel right
behind this call's data (netreduce/comm.py), so a call costs rcmodel.scale's switch
formula less the metadata bank's round trip (2 links and its last packet's store and
forward): the bank's bytes still cross the host link, its latency is hidden -- where data
and records fit the "inc" window together (else they go after, as with K = 1).
"""
from __future__ import annotations

import argparse
import json
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np

from netreduce.comm import Communicator
from netreduce.meta import RECORD_STRIDE
from netreduce.progress import Work
from tests.rcmodel.calls import data
from tests.rcmodel.scale import CONFIG, LATENCY_S, _stream, _us, formula_switch_time_us
from tests.ranks import RankEngine
from tests.rcmodel.world import World

WARMUP = 2          # calls before the steady state is timed


@dataclass(frozen=True)
class Point:
    n: int
    size: int               # bytes per call (int32)
    k: int
    calls: int
    per_call_us: float      # steady state: simulated time per call
    latency_us: float       # mean submission -> completion
    gbps: float             # size / per_call
    exact: bool


def run(n: int, size: int, k: int, calls: int = 8, world: World | None = None) -> Point:
    """`calls` (>= WARMUP + 2) int32 calls of `size` bytes with `k` outstanding on every
    rank of a one-switch model world (in_flight=k)."""
    count = size // 4
    world = world or World(n, CONFIG, max_ranks=n if n > 32 else None, in_flight=k)

    def body(comm: Communicator) -> tuple[list[float], list[float], bool]:
        engine = RankEngine(f"model rank {comm.rank}")
        comm._engine = engine
        clock = world.sim.monotonic
        queue: deque[tuple[int, float, Work, np.ndarray]] = deque()
        done, waited, exact = [], [], True
        for c in range(calls + k - 1):
            if c < calls:
                x = data(comm.rank, count) + c
                queue.append((c, clock(), comm.allreduce(x, async_op=True), x))
            if len(queue) == k or c >= calls:
                first, submitted, work, x = queue.popleft()
                engine.run_next()
                work.wait(0)
                done.append(clock())
                waited.append(clock() - submitted)
                expect = sum(data(r, count).astype(np.int64) + first for r in range(n))
                exact &= np.array_equal(x, expect.astype(np.int32))
        return done, waited, exact

    results = world.run(body)
    bad = [r for r in results if isinstance(r, BaseException)]
    if bad:
        raise bad[0]
    ends = np.max([r[0] for r in results], axis=0)
    # steady state: the calls after the warm-up but the last, each with the next call's
    # records behind its data (the last one has none: it ends early)
    per_call = (ends[-2] - ends[WARMUP - 1]) / (calls - WARMUP - 1)
    latency = float(np.mean([np.mean(r[1][WARMUP:]) for r in results]))
    return Point(n, size, k, calls, per_call * 1e6, latency * 1e6, size * 8 / per_call / 1e9,
                 all(r[2] for r in results))


def formula_in_flight_us(size: int, n: int, k: int) -> float:
    """The closed form of a call's time in steady state through one switch (module doc):
    K = 1 is rcmodel.scale's switch call; K >= 2 drops the metadata bank's latency, keeping
    its serialisation (when data and bank fit the window; counted from the sizes, not with
    flowctl's planner)."""
    whole = formula_switch_time_us("1sw", size, n)
    fits = -(-(size + 4 * n) // CONFIG.msg_size) + -(-n * RECORD_STRIDE // CONFIG.msg_size) \
        <= CONFIG.window
    if k == 1 or not fits:
        return whole
    _, bank_last = _stream(n * RECORD_STRIDE, CONFIG)
    return whole - 2 * LATENCY_S * 1e6 - _us(bank_last)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4])
    parser.add_argument("--sizes", type=int, nargs="+", default=[65536, 262144, 1 << 20])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--json", help="write the points here")
    args = parser.parse_args(argv)
    points = []
    for n in args.ranks:
        for size in args.sizes:
            for k in args.k:
                p = run(n, size, k, args.calls)
                points.append(p)
                print(f"n={n:5d} {size:>9d} B K={k}: {p.per_call_us:9.1f} us/call "
                      f"(closed form {formula_in_flight_us(size, n, k):9.1f}), "
                      f"{p.gbps:5.2f} Gbit/s, latency {p.latency_us:9.1f} us, "
                      f"exact {p.exact}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(p) for p in points], f, indent=1)


if __name__ == "__main__":
    main()
