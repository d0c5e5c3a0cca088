"""The Harness (conformance.format) of the software target's two fabric roles: a TorPipeline
or a SpinePipeline, chosen by the vector's setup["role"], plus the data plane's L2
forwarding of what the pipeline hands back (static MAC table from the setup; a known
unicast MAC's port unless it is the ingress port; unknown or group destinations flood
every other port), as switch/dataplane/ports.py does.

`tor_args` / `spine_args` turn a role vector's setup (documented in conformance/roles.py)
into the pipelines' constructor and register_ring arguments, exactly those that
TorSwitch/SpineSwitch (switch/control/fabric_rpc.py) pass; the BMv2 harness
(conformance/bmv2_role_harness.py) passes the same to the BMv2 targets.

`counters()` shape, per role (ring id -> ...; rank lists in rank order):
  ToR:   {"interswitch": {"drop_corrupt", "drop_unknown_ring"},
          "rings": {rid: {"next_emit": int,
                          "counters": {RING_COUNTERS},
                          "connections": [{"rank", "counters": {CONN_COUNTERS}}]
                                         (the local requesters),
                          "tor": {TOR_COUNTERS} (None for a ring inside the rack),
                          "transit": [{"rank", "counters": {TRANSIT_COUNTERS}}]  (entering)}}}
  spine: {"interswitch": {"drop_corrupt", "drop_unknown_ring", "drop_unknown_tor",
                          "drop_spoofed_transit"},
          "rings": {rid: {"next_total": int, "completed": int, "totals_sent": int,
                          "per_tor": {str(tor id): {LANE_OUTCOMES}}}}}
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from nr_contract.spec import RingSpec
from switch.dataplane.interswitch import Endpoint
from switch.dataplane.packets import conn_key
from switch.dataplane.spine import SpineConfig, SpinePipeline
from switch.dataplane.tor import TorConfig, TorPipeline
from tests.conformance.format import ANY_PAYLOAD_LENGTH, Frames
from tests.conformance.role_model import MANY_CARRIED


def tor_args(setup: dict[str, Any]
             ) -> tuple[TorConfig, list[tuple[RingSpec, dict[str, int], int]]]:
    """TorConfig, and per ring TorPipeline.register_ring's (spec, local_ports, slots)."""
    c = setup["config"]
    config = TorConfig(c["tor_id"], c["uplink"], Endpoint(**c["me"]), Endpoint(**c["spine"]))
    return config, [(RingSpec.from_dict(r["spec"]), dict(r["local_ports"]), r["slots"])
                    for r in setup["rings"]]


def spine_args(setup: dict[str, Any]) -> tuple[SpineConfig, list[tuple[Any, ...]]]:
    """SpineConfig, and per ring SpinePipeline.register_ring's (ring_id, tor_ids, slots, mtu,
    routes, transit)."""
    c = setup["config"]
    tors = {t["tor_id"]: (t["port"], Endpoint(t["mac"], t["ip"])) for t in c["tors"]}
    config = SpineConfig(Endpoint(**c["me"]), tors)
    return config, [(r["ring_id"], list(r["tor_ids"]), r["slots"], r["mtu"],
                     {rank: tor for rank, tor in r["routes"]},
                     {conn_key(t["src_ip"], t["dst_ip"], t["dst_qpn"]): t["tor"]
                      for t in r["transit"]})
                    for r in setup["rings"]]


def tor_counters(pipeline: Any) -> dict[str, Any]:
    """The harness's counters of a ToR with TorPipeline's interface (`interswitch`,
    `counters()`): the software one or switch/control/bmv2_tor.py's."""
    rings = {}
    for rid, ring in pipeline.counters().items():
        rings[rid] = {
            "next_emit": ring["next_emit"], "counters": ring["counters"],
            "connections": sorted(({"rank": c["rank"], "counters": c["counters"]}
                                   for c in ring["connections"]), key=lambda c: c["rank"]),
            "tor": ring["tor"],
            "transit": sorted(({"rank": t["rank"], "counters": t["counters"]}
                               for t in ring["transit"]), key=lambda t: t["rank"])}
    return {"interswitch": dict(pipeline.interswitch), "rings": rings}


def spine_counters(pipeline: Any) -> dict[str, Any]:
    """The harness's counters of a spine with SpinePipeline's interface (`interswitch`,
    `counters()`): the software one or switch/control/bmv2_spine.py's."""
    return {"interswitch": dict(pipeline.interswitch),
            "rings": {rid: {"next_total": ring["next_total"],
                            "completed": ring["counters"]["completed"],
                            "totals_sent": ring["counters"]["totals_sent"],
                            "per_tor": ring["per_tor"]}
                      for rid, ring in pipeline.counters().items()}}


class RoleHarness:
    """Either role of the software target, as the setup says."""

    supports = frozenset({ANY_PAYLOAD_LENGTH, MANY_CARRIED})
    roles = frozenset({"tor", "spine"})

    def __init__(self) -> None:
        self.pipeline: TorPipeline | SpinePipeline | None = None
        self.ports: list[int] = []
        self.macs: dict[str, int] = {}

    def setup(self, vectors_setup: dict[str, Any]) -> None:
        self.ports = list(vectors_setup["ports"])
        self.macs = dict(vectors_setup["macs"])
        if vectors_setup["role"] == "tor":
            config, rings = tor_args(vectors_setup)
            tor = TorPipeline(config)
            for spec, local_ports, slots in rings:
                tor.register_ring(spec, local_ports, slots)
            self.pipeline = tor
        elif vectors_setup["role"] == "spine":
            spine_config, spine_rings = spine_args(vectors_setup)
            spine = SpinePipeline(spine_config)
            for args in spine_rings:
                spine.register_ring(*args)
            self.pipeline = spine
        else:
            raise ValueError(f"role {vectors_setup['role']!r}: not 'tor' or 'spine'")

    def send(self, in_port: int, frame: bytes,
             expect: Optional[int] = None) -> list[tuple[int, bytes]]:
        assert self.pipeline is not None, "setup first"
        out: list[tuple[int, bytes]] = []
        buf = bytearray(frame)

        def emit(port: int, parts: Sequence[bytes | memoryview]) -> None:
            out.append((port, b"".join(parts)))

        if not self.pipeline.process(memoryview(buf), in_port, emit):
            port = None if frame[0] & 1 else self.macs.get(frame[:6].hex(":"))
            ports = [p for p in self.ports if p != in_port] if port is None else \
                [port] if port != in_port else []
            out += [(p, bytes(buf)) for p in ports]
        return out

    def send_burst(self, frames: Frames,
                   expect: Optional[int] = None) -> list[tuple[int, bytes]]:
        return [out for in_port, frame in frames for out in self.send(in_port, frame)]

    def counters(self) -> dict[str, Any]:
        if isinstance(self.pipeline, TorPipeline):
            return tor_counters(self.pipeline)
        if isinstance(self.pipeline, SpinePipeline):
            return spine_counters(self.pipeline)
        return {}

    def close(self) -> None:
        self.pipeline = None
