"""One rank of a lab allreduce test, run by `python -m netreduce.tools.launch` (one per host).

    allreduce_worker.py correctness [--sizes N,N,...] [--timed N] [--algo ring|switch|auto]
    allreduce_worker.py switch [--sizes N,...] [--timed N]
    allreduce_worker.py hold --until FILE
    allreduce_worker.py mismatch {count|dtype}
    allreduce_worker.py missing-rank --timeout S
    allreduce_worker.py stall --collective-timeout S
    allreduce_worker.py die --victim R        (rank R SIGKILLs itself mid-call)
    allreduce_worker.py late --late S         (the last rank joins a call S seconds late)
    allreduce_worker.py rank0-killed --until FILE   (rank 0 SIGKILLs itself, ring registered)
    allreduce_worker.py survive --until CUE [--size N --big N --calls N --gil S --reference N]
                                              (issue 24: the switch restarted twice)
    allreduce_worker.py inc-spec
    allreduce_worker.py floats [--sizes N,...]   (issue 22: NaN under auto, avg, 16-bit floats,
                                                  per-block scales)
    allreduce_worker.py shards [--sizes N,...] [--calls N --size N]
                                              (issue 42: the lab's aggregators sharing each
                                               call; --calls: aggregator 1 restarted mid-job)
    allreduce_worker.py recut --victim R --calls N --size N
                                              (rank R re-cuts its stream between calls, as
                                               rxe's retry race does: docs/roce.md)

Prints "OK ..." lines the tests look for; a failed check exits non-zero with the reason.
Every rank's data is a function of its rank, so each rank computes the reference itself
(netreduce.tools.reference: int32 exact, floats within the bound of the algorithm that ran).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

import netreduce
from flowctl import CompletionError
from netreduce.algorithms.switch import MIN_BLOCK, block_elements
from netreduce.tools.reference import Reference, rank_input
from ring_setup.device import hw_counters

DTYPES = ("int32", "float32")


def rank_data(rank: int, count: int, dtype: str) -> np.ndarray:
    return rank_input([rank, count], count, dtype)


def reduce_and_check(comm: netreduce.Communicator, count: int, dtype: str, algo: str,
                     timed: bool, op: str = "sum") -> None:
    """One allreduce (`op`) of every rank's `rank_data` (odd sizes in place, even ones from
    a read-only input into `out`), checked against the reference; `algo` other than "auto"
    must be the one that ran."""
    n = comm.world_size
    x = rank_data(comm.rank, count, dtype)
    out = x if count % 2 else np.empty_like(x)
    x.flags.writeable = out is x
    t0 = time.perf_counter()
    got = comm.allreduce(x, op=op, algo=algo, out=None if out is x else out)
    dt = time.perf_counter() - t0
    if got is not out:
        sys.exit(f"FAIL {dtype}[{count}]: the result is not in the array it should be in")
    if out is not x and not np.array_equal(x, rank_data(comm.rank, count, dtype)):
        sys.exit(f"FAIL {dtype}[{count}]: the input changed although out= was given")
    ran = str(comm.last_algo)
    if algo != "auto" and ran != algo:
        sys.exit(f"FAIL {dtype}[{count}]: algo={algo} ran {ran}")
    # a sharded call ("switch+ring": some shards on the host ring) within the switch's bound
    failure = Reference((rank_data(r, count, dtype) for r in range(n)), op).failure(
        got, "switch" if "switch" in ran else ran)
    if failure is not None:
        sys.exit(f"FAIL {dtype}[{count}] op={op} algo={ran}: {failure}")
    if timed:
        algbw = x.nbytes / dt
        print(f"TIME n={n} {dtype}[{count}] {x.nbytes / 2**20:.1f} MiB algo={ran}: {dt:.2f} s, "
              f"algbw {algbw * 8 / 1e9:.4f} Gbit/s, busbw "
              f"{algbw * 2 * (n - 1) / n * 8 / 1e9:.4f} Gbit/s", flush=True)


def correctness(comm: netreduce.Communicator, sizes: list[int], timed: int, algo: str,
                dtypes: tuple[str, ...] = DTYPES) -> None:
    for count in sizes:
        for dtype in dtypes:
            reduce_and_check(comm, count, dtype, algo, count == timed)
    print(f"COUNTERS {json.dumps(hw_counters(comm.device))}", flush=True)
    print(f"OK correctness n={comm.world_size} sizes={sizes} algo={comm.last_algo}", flush=True)


def switch_ring_counters(comm: netreduce.Communicator, client: Any = None) -> dict | None:
    """The switch's counters of this communicator's registered "inc" ring (asked through
    `client`, default a ControllerClient of its controller); None when the switch no longer
    holds it (it went away: the communicator's stats() count the fallback)."""
    from nr_contract.client import ControllerClient
    assert comm.switch.controller is not None and comm.switch.ring_id is not None
    with contextlib.nullcontext(client) if client else ControllerClient(
            comm.switch.controller) as controller:
        ring = controller.counters()["rings"].get(comm.switch.ring_id)
    return None if ring is None else ring["counters"]


def in_network(comm: netreduce.Communicator, sizes: list[int], timed: int,
               dtypes: tuple[str, ...] = DTYPES) -> None:
    """algo="switch" over `sizes` (each of `dtypes`); an int32 call that may overflow
    is refused on every rank and leaves the communicator usable (one more 5-element call);
    rank 0 prints the ring's switch counters."""
    if not comm.switch.registered:
        sys.exit(f"FAIL: the 'inc' ring is not registered: {comm.switch.describe()}")
    correctness(comm, sizes, timed, "switch", dtypes)
    x = np.full(3, 2**30, dtype=np.int32)
    try:
        comm.allreduce(x, algo="switch")
    except netreduce.AllreduceOverflow as exc:
        print(f"ERROR {exc}", flush=True)
    else:
        sys.exit("FAIL: an int32 allreduce that may overflow was not refused")
    if not np.all(x == 2**30):
        sys.exit("FAIL: the refused allreduce changed the data")
    reduce_and_check(comm, 5, "int32", "switch", False)
    cache = comm._registered        # int32 inputs sent in place: regions registered
    counts = {"misses": cache.misses, "hits": cache.hits, "failures": cache.failures}
    print(f"INPLACE {json.dumps(counts)}", flush=True)
    if comm.rank == 0:
        print(f"SWITCH_RING {json.dumps(switch_ring_counters(comm))}", flush=True)
    print("OK switch", flush=True)


NAN_AT, INF_AT = 3, 7        # where rank 1's data holds NaN and rank 2's +inf


def poisoned(rank: int, count: int) -> np.ndarray:
    """float32 `rank_data`, with NaN at NAN_AT on rank 1 and +inf at INF_AT on rank 2."""
    x = rank_data(rank, count, "float32")
    if rank == 1:
        x[NAN_AT] = np.nan
    if rank == 2:
        x[INF_AT] = np.inf
    return x


MIXED_POWERS = (-6, 4, -6, -6, 4, -6)   # the blocks of `mixed_blocks`: 1e-6's and 1e4's


def mixed_blocks(rank: int) -> np.ndarray:
    """float32 `rank_data` whose blocks (switch path: 1024 elements) are scaled by 10^p for
    p in MIXED_POWERS (the last block short)."""
    count = (len(MIXED_POWERS) - 1) * MIN_BLOCK + 77
    scale = np.repeat(10.0 ** np.array(MIXED_POWERS), block_elements(count))[:count]
    return (rank_data(rank, count, "float32") * scale).astype(np.float32)


def per_block_check(comm: netreduce.Communicator) -> None:
    """A float32 sum over the switch of blocks of 1e-6's next to blocks of 1e4's: every
    element within the per-block bound (`Reference`), and within 2^-20 of the largest
    |sum| of its own block (at 4 ranks one scale per call allowed about 6e-4 there: far
    more than the 1e-6 blocks' values)."""
    n = comm.world_size
    got = comm.allreduce(mixed_blocks(comm.rank), algo="switch")
    ref = Reference(mixed_blocks(r) for r in range(n))
    failure = ref.failure(got, "switch")
    if failure is not None:
        sys.exit(f"FAIL per-block float32[{got.size}]: {failure}")
    block = block_elements(got.size)
    worst = 0.0
    for lo in range(0, got.size, block):
        want = ref.want[lo:lo + block]
        err = np.abs(got[lo:lo + block].astype(np.float64) - want).max()
        worst = max(worst, err / np.abs(want).max())
    if worst > 2.0**-20:
        sys.exit(f"FAIL per-block: an error of {worst:.3g} of its block's largest sum")
    print(f"OK blocks: 1e-6 next to 1e4, largest error {worst:.3g} of its block's largest "
          f"sum", flush=True)


def floats(comm: netreduce.Communicator, sizes: list[int]) -> None:
    """Issue 22 in one job (needs 3+ ranks and the registered ring): algo="auto" on NaN/Inf
    data runs the ring on every rank (bit-identical to algo="ring", NaN and +inf where
    they belong, the rest within the ring's bound); a call mixing blocks of 1e-6 and 1e4
    within the per-block bound (`per_block_check`); then at each of `sizes`, over the
    switch and over the ring: op="avg" of float32, float16 and bfloat16, and op="sum" of
    the 16-bit ones, each within its bound; prints the communicator's STATS."""
    if not comm.switch.registered or comm.world_size < 3:
        sys.exit(f"FAIL: needs 3+ ranks and the ring registered: {comm.switch.describe()}")
    count = 1000
    got = comm.allreduce(poisoned(comm.rank, count))
    if (comm.last_algo, comm.last_fallback) != ("ring", "non-finite"):
        sys.exit(f"FAIL: auto with NaN ran {comm.last_algo} ({comm.last_fallback})")
    ring = comm.allreduce(poisoned(comm.rank, count), algo="ring")
    if got.tobytes() != ring.tobytes():
        sys.exit("FAIL: auto with NaN did not give the ring's result")
    if not (np.isnan(got[NAN_AT]) and np.isposinf(got[INF_AT])):
        sys.exit(f"FAIL: NaN/inf not propagated: {got[[NAN_AT, INF_AT]].tolist()}")
    finite = np.ones(count, dtype=bool)
    finite[[NAN_AT, INF_AT]] = False
    failure = Reference(poisoned(r, count)[finite] for r in range(comm.world_size)).failure(
        got[finite], "ring")
    if failure is not None:
        sys.exit(f"FAIL: auto with NaN: {failure}")
    print("OK nan: auto ran the ring", flush=True)
    per_block_check(comm)
    for op, dtypes in (("avg", ("float32", "float16", "bfloat16")),
                       ("sum", ("float16", "bfloat16"))):
        for dtype in dtypes:
            for n in sizes:
                for algo in ("switch", "ring"):
                    reduce_and_check(comm, n, dtype, algo, False, op)
    print(f"STATS {json.dumps(comm.stats(), sort_keys=True)}", flush=True)
    print("OK floats", flush=True)


def hold(comm: netreduce.Communicator, until: str, timeout: float) -> None:
    """Keep the "inc" ring registered (after one switch call) until the file `until` exists."""
    reduce_and_check(comm, 1000, "int32", "switch", False)
    if comm.rank == 0:
        print(f"REGISTERED {comm.switch.ring_id}", flush=True)
    end = time.monotonic() + timeout
    while not os.path.exists(until):
        if time.monotonic() > end:
            sys.exit(f"FAIL: {until} did not appear within {timeout:g}s")
        time.sleep(0.2)
    reduce_and_check(comm, 1000, "int32", "switch", False)     # the ring still aggregates
    print("OK hold", flush=True)


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
    """The last rank never calls allreduce (alive, watching): the others must fail with
    the collective timeout's report."""
    if comm.rank == comm.world_size - 1:
        time.sleep(seconds + 5)
        print("OK idle", flush=True)
        return
    try:
        comm.allreduce(np.ones(1000, dtype=np.int32))
    except (netreduce.FlowError, netreduce.PeerFailure) as exc:
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
    else:
        sys.exit("FAIL: allreduce completed although a rank never called it")


KILL_AFTER = 0.2        # s into the call: the soft switch took ~1.6 s per 16 MiB call, native ~1


def die(comm: netreduce.Communicator, victim: int) -> None:
    """Rank `victim` SIGKILLs itself KILL_AFTER s into a 16 MiB switch call (the native
    switch finishes one in ~1 s in the lab: the kill must come well before); every other rank must
    raise PeerFailure naming it (printed with the time from the kill to the error) - or,
    on the victim's predecessor, whose WRITEs to it fail once its QPs are gone, possibly
    before the store's news of the death, a CompletionError naming the WRITE to it."""
    x = rank_data(comm.rank, 1 << 22, "int32")
    comm.allreduce(x.copy(), algo="switch")                 # warm: workspace registered
    comm._rendezvous.barrier("before-kill")
    t_kill = time.time() + KILL_AFTER
    if comm.rank == victim:
        threading.Timer(KILL_AFTER, os.kill, (os.getpid(), signal.SIGKILL)).start()
    try:
        comm.allreduce(x, algo="switch")
    except (netreduce.PeerFailure, CompletionError) as exc:
        print(f"ERROR {time.time() - t_kill:.2f} {exc}", flush=True)
        netreduce.finalize()             # unusable, but closes (rank 0 unregistered already)
        sys.exit(0)
    sys.exit("FAIL: the call completed although a rank was killed during it")


def late(comm: netreduce.Communicator, seconds: float) -> None:
    """The last rank sleeps `seconds` (longer than the old 30 s stall timeout) before the
    call: the others wait for it, and the sum is right."""
    if comm.rank == comm.world_size - 1:
        time.sleep(seconds)
    t0 = time.monotonic()
    reduce_and_check(comm, 1000, "int32", "switch", False)
    print(f"OK late waited {time.monotonic() - t0:.1f} s", flush=True)


def rank0_killed(comm: netreduce.Communicator, until: str) -> None:
    """Rank 0 prints its ring and its lease, then SIGKILLs itself (nothing unregisters);
    the others wait until `until` exists (the test saw the lease expire)."""
    reduce_and_check(comm, 1000, "int32", "switch", False)
    if comm.rank == 0:
        print(f"REGISTERED {comm.switch.ring_id} lease_ms={comm.switch.lease_ms}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    end = time.monotonic() + 600
    while not os.path.exists(until) and time.monotonic() < end:
        time.sleep(0.2)
    print("OK survivor", flush=True)
    netreduce.finalize()
    sys.exit(0)


def survive(comm: netreduce.Communicator, size: int, big: int, calls: int, cue: str,
            gil: float, reference: int = 0) -> None:
    """Issue 24 in one job: `calls` algo="auto" calls of int32[size] (checked, out= a
    fresh array), one of them of int32[big] (after `reference` more of them through the
    switch: what the cut one would take), the switch restarted twice by the test: (1)
    during the big call (rank 0 prints "RESTART DURING CALL #k" and waits 0.5 s: the test
    restarts the switch meanwhile), then calls until the ring is registered again and two
    more; (2) between calls (rank 0 prints "RESTART WHILE IDLE"; every rank waits for the
    file CUE.idle, which the test creates once the switch is back), then calls until back
    and two more; then rank 0 holds the GIL `gil` s (ctypes.PyDLL: no Python thread of its
    runs, its lease keeper included) before the next call, which must still go through
    the switch; then calls up to `calls`. Prints "CALL i algo seconds" per call, STATS,
    and rank 0 the ring's switch counters (SWITCH_RING)."""
    import ctypes
    n, done = comm.world_size, [0]

    def call(count: int) -> str:
        i = done[0]
        x = rank_input([comm.rank, count, i], count, "int32")
        y = np.full(x.shape, -1, dtype=np.int32)
        t0 = time.perf_counter()
        comm.allreduce(x, out=y)
        dt = time.perf_counter() - t0
        want = sum(rank_input([r, count, i], count, "int32").astype(np.int64)
                   for r in range(n))
        if not np.array_equal(y, want.astype(np.int32)) or \
                not np.array_equal(x, rank_input([comm.rank, count, i], count, "int32")):
            sys.exit(f"FAIL call {i}: int32[{count}] not exact ({comm.last_algo})")
        print(f"CALL {i} {comm.last_algo} {dt:.2f}", flush=True)
        done[0] += 1
        return str(comm.last_algo)

    def until_back(bound: float = 300) -> None:
        end = time.monotonic() + bound
        while call(size) != "switch":
            if time.monotonic() > end:
                sys.exit(f"FAIL: not back on the switch within {bound:g} s")
        call(size)
        call(size)

    for count in [big] * reference + [size] * 3:
        if call(count) != "switch":
            sys.exit("FAIL: the first calls did not go through the switch")
    if comm.rank == 0:
        print(f"RESTART DURING CALL #{done[0]}", flush=True)
    time.sleep(0.5)
    call(big)
    until_back()
    if comm.rank == 0:
        print(f"RESTART WHILE IDLE after call #{done[0] - 1}", flush=True)
    end = time.monotonic() + 600
    while not os.path.exists(cue + ".idle"):
        if time.monotonic() > end:
            sys.exit("FAIL: the test never said the switch was back")
        time.sleep(0.2)
    until_back()
    before = comm.stats()["switch"]
    if comm.rank == 0 and gil:
        print(f"GIL HELD {gil:g} s before call #{done[0]}", flush=True)
        ctypes.PyDLL(None).sleep(int(gil))        # libc sleep(3) with the GIL held
    if call(size) != "switch" or comm.stats()["switch"] != before:
        sys.exit(f"FAIL: the call after rank 0 held the GIL {gil:g} s did not go through "
                 f"the switch: {comm.stats()}")
    while done[0] < calls:
        call(size)
    print(f"STATS {json.dumps(comm.stats(), sort_keys=True)}", flush=True)
    if comm.rank == 0:
        print(f"SWITCH_RING {comm.switch.ring_id} {json.dumps(switch_ring_counters(comm))}",
              flush=True)
    print("OK survive", flush=True)


def recut(comm: netreduce.Communicator, victim: int, calls: int, size: int) -> None:
    """`calls` int32 calls of `size` through the switch; after each but the last, rank
    `victim` sends on "inc" what rxe's retry race sends: its last message again as one empty
    WRITE WITH IMMEDIATE at its QP's next PSN, every later packet one PSN on. Every call must
    be exact; prints each rank's skipped empty arrivals and rank 0 the ring's counters."""
    from flowctl.link import RemoteBuffer
    stream = comm._streams["inc"]
    for call in range(calls):
        reduce_and_check(comm, size, "int32", "switch", False)
        if comm.rank == victim and call < calls - 1:
            index = stream.next_send_index - 1
            # a zero-byte WRITE needs no address nor R_Key at the responder (IB C9-88)
            stream.link.post_write(index, comm._control.local().slice(0, 0),
                                   RemoteBuffer(0, 0, 0))
            deadline = time.monotonic() + 120
            done: list = []
            while not done and time.monotonic() < deadline:
                done = stream.link.poll_sends(1)
                time.sleep(0.01)
            if not done or not done[0].ok or done[0].index != index:
                sys.exit(f"FAIL: rank {victim}'s empty write of message {index}: {done}")
    print(f"EMPTY_RESENDS {json.dumps({'rank': comm.rank, 'count': stream.empty_resends})}",
          flush=True)
    if comm.rank == 0:
        from nr_contract.client import ControllerClient
        with ControllerClient(comm.switch.controller) as client:
            ring = client.counters()["rings"][comm.switch.ring_id]
        print(f"SWITCH_RING {json.dumps(ring['counters'])}", flush=True)
        print(f"SWITCH_CONNS {json.dumps([c['counters'] for c in ring['connections']])}",
              flush=True)
    print("OK recut", flush=True)


def shards(comm: netreduce.ShardedCommunicator, sizes: list[int], calls: int,
           size: int) -> None:
    """Issue 42 item 3: every size of `sizes` as int32 and float32 (odd sizes in place),
    algo="auto", checked (`reduce_and_check`; "TIME" lines from 1 Mi elements on); then,
    with `calls`, that many int32[size] calls (checked, "CALL i algo seconds") while the
    test restarts aggregator 1: rank 0 prints "RESTART DURING CALL #k" before call 2 and
    waits 0.5 s; the job goes on until aggregator 1 is back and two calls more (at least
    `calls`); "STATS" (comm.stats(): per aggregator when sharded), rank 0 "AGG_RINGS" (each
    aggregator's counters of its ring, after the sizes), "OK shards"."""
    sharded = isinstance(comm, netreduce.ShardedCommunicator)
    if calls and not sharded:
        sys.exit(f"FAIL: not a sharded communicator: {comm!r}")
    for count in sizes:
        for dtype in DTYPES:
            reduce_and_check(comm, count, dtype, "auto", count >= 1 << 20)
    if comm.rank == 0 and sharded:
        rings = [switch_ring_counters(shard) for shard in comm.shards]
        print(f"AGG_RINGS {json.dumps(rings)}", flush=True)
    back, i = None, 0
    while calls and (i < calls or back is None or i < back + 2):
        if i == 2 and comm.rank == 0:
            print(f"RESTART DURING CALL #{i}", flush=True)
        if i == 2:
            time.sleep(0.5)
        x = rank_input([comm.rank, size, i], size, "int32")
        t0 = time.perf_counter()
        y = comm.allreduce(x, out=np.empty_like(x))
        dt = time.perf_counter() - t0
        want = sum(rank_input([r, size, i], size, "int32").astype(np.int64)
                   for r in range(comm.world_size)).astype(np.int32)
        if not np.array_equal(y, want):
            sys.exit(f"FAIL call {i}: int32[{size}] not exact ({comm.last_algo})")
        print(f"CALL {i} {comm.last_algo} {dt:.2f}", flush=True)
        if back is None and comm.stats()["aggregators"][1]["returns"]:
            back = i
        if i > 600:
            sys.exit("FAIL: aggregator 1 not back within 600 calls")
        i += 1
    print(f"STATS {json.dumps(comm.stats())}", flush=True)
    print("OK shards", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["correctness", "switch", "hold", "mismatch",
                                    "missing-rank", "stall", "inc-spec", "die", "late",
                                    "rank0-killed", "floats", "survive", "recut",
                                    "shards"])
    p.add_argument("what", nargs="?", default="count")
    p.add_argument("--sizes", default="1,1000,256,4194304")
    p.add_argument("--timed", type=int, default=4194304)
    p.add_argument("--dtypes", default=",".join(DTYPES), help="correctness, switch: each "
                   "size as each of these")
    p.add_argument("--algo", default="ring", help="correctness: ring, switch or auto")
    p.add_argument("--until", help="hold: the file whose existence ends the hold")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--collective-timeout", type=float, default=1800.0,
                   help="collective timeout, seconds")
    p.add_argument("--victim", type=int, default=2, help="die: the rank that is killed; "
                   "recut: the rank that re-cuts its stream")
    p.add_argument("--late", type=float, default=40.0, help="late: seconds the last rank "
                   "sleeps before its call")
    p.add_argument("--size", type=int, default=1 << 20, help="survive, recut: int32 per call")
    p.add_argument("--big", type=int, default=1 << 22, help="survive: the call restarted")
    p.add_argument("--calls", type=int, default=30, help="survive, recut, shards: calls in all")
    p.add_argument("--gil", type=float, default=25.0, help="survive: s rank 0 holds the GIL")
    p.add_argument("--reference", type=int, default=0, help="survive: uncut calls of --big "
                   "first")
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    netreduce.log_to_stderr()

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

    comm = netreduce.init(timeout=args.timeout, collective_timeout=args.collective_timeout)
    first = getattr(comm, "shards", [comm])[0]     # a ShardedCommunicator's aggregator 0
    print(f"joined {comm!r} ip={first.inc_ring_spec().connections[rank].src_ip}", flush=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    dtypes = tuple(args.dtypes.split(","))
    modes = {
        "correctness": lambda: correctness(comm, sizes, args.timed, args.algo, dtypes),
        "switch": lambda: in_network(comm, sizes, args.timed, dtypes),
        "hold": lambda: hold(comm, args.until, 600),
        "mismatch": lambda: mismatch(comm, args.what),
        "stall": lambda: stall(comm, args.collective_timeout),
        "die": lambda: die(comm, args.victim),
        "late": lambda: late(comm, args.late),
        "rank0-killed": lambda: rank0_killed(comm, args.until),
        "inc-spec": lambda: print(f"SPEC {comm.inc_ring_spec().to_json()}", flush=True),
        "floats": lambda: floats(comm, sizes),
        "survive": lambda: survive(comm, args.size, args.big, args.calls, args.until,
                                   args.gil, args.reference),
        "recut": lambda: recut(comm, args.victim, args.calls, args.size),
        "shards": lambda: shards(comm, sizes, args.calls if "--calls" in sys.argv else 0,
                                 args.size),
    }
    modes[args.mode]()
    netreduce.finalize()


if __name__ == "__main__":
    main()
