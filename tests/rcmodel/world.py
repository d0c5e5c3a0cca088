"""A whole lab in the model: n hosts with rxe devices, both QP rings, real communicators.

`World(n, config, ...)` builds, like ring setup does on real hosts, per rank one model rxe
device and per ring ("ring", "inc") a send QP to the successor and a recv QP from the
predecessor; registers the "inc" ring with the real AggregationPipeline (as the controller
would: `slots`, default 256, checked by `check_ring`); and gives every rank a real
`netreduce.Communicator` whose streams are real `flowctl.Stream`s over model links. So a
call runs the host's own code end to end: its metadata exchange through the switch, the
flowctl message plan and credit window, the algorithm's transfers (switch: one transfer on
"inc"; ring: reduce-scatter and all-gather forwarded through the switch on "ring").

`World.run(body)` runs body(comm) on every rank (one thread each, one at a time, see
rcmodel.sim) with flowctl's clock replaced by the simulated one, and returns what each
returned or raised. Stall timeouts and rxe's retransmit timer are in simulated seconds.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

import flowctl.stream
import netreduce.transport_fault as transport_fault
from flowctl.link import Completion, Gather, LocalBuffer, RemoteBuffer
from flowctl.plan import FlowConfig
from flowctl.stream import LIVENESS_POLL, Stream
from netreduce.comm import Communicator
from netreduce.rings import RINGS
from netreduce.meta import control_bytes
from netreduce.registration import SwitchStatus
from nr_contract.spec import DEFAULT_SLOTS, RingSpec
from ring_setup.device import ipv4_gid
from ring_setup.endpoints import HostEndpoint, QPEndpoint, RingEndpoint, ring_spec
from ring_setup.store_protocol import PeerFailed, RendezvousTimeout
from switch.dataplane.pipeline import AggregationPipeline
from tests.rcmodel.fabric import Fabric, FaultRates, Faults, OneArmedFabric
from tests.rcmodel.rxe import QP, Device, Peer, QPAttr
from tests.rcmodel.sim import Simulation, Turns
from tests.rcmodel.tiers import ThreeTierFabric, TwoTierFabric


def host_ip(rank: int) -> str:
    """The lab's address of host `rank` (10.77.0.(rank+1)); past 253, 10.77.q.(m+1) with
    q, m = divmod(rank, 254), so the scale study's 1024 ranks are distinct too."""
    if rank < 254:
        return f"10.77.0.{rank + 1}"
    q, m = divmod(rank, 254)
    return f"10.77.{q}.{m + 1}"


def host_mac(rank: int) -> str:
    """The lab's MAC of host `rank` (02:4e:52:00:00:(rank+1)), 16 bits of it past 254."""
    return f"02:4e:52:00:{(rank + 1) >> 8:02x}:{(rank + 1) & 0xFF:02x}"


class ModelLink:
    """flowctl.link.Link over a rank's two QPs of one ring."""

    def __init__(self, turns: Turns, rank: int, send: QP, recv: QP, successor: int,
                 predecessor: int) -> None:
        self.turns, self.rank, self.send, self.recv = turns, rank, send, recv
        self.successor, self.predecessor = successor, predecessor
        send.on_event = recv.on_event = lambda: turns.poke(rank)   # what `wait` waits for

    def post_write(self, index: int, src: LocalBuffer | Gather, dst: RemoteBuffer) -> None:
        self.send.post_write(index, src, dst)

    def post_recvs(self, count: int) -> None:
        self.recv.recv_posted += count

    def poll_sends(self, max_count: int) -> list[Completion]:
        cq = self.send.send_cq
        return [cq.popleft() for _ in range(min(max_count, len(cq)))]

    def poll_recvs(self, max_count: int) -> list[Completion]:
        cq = self.recv.recv_cq
        return [cq.popleft() for _ in range(min(max_count, len(cq)))]

    def arm(self) -> None:
        return None

    def wait(self, timeout: float) -> None:
        """Until a completion is queued after this call (an armed CQ's event: completions
        already queued raise none) or `timeout` simulated seconds pass."""
        seen = self.send.cq_events + self.recv.cq_events
        self.turns.wait(self.rank, timeout,
                        lambda: self.send.cq_events + self.recv.cq_events > seen)

    def diagnostics(self) -> str:
        counters = ", ".join(f"{k}={v}" for k, v in sorted(self.send.device.counters.items()))
        return (f"send QP {self.send.qpn} (to rank {self.successor}) "
                f"{'ERROR' if self.send.error else 'RTS'}, recv QP {self.recv.qpn} (from "
                f"rank {self.predecessor}) {'ERROR' if self.recv.error else 'RTS'}; "
                f"{self.send.device.name} counters: {counters}")


@dataclass
class ModelRingQPs:
    """A rank's QPs of one ring (netreduce.rings.RingQPsLike): those `World` connected at
    setup, or a ring the communicator builds again after a transport fault
    (`ModelHost.create_ring`: local, connect, link)."""

    send: QP
    recv: QP
    name: str = "ring"
    turns: Optional[Turns] = None
    rank: int = 0

    def local(self) -> RingEndpoint:
        return RingEndpoint(QPEndpoint(self.send.qpn, self.send.next_psn),
                            QPEndpoint(self.recv.qpn, self.recv.next_psn))

    def connect(self, predecessor: HostEndpoint, successor: HostEndpoint) -> None:
        peer_recv, peer_send = successor.rings[self.name].recv, predecessor.rings[self.name].send
        self.send.connect(Peer(successor.ip, successor.mac, peer_recv.qpn), peer_recv.psn)
        self.recv.connect(Peer(predecessor.ip, predecessor.mac, peer_send.qpn), peer_send.psn)

    def link(self, recv_sge: LocalBuffer, successor: int, predecessor: int) -> "ModelLink":
        assert self.turns is not None, "a ring built at setup has its link already"
        return ModelLink(self.turns, self.rank, self.send, self.recv, successor, predecessor)

    def to_error(self) -> None:
        self.send.to_error()
        self.recv.to_error()

    def close(self) -> None:
        self.to_error()


@dataclass
class ModelHost:
    """What netreduce.rings.Host needs for `Workspace` (register), error messages,
    `Communicator.close`, and a ring built again after a transport fault (`create_ring`:
    fresh QPs and PSNs on the model device, with the world's QP attributes)."""

    device: Device
    attr: Optional[QPAttr] = None
    turns: Optional[Turns] = None
    rank: int = 0

    def register(self, nbytes: int) -> Any:
        return self.device.register(nbytes)

    def register_user(self, addr: int, nbytes: int) -> Any:
        return self.device.register_user(addr, nbytes)

    def create_ring(self, name: str, config: FlowConfig) -> ModelRingQPs:
        assert self.attr is not None and self.turns is not None
        draw = random.Random(f"{self.device.name}-{name}-{len(self.device.qps)}")
        return ModelRingQPs(self.device.create_qp(draw.getrandbits(24), self.attr),
                            self.device.create_qp(draw.getrandbits(24), self.attr),
                            name, self.turns, self.rank)

    def close(self) -> None:
        """As closing a real device destroys its QPs: every QP of the rank's device to ERROR
        (no retransmission reads the memory the communicator freed before it); the model's
        device itself lives as long as its World."""
        for qp in list(self.device.qps.values()):
            qp.to_error()



class ModelStore:
    """What the ranks' rendezvous share: failures, switch-away notices, gathered keys."""

    def __init__(self) -> None:
        self.failures: dict[int, str] = {}
        self.notices: dict[int, str] = {}
        self.keys: dict[str, dict[int, Any]] = {}


class ModelRendezvous:
    """The rendezvous as the communicator uses it after setup: liveness, switch-away notices
    and the gathers that settle them.

    Every rank shares one `ModelStore`, as the real store's watch does: a rank that aborts
    (its call failed) is seen at once by every other rank's `check_peers`, so the others
    fail fast with `PeerFailure` naming it (ring_setup/store_server.py); a notice is seen at
    once through `notice_epoch` (a rank's "inc" stream checks it while it waits). Notices
    are never pushed to listeners: a model rank has no progress thread, so only ranks in a
    call settle (the tests' bodies end with a call on every rank). A gather waits on the
    simulated clock (`Turns`). No process dies in the model.
    """

    job_key = b"model"          # what names an "inc" ring built again (rings.inc_ring_spec)

    def __init__(self, rank: int, world_size: int, store: ModelStore, turns: Turns) -> None:
        self.rank = rank
        self.world_size = world_size
        self._store = store
        self._failures = store.failures
        self._turns = turns

    def abort(self, reason: str) -> None:
        self._failures.setdefault(self.rank, reason)

    def check_peers(self) -> None:
        if self._failures:
            raise PeerFailed(self._failures)

    @property
    def notices(self) -> dict[int, str]:
        return self._store.notices

    @property
    def notice_epoch(self) -> int:
        return max(self._store.notices, default=0)

    def notice(self, epoch: int, reason: str) -> None:
        self._store.notices.setdefault(epoch, reason)

    def on_notice(self, listener: Callable[[int, str], None]) -> None:
        """Never called in the model (see the class doc)."""

    def all_gather(self, name: str, value: Any, *, waiting_for: str = "joined") -> list[Any]:
        """The registration's outcome from rank 0 (netreduce.registration)."""
        got = self.gather(name, value, LIVENESS_POLL * 1000, waiting_for=waiting_for)
        assert got is not None
        return got

    def gather(self, name: str, value: Any, timeout: float, *, waiting_for: str,
               until: Optional[Callable[[], bool]] = None) -> Optional[list[Any]]:
        got = self._store.keys.setdefault(name, {})
        got.setdefault(self.rank, value)
        for rank in range(self.world_size):     # as the store answers a waiting "get"
            self._turns.poke(rank)
        end = self._turns.sim.now + timeout
        while len(got) < self.world_size:
            self.check_peers()
            if until is not None and until():
                return None
            if self._turns.sim.now >= end:
                raise RendezvousTimeout(f"model: ranks {sorted(set(range(self.world_size)) - set(got))} never {waiting_for}")
            self._turns.wait(self.rank, min(LIVENESS_POLL, end - self._turns.sim.now),
                             lambda: len(got) == self.world_size or bool(self._failures))
        return [got[r] for r in range(self.world_size)]

    def watch(self) -> None:
        """The model needs no watcher: `failures` is shared."""

    def close(self, timeout: float = 10.0) -> list[int]:
        return []

class ModelController:
    """Rank 0's controller client (`World(controller=True)`): registers an "inc" ring built
    again (netreduce/away.py) with the world's one switch, no lease; unregistering is
    forgotten by a single-tier switch only (a fabric's rings stay: nothing reuses them)."""

    addr = "model"

    def __init__(self, world: "World") -> None:
        self._world = world

    def register_ring(self, spec: RingSpec) -> dict[str, Any]:
        self._world.register(spec)
        self._world.spec = spec             # the "inc" ring as last registered
        return {"ring_id": spec.ring_id, "slots": self._world.slots, "lease_ms": 0}

    def unregister_ring(self, ring_id: str) -> dict[str, Any]:
        if not isinstance(self._world.fabric, TwoTierFabric):
            pipeline = self._world.pipeline
            self._world.unregistered[ring_id] = pipeline.counters()[ring_id]
            pipeline.unregister_ring(ring_id)
        return {}

    def ping(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """Nothing to close."""


class World:
    """n ranks, the switch and the links between them (see the module doc).

    `psn0s`: the initial send PSN of every QP, by (rank, ring) (default: drawn from `seed`;
    give values near 2^24 to cross the PSN wrap). `slots=None` registers the "inc" ring
    with the controller's default; `switch=False` registers nothing (the ring forwards).
    `racks` (rack sizes, contiguous ranks): a two-tier fabric instead of the one switch
    (rcmodel.tiers), its ToR-spine links with `uplink_faults`; with `pods` (racks per pod)
    three tiers (rcmodel.tiers.ThreeTierFabric, rcmodel.pod). `max_ranks` widens the one
    switch's per-ring limit (nr_contract.spec.MAX_RANKS, its slot bitmap's width) for the
    scale study's "one switch of n ports" (rcmodel.scale); the software pipeline's bitmap
    is a Python int, so nothing else changes. `aggregator_bps`: the hosts on a shared network
    with a one-armed aggregator whose link runs at that rate (rcmodel.fabric.OneArmedFabric;
    k aggregators: k x LINK_BPS, rcmodel.aggregators). `in_flight`: every communicator's
    (tests.rcmodel.inflight). `controller`: rank 0 holds a `ModelController` (an "inc"
    ring built again after a transport fault is registered; no lease).
    """

    def __init__(self, n: int, config: FlowConfig, *, faults: Faults = Faults(),
                 slots: Optional[int] = DEFAULT_SLOTS, switch: bool = True,
                 attr: Optional[QPAttr] = None, seed: int = 0,
                 psn0s: Optional[dict[tuple[int, str], int]] = None,
                 max_time: float = 600.0, max_events: int = 2_000_000,
                 racks: Optional[Sequence[int]] = None,
                 uplink_faults: FaultRates = FaultRates(),
                 max_ranks: Optional[int] = None,
                 pods: Optional[Sequence[int]] = None,
                 aggregator_bps: Optional[float] = None, in_flight: int = 1,
                 controller: bool = False) -> None:
        self.n, self.config = n, config
        self.unregistered: dict[str, Any] = {}  # a ring's last counters (ModelController)
        self.sim = Simulation(max_time, max_events)
        self.turns = Turns(self.sim)
        self.pipeline = AggregationPipeline()
        if max_ranks is not None:
            self.pipeline.max_ranks = max_ranks
        self.fabric: Fabric | TwoTierFabric
        if aggregator_bps is not None:
            self.fabric = OneArmedFabric(self.sim, self.pipeline, faults, aggregator_bps)
        elif racks is None:
            self.fabric = Fabric(self.sim, self.pipeline, faults)
        else:
            if sum(racks) != n:
                raise ValueError(f"racks {list(racks)} hold {sum(racks)} ranks, not {n}")
            self.fabric = (TwoTierFabric(self.sim, racks, faults, uplink_faults) if pods is None
                           else ThreeTierFabric(self.sim, racks, pods, faults, uplink_faults))
        attr = attr or QPAttr(mtu=config.mtu)
        draw = random.Random(seed)
        psn0s = psn0s or {}
        self.devices = []
        for r in range(n):
            dev = Device(f"rxe{r}", host_ip(r), host_mac(r), self.sim)
            dev.nic = self.fabric.attach(r + 1, dev.mac, dev.receive)
            self.devices.append(dev)
        qps = {(r, ring): (self.devices[r].create_qp(
                   psn0s.get((r, ring), draw.getrandbits(24)), attr),
                   self.devices[r].create_qp(draw.getrandbits(24), attr))
               for r in range(n) for ring in RINGS}
        controls = [dev.register(control_bytes(n)) for dev in self.devices]
        self.endpoints = [HostEndpoint(
            rank=r, ip=dev.ip, mac=dev.mac, gid=ipv4_gid(dev.ip), device=dev.name,
            mtu=config.mtu, msg_size=config.msg_size, window=config.window,
            control=controls[r].remote(),
            rings={ring: RingEndpoint(QPEndpoint(qps[r, ring][0].qpn, qps[r, ring][0].next_psn),
                                      QPEndpoint(qps[r, ring][1].qpn, qps[r, ring][1].next_psn))
                   for ring in RINGS}) for r, dev in enumerate(self.devices)]
        for r in range(n):
            succ, pred = (r + 1) % n, (r - 1) % n
            for ring in RINGS:
                send, recv = qps[r, ring]
                send.connect(Peer(self.devices[succ].ip, self.devices[succ].mac,
                                  qps[succ, ring][1].qpn), qps[succ, ring][1].next_psn)
                recv.connect(Peer(self.devices[pred].ip, self.devices[pred].mac,
                                  qps[pred, ring][0].qpn), qps[pred, ring][0].next_psn)
        self.spec: RingSpec = ring_spec(self.endpoints, "inc", "nr-model-inc", config)
        if isinstance(self.fabric, OneArmedFabric):      # both ways of the "inc" ring
            self.fabric.via = {bytes(map(int, d.ip.split("."))) + qp.qpn.to_bytes(3, "big")
                               for r, d in enumerate(self.devices) for qp in qps[r, "inc"]}
        status = SwitchStatus(note="the model registers no ring")
        self.slots: Optional[int] = None
        if switch:
            self.slots = DEFAULT_SLOTS if slots is None else slots
            self.register(self.spec)
            status = SwitchStatus("model", self.spec.ring_id, self.slots)
        self.comms = []
        self.store = ModelStore()               # what the store would tell every rank
        for r, dev in enumerate(self.devices):
            rendezvous = ModelRendezvous(r, n, self.store, self.turns)
            streams = {ring: Stream(ModelLink(self.turns, r, *qps[r, ring], (r + 1) % n,
                                              (r - 1) % n), config, f"rank {r}, ring {ring!r}",
                                    liveness=rendezvous.check_peers)
                       for ring in RINGS}
            self.comms.append(Communicator(
                rendezvous=rendezvous, host=ModelHost(dev, attr, self.turns, r),
                config=config, endpoints=self.endpoints, streams=streams,
                control=controls[r], switch=status,
                controller=ModelController(self) if controller and r == 0 else None,
                rings={ring: ModelRingQPs(*qps[r, ring]) for ring in RINGS},
                in_flight=in_flight))

    def register(self, spec: RingSpec) -> None:
        """Register an "inc" ring with the switch (or the two-tier fabric), `slots` slots."""
        assert self.slots is not None, "the world has no switch"
        if isinstance(self.fabric, TwoTierFabric):
            self.fabric.register(spec, self.slots)
        else:
            self.pipeline.register_ring(spec, {d.ip: r + 1 for r, d in enumerate(self.devices)},
                                        self.slots)

    def run(self, body: Callable[[Communicator], Any], backoff: bool = False) -> list[Any]:
        """body(comm) on every rank; each rank's result or exception (see the module doc).
        A transport fault's back-off takes simulated time when `backoff`, else none."""
        real_time, fault_time = flowctl.stream.time, transport_fault.time
        flowctl.stream.time = SimpleNamespace(monotonic=self.sim.monotonic)  # type: ignore
        transport_fault.time = SimpleNamespace(  # type: ignore
            monotonic=self.sim.monotonic,
            sleep=self.turns.sleep if backoff else lambda seconds: None)
        try:
            return self.turns.run([lambda c=c: body(c) for c in self.comms])
        finally:
            flowctl.stream.time, transport_fault.time = real_time, fault_time

    def rxe_counters(self) -> list[dict[str, int]]:
        return [dict(dev.counters) for dev in self.devices]

    def switch_counters(self) -> dict[str, Any]:
        """The "inc" ring's counters, as the controller reports them (also once rank 0's
        `ModelController` unregistered it; on a two-tier fabric:
        its ToRs' sums, with `racks` and each switch's own counters, `switches`)."""
        if isinstance(self.fabric, ThreeTierFabric):
            return self.fabric.ring_counters(self.spec.ring_id)
        if isinstance(self.fabric, TwoTierFabric):
            return self.fabric.target.counters()["rings"][self.spec.ring_id]
        counters = self.fabric.pipeline.counters()
        return counters.get(self.spec.ring_id) or self.unregistered[self.spec.ring_id]
