"""The ring description: who connects to whom, with which QPs and initial PSNs.

A `RingSpec` is the value object ring setup produces on every rank and hands to the switch
controller. Invariant: connection r goes from rank r (requester) to rank (r+1) mod n
(responder), and `connections[r].rank == r`.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Connection:
    """One RC connection of the ring, as the switch sees its packets."""

    rank: int        # requester rank; the responder is (rank + 1) % world_size
    src_ip: str
    dst_ip: str
    src_mac: str
    dst_mac: str
    src_qpn: int
    dst_qpn: int     # DestQP in the BTH of the requester's packets
    psn0: int        # the requester's initial send PSN (= responder's expected PSN at RTR)


@dataclass(frozen=True)
class RingSpec:
    ring_id: str
    world_size: int
    mtu: int         # RoCE path MTU in bytes (256..4096)
    msg_size: int    # flow-control message size in bytes (a multiple of mtu)
    window: int      # flow-control window in messages
    connections: tuple[Connection, ...]

    def __post_init__(self) -> None:
        if len(self.connections) != self.world_size:
            raise ValueError(f"ring {self.ring_id}: {len(self.connections)} connections for "
                             f"{self.world_size} ranks")
        for r, c in enumerate(self.connections):
            if c.rank != r:
                raise ValueError(f"ring {self.ring_id}: connection {r} claims rank {c.rank}")

    @property
    def window_packets(self) -> int:
        """Most packets one connection can have unacknowledged under flow control."""
        return self.window * -(-self.msg_size // self.mtu)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RingSpec":
        conns = tuple(Connection(**c) for c in d["connections"])
        return cls(**{**d, "connections": conns})

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, s: str) -> "RingSpec":
        return cls.from_dict(json.loads(s))
