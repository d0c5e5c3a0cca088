"""The ToR role on BMv2: switch/p4/tor.p4 programmed over P4Runtime, in the shape of the
software ToR (switch/dataplane/tor.py `TorPipeline`), so `TorTarget`/`TorSwitch`
(switch/control/fabric.py, fabric_rpc.py) can wrap either.

Lanes are RackPool's (`check_tor_ring`): the rack's requesters in ring order, then the
connection entering the rack. A ring registration becomes, in install order: the ring's
multicast group (one replica per lane whose responder is in the rack, rid = lane, on the
responder's port; the continuation; the partial resent for next_emit and the partial of a
packet's k, both on the uplink; with an entering connection its transit copy, on its
responder's port), the ring_table entry (epoch, N - 1, the local lanes' bitmap, 2W, the ToR's
and the spine's addresses, the leaving and entering lanes), one replica_table entry per lane
(egress: addresses, DestQP, psn0 of its result), the tor_tags entry (ring tag -> index: from
here on the ring's totals match), one conn_table entry per local requester (rank = lane) and
one tor_transit entry for the entering connection. Unregistering removes them in reverse.
`plan_tor_ring` computes it as plain data; the P4Runtime plumbing is `Bmv2Device`'s and the
ring registry `Bmv2RoleDevice`'s (shared with the spine's target).

Invariants: what is installed is what `TorPipeline.register_ring` would accept, minus what
the program cannot hold, refused by name (a path MTU other than 256, more than one leaving or
entering connection per rack: racks not contiguous, as the spine's "many_carried"; a ring
inside one rack: the single-switch program's; a fifth ring); counters of a re-used ring
index are relative to their values at registration; next_emit and slots_skipped are read
from registers over Thrift when a reader is given (P4Runtime cannot read registers), else
next_emit is derived from `completed` and slots_skipped is 0.
"""
from __future__ import annotations

from typing import Any

from nr_contract.spec import (DEFAULT_SLOTS, MAX_RACKS, MAX_RANKS, TOR_COUNTERS,
                             TRANSIT_COUNTERS, RingSpec, check_ring, required_slots)
from switch.control.bmv2 import McGroup, TableEntry
from switch.control.bmv2_role import Bmv2RoleDevice, RolePlan, RoleRing
from switch.dataplane.interswitch import ring_tag
from switch.dataplane.packets import conn_key
from switch.dataplane.tor import RackLanes, TorConfig, check_tor_ring
from switch.p4.program import Contract

INGRESS = "NrTorIngress"
EGRESS = "NrTorEgress.results"      # the single switch's egress, inside the ToR's
INTERSWITCH = ("drop_corrupt", "drop_unknown_ring")
MANY_CARRIED = "many_carried"


def check_bmv2_tor_ring(config: TorConfig, spec: RingSpec, lanes: RackLanes, slots: int,
                        c: Contract) -> None:
    """Raise ValueError unless the ring fits tor.p4's limits (limits.p4)."""
    rid = spec.ring_id
    if spec.mtu != c.max_payload:
        raise ValueError(f"ring {rid}: path MTU {spec.mtu}; through the BMv2 ToR a ring must "
                         f"use path MTU {c.max_payload} ({c.max_elems} int32 per packet)")
    if slots > c.slots:
        raise ValueError(f"ring {rid}: {slots} slots, the BMv2 ToR program has {c.slots}")
    if len(lanes.local) == spec.world_size:
        raise ValueError(f"ring {rid}: every rank is in rack {config.tor_id}; the BMv2 ToR "
                         "program aggregates rings that span racks (a ring inside one rack "
                         "is the single-switch program's)")
    if len(lanes.leaving) > 1 or len(lanes.entering) > 1:
        raise ValueError(f"ring {rid}: {len(lanes.leaving)} connections leave and "
                         f"{len(lanes.entering)} enter rack {config.tor_id} (racks not "
                         f"contiguous: {MANY_CARRIED}); the BMv2 ToR program carries one "
                         "RoCE header per partial and per total")


def plan_tor_ring(config: TorConfig, spec: RingSpec, local_ports: dict[str, int],
                  lanes: RackLanes, slots: int, index: int, epoch: int,
                  c: Contract) -> RolePlan:
    """The group and table entries of ring `index` at this ToR (local_ports: the rack's
    ranks' IPs -> host ports; every other rank is behind the uplink)."""
    def port(ip: str) -> int:
        return local_ports.get(ip, config.uplink)

    conns = lanes.local + lanes.entering
    leave = lanes.leaving[0] if lanes.leaving else None
    enter = lanes.entering[0] if lanes.entering else None
    ring = TableEntry(f"{INGRESS}.ring_table", (("ring", index),), f"{INGRESS}.set_ring", (
        ("epoch", epoch), ("slot_mask", slots - 1), ("full", (1 << len(lanes.local)) - 1),
        ("w2", required_slots(spec)), ("tor_id", config.tor_id), ("uplink", config.uplink),
        ("tag", ring_tag(spec.ring_id)), ("me_mac", config.me.mac), ("me_ip", config.me.ip),
        ("spine_mac", config.spine.mac), ("spine_ip", config.spine.ip),
        ("has_leave", int(leave is not None)),
        ("leave_lane", conns.index(leave) if leave else 0),
        ("leave_rank", leave.rank if leave else 0),
        ("has_enter", int(enter is not None)),
        ("enter_lane", conns.index(enter) if enter else 0),
        ("enter_rank", enter.rank if enter else 0)))
    replicas = tuple(
        TableEntry(f"{EGRESS}.replica_table", (("ring", index), ("rank", lane)),
                   f"{EGRESS}.set_replica",
                   (("src_ip", x.src_ip), ("dst_ip", x.dst_ip), ("dest_qp", x.dst_qpn),
                    ("psn0", x.psn0)))
        for lane, x in enumerate(conns))
    tag = TableEntry(f"{INGRESS}.tor_tags", (("tag", ring_tag(spec.ring_id)),),
                     f"{INGRESS}.set_tag", (("ring", index),))
    conn_entries = tuple(
        TableEntry(f"{INGRESS}.conn_table",
                   (("src_ip", x.src_ip), ("dst_ip", x.dst_ip), ("dest_qp", x.dst_qpn)),
                   f"{INGRESS}.set_conn",
                   (("ring", index), ("rank", lane), ("psn0", x.psn0),
                    ("in_port", port(x.src_ip)), ("out_port", port(x.dst_ip))))
        for lane, x in enumerate(lanes.local))
    transit = tuple(
        TableEntry(f"{INGRESS}.tor_transit",
                   (("src_ip", x.src_ip), ("dst_ip", x.dst_ip), ("dest_qp", x.dst_qpn)),
                   f"{INGRESS}.set_transit",
                   (("ring", index), ("psn0", x.psn0), ("out_port", port(x.dst_ip))))
        for x in lanes.entering)
    results = tuple((port(x.dst_ip), lane) for lane, x in enumerate(conns)
                    if x.dst_ip in local_ports)
    group = McGroup(c.ring_group_base + index,
                    results + ((config.uplink, c.cont_rid), (config.uplink, c.part_a_rid),
                               (config.uplink, c.part_b_rid))
                    + tuple((port(x.dst_ip), c.fwd_rid) for x in lanes.entering))
    return RolePlan(group, (ring, *replicas, tag, *conn_entries, *transit))


class Bmv2TorTarget(Bmv2RoleDevice):
    """A ToR as `TorPipeline`'s interface over a BMv2 running tor.p4: register_ring,
    unregister_ring, counters(), `interswitch`, `config`, and `port_counters()`.

    `ports`/`macs`: as Bmv2Device (the rack's host ports and the uplink, the static MAC
    table); `read_register`: a ThriftRegisters, for next_emit and slots_skipped.
    """

    name = "bmv2-tor"
    ingress = INGRESS
    config: TorConfig
    where = "ToR"
    interswitch_counter = "tor_is_ctr"
    interswitch_names = INTERSWITCH

    def register_ring(self, spec: RingSpec, local_ports: dict[str, int],
                      slots: int = DEFAULT_SLOTS) -> None:
        """As TorPipeline.register_ring (idempotent if the same), within tor.p4's limits."""
        check_ring(spec, slots, MAX_RANKS * MAX_RACKS)
        lanes = check_tor_ring(self.config, spec, local_ports)
        check_bmv2_tor_ring(self.config, spec, lanes, slots, self.c)
        args = (spec.ring_id, spec, dict(local_ports), slots, lanes)
        mine = {conn_key(x.src_ip, x.dst_ip, x.dst_qpn): x.rank
                for x in lanes.local + lanes.entering}

        def clash(other: RoleRing) -> str | None:
            theirs = other.args[4].local + other.args[4].entering
            taken = [mine[k] for k in (conn_key(x.src_ip, x.dst_ip, x.dst_qpn) for x in theirs)
                     if k in mine]
            return (f"connection of rank {taken[0]} is already registered by ring "
                    f"{other.args[0]}" if taken else None)

        self._register(args, clash,
                       lambda index, epoch: plan_tor_ring(self.config, spec, local_ports,
                                                          lanes, slots, index, epoch, self.c),
                       lambda index: self._tor_raw(index, len(lanes.local)))

    def limits(self) -> dict[str, Any]:
        """tor.p4's: path MTU 256 only (64 int32 per packet), its slots, its rings."""
        return {"path_mtus": [self.c.max_payload], "max_slots": self.c.slots,
                "max_rings": self.c.max_rings}

    def _tor_raw(self, index: int, local: int) -> dict[str, Any]:
        """Raw counter values of ring `index`: the single switch's ring and connection
        counters (Bmv2Device._ring_counts), "tor" and "transit" (of its entering one)."""
        c = self.c
        return {**self._ring_counts(index, local),
                "tor": self._counts("tor_ctr", {n: c.tor_counter_index(index, n)
                                                for n in c.tor_counter_ids}),
                "transit": self._counts("tor_transit_ctr",
                                        {n: c.transit_counter_index(index, n)
                                         for n in TRANSIT_COUNTERS})}

    def counters(self) -> dict[str, Any]:
        """TorPipeline.counters()'s shape: per ring its size, slots, next_emit, counters, the
        local requesters' connections, the ToR counters and the entering one's transit."""
        with self._lock:
            rings = list(self._rings.values())
        out = {}
        for ring in rings:
            ring_id, spec, local_ports, slots, lanes = ring.args
            now, base = self._tor_raw(ring.index, len(lanes.local)), ring.baseline
            counts = {n: v - base["ring"][n] for n, v in now["ring"].items()}
            port = {ip: local_ports.get(ip, self.config.uplink) for ip in
                    {x.src_ip for x in spec.connections}}
            conns = [self._connection_view(x, ring.index, lane, port[x.src_ip],
                                           port[x.dst_ip], cnow, cbase)
                     for lane, (x, cnow, cbase)
                     in enumerate(zip(lanes.local, now["conns"], base["conns"]))]
            tor = {n: now["tor"][n] - base["tor"][n] for n in now["tor"]}
            tor["slots_skipped"] = self._ring_register("tor_skipped", ring) or 0
            transit = [{"rank": x.rank, "out_port": port[x.dst_ip],
                        "counters": {n: now["transit"][n] - base["transit"][n]
                                     for n in TRANSIT_COUNTERS}} for x in lanes.entering]
            out[ring_id] = {"world_size": spec.world_size, "slots": slots,
                            "next_emit": self._next(ring, counts["completed"]),
                            "counters": counts, "connections": conns,
                            "tor": {n: tor[n] for n in TOR_COUNTERS}, "transit": transit}
        return out
