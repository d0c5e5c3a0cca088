"""The switch controller: the typed gRPC service of nr_contract/control.proto and its TLS
server, in front of one `switch.control.target.Target`.

Every call goes: credentials (all but Ping) -> decode and validate every field
(`switch.control.validate`) -> ownership and configured limits -> the Target. A refusal is a
gRPC status naming the field or limit (see the proto's header); anything unexpected is
INTERNAL, logged once per method and exception type. Invariants: no request reaches a
Target unvalidated; a refused call changes nothing; every registered ring has exactly one
lease, owned by the principal that registered it, and a lapsed lease unregisters its ring
(`leases_expired`); the rings and their aggregator memory stay within `ControllerConfig`;
a ring another principal owns is answered exactly as a ring that does not exist (NOT_FOUND,
the same message), and an unauthenticated Ping says nothing of the rings in use; no lock
of the controller is held across a call to the target, and one principal has at most
`ControllerConfig.target_calls` calls at the target at once, so its slow calls neither hold
another principal's nor the lease reaper's. The controller never touches packets.
"""
from __future__ import annotations

import contextlib
import hmac
import ipaddress
import logging
import math
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import grpc

from nr_contract import control_pb2 as pb
from nr_contract.client import DEFAULT_ADDR, local_address
from switch.control import validate
from nr_contract.spec import RingSpec
from switch.control.config import DEFAULT_TARGET_CALLS, ControllerConfig
from switch.control.quotas import RateLimit, TargetTurns
from switch.control.target import FabricSwitchTarget, Target, slot_memory

SERVICE = pb.DESCRIPTOR.services_by_name["Controller"].full_name
MAX_MESSAGE = 4 << 20              # gRPC's default receive limit, which clients keep
REPLY_BUDGET = MAX_MESSAGE - (64 << 10)
REAPER_TICK = 0.05                 # s between lease checks
MAX_REMEMBERED_LOSSES = 1024      # lost rings whose reason a renewal's NOT_FOUND still names
FAILED_LOGINS = 10                 # wrong secrets from one peer address within ...
FAILED_LOGIN_WINDOW = 60.0         # ... this many seconds: its calls are refused for as long
DEFAULT_WORKERS = 16               # gRPC worker threads (> DEFAULT_TARGET_CALLS x tenants)
FREE_WORKERS = 4                   # threads that unregister lapsed rings, each on its own
ANONYMOUS = "anonymous"            # the principal of every call of an insecure controller
TARGET_METHODS = frozenset({"RegisterRing", "UnregisterRing", "Counters"})
log = logging.getLogger(__name__)

class Refusal(Exception):
    """A call refused with `code`; the message names the field or limit."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


REFUSAL_COUNTERS = {grpc.StatusCode.INVALID_ARGUMENT: "refused_invalid",
                    grpc.StatusCode.UNAUTHENTICATED: "refused_unauthenticated",
                    grpc.StatusCode.PERMISSION_DENIED: "refused_permission",
                    grpc.StatusCode.RESOURCE_EXHAUSTED: "refused_limit",
                    grpc.StatusCode.FAILED_PRECONDITION: "refused_precondition",
                    grpc.StatusCode.NOT_FOUND: "refused_not_found",
                    grpc.StatusCode.ABORTED: "refused_busy"}
OWN_COUNTERS = ("rings_registered", "slot_memory_used", "leases_expired", "rings_lost",
                "internal_errors",
                *REFUSAL_COUNTERS.values())


@dataclass
class Lease:
    """A registered ring's owner, lease and share of the aggregator memory. `busy`: a
    register or unregister of the ring is at the target; the lease holds the ring's id and
    room meanwhile, does not lapse, and other calls on the ring wait their turn (ABORTED)."""

    owner: str
    lease_ms: int
    expires: float                 # on the controller's clock
    memory: int
    busy: bool = False
    hosts: frozenset[str] = frozenset()    # the ranks' addresses: held by `owner` alone


class ControllerService:
    """The RPC handlers over a Target (see the module doc).

    One lock, `_lock`: it guards the leases and counts and is never held across a call to
    the target (a fabric's target calls other switches, up to their timeouts; a BMv2 one
    reads counters for seconds under load). Targets take concurrent calls for different
    rings (`Target`); a ring being registered or unregistered holds a busy lease meanwhile
    (`Lease.busy`), so no two calls for one ring reach the target at once. The lease reaper
    marks lapsed rings at once and unregisters each on a thread of its own (`_freeing`).
    """

    def __init__(self, target: Target, config: ControllerConfig,
                 clock: Callable[[], float] = time.monotonic):
        self.target = target
        self.config = config
        self.clock = clock
        self.leases: dict[str, Lease] = {}
        self.counts = dict.fromkeys(OWN_COUNTERS, 0)
        self._lock = threading.Lock()
        # ring id -> (its owner, why the target lost it), recent losses only
        self._lost_why: dict[str, tuple[str, str]] = {}
        self._turns = TargetTurns(config.target_calls)
        self._freeing = futures.ThreadPoolExecutor(FREE_WORKERS, "lease-free")
        self._frees: list[futures.Future[None]] = []     # lapsed rings' removals under way
        self._rate = RateLimit(config.calls_per_second, clock)
        self._failed_logins: dict[str, list[float]] = {}   # peer address -> recent failures
        self._logged: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._reaper: Optional[threading.Thread] = None

    # -- limits, credentials, ownership -------------------------------------------------
    def limits(self) -> dict[str, Any]:
        """The TargetLimits fields (free_rings: rings of every principal counted)."""
        mine = self.target.limits()
        max_rings = min(self.config.max_rings, mine.get("max_rings", self.config.max_rings))
        return {"path_mtus": list(mine["path_mtus"]), "max_slots": mine["max_slots"],
                "max_ranks": mine["max_ranks"], "max_rings": max_rings,
                "free_rings": max(0, max_rings - len(self.leases)),
                "max_slot_memory": self.config.max_slot_memory,
                "default_lease_ms": self.config.default_lease_ms,
                "max_in_flight": self.config.max_in_flight,
                "ack_timeout": self.config.ack_timeout, "capacity": self.config.capacity}

    def authenticate(self, context: grpc.ServicerContext) -> str:
        """The caller's principal; UNAUTHENTICATED unless it sent a secret of the file (or
        the controller is insecure: ANONYMOUS)."""
        tokens = self.config.tokens
        if tokens is None:
            return ANONYMOUS
        sent = [v for k, v in context.invocation_metadata() if k == "authorization"]
        if not sent:
            raise Refusal(grpc.StatusCode.UNAUTHENTICATED,
                          "no credentials: this switch needs 'authorization: Bearer SECRET' "
                          "(a client reads the token file $NR_CONTROLLER_TOKEN names)")
        scheme, _, secret = str(sent[0]).partition(" ")
        principal = None
        for known, who in tokens.items():          # compare with every secret, in constant time
            if hmac.compare_digest(secret.encode(), known.encode()):
                principal = who
        if scheme != "Bearer" or principal is None:
            raise Refusal(grpc.StatusCode.UNAUTHENTICATED,
                          "the secret sent is not one of the switch's token file")
        return principal

    def _login(self, context: grpc.ServicerContext) -> str:
        """`authenticate`, throttled: a peer address that sent FAILED_LOGINS wrong secrets
        within FAILED_LOGIN_WINDOW s is refused (RESOURCE_EXHAUSTED) until the oldest ages
        out, so guessing a secret costs a minute per ten guesses and address (Ping's
        answer too: it says more to a valid secret, `_maybe_login`)."""
        peer = context.peer().rsplit(":", 1)[0] if context.peer() else "?"
        now = self.clock()
        with self._lock:
            recent = [t for t in self._failed_logins.get(peer, []) if now - t < FAILED_LOGIN_WINDOW]
            if len(recent) >= FAILED_LOGINS:
                raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"{len(recent)} wrong secrets from {peer} within "
                              f"{FAILED_LOGIN_WINDOW:g} s: calls from it are refused for "
                              f"{FAILED_LOGIN_WINDOW - (now - recent[0]):.0f} s more")
        try:
            return self.authenticate(context)
        except Refusal as e:
            if "not one of the switch's token file" in e.message:
                with self._lock:
                    self._failed_logins[peer] = [*recent, now]
                    while len(self._failed_logins) > 4096:     # bounded: oldest peers go
                        del self._failed_logins[next(iter(self._failed_logins))]
            raise

    def _maybe_login(self, context: grpc.ServicerContext) -> Optional[str]:
        """The principal of a call that may come without credentials (Ping): None when it
        sent none, a wrong one (counted as `_login` counts it) or comes from a throttled
        address."""
        if self.config.tokens is None:
            return ANONYMOUS
        if not any(k == "authorization" for k, _ in context.invocation_metadata()):
            return None
        try:
            return self._login(context)
        except Refusal:
            return None

    def _owned(self, ring_id: str, principal: str) -> Lease:
        """The lease of `ring_id` if `principal` owns it; NOT_FOUND otherwise, worded alike
        whether the ring is absent or another principal's (nobody learns of others' rings:
        their ids name jobs). Caller holds `_lock`."""
        lease = self.leases.get(ring_id)
        if lease is None or lease.owner != principal:
            owner, lost = self._lost_why.get(ring_id, ("", ""))
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"ring {ring_id} is not registered"
                          + (f" (the switch lost it: {lost})" if lost and lease is None
                             and owner == principal else ""))
        return lease

    # -- the calls ------------------------------------------------------------------------
    def ping(self, req: pb.PingRequest, principal: Optional[str]) -> pb.PingReply:
        """Open to anyone; `free_rings` (what other tenants hold) only to a principal."""
        with self._lock:
            limits = self.limits()
        if principal is None:
            limits["free_rings"] = 0
        return pb.PingReply(target=self.target.name, limits=pb.TargetLimits(**limits),
                            auth_required=self.config.tokens is not None)

    def register_ring(self, req: pb.RegisterRingRequest, principal: str
                      ) -> pb.RegisterRingReply:
        with self._lock:
            limits = self.limits()
            reg = validate.registration(req, limits, self.config.default_slots,
                                        self.config.default_lease_ms)
            spec = reg.spec
            old = self.leases.get(spec.ring_id)
            if old is not None and old.owner != principal:
                raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                              f"ring {spec.ring_id}: this ring id is taken: choose another")
            if old is not None:
                self._idle(old, spec.ring_id)
            else:
                self._check_room(spec, reg.slots, limits)
            hosts = self._check_hosts(spec, principal)
            memory = slot_memory(spec.world_size, reg.slots, spec.mtu)
            if old is not None:
                old.busy = True
            else:
                self.leases[spec.ring_id] = Lease(principal, reg.lease_ms, math.inf, memory,
                                                  busy=True, hosts=hosts)
        began = time.monotonic()         # wall time, for the log: how long a registration takes
        try:
            if isinstance(self.target, FabricSwitchTarget) and reg.racks:
                placed = self.target.register_in_fabric(spec, reg.slots, reg.racks)
            elif reg.racks:
                raise ValueError(f"racks: given, but this switch ({self.target.name}) is "
                                 "not a ToR or spine of a two-tier fabric")
            else:
                placed = self.target.register_ring(spec, reg.slots)
        except BaseException as e:
            with self._lock:
                if old is not None:
                    old.busy = False
                else:
                    del self.leases[spec.ring_id]
            if isinstance(e, ValueError):
                raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(e)) from None
            raise
        with self._lock:
            self._lost_why.pop(spec.ring_id, None)
            self.leases[spec.ring_id] = Lease(principal, reg.lease_ms,
                                              self.clock() + reg.lease_ms / 1000, memory,
                                              hosts=hosts)
        log.info("ring %s registered by %s: %d ranks, %d slots, lease %d ms (%.1f s "
                 "programming the target)", spec.ring_id, principal, spec.world_size,
                 reg.slots, reg.lease_ms, time.monotonic() - began)
        return pb.RegisterRingReply(ring_id=placed["ring_id"], slots=placed["slots"],
                                    ports=placed["ports"], lease_ms=reg.lease_ms)

    def _check_hosts(self, spec: RingSpec, principal: str) -> frozenset[str]:
        """The ring's host addresses, if `principal` may use them: each within its hosts
        policy (if any), and none in another principal's registered ring (an address
        belongs to one tenant at a time). Caller holds `_lock`."""
        policy = self.config.hosts_policy
        for c in spec.connections:
            if policy is not None:
                ip = ipaddress.ip_address(c.src_ip)
                if not any(ip in net for net in policy.get(principal, ())):
                    raise Refusal(grpc.StatusCode.PERMISSION_DENIED,
                                  f"ring {spec.ring_id}: rank {c.rank}'s address {c.src_ip} is "
                                  f"not a host of principal {principal!r} (hosts policy)")
            for rid, lease in self.leases.items():
                if rid != spec.ring_id and lease.owner != principal and c.src_ip in lease.hosts:
                    raise Refusal(grpc.StatusCode.PERMISSION_DENIED,
                                  f"ring {spec.ring_id}: rank {c.rank}'s address {c.src_ip} "
                                  "is in use by another principal's ring")
        return frozenset(c.src_ip for c in spec.connections)

    @staticmethod
    def _idle(lease: Lease, ring_id: str) -> Lease:
        if lease.busy:
            raise Refusal(grpc.StatusCode.ABORTED, f"ring {ring_id}: a registration or "
                          "unregistration of it is in progress: retry")
        return lease

    def _check_room(self, spec: RingSpec, slots: int, limits: dict[str, Any]) -> None:
        if len(self.leases) >= limits["max_rings"]:
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"ring {spec.ring_id}: the switch's limit of {limits['max_rings']} "
                          f"rings (--max-rings) is reached")
        cap = self.config.max_slot_memory
        used = sum(lease.memory for lease in self.leases.values())
        need = slot_memory(spec.world_size, slots, spec.mtu)
        if cap and used + need > cap:
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"ring {spec.ring_id}: {slots} slots x {spec.world_size + 1} x "
                          f"{spec.mtu} B = {need} bytes of aggregator memory, {used} of the "
                          f"switch's limit of {cap} bytes (--max-slot-memory) in use")

    def renew_lease(self, req: pb.RenewLeaseRequest, principal: str) -> pb.RenewLeaseReply:
        rid = validate.ring_id(req.ring_id)
        with self._lock:
            lease = self._owned(rid, principal)
            lease.expires = self.clock() + lease.lease_ms / 1000
            return pb.RenewLeaseReply(ring_id=rid, lease_ms=lease.lease_ms)

    def unregister_ring(self, req: pb.UnregisterRingRequest, principal: str
                        ) -> pb.UnregisterRingReply:
        rid = validate.ring_id(req.ring_id)
        with self._lock:
            self._idle(self._owned(rid, principal), rid).busy = True
        self._free(rid)
        log.info("ring %s unregistered by %s", rid, principal)
        return pb.UnregisterRingReply(ring_id=rid)

    def _free(self, ring_id: str) -> None:
        """Remove the ring from the target, then its (busy) lease; not under `_lock`."""
        try:
            self.target.unregister_ring(ring_id)
        except KeyError:
            log.error("ring %s had a lease but was not in the %s target", ring_id,
                      self.target.name)
        finally:
            with self._lock:
                del self.leases[ring_id]

    def counters(self, req: pb.CountersRequest, principal: str) -> pb.CountersReply:
        """Rings the caller owns (every ring for an admin principal), with per-connection
        detail on request; ports and the switch's totals for everyone. Another tenant's ring
        is not shown at all: its connections carry RETH addresses, R_Keys and PSNs, enough to
        forge a WRITE into that job's memory."""
        rid = validate.ring_id(req.ring_id) if req.ring_id else None
        sees_all = principal in self.config.admins
        with self._lock:
            if rid is not None and rid not in self.leases:
                raise Refusal(grpc.StatusCode.NOT_FOUND, f"ring {rid} is not registered")
            if rid is not None and not sees_all:
                self._owned(rid, principal)
        got = self.target.counters()
        with self._lock:
            now = self.clock()
            leases = {r: lease for r, lease in self.leases.items() if not lease.busy}
            own = {**self.counts, "rings_registered": len(leases),
                   "slot_memory_used": sum(x.memory for x in leases.values())}
        reply = pb.CountersReply(target=got["target"])
        for ring_id, ring in got["rings"].items():
            if (rid is not None and ring_id != rid) or ring_id not in leases:
                continue
            lease = leases[ring_id]
            if lease.owner != principal and not sees_all:
                continue
            rc = reply.rings.add(ring_id=ring_id, world_size=ring["world_size"],
                                 slots=ring["slots"], next_emit=ring["next_emit"],
                                 counters=ring["counters"], owner=lease.owner,
                                 lease_remaining_ms=max(0, int((lease.expires - now) * 1000)))
            if req.connections:
                for c in ring["connections"]:
                    cc = rc.connections.add(
                        rank=c["rank"], src_ip=c["src_ip"], dst_ip=c["dst_ip"],
                        dst_qpn=c["dst_qpn"], psn0=c["psn0"], in_port=c["in_port"],
                        out_port=c["out_port"], counters=c["counters"])
                    if c["reth"] is not None:
                        cc.reth.CopyFrom(pb.Reth(**c["reth"]))
        for port, pc in got["ports"].items():
            reply.ports.add(port=int(port), ifname=str(pc.get("ifname", "")),
                            counters={k: v for k, v in pc.items() if k != "ifname"})
        reply.switch.update({**got.get("switch", {}), **own})
        reply.static_macs.update(got.get("static_macs", {}))
        size = reply.ByteSize()
        if size > REPLY_BUDGET:
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the per-connection counters of {len(reply.rings)} rings take "
                          f"{size} bytes, over the {MAX_MESSAGE} byte message limit: ask for "
                          "one ring (ring_id) or for totals only (connections false)")
        return reply

    # -- leases -----------------------------------------------------------------------------
    def expire_leases(self) -> list[str]:
        """Mark every ring whose lease lapsed (busy, counted) and have it unregistered on a
        thread of `_freeing` (one slow removal delays no other); then drop the leases of the
        rings the target lost. Returns the lapsed ids (`wait_freed` waits for their removal)."""
        with self._lock:
            now = self.clock()
            lapsed = [(rid, lease) for rid, lease in self.leases.items()
                      if lease.expires <= now and not lease.busy]
            for rid, lease in lapsed:
                lease.busy = True
                self.counts["leases_expired"] += 1
        frees = [self._freeing.submit(self._lapse, rid, lease) for rid, lease in lapsed]
        with self._lock:
            self._frees = [f for f in self._frees if not f.done()] + frees
        lost = self.target.take_lost()
        with self._lock:
            for rid, why in lost.items():
                lease = self.leases.get(rid)
                if lease is not None and not lease.busy:
                    del self.leases[rid]
                    self.counts["rings_lost"] += 1
                    self._lost_why[rid] = (lease.owner, why)
                    while len(self._lost_why) > MAX_REMEMBERED_LOSSES:
                        del self._lost_why[next(iter(self._lost_why))]
                    log.warning("ring %s of %s: the target lost it: %s", rid, lease.owner, why)
        return [rid for rid, _ in lapsed]

    def _lapse(self, ring_id: str, lease: Lease) -> None:
        self._free(ring_id)
        log.warning("ring %s of %s: lease lapsed (not renewed within %d ms): unregistered",
                    ring_id, lease.owner, lease.lease_ms)

    def wait_freed(self) -> None:
        """Until every ring the reaper found lapsed so far is off the target."""
        with self._lock:
            frees = list(self._frees)
        futures.wait(frees)

    def start_reaper(self, tick: float = REAPER_TICK) -> None:
        def run() -> None:
            while not self._stop.wait(tick):
                try:
                    self.expire_leases()
                except Exception:  # noqa: BLE001 - the reaper must outlive a target's bug
                    log.exception("lease expiry failed")
        self._reaper = threading.Thread(target=run, name="lease-reaper", daemon=True)
        self._reaper.start()

    def stop(self) -> None:
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join()
        self._freeing.shutdown(wait=True)

    # -- gRPC plumbing ----------------------------------------------------------------------
    def handler(self) -> grpc.GenericRpcHandler:
        calls = {"Ping": (pb.PingRequest, self.ping, False),
                 "RegisterRing": (pb.RegisterRingRequest, self.register_ring, True),
                 "RenewLease": (pb.RenewLeaseRequest, self.renew_lease, True),
                 "UnregisterRing": (pb.UnregisterRingRequest, self.unregister_ring, True),
                 "Counters": (pb.CountersRequest, self.counters, True)}
        return grpc.method_handlers_generic_handler(
            SERVICE, {name: grpc.unary_unary_rpc_method_handler(self._rpc(name, *call))
                      for name, call in calls.items()})

    def _rpc(self, name: str, request_type: type, fn: Callable[[Any, Any], Any],
             needs_credentials: bool) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        """A raw-bytes handler: authenticate, decode, call; every failure becomes a status.

        Requests are decoded here, not by grpc, so that undecodable bytes are
        INVALID_ARGUMENT like any other malformed value. context.abort raises, so a call
        either returns the reply or ends with the status.
        """
        at_target = name in TARGET_METHODS

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                principal = (self._login(context) if needs_credentials
                             else self._maybe_login(context))
                if principal is not None and needs_credentials \
                        and not self._rate.take(principal):
                    raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  f"principal {principal!r}: over "
                                  f"{self.config.calls_per_second:g} calls per second "
                                  "(the controller's rate limit per principal)")
                msg = validate.parse(request_type, request)
                if not at_target:
                    return fn(msg, principal).SerializeToString()
                with self._target_turn(principal):
                    return fn(msg, principal).SerializeToString()
            except (Refusal, validate.InvalidArgument) as e:
                refusal = e if isinstance(e, Refusal) else Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT, str(e))
                self._count(REFUSAL_COUNTERS[refusal.code])
                context.abort(refusal.code, refusal.message)
            except Exception as e:  # noqa: BLE001 - anything else is the controller's fault
                self._count("internal_errors")
                if (name, type(e).__name__) not in self._logged:
                    self._logged.add((name, type(e).__name__))
                    log.exception("%s failed", name)
                context.abort(grpc.StatusCode.INTERNAL, f"{name}: {type(e).__name__}: {e}")
        return handle

    def _count(self, counter: str) -> None:
        with self._lock:
            self.counts[counter] += 1

    @contextlib.contextmanager
    def _target_turn(self, principal: str) -> Iterator[None]:
        """One of `principal`'s places at the target (`TargetTurns`), or RESOURCE_EXHAUSTED."""
        if not self._turns.take(principal):
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"principal {principal!r}: {self._turns.cap} calls at the target "
                          "already (the controller's limit per principal): wait for one to end")
        try:
            yield
        finally:
            self._turns.give_back(principal)


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path


class ControllerServer:
    """A running controller: the gRPC server and its service's lease reaper."""

    def __init__(self, server: grpc.Server, service: ControllerService):
        self.server = server
        self.service = service

    def stop(self, grace: Optional[float] = None) -> None:
        self.service.stop()
        self.server.stop(grace).wait()


def serve(target: Target, addr: str = DEFAULT_ADDR, max_workers: int = DEFAULT_WORKERS, *,
          config: ControllerConfig, tls: Optional[TlsFiles] = None
          ) -> tuple[ControllerServer, int]:
    """Start the controller on `addr` ('host:0' picks a port) with its lease reaper;
    returns (the running controller, port). ValueError: clear text on an address other
    hosts reach (not loopback, not a unix socket) without `config.insecure`."""
    if tls is None and not local_address(addr):
        if not config.insecure:
            raise ValueError(f"controller on {addr}: clear text on an address other hosts "
                             "reach: give a TLS certificate and key (or run it insecure, in "
                             "so many words)")
        log.warning("controller on %s: INSECURE: clear text, token secrets (if any) "
                    "replayable by anyone who can capture the control traffic", addr)
    service = ControllerService(target, config)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE)])
    server.add_generic_rpc_handlers((service.handler(),))
    try:
        if tls is None:
            port = server.add_insecure_port(addr)
        else:
            creds = grpc.ssl_server_credentials([(tls.key.read_bytes(), tls.cert.read_bytes())])
            port = server.add_secure_port(addr, creds)
    except RuntimeError as e:
        raise OSError(f"controller: cannot listen on {addr}: {e}") from None
    server.start()
    service.start_reaper()
    return ControllerServer(server, service), port
