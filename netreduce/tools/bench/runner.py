"""The parent of `netreduce bench`: launches one worker per lab host, gathers their records
while showing progress, prints the SwitchML-style lines, the statistics, the table of rates
and ratios, and writes the JSON document and the figure."""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, TypeVar

from netreduce.tools.bench.gather import RankLines, meta
from netreduce.tools.bench.runplan import (ALGOS, DTYPES, SWEEP, BenchPlan, parse_algos,
                                        parse_iters, parse_size, parse_sizes)
from netreduce.tools.bench.progressbar import Progress
from netreduce.tools.bench.results import document, latency_table, table
from netreduce.tools.bench.tenants import TENANT_TOKENS_ENV, run_tenants
from netreduce.tools.launch import launch
from nr_contract.tokens import ADDR_ENV
from ring_setup.store_protocol import DEFAULT_PORT

DEFAULT_SIZES = "256K,1M,4M,16M"
T = TypeVar("T")


def default_algos() -> list[str]:
    """switch and ring where a switch controller is announced ($NR_CONTROLLER), else ring."""
    return ["switch", "ring"] if os.environ.get(ADDR_ENV) else ["ring"]


def _option(parse: Callable[[str], T]) -> Callable[[str], T]:
    """`parse` as an argparse type: its ValueError's own message is the error shown."""
    def option(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return option


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=int(os.environ.get("NR_LAB_HOSTS") or 4),
                   help="ranks, one per lab host (default %(default)s: $NR_LAB_HOSTS, the "
                        "lab's hosts, else 4)")
    p.add_argument("--sizes", type=_option(parse_sizes), default=None,
                   help=f"comma-separated message sizes in bytes, K/M/G suffixes binary, or "
                        f"MIN:MAX:FACTOR ranges (default {DEFAULT_SIZES}; {SWEEP} with "
                        f"--sweep)")
    p.add_argument("--sweep", action="store_true",
                   help=f"the latency sweep, nccl-tests style: sizes {SWEEP} (4 B .. 16 MiB "
                        f"by powers of 4) unless --sizes is given, --iters auto, --rtt")
    p.add_argument("--iters", type=_option(parse_iters), default=None, metavar="N|auto",
                   help="calls per timed job, back to back; the job reports its time per "
                        "call (default 1; auto with --sweep: up to 16 at small sizes)")
    p.add_argument("--rtt", action="store_true",
                   help="also measure the lab's RC round trip (ranks 0 and 1 ping-pong an "
                        "8-byte RDMA WRITE WITH IMMEDIATE through the switch) and count "
                        "each algorithm's time per call in round trips (on with --sweep)")
    p.add_argument("--dtype", choices=DTYPES, default="int32",
                   help="the elements' type (the inputs: int32 uniform in [-2^20, 2^20), "
                        "float32 standard normal)")
    p.add_argument("--algos", type=_option(parse_algos), default=None,
                   help=f"comma-separated allreduce algorithms from {','.join(ALGOS)} "
                        f"(default: switch,ring if ${ADDR_ENV} is set, else ring; "
                        f"switch-call: float32 through the switch with one quantization "
                        f"scale per call, as before per-block scales, to compare with "
                        f"switch in one run)")
    p.add_argument("--jobs", type=int, default=5, help="timed jobs per size and algorithm")
    p.add_argument("--in-flight", type=int, default=1, metavar="K",
                   help="asynchronous calls outstanding per allreduce job (K > 1: the "
                        "stream's time per call and each call's latency; --iters defaults "
                        "to 8 K)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed jobs per size and algorithm before the timed ones")
    p.add_argument("--window", type=int, default=2,
                   help="messages in flight per connection (default %(default)s: 128 packets "
                        "with 256K messages, within the 256 slots a ring gets by default)")
    p.add_argument("--msg-size", type=_option(parse_size), default="256K",
                   help="flow-control message size, a multiple of --mtu")
    p.add_argument("--mtu", type=int, default=4096, help="RoCE path MTU (bytes)")
    p.add_argument("--ack-timeout", type=int, default=None, metavar="EXP",
                   help="the QPs' local ACK timeout, 4.096 us x 2^EXP (rxe's retransmit timer; "
                        "default: netreduce.init's, 14 = 67 ms, or the target's pace)")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of the inputs (each rank's: seed, rank, size)")
    p.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    p.add_argument("--plot", type=Path, metavar="PATH", help="write algbw vs size as PNG")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help="the ranks' rendezvous port (MASTER_PORT)")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds the whole run may take")
    p.add_argument("--tenants", type=int, default=1, metavar="T",
                   help="run T independent jobs at once, each on its own share of the "
                        "--workers hosts, with its own ring and principal; report each "
                        "one's results, the aggregate and each one's share "
                        "(netreduce.tools.bench.tenants)")
    p.add_argument("--tenant-tokens", metavar="F1,F2,...",
                   help=f"with --tenants: each tenant's controller token file (default "
                        f"${TENANT_TOKENS_ENV}, set by the lab)")


def plan_of(args: argparse.Namespace) -> BenchPlan:
    algos = args.algos or default_algos()
    sizes = args.sizes or parse_sizes(SWEEP if args.sweep else DEFAULT_SIZES)
    iters = args.iters if args.iters is not None else 0 if args.sweep else \
        8 * args.in_flight if args.in_flight > 1 else 1
    return BenchPlan(workers=args.workers, sizes=tuple(sizes), algos=tuple(algos),
                     dtype=args.dtype, jobs=args.jobs, warmup=args.warmup,
                     window=args.window, msg_size=args.msg_size, mtu=args.mtu,
                     seed=args.seed, ack_timeout=args.ack_timeout, iters=iters,
                     rtt=args.rtt or args.sweep, in_flight=args.in_flight)


def run(args: argparse.Namespace) -> int:
    """The whole benchmark (see `netreduce bench --help`); the exit code."""
    try:
        plan = plan_of(args)
    except ValueError as exc:
        print(f"netreduce bench: {exc}", file=sys.stderr)
        return 2
    if args.tenants != 1:
        if args.plot:
            print("netreduce bench: --plot draws one job: not with --tenants", file=sys.stderr)
            return 2
        return run_tenants(args, plan)
    started = datetime.now(timezone.utc)
    progress = Progress(plan.units)
    sink = RankLines(plan, progress)
    cmd = [sys.executable, "-m", "netreduce.tools.bench.worker", "--plan", plan.to_json()]
    try:
        launched = launch(cmd, plan.workers, port=args.port, timeout=args.timeout, out=sink)
    except ValueError as exc:
        progress.close()
        print(f"netreduce bench: {exc}", file=sys.stderr)
        return 2
    progress.close()
    if not launched.ok:
        print(f"netreduce bench: the workers failed (exit {launched.exit_code})",
              file=sys.stderr)
        return launched.exit_code
    results = sink.measured()
    print()
    for line in table(results) + [""] + latency_table(results):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(document(meta(plan, started), results), indent=2)
                             + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        from netreduce.tools.bench.plot import plot
        plot(results, plan.workers, plan.dtype, args.plot)
        print(f"wrote {args.plot}")
    if not all(r.verified for r in results):
        print("netreduce bench: some results did not match numpy", file=sys.stderr)
        return 1
    return 0

