"""The lab's wiring in the model: host I on switch port I+1, links with faults, the switch.

The switch is the real `switch.dataplane.pipeline.AggregationPipeline`: every frame reaching it is
offered to `process` (as switch.dataplane.ports does); what it emits leaves on the port it names,
what it does not take is forwarded by destination MAC. Frames cross two links (host ->
switch, switch -> host); each crossing may lose, duplicate or delay (reorder) the frame
according to `Faults`, drawn from one seeded random generator, so a run is reproducible.

Frame kinds, for faults and counts: "contribution" (a request from a host to the switch),
"result" (a request from the switch to a host: an aggregated result, a served
retransmission, or a forwarded one of an unregistered ring), "ack" (ACK/NAK, either link).
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from switch.dataplane.packets import BTH_OFF, Op
from switch.dataplane.pipeline import AggregationPipeline
from tests.rcmodel.sim import Simulation

KINDS = ("contribution", "result", "ack")
LINK_BPS = 10e9                 # serialisation rate of every link
LATENCY_S = 5e-6                # propagation + switching per link
AGG = -1                        # a one-armed aggregator's link, in Fabric._busy's keys


@dataclass(frozen=True)
class FaultRates:
    """Per crossing of one link: P(lost), P(duplicated), P(delayed by up to `delay_s`)."""

    loss: float = 0.0
    duplicate: float = 0.0
    delay: float = 0.0
    delay_s: float = 200e-6


@dataclass(frozen=True)
class Faults:
    """Fault rates by frame kind, the generator's seed, and an optional script:
    `drop(kind, frame)` -> True loses that frame (on top of the rates)."""

    rates: Mapping[str, FaultRates] = field(default_factory=dict)
    seed: int = 0
    drop: Optional[Callable[[str, bytes], bool]] = None

    @classmethod
    def everywhere(cls, loss: float = 0.0, duplicate: float = 0.0, delay: float = 0.0,
                   seed: int = 0) -> "Faults":
        rates = FaultRates(loss, duplicate, delay)
        return cls({kind: rates for kind in KINDS}, seed)


def kind_of(frame: bytes, to_switch: bool) -> str:
    if frame[BTH_OFF] == Op.ACKNOWLEDGE:
        return "ack"
    return "contribution" if to_switch else "result"


class Fabric:
    """Links, faults and the switch; `counts[kind]` counts frames put on a link,
    `lost[kind]` those the faults dropped."""

    def __init__(self, sim: Simulation, pipeline: AggregationPipeline, faults: Faults) -> None:
        self.sim = sim
        self.pipeline = pipeline
        self.faults = faults
        self._random = random.Random(faults.seed)
        self.hosts: dict[int, Callable[[bytes], None]] = {}   # port -> host's receive
        self.macs: dict[bytes, int] = {}                      # MAC -> port
        self._busy: dict[tuple[int, bool], float] = {}        # (port, to_switch) -> free at
        self.counts: Counter = Counter()
        self.lost: Counter = Counter()
        self.down_until = -1.0          # the switch drops every frame until then
        self.restarts = 0
        self._die_after: Optional[tuple[int, float]] = None   # (results, down_for)
        self._emitted = 0
        self._die_in_slot: Optional[tuple[int, int, float]] = None

    def restart_switch(self, at: Optional[float] = None, down_for: float = 0.0,
                       after_results: Optional[int] = None,
                       in_slot: Optional[tuple[int, int]] = None) -> None:
        """The switch process dies at simulated time `at`; or right after it emitted its
        `after_results`-th frame; or (`in_slot` = (s, j)) while it emits the results of
        the s-th slot it completes, after j of them. Frames it emitted in the same step
        after that are lost (a switch that dies while it sends a slot's results). Its
        pipeline state is lost, it drops every frame for `down_for` s, then a fresh
        pipeline (no ring registered) forwards everything by MAC, unaggregated, like a
        restarted switch."""
        if after_results is not None:
            self._die_after = (after_results, down_for)
        if in_slot is not None:
            self._die_in_slot = (*in_slot, down_for)
        if at is not None:
            self.sim.at(max(0.0, at - self.sim.now), self._restart, down_for)

    def _completed(self) -> int:
        """Slots the switch completed so far (all rings)."""
        return sum(ring.pool.completed for ring in self.pipeline._rings.values())

    def _restart(self, down_for: float) -> None:
        self.pipeline = AggregationPipeline()
        self.down_until = self.sim.now + down_for
        self.restarts += 1

    def attach(self, port: int, mac: str,
               receive: Callable[[bytes], None]) -> Callable[[bytes], None]:
        """Cable a host to `port`; returns what the host calls to send a frame."""
        self.hosts[port] = receive
        self.macs[bytes.fromhex(mac.replace(":", ""))] = port
        return lambda frame: self._cross(port, True, frame)

    def _cross(self, port: int, to_switch: bool, frame: bytes) -> None:
        """Put `frame` on the link of `port` (towards the switch or towards the host)."""
        kind = kind_of(frame, to_switch)
        self.counts[kind] += 1
        rates = self.faults.rates.get(kind, FaultRates())
        rnd = self._random.random
        if rnd() < rates.loss or (self.faults.drop is not None and self.faults.drop(kind, frame)):
            self.lost[kind] += 1
            return
        copies = 2 if rnd() < rates.duplicate else 1
        for _ in range(copies):
            start = max(self.sim.now, self._busy.get((port, to_switch), 0.0))
            done = start + len(frame) * 8 / LINK_BPS
            self._busy[(port, to_switch)] = done
            extra = rnd() * rates.delay_s if rnd() < rates.delay else 0.0
            arrive = done + LATENCY_S + extra - self.sim.now
            if to_switch:
                self.sim.at(arrive, self._switch, port, frame)
            else:
                self.sim.at(arrive, self.hosts[port], frame)

    def _switch(self, in_port: int, frame: bytes) -> None:
        """switch.dataplane.ports's per-frame step: the pipeline first, else L2 forwarding."""
        if self.sim.now < self.down_until:
            self.lost["switch down"] += 1
            return
        out: list[tuple[int, bytes]] = []
        before = self._completed()
        took = self.pipeline.process(memoryview(bytearray(frame)), in_port,
                                     lambda port, parts: out.append((port, b"".join(parts))))
        if self._die_in_slot is not None and before < self._die_in_slot[0] <= self._completed():
            slot, j, down_for = self._die_in_slot      # (completed slots go out in order,
            self._die_in_slot = None                   # each on every connection)
            keep = min(len(out), (slot - before - 1) * len(out) // (self._completed() - before)
                       + j)
            self.lost["switch died"] += len(out) - keep
            out = out[:keep]
            self._restart(down_for)
        if not took:
            port = self.macs.get(frame[:6])
            if port is None:
                raise AssertionError(f"frame for unknown MAC {frame[:6].hex(':')}")
            out.append((port, frame))
        for port, emitted in out:
            if took and self._die_after is not None:
                limit, down_for = self._die_after
                self._emitted += 1
                if self._emitted > limit:          # it died while sending this step's frames
                    self.lost["switch died"] += 1
                    continue
                if self._emitted == limit:
                    self._restart(down_for)
            self._cross(port, False, emitted)
        if self._emitted >= (self._die_after or (1 << 62, 0))[0]:
            self._die_after = None


class OneArmedFabric(Fabric):
    """Hosts and one aggregator on a shared L2 network (rcmodel.aggregators); `via` holds the
    (destination IPv4, destination QPN) of every frame the hosts route via the aggregator."""

    def __init__(self, sim: Simulation, pipeline: AggregationPipeline, faults: Faults,
                 agg_bps: float = LINK_BPS) -> None:
        super().__init__(sim, pipeline, faults)
        self.agg_bps = agg_bps
        self.via: set[bytes] = set()

    def _hop(self, link: tuple[int, bool], bps: float, frame: bytes, kind: str,
             then: Callable[[bytes], None]) -> None:
        """One link crossing (serialised behind the link's earlier frames), its faults."""
        rates = self.faults.rates.get(kind, FaultRates())
        if self._random.random() < rates.loss:
            self.lost[kind] += 1
            return
        start = max(self.sim.now, self._busy.get(link, 0.0))
        self._busy[link] = start + len(frame) * 8 / bps
        self.sim.at(self._busy[link] + LATENCY_S - self.sim.now, then, frame)

    def _cross(self, port: int, to_switch: bool, frame: bytes) -> None:
        """From host `port` (to_switch) to the aggregator or a host; or from the aggregator
        to host `port`."""
        kind = kind_of(frame, to_switch)
        self.counts[kind] += 1
        if not to_switch:
            self._hop((AGG, False), self.agg_bps, frame, kind,
                      lambda f: self._hop((port, False), LINK_BPS, f, kind, self.hosts[port]))
        elif frame[30:34] + frame[BTH_OFF + 5:BTH_OFF + 8] in self.via:
            self._hop((port, True), LINK_BPS, frame, kind,
                      lambda f: self._hop((AGG, True), self.agg_bps, f, kind,
                                          lambda g: self._switch(port, g)))
        else:
            dst = self.macs[frame[:6]]
            self._hop((port, True), LINK_BPS, frame, kind,
                      lambda f: self._hop((dst, False), LINK_BPS, f, kind, self.hosts[dst]))
