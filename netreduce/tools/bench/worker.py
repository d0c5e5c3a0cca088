"""One rank of `netreduce bench`, started by the bench through netreduce.tools.launch:

    python -m netreduce.tools.bench.worker --plan JSON

For every size of the plan, `warmup` + `jobs` rounds; a round runs one job of every column
in order -- the link (netreduce.tools.bench.link_baseline), then each allreduce algorithm, then with
`--rtt` the RC round trip between ranks 0 and 1 (netreduce.tools.bench.rtt) -- so that a
slow spell of the lab hits every column alike. A job makes `plan.calls(size)` calls back to
back (with `in_flight` K > 1, an allreduce job keeps K asynchronous calls outstanding and
adds up their latencies, `results.LATENCY`). A job: prepare, barrier (a one-element ring
allreduce: nobody leaves it before every rank entered it), run (timed), verify, read the
rxe counters (and, rank 0, the lab's CPU time by state and, on a two-tier fabric, the bytes
that crossed its ToR-spine links, read around the job's barriers). One `Record` line per job goes
to stdout. Inputs are deterministic (seed, rank, size), so every rank computes the numpy
reference of the sum itself.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from contextlib import nullcontext
from typing import Any, Callable, Protocol

import numpy as np

import netreduce
from netreduce.algorithms.switch import one_scale_per_call
from netreduce.tools.bench.link_baseline import LinkProbe
from netreduce.tools.bench.runplan import LINK, RTT, BenchPlan
from netreduce.tools.bench.results import CPU, LATENCY, SPINE, Record
from netreduce.tools.bench.rtt import RTT_PINGS, PingPong
from netreduce.tools.reference import SWITCH_PER_CALL, Reference, rank_input as seeded_input
from ring_setup.device import hw_counters
from nr_contract.client import ControllerClient
from nr_contract.tokens import ADDR_ENV

CPU_STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def rank_input(plan: BenchPlan, rank: int, size: int) -> np.ndarray:
    """Rank `rank`'s input at `size` bytes, seeded by (seed, rank, size)."""
    return seeded_input([plan.seed, rank, size], plan.count(size), plan.dtype)


def size_reference(plan: BenchPlan, world_size: int, size: int) -> Reference:
    """The numpy sum of every rank's input at `size`, with each algorithm's tolerance."""
    return Reference(rank_input(plan, r, size) for r in range(world_size))


class Measured(Protocol):
    """One kind of job at one size: set up (untimed), run `calls` calls (timed), verify
    (untimed): `wrong` counts the elements of the job's type (results.Result.type) that
    came out wrong on this rank, nccl-tests' #wrong."""

    def prepare(self) -> None: ...
    def run(self, calls: int) -> dict[str, int]: ...     # counters of its own (in flight)
    def wrong(self) -> int: ...


class AllreduceJob:
    """An allreduce with the column's algorithm; `SWITCH_PER_CALL`: algo="switch" inside
    `one_scale_per_call` (every rank runs the same columns, so every rank enters it)."""

    def __init__(self, comm: netreduce.Communicator, column: str, x: np.ndarray,
                 reference: Reference, in_flight: int = 1) -> None:
        self.comm, self.column, self.x, self.reference = comm, column, x, reference
        self.in_flight = in_flight
        self.algo = "switch" if column == SWITCH_PER_CALL else column
        self.scales = one_scale_per_call if column == SWITCH_PER_CALL else nullcontext
        self.out = np.empty_like(x)

    def prepare(self) -> None:
        self.out.fill(0)                  # a job that wrote nothing cannot pass the check

    def run(self, calls: int) -> dict[str, int]:
        with self.scales():
            if self.in_flight > 1:
                return {LATENCY: self._in_flight(calls)}
            for _ in range(calls):
                self.comm.allreduce(self.x, algo=self.algo, out=self.out)
                self._check_route()
        return {}

    def _in_flight(self, calls: int) -> int:
        """`calls` asynchronous calls, `in_flight` outstanding (all into `out`, in order);
        their latencies (ns, submission to completion) summed."""
        outstanding: deque[tuple[int, Any]] = deque()
        total = 0
        for c in range(calls + self.in_flight):
            if len(outstanding) == self.in_flight or (c >= calls and outstanding):
                started, work = outstanding.popleft()
                work.wait()
                total += time.perf_counter_ns() - started
                self._check_route()
            if c < calls:
                outstanding.append((time.perf_counter_ns(), self.comm.allreduce(
                    self.x, algo=self.algo, out=self.out, async_op=True)))
        return total

    def _check_route(self) -> None:
        if self.comm.last_algo != self.algo:
            raise RuntimeError(f"bench: asked for algo={self.algo!r}, the communicator "
                               f"ran {self.comm.last_algo!r}")

    def wrong(self) -> int:
        """Elements outside the bound of the column's algorithm (int32: not exact)."""
        return int(self.reference.wrong(self.out, self.column).size)


class LinkJob:
    def __init__(self, probe: LinkProbe, size: int) -> None:
        self.probe, self.size = probe, size

    def prepare(self) -> None:
        self.probe.prepare(self.size)

    def run(self, calls: int) -> dict[str, int]:
        for _ in range(calls):
            self.probe.run()
        return {}

    def wrong(self) -> int:
        return self.probe.wrong()


class RoundTripJob:
    """`calls` RC round trips between ranks 0 and 1 (the other ranks only wait)."""

    def __init__(self, pingpong: PingPong) -> None:
        self.pingpong = pingpong

    def prepare(self) -> None:
        return None

    def run(self, calls: int) -> dict[str, int]:
        self.pingpong.run(calls)
        return {}

    def wrong(self) -> int:
        return self.pingpong.wrong()


def lab_cpu() -> dict[str, int]:
    """CPU time by state (clock ticks, all CPUs) from /proc/stat, keyed `CPU` + state."""
    with open("/proc/stat") as f:
        ticks = f.readline().split()[1:len(CPU_STATES) + 1]
    return {CPU + state: int(t) for state, t in zip(CPU_STATES, ticks)}


class SpineMeter:
    """Rank 0's reading of the bytes that crossed a two-tier fabric's ToR-spine links, as
    the receiving ends counted them (rx bytes of the ToRs' uplinks, "torJ:uplink", and of the
    spine's ToR ports, "spine:1".."spine:R", through the job's controller: a BMv2 switch's
    tx bytes are those of the frame it built a partial or total from, its rx bytes the
    frame's own); {} on other ranks and when the controller is not a fabric's."""

    def __init__(self, comm: netreduce.Communicator) -> None:
        self.client: ControllerClient | None = None
        addr = os.environ.get(ADDR_ENV)
        if comm.rank == 0 and addr and comm.switch.registered:
            client = ControllerClient(addr)
            if client.ping()["target"] == "fabric":
                self.client = client
            else:
                client.close()

    def read(self) -> dict[str, int]:
        if self.client is None:
            return {}
        return {SPINE: spine_link_bytes(self.client.counters(connections=False)["ports"])}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def spine_link_bytes(ports: dict[str, dict[str, Any]]) -> int:
    """Bytes received at both ends of a fabric's ToR-spine links, from its Counters reply's
    ports: the ToRs' uplinks and the spine's ports 1..R (ToR j is on spine port j+1)."""
    names = {str(p["ifname"]) for p in ports.values()}
    ends = {f"spine:{j + 1}" for j in range(sum(n.endswith(":uplink") for n in names))}
    return sum(int(p["rx_bytes"]) for p in ports.values()
               if str(p["ifname"]).endswith(":uplink") or p["ifname"] in ends)


def _moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def run(comm: netreduce.Communicator, plan: BenchPlan, emit: Callable[[Record], None]) -> None:
    """The whole plan on this rank (collective: every rank runs it alike)."""
    if plan.needs_switch and not comm.switch.registered:
        raise RuntimeError(f"bench: algo 'switch' asked for, but there is no switch: "
                           f"{comm.switch.note}")
    token = np.zeros(1, dtype=np.int32)
    probe = LinkProbe(comm, max(plan.sizes))
    pingpong = PingPong(comm) if plan.rtt else None
    spine = SpineMeter(comm)
    try:
        for size in plan.sizes:
            x = rank_input(plan, comm.rank, size)
            reference = size_reference(plan, comm.world_size, size)
            jobs: dict[str, Measured] = {
                column: LinkJob(probe, size) if column == LINK
                else RoundTripJob(pingpong) if column == RTT and pingpong is not None
                else AllreduceJob(comm, column, x, reference, plan.in_flight)
                for column in plan.columns}
            calls = plan.calls(size)
            counters = hw_counters(comm.device)
            for i in range(-plan.warmup, plan.jobs):
                for column, job in jobs.items():
                    n_calls = max(calls, RTT_PINGS) if column == RTT else calls
                    job.prepare()
                    crossed = spine.read()
                    comm.allreduce(token, algo="ring")           # the barrier
                    cpu = lab_cpu() if comm.rank == 0 else {}
                    t0 = time.perf_counter_ns()
                    own = job.run(n_calls)
                    ns = time.perf_counter_ns() - t0
                    cpu = _moved(cpu, lab_cpu()) if comm.rank == 0 else {}
                    comm.allreduce(token, algo="ring")           # every rank is done
                    crossed = _moved(crossed, spine.read())
                    now = hw_counters(comm.device)
                    emit(Record(column, size, i, ns, job.wrong(),
                                _moved(counters, now) | cpu | crossed | own, n_calls))
                    counters = now
    finally:
        spine.close()
        probe.close()
        if pingpong is not None:
            pingpong.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m netreduce.tools.bench.worker",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--plan", required=True, help="the BenchPlan as JSON")
    plan = BenchPlan.from_json(parser.parse_args(argv).plan)
    netreduce.log_to_stderr()
    comm = netreduce.init(mtu=plan.mtu, msg_size=plan.msg_size, window=plan.window,
                          ack_timeout=plan.ack_timeout, in_flight=plan.in_flight,
                          switch=None if plan.needs_switch else "")  # None: $NR_CONTROLLER
    run(comm, plan, lambda record: print(record.line(), flush=True))
    netreduce.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
