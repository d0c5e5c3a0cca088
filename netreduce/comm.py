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
A switch that stops aggregating the registered ring (restarted: rank 0's lease renewal
hears NOT_FOUND; or a call's seal or metadata came back unaggregated) is `SwitchFailure`
naming the switch. After any of these the communicator is unusable and says so; rank 0
unregisters the ring at once. The communicator never re-registers: `netreduce.finalize()`
and `netreduce.init()` build a new one (and register it with the restarted switch).
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Protocol

import numpy as np

from flowctl.link import Link, LocalBuffer
from flowctl.plan import FlowConfig
from flowctl.stream import Stream
from netreduce.algorithms import Algorithm, CallContext
from netreduce.meta import (CallMeta, CallRejected, MetaExchange, SwitchNotAggregating,
                            check_agreement, check_dtype, check_op, control_bytes)
from netreduce.progress import ProgressEngine, Work
from netreduce.registration import (Controller, LeaseKeeper, SwitchStatus, fit_inc_ring,
                                    register_inc_ring, switch_address, unregister)
from netreduce.routing import FALLBACKS, CallStats, Route, candidates, route
from netreduce.tensors import as_ndarray, torch_store_in_use
from netreduce.workspace import RegisteredMemory, Workspace
from ring_setup.device import source_ipv4_towards
from ring_setup.endpoints import (HostEndpoint, RingEndpoint, check_agreement as
                                  check_endpoints, neighbours, ring_spec)
from ring_setup.rendezvous import (DEFAULT_TIMEOUT, PeerFailed, PortExchange, Rendezvous,
                                   RendezvousConfig, RendezvousError)
from switch.contract import RingSpec

logger = logging.getLogger(__name__)

RINGS = ("ring", "inc")
_FAILED_LEAVE_TIMEOUT = 5.0


class CommunicatorError(RuntimeError):
    """The communicator cannot be used (closed, or broken by an earlier transfer error)."""


class PeerFailure(CommunicatorError):
    """A call failed because other ranks died, went silent or aborted (`ranks`, with the
    reasons in the message); the communicator is unusable afterwards."""

    def __init__(self, message: str, ranks: list[int]) -> None:
        super().__init__(message)
        self.ranks = ranks


class SwitchFailure(CommunicatorError):
    """The switch stopped aggregating the registered ring during a call (restarted, or
    lost the ring); the message names the switch. The communicator is unusable afterwards."""


class RingQPsLike(Protocol):
    """This rank's QPs in one ring (ring_setup.verbs.host.RingQPs)."""

    def local(self) -> RingEndpoint: ...
    def connect(self, predecessor: HostEndpoint, successor: HostEndpoint) -> None: ...
    def link(self, recv_sge: LocalBuffer, successor: int, predecessor: int) -> Link: ...


class Host(Protocol):
    """An opened RDMA device (ring_setup.verbs.host.RdmaHost; tests use an in-process one)."""

    ip: str
    mac: str

    @property
    def gid(self) -> str: ...
    @property
    def device(self) -> str: ...
    def register(self, nbytes: int) -> RegisteredMemory: ...
    def create_ring(self, name: str, config: FlowConfig) -> RingQPsLike: ...
    def close(self) -> None: ...


class Communicator:
    """One rank's membership in a ring of `world_size` ranks. Build it with
    `netreduce.init(...)` or `Communicator.create(...)`; close it on every rank."""

    def __init__(self, *, rendezvous: Rendezvous, host: Host, config: FlowConfig,
                 endpoints: list[HostEndpoint], streams: dict[str, Stream],
                 control: RegisteredMemory, switch: SwitchStatus,
                 controller: Controller | None,
                 inc_config: FlowConfig | None = None) -> None:
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
        self._lease: LeaseKeeper | None = None
        if controller is not None and switch.registered and switch.lease_ms > 0:
            self._lease = LeaseKeeper(controller, switch, rendezvous.abort)

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
        bounds every wait for peers; the controller gets min(10 s, timeout / 2) per call,
        so that a silent controller is reported before the other ranks stop waiting."""
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
            if rdzv.rank == 0 and addr is not None:
                from switch.api.client import ControllerClient  # grpc: only where it is used
                controller = ControllerClient(addr, timeout=min(10.0, timeout / 2))
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
        pace); create the QPs (INIT), exchange
        endpoints through the rendezvous, connect (RTR, RTS), post receives, and wait until
        every rank is ready so that nobody sends to a QP that is not yet in RTR. Then rank
        0 registers the "inc" ring with `controller` (if any; other ranks' is not used) and
        every rank learns the outcome (`netreduce.registration.register_inc_ring`). The
        communicator owns `controller` from then on."""
        rank = rendezvous.rank
        fit = fit_inc_ring(rendezvous, config, pinned, controller)
        config = replace(config, ack_timeout=fit.config.ack_timeout)
        configs = {"ring": config, "inc": fit.config}
        control = host.register(control_bytes(rendezvous.world_size))
        rings = {name: host.create_ring(name, configs[name]) for name in RINGS}
        me = HostEndpoint(rank=rank, ip=host.ip, mac=host.mac, gid=host.gid,
                          device=host.device, mtu=config.mtu,
                          msg_size=config.msg_size, window=config.window,
                          control=control.remote(),
                          rings={name: qps.local() for name, qps in rings.items()})
        endpoints = [HostEndpoint.from_dict(d)
                     for d in rendezvous.all_gather("endpoint", me.to_dict())]
        check_endpoints(endpoints)
        predecessor, successor = neighbours(endpoints, rank)
        streams = {}
        for name, qps in rings.items():
            qps.connect(predecessor, successor)
            link = qps.link(control.local(), successor.rank, predecessor.rank)
            streams[name] = Stream(link, configs[name], f"rank {rank}, ring {name!r}",
                                   liveness=rendezvous.check_peers)
        rendezvous.barrier("ready")
        switch = register_inc_ring(rendezvous, _inc_ring_spec(endpoints, fit.config,
                                                              rendezvous.config.secret),
                                   controller, fit.choice)
        try:
            rendezvous.watch()
        except BaseException:
            if controller is not None and switch.ring_id is not None:
                unregister(controller, switch.ring_id)
            raise
        return cls(rendezvous=rendezvous, host=host, config=config, inc_config=fit.config,
                   endpoints=endpoints, streams=streams, control=control, switch=switch,
                   controller=controller)

    @property
    def device(self) -> str:
        return self._host.device

    def inc_ring_spec(self) -> RingSpec:
        """The "inc" ring as the switch controller needs it (identical on every rank)."""
        return _inc_ring_spec(self._endpoints, self.inc_config, self._rendezvous.config.secret)

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
        algorithms = candidates(algo, dtype, op, self.switch)
        target = values if out is None else as_ndarray(out, "out")
        if target.shape != values.shape or target.dtype != dtype:
            raise ValueError(f"allreduce: out must be a {dtype} array of shape {values.shape}")
        if not target.flags.writeable:
            raise ValueError("allreduce: the result array is read-only")
        return _Call(values, target, array if out is None else out, op, ufunc, algo, algorithms)

    def _run(self, call: "_Call") -> Any:
        """Run one prepared call (one at a time: the synchronous caller after draining the
        progress thread, or the progress thread itself)."""
        with self._running:
            self._check_usable()
            self._execute(call)
        return call.result

    def _execute(self, call: "_Call") -> None:
        array, target, dtype = call.array, call.target, call.array.dtype
        seq = self._calls
        what = call.what(seq)
        try:
            self._rendezvous.check_peers()
            workspace = self._workspace.ensure(max(
                a.workspace_bytes(array.size, dtype, self.world_size)
                for a in call.candidates))
            lo, hi, blocks = call.candidates[0].local_range(array)
            mine = CallMeta(rank=self.rank, seq=seq, count=array.size, dtype=dtype.name,
                            op=call.op, algo=call.algo, workspace=workspace.remote(),
                            lo=lo, hi=hi, blocks=blocks)
            self._calls += 1
            records = self._meta.exchange(mine)
            check_agreement(records)
            context = CallContext(
                rank=self.rank, world_size=self.world_size, seq=seq, count=array.size,
                dtype=dtype, op=call.ufunc, divisor=self.world_size if call.op == "avg" else 1,
                ranges=tuple((m.lo, m.hi) for m in records),
                workspace=workspace,
                peer_workspace=records[(self.rank + 1) % self.world_size].workspace,
                streams=self._streams, blocks=tuple(m.blocks for m in records))
            taken = route(call.algo, context, call.op, self.switch.registered)
            self._count(taken, what)
            taken.algorithm.run(context, array, target)
        except CallRejected:
            raise
        except PeerFailed as exc:
            raise self._break(PeerFailure(
                f"netreduce: rank {self.rank}: {what} failed: {exc}; the communicator is "
                f"unusable (netreduce.finalize(), then netreduce.init() a new one)",
                exc.ranks)) from exc
        except SwitchNotAggregating as exc:
            error = self._break(SwitchFailure(
                f"netreduce: rank {self.rank}: {what} failed: the switch at "
                f"{self.switch.controller} stopped aggregating ring {self.switch.ring_id} "
                f"(restarted?): {exc}; the communicator is unusable (netreduce.finalize(), "
                f"then netreduce.init() registers a new ring)"))
            self._rendezvous.abort(f"{what}: {error}")
            raise error from exc
        except BaseException as exc:
            self._rendezvous.abort(f"{what} failed: {type(exc).__name__}: {exc}")
            raise self._break(exc)
        self.last_algo, self.last_fallback = taken.algorithm.name, taken.fallback

    def _count(self, taken: Route, what: str) -> None:
        """Count the call's route; rank 0 warns the first time "auto" falls back to the
        ring for a reason (every rank takes the same route: one line per job suffices)."""
        if self._stats.count(taken) and self.rank == 0:
            logger.warning("netreduce: %s runs over the host ring although the switch is "
                           "registered: %s (logged once per reason; comm.stats() counts "
                           "them)", what, FALLBACKS[taken.fallback])

    def stats(self) -> dict[str, dict[str, int]]:
        """The routes of this communicator's calls so far, the same on every rank:
        {"calls": {"switch" | "ring": calls routed there}, "fallbacks": {reason: "auto" calls
        that ran over the ring although a switch is registered}}; the reasons are the keys
        of `netreduce.routing.FALLBACKS` ("dtype", "op", "non-finite")."""
        return self._stats.snapshot()

    def _break(self, exc: BaseException) -> BaseException:
        """Mark the communicator unusable by `exc`; rank 0 unregisters the ring at once
        (nothing aggregates on it any more). Returns `exc`."""
        self._broken = exc
        self._release_ring()
        return exc

    def _release_ring(self) -> None:
        """Stop renewing the lease and unregister the "inc" ring (rank 0; once)."""
        if self._lease is not None:
            self._lease.stop()
            self._lease = None
        if self._controller is not None and self.switch.ring_id is not None \
                and not self._unregistered:
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
        self._finish_async_calls(timeout)
        self._closed = True
        if self._broken is not None:       # the others know: no long wait for a dead peer
            timeout = min(timeout, _FAILED_LEAVE_TIMEOUT)
        self._rendezvous.close(timeout)
        if self._controller is not None:
            self._release_ring()
            self._controller.close()
        self._workspace.close()
        self._control.close()
        self._host.close()

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
    candidates: tuple[Algorithm, ...]           # what it may run (netreduce.routing)

    def what(self, seq: int | None) -> str:
        """How messages name the call (`seq`: its number once it started)."""
        number = "" if seq is None else f" #{seq}"
        return (f"allreduce call{number} ({self.array.dtype}[{self.array.size}] "
                f"op={self.op} algo={self.algo})")


def _inc_ring_spec(endpoints: list[HostEndpoint], config: FlowConfig,
                   secret: bytes) -> RingSpec:
    """The "inc" ring's RingSpec; its id names rank 0's address and "inc" send QPN, and ends
    in 8 hex digits derived from the job's secret: the same on every rank, and no other
    tenant can predict it to register it first (and so have this job refused)."""
    first = endpoints[0]
    qpn = first.rings["inc"].send.qpn
    tag = hmac.new(secret, f"ring-id|{first.ip}|{qpn}".encode(), hashlib.sha256).hexdigest()
    return ring_spec(endpoints, "inc", f"nr-{first.ip}-{qpn}-{tag[:8]}", config)
