"""Where an allreduce call's time goes, on every rank of a lab job (issue 23).

    scripts/lab.sh --hosts 4 -- netreduce launch --hosts 4 -- python -m benchmarks.profile_call \
        --calls 100 --out .lab/profile                                         (one line)

Per algorithm (switch, ring), `--calls` back-to-back int32 calls of `--count` elements, after
a barrier: the time per call, each rank's rxe packets per call (hw_counters), and the
call's phases, timed by wrapping the library's own functions in this process (nothing of
netreduce is changed): the whole call (`Communicator._execute`), the metadata exchange
(`MetaExchange.exchange`), the algorithm (`*.run`; the switch's own steps: its min/max
pass `local_range`, `send` -- the copy in, then the data's transfer -- and `deliver`, the
copy out), every `Stream.transfer` (how many
per call, how long) and every sleep of a stream on its completion channel (`Link.wait`:
how many per call, how long) -- a sleep is a wait for the network or for another rank.
Then rank 0 runs the same calls under cProfile (wall clock) and under py-spy (`--py-spy`,
raw folded stacks of every thread, idle included, written to OUT/py-spy-rank0.txt). One
JSON line per rank and algorithm ("PROFILE {...}") and the profiles go to stdout / OUT.
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import os
import pstats
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

import netreduce
from flowctl.stream import Stream
from netreduce.algorithms.ring import RingAllreduce
from netreduce.algorithms.switch import SwitchAllreduce
from netreduce.comm import Communicator
from netreduce.meta import MetaExchange
from ring_setup.device import hw_counters

PHASES: dict[str, tuple[Any, str]] = {
    "call": (Communicator, "_execute"),
    "meta": (MetaExchange, "exchange"),
    "switch.run": (SwitchAllreduce, "run"),
    "switch.range": (SwitchAllreduce, "local_range"),    # the min/max (and block) pass
    "switch.send": (SwitchAllreduce, "send"),     # copy in (or quantize), then the transfer
    "switch.deliver": (SwitchAllreduce, "deliver"),   # copy out (or dequantize)
    "ring.run": (RingAllreduce, "run"),
    "transfer": (Stream, "transfer"),
}


class Phases:
    """Counts and total seconds of each wrapped function while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.count: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.count[name] += 1
                self.seconds[name] += time.perf_counter() - t0
        return timed

    def install(self, comm: Communicator) -> None:
        for name, (owner, attr) in PHASES.items():
            setattr(owner, attr, self.wrap(name, getattr(owner, attr)))
        for ring, stream in comm._streams.items():      # the link's sleeps, per ring
            stream.link.wait = self.wrap(f"wait.{ring}", stream.link.wait)  # type: ignore

    def reset(self) -> None:
        self.count.clear()
        self.seconds.clear()

    def per_call(self, calls: int) -> dict[str, dict[str, float]]:
        return {name: {"count": self.count[name] / calls,
                       "ms": self.seconds[name] * 1e3 / calls} for name in sorted(self.count)}


def calls(comm: Communicator, algo: str, x: np.ndarray, out: np.ndarray, n: int) -> None:
    for _ in range(n):
        comm.allreduce(x, algo=algo, out=out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--count", type=int, default=1, help="int32 elements per call")
    ap.add_argument("--algos", default="switch,ring")
    ap.add_argument("--out", type=Path, default=Path(".lab/profile"))
    ap.add_argument("--py-spy", action="store_true", help="rank 0: also record with py-spy")
    args = ap.parse_args()
    comm = netreduce.init()
    rank, n = comm.rank, comm.world_size
    x = np.full(args.count, rank + 1, dtype=np.int32)
    out = np.empty_like(x)
    barrier = np.zeros(1, dtype=np.int32)
    phases = Phases()
    phases.install(comm)
    algos = [a for a in args.algos.split(",") if a != "switch" or comm.switch.registered]
    for algo in algos:
        calls(comm, algo, x, out, 5)                              # warm up
        comm.allreduce(barrier, algo="ring")
        before = hw_counters(comm.device)
        phases.reset()
        phases.on = True
        t0 = time.perf_counter()
        calls(comm, algo, x, out, args.calls)
        seconds = time.perf_counter() - t0
        phases.on = False
        after = hw_counters(comm.device)
        if not np.array_equal(out, np.full_like(x, n * (n + 1) // 2)):
            print(f"rank {rank}: {algo}: wrong sum {out[:4]}", file=sys.stderr)
            return 1
        moved = {k: (v - before.get(k, 0)) / args.calls for k, v in after.items()
                 if v != before.get(k, 0)}
        print("PROFILE " + json.dumps({"rank": rank, "algo": algo, "calls": args.calls,
                                       "ms_per_call": seconds * 1e3 / args.calls,
                                       "phases": phases.per_call(args.calls),
                                       "rxe_per_call": moved}), flush=True)
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
    for algo in algos:
        comm.allreduce(barrier, algo="ring")
        if rank != 0:
            calls(comm, algo, x, out, args.calls)
            continue
        prof = cProfile.Profile(time.perf_counter)
        prof.enable()
        calls(comm, algo, x, out, args.calls)
        prof.disable()
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(25)
        (args.out / f"cprofile-{algo}-rank0.txt").write_text(text.getvalue())
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if args.py_spy and os.path.exists(spy):
        for algo in algos:
            comm.allreduce(barrier, algo="ring")
            record = None
            if rank == 0:
                path = args.out / f"py-spy-{algo}-rank0.txt"
                record = subprocess.Popen(
                    [spy, "record", "--pid", str(os.getpid()), "--rate", "200", "--idle",
                     "--threads", "--format", "raw", "--nonblocking", "-o", str(path)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                time.sleep(2.0)                                   # py-spy attaches
            comm.allreduce(barrier, algo="ring")
            calls(comm, algo, x, out, args.calls)
            if record is not None:
                record.send_signal(2)                             # SIGINT: py-spy writes
                _, err = record.communicate(timeout=60)
                print(f"py-spy ({algo}): exit {record.returncode}: "
                      f"{err.decode(errors='replace').strip()[-300:]}", flush=True)
    netreduce.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
