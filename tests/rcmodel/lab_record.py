"""One rank of the lab recording the RC model is checked against (tests/rcmodel/lab_calls.json).

    NR_VENV=/work/main/.venv scripts/lab.sh --hosts 2 -- env PYTHONPATH=$PWD \
        python -m netreduce.tools.launch --hosts 2 -- python tests/rcmodel/lab_record.py

(from the repository or worktree root; PYTHONPATH makes the guest import this tree's code).
The `RCMODEL` lines' records, sorted by call then rank, are lab_calls.json's "records".

Runs the `CALLS` below on a communicator with the default knobs (the lab's switch
registers its "inc" ring) and prints, per call, one `RCMODEL <json>` line: this rank's rxe
hw_counters that moved during the call and, on rank 0, the switch's counters of the "inc"
ring (ring and per connection) that moved. Every rank waits for every other before and
after each call (rendezvous barriers, TCP: no RoCE packet), so the deltas hold exactly one
call's packets, ACKs included. Results are checked against numpy.
"""
from __future__ import annotations

import json
import platform
import sys

import numpy as np

import netreduce
from ring_setup.device import hw_counters

#: (name, count, dtype, algo) of each recorded call.
CALLS = (("switch-1MiB", 262144, "int32", "switch"),
         ("ring-1MiB", 262144, "int32", "ring"),
         ("switch-5", 5, "float32", "switch"))


def moved(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def ring_counters(comm: netreduce.Communicator) -> dict:
    from nr_contract.client import ControllerClient
    assert comm.switch.controller is not None
    with ControllerClient(comm.switch.controller) as client:
        ring = client.counters()["rings"][comm.switch.ring_id]
    return {"ring": ring["counters"], "connections": [c["counters"] for c in ring["connections"]]}


def data(rank: int, count: int, dtype: str) -> np.ndarray:
    return (np.arange(count) % 1000 * (rank + 1) - 500).astype(dtype)


def main() -> None:
    comm = netreduce.init()
    if not comm.switch.registered:
        sys.exit(f"FAIL: no switch: {comm.switch.describe()}")
    barrier = comm._rendezvous.barrier          # noqa: SLF001 - TCP, no RoCE packet
    n = comm.world_size
    for name, count, dtype, algo in CALLS:
        barrier(f"before.{name}")
        rxe0 = hw_counters(comm.device)
        sw0 = ring_counters(comm) if comm.rank == 0 else None
        barrier(f"counted.{name}")
        got = comm.allreduce(data(comm.rank, count, dtype), algo=algo)
        want = np.sum([data(r, count, dtype) for r in range(n)], axis=0, dtype=dtype)
        if not np.array_equal(got, want):
            sys.exit(f"FAIL {name}: wrong sum")
        barrier(f"after.{name}")
        record = {"call": name, "count": count, "dtype": dtype, "algo": comm.last_algo,
                  "rank": comm.rank, "world_size": n, "mtu": comm.config.mtu,
                  "msg_size": comm.config.msg_size, "window": comm.config.window,
                  "kernel": platform.release(), "rxe": moved(rxe0, hw_counters(comm.device))}
        if sw0 is not None:
            sw1 = ring_counters(comm)
            record["switch"] = {"ring": moved(sw0["ring"], sw1["ring"]),
                                "connections": [moved(a, b) for a, b in
                                                zip(sw0["connections"], sw1["connections"])]}
        print("RCMODEL " + json.dumps(record, sort_keys=True), flush=True)
        barrier(f"read.{name}")
    netreduce.finalize()


if __name__ == "__main__":
    main()
