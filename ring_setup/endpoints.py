"""What ranks tell each other out of band to build their rings, and the RingSpec it yields.

Every rank publishes one `HostEndpoint` through the rendezvous and receives everyone's.
Ring invariant: in ring `name`, rank r's `send` QP is connected to rank (r+1) % n's `recv`
QP; a QP's `psn` is its own initial send PSN, so the responder's expected PSN at RTR is the
requester's `psn`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from flowctl.link import RemoteBuffer
from flowctl.plan import FlowConfig
from ring_setup.store_protocol import RendezvousError
from nr_contract.spec import Connection, RingSpec


@dataclass(frozen=True)
class QPEndpoint:
    qpn: int
    psn: int        # this QP's initial send PSN


@dataclass(frozen=True)
class RingAddress:
    """The address a ring's QPs use when it is not the host's: another IPv4 address (and
    its RoCEv2 GID) of the same device, e.g. one whose routes lead through a one-armed
    aggregator (docs/switch.md, "One-armed mode")."""

    ip: str
    mac: str
    gid: str            # RoCEv2 IPv4-mapped GID, sysfs notation


@dataclass(frozen=True)
class RingEndpoint:
    """One rank's QPs in one ring, and their address if it is not the host's."""

    send: QPEndpoint    # requester, connected to the successor's `recv`
    recv: QPEndpoint    # responder, connected to the predecessor's `send`
    addr: Optional[RingAddress] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RingEndpoint":
        addr = d.get("addr")
        return cls(QPEndpoint(**d["send"]), QPEndpoint(**d["recv"]),
                   RingAddress(**addr) if addr is not None else None)


@dataclass(frozen=True)
class HostEndpoint:
    """Everything a peer needs to connect to this rank and to address its memory."""

    rank: int
    ip: str
    mac: str
    gid: str            # RoCEv2 IPv4-mapped GID, sysfs notation
    device: str
    mtu: int            # flow-control knobs: every rank must use the same
    msg_size: int
    window: int
    control: RemoteBuffer   # the rank's control region (per-call metadata lands there)
    rings: dict[str, RingEndpoint]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HostEndpoint":
        rings = {name: RingEndpoint.from_dict(r) for name, r in d["rings"].items()}
        return cls(**{**d, "control": RemoteBuffer(**d["control"]), "rings": rings})

    def address(self, ring: str) -> RingAddress:
        """The address ring `ring`'s QPs of this rank use: the ring's own, else the host's."""
        return self.rings[ring].addr or RingAddress(self.ip, self.mac, self.gid)


def check_agreement(endpoints: list[HostEndpoint]) -> None:
    """Raise (with the same text on every rank) unless the ranks can form one ring."""
    problems = [f"rank {r} published as rank {e.rank}"
                for r, e in enumerate(endpoints) if e.rank != r]
    for knob in ("mtu", "msg_size", "window"):
        values = {getattr(e, knob) for e in endpoints}
        if len(values) > 1:
            problems.append(f"{knob} differs: " + ", ".join(
                f"rank {e.rank} {getattr(e, knob)}" for e in endpoints))
    names = {tuple(sorted(e.rings)) for e in endpoints}
    if len(names) > 1:
        problems.append("ring names differ: " + ", ".join(
            f"rank {e.rank} {sorted(e.rings)}" for e in endpoints))
    if problems:
        raise RendezvousError("ring setup: ranks disagree: " + "; ".join(problems))


def neighbours(endpoints: list[HostEndpoint], rank: int) -> tuple[HostEndpoint, HostEndpoint]:
    """(predecessor, successor) of `rank`."""
    n = len(endpoints)
    return endpoints[(rank - 1) % n], endpoints[(rank + 1) % n]


def ring_spec(endpoints: list[HostEndpoint], ring: str, ring_id: str,
              config: FlowConfig) -> RingSpec:
    """The switch's view of ring `ring`: connection r from rank r to rank r+1."""
    n = len(endpoints)
    conns = []
    for r, src_ep in enumerate(endpoints):
        dst_ep = endpoints[(r + 1) % n]
        src, dst = src_ep.address(ring), dst_ep.address(ring)
        conns.append(Connection(rank=r, src_ip=src.ip, dst_ip=dst.ip, src_mac=src.mac,
                                dst_mac=dst.mac, src_qpn=src_ep.rings[ring].send.qpn,
                                dst_qpn=dst_ep.rings[ring].recv.qpn,
                                psn0=src_ep.rings[ring].send.psn))
    return RingSpec(ring_id=ring_id, world_size=n, mtu=config.mtu, msg_size=config.msg_size,
                    window=config.window, connections=tuple(conns))
