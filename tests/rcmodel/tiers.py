"""A two-tier fabric in the RC model: racks of model rxe hosts, a ToR per rack, one spine
(and `ThreeTierFabric`: pods of racks under pod switches, rcmodel.pod, under a top spine).

The switches are the real `TorPipeline`s and `SpinePipeline`, the ring is installed through
the real `FabricTarget` (placement from the ToRs' static MAC tables). Host r sits on a host
port of its rack's ToR (rack sizes, contiguous ranks); ToR j's uplink (port `UPLINK`) is
cabled to spine port j+1. Every switch runs switch.dataplane.ports's per-frame step (the pipeline
first, else forwarding by static MAC). Links serialise at `LINK_BPS` with `LATENCY_S`, like
`rcmodel.fabric.Fabric`; host links take `faults` by frame kind (contribution, result,
ack), the ToR–spine links take `uplink` for every frame (partials, totals, results
between racks, ACKs), from the same seeded generator: a run is reproducible.
`bytes[(a, b)]` counts the bytes put on the link from node a to node b (lost ones too).
"""
from __future__ import annotations

import random
from collections import Counter
from typing import Any, Callable, Sequence

from nr_contract.spec import RingSpec, required_slots
from switch.control.fabric import FabricTarget, SpineTarget, TorTarget
from switch.dataplane.interswitch import Endpoint
from switch.dataplane.packets import conn_key
from switch.dataplane.spine import SpineConfig, SpinePipeline
from switch.dataplane.tor import TorConfig, TorPipeline
from tests.rcmodel.fabric import LATENCY_S, LINK_BPS, FaultRates, Faults, kind_of
from tests.rcmodel.pod import PodConfig, PodPipeline
from tests.rcmodel.sim import Simulation

UPLINK = 100
SPINE = Endpoint("02:4e:53:00:00:fe", "10.78.0.254")
Node = tuple[str, int]              # ("host", rank), ("tor", j), ("spine", 0)


def tor_endpoint(j: int) -> Endpoint:
    return Endpoint(f"02:4e:53:00:00:{j + 1:02x}", f"10.78.0.{j + 1}")


class TwoTierFabric:
    """Hosts, ToRs, the spine and the links between them (see the module doc)."""

    def __init__(self, sim: Simulation, rack_sizes: Sequence[int], faults: Faults,
                 uplink: FaultRates = FaultRates()) -> None:
        self.sim, self.faults, self.uplink = sim, faults, uplink
        self._random = random.Random(faults.seed)
        self.rack = [j for j, size in enumerate(rack_sizes) for _ in range(size)]
        self._port = {r: self.rack[:r].count(self.rack[r]) + 1 for r in range(len(self.rack))}
        self.hosts: dict[int, Callable[[bytes], None]] = {}
        self.pipelines: dict[Node, TorPipeline | SpinePipeline] = {
            ("tor", j): TorPipeline(TorConfig(j, UPLINK, tor_endpoint(j), SPINE))
            for j in range(len(rack_sizes))}
        self.pipelines[("spine", 0)] = SpinePipeline(SpineConfig(
            SPINE, {j: (j + 1, tor_endpoint(j)) for j in range(len(rack_sizes))}))
        self.macs: dict[Node, dict[bytes, int]] = {node: {} for node in self.pipelines}
        self.bytes: Counter = Counter()
        self.lost: Counter = Counter()
        self._busy: dict[tuple[Node, Node], float] = {}
        self.target = FabricTarget(
            [TorTarget(self.pipelines[("tor", j)],       # type: ignore[arg-type]
                       lambda mac, j=j: self.macs[("tor", j)].get(bytes.fromhex(
                           mac.replace(":", ""))))
             for j in range(len(rack_sizes))],
            SpineTarget(self.pipelines[("spine", 0)]))   # type: ignore[arg-type]

    def attach(self, port: int, mac: str,
               receive: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """Cable host port-1 (rcmodel.world numbers hosts' ports 1..n) to its rack's ToR."""
        r = port - 1
        j, raw = self.rack[r], bytes.fromhex(mac.replace(":", ""))
        self.hosts[r] = receive
        for k in range(max(self.rack) + 1):
            self.macs[("tor", k)][raw] = self._port[r] if k == j else UPLINK
        self.macs[("spine", 0)][raw] = j + 1
        return lambda frame: self._cross(("host", r), ("tor", j), self._port[r], frame)

    def register(self, spec: RingSpec, slots: int) -> None:
        self.target.register_ring(spec, slots)

    def _neighbour(self, node: Node, port: int) -> tuple[Node, int]:
        """Who is at the other end of `node`'s `port`, and on which of its ports."""
        if node[0] == "spine":
            return ("tor", port - 1), UPLINK
        if port == UPLINK:
            return ("spine", 0), node[1] + 1
        r = next(r for r in self.hosts if self.rack[r] == node[1] and self._port[r] == port)
        return ("host", r), 0

    def _cross(self, src: Node, dst: Node, in_port: int, frame: bytes) -> None:
        self.bytes[(src, dst)] += len(frame)
        if "host" in (src[0], dst[0]):
            kind = kind_of(frame, dst[0] != "host")
            rates = self.faults.rates.get(kind, FaultRates())
            scripted = self.faults.drop is not None and self.faults.drop(kind, frame)
        else:
            rates, scripted = self.uplink, False
        rnd = self._random.random
        if rnd() < rates.loss or scripted:
            self.lost[(src, dst)] += 1
            return
        for _ in range(2 if rnd() < rates.duplicate else 1):
            start = max(self.sim.now, self._busy.get((src, dst), 0.0))
            done = start + len(frame) * 8 / LINK_BPS
            self._busy[(src, dst)] = done
            extra = rnd() * rates.delay_s if rnd() < rates.delay else 0.0
            delay = done + LATENCY_S + extra - self.sim.now
            if dst[0] == "host":
                self.sim.at(delay, self.hosts[dst[1]], frame)
            else:
                self.sim.at(delay, self._switch, dst, in_port, frame)

    def _switch(self, node: Node, in_port: int, frame: bytes) -> None:
        """switch.dataplane.ports's per-frame step: the pipeline first, else L2 forwarding."""
        out: list[tuple[int, bytes]] = []
        took = self.pipelines[node].process(memoryview(bytearray(frame)), in_port,
                                            lambda port, parts: out.append((port,
                                                                            b"".join(parts))))
        if not took:
            port = self.macs[node].get(frame[:6])
            if port is None:
                raise AssertionError(f"{node}: frame for unknown MAC {frame[:6].hex(':')}")
            if port != in_port:
                out.append((port, frame))
        for port, emitted in out:
            dst, dst_port = self._neighbour(node, port)
            self._cross(node, dst, dst_port, emitted)

    def spine_link_bytes(self) -> dict[int, tuple[int, int]]:
        """Per ToR j: (bytes up its uplink, bytes down to it)."""
        return {j: (self.bytes[(("tor", j), ("spine", 0))],
                    self.bytes[(("spine", 0), ("tor", j))])
                for j in range(max(self.rack) + 1)}


def pod_endpoint(p: int) -> Endpoint:
    return Endpoint(f"02:4e:54:00:00:{p + 1:02x}", f"10.79.0.{p + 1}")


class ThreeTierFabric(TwoTierFabric):
    """Racks of hosts, a ToR per rack, a pod switch per pod of racks (rcmodel.pod), and the
    top spine (the real `SpinePipeline`, its lanes the pods).

    `pods` gives the racks of each pod (consecutive racks). ToR j's uplink (port `UPLINK`)
    is cabled to its pod switch's port (its index in the pod) + 1; pod p's uplink (port
    `UPLINK`) to top spine port p+1. The ring is installed by hand, as a three-tier
    controller would (`register`); links, faults and byte counts as in `TwoTierFabric`
    (every link between switches takes `uplink`).
    """

    def __init__(self, sim: Simulation, rack_sizes: Sequence[int], pods: Sequence[int],
                 faults: Faults, uplink: FaultRates = FaultRates()) -> None:
        if sum(pods) != len(rack_sizes):
            raise ValueError(f"pods {list(pods)} hold {sum(pods)} racks, not "
                             f"{len(rack_sizes)}")
        self.sim, self.faults, self.uplink = sim, faults, uplink
        self._random = random.Random(faults.seed)
        self.rack = [j for j, size in enumerate(rack_sizes) for _ in range(size)]
        self._port = {r: self.rack[:r].count(self.rack[r]) + 1 for r in range(len(self.rack))}
        self.pod_of = [p for p, racks in enumerate(pods) for _ in range(racks)]   # by rack
        self._pod_port = {j: self.pod_of[:j].count(self.pod_of[j]) + 1
                          for j in range(len(rack_sizes))}
        self.hosts: dict[int, Callable[[bytes], None]] = {}
        self.pipelines: dict[Node, Any] = {
            ("tor", j): TorPipeline(TorConfig(j, UPLINK, tor_endpoint(j),
                                              pod_endpoint(self.pod_of[j])))
            for j in range(len(rack_sizes))}
        for p in range(len(pods)):
            self.pipelines[("pod", p)] = PodPipeline(PodConfig(
                p, UPLINK, pod_endpoint(p), SPINE,
                {j: (self._pod_port[j], tor_endpoint(j)) for j in range(len(rack_sizes))
                 if self.pod_of[j] == p}))
        self.pipelines[("spine", 0)] = SpinePipeline(SpineConfig(
            SPINE, {p: (p + 1, pod_endpoint(p)) for p in range(len(pods))}))
        self.macs = {node: {} for node in self.pipelines}
        self.bytes = Counter()
        self.lost = Counter()
        self._busy = {}

    def attach(self, port: int, mac: str,
               receive: Callable[[bytes], None]) -> Callable[[bytes], None]:
        r = port - 1
        j, raw = self.rack[r], bytes.fromhex(mac.replace(":", ""))
        p = self.pod_of[j]
        self.hosts[r] = receive
        for node in self.macs:
            kind, x = node
            if kind == "tor":
                self.macs[node][raw] = self._port[r] if x == j else UPLINK
            elif kind == "pod":
                self.macs[node][raw] = self._pod_port[j] if x == p else UPLINK
            else:
                self.macs[node][raw] = p + 1
        return lambda frame: self._cross(("host", r), ("tor", j), self._port[r], frame)

    def register(self, spec: RingSpec, slots: int) -> None:
        """Install the ring on every switch of its path, as a three-tier controller would."""
        n = spec.world_size
        rack = {c.src_ip: self.rack[c.rank] for c in spec.connections}
        pod = {ip: self.pod_of[j] for ip, j in rack.items()}
        window = required_slots(spec) // 2
        for j in sorted(set(rack.values())):
            local = {c.src_ip: self._port[c.rank] for c in spec.connections
                     if rack[c.src_ip] == j}
            self.pipelines[("tor", j)].register_ring(spec, local, slots)
        conns = spec.connections
        for p in sorted(set(pod.values())):
            tors = sorted({j for ip, j in rack.items() if pod[ip] == p})
            routes = {c.rank: rack[c.dst_ip] for c in conns
                      if pod[c.dst_ip] == p and rack[c.src_ip] != rack[c.dst_ip]}
            leaving = [c.rank for c in conns if pod[c.src_ip] == p and pod[c.dst_ip] != p]
            entering = [c.rank for c in conns if pod[c.src_ip] != p and pod[c.dst_ip] == p]
            self.pipelines[("pod", p)].register_ring(spec.ring_id, tors, slots, spec.mtu,
                                                     window, routes, leaving, entering)
        between = [c for c in conns if pod[c.src_ip] != pod[c.dst_ip]]
        self.pipelines[("spine", 0)].register_ring(
            spec.ring_id, sorted(set(pod.values())), slots, spec.mtu,
            {c.rank: pod[c.dst_ip] for c in between},
            {conn_key(c.src_ip, c.dst_ip, c.dst_qpn): pod[c.src_ip] for c in between})
        assert n == len(conns)

    def _neighbour(self, node: Node, port: int) -> tuple[Node, int]:
        kind, x = node
        if kind == "spine":
            return ("pod", port - 1), UPLINK
        if kind == "pod":
            if port == UPLINK:
                return ("spine", 0), x + 1
            j = next(j for j in self._pod_port if self.pod_of[j] == x
                     and self._pod_port[j] == port)
            return ("tor", j), UPLINK
        if port == UPLINK:
            return ("pod", self.pod_of[x]), self._pod_port[x]
        return super()._neighbour(node, port)

    def ring_counters(self, ring_id: str) -> dict[str, Any]:
        """The ToRs' ring counters summed (as FabricTarget reports a ring), and each
        switch's own."""
        per = {f"{kind}{x}": self.pipelines[(kind, x)].counters().get(ring_id)
               for kind, x in self.pipelines}
        total: Counter = Counter()
        for name, ring in per.items():
            if name.startswith("tor") and ring is not None:
                total.update(ring["counters"])
        return {"counters": dict(total), "switches": per}

    def uplink_bytes(self) -> dict[str, int]:
        """Bytes per direction summed over each tier's links: ToR-pod and pod-spine."""
        out: Counter = Counter()
        for (a, b), v in self.bytes.items():
            kinds = {a[0], b[0]}
            if kinds == {"tor", "pod"}:
                out["tor-pod up" if a[0] == "tor" else "tor-pod down"] += v
            elif kinds == {"pod", "spine"}:
                out["pod-spine up" if a[0] == "pod" else "pod-spine down"] += v
        return dict(out)
