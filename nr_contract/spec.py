"""The contract between hosts and switches: the limits both sides must agree on, the names
of the counters every target reports, the ring description a host registers (`RingSpec`) and
the pace a target may publish. The Python twin of switch/p4/limits.p4; host (`netreduce`,
`flowctl`, `ring_setup`) and switch (`switch.dataplane`, `switch.control`, `nr_contract`) import
these from here and nowhere else. This module imports nothing of the project.

Invariants of a `RingSpec`: connection r goes from rank r (requester) to rank (r+1) mod n
(responder), and `connections[r].rank == r`. A ring passes `check_ring` exactly when every
target can aggregate it with the given number of slots (a target may have tighter limits of
its own, published in Ping's TargetLimits).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

# ---- RoCE and rxe facts (docs/roce.md) -------------------------------------------------
PSN_MASK = 0xFFFFFF              # PSNs and QPNs are 24-bit
PATH_MTUS = (256, 512, 1024, 2048, 4096)
# rxe_req.c (rxe_requester) stalls only when psn_compare(psn, comp.psn +
# RXE_MAX_UNACKED_PSNS) > 0, RXE_MAX_UNACKED_PSNS = 128: PSNs comp.psn .. comp.psn + 128,
# i.e. 129 of them, may be unacknowledged at once per QP.
RXE_MAX_INFLIGHT = 129

# ---- the pace a target publishes (TargetLimits.max_in_flight, .ack_timeout) ------------
# A QP's local ACK timeout is 4.096 us x 2^ack_timeout (IB spec; rxe arms its retransmit
# timer with it). 14 (67 ms) suits a switch that keeps pace with the hosts; a slower target
# asks for more in TargetLimits. 0 would mean "never retransmit": not allowed.
DEFAULT_ACK_TIMEOUT = 14
MAX_ACK_TIMEOUT = 31

# ---- aggregation limits (the software target's; limits.p4 states BMv2's) ---------------
DEFAULT_SLOTS = 256
MAX_SLOTS = 1024
MAX_RANKS = 32                   # a slot's contribution bitmap width
MAX_RACKS = 32                   # the spine's per-slot bitmap width

# ---- counters' names (Counters replies; limits.p4's NR_CTR_* in capitals) ---------------
DROPS = ("drop_wrong_port", "drop_bad_ipcsum", "drop_fragment", "drop_bad_opcode",
         "drop_bad_length", "drop_bad_icrc", "drop_overrun", "drop_mismatch", "drop_duplicate",
         "drop_stale")
OUTCOMES = ("aggregated", "retransmits_served", "empties_forwarded") + DROPS  # one per packet
RING_COUNTERS = ("aggregated", "completed", "results_sent", "retransmits_served",
                 "empties_forwarded") + DROPS
CONN_COUNTERS = ("packets", "messages", "recuts", "aggregated", "retransmits_served",
                 "empties_forwarded") + DROPS
TOR_COUNTERS = ("partials_sent", "partials_resent", "slots_skipped", "totals",
                "drop_total_unexpected", "drop_total_duplicate", "drop_total_length",
                "drop_total_headers", "drop_total_misdirected")
TRANSIT_COUNTERS = ("forwarded", "drop_wrong_port")
LANE_OUTCOMES = ("partials", "totals_resent", "drop_duplicate", "drop_mismatch",
                 "drop_overrun", "drop_stale", "drop_wrong_port")

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


def inflight_packets(spec: RingSpec) -> int:
    """W: the most packets one connection can have unacknowledged (flow-control window,
    capped by rxe's RXE_MAX_INFLIGHT)."""
    return min(spec.window_packets, RXE_MAX_INFLIGHT)


def required_slots(spec: RingSpec) -> int:
    """The smallest N the ring may use: the power of two >= 2W (W = `inflight_packets`).

    Why 2W: a rank sends k + N only once everything below k + N - (W - 1) is acknowledged,
    hence emitted; a rank still missing the result at k has sent at most up to k + W - 1,
    so next_emit <= k + W. Re-opening k's slot needs k + N <= next_emit + W - 1 <= k + 2W - 1:
    with N >= 2W no slot is re-used while some connection may still need its result.
    """
    return 1 << (2 * inflight_packets(spec) - 1).bit_length()


def check_ring(spec: RingSpec, slots: int, max_ranks: int = MAX_RANKS) -> None:
    """Raise ValueError unless the ring can be aggregated with `slots` slots."""
    rid = spec.ring_id
    if not 2 <= spec.world_size <= max_ranks:
        raise ValueError(f"ring {rid}: {spec.world_size} ranks, need 2..{max_ranks}")
    if spec.mtu not in PATH_MTUS:
        raise ValueError(f"ring {rid}: path MTU {spec.mtu} is not one of {PATH_MTUS}")
    if spec.window < 1 or spec.msg_size < 1:
        raise ValueError(f"ring {rid}: window {spec.window} x msg_size {spec.msg_size}")
    if slots & (slots - 1) or not 0 < slots <= MAX_SLOTS:
        raise ValueError(f"ring {rid}: {slots} slots, need a power of two <= {MAX_SLOTS} "
                         "(k mod N must stay continuous across the 24-bit PSN wrap)")
    if slots < required_slots(spec):
        capped = (f", capped at rxe's {RXE_MAX_INFLIGHT}"
                  if spec.window_packets > RXE_MAX_INFLIGHT else "")
        raise ValueError(f"ring {rid}: {slots} slots < 2 x {inflight_packets(spec)} packets "
                         f"in flight (window {spec.window} x "
                         f"{spec.window_packets // spec.window} packets per message{capped}): "
                         f"needs {required_slots(spec)}")
    for c in spec.connections:
        if not (0 <= c.psn0 <= PSN_MASK and 0 <= c.dst_qpn <= PSN_MASK):
            raise ValueError(f"ring {rid}: rank {c.rank}: psn0 {c.psn0} / DestQP "
                             f"{c.dst_qpn} not 24-bit")
    keys = {(c.src_ip, c.dst_ip, c.dst_qpn) for c in spec.connections}
    if len(keys) != spec.world_size:
        raise ValueError(f"ring {rid}: two connections share ⟨SrcIP, DstIP, DestQP⟩")
