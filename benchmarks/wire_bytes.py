"""Per-host bytes on the wire and call time of int32 allreduce calls, on every rank of a lab
job (issue 42: the direct-attached switch, the host ring, one-armed aggregators; the
figures in docs/hardware.md).

    scripts/lab.sh [--aggregators K] -- netreduce launch --hosts 4 -- \
        python -m benchmarks.wire_bytes --mib 4,16                             (one line)

Per algorithm (switch, when a switch or aggregator registered the ring; ring) and size:
two warm-up calls, then `--calls` calls, each after a ring barrier: the median time of a
call and this host's bytes per call, sent and received, from the kernel's counters of its
interfaces (/sys/class/net/*/statistics, loopback left out: every frame the rank's rxe
device puts on or takes off the wire, the barrier's and the store's few bytes included).
One JSON line per rank, algorithm and size ("WIRE {...}"), checked sums.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import netreduce

NET = Path("/sys/class/net")


def wire_bytes() -> tuple[int, int]:
    """(tx, rx) bytes of this namespace's interfaces but loopback, as counted so far."""
    tx = rx = 0
    for dev in NET.iterdir():
        if dev.name != "lo":
            tx += int((dev / "statistics" / "tx_bytes").read_text())
            rx += int((dev / "statistics" / "rx_bytes").read_text())
    return tx, rx


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", default="4,16", help="call sizes, MiB of int32 (comma-separated)")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--algos", default="switch,ring")
    args = ap.parse_args()
    comm = netreduce.init()
    n, barrier = comm.world_size, np.zeros(1, dtype=np.int32)
    algos = [a for a in args.algos.split(",") if a != "switch" or comm.switch.registered]
    for mib in (int(m) for m in args.mib.split(",")):
        x = np.full(mib << 18, comm.rank + 1, dtype=np.int32)
        out = np.empty_like(x)
        for algo in algos:
            for _ in range(2):
                comm.allreduce(x, algo=algo, out=out)
            times, sent, received = [], [], []
            for _ in range(args.calls):
                comm.allreduce(barrier, algo="ring")
                tx0, rx0 = wire_bytes()
                t0 = time.perf_counter()
                comm.allreduce(x, algo=algo, out=out)
                times.append(time.perf_counter() - t0)
                tx1, rx1 = wire_bytes()
                sent.append(tx1 - tx0)
                received.append(rx1 - rx0)
            if not np.array_equal(out, np.full_like(x, n * (n + 1) // 2)):
                print(f"rank {comm.rank}: {algo} {mib} MiB: wrong sum {out[:4]}", file=sys.stderr)
                return 1
            print("WIRE " + json.dumps({
                "rank": comm.rank, "ranks": n, "algo": algo, "mib": mib,
                "controller": comm.switch.controller if algo == "switch" else None,
                "ms": round(statistics.median(times) * 1e3, 2),
                "tx_mib": round(statistics.median(sent) / 2**20, 3),
                "rx_mib": round(statistics.median(received) / 2**20, 3)}), flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
