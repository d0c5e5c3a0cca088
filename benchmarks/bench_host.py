"""The host library's own CPU per allreduce call, natively (issue 41 item 5): no VM, no rxe.

    make -C netreduce/native && PYTHONPATH=$PWD python -m benchmarks.bench_host
        [--sizes 4,1K,64K,1M,16M,64M] [--dtypes int32,float32] [--ranks 2] [--budget 0.5]
        [--repeat 3] [--cprofile SIZE:DTYPE] [--in-flight K]

Ranks are threads of this process over the in-process fabric (tests/fakefabric.py: RDMA
WRITEs are memmoves, its fake switch sums each message), running the real host code
(netreduce.comm, the switch algorithm, flowctl's streams). Each rank's CPU is read per
thread (`time.thread_time_ns`), and split by the functions it was in, exclusive of their
wrapped callees (`Split`): the stand-in NIC and switch (`FakeLink._deliver`: the memmove
and the sum a real NIC and switch do without this host's CPU) and the idle polls (a poll of
a completion queue that found nothing, `arm`, `wait`: waiting, not work) are not the
library's; everything else in the call is: `library`, per call and per message (RDMA
WRITEs posted on "inc", metadata included), less the wrappers' own cost (`Split.cost`,
calibrated on a no-op). The rate one core can drive is the call's data
bytes / its library CPU. One core's copy bandwidth (`copy_bandwidth`: np.copyto of a 64 MiB
buffer, best of 5) is measured in the same run, alone and with every rank copying at once
(the rank threads' passes overlap on the machine's cores and share its memory: the rate is
compared with the latter). Figures are rank 0's, medians over the calls of a batch, of the
batch (of `--repeat`) with the least library CPU: the machine is shared, and other load
only adds. A "BENCH_HOST {...}" JSON line per size and dtype goes to stdout, then
a table; `--cprofile` prints rank 0's cProfile of that size (by own time). `--in-flight K`:
asynchronous calls, K outstanding (in_flight=K), their jobs run on the rank's own thread
(tests.ranks.RankEngine) so that its clock holds them: a call's CPU is one job run plus the
next call's submission (the next call's records posted behind this call's data included).
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import os
import pstats
import sys
import threading
import time
from collections import defaultdict
from typing import Any, Callable

import numpy as np

from flowctl.plan import FlowConfig
from flowctl.stream import Stream
from netreduce.algorithms.switch import SwitchAllreduce
from netreduce.comm import Communicator
from netreduce.inflight import IN_FLIGHT_ENV
from netreduce.meta import MetaExchange
from netreduce.tools.bench.runplan import format_size, parse_sizes
from tests.fakefabric import FakeController, FakeFabric, FakeLink
from tests.ranks import RankEngine, run_ranks

#: (label, owner, attribute): the functions whose exclusive CPU is counted apart
WRAPPED: tuple[tuple[str, Any, str], ...] = (
    ("call", Communicator, "allreduce"),          # argument checks, routing, agreement...
    ("call", RankEngine, "run_next"),             # an asynchronous call (--in-flight)
    ("meta", MetaExchange, "exchange"),           # packing and unpacking the records
    ("meta", MetaExchange, "collect"),            # the records that went ahead
    ("range", SwitchAllreduce, "local_range"),    # min/max (and block floors) pass
    ("send", SwitchAllreduce, "send"),            # the seal, copy in / quantize
    ("deliver", SwitchAllreduce, "deliver"),      # copy out / dequantize
    ("transfer", Stream, "transfer"),             # posting, polling, flow control
    ("nic", FakeLink, "_deliver"),                # the stand-in NIC and switch: not ours
    ("poll", FakeLink, "poll_sends"),
    ("poll", FakeLink, "poll_recvs"),
    ("idle", FakeLink, "arm"),
    ("idle", FakeLink, "wait"),
)
NOT_LIBRARY = ("nic", "idle")
ENTRIES = "entries"             # wrapped calls made: each costs the thread `Split.cost` ns
CONFIG = FlowConfig(collective_timeout=30.0)      # the defaults: 256 KiB messages, window 2


class Split:
    """Per thread, CPU nanoseconds by label, each function's exclusive of the wrapped
    functions it called; a poll that returned nothing counts as "idle". Invariant: while
    `on`, the labels' sum is the thread CPU spent inside the outermost wrapped calls."""

    def __init__(self) -> None:
        self.on = False
        self._local = threading.local()

    def cost(self, calls: int = 20000) -> float:
        """CPU ns one wrapped call adds (the thread clock read twice, the bookkeeping):
        measured on a no-op, so that `summarize` takes it off the library's figure."""
        def noop() -> None:
            return None
        timed = self.wrap("calibration", noop)
        was, self.on = self.on, True
        t0 = time.thread_time_ns()
        for _ in range(calls):
            noop()
        t1 = time.thread_time_ns()
        for _ in range(calls):
            timed()
        t2 = time.thread_time_ns()
        self.on = was
        self.counts().clear()
        return max(0.0, ((t2 - t1) - (t1 - t0)) / calls)

    def counts(self) -> dict[str, int]:
        if not hasattr(self._local, "ns"):
            self._local.ns, self._local.stack = defaultdict(int), []
        return self._local.ns

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            ns = self.counts()
            stack: list[int] = self._local.stack
            stack.append(0)                      # CPU of wrapped callees
            t0 = time.thread_time_ns()
            result = None
            try:
                result = fn(*args, **kwargs)
                return result
            finally:
                spent = time.thread_time_ns() - t0
                inner = stack.pop()
                name = "idle" if label == "poll" and not result else label
                ns[name] += spent - inner
                ns[ENTRIES] += 1
                if stack:
                    stack[-1] += spent
        return timed

    def install(self) -> Callable[[], None]:
        """Wrap every function of `WRAPPED`; returns the undo."""
        saved = [(owner, attr, owner.__dict__[attr]) for _, owner, attr in WRAPPED]
        for label, owner, attr in WRAPPED:
            setattr(owner, attr, self.wrap(label, owner.__dict__[attr]))

        def undo() -> None:
            for owner, attr, fn in saved:
                setattr(owner, attr, fn)
        return undo


def copy_bandwidth(nbytes: int = 64 << 20, repeat: int = 5) -> float:
    """One core's copy bandwidth in bytes/s: np.copyto of `nbytes` between two buffers
    (each byte read once and written once), the best of `repeat`."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best


def calls_for(nbytes: int, budget: float) -> int:
    """Calls timed at one size: about `budget` seconds at 1 GB/s, 5..200."""
    return int(min(200, max(5, budget * 1e9 / max(nbytes, 1))))


def rank_body(split: Split, sizes: list[int], dtypes: list[str], budget: float,
              profile: tuple[int, str] | None, together: threading.Barrier,
              repeat: int, in_flight: int = 1) -> Callable[[Communicator, Any], list[dict]]:
    def body(comm: Communicator, host: Any) -> list[dict]:
        rows = []
        engine = comm._engine = RankEngine(f"bench rank {comm.rank}")
        overhead = split.cost()
        together.wait()
        busy = copy_bandwidth()         # every rank copies at once, as their calls overlap
        rng = np.random.default_rng(comm.rank)
        for dtype in dtypes:
            for nbytes in sizes:
                count = max(1, nbytes // np.dtype(dtype).itemsize)
                data = (rng.integers(-1000, 1000, count) if dtype == "int32"
                        else rng.standard_normal(count)).astype(dtype)
                out = np.empty_like(data)
                for _ in range(2):                              # warm-up: workspace grown
                    comm.allreduce(data, algo="switch", out=out)
                inc = comm._streams["inc"]
                calls, batches = calls_for(data.nbytes, budget), []

                def submit() -> Any:
                    return comm.allreduce(data, algo="switch", out=out, async_op=True)
                for _ in range(repeat):
                    per_call, posted = [], inc.next_send_index
                    works = [submit() for _ in range(in_flight - 1)]
                    for _ in range(calls):
                        ns = split.counts()
                        ns.clear()
                        t0 = time.thread_time_ns()
                        if in_flight > 1:        # this call's job, the next one submitted
                            works.append(submit())
                            engine.run_next()
                            works.pop(0).wait(0)
                        else:
                            comm.allreduce(data, algo="switch", out=out)
                        total = time.thread_time_ns() - t0
                        per_call.append({**ns, "thread": total})
                    for work in works:          # untimed: the calls left outstanding
                        engine.run_next()
                        work.wait(0)
                    batches.append(summarize(per_call, dtype, data.nbytes,
                                             (inc.next_send_index - posted) / calls, overhead))
                row = min(batches, key=lambda b: b["library_us"])
                if profile == (nbytes, dtype):          # every rank calls; rank 0's kept
                    row["cprofile"] = profiled(lambda: comm.allreduce(data, algo="switch",
                                                                      out=out), calls)
                rows.append(row | {"busy_copy_gbps": busy * 8 / 1e9})
        return rows
    return body


def summarize(per_call: list[dict], dtype: str, nbytes: int, messages: float,
              overhead: float = 0.0) -> dict:
    """Median µs per call of each label, the library's (all labels but `NOT_LIBRARY`, less
    `overhead` ns per wrapped call: the measurement's own), per message, and the rate one
    core drives (data bits / library CPU)."""
    labels = sorted({k for c in per_call for k in c} - {"thread", ENTRIES})
    med = {k: float(np.median([c.get(k, 0) for c in per_call])) / 1e3 for k in labels}
    library = float(np.median([
        sum(v for k, v in c.items() if k not in (*NOT_LIBRARY, "thread", ENTRIES))
        - overhead * c.get(ENTRIES, 0) for c in per_call])) / 1e3
    return {"dtype": dtype, "bytes": nbytes, "calls": len(per_call), "messages": messages,
            "library_us": library, "per_message_us": library / max(messages, 1),
            "gbps": nbytes * 8 / (library * 1e3), "overhead_ns": overhead, "thread_us":
            float(np.median([c["thread"] for c in per_call])) / 1e3,
            "split_us": med}


def profiled(call: Callable[[], Any], calls: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
    return out.getvalue()


def measure(sizes: list[int], dtypes: list[str], ranks: int = 2, budget: float = 0.5,
            profile: tuple[int, str] | None = None, repeat: int = 3,
            in_flight: int = 1) -> list[dict]:
    """Rank 0's rows (see the module doc), one per dtype and size."""
    split = Split()
    undo = split.install()
    split.on = True
    fabric = FakeFabric()
    was = os.environ.get(IN_FLIGHT_ENV)
    os.environ[IN_FLIGHT_ENV] = str(in_flight)      # the communicators run_ranks builds
    try:
        results = run_ranks(ranks, rank_body(split, sizes, dtypes, budget, profile,
                                             threading.Barrier(ranks), repeat, in_flight),
                            cfg=CONFIG, fabric=fabric, controller=FakeController(fabric))
    finally:
        split.on = False
        undo()
        if was is None:
            del os.environ[IN_FLIGHT_ENV]
        else:
            os.environ[IN_FLIGHT_ENV] = was
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results[0]


def table(rows: list[dict], copy_bps: float) -> str:
    busy = rows[0]["busy_copy_gbps"] if rows else 0.0
    lines = [f"one core's copy bandwidth: {copy_bps / 1e9:.2f} GB/s "
             f"({copy_bps * 8 / 1e9:.1f} Gbit/s) alone, {busy / 8:.2f} GB/s while every rank "
             f"copies (\"of copy\": the rate over the latter)",
             f"{'dtype':8}{'size':>10}{'msgs':>6}{'library us':>12}{'us/msg':>9}"
             f"{'Gbit/s':>9}{'of copy':>9}  top of the split (us)"]
    for r in rows:
        top = sorted(((v, k) for k, v in r["split_us"].items() if k not in NOT_LIBRARY),
                     reverse=True)[:3]
        lines.append(f"{r['dtype']:8}{format_size(r['bytes']):>10}{r['messages']:>6.1f}"
                     f"{r['library_us']:>12.1f}{r['per_message_us']:>9.1f}{r['gbps']:>9.2f}"
                     f"{r['gbps'] / r['busy_copy_gbps']:>9.2f}  "
                     + ", ".join(f"{k} {v:.1f}" for v, k in top))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,1K,64K,256K,1M,4M,16M,64M")
    parser.add_argument("--dtypes", default="int32,float32")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--budget", type=float, default=0.5,
                        help="seconds of data (at 1 GB/s) per size")
    parser.add_argument("--repeat", type=int, default=3,
                        help="batches per size: the one of least library CPU is reported")
    parser.add_argument("--cprofile", default=None, help="SIZE:DTYPE: rank 0's cProfile")
    parser.add_argument("--in-flight", type=int, default=1, metavar="K",
                        help="asynchronous calls outstanding (module doc)")
    args = parser.parse_args(argv)
    profile = None
    if args.cprofile:
        size, _, dtype = args.cprofile.partition(":")
        profile = (parse_sizes(size)[0], dtype or "int32")
    copy_bps = copy_bandwidth()
    rows = measure(parse_sizes(args.sizes), args.dtypes.split(","), args.ranks, args.budget,
                   profile, args.repeat, args.in_flight)
    for row in rows:
        print("BENCH_HOST " + json.dumps({k: v for k, v in row.items() if k != "cprofile"}
                                         | {"copy_gbps": copy_bps * 8 / 1e9}))
    print(table(rows, copy_bps))
    for row in rows:
        if "cprofile" in row:
            print(row["cprofile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
