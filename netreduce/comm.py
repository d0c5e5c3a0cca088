"""The communicator: one rank's rings of RC QPs, their streams, and allreduce on top.

A communicator holds two rings of RC QPs to the same neighbours: "ring" for host
algorithms and "inc", dedicated to in-network aggregation: on "inc" every rank must post
the identical message sequence. The per-call metadata exchange goes through the switch on
"inc" when "inc" is registered (one bank-sized message per call, on every rank alike),
else around "ring" (netreduce.meta). `inc_ring_spec()` describes "inc" for the switch
controller; when a switch address is given, rank 0 registers it at setup and unregisters
it at close (`netreduce.registration`), and `switch` says on every rank alike whether it
is registered.

Failures (liveness is separate from progress): every rank watches the others through the
rendezvous store (`Rendezvous.watch`), and every wait of a call checks it, so a peer that
died, went silent or aborted is reported within about a second as `PeerFailure` naming it
and the call; a live but slow peer is waited for up to `FlowConfig.collective_timeout`.
A rank whose call fails otherwise aborts through the store, so the others learn it too.
After any of these the communicator is unusable and says so; rank 0 unregisters the ring.

A switch that stops aggregating the registered ring (it restarted, or lost the ring: a
lease renewal hears NOT_FOUND, a call's seal or metadata came back unaggregated) costs one
call's time, never the job (docs/reliability.md has the argument): the rank that sees it
publishes a switch-away notice of epoch e through the store; every rank settles epoch e
once, under the call lock (`_settle`: inside its call, or on the progress thread when
idle): it moves its "inc" QPs to ERROR, publishes its position, and all agree on the
call k* to settle (`netreduce.away.settle_plan`). When some rank completed k* with a good
seal, every rank sums its kept wire words of k* over the host ring and the ranks without
a good seal write that sum (exactly what the switch would have given); the calls not
completed run again over the host ring from their untouched inputs. No output is written
twice, no partial sum is returned. Later calls run over the host ring ("auto"; algo=
"switch" is `SwitchUnavailable`) until rank 0 sees the controller answer again (after a
back-off, `netreduce.away.Rejoiner`) and flags a call's metadata: in that call every rank
builds a fresh "inc" ring (new QPs and PSNs, so a new ring id) and rank 0 registers it;
the next calls aggregate in the network again. Rank 0 logs each fallback and return;
`stats()` counts them. `SwitchFailure` is left for what cannot be settled (a rank lacks
the wire words the plan needs, or a good seal disagrees with the recovered sum).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from flowctl.plan import FlowConfig
from flowctl.stream import FlowError, StallError, Stream
from netreduce.algorithms import CallContext
from netreduce.algorithms.ring import RING
from netreduce.algorithms.switch import SWITCH, inline_sum, write_inline
from netreduce.away import Backoff, Rejoiner, SwitchAway, settle_plan
from netreduce.errors import CommunicatorError, PeerFailure, SwitchFailure
from netreduce.meta import (INLINE, REJOIN, CallMeta, CallRejected, MetaExchange,
                            SwitchNotAggregating, check_agreement, check_dtype, check_op,
                            control_bytes)
from netreduce.progress import ProgressEngine, Work
from netreduce.registration import (LEASE_RANKS, Controller, LeaseKeeper, SwitchStatus,
                                    SwitchRegistrationError, controller_client, fit_inc_ring,
                                    register_inc_ring, switch_address, unregister)
from netreduce.rings import Host, RingQPsLike, connect_ring, connect_rings, inc_ring_spec
from netreduce.routing import (AWAY, FALLBACKS, CallStats, Route, candidates, check_request,
                               route)
from netreduce.tensors import as_ndarray, torch_store_in_use
from netreduce.workspace import RegisteredMemory, Workspace
from nr_contract.spec import RingSpec
from ring_setup.device import source_ipv4_towards
from ring_setup.endpoints import HostEndpoint, RingEndpoint, neighbours
from ring_setup.rendezvous import PortExchange, Rendezvous, RendezvousConfig
from ring_setup.store_protocol import DEFAULT_TIMEOUT, PeerFailed, RendezvousError

logger = logging.getLogger(__name__)

_FAILED_LEAVE_TIMEOUT = 5.0
NOTICE_GRACE = 3.0     # s a transfer error on "inc" waits for another rank's switch-away
#                        notice (its QPs went to ERROR just after it published one)


class Communicator:
    """One rank's membership in a ring of `world_size` ranks. Build it with
    `netreduce.init(...)` or `Communicator.create(...)`; close it on every rank."""

    def __init__(self, *, rendezvous: Rendezvous, host: Host, config: FlowConfig,
                 endpoints: list[HostEndpoint], streams: dict[str, Stream],
                 control: RegisteredMemory, switch: SwitchStatus,
                 controller: Controller | None,
                 inc_config: FlowConfig | None = None,
                 rings: dict[str, RingQPsLike] | None = None) -> None:
        self._rendezvous = rendezvous
        self._host = host
        self.config = config                  # the "ring" ring's knobs: what the user asked
        self.inc_config = inc_config or config  # the "inc" ring's: fitted to the switch
        self._endpoints = endpoints
        self.rank = rendezvous.rank
        self.world_size = rendezvous.world_size
        self._streams = streams
        self._control = control
        _, successor = neighbours(endpoints, self.rank)
        self._meta = MetaExchange(streams, control, successor.control, self.rank,
                                  self.world_size, through_switch=switch.registered)
        self._workspace = Workspace(host.register)
        self._calls = 0                       # calls started: the next one's seq (all alike)
        self._running = threading.Lock()      # one call runs at a time (see _run)
        self._engine = ProgressEngine(f"nr-progress-{self.rank}")
        self._unregistered = False
        self._broken: BaseException | None = None
        self._closed = False
        self.switch = switch                  # is "inc" registered with a switch (all alike)
        self._controller = controller         # rank 0's controller client, if any
        self.last_algo: str | None = None    # the algorithm the last allreduce ran
        self.last_fallback: str | None = None   # why that "auto" call did not take the switch
        self._stats = CallStats()
        self._rings = dict(rings or {})       # this rank's QPs by ring (to silence "inc")
        self._epoch = 0                       # switch-away epochs settled (all alike)
        self._away: str | None = None         # why the switch is away (None: it is not)
        self._away_at = (0, 0.0)              # the call settled and when, for the log
        self._last_switch: _SwitchCall | None = None   # wire words that may be needed
        self._began: CallMeta | None = None   # this rank's record of the last call it began
        self._generation = 0                  # "inc" rings built again
        self._backoff = Backoff()
        self._rejoiner: Rejoiner | None = None
        self._closing = False
        streams["inc"].liveness = self._inc_liveness
        rendezvous.on_notice(self._noticed)
        self._lease = self._keep_lease()

    @classmethod
    def create(cls, rank: int | None = None, world_size: int | None = None,
               master_addr: str | None = None, master_port: int | None = None, *,
               device: str | None = None, local_addr: str | None = None,
               config: FlowConfig = FlowConfig(), pinned: frozenset[str] = frozenset(),
               switch: str | None = None, timeout: float = DEFAULT_TIMEOUT,
               port_exchange: PortExchange | None = None) -> "Communicator":
        """Rendezvous with the other ranks (arguments, else RANK, WORLD_SIZE, MASTER_ADDR,
        MASTER_PORT; when torch owns MASTER_PORT, `torch_store_in_use`, rank 0 serves the
        store on a free port and passes it through torch's store: `netreduce.torch`; or
        through `port_exchange`, see `Rendezvous.join`), open
        this rank's rxe device (`device`, else the one holding
        `local_addr` as a RoCEv2 GID; `local_addr` defaults to the address this host
        reaches MASTER_ADDR from) and connect both rings. `switch` is the switch
        controller's HOST:PORT (None: $NR_CONTROLLER; "" or unset: no switch; rank 0's
        decides): the "inc" ring is fitted to its target (the knobs named in `pinned` were
        set by the user and are never changed) and registered with it; a refusal is an
        error naming the controller. Rank 0 prints one line on stderr saying whether a switch is used.
        A rank that fails on its own tells the others through the rendezvous; `timeout`
        bounds every wait for peers; the controller gets min(10 s, timeout / 2) per call
        (min(30 s, timeout / 2) to register, unregister or read counters: a fabric programs
        several switches), so that a silent controller is reported before the other ranks
        stop waiting."""
        from ring_setup.verbs.host import RdmaHost   # pyverbs: only where a real device is opened
        rdzv = RendezvousConfig.resolve(rank, world_size, master_addr, master_port, timeout)
        ip = local_addr or source_ipv4_towards(rdzv.master_addr)
        addr = switch_address(switch)
        if port_exchange is None and master_port is None and torch_store_in_use():
            from netreduce.torch_store import store_port_exchange
            port_exchange = store_port_exchange(rdzv)
        rendezvous = Rendezvous(rdzv).join(port_exchange)
        host: RdmaHost | None = None
        controller: Controller | None = None
        try:
            if rdzv.rank in LEASE_RANKS and addr is not None:
                controller = controller_client(addr, min(10.0, timeout / 2),
                                               min(30.0, timeout / 2), rdzv.rank)
            host = RdmaHost(ip, device, config)
            comm = cls.connect(rendezvous, host, config, controller, pinned)
        except BaseException as exc:
            if not isinstance(exc, RendezvousError):    # the others could not know: tell them
                rendezvous.abort(f"{type(exc).__name__}: {exc}")
            if host is not None:
                host.close()
            if controller is not None:
                controller.close()
            rendezvous.close(timeout=_FAILED_LEAVE_TIMEOUT)
            raise
        if comm.rank == 0:
            logger.info("netreduce: %d rank(s); %s", comm.world_size, comm.switch.describe())
        return comm

    @classmethod
    def connect(cls, rendezvous: Rendezvous, host: Host, config: FlowConfig,
                controller: Controller | None = None,
                pinned: frozenset[str] = frozenset()) -> "Communicator":
        """Build both QP rings with the other ranks: rank 0 fits the "inc" ring's knobs to
        `controller`'s target (`netreduce.registration.fit_inc_ring`; "ring" keeps
        `config` but for the ACK timeout: its packets cross the same switch, at the same
        pace); create the QPs, exchange endpoints through the rendezvous, connect and wait
        until every rank is ready (`netreduce.rings.connect_rings`). Then rank 0 registers
        the "inc" ring with `controller` (if any; on ranks `LEASE_RANKS` other than 0 it
        only renews the lease) and every rank learns the outcome
        (`netreduce.registration.register_inc_ring`). The communicator owns `controller`
        from then on."""
        rank = rendezvous.rank
        fit = fit_inc_ring(rendezvous, config, pinned, controller)
        config = replace(config, ack_timeout=fit.config.ack_timeout)
        control = host.register(control_bytes(rendezvous.world_size))
        endpoints, streams, rings = connect_rings(rendezvous, host,
                                                  {"ring": config, "inc": fit.config}, control)
        switch = register_inc_ring(rendezvous, inc_ring_spec(endpoints, fit.config,
                                                             rendezvous.job_key),
                                   controller if rank == 0 else None, fit.choice)
        try:
            rendezvous.watch()
        except BaseException:
            if rank == 0 and controller is not None and switch.ring_id is not None:
                unregister(controller, switch.ring_id)
            raise
        return cls(rendezvous=rendezvous, host=host, config=config, inc_config=fit.config,
                   endpoints=endpoints, streams=streams, control=control, switch=switch,
                   controller=controller, rings=rings)

    @property
    def device(self) -> str:
        return self._host.device

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
            return self._engine.submit(lambda: self._run(call), call.what(None))
        if not self._engine.on_thread():
            self._engine.drain()
        return self._run(call)

    def submit(self, job: Callable[[], Any], what: str) -> Work:
        """Run `job()` on the progress thread, in issue order with the asynchronous calls;
        the returned `Work` completes with what `job` returns or raises. `job` may call
        `allreduce` synchronously (it runs at once, on that thread): how a composite
        operation (the DDP hook's call, then its fallback) keeps its place in the order."""
        self._check_usable()
        return self._engine.submit(job, what)

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
            if self._rendezvous.notice_epoch > self._epoch:   # the switch went away meanwhile
                self._settle(seq, None, self._notice_reason())
            while True:
                try:
                    taken = self._attempt(call, seq)
                    break
                except (SwitchAway, SwitchNotAggregating) as exc:
                    self._calls = seq
                    if self._settle(seq, call, str(exc)):
                        self._calls = seq + 1
                        taken = Route(SWITCH)     # its wire words, summed over the ring
                        break
                    # not completed anywhere: run it again over the host ring (the input is
                    # untouched, the output not written); algo="switch" is refused there
        except CallRejected:
            raise
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

    def _attempt(self, call: "_Call", seq: int) -> Route:
        """Call `seq` once: route it before the exchange (`candidates`), metadata exchange
        (through the switch while it aggregates, else around the host ring), agreement,
        rejoining the switch when rank 0's record asks for it, route, run. Raises
        `SwitchAway` / `SwitchNotAggregating` when the switch stopped aggregating during it
        (the caller settles)."""
        array, target, dtype = call.array, call.target, call.array.dtype
        self._rendezvous.check_peers()
        algorithms = candidates(call.algo, dtype, call.op, self.switch, self._away)
        workspace = self._workspace.ensure(max(
            a.workspace_bytes(array.size, dtype, self.world_size) for a in algorithms),
            keep=self._last_switch is not None)
        data = algorithms[0].local_range(array)
        rejoin = self._rejoiner is not None and self._rejoiner.ready.is_set()
        mine = CallMeta(rank=self.rank, seq=seq, count=array.size, dtype=dtype.name,
                        op=call.op, algo=call.algo, workspace=workspace.remote(),
                        lo=data.lo, hi=data.hi, blocks=data.blocks,
                        flags=(REJOIN if rejoin else 0) | (INLINE if data.inline else 0))
        self._calls, self._began = seq + 1, mine
        through_switch = self.switch.registered and self._away is None
        # unsettled: the switch's successor acknowledges these records while this rank
        # checks and routes the call; the "inc" stream is settled before any output is
        # written (a call whose acknowledgement fails is settled as not completed here)
        records = self._on_inc(through_switch, lambda: self._meta.exchange(
            mine, through_switch, settle=False))
        # every rank started this call, so every rank completed the previous one: its wire
        # words will never be needed again
        self._last_switch = None
        self._workspace.release_retired()
        try:
            context = self._context(call, records, workspace)
            away = self._away is not None
            if away and records[0].flags & REJOIN:
                self._rejoin(seq)        # alike on every rank; this call still runs the ring
            taken = route(call.algo, context, call.op, through_switch, away=away)
        except CallRejected:
            self._settle_inc(through_switch)
            raise
        if taken.algorithm is not SWITCH:
            self._settle_inc(through_switch)
            taken.algorithm.run(context, array, target)
            return taken
        self._last_switch = _SwitchCall(context, call, mine)
        # a small call's sum is formed from its records (SwitchAllreduce.run)
        self._on_inc(True, lambda: SWITCH.run(context, array, target))
        return taken

    def _settle_inc(self, used: bool) -> None:
        """Wait for the acknowledgements of this call's records on "inc" (`used`: they went
        through the switch); a failure there is the switch's (`_on_inc`)."""
        if used:
            self._on_inc(True, self._streams["inc"].settle)

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
            inline=bool(records[0].flags & INLINE))

    def _on_inc(self, uses_inc: bool, step: Callable[[], Any]) -> Any:
        """Run `step`; when it moves data on "inc", a transport error there that comes with
        (or within NOTICE_GRACE s before) another rank's switch-away notice is `SwitchAway`:
        that rank moved its "inc" QPs to ERROR right after publishing it."""
        if not uses_inc:
            return step()
        try:
            return step()
        except FlowError as exc:
            if not isinstance(exc, SwitchNotAggregating) and self._notice_within(NOTICE_GRACE):
                raise SwitchAway(f"a transfer on 'inc' failed after the switch went away: "
                                 f"{exc}") from exc
            if isinstance(exc, StallError):
                raise StallError(f"{exc}; {self._switch_view()}") from exc
            raise

    def _switch_view(self) -> str:
        """What the switch counted for this ring, for a stall on "inc": its next_emit and the
        nonzero counters of the ring and of each connection. A connection whose packets the
        switch keeps dropping names the stall's cause (a BMv2 ToR's drop_mismatch on one
        connection did, docs/reliability.md). Rank 0 holds the controller client and asks;
        the other ranks' errors point to its."""
        ring_id = self.switch.ring_id
        if self.rank != 0 or self._controller is None or ring_id is None:
            return "what the switch counted: in rank 0's error"
        try:
            ring = self._controller.counters(ring_id)["rings"][ring_id]
        except Exception as e:  # noqa: BLE001 - a diagnostic of the stall, never its error
            return f"what the switch counted for ring {ring_id}: unavailable ({e})"

        def nonzero(counters: dict[str, int]) -> dict[str, int]:
            return {k: v for k, v in sorted(counters.items()) if v}
        conns = "; ".join(f"rank {c['rank']}'s connection {nonzero(c['counters'])}"
                          for c in ring.get("connections", []))
        return (f"what the switch counted for ring {ring_id}: next_emit {ring['next_emit']}, "
                f"{nonzero(ring['counters'])}; {conns}")

    def _notice_within(self, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while self._rendezvous.notice_epoch <= self._epoch:
            if time.monotonic() > end:
                return False
            time.sleep(0.05)
        return True

    def _notice_reason(self) -> str:
        """The reason of the first switch-away notice not settled yet."""
        notices = self._rendezvous.notices
        return notices.get(self._epoch + 1) or notices[max(notices)]

    def _inc_liveness(self) -> None:
        """The "inc" stream's liveness check: the peers' (PeerFailed), then whether some
        rank published a switch-away notice this rank has not settled (SwitchAway)."""
        self._rendezvous.check_peers()
        epoch = self._rendezvous.notice_epoch
        if epoch > self._epoch:
            raise SwitchAway(self._rendezvous.notices[epoch])

    def _noticed(self, epoch: int, reason: str) -> None:
        """A switch-away notice arrived (watch thread): an idle rank settles it on the
        progress thread (a rank in a call settles it there, at the latest at its next
        call's start; the job then finds it settled)."""
        if epoch <= self._epoch or self._closing or self._closed:
            return
        try:
            self._engine.submit(self._settle_idle, f"switch-away epoch {epoch}")
        except RuntimeError:        # closing: the engine takes no more jobs
            pass

    def _settle_idle(self) -> None:
        with self._running:
            if self._closed or self._broken is not None \
                    or self._rendezvous.notice_epoch <= self._epoch:
                return
            what = f"settling the switch's loss (epoch {self._epoch + 1}) while idle"
            try:
                self._settle(self._calls, None, self._notice_reason())
            except PeerFailed as exc:
                self._break(PeerFailure(f"netreduce: rank {self.rank}: {what}: {exc}",
                                        exc.ranks))
            except BaseException as exc:    # noqa: BLE001 - the next call reports it
                self._rendezvous.abort(f"{what} failed: {type(exc).__name__}: {exc}")
                self._break(exc)

    def _settle(self, position: int, call: "_Call | None", reason: str) -> bool:
        """Settle the next switch-away epoch (see the module doc), under the call lock,
        with this rank's `position` (the call it could not complete through the switch, or
        its next call when idle) and its call in flight (`call`, None when idle). Returns
        True when `call` was completed from every rank's wire words (its output written)."""
        epoch = self._epoch + 1
        if self._rendezvous.notice_epoch < epoch:
            self._rendezvous.notice(epoch, f"rank {self.rank}: {reason}")
        reason = self._notice_reason()
        self._stop_lease()
        inc = self._rings.get("inc")
        if inc is not None:
            inc.to_error()      # no late WRITE through the lost switch lands in our memory
        last = self._last_switch
        # what the switch gave this rank with a good seal, before any rank's recovery ring
        # can write into this workspace (its staging overlaps the receive area)
        good = last is not None and position > last.context.seq
        expected = SWITCH.areas(last.context)[1][:last.context.count].copy() \
            if good and not last.context.inline else None
        positions = [p["position"] for p in self._rendezvous.gather(
            f"away.{epoch}", {"position": position}, self.config.collective_timeout,
            waiting_for=f"settled the switch's loss (epoch {epoch})")]
        plan = settle_plan(positions)
        recovered = False
        if plan.recover and last is not None and last.context.seq == plan.call \
                and not last.context.inline:
            summed = self._sum_wire(last.context, expected)
            if position == plan.call:
                assert call is last.call, "the call in flight is the one recovered"
                SWITCH.deliver(last.context, summed, call.target)
                recovered = True
        elif plan.recover:
            recovered = self._finish_inline(plan.call, position, call, reason)
        self._last_switch = None
        self._workspace.release_retired()
        lost_ring = self.switch.ring_id
        self._epoch, self._away = epoch, reason
        self._away_at = (plan.call, time.monotonic())
        self._stats.switch_event("fallbacks")
        counts = self._stats.switch_event("recovered", int(plan.recover))
        if self.rank == 0 and self._controller is not None:
            delay = self._backoff.lost()
            self._rejoiner = Rejoiner(self._controller, delay, lost_ring)
            when = f"rank 0 asks the controller again in {delay:g} s"
        else:
            when = "no controller to ask again"
        if self.rank == 0:
            logger.warning("netreduce: the switch at %s stopped aggregating ring %s (%s): "
                           "fallback %d at call #%d: %s; calls run over the host ring, %s "
                           "(switch counts: %s)", self.switch.controller, lost_ring, reason,
                           counts["fallbacks"], plan.call, plan.describe(), when,
                           _counts(counts))
        return recovered

    def _finish_inline(self, seq: int, position: int, call: "_Call | None",
                       reason: str) -> bool:
        """Settle call `seq`, a small call that travelled in its records (INLINE), which
        the switch completed for some ranks only (it was lost while it emitted their
        sums): every rank exchanges its record of it again around the host ring; the ranks
        without it (`position` == `seq`) write its result from those records, the others
        check that the switch gave them the same records. Returns True when it wrote
        `call`'s output. `SwitchFailure` when this rank holds neither that call's wire
        words (`_settle` sums those) nor its record of a small call."""
        last = self._last_switch
        kept = last is not None and last.context.seq == seq
        if position > seq and not kept:
            raise SwitchFailure(
                f"netreduce: rank {self.rank}: the switch at {self.switch.controller} was "
                f"lost ({reason}) while some ranks lacked the records of call #{seq}, which "
                f"this rank refused from them (a refusal keeps nothing to finish it with)")
        mine = last.record if kept else self._began
        if mine is None or mine.seq != seq or not mine.flags & INLINE:
            raise SwitchFailure(
                f"netreduce: rank {self.rank}: the switch at {self.switch.controller} was "
                f"lost ({reason}); call #{seq} must be finished from every rank's wire words "
                f"(or records), but this rank holds "
                f"{'none' if last is None else f'those of call #{last.context.seq}'}")
        records = self._meta.exchange(mine, through_switch=False)
        if position > seq:
            assert last is not None
            if tuple(m.blocks for m in records) != last.context.blocks:
                raise SwitchFailure(
                    f"netreduce: rank {self.rank}: allreduce call #{seq}: the records the "
                    f"switch at {self.switch.controller} returned differ from every rank's "
                    f"records exchanged over the host ring: the result returned was wrong")
            return False
        assert call is not None, "a rank at the settled call has it in flight"
        check_agreement(records)
        write_inline(inline_sum([m.blocks for m in records],
                                self.world_size if call.op == "avg" else 1, call.target.dtype),
                     call.target)
        return True

    def _sum_wire(self, switch_call: CallContext, expected: np.ndarray | None) -> np.ndarray:
        """The wrapping int32 sum of every rank's wire words of `switch_call` (kept in its
        workspace), over the host ring; a rank whose seal was good checks that the switch
        gave it exactly that (`expected`; SwitchFailure otherwise)."""
        wire, _ = SWITCH.areas(switch_call)
        summed = np.empty(switch_call.count, dtype=wire.dtype)
        RING.run(replace(switch_call, dtype=wire.dtype, op=np.add, divisor=1,
                         streams=self._streams), wire[:switch_call.count], summed)
        if expected is not None and not np.array_equal(expected, summed):
            bad = int(np.flatnonzero(expected != summed)[0])
            raise SwitchFailure(
                f"netreduce: rank {self.rank}: allreduce call #{switch_call.seq}: the sum the "
                f"switch at {self.switch.controller} returned with a good seal differs from "
                f"every rank's wire words summed over the host ring (first at element {bad}: "
                f"{expected[bad]} vs {summed[bad]}): the result returned was wrong")
        return summed

    def _rejoin(self, seq: int) -> None:
        """Collective, inside call `seq` (rank 0's record asked for it, so alike on every
        rank): build a fresh "inc" ring (new QPs and PSNs: the old ones are in ERROR and the
        new switch knows none of them), connect it through the store, and let rank 0
        register it. Registered: calls from `seq` + 1 on may take the switch again; else
        rank 0 backs off and asks again later."""
        gen = self._generation + 1
        timeout = self.config.collective_timeout
        old = self._rings.get("inc")
        if old is not None:
            try:
                old.close()
            except Exception as exc:    # noqa: BLE001 - in ERROR, unused: leaking it is safe
                logger.warning("netreduce: rank %d: the old 'inc' QPs could not be destroyed "
                               "(they stay in ERROR until the device closes): %s",
                               self.rank, exc)
        qps = self._host.create_ring("inc", self.inc_config)
        theirs = self._rendezvous.gather(f"inc.{gen}", qps.local().to_dict(), timeout,
                                         waiting_for=f"rebuilt 'inc' ({gen})")
        endpoints = [replace(ep, rings={**ep.rings, "inc": RingEndpoint.from_dict(d)})
                     for ep, d in zip(self._endpoints, theirs)]
        self._streams["inc"] = connect_ring(qps, "inc", self.inc_config, endpoints, self.rank,
                                            self._control, self._inc_liveness)
        self._rings["inc"], self._endpoints, self._generation = qps, endpoints, gen
        self._rendezvous.gather(f"inc-ready.{gen}", True, timeout,
                                waiting_for=f"connected 'inc' ({gen})")
        if self._rejoiner is not None:
            self._rejoiner.stop()
            self._rejoiner = None
        spec = inc_ring_spec(endpoints, self.inc_config, self._rendezvous.job_key)
        try:
            status = register_inc_ring(self._rendezvous, spec,
                                       self._controller if self.rank == 0 else None,
                                       self.switch.choice, key=f"switch.{gen}")
        except SwitchRegistrationError as exc:
            status = replace(self.switch, ring_id=None, note=str(exc))
        if not status.registered:
            if self.rank == 0 and self._controller is not None:
                delay = self._backoff.failed()
                self._rejoiner = Rejoiner(self._controller, delay, None)
                logger.warning("netreduce: the switch at %s did not register ring %s again "
                               "at call #%d: %s; calls keep running over the host ring, rank "
                               "0 asks again in %g s", self.switch.controller, spec.ring_id,
                               seq, status.note, delay)
            return
        away_call, since = self._away_at
        self.switch, self._away = status, None
        self._backoff.returned()
        counts = self._stats.switch_event("returns")
        self._lease = self._keep_lease()
        if self.rank == 0:
            logger.warning("netreduce: back on the switch at %s: ring %s registered at call "
                           "#%d, %.1f s and %d call(s) after it went away; calls from #%d on "
                           "aggregate in the network again (switch counts: %s)",
                           status.controller, status.ring_id, seq, time.monotonic() - since,
                           seq - away_call, seq + 1, _counts(counts))

    def _keep_lease(self) -> LeaseKeeper | None:
        """A lease keeper for the registered ring on this rank (ranks LEASE_RANKS with a
        controller client), reporting a loss as a switch-away notice of the next epoch."""
        if self._controller is None or not self.switch.registered or self.switch.lease_ms <= 0:
            return None
        epoch = self._epoch + 1
        return LeaseKeeper(self._controller, self.switch,
                           lambda why: self._lease_lost(epoch, why),
                           judge_silence=self.rank == 0,
                           job_alive=self._rendezvous.peers_alive)

    def _lease_lost(self, epoch: int, why: str) -> None:
        """The keeper thread heard the switch lose the ring: tell every rank (they settle)."""
        if epoch <= self._epoch or self._closing:
            return
        try:
            self._rendezvous.notice(epoch, f"rank {self.rank}: {why}")
        except RendezvousError as exc:
            logger.warning("netreduce: rank %d: %s, and the store could not be told: %s",
                           self.rank, why, exc)

    def _stop_lease(self) -> None:
        if self._lease is not None:
            self._lease.stop()
            self._lease = None

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
        "recovered": calls finished from every rank's wire words over the ring}}; the
        reasons are the keys of `netreduce.routing.FALLBACKS` ("dtype", "op",
        "non-finite", "switch-away")."""
        return self._stats.snapshot()

    def _break(self, exc: BaseException) -> BaseException:
        """Mark the communicator unusable by `exc`; rank 0 unregisters the ring at once
        (nothing aggregates on it any more). Returns `exc`."""
        self._broken = exc
        self._release_ring()
        return exc

    def _release_ring(self) -> None:
        """Stop renewing the lease and asking the switch back, and unregister the "inc"
        ring (rank 0; once; not while the switch is away: it lost the ring)."""
        self._stop_lease()
        if self._rejoiner is not None:
            self._rejoiner.stop()
            self._rejoiner = None
        if self.rank == 0 and self._controller is not None and self.switch.ring_id is not None \
                and self._away is None and not self._unregistered:
            self._unregistered = True
            unregister(self._controller, self.switch.ring_id)

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
        self._closing = True
        self._finish_async_calls(timeout)
        t0 = time.monotonic()
        self._quiesce(timeout)
        self._closed = True
        timeout = max(1.0, timeout - (time.monotonic() - t0))   # one wait for the others
        if self._broken is not None:       # the others know: no long wait for a dead peer
            timeout = min(timeout, _FAILED_LEAVE_TIMEOUT)
        self._rendezvous.close(timeout)
        self._release_ring()
        if self._controller is not None:
            self._controller.close()
        self._workspace.close()
        self._control.close()
        self._host.close()

    def _quiesce(self, timeout: float) -> None:
        """Before leaving a ring registered with a switch: wait (up to `timeout` s) until
        every rank is closing too, settling a switch-away notice that arrives meanwhile --
        a rank without a good seal for the last call needs this rank's wire words of it.
        Alike on every rank (`switch.registered` is)."""
        if self._broken is not None or not self.switch.registered:
            return
        with self._running:
            try:
                while self._rendezvous.gather(
                        "closing", self._calls, timeout, waiting_for="closed",
                        until=lambda: self._rendezvous.notice_epoch > self._epoch) is None:
                    self._settle(self._calls, None, self._notice_reason())
            except RendezvousError as exc:      # PeerFailed included: leave as before
                logger.info("netreduce: rank %d: closing without every rank: %s",
                            self.rank, exc)
            except BaseException as exc:    # noqa: BLE001 - closing: tell the others, go on
                self._rendezvous.abort(f"closing: {type(exc).__name__}: {exc}")
                self._break(exc)

    def _finish_async_calls(self, timeout: float) -> None:
        """Wait up to `timeout` s for the asynchronous calls issued, then cancel the rest:
        those not started fail with `CommunicatorError`; the one running is aborted
        through the rendezvous, so it fails within about a second here (and on the other
        ranks, as `PeerFailure` naming this rank)."""
        left, running = self._engine.close(timeout)
        for work in left:
            work.finish(error=CommunicatorError(
                f"netreduce: rank {self.rank}: {work.what} cancelled: the communicator was "
                f"closed before it started"))
        if running is not None:
            self._rendezvous.abort(f"{running.what} was still running {timeout:g}s after "
                                   f"this rank closed the communicator")
            self._engine.join(_FAILED_LEAVE_TIMEOUT)

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

    def what(self, seq: int | None) -> str:
        """How messages name the call (`seq`: its number once it started)."""
        number = "" if seq is None else f" #{seq}"
        return (f"allreduce call{number} ({self.array.dtype}[{self.array.size}] "
                f"op={self.op} algo={self.algo})")


@dataclass(frozen=True)
class _SwitchCall:
    """The last call routed through the switch: its context (workspace, successor's
    workspace, wire words) and the call itself, kept until every rank started the next
    call, in case the switch is lost and its wire words must be summed over the ring."""

    context: CallContext
    call: _Call
    record: CallMeta        # this rank's record of it (a small call's data: `context.inline`)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())
