"""k aggregators sharing one call (issue 42): the one home of the shard logic.

A job given k > 1 switch controllers (`netreduce.init(switch="A:P,B:P", inc_addr="N0,N1")`,
or $NR_CONTROLLER and $NR_INC_ADDR as comma-separated lists of equal length) gets a
`ShardedCommunicator`: one ordinary `Communicator` per aggregator j, each with its own
rendezvous store (its port and the job's secret travel through aggregator 0's store), its
own "inc" ring on the address j names (routed through aggregator j), its registration,
lease and switch-away state (`netreduce.away.AwayProtocol`), and its own host ring. One
call is split into k contiguous shards (`split`): shard j's elements are reduced by
communicator j, all k at once, each on its communicator's progress thread.

Invariants:
- Every rank splits alike: the split is a function of the call's element count and the
  weights rank 0 read from each controller's Ping (`TargetLimits.capacity`; 0 or absent
  counts as 1, so equal shares by default) and shared through the store at setup; so each
  communicator sees the same sequence of shard calls on every rank.
- Exactness per shard: int32 shards are exact as any call is. A float32 shard is its own
  call with its own agreed block scales (netreduce/algorithms/switch.py); shard boundaries
  are multiples of the whole call's block (`block_elements(count)`), and a shard's blocks
  (a power of two no larger) nest inside the call's, so every element's error bound is
  relative to a block maximum no larger than the unsharded call's: the documented bound
  holds.
- An aggregator lost is one communicator's switch-away: its shard runs over its host ring
  until it registers again; the other shards stay on their aggregators.
- A refusal (`CallRejected`, alike on every rank) of any shard changes nothing in place, as
  one communicator's refusal does: an in-place call's shards write a scratch array, copied
  back once every shard completed (the DDP hook re-runs a refused bucket over the ring);
  into `out=`, the shards that completed are written.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from netreduce.algorithms.switch import block_elements
from netreduce.comm import Communicator
from netreduce.connect import create
from netreduce.errors import CommunicatorError
from netreduce.progress import ProgressEngine, Work
from netreduce.rings import INC_ADDR_ENV
from netreduce.tensors import as_ndarray
from nr_contract.tokens import ADDR_ENV
from ring_setup.rendezvous import PortExchange, Rendezvous

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Aggregator:
    """One aggregator of a sharded job: its controller's HOST:PORT and the "inc" address
    (or network) of this host routed through it."""

    controller: str
    inc_addr: str


def aggregators(switch: str | None, inc_addr: str | None) -> list[Aggregator] | None:
    """The aggregators `switch` and `inc_addr` (else $NR_CONTROLLER, $NR_INC_ADDR) name when
    they list more than one controller, comma-separated, with one "inc" address each;
    None for a single switch or none (the communicator's own business, unchanged)."""
    switch = os.environ.get(ADDR_ENV, "") if switch is None else switch
    controllers = [c.strip() for c in switch.split(",")]
    if len(controllers) < 2:
        return None
    inc_addr = inc_addr or os.environ.get(INC_ADDR_ENV) or ""
    addrs = [a.strip() for a in inc_addr.split(",")]
    if "" in controllers or len(addrs) != len(controllers) or "" in addrs:
        raise ValueError(
            f"netreduce: {len(controllers)} switch controllers ({switch!r}) need as many "
            f"'inc' addresses, one routed through each (inc_addr or ${INC_ADDR_ENV}, "
            f"comma-separated, e.g. '10.78.0.0/24,10.78.1.0/24'): got {inc_addr!r}")
    return [Aggregator(c, a) for c, a in zip(controllers, addrs)]


def split(count: int, weights: Sequence[int], align: int) -> list[tuple[int, int]]:
    """Contiguous (lo, hi) element ranges, one per weight, covering [0, count): shard j
    gets about count * w_j / sum(w) elements, every boundary a multiple of `align` but the
    end (`count`), so small calls leave the later shards empty (lo == hi)."""
    if not weights or min(weights) < 0 or sum(weights) == 0 or align < 1:
        raise ValueError(f"split: weights {list(weights)} and align {align} must be "
                         f"non-negative, not all zero, and align >= 1")
    total, before, bounds = sum(weights), 0, [0]
    for w in weights[:-1]:
        before += w
        bounds.append(min(count, max(bounds[-1], round(count * before / total / align) * align)))
    bounds.append(count)
    return list(zip(bounds[:-1], bounds[1:]))


def shard_align(count: int, dtype: np.dtype) -> int:
    """The boundary alignment that keeps a call's exactness (module doc): 1 for integers,
    else (floats, bfloat16 included) the call's block."""
    return 1 if dtype.kind in "iu" else block_elements(count)


def store_exchange(first: Rendezvous, j: int) -> PortExchange:
    """`Rendezvous.join`'s exchange for communicator `j`'s store: its port and secret pass
    through `first`'s store (rank 0 publishes them, every rank reads rank 0's)."""
    def exchange(mine: tuple[int, str] | None) -> tuple[int, str]:
        port, secret = first.all_gather(f"shard-store.{j}", None if mine is None else list(mine),
                                        waiting_for=f"learned communicator {j}'s store")[0]
        return int(port), secret
    return exchange


class ShardedCommunicator:
    """One rank's membership in a job whose calls are split over k aggregators (module doc).
    It answers `allreduce`, `stats`, `close` like a `Communicator`; `shards[j]` is
    aggregator j's communicator, `weights` the shares every rank agreed on."""

    def __init__(self, shards: list[Communicator], weights: list[int]) -> None:
        self.shards, self.weights = shards, weights
        self.rank, self.world_size = shards[0].rank, shards[0].world_size
        self.config = shards[0].config
        self._engine = ProgressEngine(f"nr-shards-{self.rank}")
        self._bytes = [dict.fromkeys(("switch", "ring"), 0) for _ in shards]
        self.last_algo: str | None = None
        self.last_fallback: str | None = None   # a shard's "auto" fallback reason, if any
        self._closed = False

    @classmethod
    def create(cls, aggs: list[Aggregator], rank: int | None = None,
               world_size: int | None = None, master_addr: str | None = None,
               master_port: int | None = None, *,
               connect: Callable[..., Communicator] | None = None,
               **kwargs: Any) -> "ShardedCommunicator":
        """Collective: one communicator per aggregator of `aggs` (`connect`, default
        `netreduce.connect.create`, with its controller and "inc" address; `kwargs` go to each),
        the first rendezvousing as a single communicator would, the others through its
        store; then the shares (`weights`)."""
        connect = connect or create
        shards: list[Communicator] = []
        try:
            for j, agg in enumerate(aggs):
                exchange = store_exchange(shards[0]._rendezvous, j) if j else \
                    kwargs.pop("port_exchange", None)
                shards.append(connect(rank, world_size, master_addr, master_port,
                                      switch=agg.controller, inc_addr=agg.inc_addr,
                                      port_exchange=exchange, **kwargs))
            return cls(shards, share_weights(shards))
        except BaseException:
            for comm in reversed(shards):
                comm.close(timeout=5)
            raise

    @property
    def device(self) -> str:
        """The rxe device (every aggregator's communicator opens the same one)."""
        return self.shards[0].device

    @property
    def switch(self) -> Any:
        """Aggregator 0's status (`shards[j].switch` for the others)."""
        return self.shards[0].switch

    def allreduce(self, array: Any, op: str = "sum", algo: str = "auto",
                  out: Any = None, async_op: bool = False) -> Any:
        """`Communicator.allreduce` over the k aggregators: shard j of the flattened array
        (`split`) is reduced by `shards[j]`, all at once; returns `out` (default `array`)."""
        self._check_usable()
        values = as_ndarray(array, "array")
        target = values if out is None else as_ndarray(out, "out")
        if target.shape != values.shape or target.dtype != values.dtype:
            raise ValueError(f"allreduce: out must be a {values.dtype} array of shape "
                             f"{values.shape}")
        job = lambda: self._run(values.reshape(-1), target.reshape(-1), op, algo,   # noqa: E731
                                array if out is None else out,
                                np.shares_memory(values, target))
        if async_op:
            return self._engine.submit(job, f"sharded allreduce ({values.dtype}[{values.size}])")
        if not self._engine.on_thread():
            self._engine.drain()
        return job()

    def submit(self, job: Callable[[], Any], what: str, first: Any = None) -> Work:
        """`Communicator.submit`: `job()` on this communicator's progress thread, in issue
        order with the asynchronous calls (netreduce.torch's DDP hook uses it); `first` is
        not used: the shards' calls run one at a time on their own communicators."""
        self._check_usable()
        return self._engine.submit(job, what)

    def _run(self, values: np.ndarray, target: np.ndarray, op: str, algo: str,
             result: Any, in_place: bool) -> Any:
        ranges = split(values.size, self.weights, shard_align(values.size, values.dtype))
        busy = [(j, lo, hi) for j, (lo, hi) in enumerate(ranges) if hi > lo]
        # in place over 2+ shards: a scratch array, so that a refusal changes nothing
        dst = np.empty_like(target) if in_place and len(busy) > 1 else target
        works: list[tuple[int, Work]] = []
        for j, lo, hi in busy:
            works.append((j, self.shards[j].allreduce(values[lo:hi], op, algo,
                                                      out=dst[lo:hi], async_op=True)))
        errors = []
        for j, work in works:
            try:
                work.wait()
            except BaseException as exc:    # noqa: BLE001 - every shard waited for first
                errors.append(exc)
                continue
            lo, hi = ranges[j]
            route = self.shards[j].last_algo or "ring"
            self._bytes[j][route] = self._bytes[j].get(route, 0) + (hi - lo) * values.itemsize
        if errors:
            raise errors[0]
        if dst is not target:
            target[...] = dst
        algos = sorted({str(self.shards[j].last_algo) for j, _ in works}, reverse=True)
        self.last_algo = "+".join(algos)    # "switch", "ring", or "switch+ring": some shards
        self.last_fallback = next((self.shards[j].last_fallback for j, _ in works
                                   if self.shards[j].last_fallback), None)
        return result

    def stats(self) -> dict[str, Any]:
        """{"aggregators": [per aggregator j: {"controller", "bytes" (data bytes of its
        shards it aggregated), "ring_bytes" (of its shards run over its host ring), "calls",
        "fallbacks" (its switch-away fallbacks), "returns", "stats" (`shards[j].stats()`)}]},
        the same on every rank."""
        rows = []
        for comm, moved in zip(self.shards, self._bytes):
            stats = comm.stats()
            rows.append({"controller": comm.switch.controller, "bytes": moved["switch"],
                         "ring_bytes": moved["ring"], "calls": stats["calls"].get("switch", 0),
                         "fallbacks": stats["switch"]["fallbacks"],
                         "returns": stats["switch"]["returns"], "stats": stats})
        return {"aggregators": rows}

    def _check_usable(self) -> None:
        if self._closed:
            raise CommunicatorError(f"rank {self.rank}: the communicator is closed")

    def close(self, timeout: float = 10.0) -> None:
        """Close every aggregator's communicator (collective), aggregator 0's last: the
        others' stores were found through its store."""
        if self._closed:
            return
        self._closed = True
        running = self._engine.close(timeout, self.rank)
        if running is not None:     # its shards' communicators abort it as they close
            logger.warning("netreduce: rank %d: closing with %s still running", self.rank,
                           running.what)
        for comm in reversed(self.shards):
            comm.close(timeout)

    def __enter__(self) -> "ShardedCommunicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShardedCommunicator(rank={self.rank}, weights={self.weights}, {self.shards})"


def create_communicator(rank: int | None = None, world_size: int | None = None,
                        master_addr: str | None = None, master_port: int | None = None, *,
                        switch: str | None = None, inc_addr: str | None = None,
                        **kwargs: Any) -> Communicator | ShardedCommunicator:
    """Collective: the communicator `switch` and `inc_addr` (else $NR_CONTROLLER,
    $NR_INC_ADDR) ask for: a `ShardedCommunicator` when they list k > 1 aggregators, else
    `netreduce.connect.create`'s (`kwargs` go to each). `netreduce.init` and the torch backend
    make theirs here."""
    aggs = aggregators(switch, inc_addr)
    if aggs:
        return ShardedCommunicator.create(aggs, rank, world_size, master_addr, master_port,
                                          **kwargs)
    return create(rank, world_size, master_addr=master_addr, master_port=master_port,
                  inc_addr=inc_addr, switch=switch, **kwargs)


def share_weights(shards: list[Communicator]) -> list[int]:
    """Collective: the shares of the aggregators, alike on every rank: rank 0 reads what
    each controller publishes (`Communicator.published_capacity`; 0, none, or a silent
    controller: 1) and shares them through aggregator 0's store."""
    first = shards[0]
    mine = [max(1, comm.published_capacity()) for comm in shards] if first.rank == 0 else None
    weights = first._rendezvous.all_gather("shard-weights", mine,
                                           waiting_for="learned the aggregators' shares")[0]
    if first.rank == 0:
        logger.info("netreduce: %d aggregators share each call in proportion %s: %s",
                    len(shards), weights, "; ".join(c.switch.describe() for c in shards))
    return [int(w) for w in weights]
