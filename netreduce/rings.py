"""This rank's two rings of RC QPs to the same neighbours, and the streams over them.

"ring" carries the host algorithms (and the per-call metadata while no switch aggregates);
"inc" is dedicated to in-network aggregation: on it every rank posts the identical message
sequence (netreduce/algorithms/switch.py). Both are built alike (`connect_rings`) and "inc"
is built again when the switch returns after it went away (`connect_ring`,
netreduce/away.py). Invariant (ring_setup/endpoints.py): in each ring rank r's send QP is
connected to rank (r+1) % n's recv QP, and a stream's receives land in the rank's control
region, so no rank sends to a QP that is not yet ready to receive (`connect_rings` waits
for every rank before it returns).
"""
from __future__ import annotations

import hashlib
import hmac
from typing import Callable, Protocol

from flowctl.link import Link, LocalBuffer
from flowctl.plan import FlowConfig
from flowctl.stream import Stream
from netreduce.workspace import RegisteredMemory
from nr_contract.spec import RingSpec
from ring_setup.endpoints import (HostEndpoint, RingEndpoint, check_agreement, neighbours,
                                  ring_spec)
from ring_setup.rendezvous import Rendezvous

RINGS = ("ring", "inc")
INC_ADDR_ENV = "NR_INC_ADDR"    # the "inc" ring's own address (netreduce.connect.create's inc_addr)


class RingQPsLike(Protocol):
    """This rank's QPs in one ring (ring_setup.verbs.host.RingQPs)."""

    def local(self) -> RingEndpoint: ...
    def connect(self, predecessor: HostEndpoint, successor: HostEndpoint) -> None: ...
    def link(self, recv_sge: LocalBuffer, successor: int, predecessor: int) -> Link: ...
    def to_error(self) -> None: ...
    def close(self) -> None: ...


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


def connect_ring(qps: RingQPsLike, name: str, config: FlowConfig,
                 endpoints: list[HostEndpoint], rank: int, control: RegisteredMemory,
                 liveness: Callable[[], None]) -> Stream:
    """Connect this rank's `qps` of ring `name` to its neighbours in `endpoints` (RTR, RTS)
    and return the ring's stream, whose receives land in `control` and whose waits check
    `liveness`."""
    predecessor, successor = neighbours(endpoints, rank)
    qps.connect(predecessor, successor)
    link = qps.link(control.local(), successor.rank, predecessor.rank)
    return Stream(link, config, f"rank {rank}, ring {name!r}", liveness=liveness)


def connect_rings(rendezvous: Rendezvous, host: Host, configs: dict[str, FlowConfig],
                  control: RegisteredMemory
                  ) -> tuple[list[HostEndpoint], dict[str, Stream], dict[str, RingQPsLike]]:
    """Collective: create this rank's QPs of every ring of `RINGS` (INIT) with its config
    of `configs`, exchange every rank's endpoints through the rendezvous, connect (RTR,
    RTS), post receives into `control`, and wait until every rank is ready. Returns every
    rank's endpoints (by rank), this rank's streams and QPs (by ring)."""
    rank, config = rendezvous.rank, configs["ring"]
    rings = {name: host.create_ring(name, configs[name]) for name in RINGS}
    me = HostEndpoint(rank=rank, ip=host.ip, mac=host.mac, gid=host.gid,
                      device=host.device, mtu=config.mtu,
                      msg_size=config.msg_size, window=config.window,
                      control=control.remote(),
                      rings={name: qps.local() for name, qps in rings.items()})
    endpoints = [HostEndpoint.from_dict(d)
                 for d in rendezvous.all_gather("endpoint", me.to_dict())]
    check_agreement(endpoints)
    streams = {name: connect_ring(qps, name, configs[name], endpoints, rank, control,
                                  rendezvous.check_peers)
               for name, qps in rings.items()}
    rendezvous.barrier("ready")
    return endpoints, streams, rings


def inc_ring_spec(endpoints: list[HostEndpoint], config: FlowConfig,
                  job_key: bytes) -> RingSpec:
    """The "inc" ring's RingSpec; its id names rank 0's address and "inc" send QPN, and ends
    in 8 hex digits derived from the job's key (`Rendezvous.job_key`): the same on every
    rank, and no other tenant can predict it to register it first (and so have this job
    refused)."""
    first = endpoints[0]
    qpn = first.rings["inc"].send.qpn
    tag = hmac.new(job_key, f"ring-id|{first.ip}|{qpn}".encode(), hashlib.sha256).hexdigest()
    return ring_spec(endpoints, "inc", f"nr-{first.ip}-{qpn}-{tag[:8]}", config)
