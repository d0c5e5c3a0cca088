"""One rank of a lab transport-fault test (issue 40), run by `netreduce.tools.launch`:

    fault_worker.py --calls N --size N [--algo A] [--no-switch] [--expect-fault]
                    [--kill RING --victim R --at K --delay S] [--late S] [--until-fault M]
                    [--ack-timeout E] [--async-pairs]

`--calls` calls of int32[size] (checked exactly against every rank's input, out= a fresh
array, the input untouched); with `--kill`, rank R moves its RING QPs ("inc" or "ring") to
ERROR `--delay` s into call K, from a timer thread (as a NIC reset would); with `--late`,
rank R begins call K S s late (a straggler: a checkpoint, a slow step). Prints
"CALL i algo seconds" per call (with `--until-switch`, more calls until one goes
through the switch), rank 0 "AT CALL i" before call i (the link-dark test's
cue), then STATS and "OK faults". Under algo "switch" a call refused while the switch
is away (`SwitchUnavailable`, alike on every rank) runs again with algo "auto", as the DDP
hook does ("REFUSED i"): only a call over the ring brings the job back to the switch.
With `--expect-fault` a call that fails prints "FAILED i seconds: error", finalize()
returns ("FINALIZED") and the rank exits 0. With `--until-fault M`, after each call
from `--calls` on the ranks sum their transport fault counts (a one-element call): the
first time it is not 0 rank 0 prints "FAULT SEEN i" and the job runs 4 more calls; at M
calls without one, it ends there (the test names the counters). With `--async-pairs` every call is
asynchronous and waited for once the next one is issued (in_flight=2; CALL lines say "async"), "DONE [...]" the order they completed in.
Every rank prints "HW"
with its rxe hw_counters that moved during the job.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import numpy as np

import netreduce
from netreduce.tools.reference import rank_input
from ring_setup.device import hw_counters

AFTER_FAULT = 4     # calls run after the first fault was seen (--until-fault)


def faults_seen(comm: netreduce.Communicator) -> int:
    """Transport faults every rank counted so far, summed (the same on every rank)."""
    mine = np.array([comm.stats()["transport"]["faults"]], dtype=np.int32)
    return int(comm.allreduce(mine, algo="auto")[0])


def checked_call(comm: netreduce.Communicator, args: argparse.Namespace, i: int,
                 x: np.ndarray, y: np.ndarray, dt: float) -> None:
    """Call i's result exact (numpy's sum of every rank's input), its input untouched; its
    CALL line names its algorithm ("async" with --async-pairs: `last_algo` is a later
    call's)."""
    want = sum(rank_input([r, args.size, i], args.size, "int32").astype(np.int64)
               for r in range(comm.world_size)).astype(np.int32)
    algo = "async" if args.async_pairs else comm.last_algo
    if not np.array_equal(y, want) or \
            not np.array_equal(x, rank_input([comm.rank, args.size, i], args.size, "int32")):
        sys.exit(f"FAIL call {i}: int32[{args.size}] not exact ({algo})")
    print(f"CALL {i} {algo} {dt:.2f}", flush=True)


def run(comm: netreduce.Communicator, args: argparse.Namespace) -> None:
    start, i = time.monotonic(), -1
    pending: list[tuple] = []       # --async-pairs: the calls issued, not yet waited for
    done: list[int] = []            # --async-pairs: the calls in the order they completed
    hw0 = hw_counters(comm.device)
    while i + 1 < args.calls:
        i += 1
        if comm.rank == 0:
            print(f"AT CALL {i}", flush=True)
        if args.kill and i == args.at and comm.rank == args.victim:
            qps = comm._faults._qps if args.kill == "ring" else comm._away._inc
            threading.Timer(args.delay, qps.to_error).start()
        if args.late and i == args.at and comm.rank == args.victim:
            time.sleep(args.late)
        x = rank_input([comm.rank, args.size, i], args.size, "int32")
        y = np.full(x.shape, -1, dtype=np.int32)
        t0 = time.perf_counter()
        if args.async_pairs:
            work = comm.allreduce(x, out=y, algo=args.algo, async_op=True)
            work.add_done_callback(lambda _, i=i: done.append(i))
            pending.append((i, x, y, t0, work))
            while len(pending) > (0 if i + 1 == args.calls else 1):    # the oldest, in turn
                j, xj, yj, tj, work = pending.pop(0)
                work.wait()
                checked_call(comm, args, j, xj, yj, time.perf_counter() - tj)
            continue
        algo = args.algo
        while True:
            try:
                comm.allreduce(x, out=y, algo=algo)
                break
            except netreduce.SwitchUnavailable:
                print(f"REFUSED {i}", flush=True)
                algo = "auto"
            except netreduce.CommunicatorError as exc:
                if not args.expect_fault:
                    raise
                print(f"FAILED {i} {time.perf_counter() - t0:.2f}: {type(exc).__name__}: "
                      f"{exc}", flush=True)
                return
        checked_call(comm, args, i, x, y, time.perf_counter() - t0)
        if args.until_fault and i == args.calls - 1 and i + 1 < args.until_fault:
            if faults_seen(comm):
                if comm.rank == 0:
                    print(f"FAULT SEEN {i}", flush=True)
                args.calls, args.until_fault = i + 1 + AFTER_FAULT, 0
            else:
                args.calls += 1
        if i == args.calls - 1 and comm.last_algo != "switch" and args.until_switch:
            args.calls += 1     # alike on every rank: routes are
            if time.monotonic() - start > args.until_switch:
                sys.exit(f"FAIL: not back on the switch {args.until_switch:g} s after start")
    if args.async_pairs:
        print(f"DONE {json.dumps(done)}", flush=True)
    print(f"STATS {json.dumps(comm.stats(), sort_keys=True)}", flush=True)
    hw = hw_counters(comm.device)
    print(f"HW {json.dumps({k: v - hw0.get(k, 0) for k, v in hw.items() if v != hw0.get(k)})}",
          flush=True)
    print("OK faults", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--size", type=int, default=1 << 20)
    p.add_argument("--algo", default="auto")
    p.add_argument("--no-switch", action="store_true", help="no switch: the host ring only")
    p.add_argument("--kill", choices=["inc", "ring"], help="the ring whose QPs go to ERROR")
    p.add_argument("--victim", type=int, default=2)
    p.add_argument("--at", type=int, default=2, help="the call during which they do")
    p.add_argument("--delay", type=float, default=0.3, help="s into that call")
    p.add_argument("--late", type=float, default=0.0, help="rank R begins call K S s late")
    p.add_argument("--expect-fault", action="store_true", help="a failed call ends the "
                   "loop: FAILED, then finalize()")
    p.add_argument("--until-switch", type=float, default=0.0, help="after the calls, more "
                   "until one goes through the switch, for up to S s from the start")
    p.add_argument("--until-fault", type=int, default=0, help="more calls (up to M in all) "
                   "until some rank counted a transport fault, then 4 more")
    p.add_argument("--async-pairs", action="store_true", help="async calls, two in flight "
                   "(in_flight=2; not with --until-fault, --until-switch)")
    p.add_argument("--ack-timeout", type=int, help="the QPs' ACK timeout exponent")
    args = p.parse_args()
    netreduce.log_to_stderr()
    comm = netreduce.init(switch="" if args.no_switch else None, collective_timeout=300,
                          ack_timeout=args.ack_timeout, in_flight=2 if args.async_pairs else None)
    print(f"joined {comm!r}", flush=True)
    run(comm, args)
    netreduce.finalize()
    print("FINALIZED", flush=True)


if __name__ == "__main__":
    main()
