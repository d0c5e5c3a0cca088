"""A simulated two-tier fabric: real ToR/spine pipeline objects, in-process links, go-back-N hosts.

R racks of hosts, one `TorPipeline` per rack, one `SpinePipeline`, all registered through
the real `FabricTarget`; frames travel as bytes over links that can lose, duplicate,
reorder (random extra delay) and corrupt (inter-switch frames only: a host's NIC would
drop a frame whose ICRC fails, which is not what is under test) what they carry.
Every rank is a requester (its ring connection; frames as rxe sends them, built by
switch.dataplane.packets.build_frame for speed and equal to scapy's, which a test checks; a go-back-N
window of W packets, a retransmit timer, NAK handling) and a responder (in-order
acceptance, cumulative ACK per packet, one NAK per gap), so loss anywhere heals as with
rxe: by the hosts, never by a switch timer.
Seam: `SimHost` is the only host model; the packet-level rxe RC model (tests/rcmodel/,
branch rcmodel) can replace it as long as it sends and takes frames through `Sim.send`.
"""
from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from nr_contract.spec import PSN_MASK, Connection, RingSpec
from switch.control.fabric import FabricTarget, SpineTarget, TorTarget
from switch.dataplane import interswitch
from switch.dataplane.interswitch import Endpoint
from switch.dataplane.packets import (EXT_LEN, EXT_OFF, IMMDT_OPCODES, RETH_OPCODES, Op,
                                      build_frame, icrc, parse)
from switch.dataplane.spine import SpineConfig, SpinePipeline
from switch.dataplane.tor import TorConfig, TorPipeline
from tests.roce_layers import (WRITE_FIRST, WRITE_LAST_IMM, WRITE_MIDDLE, WRITE_ONLY_IMM, make_ring,
                               write_frame)

SPINE = Endpoint("02:4e:53:00:00:fe", "10.78.0.254")
UPLINK = 100                     # every ToR's uplink port number
ACK, NAK_SEQ = 0x00, 0x60        # AETH syndromes


def tor_endpoint(j: int) -> Endpoint:
    return Endpoint(f"02:4e:53:00:00:{j + 1:02x}", f"10.78.0.{j + 1}")


def kind_of(frame: bytes) -> str:
    """'partial' / 'total' / 'write' (RoCE RDMA WRITE) / 'ack' / 'other', for traffic counts."""
    if interswitch.is_interswitch(frame):
        return "partial" if frame[interswitch.OFF + 1] == interswitch.Kind.PARTIAL else "total"
    fields = parse(frame)
    if fields is None:
        return "other"
    return "ack" if fields[2] == 0x11 else "write"


@dataclass
class Faults:
    """Per frame crossing a link: probabilities of loss, duplication, extra delay, corruption."""

    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    corrupt: float = 0.0
    kinds: tuple[str, ...] = ("partial", "total", "write", "ack")   # frames they hit


@dataclass
class LinkStats:
    """What one direction of a link carried (by `kind_of`) and what its faults did."""

    sent: Counter = field(default_factory=Counter)
    bytes: Counter = field(default_factory=Counter)
    lost: int = 0
    duplicated: int = 0
    delayed: int = 0
    corrupted: int = 0


Node = tuple[str, int]            # (switch name, port) or ("host", rank)


class SimSwitch:
    """A switch of the fabric: its pipeline, a static MAC table (MAC -> port), port counters."""

    def __init__(self, name: str, pipeline: Any, macs: dict[str, int]):
        self.name = name
        self.pipeline = pipeline
        self.macs = {bytes.fromhex(m.replace(":", "")): p for m, p in macs.items()}
        self.ports: dict[int, Counter] = defaultdict(Counter)

    def port_of_mac(self, mac: str) -> Optional[int]:
        return self.macs.get(bytes.fromhex(mac.replace(":", "")))

    def port_counters(self) -> dict[int, dict[str, int]]:
        return {p: dict(c) for p, c in sorted(self.ports.items())}

    def receive(self, frame: bytes, in_port: int) -> list[tuple[int, bytes]]:
        self.ports[in_port]["rx_packets"] += 1
        out: list[tuple[int, bytes]] = []
        buf = bytearray(frame)                   # the data plane re-uses its buffer
        took = self.pipeline.process(memoryview(buf), in_port,
                                     lambda p, parts: out.append((p, b"".join(parts))))
        buf[:] = bytes(len(buf))
        if not took:
            port = self.macs.get(frame[:6])
            assert port is not None, f"{self.name}: no port for MAC {frame[:6].hex()}"
            if port != in_port:
                out.append((port, frame))
        for port, f in out:
            self.ports[port]["tx_packets"] += 1
            self.ports[port][f"tx_{kind_of(f)}"] += 1
        return out


def message_packets(nbytes: int, mtu: int, msg_size: int) -> list[tuple[int, int, int, int]]:
    """(opcode, byte offset, length, message index) of every packet, in PSN order.

    Messages of msg_size bytes (the last one shorter), WRITE (WITH IMMEDIATE at the end)
    split at the path MTU, as flowctl posts them.
    """
    out = []
    for m, start in enumerate(range(0, nbytes, msg_size)):
        size = min(msg_size, nbytes - start)
        pieces = list(range(start, start + size, mtu))
        for p, off in enumerate(pieces):
            length = min(mtu, start + size - off)
            if len(pieces) == 1:
                op = WRITE_ONLY_IMM
            else:
                op = WRITE_FIRST if p == 0 else WRITE_LAST_IMM if p == len(pieces) - 1 \
                    else WRITE_MIDDLE
            out.append((op, off, length, m))
    return out


class SimHost:
    """Rank r: requester of connection r (go-back-N, window W packets), responder of r-1."""

    def __init__(self, sim: "Sim", spec: RingSpec, rank: int, data: np.ndarray, window: int,
                 timeout: float):
        n = spec.world_size
        self.sim, self.rank, self.window, self.timeout = sim, rank, window, timeout
        self.conn: Connection = spec.connections[rank]
        self.incoming: Connection = spec.connections[(rank - 1) % n]
        wire = data.astype("<i4").tobytes()
        self.layout = message_packets(len(wire), spec.mtu, spec.msg_size)
        self.frames = [self.frame(k, wire[off:off + ln]) for k, (_, off, ln, _) in
                       enumerate(self.layout)]
        self.packets = len(self.frames)
        self.una = self.nxt = 0           # oldest unacknowledged / next to send (relative)
        self.sent_max = -1
        self.last_progress = 0.0
        self.retransmissions = 0
        self.expected = 0                 # responder: next relative PSN of connection r-1
        self.nak_sent = False
        self.received = bytearray(len(wire))

    def frame(self, k: int, payload: bytes, *, scapy: bool = False) -> bytes:
        """Packet k of our connection as rxe sends it (`scapy`: built by scapy instead of
        switch.dataplane.packets, which is ~50x faster; tests check that both agree)."""
        op, _, _, m = self.layout[k]
        c, size = self.conn, self.sim.spec.msg_size
        reth = (0x7F0000000000 + 0x100000 * self.rank + m * size, 0x100 + self.rank, size)
        kw: dict[str, Any] = {"ackreq": op >= WRITE_LAST_IMM, "ip_id": k & 0xFFFF}
        if scapy:
            return write_frame(c, k, op, payload, reth=reth, imm=m, **kw)
        return build_frame(dst_mac=c.dst_mac, src_mac=c.src_mac, src_ip=c.src_ip,
                           dst_ip=c.dst_ip, dest_qp=c.dst_qpn, psn=(c.psn0 + k) & PSN_MASK,
                           opcode=op, payload=payload, src_port=0xC000 | c.src_qpn & 0x3FFF,
                           reth_fields=reth if op in RETH_OPCODES else None,
                           imm=m if op in IMMDT_OPCODES else None, **kw)

    @property
    def done(self) -> bool:
        return self.una == self.packets and self.expected == self.packets

    def pump(self, now: float) -> None:
        """Send what the window allows; go back to una when the timer expired."""
        if self.una < self.packets and now - self.last_progress > self.timeout:
            self.nxt = self.una
            self.last_progress = now
        while self.nxt < min(self.una + self.window, self.packets):
            self.sim.check_bound(self, self.nxt)
            if self.nxt <= self.sent_max:
                self.retransmissions += 1
            self.sent_max = max(self.sent_max, self.nxt)
            self.sim.send(("host", self.rank), self.frames[self.nxt], now)
            self.nxt += 1

    def receive(self, frame: bytes, now: float) -> None:
        fields = parse(frame)
        assert fields is not None, f"rank {self.rank}: a non-RoCE frame reached the host"
        _, udp_len, opcode, _, psn, _ = fields
        if opcode == 0x11:                                   # ACK/NAK of our connection
            k = (psn - self.conn.psn0) & PSN_MASK
            if k >= self.packets or k < self.una - (frame[EXT_OFF] != NAK_SEQ):
                return                                       # stale
            if frame[EXT_OFF] == NAK_SEQ:                    # go back to k
                self.una = self.nxt = k
            else:
                self.una = k + 1
                self.nxt = max(self.nxt, self.una)
            self.last_progress = now
            return
        k = (psn - self.incoming.psn0) & PSN_MASK
        self.sim.check_result(self, k, frame, opcode)
        if k == self.expected:
            _, off, ln, _ = self.layout[k]
            start = EXT_OFF + EXT_LEN[opcode]
            self.received[off:off + ln] = frame[start:start + ln]
            self.expected += 1
            self.nak_sent = False
            self._ack(k, ACK, now)
        elif k < self.expected:
            self._ack(self.expected - 1, ACK, now)            # duplicate: ACK again
        elif not self.nak_sent:
            self.nak_sent = True
            self._ack(self.expected, NAK_SEQ, now)

    def _ack(self, k: int, syndrome: int, now: float) -> None:
        c = self.incoming                                     # we are its responder
        frame = build_frame(dst_mac=c.src_mac, src_mac=c.dst_mac, src_ip=c.dst_ip,
                            dst_ip=c.src_ip, dest_qp=c.src_qpn, psn=(c.psn0 + k) & PSN_MASK,
                            opcode=Op.ACKNOWLEDGE, payload=bytes([syndrome, 0, 0, 0]))
        self.sim.send(("host", self.rank), frame, now)


def rack_of_rank(racks: Sequence[int] | Sequence[Sequence[int]]) -> list[int]:
    """Each rank's rack from rack sizes (contiguous ranks) or from each rack's ranks."""
    if all(isinstance(r, int) for r in racks):
        return [j for j, size in enumerate(racks) for _ in range(size)]   # type: ignore[arg-type]
    rack_of = {r: j for j, ranks in enumerate(racks) for r in ranks}      # type: ignore[union-attr]
    assert sorted(rack_of) == list(range(len(rack_of))), f"racks {racks}: not ranks 0..n-1"
    return [rack_of[r] for r in range(len(rack_of))]


class Sim:
    """The fabric: racks of hosts, ToRs, a spine, links, the event loop.

    `racks`: rack sizes (contiguous ranks), or each rack's list of ranks.
    """

    def __init__(self, racks: Sequence[int] | Sequence[Sequence[int]], *, elements: int,
                 mtu: int = 256, msg_size: Optional[int] = None, window_msgs: int = 2,
                 slots: int = 0,
                 host_faults: Faults = Faults(), uplink_faults: Faults = Faults(),
                 seed: int = 0, timeout: float = 60.0, ring_id: str = "mr",
                 drop: Optional[Callable[[Node, bytes], bool]] = None,
                 control: Callable[[list[TorTarget], SpineTarget], FabricTarget] = FabricTarget):
        self.rack_of = rack_of_rank(racks)
        n = len(self.rack_of)
        self.rng = random.Random(seed)
        self.drop = drop                  # frames leaving a node that this says to lose
        self.spec = make_ring(n, ring_id=ring_id, mtu=mtu, msg_size=msg_size or 2 * mtu,
                              window=window_msgs)
        self.W = self.spec.window_packets
        self.slots = slots or 2 * self.W
        self.switches: dict[str, SimSwitch] = {}
        self.links: dict[Node, tuple[Node, Faults]] = {}
        self.stats: dict[tuple[Node, Node], LinkStats] = defaultdict(LinkStats)
        self._wire(host_faults, uplink_faults)
        self.fabric = control(   # the controller over the switches (in-process by default)
            [TorTarget(self.switches[f"tor{j}"].pipeline, self.switches[f"tor{j}"].port_of_mac,
                       self.switches[f"tor{j}"].port_counters) for j in range(len(racks))],
            SpineTarget(self.switches["spine"].pipeline, self.switches["spine"].port_counters))
        self.registration = self.fabric.register_ring(self.spec, self.slots)
        rng = np.random.default_rng(seed)
        self.data = [rng.integers(-2**31, 2**31, elements, dtype=np.int32) for _ in range(n)]
        for d in self.data:
            d[:2] = [2**31 - 1, -2**31][:len(d[:2])]          # sums wrap
        total = np.sum(np.stack(self.data).astype(np.int64), axis=0)
        self.expected = ((total + 2**31) % 2**32 - 2**31).astype(np.int32)
        self.hosts = [SimHost(self, self.spec, r, self.data[r], self.W, timeout)
                      for r in range(n)]
        self._queue: list[tuple[float, int, Node, bytes]] = []
        self._seq = itertools.count()
        self.now = 0.0
        self.results_checked = 0
        self.max_lead = 0                 # most a sent k was ahead of the slowest una

    def _wire(self, host_faults: Faults, uplink_faults: Faults) -> None:
        hosts = [c.src_mac for c in self.spec.connections]
        spine_macs: dict[str, int] = {}
        spine_tors = {}
        for j in range(max(self.rack_of) + 1):
            ranks = [r for r in range(len(hosts)) if self.rack_of[r] == j]
            macs = {m: UPLINK for m in hosts}
            for port, r in enumerate(ranks, start=1):
                macs[hosts[r]] = port
                self._cable(("host", r), (f"tor{j}", port), host_faults)
                spine_macs[hosts[r]] = j + 1
            macs[SPINE.mac] = UPLINK
            config = TorConfig(j, UPLINK, tor_endpoint(j), SPINE)
            self.switches[f"tor{j}"] = SimSwitch(f"tor{j}", TorPipeline(config), macs)
            self._cable((f"tor{j}", UPLINK), ("spine", j + 1), uplink_faults)
            spine_tors[j] = (j + 1, tor_endpoint(j))
            spine_macs[tor_endpoint(j).mac] = j + 1
        self.switches["spine"] = SimSwitch("spine", SpinePipeline(SpineConfig(SPINE, spine_tors)),
                                           spine_macs)

    def _cable(self, a: Node, b: Node, faults: Faults) -> None:
        self.links[a] = (b, faults)
        self.links[b] = (a, faults)

    # -- the event loop ------------------------------------------------------------------
    def send(self, src: Node, frame: bytes, now: float) -> None:
        """`frame` leaves `src` (a host, or a switch port) onto its link, faults applied."""
        dst, faults = self.links[src]
        stats = self.stats[(src, dst)]
        kind = kind_of(frame)
        stats.sent[kind] += 1
        stats.bytes[kind] += len(frame)
        if kind not in faults.kinds:
            faults = Faults()
        if self.rng.random() < faults.loss or (self.drop is not None and self.drop(src, frame)):
            stats.lost += 1
            return
        copies = 1
        if self.rng.random() < faults.dup:
            copies = 2
            stats.duplicated += 1
        for _ in range(copies):
            f = frame
            if kind in ("partial", "total") and self.rng.random() < faults.corrupt:
                at = self.rng.randrange(interswitch.OFF, len(f))
                f = f[:at] + bytes([f[at] ^ 1 << self.rng.randrange(8)]) + f[at + 1:]
                stats.corrupted += 1
            delay = 1.0
            if self.rng.random() < faults.reorder:
                delay += self.rng.uniform(0, 8)
                stats.delayed += 1
            heapq.heappush(self._queue, (now + delay, next(self._seq), dst, f))

    def run(self, max_events: int = 2_000_000) -> int:
        """Until every host has all results acknowledged and received; returns events."""
        events = 0
        pumped = -1.0
        while not all(h.done for h in self.hosts):
            if self.now >= pumped + 1:                # every host's window and timer
                for h in self.hosts:
                    h.pump(self.now)
                pumped = self.now
            if not self._queue:                       # all quiet: the next timer expires
                self.now = min(h.last_progress for h in self.hosts if h.una < h.packets) \
                    + self.hosts[0].timeout + 1
                continue
            self.now, _, (name, port), frame = heapq.heappop(self._queue)
            events += 1
            assert events < max_events, f"no progress after {events} events: {self.progress()}"
            if name == "host":
                self.hosts[port].receive(frame, self.now)
                self.hosts[port].pump(self.now)
            else:
                for out, f in self.switches[name].receive(frame, port):
                    self.send((name, out), f, self.now)
        return events

    def progress(self) -> str:
        return ", ".join(f"r{h.rank}: una {h.una} exp {h.expected}/{h.packets}"
                         for h in self.hosts)

    # -- what the test checks on the way ---------------------------------------------------
    def check_bound(self, host: SimHost, k: int) -> None:
        """Slot reuse bound: a packet sent is at most min(una) + 2W - 1 (docs/multirack.md)."""
        low = min(h.una for h in self.hosts)
        assert k <= low + 2 * self.W - 1, \
            f"rank {host.rank} sends k={k} while a rank is stuck at {low} (W={self.W})"
        self.max_lead = max(self.max_lead, k - low)

    def check_result(self, host: SimHost, k: int, frame: bytes, opcode: int) -> None:
        """A result is the requester's own packet k with payload = the sum and a valid ICRC."""
        sender = self.hosts[host.incoming.rank]
        orig = sender.frames[k]
        _, off, ln, _ = sender.layout[k]
        start = EXT_OFF + EXT_LEN[opcode]
        assert len(frame) == len(orig) and frame[:start] == orig[:start], \
            f"result of connection {sender.rank} at k={k}: headers differ from its packet"
        want = self.expected.astype("<i4").tobytes()[off:off + ln]
        assert frame[start:start + ln] == want, \
            f"result of connection {sender.rank} at k={k}: payload is not the sum"
        assert frame[-4:] == icrc(frame[:-4]), f"result of connection {sender.rank} at k={k}: ICRC"
        self.results_checked += 1

    def results(self) -> list[np.ndarray]:
        return [np.frombuffer(bytes(h.received), dtype="<i4") for h in self.hosts]

    def uplink_traffic(self) -> dict[int, dict[str, Counter]]:
        """Per rack j: frames by kind on its ToR-spine link, 'up' (ToR -> spine) and 'down'."""
        return {j: {"up": self.stats[((f"tor{j}", UPLINK), ("spine", j + 1))].sent,
                    "down": self.stats[(("spine", j + 1), (f"tor{j}", UPLINK))].sent}
                for j in range(len({*self.rack_of}))}

    def uplink_bytes(self) -> dict[str, int]:
        """Bytes on all ToR-spine links, both directions, by kind."""
        out: Counter = Counter()
        for (src, dst), st in self.stats.items():
            if "spine" in (src[0], dst[0]):
                out.update(st.bytes)
        return dict(out)



def spine_report(rack_sizes: Sequence[int], nbytes: int, mtu: int = 4096,
                 msg_size: int = 262144, window_msgs: int = 2) -> dict[str, Any]:
    """One fault-free allreduce of `nbytes` per rank: bytes per ToR-spine link direction.

    Also the host ring's figure for the same fabric (each connection between racks carries
    2(n-1)/n of the data in packets of the path MTU), for comparison.
    """
    sim = Sim(rack_sizes, elements=nbytes // 4, mtu=mtu, msg_size=msg_size,
              window_msgs=window_msgs, slots=256)
    sim.run()
    assert all(np.array_equal(r, sim.expected) for r in sim.results())
    R = len(rack_sizes)
    up, down = Counter(), Counter()
    for j in range(R):
        up.update(sim.stats[((f"tor{j}", UPLINK), ("spine", j + 1))].bytes)
        down.update(sim.stats[(("spine", j + 1), (f"tor{j}", UPLINK))].bytes)
    n = sum(rack_sizes)
    ring_frames = 2 * (n - 1) * -(-nbytes // n // mtu)
    ring = 2 * (n - 1) / n * nbytes + ring_frames * (EXT_OFF + 4 + 2)  # + RETH/ImmDt ~2 B avg
    return {"racks": list(rack_sizes), "bytes_per_rank": nbytes, "mtu": mtu,
            "up_per_link": {k: v / R for k, v in up.items()},
            "down_per_link": {k: v / R for k, v in down.items()},
            "ring_per_link_direction": ring}

if __name__ == "__main__":      # python -m tests.fabricsim 8x8 1048576
    import json
    import sys
    racks_arg, size_arg = sys.argv[1], int(sys.argv[2])
    count, size = (int(x) for x in racks_arg.split("x"))
    print(json.dumps(spine_report([size] * count, size_arg), indent=1))
