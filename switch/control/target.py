"""The `Target` interface the controller programs, and the software target.

A Target is one switch data plane: it installs and removes rings, reports counters and knows
its static port map. Invariant: a Target is only ever called by `service.ControllerService`,
with a ring `nr_contract.spec.check_ring` accepts and the controller's own limits allow; a
`ValueError` from it refuses the call and changes nothing. Calls come concurrently (never two
for one ring at once): a target keeps its own state consistent, and a lock of its own is held
only across what it cannot do in parallel (one P4Runtime session of a BMv2 switch). A new
target subclasses `Target` (BMv2: `switch.control.bmv2`; the fabric's roles:
`switch.control.fabric`).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Optional

from nr_contract.spec import MAX_RANKS, MAX_SLOTS, PATH_MTUS, RingSpec
from switch.dataplane.pipeline import AggregationPipeline
from switch.dataplane.router import Router

PortOfMac = Callable[[str], Optional[int]]


def normalize_mac(mac: str) -> str:
    """'02:4E:52:0:0:1' -> '02:4e:52:00:00:01'."""
    return ":".join(f"{int(b, 16):02x}" for b in mac.split(":"))


def resolve_ports(spec: RingSpec, port_of_mac: PortOfMac) -> dict[str, int]:
    """Each rank's IP -> its port in the static port map; ValueError names who is missing."""
    ports: dict[str, int] = {}
    n = spec.world_size
    for c in spec.connections:
        for rank, ip, mac in ((c.rank, c.src_ip, c.src_mac),
                              ((c.rank + 1) % n, c.dst_ip, c.dst_mac)):
            port = port_of_mac(normalize_mac(mac))
            if port is None:
                raise ValueError(f"rank {rank} ({ip}): MAC {mac} is not in the switch's static "
                                 f"port map (start the switch with --mac {mac}=PORT)")
            if ports.setdefault(ip, port) != port:
                raise ValueError(f"rank {rank} ({ip}) is on switch ports {ports[ip]} and "
                                 f"{port} in the static port map")
    return ports


def slot_memory(world_size: int, slots: int, mtu: int) -> int:
    """Aggregator bytes a ring holds: each slot keeps every rank's payload and the sum."""
    return slots * (world_size + 1) * mtu


class Target(ABC):
    """A switch data plane the controller can program."""

    name: str

    @abstractmethod
    def register_ring(self, spec: RingSpec, slots: int) -> dict[str, Any]:
        """Install the ring; returns {"ring_id", "slots", "ports": {ip: port}}.
        ValueError: a ring this target cannot host (the message says why)."""

    @abstractmethod
    def unregister_ring(self, ring_id: str) -> None:
        """Remove the ring (KeyError if unknown)."""

    @abstractmethod
    def counters(self) -> dict[str, Any]:
        """{"target": name, "rings": {ring_id: ...}, "ports": {port: {...}}, and optionally
        "switch": {name: count}} (the shape of AggregationPipeline.counters; JSON-able)."""

    @abstractmethod
    def port_of_mac(self, mac: str) -> Optional[int]:
        """The switch port of `mac` (lowercase, colon form) in the static port map."""

    def take_lost(self) -> dict[str, str]:
        """Rings this target lost on its own since the last call (ring id -> why), already
        removed: the controller drops their leases, so each job learns it at its next
        renewal (NOT_FOUND naming why). A target that cannot lose rings returns {}."""
        return {}

    def limits(self) -> dict[str, Any]:
        """What this target can aggregate, by TargetLimits field name (path_mtus, max_slots,
        max_ranks; max_rings if the target has a capacity of its own)."""
        return {"path_mtus": list(PATH_MTUS), "max_slots": MAX_SLOTS, "max_ranks": MAX_RANKS}


class FabricSwitchTarget(Target):
    """A ToR or the spine of a two-tier fabric (docs/multirack.md): it takes rings only from
    the fabric's controller, with every rank's rack (RegisterRingRequest.racks)."""

    @abstractmethod
    def register_in_fabric(self, spec: RingSpec, slots: int, racks: tuple[int, ...]
                           ) -> dict[str, Any]:
        """As `register_ring`, `racks[r]` the ToR id of rank r's rack."""

    def register_ring(self, spec: RingSpec, slots: int) -> dict[str, Any]:
        raise ValueError(f"ring {spec.ring_id}: this switch ({self.name}) is part of a "
                         "two-tier fabric: register rings with the fabric's controller, which "
                         "sends every rank's rack")


class SoftwareTarget(Target):
    """The Python switch: an AggregationPipeline plus what its dataplane knows of ports.

    `port_of_mac` must answer from the static port map only (DataPlane.static_port_of_mac);
    `switch_counters` (DataPlane.switch_counters) become the counters' "switch" entry. In
    one-armed mode (`router`, switch/dataplane/router.py) a ring's hosts become the router's
    neighbours while it is registered, and their ports are its neighbour ports.
    """

    name = "software"

    def __init__(self, pipeline: AggregationPipeline, port_of_mac: PortOfMac,
                 port_counters: Callable[[], dict[Any, dict[str, Any]]] = dict,
                 switch_counters: Optional[Callable[[], dict[str, int]]] = None,
                 router: Optional[Router] = None):
        self.pipeline = pipeline
        self.router = router
        self._port_of_mac = router.port_of_mac if router is not None else port_of_mac
        self._port_counters = port_counters
        self._switch_counters = switch_counters

    def register_ring(self, spec: RingSpec, slots: int) -> dict[str, Any]:
        learned = self.router is not None and self.router.add_ring(spec)
        try:
            ports = resolve_ports(spec, self._port_of_mac)
            self.pipeline.register_ring(spec, ports, slots)
        except ValueError:
            if learned:
                self.router.remove_ring(spec.ring_id)
            raise
        return {"ring_id": spec.ring_id, "slots": slots, "ports": ports}

    def unregister_ring(self, ring_id: str) -> None:
        self.pipeline.unregister_ring(ring_id)
        if self.router is not None:
            self.router.remove_ring(ring_id)

    def counters(self) -> dict[str, Any]:
        out = {"target": self.name, "rings": self.pipeline.counters(),
               "ports": {str(p): c for p, c in self._port_counters().items()}}
        if self._switch_counters is not None:
            out["switch"] = self._switch_counters()
        return out

    def port_of_mac(self, mac: str) -> Optional[int]:
        return self._port_of_mac(mac)

    def describe_connection(self, key: int) -> Optional[str]:
        """'ring R rank K' of the registered connection with this `packets.conn_key`."""
        entry = self.pipeline.table.entries.get(key)
        return None if entry is None else f"ring {entry.ring_id!r} rank {entry.rank}"
