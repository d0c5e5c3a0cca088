"""The simulated clock, and ranks as threads that take turns with it.

`Simulation` is a discrete-event loop: callbacks scheduled at simulated times run in time
order (FIFO among equal times). `Turns` runs one thread per rank over the real host code
(flowctl.Stream, netreduce.Communicator) so that exactly one thread runs at a time: a rank
runs until its stream waits for completions (`Turns.wait`), then the simulation advances
until that rank has a completion or its wait times out. While a rank runs, simulated time
stands still, so a run is a deterministic function of its inputs.

Invariants: `now` never decreases; at most one of {the scheduler, one rank} runs at a time;
a run ends in bounded simulated time and events (`SimulationLimit` otherwise: a hang), and
a rank that runs for more than `REAL_TIMEOUT` s of real time without waiting is reported
too.
"""
from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from typing import Any, Callable

REAL_TIMEOUT = 60.0
WAKE_LATENCY_S = 1e-6   # a timed-out wait returns this late, as a real one does: a caller
                        # that checks `waited > timeout` after it must see time move on


class SimulationLimit(AssertionError):
    """The model ran past its bounds of simulated time or events: the run would hang."""


class Aborted(BaseException):
    """Raised inside a rank thread whose run was abandoned (the scheduler gave up)."""


class Simulation:
    """Simulated time (seconds) and the events scheduled in it."""

    def __init__(self, max_time: float, max_events: int) -> None:
        self.now = 0.0
        self.events = 0
        self.max_time, self.max_events = max_time, max_events
        self._heap: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._seq = itertools.count()

    def at(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        """Run fn(*args) `delay` simulated seconds from now."""
        heapq.heappush(self._heap, (self.now + delay, next(self._seq), fn, args))

    def monotonic(self) -> float:
        """The clock flowctl.stream reads while a model runs (stands in for time.monotonic)."""
        return self.now

    def next_time(self) -> float:
        return self._heap[0][0] if self._heap else float("inf")

    def advance_to(self, t: float) -> None:
        self._check(t)
        self.now = max(self.now, t)

    def step(self) -> None:
        """Run the earliest event."""
        t, _, fn, args = heapq.heappop(self._heap)
        self._check(t)
        self.events += 1
        if self.events > self.max_events:
            raise SimulationLimit(f"more than {self.max_events} events (simulated time "
                                  f"{self.now:.3f} s): the run does not end")
        self.now = max(self.now, t)
        fn(*args)

    def _check(self, t: float) -> None:
        if t > self.max_time:
            raise SimulationLimit(f"simulated time passed {self.max_time} s "
                                  f"({self.events} events): the run does not end")


class Turns:
    """Runs one body per rank on its own thread, one thread at a time (see the module doc).

    Hand-offs are per-thread semaphores (the scheduler wakes exactly the rank whose turn it
    is, and that rank wakes only the scheduler), and a waiting rank is looked at again only
    after `poke(rank)` (its link queued a completion) or its deadline, so a turn costs the
    same at 8 ranks as at 1024. Invariant the waiters keep: a `ready()` that was false can
    turn true only after a `poke` of its rank.
    """

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self._sched = threading.Semaphore(0)     # released when the scheduler's turn comes
        self._sems: dict[int, threading.Semaphore] = {}
        self._turn: int | None = None            # None: the scheduler's turn
        self._aborted = False
        self._waiting: dict[int, tuple[float, Callable[[], bool], int]] = {}
        self._deadlines: list[tuple[float, int, int]] = []   # (deadline, token, rank), lazy
        self._tokens = itertools.count()
        self._poked: set[int] = set()

    def sleep(self, seconds: float) -> None:
        """time.sleep on the simulated clock: the rank whose turn it is waits `seconds`."""
        if self._turn is None:
            raise RuntimeError("Turns.sleep outside a rank's turn")
        self.wait(self._turn, seconds, lambda: False)

    def poke(self, rank: int) -> None:
        """Something `rank` may be waiting for happened (called from simulation events)."""
        self._poked.add(rank)

    def wait(self, rank: int, timeout: float, ready: Callable[[], bool]) -> None:
        """Called on rank's thread: give the turn back until `ready()` or `timeout`
        simulated seconds pass."""
        deadline = self.sim.now + max(timeout, 0.0) + WAKE_LATENCY_S
        token = next(self._tokens)
        self._waiting[rank] = (deadline, ready, token)
        heapq.heappush(self._deadlines, (deadline, token, rank))
        self._pass(rank)

    def run(self, bodies: list[Callable[[], Any]]) -> list[Any]:
        """Each body's return value, or the exception it raised."""
        n = len(bodies)
        results: list[Any] = [None] * n
        done: set[int] = set()
        self._sems = {r: threading.Semaphore(0) for r in range(n)}

        def thread(rank: int) -> None:
            try:
                self._await(rank)
                results[rank] = bodies[rank]()
            except Aborted:
                return
            except BaseException as exc:        # noqa: BLE001 - the caller inspects it
                results[rank] = exc
            done.add(rank)
            self._turn = None
            self._sched.release()

        threads = [threading.Thread(target=thread, args=(r,), daemon=True,
                                    name=f"rcmodel rank {r}") for r in range(n)]
        for t in threads:
            t.start()
        runnable = deque(range(n))
        try:
            while len(done) < n:
                if runnable:
                    self._give(runnable.popleft())
                    continue
                if self._poked:
                    woken = sorted((r for r in self._poked
                                    if r in self._waiting and self._waiting[r][1]()),
                                   key=lambda r: self._waiting[r][2])   # in order of waiting
                    self._poked.clear()
                    if woken:
                        for r in woken:
                            del self._waiting[r]
                        runnable.extend(woken)
                        continue
                deadline, rank = self._next_deadline()
                if self.sim.next_time() <= deadline:
                    self.sim.step()
                else:
                    self.sim.advance_to(deadline)
                    del self._waiting[rank]
                    runnable.append(rank)
        except BaseException:
            self._aborted = True
            for sem in self._sems.values():
                sem.release()
            raise
        for t in threads:
            t.join(timeout=REAL_TIMEOUT)
        return results

    def _next_deadline(self) -> tuple[float, int]:
        """The earliest (deadline, rank) among the waiting ranks (stale entries dropped)."""
        while True:
            deadline, token, rank = self._deadlines[0]
            held = self._waiting.get(rank)
            if held is not None and held[2] == token:
                return deadline, rank
            heapq.heappop(self._deadlines)

    def _give(self, rank: int) -> None:
        self._turn = rank
        self._sems[rank].release()
        if not self._sched.acquire(timeout=REAL_TIMEOUT):
            raise SimulationLimit(f"rank {rank} ran {REAL_TIMEOUT} s of real time "
                                  f"without waiting")

    def _await(self, rank: int) -> None:
        self._sems[rank].acquire()
        if self._aborted:
            raise Aborted()

    def _pass(self, rank: int) -> None:
        self._turn = None
        self._sched.release()
        self._await(rank)
