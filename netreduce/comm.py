"""The communicator: one rank's rings of RC QPs, their streams, and allreduce on top.

A communicator holds two rings of RC QPs to the same neighbours (`netreduce.rings`): "ring"
for host algorithms and "inc", dedicated to in-network aggregation. It coordinates a call:
checks its arguments, exchanges the per-call metadata (through the switch on "inc" while
it aggregates, else around "ring": `netreduce.meta`), routes the agreed call
(`netreduce.routing`, once per attempt) and runs the algorithm (`netreduce.algorithms`).
When a switch address is given, rank 0 registers "inc" at setup and unregisters it at close
(`netreduce.registration`); `switch` says on every rank alike whether it is registered.

Failures (liveness is separate from progress): every rank watches the others through the
rendezvous store (`Rendezvous.watch`), and every wait of a call checks it, so a peer that
died, went silent or aborted is reported within about a second as `PeerFailure` naming it
and the call; a live but slow peer is waited for up to `FlowConfig.collective_timeout`.
A rank whose call fails otherwise aborts through the store, so the others learn it too.
After any of these the communicator is unusable and says so; rank 0 unregisters the ring.

A switch that stops aggregating the registered ring costs one call's time, never the job:
the switch-away protocol (`netreduce.away.AwayProtocol`, docs/reliability.md) settles it
under this communicator's call lock -- inside the call that saw it, before the next call,
or on the progress thread when idle -- and the call not completed anywhere runs again over
the host ring from its untouched input; later calls run there ("auto"; algo="switch" is
`SwitchUnavailable`) until the ring is registered again. `stats()` counts it all.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable

import numpy as np

from flowctl.plan import FlowConfig
from flowctl.stream import CompletionError, Stream
from netreduce.algorithms import CallContext
from netreduce.algorithms.base import Spare
from netreduce.algorithms.switch import SWITCH
from netreduce.away import AwayProtocol, SwitchAway
from netreduce.dtypes import NAMES
from netreduce.errors import CommunicatorError, PeerFailure, TransportFault
from netreduce.inflight import Ahead, fits_window, in_flight_setting, slot
from netreduce.meta import (AHEAD, IN_FLIGHT, INLINE, REJOIN, CallMeta, CallRejected,
                            MetaExchange, SwitchNotAggregating, check_agreement, check_dtype,
                            check_op)
from netreduce.progress import ProgressEngine, Work
from netreduce.regcache import RegistrationCache
from netreduce.registration import Controller, SwitchStatus, published_capacity
from netreduce.rings import Host, RingQPsLike, inc_ring_spec
from netreduce.routing import (AWAY, FALLBACKS, CallStats, Route, candidates, check_request,
                               route)
from netreduce.tensors import as_ndarray
from netreduce.transport_fault import FaultRecovery, RingFault
from netreduce.workspace import RegisteredMemory, Workspace
from nr_contract.spec import RingSpec
from ring_setup.endpoints import HostEndpoint, neighbours
from ring_setup.rendezvous import Rendezvous
from ring_setup.store_protocol import PeerFailed, RendezvousError

logger = logging.getLogger(__name__)

FAILED_LEAVE_TIMEOUT = 5.0     # s a rank that failed waits to leave the rendezvous


class Communicator:
    """One rank's membership in a ring of `world_size` ranks. Build it with
    `netreduce.init(...)` or `netreduce.connect.create(...)`; close it on every rank."""

    def __init__(self, *, rendezvous: Rendezvous, host: Host, config: FlowConfig,
                 endpoints: list[HostEndpoint], streams: dict[str, Stream],
                 control: RegisteredMemory, switch: SwitchStatus,
                 controller: Controller | None,
                 inc_config: FlowConfig | None = None,
                 rings: dict[str, RingQPsLike] | None = None,
                 in_flight: int | None = None) -> None:
        self._rendezvous = rendezvous
        self._host = host
        self.config = config                  # the "ring" ring's knobs: what the user asked
        self.inc_config = inc_config or config  # the "inc" ring's: fitted to the switch
        self.rank = rendezvous.rank
        self.world_size = rendezvous.world_size
        self._streams = streams
        self._control = control
        _, successor = neighbours(endpoints, self.rank)
        self._meta = MetaExchange(streams, control, successor.control, self.rank,
                                  self.world_size, through_switch=switch.registered)
        # calls in flight (`in_flight` > 1, alike on every rank: their records say so):
        # call seq works in workspace seq % 2, and the next queued call's records travel
        # behind the running call's data (`_behind`, netreduce/inflight.py)
        self._in_flight = in_flight_setting(in_flight)
        self._workspaces = (Workspace(host.register), Workspace(host.register))
        self._ahead: Ahead | None = None
        self._registered = RegistrationCache(getattr(host, "register_user", None))
        self._calls = 0                       # calls started: the next one's seq (all alike)
        self._running = threading.Lock()      # one call runs at a time (see _run)
        self._engine = ProgressEngine(f"nr-progress-{self.rank}")
        self._broken: BaseException | None = None
        self._closed = False
        self._controller = controller         # rank 0's controller client, if any
        self.last_algo: str | None = None    # the algorithm the last allreduce ran
        self.last_fallback: str | None = None   # why that "auto" call did not take the switch
        self._stats = CallStats()
        self._away = AwayProtocol(
            rendezvous=rendezvous, host=host, control=control, endpoints=endpoints,
            streams=streams, inc=(rings or {}).get("inc"), inc_config=self.inc_config,
            timeout=config.collective_timeout, status=switch, controller=controller,
            stats=self._stats, meta=self._meta, workspaces=self._workspaces, slot=self._slot)
        self._faults = FaultRecovery(
            rendezvous=rendezvous, host=host, control=control, config=config, streams=streams,
            qps=(rings or {}).get("ring"), epochs=self._away, stats=self._stats,
            redo=self._attempt)
        self._away.on_fault = self._faults.settle
        rendezvous.on_notice(self._noticed)

    @property
    def in_flight(self) -> int:
        """Asynchronous calls kept in flight (fixed at creation; docs/reliability.md)."""
        return self._in_flight

    @property
    def device(self) -> str:
        return self._host.device

    @property
    def switch(self) -> SwitchStatus:
        """Whether "inc" is registered with a switch, and which ring (alike on every rank)."""
        return self._away.status

    @property
    def _endpoints(self) -> list[HostEndpoint]:
        """Every rank's endpoints, "inc" as last built (the bench's RTT probe reads them)."""
        return self._away.endpoints

    def published_capacity(self) -> int:
        """Rank 0: the share of a sharded call its controller publishes (0: none, or no
        controller here; netreduce/shards.py)."""
        return published_capacity(self._controller) if self._controller is not None else 0

    def inc_ring_spec(self) -> RingSpec:
        """The "inc" ring as the switch controller needs it (identical on every rank)."""
        return inc_ring_spec(self._endpoints, self.inc_config, self._rendezvous.job_key)

    def allreduce(self, array: Any, op: str = "sum", algo: str = "auto",
                  out: Any = None, async_op: bool = False) -> Any:
        """Reduce `array` element-wise over all ranks into `out` (default: `array` itself,
        in place) and return it; `last_algo` then names the algorithm that ran ("auto":
        "switch" when `switch.registered` and the switch can carry the call, else "ring",
        decided alike on every rank from the exchanged metadata: `netreduce.routing`) and
        `last_fallback` why an "auto" call ran over the ring although a switch is
        registered (None otherwise; `stats()` counts them). `array` and `out` are numpy
        arrays or contiguous CPU torch tensors of a
        supported dtype (reduced in their own memory, `netreduce.tensors`). Every rank must
        call with the same shape, dtype, op and algo; a
        disagreement raises `AllreduceMismatch` on every rank and changes nothing, as do
        the switch's refusals (`AllreduceOverflow`; `NotQuantizable` under algo="switch"
        only): any `CallRejected` leaves the communicator usable. Arguments that are wrong
        on their own (unsupported dtype, unknown op or algo, algo="switch" without a
        registered switch, bad `out`) raise before any exchange.

        `async_op=True` checks the arguments at once, then queues the call on this
        communicator's progress thread and returns a `Work` at once: `wait()` returns what
        the synchronous call would have returned or raises what it would have raised.
        Calls run in the order issued; a synchronous call first waits for every
        asynchronous call issued before it. Don't touch `array`/`out` until `wait()`."""
        self._check_usable()
        call = self._prepare(array, op, algo, out)
        if async_op:
            return self._engine.submit(lambda: self._run(call), call.what(None), payload=call)
        if not self._engine.on_thread():
            self._engine.drain()
        return self._run(call)

    def submit(self, job: Callable[[], Any], what: str,
               first: tuple[Any, str, str] | None = None) -> Work:
        """Run `job()` on the progress thread, in issue order with the asynchronous calls;
        the returned `Work` completes with what `job` returns or raises. `job` may call
        `allreduce` synchronously (it runs at once, on that thread): how a composite
        operation (the DDP hook's call, then its fallback) keeps its place in the order.
        `first`: the (array, op, algo) of the in-place call `job` makes first, whose
        records may then go ahead (calls in flight); arguments it refuses are `job`'s."""
        self._check_usable()
        payload = None
        if first is not None:
            try:
                payload = self._prepare(*first, None)
            except (TypeError, ValueError):     # the job's own call raises them
                pass
        return self._engine.submit(job, what, payload=payload)

    def _prepare(self, array: Any, op: str, algo: str, out: Any) -> "_Call":
        """Check one call's arguments (no exchange)."""
        values = as_ndarray(array, "array")
        dtype = check_dtype(values.dtype)
        ufunc = check_op(op, dtype)
        check_request(algo, dtype, op, self.switch)
        target = values if out is None else as_ndarray(out, "out")
        if target.shape != values.shape or target.dtype != dtype:
            raise ValueError(f"allreduce: out must be a {dtype} array of shape {values.shape}")
        if not target.flags.writeable:
            raise ValueError("allreduce: the result array is read-only")
        return _Call(values, target, array if out is None else out, op, ufunc, algo)

    def _run(self, call: "_Call") -> Any:
        """Run one prepared call (one at a time: the synchronous caller after draining the
        progress thread, or the progress thread itself)."""
        with self._running:
            self._check_usable()
            self._execute(call)
        return call.result

    def _execute(self, call: "_Call") -> None:
        seq = self._calls
        try:
            taken = self._complete(call, seq)
        except CallRejected:
            self._away.recovered()
            raise
        except TransportFault as exc:   # decided alike on every rank: no abort
            raise self._break(exc)
        except PeerFailed as exc:
            raise self._break(PeerFailure(
                f"netreduce: rank {self.rank}: {call.what(seq)} failed: {exc}; the "
                f"communicator is unusable (netreduce.finalize(), then netreduce.init() a "
                f"new one)",
                exc.ranks)) from exc
        except BaseException as exc:
            self._rendezvous.abort(f"{call.what(seq)} failed: {type(exc).__name__}: {exc}")
            raise self._break(exc)
        self._count(taken, call, seq)
        self.last_algo, self.last_fallback = taken.algorithm.name, taken.fallback

    def _complete(self, call: "_Call", seq: int) -> Route:
        """Run call `seq` until it completes: settle the notices pending (the switch went
        away, or a transport fault: `AwayProtocol.settle`, netreduce.transport_fault) --
        first as idle, then with the call in flight -- and attempt it again from its
        untouched input (its output not written), unless a settle finished it from a good
        rank's sum; algo="switch" is refused over the host ring."""
        target: np.ndarray | None = None     # None: the call has not started (idle)
        seen: str | None = None              # what this rank saw, published if none pending
        while True:
            try:
                if self._settle(seq, target, seen):
                    self._calls = seq + 1
                    self._away.recovered()
                    return Route(SWITCH)      # its wire words, summed over the ring
                seen, target = None, call.target
                taken = self._attempt(call, seq)
                self._away.recovered()
                return taken
            except (SwitchAway, SwitchNotAggregating, RingFault, CompletionError) as exc:
                self._calls = seq
                seen = self._faults.seen(exc)

    def _settle(self, position: int, target: np.ndarray | None, seen: str | None) -> bool:
        """Settle every notice pending at this rank's `position` (`seen`: what it saw,
        published unless a notice is pending); True when its call in flight (`target`)
        was finished from a good rank's sum. A transport fault during a settle is
        settled next once its epoch was settled (a rank redoing a call it had completed, or
        a good rank's sum handed over the host ring, then redone: `AwayProtocol.settle`);
        one before that is a `CommunicatorError`."""
        while self._away.pending or seen is not None:
            self._ahead = None          # "inc" goes to ERROR: the records ahead are void
            epoch = self._away.epoch
            try:
                if self._away.settle(position, target, seen):
                    return True
                seen = None
            except (RingFault, CompletionError) as exc:
                if self._away.epoch == epoch:
                    raise CommunicatorError(
                        f"netreduce: rank {self.rank}: a transport fault while settling "
                        f"notice epoch {epoch + 1}, which needs the host ring: {exc}") from exc
                seen = self._faults.seen(exc)
        return False

    def _attempt(self, call: "_Call", seq: int) -> Route:
        """Call `seq` once: route it before the exchange (`candidates`), metadata exchange
        (through the switch while it aggregates, else around the host ring; or only its
        bank received, when its records went behind the previous call's data: `Ahead`),
        agreement, rejoining the switch when rank 0's record asks for it, route, run.
        Raises `SwitchAway` / `SwitchNotAggregating` when the switch stopped aggregating
        during it (the caller settles)."""
        array, target, away = call.array, call.target, self._away
        self._rendezvous.check_peers()
        away.meet()
        through_switch, was_away = away.aggregating, away.reason is not None
        ahead, self._ahead = self._ahead, None
        if ahead is not None:           # a settle voids them (`_settle`)
            if not ahead.call.same(call) or ahead.record.seq != seq or not through_switch:
                raise CommunicatorError(
                    f"netreduce: rank {self.rank}: {call.what(seq)} overtook the asynchronous "
                    f"{ahead.call.what(ahead.record.seq)}, whose records went ahead (calls "
                    f"issued from several threads at once)")
            mine, workspace = ahead.record, ahead.workspace
            exchange: Callable[[], list[CallMeta]] = lambda: self._meta.collect(seq)
        else:
            mine, workspace = self._record(call, seq, REJOIN if away.rejoin_due else 0)
            exchange = lambda: self._meta.exchange(mine, through_switch, settle=False)
        self._calls = seq + 1
        away.began(mine)
        # unsettled: the switch's successor acknowledges these records while this rank
        # checks and routes the call; the "inc" stream is settled before any output is
        # written (a call whose acknowledgement fails is settled as not completed here)
        records = away.on_inc(through_switch, exchange)
        # every rank started this call, so completed the last one -- unless some rank
        # posted these records before completing it (AHEAD): then the one before
        early = any(m.flags & AHEAD for m in records)
        away.forget_kept(seq - 1 if early else seq)
        self._registered.unpin(seq - 1 if early else seq)
        self._faults.forget(seq)
        try:
            context = self._context(call, records, workspace)
            if was_away and records[0].flags & REJOIN:
                away.rejoin(seq)        # alike on every rank; this call still runs the ring
            taken = route(call.algo, context, call.op, through_switch, away=was_away)
        except CallRejected:
            self._confirm(early, mine)
            away.settle_inc(through_switch)
            raise
        if taken.algorithm is SWITCH:   # kept: its sum may be handed over the ring
            if context.inline:
                self._confirm(early, mine)
            away.run_switch(self._behind(context, target), array, target, mine)
        else:
            away.settle_inc(through_switch)
            self._faults.keep(seq, call)    # a rank ahead redoes it after a fault
            taken.algorithm.run(context, array, target)
        return taken

    def _slot(self, seq: int) -> int:
        return slot(seq, self._in_flight)

    def _record(self, call: "_Call", seq: int, flags: int) -> tuple[CallMeta, RegisteredMemory]:
        """This rank's record of call `seq` and its workspace, sized for every route the
        call may take (`candidates`)."""
        array, dtype, away = call.array, call.array.dtype, self._away
        algorithms = candidates(call.algo, dtype, call.op, away.status, away.reason)
        workspace = self._workspaces[self._slot(seq)].ensure(max(
            a.workspace_bytes(array.size, dtype, self.world_size) for a in algorithms),
            keep=away.keeping)
        data = algorithms[0].local_range(array, Spare(workspace, away.free_below(workspace),
                                                      seq, self.world_size))
        flags |= (INLINE if data.inline else 0) | (IN_FLIGHT if self._in_flight > 1 else 0)
        return CallMeta(rank=self.rank, seq=seq, count=array.size, dtype=NAMES[dtype],
                        op=call.op, algo=call.algo, workspace=workspace.remote(),
                        lo=data.lo, hi=data.hi, blocks=data.blocks, flags=flags), workspace

    def _behind(self, context: CallContext, target: np.ndarray) -> CallContext:
        """Calls in flight: the records of the next queued call (`ProgressEngine.peek`)
        go on "inc" right behind this switch call's data (`CallContext.then`), so its
        agreement arrives with this call's sums. The wire order on "inc" -- a call's data,
        then the next call's records -- is the same whenever a rank posts them, so each
        rank decides alone. Not for a small call (its records are its data: completing it
        would not wait for this call's completion everywhere), nor past the "inc" window
        (`fits_window`), nor when the next call's input may be this call's output `target`
        (its records describe the result)."""
        if self._in_flight < 2 or context.inline:
            return context
        nxt = self._engine.peek()
        if not isinstance(nxt, _Call) or not self._engine.on_thread() \
                or not self._away.aggregating or np.may_share_memory(nxt.array, target) \
                or not fits_window(context.count, self.world_size, self._streams["inc"].config):
            return context
        record, workspace = self._record(nxt, context.seq + 1, AHEAD)
        if record.flags & INLINE:
            return context
        self._away.settle_inc(True)     # the records' send area is rewritten
        then = self._meta.outgoing(record)
        self._ahead = Ahead(nxt, record, workspace)
        return replace(context, then=then)

    def _confirm(self, early: bool, mine: CallMeta) -> None:
        """A call ending without its data moving on "inc" (refused, or a small call) whose
        records some rank posted early (`early`: AHEAD, alike on every rank) first
        exchanges them once more through the switch: every rank sends these only after
        it completed the previous call, so no rank gets two calls ahead of another (the
        switch-away settle's positions, docs/reliability.md)."""
        if early:
            self._away.settle_inc(True)
            self._away.on_inc(True, lambda: self._meta.exchange(mine, True, settle=False))

    def _context(self, call: "_Call", records: list[CallMeta],
                 workspace: RegisteredMemory) -> CallContext:
        """The agreed call from every rank's record of it (`AllreduceMismatch` unless they
        describe the same call)."""
        check_agreement(records)
        return CallContext(
            rank=self.rank, world_size=self.world_size, seq=records[0].seq,
            count=call.array.size, dtype=call.array.dtype, op=call.ufunc,
            divisor=self.world_size if call.op == "avg" else 1,
            ranges=tuple((m.lo, m.hi) for m in records),
            workspace=workspace,
            peer_workspace=records[(self.rank + 1) % self.world_size].workspace,
            streams=self._streams, blocks=tuple(m.blocks for m in records),
            inline=bool(records[0].flags & INLINE),
            registered=partial(self._registered.local, pin=records[0].seq))

    def _noticed(self, epoch: int, reason: str) -> None:
        """A switch-away notice arrived (watch thread): an idle rank settles it on the
        progress thread (a rank in a call settles it there, at the latest at its next
        call's start; the job then finds it settled)."""
        if epoch <= self._away.epoch or self._away.closing or self._closed:
            return
        try:
            self._engine.submit(self._settle_idle, f"switch-away epoch {epoch}")
        except RuntimeError:        # closing: the engine takes no more jobs
            pass

    def _settle_idle(self) -> None:
        with self._running:
            if self._closed or self._broken is not None or not self._away.pending:
                return
            what = f"settling notice epoch {self._away.epoch + 1} while idle"
            try:
                self._settle(self._calls, None, None)
                self._away.recovered()
            except TransportFault as exc:
                self._break(exc)
            except PeerFailed as exc:
                self._break(PeerFailure(f"netreduce: rank {self.rank}: {what}: {exc}",
                                        exc.ranks))
            except BaseException as exc:    # noqa: BLE001 - the next call reports it
                self._rendezvous.abort(f"{what} failed: {type(exc).__name__}: {exc}")
                self._break(exc)

    def _count(self, taken: Route, call: "_Call", seq: int) -> None:
        """Count the call's route; rank 0 warns the first time "auto" falls back to the
        ring for a reason (every rank takes the same route: one line per job suffices;
        the switch's departures are logged when they happen)."""
        if self._stats.count(taken) and self.rank == 0 and taken.fallback != AWAY:
            logger.warning("netreduce: %s runs over the host ring although the switch is "
                           "registered: %s (logged once per reason; comm.stats() counts "
                           "them)", call.what(seq), FALLBACKS[taken.fallback])

    def stats(self) -> dict[str, dict[str, int]]:
        """The routes of this communicator's calls so far, the same on every rank:
        {"calls": {"switch" | "ring": calls routed there}, "fallbacks": {reason: "auto" calls
        that ran over the ring although a switch is registered}, "switch": {"fallbacks":
        times the switch went away, "returns": times the ring was registered again,
        "recovered": calls finished from a good rank's sum over the ring}, "transport":
        {"faults": transport faults settled, "rebuilds": rings rebuilt for them, "redone":
        calls redone after them, "ms_lost": this rank's time from their detection to the
        completion of the call they interrupted}}
        (`netreduce.transport_fault`); the reasons are the keys of
        `netreduce.routing.FALLBACKS` ("dtype", "op", "non-finite", "switch-away")."""
        return self._stats.snapshot()

    def _break(self, exc: BaseException) -> BaseException:
        """Mark the communicator unusable by `exc`; rank 0 unregisters the ring at once
        (nothing aggregates on it any more). Returns `exc`."""
        self._broken = exc
        self._away.release()
        return exc

    def _check_usable(self) -> None:
        if self._closed:
            raise CommunicatorError(f"rank {self.rank}: the communicator is closed")
        if self._broken is not None:
            raise CommunicatorError(f"rank {self.rank}: the communicator is unusable after an "
                                    f"earlier error: {self._broken}")

    def close(self, timeout: float = 10.0) -> None:
        """Leave the ring: wait (up to `timeout` s; 5 s once broken) for every rank to close
        too, so no peer is still sending to our QPs; rank 0 then stops renewing the lease and
        unregisters the "inc" ring from the switch; then destroy QPs, memory and the device
        context."""
        if self._closed:
            return
        self._away.closing = True
        self._finish_async_calls(timeout)
        t0 = time.monotonic()
        self._quiesce(timeout)
        self._closed = True
        timeout = max(1.0, timeout - (time.monotonic() - t0))   # one wait for the others
        if self._broken is not None:       # the others know: no long wait for a dead peer
            timeout = min(timeout, FAILED_LEAVE_TIMEOUT)
        self._rendezvous.close(timeout)
        self._away.release()
        if self._controller is not None:
            self._controller.close()
        for workspace in self._workspaces:
            workspace.close()
        self._registered.close()
        self._control.close()
        self._host.close()

    def _quiesce(self, timeout: float) -> None:
        """Before leaving a ring registered with a switch: wait (up to `timeout` s) until
        every rank is closing too (`AwayProtocol.wait_closing`). Alike on every rank
        (`switch.registered` is)."""
        if self._broken is not None or not self.switch.registered:
            return
        with self._running:
            try:
                self._away.wait_closing(self._calls, timeout)
            except RendezvousError as exc:      # PeerFailed included: leave as before
                logger.info("netreduce: rank %d: closing without every rank: %s",
                            self.rank, exc)
            except TransportFault as exc:       # decided alike on every rank: no abort
                self._break(exc)
            except BaseException as exc:    # noqa: BLE001 - closing: tell the others, go on
                self._rendezvous.abort(f"closing: {type(exc).__name__}: {exc}")
                self._break(exc)

    def _finish_async_calls(self, timeout: float) -> None:
        """Wait up to `timeout` s for the asynchronous calls issued, then cancel the rest:
        those not started fail with `CommunicatorError`; the one running is aborted
        through the rendezvous, so it fails within about a second here (and on the other
        ranks, as `PeerFailure` naming this rank)."""
        running = self._engine.close(timeout, self.rank)
        if running is not None:
            self._rendezvous.abort(f"{running.what} was still running {timeout:g}s after "
                                   f"this rank closed the communicator")
            self._engine.join(FAILED_LEAVE_TIMEOUT)

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Communicator(rank={self.rank}, world_size={self.world_size}, "
                f"device={self.device!r}, mtu={self.config.mtu}, "
                f"msg_size={self.config.msg_size}, window={self.config.window}, "
                f"ack_timeout={self.config.ack_timeout}, "
                f"inc mtu={self.inc_config.mtu}, msg_size={self.inc_config.msg_size}, "
                f"window={self.inc_config.window}, ack_timeout={self.inc_config.ack_timeout}, "
                f"switch={self.switch.ring_id!r})")


@dataclass(frozen=True)
class _Call:
    """One checked allreduce call: `array`/`target` are the numpy views reduced, `result`
    what the call returns (the caller's own array or tensor)."""

    array: np.ndarray
    target: np.ndarray
    result: Any
    op: str
    ufunc: np.ufunc
    algo: str                                   # as asked: "auto", "switch" or "ring"

    def same(self, other: "_Call") -> bool:
        """The same call: its arrays in the same memory, the same op and algo (a job's own
        call and the one `Communicator.submit` was told it makes first)."""
        def where(a: np.ndarray) -> tuple:
            return a.__array_interface__["data"][0], a.shape, a.strides, a.dtype
        return self is other or (where(self.array) == where(other.array)
                                 and where(self.target) == where(other.target)
                                 and (self.op, self.algo) == (other.op, other.algo))

    def what(self, seq: int | None) -> str:
        """How messages name the call (`seq`: its number once it started)."""
        number = "" if seq is None else f" #{seq}"
        return (f"allreduce call{number} ({self.array.dtype}[{self.array.size}] "
                f"op={self.op} algo={self.algo})")
