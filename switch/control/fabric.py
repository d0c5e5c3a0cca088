"""One controller for a two-tier fabric: `FabricTarget` programs every switch on a ring's path.

A ring's ranks are placed by rack membership: rank r is in the rack of the ToR that sees its
MAC on a host port (any port but the ToR's uplink); exactly one ToR must. Each ToR holding
ranks gets the ring with its local ranks' ports (`TorControl.register_ring`), and the spine
gets the ring over those ToRs when there are two or more. A ring the fabric cannot host is
refused with the reason (a rank in no rack or in two, a switch's own refusal), and nothing
stays installed: what was installed before the refusal is removed again.

The switches are reached through `TorControl` / `SpineControl`, whose arguments are
JSON-able: `TorTarget` / `SpineTarget` are the in-process ones (the simulation, or a switch
process owning its controller); a client-backed implementation of the same two protocols
reaches switch processes of a lab.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

from nr_contract.spec import MAX_RACKS, MAX_RANKS, MAX_SLOTS, PATH_MTUS, RING_COUNTERS, RingSpec
from switch.control.target import PortOfMac, Target, normalize_mac
from switch.dataplane.packets import conn_key
from switch.dataplane.spine import SpinePipeline
from switch.dataplane.tor import TorPipeline

log = logging.getLogger(__name__)
PortCounters = Callable[[], dict[Any, dict[str, Any]]]
LostCallback = Callable[[str, str], None]


@dataclass(frozen=True)
class Placement:
    """Where a ring's ranks are: each rank's rack (ToR id) and, per ToR id, its local ranks'
    IP -> host port (a switch of the fabric is told the racks and knows its own ports)."""

    rack_of_rank: tuple[int, ...]
    local_ports: dict[int, dict[str, int]]

    @property
    def tor_ids(self) -> list[int]:
        return sorted(set(self.rack_of_rank))

    @property
    def routes(self) -> dict[int, int]:
        """Rank -> its responder's rack, for the connections between racks."""
        racks = self.rack_of_rank
        n = len(racks)
        return {r: racks[(r + 1) % n] for r in range(n) if racks[r] != racks[(r + 1) % n]}


class TorControl(Protocol):
    """What the fabric controller needs of a ToR."""

    name: str
    tor_id: int

    def register_ring(self, spec: RingSpec, slots: int, placement: Placement) -> None: ...
    def unregister_ring(self, ring_id: str) -> None: ...
    def counters(self) -> dict[str, Any]: ...
    def on_lost(self, callback: LostCallback) -> None:
        """Call `callback(ring_id, why)` when this switch turns out to have lost a ring the
        fabric installed (a restart); in-process switches never do."""
    def port_of_mac(self, mac: str) -> Optional[int]:
        """The host port of `mac` on this ToR (None: not on a host port here)."""
        ...
    def limits(self) -> dict[str, Any]:
        """What this switch can aggregate (control.proto TargetLimits' fields it sets)."""
        ...


class SpineControl(Protocol):
    """What the fabric controller needs of the spine."""

    name: str

    def register_ring(self, spec: RingSpec, slots: int, placement: Placement) -> None: ...
    def unregister_ring(self, ring_id: str) -> None: ...
    def counters(self) -> dict[str, Any]: ...
    def on_lost(self, callback: LostCallback) -> None: ...
    def limits(self) -> dict[str, Any]: ...


def software_limits() -> dict[str, Any]:
    """What the software roles aggregate: every path MTU, MAX_SLOTS slots."""
    return {"path_mtus": list(PATH_MTUS), "max_slots": MAX_SLOTS}


class TorTarget:
    """An in-process ToR: a TorPipeline and what its data plane knows of ports."""

    def __init__(self, pipeline: TorPipeline, port_of_mac: PortOfMac,
                 port_counters: PortCounters = dict):
        self.pipeline = pipeline
        self.tor_id = pipeline.config.tor_id
        self.uplink = pipeline.config.uplink
        self.name = f"tor{self.tor_id}"
        self._port_of_mac = port_of_mac
        self._port_counters = port_counters

    def register_ring(self, spec: RingSpec, slots: int, placement: Placement) -> None:
        self.pipeline.register_ring(spec, placement.local_ports[self.tor_id], slots)

    def unregister_ring(self, ring_id: str) -> None:
        self.pipeline.unregister_ring(ring_id)

    def counters(self) -> dict[str, Any]:
        return {"rings": self.pipeline.counters(), "interswitch": dict(self.pipeline.interswitch),
                "ports": {str(p): c for p, c in self._port_counters().items()},
                "uplink": self.uplink}

    def port_of_mac(self, mac: str) -> Optional[int]:
        port = self._port_of_mac(mac)
        return None if port == self.uplink else port

    def on_lost(self, callback: LostCallback) -> None:
        """In process, the ToR lives and dies with the fabric: nothing to report."""

    def limits(self) -> dict[str, Any]:
        return software_limits()


class SpineTarget:
    """An in-process spine: a SpinePipeline and its port counters."""

    name = "spine"

    def __init__(self, pipeline: SpinePipeline, port_counters: PortCounters = dict):
        self.pipeline = pipeline
        self._port_counters = port_counters

    def register_ring(self, spec: RingSpec, slots: int, placement: Placement) -> None:
        racks, n = placement.rack_of_rank, spec.world_size
        transit = {conn_key(c.src_ip, c.dst_ip, c.dst_qpn): racks[c.rank]
                   for c in spec.connections if racks[c.rank] != racks[(c.rank + 1) % n]}
        self.pipeline.register_ring(spec.ring_id, placement.tor_ids, slots, spec.mtu,
                                    placement.routes, transit)

    def unregister_ring(self, ring_id: str) -> None:
        self.pipeline.unregister_ring(ring_id)

    def counters(self) -> dict[str, Any]:
        return {"rings": self.pipeline.counters(), "interswitch": dict(self.pipeline.interswitch),
                "ports": {str(p): c for p, c in self._port_counters().items()}}

    def on_lost(self, callback: LostCallback) -> None:
        """In process, the spine lives and dies with the fabric: nothing to report."""

    def limits(self) -> dict[str, Any]:
        return software_limits()


def tier_counters(switches: dict[str, dict[str, Any]]) -> dict[str, int]:
    """One ring's counters at each of its switches (`FabricTarget.counters`' `switches`) as
    flat dotted names: a ToR's ring and ToR counters ("tor0.aggregated",
    "tor0.partials_sent"), the spine's ring counters and per-ToR outcomes ("spine.completed",
    "spine.per_tor.1.partials"). Each contribution is counted once per tier: at 0 loss, a ToR's
    `aggregated` is its rack's ranks times the ring's packets, its `partials_sent` and the
    spine's `completed` and each `per_tor.J.partials` the packets."""
    out: dict[str, int] = {}
    for name, ring in switches.items():
        out.update({f"{name}.{k}": v for k, v in ring["counters"].items()})
        out.update({f"{name}.{k}": v for k, v in (ring.get("tor") or {}).items()})
        out.update({f"{name}.per_tor.{t}.{k}": v for t, c in ring.get("per_tor", {}).items()
                    for k, v in c.items()})
    return out


class FabricTarget(Target):
    """The controller's Target for a ToR/spine fabric (see the module doc).

    Takes concurrent calls for different rings (the controller's contract, `Target`):
    `_lock` guards the map of rings and is never held across a call to a switch."""

    name = "fabric"

    def __init__(self, tors: Sequence[TorControl], spine: SpineControl):
        ids = [t.tor_id for t in tors]
        if len(set(ids)) != len(ids) or not 0 < len(ids) <= MAX_RACKS:
            raise ValueError(f"ToR ids {ids}: need 1..{MAX_RACKS} distinct")
        self.tors = {t.tor_id: t for t in tors}
        self.spine = spine
        self._rings: dict[str, tuple[RingSpec, int, Placement]] = {}
        self._reports: dict[str, str] = {}      # ring id -> which switch lost it, and why
        self.unregister_failures = 0            # switches that did not confirm a removal
        self._reports_lock = threading.Lock()
        self._lock = threading.Lock()
        for switch in [*tors, spine]:
            switch.on_lost(lambda rid, why, name=switch.name: self._report_lost(rid, name, why))

    def _report_lost(self, ring_id: str, switch: str, why: str) -> None:
        """From a switch's lease keeper (any thread): `switch` no longer holds the ring."""
        with self._reports_lock:
            self._reports.setdefault(ring_id, f"{switch} lost it (restarted?): {why}")

    def take_lost(self) -> dict[str, str]:
        """Rings some switch lost since the last call, now removed from every other switch
        too (the controller drops their leases: the job learns it at its next renewal)."""
        with self._reports_lock:
            reports, self._reports = self._reports, {}
        with self._lock:
            lost = {rid: why for rid, why in reports.items() if rid in self._rings}
        for rid, why in lost.items():
            log.warning("ring %s: %s: removing it from the whole fabric", rid, why)
            self.unregister_ring(rid)
        return lost

    def place(self, spec: RingSpec) -> Placement:
        """Each rank's rack from the ToRs' MAC tables; ValueError names a rank placed badly."""
        racks: list[int] = []
        local: dict[int, dict[str, int]] = {}
        for c in spec.connections:
            mac = normalize_mac(c.src_mac)
            seen = [(t.tor_id, port) for t in self.tors.values()
                    for port in [t.port_of_mac(mac)] if port is not None]
            if len(seen) != 1:
                where = "no rack" if not seen else f"racks {[t for t, _ in seen]}"
                raise ValueError(f"ring {spec.ring_id}: rank {c.rank} ({c.src_ip}, MAC {mac}) "
                                 f"is in {where}: not seen on exactly one ToR host port")
            tor, port = seen[0]
            racks.append(tor)
            local.setdefault(tor, {})[c.src_ip] = port
        return Placement(tuple(racks), local)

    def register_ring(self, spec: RingSpec, slots: int) -> dict[str, Any]:
        placement = self.place(spec)
        with self._lock:
            old = self._rings.get(spec.ring_id)
        if old is not None:
            if old != (spec, slots, placement):
                raise ValueError(f"ring {spec.ring_id} is already registered differently")
            return self._reply(spec, slots, placement)
        steps: list[tuple[TorControl | SpineControl, Callable[[], None]]] = [
            (self.tors[t], lambda t=t: self.tors[t].register_ring(spec, slots, placement))
            for t in placement.tor_ids]
        if len(placement.tor_ids) > 1:
            steps.append((self.spine, lambda: self.spine.register_ring(spec, slots, placement)))
        done: list[TorControl | SpineControl] = []
        for switch, install in steps:
            try:
                install()
            except ValueError as e:
                self._roll_back(spec.ring_id, done)
                raise ValueError(f"ring {spec.ring_id} refused by {switch.name}: {e}") from e
            except Exception:
                self._roll_back(spec.ring_id, done)
                raise
            done.append(switch)
        with self._lock:
            self._rings[spec.ring_id] = (spec, slots, placement)
        return self._reply(spec, slots, placement)

    @staticmethod
    def _reply(spec: RingSpec, slots: int, placement: Placement) -> dict[str, Any]:
        ports = {ip: p for ports in placement.local_ports.values() for ip, p in ports.items()}
        racks = {c.src_ip: placement.rack_of_rank[c.rank] for c in spec.connections}
        return {"ring_id": spec.ring_id, "slots": slots, "ports": ports, "racks": racks}

    @staticmethod
    def _roll_back(ring_id: str, done: Sequence[TorControl | SpineControl]) -> None:
        for switch in reversed(done):
            try:
                switch.unregister_ring(ring_id)
            except Exception:  # noqa: BLE001 - keep undoing the others; the log names it
                log.exception("ring %s: rollback on %s failed", ring_id, switch.name)

    def unregister_ring(self, ring_id: str) -> None:
        with self._lock:
            ring = self._rings.pop(ring_id, None)
        if ring is None:
            raise KeyError(f"ring {ring_id} is not registered")
        _, _, placement = ring
        switches: list[TorControl | SpineControl] = [self.tors[t] for t in placement.tor_ids]
        if len(placement.tor_ids) > 1:
            switches.append(self.spine)
        for switch in switches:      # every one, whatever the others answer: no ring left over
            try:
                switch.unregister_ring(ring_id)
            except KeyError:
                pass                 # it had lost the ring already
            except Exception as e:  # noqa: BLE001 - an unreachable switch: its lease lapses
                self.unregister_failures += 1
                log.warning("ring %s: %s did not confirm its removal (%s); no lease of it is "
                            "renewed any more, so it frees the ring when that lease lapses",
                            ring_id, switch.name, e)

    def counters(self) -> dict[str, Any]:
        """The Target shape for the whole fabric, plus the fabric's own detail.

        Per ring: the host-facing view every Target gives (its ToRs' counters summed, their
        connections by rank, next_emit of the slowest ToR) and, beside it, `racks` and each
        switch's own counters for the ring (`switches`), which also go into `counters` under
        dotted names (`tier_counters`: how each tier counted the ring's packets, through the
        API's string map to the hosts). Ports are numbered 1.. over the
        fabric, switch by switch; each says which switch and port it is in `ifname`
        ('tor0:3'; a ToR's uplink is 'tor0:uplink': the ToR-spine links are the uplinks)."""
        with self._lock:
            registered = dict(self._rings)
        per_switch = {s.name: s.counters() for s in [*self.tors.values(), self.spine]}
        rings = {}
        for rid, (spec, slots, placement) in registered.items():
            names = [self.tors[t].name for t in placement.tor_ids]
            if len(names) > 1:
                names.append(self.spine.name)
            if any(rid not in per_switch[n]["rings"] for n in names):
                continue                 # being unregistered meanwhile
            tors = [per_switch[n]["rings"][rid] for n in names[:len(placement.tor_ids)]]
            switches = {n: per_switch[n]["rings"][rid] for n in names}
            rings[rid] = {"world_size": spec.world_size, "slots": slots,
                          "next_emit": min(t["next_emit"] for t in tors),
                          "counters": {**{n: sum(t["counters"][n] for t in tors)
                                          for n in RING_COUNTERS},
                                       **tier_counters(switches)},
                          "connections": sorted((c for t in tors for c in t["connections"]),
                                                key=lambda c: c["rank"]),
                          "racks": list(placement.rack_of_rank),
                          "switches": switches}
        ports = {}
        for name, snap in per_switch.items():
            for p, c in snap["ports"].items():
                where = "uplink" if p == str(snap.get("uplink")) else p
                ports[str(len(ports) + 1)] = {**c, "ifname": f"{name}:{where}"}
        interswitch = {name: snap["interswitch"] for name, snap in per_switch.items()}
        return {"target": self.name, "rings": rings, "ports": ports, "interswitch": interswitch}

    def port_of_mac(self, mac: str) -> Optional[int]:
        """The host port of `mac` on its rack's ToR (None when no ToR has it on a host port)."""
        for t in self.tors.values():
            port = t.port_of_mac(mac)
            if port is not None:
                return port
        return None

    def limits(self) -> dict[str, Any]:
        """What the fabric can aggregate (the fields of control.proto's TargetLimits it
        sets): what every one of its switches takes (e.g. path MTU 256 only with a BMv2
        spine), ranks up to MAX_RANKS per ToR, and, when its switches state one, the fewest
        rings any of them holds (a BMv2 role's 4: a ring across racks takes a place at the
        spine and at each of its ToRs; one inside a software rack would take fewer)."""
        mtus, slots, rings = set(PATH_MTUS), MAX_SLOTS, []
        for switch in [*self.tors.values(), self.spine]:
            theirs = switch.limits()
            mtus &= set(theirs.get("path_mtus", PATH_MTUS))
            slots = min(slots, theirs.get("max_slots", MAX_SLOTS))
            rings += [theirs["max_rings"]] if "max_rings" in theirs else []
        return {"path_mtus": sorted(mtus), "max_slots": slots,
                "max_ranks": MAX_RANKS * len(self.tors), **({"max_rings": min(rings)}
                                                             if rings else {})}
