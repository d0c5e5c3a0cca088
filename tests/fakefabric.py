"""An in-process stand-in for rxe, so the stream, the communicator and the ring algorithm
run on a machine without RDMA: ranks are threads of one process, registered memory is numpy
arrays, and an RDMA WRITE WITH IMMEDIATE is a memmove plus two completions.

Like the real thing: a posted WRITE executes later (when its sender polls), reading each
of its SGEs from a registered region under the right key and in bounds (the host's
buffers, or the caller's memory registered in place: `FakeHost.register_user`, which never
owns nor frees it), only into a registered region under the right key and in bounds,
consumes one posted receive of the responder (none posted -> it waits, like an RNR retry),
and completes in order; CQs must never overflow. Faults on demand: `fail_index` (error
completion), `frozen` (stall), and a transport fault of one rank's QPs (`FakeHost.faults`:
the ring built next fails its WRITE number N with a retry error and goes to ERROR).

`FakeController` stands in for the switch controller: a ring registered with it makes the
fabric aggregate that ring's WRITEs like the switch (`FakeSwitch`), message by message
instead of packet by packet: message i of every connection must have the same length; once
all n have arrived, each connection's destination receives the wrapping little-endian int32
sum, and only then do the senders' WRITEs complete. Packet-level behaviour (PSNs, loss,
retransmission, the real switch pipeline) is the RC model's job (tests/rcmodel); this
fabric serves the tests of the communicator around it (rendezvous, registration, refusals).
"""
from __future__ import annotations

import ctypes
import itertools
import random
import threading
import time
from collections import deque
from typing import Callable

import numpy as np

from flowctl.link import Completion, Gather, LocalBuffer, RemoteBuffer, sges
from flowctl.plan import IMM_MODULUS, FlowConfig
from ring_setup.device import ipv4_gid
from ring_setup.endpoints import HostEndpoint, QPEndpoint, RingAddress, RingEndpoint
from nr_contract.spec import RingSpec


class FakeFabric:
    def __init__(self, deliver_per_poll: int = 3) -> None:
        self.lock = threading.RLock()
        self.deliver_per_poll = deliver_per_poll
        self.regions: dict[int, FakeRegion] = {}
        self.receivers: dict[int, FakeLink] = {}      # recv QPN -> the link receiving on it
        self._ids = itertools.count(1)
        self.fail_index: int | None = None
        self.frozen = False
        self.switch = FakeSwitch()

    def new_id(self) -> int:
        return next(self._ids)


class FakeRegion:
    def __init__(self, fabric: FakeFabric, nbytes: int) -> None:
        self._fabric = fabric
        self._array: np.ndarray | None = np.zeros(nbytes, dtype=np.uint8)
        self.nbytes = nbytes
        self.addr = self._array.ctypes.data
        self.lkey = self.rkey = fabric.new_id()
        fabric.regions[self.lkey] = self

    def local(self) -> LocalBuffer:
        return LocalBuffer(self.addr, self.lkey, self.nbytes)

    def remote(self) -> RemoteBuffer:
        return RemoteBuffer(self.addr, self.rkey, self.nbytes)

    def view(self) -> np.ndarray:
        assert self._array is not None, "view of a closed region"
        return self._array

    def contains(self, addr: int, nbytes: int) -> bool:
        return self._array is not None and self.addr <= addr and addr + nbytes <= self.addr + self.nbytes

    def close(self) -> None:
        self._fabric.regions.pop(self.lkey, None)
        self._array = None


class FakeUserRegion(FakeRegion):
    """The caller's memory registered in place for local reads (RdmaHost.register_user): a
    WRITE's source reads that memory (never a copy of it) from registration to `close`;
    nothing is ever written into it (no remote key); `closed`: deregistered."""

    def __init__(self, fabric: FakeFabric, addr: int, nbytes: int) -> None:
        self._fabric = fabric
        self.nbytes, self.addr = nbytes, addr
        self._array = np.ctypeslib.as_array((ctypes.c_ubyte * nbytes).from_address(addr))
        self.lkey = self.rkey = fabric.new_id()
        fabric.regions[self.lkey] = self
        self.closed = False

    def remote(self) -> RemoteBuffer:
        raise AssertionError("a region of the caller's memory has no remote key")

    def close(self) -> None:
        super().close()
        self.closed = True


def read_sges(src: LocalBuffer | Gather) -> bytes:
    """A WRITE's payload: its SGEs' bytes in order."""
    return b"".join(ctypes.string_at(p.addr, p.nbytes) for p in sges(src))


class FakeHost:
    """A rank's device; `ring_addrs` (ring -> IPv4) as RdmaHost's: rings on another address."""

    def __init__(self, fabric: FakeFabric, rank: int,
                 ring_addrs: dict[str, str] | None = None) -> None:
        self.fabric = fabric
        self.ring_addrs = dict(ring_addrs or {})
        self.ip = f"10.99.0.{rank + 1}"
        self.mac = f"02:99:00:00:00:{rank + 1:02x}"
        self.gid = ipv4_gid(self.ip)
        self.device = f"fake{rank}"
        self._regions: list[FakeRegion] = []
        self.user_regions: list[FakeUserRegion] = []
        self.rings: dict[str, FakeRingQPs] = {}
        # ring name -> for each QPs of it built from now on, the WRITE (0: the first
        # delivered) that fails with a transport fault, or None
        self.faults: dict[str, list[int | None]] = {}
        self.built: dict[str, int] = {}                # ring name -> QPs built

    def register(self, nbytes: int) -> FakeRegion:
        region = FakeRegion(self.fabric, nbytes)
        self._regions.append(region)
        return region

    def register_user(self, addr: int, nbytes: int) -> FakeUserRegion:
        """Like RdmaHost.register_user; `user_regions` lists them all, in order."""
        region = FakeUserRegion(self.fabric, addr, nbytes)
        self.user_regions.append(region)
        return region

    def create_ring(self, name: str, config: FlowConfig) -> "FakeRingQPs":
        addr = self.ring_addrs.get(name)
        qps = self.rings[name] = FakeRingQPs(self.fabric, name, config, None if addr is None
                                             else RingAddress(addr, self.mac, ipv4_gid(addr)))
        self.built[name] = self.built.get(name, 0) + 1
        if self.faults.get(name):
            qps.fail_at = self.faults[name].pop(0)
        return qps

    def close(self) -> None:
        for region in self._regions + self.user_regions:
            region.close()


class FakeRingQPs:
    def __init__(self, fabric: FakeFabric, name: str, config: FlowConfig,
                 addr: RingAddress | None = None) -> None:
        self.fabric, self.name, self.config, self.addr = fabric, name, config, addr
        self.send_qpn, self.recv_qpn = fabric.new_id(), fabric.new_id()
        self.send_psn, self.recv_psn = random.getrandbits(24), random.getrandbits(24)
        self.dest_qpn: int | None = None
        self.posted = 0                 # WRITEs posted on this ring's send QP (all time)
        self.error = False              # to_error() or close(): nothing moves any more
        self.fail_at: int | None = None  # the delivered WRITE that fails (a transport fault)
        self.delivered = 0

    def local(self) -> RingEndpoint:
        return RingEndpoint(QPEndpoint(self.send_qpn, self.send_psn),
                            QPEndpoint(self.recv_qpn, self.recv_psn), self.addr)

    def connect(self, predecessor: HostEndpoint, successor: HostEndpoint) -> None:
        self.dest_qpn = successor.rings[self.name].recv.qpn

    def link(self, recv_sge: LocalBuffer, successor: int, predecessor: int) -> "FakeLink":
        link = FakeLink(self, successor, predecessor)
        self.fabric.receivers[self.recv_qpn] = link
        return link

    def to_error(self) -> None:
        """Like QPs in ERROR: our WRITEs not yet delivered are dropped, and WRITEs to us are
        never executed nor answered (their senders wait, as rxe's retry forever)."""
        with self.fabric.lock:
            self.error = True

    def close(self) -> None:
        with self.fabric.lock:
            self.error = True
            self.fabric.receivers.pop(self.recv_qpn, None)


class FakeLink:
    """flowctl.link.Link for one rank of a fake ring."""

    def __init__(self, qps: FakeRingQPs, successor: int, predecessor: int) -> None:
        self.qps, self.fabric = qps, qps.fabric
        self.successor, self.predecessor = successor, predecessor
        self.wire: deque[tuple[int, LocalBuffer | Gather, RemoteBuffer]] = deque()
        self.send_cq: deque[Completion] = deque()
        self.recv_cq: deque[Completion] = deque()
        self.recv_posted = 0
        self.in_switch = 0          # WRITEs the fake switch holds until their sum is complete
        self.held_src: dict[int, LocalBuffer | Gather] = {}   # their sources, by index
        self.max_in_flight = 0      # most WRITEs posted and not yet polled at once
        self.armed = 0              # arm() calls
        self.waits: list[float] = []   # wait() timeouts

    def post_write(self, index: int, src: LocalBuffer | Gather, dst: RemoteBuffer) -> None:
        with self.fabric.lock:
            in_flight = len(self.wire) + self.in_switch + len(self.send_cq) + 1
            assert in_flight <= self.qps.config.window, "send queue / send CQ overflow"
            self.max_in_flight = max(self.max_in_flight, in_flight)
            self.wire.append((index, src, dst))
            self.qps.posted += 1

    def post_recvs(self, count: int) -> None:
        with self.fabric.lock:
            self.recv_posted += count
            assert self.recv_posted <= self.qps.config.recv_depth, "receive queue overflow"

    def _deliver(self) -> None:
        fabric = self.fabric
        with fabric.lock:
            if fabric.frozen:
                return
            assert self.qps.dest_qpn is not None, "post before connect"
            target = fabric.receivers.get(self.qps.dest_qpn)
            if self.qps.error:
                self.wire.clear()
                return
            if target is None or target.qps.error:      # never executed, never answered
                return
            for _ in range(fabric.deliver_per_poll):
                if not self.wire or target.recv_posted == 0:
                    return
                index, src, dst = self.wire.popleft()
                if self.qps.delivered == self.qps.fail_at:    # retries exhausted: ERROR
                    self.qps.error = True
                    self.send_cq.append(Completion(
                        index, False, "transport retry counter exceeded (status 12, fake)"))
                    return
                self.qps.delivered += 1
                if index == fabric.fail_index:
                    self.send_cq.append(Completion(index, False, "remote access error (fake)"))
                    continue
                for part in sges(src):
                    src_region = fabric.regions.get(part.lkey)
                    assert src_region is not None and src_region.contains(part.addr,
                                                                          part.nbytes)
                dst_region = fabric.regions.get(dst.rkey)
                if dst_region is None:      # the peer closed its memory (it died): a write
                    continue                # to it is never answered, as on a real NIC
                assert dst_region.contains(dst.addr, dst.nbytes)
                assert not isinstance(dst_region, FakeUserRegion), "no remote key there"
                target.recv_posted -= 1
                if fabric.switch.contribute(self, target, index, src, dst):
                    continue
                at = dst.addr
                for part in sges(src):
                    ctypes.memmove(at, part.addr, part.nbytes)
                    at += part.nbytes
                self.arrive(target, index)

    def arrive(self, target: "FakeLink", index: int) -> None:
        """The WRITE `index` landed at `target` (its receive already taken) and is acked."""
        target.recv_cq.append(Completion(index % IMM_MODULUS, True))
        assert len(target.recv_cq) <= self.qps.config.recv_depth, "recv CQ overflow"
        self.send_cq.append(Completion(index, True))

    def poll_sends(self, max_count: int) -> list[Completion]:
        self._deliver()
        with self.fabric.lock:
            return [self.send_cq.popleft() for _ in range(min(max_count, len(self.send_cq)))]

    def poll_recvs(self, max_count: int) -> list[Completion]:
        with self.fabric.lock:
            return [self.recv_cq.popleft() for _ in range(min(max_count, len(self.recv_cq)))]

    def arm(self) -> None:
        self.armed += 1

    def wait(self, timeout: float) -> None:
        """No events here (WRITEs move when their sender polls): a short nap instead."""
        self.waits.append(timeout)
        time.sleep(min(timeout, 1e-4))

    def diagnostics(self) -> str:
        return f"fake link ({len(self.wire)} on the wire, {self.recv_posted} receives posted)"


class FakeSwitch:
    """Aggregates the WRITEs of registered rings (see the module doc); `messages` counts the
    sums it delivered per ring."""

    def __init__(self) -> None:
        self.rings: dict[int, tuple[str, int]] = {}    # responder QPN -> (ring id, rank)
        self.world: dict[str, int] = {}
        self.pending: dict[tuple[str, int], dict[int, tuple]] = {}
        self.messages: dict[str, int] = {}
        # cut(ring id, message index) -> k or None: a switch that dies while it emits that
        # message's sums: the first k receivers (in rank order of the senders) get the sum,
        # the others their sender's own payload (what the restarted switch forwards), and
        # every ring is forgotten
        self.cut: Callable[[str, int], int | None] | None = None

    def register(self, spec: RingSpec) -> None:
        for c in spec.connections:
            assert c.dst_qpn not in self.rings, "connection already registered"
            self.rings[c.dst_qpn] = (spec.ring_id, c.rank)
        self.world[spec.ring_id] = spec.world_size
        self.messages[spec.ring_id] = 0

    def unregister(self, ring_id: str) -> None:
        self.rings = {q: v for q, v in self.rings.items() if v[0] != ring_id}
        del self.world[ring_id]

    def restart(self) -> None:
        """Forget every ring, like a restarted switch. The WRITEs it held for an incomplete
        sum are lost with it: each goes back to the front of its sender's wire, as RoCE's
        go-back-N resends it, and the restarted switch forwards it plainly."""
        held = sorted(((index, part) for (_, index), parts in self.pending.items()
                       for part in parts.values()), key=lambda item: -item[0])
        for index, (sender, receiver, dst, payload) in held:
            src = sender.held_src.pop(index)
            sender.wire.appendleft((index, src, dst))
            sender.in_switch -= 1
            receiver.recv_posted += 1
        self.pending.clear()
        for ring_id in list(self.world):
            self.unregister(ring_id)

    def contribute(self, link: FakeLink, target: FakeLink, index: int,
                   src: LocalBuffer | Gather, dst: RemoteBuffer) -> bool:
        """Take the WRITE if its ring is registered (False: not ours, deliver it plainly)."""
        assert link.qps.dest_qpn is not None
        entry = self.rings.get(link.qps.dest_qpn)
        if entry is None:
            return False
        ring_id, rank = entry
        payload = read_sges(src)
        parts = self.pending.setdefault((ring_id, index), {})
        assert rank not in parts, f"rank {rank} sent message {index} twice"
        parts[rank] = (link, target, dst, payload)
        link.held_src[index] = src
        link.in_switch += 1
        assert len({len(p[3]) for p in parts.values()}) == 1, \
            f"ring {ring_id}: message {index} differs in length between ranks"
        if len(parts) == self.world[ring_id]:
            del self.pending[(ring_id, index)]
            total = np.zeros(len(payload) // 4, dtype="<i4")
            for *_, data in parts.values():
                total += np.frombuffer(data, dtype="<i4")     # wraps like the switch
            summed = self.cut(ring_id, index) if self.cut is not None else None
            for i, (sender, receiver, where, data) in enumerate(
                    p for _, p in sorted(parts.items())):
                good = summed is None or i < summed
                ctypes.memmove(where.addr, total.tobytes() if good else data, where.nbytes)
                sender.in_switch -= 1
                del sender.held_src[index]
                sender.arrive(receiver, index)
            self.messages[ring_id] += 1
            if summed is not None:
                self.restart()
        return True


SOFTWARE_LIMITS = {"path_mtus": [256, 512, 1024, 2048, 4096], "max_slots": 1024,
                   "max_ranks": 32, "max_rings": 0, "free_rings": 0, "max_slot_memory": 0,
                   "default_lease_ms": 0, "max_in_flight": 0, "ack_timeout": 0, "capacity": 0}


class FakeControllerError(RuntimeError):
    """Like the controller client's error: a gRPC status `code` name and a message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class FakeController:
    """switch.control.service.ControllerClient for a fake fabric: `refuse` makes registration
    fail with that message; `lease_ms` > 0 grants leases (renewals counted in `renewed`);
    `restart()` forgets every ring like a restarted switch; Ping answers `target` and
    `limits` (None: a controller that publishes none; an exception: raised); renewals
with a timeout (probes) are counted in `probes`; Counters
    answers `ring_counters` for every registered ring (an exception: raised);
    `registered` / `unregistered` record the calls."""

    addr = "fake-controller:1"

    def __init__(self, fabric: FakeFabric, refuse: str | None = None, lease_ms: int = 0,
                 target: str = "software",
                 limits: dict | Exception | None = SOFTWARE_LIMITS) -> None:
        self.fabric, self.refuse, self.lease_ms = fabric, refuse, lease_ms
        self.target, self.limits = target, limits
        self.pings = self.probes = 0
        self.registered: list[RingSpec] = []
        self.unregistered: list[str] = []
        self.renewed: list[str] = []
        self.closed = False
        self.ring_counters: dict | Exception = {"next_emit": 0, "counters": {},
                                                "connections": []}

    def ping(self) -> dict:
        self.pings += 1
        if isinstance(self.limits, Exception):
            raise self.limits
        return {"target": self.target} if self.limits is None else \
            {"target": self.target, "limits": self.limits}

    def register_ring(self, spec: RingSpec) -> dict:
        if self.refuse is not None:
            raise RuntimeError(self.refuse)
        with self.fabric.lock:
            self.fabric.switch.register(spec)
        self.registered.append(spec)
        return {"ring_id": spec.ring_id, "slots": 256, "ports": {}, "lease_ms": self.lease_ms}

    def renew_lease(self, ring_id: str, timeout: float | None = None) -> dict:
        self.probes += timeout is not None
        with self.fabric.lock:
            if ring_id not in self.fabric.switch.world:
                raise FakeControllerError("NOT_FOUND", f"no ring {ring_id!r}")
        self.renewed.append(ring_id)
        return {"ring_id": ring_id, "lease_ms": self.lease_ms}

    def restart(self) -> None:
        with self.fabric.lock:
            self.fabric.switch.restart()

    def unregister_ring(self, ring_id: str) -> dict:
        with self.fabric.lock:
            if ring_id not in self.fabric.switch.world:
                raise FakeControllerError("NOT_FOUND", f"no ring {ring_id!r}")
            self.fabric.switch.unregister(ring_id)
        self.unregistered.append(ring_id)
        return {"ring_id": ring_id}

    def counters(self, ring_id: str | None = None) -> dict:
        if isinstance(self.ring_counters, Exception):
            raise self.ring_counters
        with self.fabric.lock:
            rings = [r for r in self.fabric.switch.world if ring_id in (None, r)]
        return {"rings": {r: self.ring_counters for r in rings}}

    def close(self) -> None:
        self.closed = True
