"""What the models of a two-tier fabric's roles share (docs/multirack.md), and how a
vector is written with one: the ring and its racks, each rank's packet at k (scapy-built by
`write_frame`, its payload seeded, sums made to wrap), L2 forwarding, the roles' constants
(the ToRs' uplink port, the spine's endpoint, the inter-switch drops), and `role`, which
makes a scenario function a vector. Like the models (tests/conformance/tor_model.py,
spine_model.py), written from docs/multirack.md's rules, never from switch/dataplane."""
from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
from scapy.compat import raw
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from nr_contract.spec import Connection, RingSpec
from switch.dataplane.interswitch import Endpoint, ring_tag
from tests.conformance.format import Step, Vector
from tests.conformance.vectors import BROADCAST, MTU
from tests.roce_layers import (WRITE_FIRST, WRITE_LAST, WRITE_LAST_IMM, WRITE_MIDDLE, WRITE_ONLY,
                               WRITE_ONLY_IMM, make_ring, write_frame)


MANY_CARRIED = "many_carried"     # a partial or total carries more than one RoCE header


UPLINK = 100                      # every ToR's uplink port (the lab's)


SPINE = Endpoint("02:4e:53:00:00:fe", "10.78.0.254")


PSN_HALF = 1 << 23


FAR_AHEAD = 1 << 22


HALF_AHEAD = 0x800000             # a relative PSN this far from next_emit is behind it


TOR_INTERSWITCH = ("drop_corrupt", "drop_unknown_ring")


SPINE_INTERSWITCH = ("drop_corrupt", "drop_unknown_ring", "drop_unknown_tor",
                     "drop_spoofed_transit")


# RoCE header bytes after the BTH, per WRITE opcode (RETH 16, ImmDt 4)
EXT = {WRITE_FIRST: 16, WRITE_MIDDLE: 0, WRITE_LAST: 0, WRITE_LAST_IMM: 4, WRITE_ONLY: 16,
       WRITE_ONLY_IMM: 20}


def tor_endpoint(j: int) -> Endpoint:
    return Endpoint(f"02:4e:53:00:00:{j + 1:02x}", f"10.78.0.{j + 1}")


def endpoint_dict(e: Endpoint) -> dict[str, str]:
    return {"mac": e.mac, "ip": e.ip}


def header_of(frame: bytes, plen: int) -> bytes:
    """The RoCE header (Ethernet up to the payload) of a WRITE frame, UDP checksum 0 (as a
    switch keeps it)."""
    head = bytearray(frame[:len(frame) - plen - 4])
    head[40:42] = bytes(2)
    return bytes(head)


def wire(data: np.ndarray) -> bytes:
    return data.astype("<i4").tobytes()


def l2_out(macs: dict[str, int], ports: Sequence[int], frame: bytes, in_port: int
           ) -> list[int]:
    """The data plane's L2 forwarding: a known unicast MAC's port (nothing if that is the
    port it came in by), else every other port."""
    dst = Ether(frame).dst
    if dst in macs and not int(dst[:2], 16) & 1:
        return [macs[dst]] if macs[dst] != in_port else []
    return [p for p in ports if p != in_port]


def ack(c: Connection) -> bytes:
    """The responder's ACK on connection c (to its requester)."""
    return raw(Ether(src=c.dst_mac, dst=c.src_mac) / IP(src=c.dst_ip, dst=c.src_ip)
               / UDP(sport=0xC001, dport=4791, chksum=0)
               / BTH(opcode=0x11, dqpn=c.src_qpn, psn=c.psn0) / AETH(syndrome=0x1F))


def arp_request(c: Connection) -> bytes:
    """The requester's broadcast ARP request for its responder."""
    return raw(Ether(src=c.src_mac, dst=BROADCAST) / ARP(psrc=c.src_ip, pdst=c.dst_ip))


@dataclass
class Held:
    """A counted contribution (or a header carried for a remote rank): what builds results."""

    opcode: int
    data: np.ndarray
    kw: dict[str, Any]
    header: bytes
    raw: bytes           # the payload as sent (data's bytes, unless a bad length)


class RoleModel:
    """What both roles' models share: the ring, its racks, each rank's packet at k."""

    def __init__(self, name: str, description: str, racks: Sequence[int], slots: int,
                 spec: Optional[RingSpec], requires: Sequence[str]):
        self.name, self.description = name, description
        self.requires = frozenset(requires)
        self.spec = spec or make_ring(len(racks), msg_size=MTU, window=2)
        self.racks = list(racks)
        self.n = len(racks)
        self.N = slots
        self.tag = ring_tag(self.spec.ring_id)
        self.steps: list[Step] = []
        self.plan: dict[int, tuple[int, dict[str, Any]]] = {}     # k -> opcode, kw of all ranks
        self.setup: dict[str, Any] = {}

    def first_refusal(self, msg: Any, corrupt: bool) -> str:
        """The refusal every role makes before its own checks ('' if none): a frame mangled
        so decode refuses it, or one of another ring."""
        if corrupt:
            return "drop_corrupt"
        if msg.ring != self.tag:
            return "drop_unknown_ring"
        return ""

    def record(self, outcome: str, expect: str, counters: dict[str, int], port: int,
               frame: bytes, out: list[tuple[int, bytes]], note: str) -> None:
        """Count the model's outcome (it must be `expect`, when given) and keep the step."""
        assert not expect or expect == outcome, f"{self.name}: {expect} != model's {outcome}"
        counters[outcome] += 1
        self.steps.append(Step(port, frame, tuple(out), note))

    def op(self, k: int, opcode: int, **kw: Any) -> None:
        """Every rank's packet at k has this opcode and these write_frame arguments."""
        self.plan[k] = (opcode, kw)

    def rack(self, j: int) -> list[int]:
        return [r for r in range(self.n) if self.racks[r] == j]

    def leaving(self, j: int) -> list[int]:
        return [r for r in self.rack(j) if self.racks[(r + 1) % self.n] != j]

    def entering(self, j: int) -> list[int]:
        return [r for r in range(self.n)
                if self.racks[r] != j and self.racks[(r + 1) % self.n] == j]

    def payload(self, rank: int, k: int) -> np.ndarray:
        seed = [zlib.crc32(self.spec.ring_id.encode()), rank, k]
        data = np.random.default_rng(seed).integers(-2**31, 2**31, MTU // 4, dtype=np.int32)
        data[:2] = (2**31 - 1, -2**31)                   # sums must wrap
        return data

    def packet(self, rank: int, k: int, data: Optional[np.ndarray | bytes] = None,
               **override: Any) -> Held:
        """Rank's packet at k (the plan, `override` on top: `op=`, write_frame kwargs)."""
        opcode, kw = self.plan.get(k, (WRITE_ONLY, {}))
        opcode = override.pop("op", opcode)
        kw = {"ip_id": (rank << 8 | k) & 0xFFFF, **kw, **override}
        data = self.payload(rank, k) if data is None else data
        raw_data = data if isinstance(data, bytes) else wire(data)
        frame = write_frame(self.spec.connections[rank], k, opcode, raw_data, **kw)
        return Held(opcode, np.frombuffer(raw_data[:len(raw_data) & ~3], "<i4").astype(np.int32),
                    kw, header_of(frame, len(raw_data)), raw_data)

    def frame(self, rank: int, k: int, p: Held, data: Optional[np.ndarray] = None,
              psn: Optional[int] = None) -> bytes:
        """Rank's packet p at k with payload `data` (default: its own) and PSN `psn`
        (default: its own)."""
        kw = p.kw if psn is None else {**p.kw, "psn": psn}
        return write_frame(self.spec.connections[rank], k, p.opcode,
                           p.raw if data is None else data, **kw)

    def forward(self, frame: bytes, in_port: int, note: str) -> None:
        """A frame the role does not own: L2 forwarding, byte for byte."""
        outs = l2_out(self.setup["macs"], self.setup["ports"], frame, in_port)
        self.steps.append(Step(in_port, frame, tuple((p, frame) for p in outs),
                               f"forwarded: {note}"))

    def vector(self) -> Vector:
        return Vector(self.name, self.description, self.setup, tuple(self.steps),
                      self.counters(), self.requires)

    def counters(self) -> dict[str, Any]:
        raise NotImplementedError


def role(model: Callable[..., RoleModel], description: str, **setup: Any
         ) -> Callable[[Callable[[Any], None]], Callable[[], Vector]]:
    """A scenario: the function (its name, the vector's) drives a `model` built with
    `description` and `setup`; calling the result gives the vector."""
    def wrap(steps: Callable[[Any], None]) -> Callable[[], Vector]:
        @functools.wraps(steps)
        def make() -> Vector:
            s = model(steps.__name__, description, **setup)
            steps(s)
            return s.vector()
        return make
    return wrap
