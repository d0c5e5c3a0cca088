"""A fabric's switches as separate processes: each serves the typed control API, the fabric's
controller reaches them as its `TorControl` / `SpineControl` over `ControllerClient`.

Process side: `TorSwitch` / `SpineSwitch` are the `FabricSwitchTarget`s a ToR or spine
process (`python -m switch --role tor|spine`) serves. A registration carries every rank's
rack (RegisterRingRequest.racks); a ToR finds its own ranks' host ports in its static port
map and refuses a ring whose racks disagree with it (a rank said to be here that is not on
a host port, or one said to be elsewhere that is). Their counters travel in the proto's
string maps with dotted names ("tor.partials_sent", "interswitch.drop_corrupt",
"per_tor.1.partials"); the clients unfold them into the in-process shapes
(`TorTarget.counters`, `SpineTarget.counters`: every field `FabricTarget` reads; a ToR's
transit counters arrive summed over its entering connections, as "transit.forwarded").

Client side: `TorClient` / `SpineClient` register with the switch's default lease and renew
every ring they hold every third of it (`LeaseKeeper`) until the fabric unregisters it: a
fabric controller that dies leaves nothing installed beyond one lease.
Invariant: what the fabric believes installed is what the switches hold (a refusal is a
ValueError naming the switch's reason; FabricTarget rolls back the others).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from nr_contract.client import ControllerClient, ControllerError
from nr_contract.spec import MAX_RACKS, MAX_RANKS, RingSpec
from switch.control.fabric import Placement, SpineTarget, TorTarget, software_limits
from switch.control.target import FabricSwitchTarget, normalize_mac

log = logging.getLogger(__name__)
RENEW_FRACTION = 3                 # renew every lease / 3 (as the host library does)
STATIC_MAC_TTL = 1.0               # s a client trusts the static port map it read


def _fold(prefix: str, counts: dict[str, int]) -> dict[str, int]:
    return {f"{prefix}.{k}": v for k, v in counts.items()}


def _unfold(prefix: str, counts: dict[str, int]) -> dict[str, int]:
    p = prefix + "."
    return {k[len(p):]: v for k, v in counts.items() if k.startswith(p)}


def _limits() -> dict[str, Any]:
    return {**software_limits(), "max_ranks": MAX_RANKS * MAX_RACKS}


# -- process side ------------------------------------------------------------------------------

class TorSwitch(FabricSwitchTarget):
    """What a ToR process serves: its TorTarget, driven by racks from the fabric."""

    def __init__(self, tor: TorTarget, static_macs: dict[str, int],
                 switch_counters: Callable[[], dict[str, int]] = dict,
                 limits: Optional[dict[str, Any]] = None):
        self.tor = tor
        self.name = tor.name
        self._static = {normalize_mac(m): p for m, p in static_macs.items()
                        if p != tor.uplink}
        self._switch_counters = switch_counters
        self._limits = {**_limits(), **(limits or {})}   # a BMv2 ToR's: its program's

    def register_in_fabric(self, spec: RingSpec, slots: int, racks: tuple[int, ...]
                           ) -> dict[str, Any]:
        me = self.tor.tor_id
        local: dict[str, int] = {}
        for c in spec.connections:
            port = self.port_of_mac(normalize_mac(c.src_mac))
            if (racks[c.rank] == me) != (port is not None):
                where = f"on host port {port}" if port is not None else "on no host port"
                raise ValueError(f"ring {spec.ring_id}: rank {c.rank} ({c.src_ip}, MAC "
                                 f"{c.src_mac}) is said to be in rack {racks[c.rank]} but is "
                                 f"{where} of {self.name}")
            if port is not None:
                local[c.src_ip] = port
        self.tor.register_ring(spec, slots, Placement(racks, {me: local}))
        return {"ring_id": spec.ring_id, "slots": slots, "ports": local}

    def unregister_ring(self, ring_id: str) -> None:
        self.tor.unregister_ring(ring_id)

    def counters(self) -> dict[str, Any]:
        snap = self.tor.counters()
        rings = {}
        for rid, ring in snap["rings"].items():
            transit: dict[str, int] = {}
            for entry in ring["transit"]:
                for k, v in entry["counters"].items():
                    transit[k] = transit.get(k, 0) + v
            rings[rid] = {**ring, "counters": {**ring["counters"],
                                               **_fold("tor", ring["tor"] or {}),
                                               **_fold("transit", transit)}}
        return {"target": self.name, "rings": rings, "ports": snap["ports"],
                "switch": {**self._switch_counters(), **_fold("interswitch", snap["interswitch"]),
                           "uplink": self.tor.uplink},
                "static_macs": dict(self._static)}

    def port_of_mac(self, mac: str) -> Optional[int]:
        return self._static.get(mac)

    def limits(self) -> dict[str, Any]:
        return dict(self._limits)


class SpineSwitch(FabricSwitchTarget):
    """What the spine process serves: its SpineTarget, driven by racks from the fabric."""

    def __init__(self, spine: SpineTarget, switch_counters: Callable[[], dict[str, int]] = dict,
                 limits: Optional[dict[str, Any]] = None):
        self.spine = spine
        self.name = spine.name
        self._switch_counters = switch_counters
        self._limits = {**_limits(), **(limits or {})}   # a BMv2 spine's: its program's
        self._world: dict[str, int] = {}

    def register_in_fabric(self, spec: RingSpec, slots: int, racks: tuple[int, ...]
                           ) -> dict[str, Any]:
        self.spine.register_ring(spec, slots, Placement(racks, {}))
        self._world[spec.ring_id] = spec.world_size
        return {"ring_id": spec.ring_id, "slots": slots, "ports": {}}

    def unregister_ring(self, ring_id: str) -> None:
        self.spine.unregister_ring(ring_id)
        self._world.pop(ring_id, None)

    def counters(self) -> dict[str, Any]:
        snap = self.spine.counters()
        rings = {}
        for rid, ring in snap["rings"].items():
            per_tor = {f"per_tor.{t}.{k}": v for t, c in ring["per_tor"].items()
                       for k, v in c.items()}
            rings[rid] = {"world_size": self._world.get(rid, 0), "slots": ring["slots"],
                          "next_emit": ring["next_total"], "connections": [],
                          "counters": {**ring["counters"], **per_tor}}
        return {"target": self.name, "rings": rings, "ports": snap["ports"],
                "switch": {**self._switch_counters(), **_fold("interswitch", snap["interswitch"])}}

    def port_of_mac(self, mac: str) -> Optional[int]:
        return None

    def limits(self) -> dict[str, Any]:
        return dict(self._limits)


# -- client side -------------------------------------------------------------------------------

class LeaseKeeper:
    """Renews the leases of the rings a client holds at one switch, every lease / 3."""

    def __init__(self, client: ControllerClient, name: str):
        self._client = client
        self._name = name
        # called (ring id, why) when the switch answers a renewal NOT_FOUND: it lost the ring
        self.on_lost: Callable[[str, str], None] = lambda rid, why: None
        self._leases: dict[str, float] = {}           # ring id -> lease s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"leases-{name}", daemon=True)
        self._thread.start()

    def hold(self, ring_id: str, lease_ms: int) -> None:
        with self._lock:
            self._leases[ring_id] = lease_ms / 1000

    def release(self, ring_id: str) -> None:
        with self._lock:
            self._leases.pop(ring_id, None)

    def _run(self) -> None:
        due: dict[str, float] = {}
        while not self._stop.wait(0.2):
            now = time.monotonic()
            with self._lock:
                leases = dict(self._leases)
            for rid, lease in leases.items():
                if due.setdefault(rid, now + lease / RENEW_FRACTION) > now:
                    continue
                due[rid] = now + lease / RENEW_FRACTION
                try:
                    self._client.renew_lease(rid)
                except ControllerError as e:
                    log.error("ring %s: renewing its lease at %s failed: %s", rid, self._name, e)
                    if e.code == "NOT_FOUND":
                        self.release(rid)
                        self.on_lost(rid, e.message)
            for rid in set(due) - set(leases):
                del due[rid]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class _SwitchClient:
    """A fabric switch's control API as the fabric sees it; checks who answers at `addr`."""

    def __init__(self, name: str, addr: str, token_file: Optional[str] = None,
                 timeout: float = 10.0):
        self.name = name
        self.client = ControllerClient(addr, timeout, token_file=token_file)
        answer = self.client.ping()
        if answer["target"] != name:
            raise ValueError(f"the switch at {addr} is {answer['target']!r}, not {name!r}")
        self._limits: dict[str, Any] = answer["limits"]
        self.leases = LeaseKeeper(self.client, name)

    def register_ring(self, spec: RingSpec, slots: int, placement: Placement) -> None:
        try:
            reply = self.client.register_ring(spec, slots, racks=placement.rack_of_rank)
        except ControllerError as e:
            if e.code in ("FAILED_PRECONDITION", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"):
                raise ValueError(e.message) from None
            raise
        self.leases.hold(spec.ring_id, reply["lease_ms"])

    def on_lost(self, callback: Callable[[str, str], None]) -> None:
        self.leases.on_lost = callback

    def unregister_ring(self, ring_id: str) -> None:
        self.leases.release(ring_id)
        try:
            self.client.unregister_ring(ring_id)
        except ControllerError as e:
            if e.code == "NOT_FOUND":
                raise KeyError(f"ring {ring_id} is not registered at {self.name}") from None
            raise

    def _snapshot(self) -> dict[str, Any]:
        return self.client.counters(connections=True)

    def limits(self) -> dict[str, Any]:
        """What the switch published when the fabric connected (its Ping)."""
        return dict(self._limits)

    def close(self) -> None:
        self.leases.stop()
        self.client.close()


class TorClient(_SwitchClient):
    """TorControl of ToR `tor_id` served by a ToR process at `addr`."""

    def __init__(self, tor_id: int, addr: str, token_file: Optional[str] = None):
        self.tor_id = tor_id
        super().__init__(f"tor{tor_id}", addr, token_file)
        self._static: dict[str, int] = {}
        self._read_at = float("-inf")

    def counters(self) -> dict[str, Any]:
        snap = self._snapshot()
        rings = {rid: {**ring, "counters": {k: v for k, v in ring["counters"].items()
                                            if "." not in k},
                       "tor": _unfold("tor", ring["counters"]) or None}
                 for rid, ring in snap["rings"].items()}
        return {"rings": rings, "interswitch": _unfold("interswitch", snap["switch"]),
                "ports": snap["ports"], "uplink": snap["switch"].get("uplink")}

    def port_of_mac(self, mac: str) -> Optional[int]:
        now = time.monotonic()
        if now - self._read_at > STATIC_MAC_TTL:
            self._static = self.client.counters(connections=False)["static_macs"]
            self._read_at = now
        return self._static.get(mac)


class SpineClient(_SwitchClient):
    """SpineControl served by the spine process at `addr`."""

    def __init__(self, addr: str, token_file: Optional[str] = None):
        super().__init__("spine", addr, token_file)

    def counters(self) -> dict[str, Any]:
        snap = self._snapshot()
        rings = {}
        for rid, ring in snap["rings"].items():
            per_tor = {t: _unfold(f"per_tor.{t}", ring["counters"])
                       for t in sorted({k.split(".")[1] for k in ring["counters"]
                                        if k.startswith("per_tor.")}, key=int)}
            rings[rid] = {"tors": [int(t) for t in per_tor], "slots": ring["slots"],
                          "next_total": ring["next_emit"], "per_tor": per_tor,
                          "counters": {k: v for k, v in ring["counters"].items() if "." not in k}}
        return {"rings": rings, "interswitch": _unfold("interswitch", snap["switch"]),
                "ports": snap["ports"]}
