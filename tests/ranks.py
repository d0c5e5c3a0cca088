"""Ranks as threads of the test process over one tests/fakefabric.py fabric (RDMA WRITEs are
memmoves), the rendezvous real TCP on localhost: what the communicator's unit tests share.
Each rank's result or exception comes back; a rank that hangs fails the test."""
from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from flowctl import FlowConfig
from flowctl.plan import MessagePlan
from netreduce.comm import Communicator
from netreduce.connect import connect
from netreduce.progress import ProgressEngine, Work
from ring_setup.rendezvous import Rendezvous, RendezvousConfig
from tests.fakefabric import FakeController, FakeFabric, FakeHost
from tests.processes import free_port

#: a small flow configuration: several messages and packets per call at small counts
CFG = FlowConfig(mtu=256, msg_size=1024, window=4, recv_depth=64, collective_timeout=5.0)


def run_ranks(n: int, body: Callable[[Communicator, FakeHost], Any], cfg: FlowConfig = CFG,
              fabric: FakeFabric | None = None,
              controller: FakeController | None = None,
              pinned: frozenset[str] = frozenset(),
              controller_ranks: tuple[int, ...] = (0,),
              ring_addrs: Callable[[int], dict[str, str]] = lambda rank: {}) -> list[Any]:
    """Connect n ranks over one fake fabric (rank 0 fitting the "inc" ring to `controller`,
    if given, leaving the knobs in `pinned` alone, and registering it; the other ranks of
    `controller_ranks` get it too: they renew the lease; rank r's rings on the addresses
    `ring_addrs(r)` names), run `body` on each; results or exceptions."""
    fabric = fabric or FakeFabric()
    port = free_port()
    out: list[Any] = [None] * n

    def worker(rank: int) -> None:
        host = FakeHost(fabric, rank, ring_addrs(rank))
        rdzv = Rendezvous(RendezvousConfig(rank, n, "127.0.0.1", port, timeout=10,
                                           secret=b"secret-of-the-comm-tests")).join()
        try:
            comm = connect(rdzv, host, cfg, controller if rank in controller_ranks else None,
                           pinned)
        except Exception as exc:        # noqa: BLE001 - the test inspects it
            out[rank] = exc
            rdzv.close(timeout=1)
            return
        try:
            out[rank] = body(comm, host)
        except Exception as exc:        # noqa: BLE001
            out[rank] = exc
        finally:
            comm.close(timeout=5)

    run_threads(n, worker, timeout=60)
    return out


def run_threads(n: int, worker: Callable[[int], None], timeout: float) -> None:
    """Run worker(rank) for ranks 0..n-1 on threads; assert every one ended within
    `timeout` s of the joins' start (a rank that hangs fails the test, naming none)."""
    threads = [threading.Thread(target=worker, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a rank hung"


class RankEngine(ProgressEngine):
    """A progress engine whose jobs run on the rank's own thread (`run_next`): the RC
    model schedules that thread alone (tests/rcmodel/inflight.py), and benchmarks/
    bench_host.py reads its CPU; `peek` and the order of jobs are the engine's."""

    def submit(self, job: Callable[[], Any], what: str, payload: Any = None) -> Work:
        work = Work(what)
        self._queue.append((work, job, payload))
        return work

    def on_thread(self) -> bool:
        return True

    def run_next(self) -> None:
        work, job, _ = self._queue.popleft()
        try:
            work.finish(result=job())
        except BaseException as exc:        # noqa: BLE001 - handed to the caller's wait()
            work.finish(error=exc)


def rank_data(rank: int, count: int, dtype: str) -> np.ndarray:
    """Rank `rank`'s input: integers in [-1000, 1000) or standard normal floats, seeded."""
    rng = np.random.default_rng(1000 + rank)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, count).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def with_fake_switch(n: int, body: Callable[[Communicator, FakeHost], Any],
                     fabric: FakeFabric | None = None
                     ) -> tuple[list[Any], FakeFabric, FakeController]:
    """`run_ranks` with rank 0 registering the "inc" ring with a fake controller of the
    fabric's fake switch (which sums each message of a registered ring); the results, the
    fabric and the controller."""
    fabric = fabric or FakeFabric()
    controller = FakeController(fabric)
    return run_ranks(n, body, fabric=fabric, controller=controller), fabric, controller


def messages(nbytes: int, cfg: FlowConfig = CFG) -> int:
    """RDMA messages of one transfer of `nbytes` under `cfg`."""
    return len(MessagePlan(nbytes, cfg.msg_size))
