"""The spine role on BMv2: switch/p4/spine.p4 programmed over P4Runtime, in the shape of the
software spine (switch/dataplane/spine.py `SpinePipeline`), so `SpineTarget`/`SpineSwitch`
(switch/control/fabric.py, fabric_rpc.py) wrap either.

A ring registration becomes, in install order: the ring's multicast group (one replica per
lane: the ToR's spine port, rid = lane, lane = position in tor_ids), one spine_lane_out
entry per lane (egress: the ToR's addresses and id, the spine's), one spine_lanes entry per
lane (ring index, ToR id -> lane, port), one spine_routes entry per connection between
racks (ring index, rank -> the responder's lane), the spine_rings entry (ring tag -> index,
epoch, N - 1, full bitmap: from here on the ring's partials match), and one spine_transit
entry per connection between racks (its key -> the requester's ToR port). Unregistering
removes them in reverse. `plan_spine_ring` computes it as plain data; the P4Runtime
plumbing (session, static MACs, flood group, epochs, rollback, port counters) is
`Bmv2Device`'s, shared with the single switch's target, the ring registry and inter-switch
counters `Bmv2RoleDevice`'s, shared with the ToR's (switch/control/bmv2_role.py).

Invariants: what is installed is what `SpinePipeline.register_ring` would accept, minus
what the program cannot hold, refused by name (more ToRs than NR_MAX_LANES, a path MTU
other than 256, more than one carried header per total, a fifth ring); counters of a
re-used ring index are relative to their values at registration. `next_total` is read from
the `ring_next` register over Thrift when a reader is given (P4Runtime cannot read
registers), else it is derived from `completed` (exact while slots complete in order).
"""
from __future__ import annotations

import socket
from collections import Counter
from typing import Any, Sequence

from nr_contract.spec import LANE_OUTCOMES, PSN_MASK
from switch.control.bmv2 import McGroup, TableEntry
from switch.control.bmv2_role import Bmv2RoleDevice, RolePlan, RoleRing
from switch.dataplane.interswitch import ring_tag
from switch.dataplane.spine import SpineConfig, check_spine_ring
from switch.p4.program import Contract

INGRESS = "NrSpineIngress"
EGRESS = "NrSpineEgress"
INTERSWITCH = ("drop_corrupt", "drop_unknown_ring", "drop_unknown_tor", "drop_spoofed_transit")


def _ip(value: int) -> str:
    return socket.inet_ntoa(value.to_bytes(4, "big"))


def transit_match(key: int) -> tuple[tuple[str, Any], ...]:
    """spine_transit's match of a `packets.conn_key` (⟨SrcIP, DstIP, DestQP⟩)."""
    return (("src_ip", _ip(key >> 56)), ("dst_ip", _ip(key >> 24 & 0xFFFFFFFF)),
            ("dest_qp", key & PSN_MASK))


def check_bmv2_spine_ring(ring_id: str, tor_ids: Sequence[int], slots: int, mtu: int,
                          routes: dict[int, int], c: Contract) -> None:
    """Raise ValueError unless the ring fits spine.p4's limits (limits.p4)."""
    if len(tor_ids) > c.max_lanes:
        raise ValueError(f"ring {ring_id}: {len(tor_ids)} ToRs, the BMv2 spine program takes "
                         f"{c.max_lanes} per ring")
    if mtu != c.max_payload:
        raise ValueError(f"ring {ring_id}: path MTU {mtu}; through the BMv2 spine a ring must "
                         f"use path MTU {c.max_payload} ({c.max_elems} int32 per packet)")
    if slots > c.slots:
        raise ValueError(f"ring {ring_id}: {slots} slots, the BMv2 spine program has {c.slots}")
    many = sorted(t for t, n in Counter(routes.values()).items() if n > 1)
    if many:
        raise ValueError(f"ring {ring_id}: the totals to ToR(s) {many} would carry more than "
                         "one RoCE header (racks not contiguous); the BMv2 spine program "
                         "carries one per message")


def plan_spine_ring(config: SpineConfig, ring_id: str, tor_ids: Sequence[int], slots: int,
                    routes: dict[int, int], transit: dict[int, int], index: int, epoch: int,
                    c: Contract) -> RolePlan:
    """The group and table entries of ring `index` (routes: rank -> responder's ToR;
    transit: conn_key -> requester's ToR)."""
    lane = {t: x for x, t in enumerate(tor_ids)}
    me = config.me
    lane_out = tuple(
        TableEntry(f"{EGRESS}.spine_lane_out", (("ring", index), ("lane", x)),
                   f"{EGRESS}.set_lane_out",
                   (("tor_mac", config.tors[t][1].mac), ("tor_ip", config.tors[t][1].ip),
                    ("tor_id", t), ("me_mac", me.mac), ("me_ip", me.ip)))
        for x, t in enumerate(tor_ids))
    lanes = tuple(
        TableEntry(f"{INGRESS}.spine_lanes", (("ring", index), ("tor", t)),
                   f"{INGRESS}.set_lane", (("lane", x), ("port", config.tors[t][0])))
        for x, t in enumerate(tor_ids))
    route_entries = tuple(
        TableEntry(f"{INGRESS}.spine_routes", (("ring", index), ("rank", rank)),
                   f"{INGRESS}.set_route", (("to_lane", lane[t]),))
        for rank, t in sorted(routes.items()))
    ring = TableEntry(f"{INGRESS}.spine_rings", (("tag", ring_tag(ring_id)),),
                      f"{INGRESS}.set_ring",
                      (("ring", index), ("epoch", epoch), ("slot_mask", slots - 1),
                       ("full", (1 << len(tor_ids)) - 1)))
    transit_entries = tuple(
        TableEntry(f"{INGRESS}.spine_transit", transit_match(key), f"{INGRESS}.set_transit",
                   (("port", config.tors[t][0]),))
        for key, t in sorted(transit.items()))
    group = McGroup(c.ring_group_base + index,
                    tuple((config.tors[t][0], x) for x, t in enumerate(tor_ids)))
    return RolePlan(group, (*lane_out, *lanes, *route_entries, ring, *transit_entries))


class Bmv2SpineTarget(Bmv2RoleDevice):
    """The spine as `SpinePipeline`'s interface over a BMv2 running spine.p4: register_ring,
    unregister_ring, counters(), `interswitch`, `config`, and `port_counters()`.

    `ports`/`macs`: as Bmv2Device (the ToRs' ports and the static MAC table);
    `read_register`: a ThriftRegisters, for next_total.
    """

    name = "bmv2-spine"
    ingress = INGRESS
    config: SpineConfig
    where = "spine"
    interswitch_counter = "spine_is_ctr"
    interswitch_names = INTERSWITCH

    def register_ring(self, ring_id: str, tor_ids: Sequence[int], slots: int, mtu: int,
                      routes: dict[int, int], transit: dict[int, int] | None = None) -> None:
        """As SpinePipeline.register_ring (idempotent if the same), within spine.p4's
        limits."""
        tors, transit = check_spine_ring(self.config, ring_id, tor_ids, slots, mtu, routes,
                                         transit)
        check_bmv2_spine_ring(ring_id, tors, slots, mtu, routes, self.c)
        args = (ring_id, tors, slots, mtu, dict(routes), transit)

        def clash(other: RoleRing) -> str | None:
            return ("a connection between racks is already another ring's"
                    if set(transit) & set(other.args[5]) else None)

        self._register(args, clash,
                       lambda index, epoch: plan_spine_ring(self.config, ring_id, tors, slots,
                                                            routes, transit, index, epoch,
                                                            self.c),
                       lambda index: self._ring_raw(index, len(tors)))

    def limits(self) -> dict[str, Any]:
        """spine.p4's: path MTU 256 only (64 int32 per partial and total), its slots, its
        rings (NR_MAX_RINGS: the fabric publishes the fewest any of its switches holds)."""
        return {"path_mtus": [self.c.max_payload], "max_slots": self.c.slots,
                "max_rings": self.c.max_rings}

    def _ring_raw(self, index: int, lanes: int) -> dict[str, Any]:
        """Raw counter values of ring `index`: {"ring": {name: n}, "lanes": [{name: n}]}."""
        c = self.c
        return {"ring": self._counts("spine_ring_ctr", {n: c.spine_counter_index(index, n)
                                                        for n in c.spine_counter_ids}),
                "lanes": [self._counts("spine_lane_ctr",
                                       {n: c.lane_counter_index(index, x, n)
                                        for n in LANE_OUTCOMES}) for x in range(lanes)]}

    def counters(self) -> dict[str, Any]:
        """SpinePipeline.counters()'s shape: per ring its ToRs, slots, next_total,
        completed, totals_sent and the lane outcomes (summed and per ToR)."""
        with self._lock:
            rings = list(self._rings.values())
        out = {}
        for ring in rings:
            ring_id, tors, slots = ring.args[:3]
            now, base = self._ring_raw(ring.index, len(tors)), ring.baseline
            counts = {n: now["ring"][n] - base["ring"][n] for n in now["ring"]}
            per_tor = {str(t): {n: lane[n] - lane0[n] for n in LANE_OUTCOMES}
                       for t, lane, lane0 in zip(tors, now["lanes"], base["lanes"])}
            out[ring_id] = {"tors": list(tors), "slots": slots,
                            "next_total": self._next(ring, counts["completed"]),
                            "counters": {"completed": counts["completed"],
                                         "totals_sent": counts["totals_sent"],
                                         **{n: sum(c[n] for c in per_tor.values())
                                            for n in LANE_OUTCOMES}},
                            "per_tor": per_tor}
        return out
