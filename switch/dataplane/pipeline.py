"""The aggregation pipeline of the software target (docs/pipeline.md, followed rule by rule).

`AggregationPipeline.process` is the data-plane hook (switch.dataplane.ports.Pipeline): the
dataplane calls it for every received frame. Registered RDMA WRITE packets of a ring are
verified (IPv4 checksum, not a fragment, ICRC), then summed slot by slot (slot = relative
PSN mod N), and each completed slot goes out, in PSN order, as every rank's own packet
with the payload replaced by the sum, UDP checksum 0 and the ICRC recomputed.
Invariants kept: only a packet with a valid IPv4 checksum and ICRC that is not a
fragment is added or served; a rank's contribution to a slot is added once; a slot is
re-used only after it was emitted; results leave in order of relative PSN; a response
(ACK/NAK, ...) to a registered connection's requester passes only from its responder's port
(rule 2r); traffic that matches no registered connection is never touched (process returns
False).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from nr_contract.spec import (CONN_COUNTERS, DEFAULT_SLOTS, MAX_RANKS, OUTCOMES, PSN_MASK,
                             RING_COUNTERS, Connection, RingSpec, check_ring)
from switch.dataplane.packets import (EXT_LEN, EXT_OFF, MESSAGE_START_WRITES, ONLY_WRITES,
                                      PSN_OFF, UDP_CSUM_OFF, UDP_OFF, WRITE_OPCODES, conn_key,
                                      icrc_after, icrc_state, icrc_valid, icrcs, ipv4_header_ok,
                                      is_fragment, parse, payload_len, reth)

if TYPE_CHECKING:
    from switch.dataplane.ports import Emit  # the hook contract: parts valid only during the call

EMPTY = -1                       # tag of a slot that holds no packet
PSN_HALF = 1 << 23                # serial arithmetic: a relative distance below this is "ahead"
_WIRE_I32 = np.dtype("<i4")      # payload elements on the wire: the hosts' own int32
_ZERO_CSUM = bytes(2)            # a rewritten packet's UDP checksum (rxe sends 0; the ICRC masks it)


class Recut:
    """How a requester re-cut its stream (rule 7a, docs/roce.md: rxe sends a message again as
    one empty WRITE_ONLY, every later packet one PSN late): `shift` re-cuts so far, the last
    at relative PSN `at`. Its packet at relative PSN j is slot k = j - shift, and its
    results leave at psn0 + shift + k, the shift when they leave."""

    __slots__ = ("shift", "at")

    def __init__(self) -> None:
        self.shift = 0
        self.at = 0

    def follow(self, j: int) -> bool:
        """An empty WRITE_ONLY at relative PSN j: a re-cut (True), unless it repeats or
        precedes the last one."""
        if self.shift and not 0 < (j - self.at) & PSN_MASK < PSN_HALF:
            return False
        self.shift = (self.shift + 1) & PSN_MASK
        self.at = j
        return True


class AggregatorPool:
    """The N slots of one ring, its in-order emission point and its emission counters.

    Invariant: slot i holds relative PSN tag[i] (≡ i mod N) or is empty; bitmap[i] names
    the ranks whose payload (wire int32) and header it holds, each stored once; ready[i]
    says the slot's result is in its sum row (here: the wrapping int32 sum, formed when the
    bitmap becomes full), and emitted[i] is set only once every slot before tag[i] was
    emitted; `next_emit` is the first relative PSN not emitted yet. Sums stay in wire order
    (little-endian), so a result's payload is the sum array's buffer. A lane's result at k
    is its stored header with PSN psn0 + shift + k, the lane's `recuts[lane]` when it
    leaves (the header it was contributed with may predate a re-cut).
    Hooks for a pool whose result comes from elsewhere (the ToR role, switch/dataplane/tor.py):
    `_complete` (the bitmap became full), `_servable` and `_duplicate` (when a held
    contribution that comes again gets the result, and what happens otherwise), `_full` and
    `result_lanes` (the ranks that contribute, and those whose result an emission sends).
    """

    def __init__(self, world_size: int, slots: int, mtu: int, out_ports: Sequence[int],
                 psn0s: Sequence[int]):
        self.world_size = world_size
        self.psn0 = tuple(psn0s)
        self.recuts = [Recut() for _ in psn0s]
        self.slots = slots
        self.mtu = mtu
        self.out_ports = tuple(out_ports)
        self.next_emit = 0
        self.completed = 0
        self.results_sent = 0
        self._mask = slots - 1
        self._full = (1 << world_size) - 1
        self.result_lanes = tuple(range(world_size))     # whose results a slot emits
        self.tag = [EMPTY] * slots
        self.bitmap = [0] * slots
        self.emitted = [False] * slots
        self.ready = [False] * slots
        self.plen = [mtu] * slots       # _cut[i] is cut to plen[i]
        self.opcode = [0] * slots
        self.headers: list[list[bytearray]] = [[bytearray()] * world_size
                                               for _ in range(slots)]
        self._hcrc = [[0] * world_size for _ in range(slots)]   # icrc_state after header
        elems = mtu // 4
        self._payloads = np.zeros((slots, world_size, elems), dtype=_WIRE_I32)
        self._payload_bytes = [[memoryview(row).cast("B") for row in slot]
                               for slot in self._payloads]
        self._sums = np.zeros((slots, elems), dtype=_WIRE_I32)
        self._sum_bytes = [memoryview(row).cast("B") for row in self._sums]
        # per slot: (payloads, sum) cut to the slot's payload length
        self._cut = [(self._payloads[i], self._sums[i]) for i in range(slots)]

    def offer(self, rank: int, k: int, frame: memoryview, hdr_end: int, plen: int,
              opcode: int, hcrc: int, emit: Emit) -> str:
        """Apply rule 7 to verified packet k of `rank` (`hcrc`: its `icrc_state` at
        hdr_end); returns the counter the outcome bumps."""
        i = k & self._mask
        tag = self.tag[i]
        if tag == k:
            if plen != self.plen[i] or opcode != self.opcode[i]:
                return "drop_mismatch"
            if self.bitmap[i] >> rank & 1:
                if not self._servable(i):
                    return self._duplicate(i, emit)
                payload = self._sum_bytes[i][:plen]
                emit(self.out_ports[rank], (frame[:UDP_CSUM_OFF], _ZERO_CSUM,
                                            frame[UDP_CSUM_OFF + 2:hdr_end], payload,
                                            icrc_after(hcrc, payload)))
                return "retransmits_served"
        else:
            ahead = (k - self.next_emit) & PSN_MASK
            if ahead >= self.slots:     # outside [next_emit, next_emit + N)
                return "drop_overrun" if ahead < PSN_HALF else "drop_stale"
            # In the window, so whatever slot i held (k - N or older) was emitted.
            self.tag[i] = k
            self.bitmap[i] = 0
            self.emitted[i] = False
            self.ready[i] = False
            if self.plen[i] != plen:
                self._cut[i] = (self._payloads[i][:, :plen >> 2], self._sums[i][:plen >> 2])
            self.plen[i] = plen
            self.opcode[i] = opcode
        self._payload_bytes[i][rank][:plen] = frame[hdr_end:hdr_end + plen]
        header = bytearray(frame[:hdr_end])
        header[UDP_CSUM_OFF:UDP_CSUM_OFF + 2] = _ZERO_CSUM
        self.headers[i][rank] = header
        self._hcrc[i][rank] = hcrc
        self.bitmap[i] |= 1 << rank
        if self.bitmap[i] == self._full:
            self._complete(k, i, emit)
        return "aggregated"

    def recut_of(self, rank: int) -> Recut:
        """The re-cuts of rank's connection (its lane's)."""
        return self.recuts[rank]

    def _result_header(self, i: int, lane: int, k: int) -> tuple[bytearray | bytes, int]:
        """Lane's header for slot i's result at k, and its icrc_state: PSN psn0 + shift + k."""
        header, hcrc = self.headers[i][lane], self._hcrc[i][lane]
        psn = (self.psn0[lane] + self.recuts[lane].shift + k) & PSN_MASK
        if int.from_bytes(header[PSN_OFF:PSN_OFF + 3], "big") != psn:
            header = bytearray(header)
            header[PSN_OFF:PSN_OFF + 3] = psn.to_bytes(3, "big")
            hcrc = icrc_state(header, len(header))
        return header, hcrc

    def _servable(self, i: int) -> bool:
        """May a retransmission into slot i get the result back now? (Once emitted.)"""
        return self.emitted[i]

    def _duplicate(self, i: int, emit: Emit) -> str:
        """A contribution slot i holds came again before it was servable: not added."""
        return "drop_duplicate"

    def _complete(self, k: int, i: int, emit: Emit) -> None:
        """Slot i (holding k) has every rank: its result is their sum; emit what is due."""
        payloads, total = self._cut[i]
        np.add.reduce(payloads, axis=0, out=total)
        self.ready[i] = True
        if k == self.next_emit:
            self._emit_in_order(emit)

    def _emit_in_order(self, emit: Emit) -> None:
        """Send next_emit and every ready slot that follows it without a gap."""
        k = self.next_emit
        i = k & self._mask
        while self.tag[i] == k and self.ready[i] and not self.emitted[i]:
            payload = self._sum_bytes[i][:self.plen[i]]
            lanes = self.result_lanes
            headers = [self._result_header(i, lane, k) for lane in lanes]
            for lane, (header, _), crc in zip(lanes, headers,
                                              icrcs(payload, [h for _, h in headers])):
                emit(self.out_ports[lane], (header, payload, crc))
            self.emitted[i] = True
            self.completed += 1
            self.results_sent += len(lanes)
            k = (k + 1) & PSN_MASK
            i = k & self._mask
        self.next_emit = k


class ConnEntry:
    """One registered connection: where its packets may come from and go, its counters.

    `counts` holds the outcomes (one per packet, so `packets` is their sum), `messages` and
    `recuts`; `recut` is its lane's in the pool (rule 7a).
    """

    __slots__ = ("ring_id", "rank", "src_ip", "dst_ip", "src_qpn", "dst_qpn", "psn0",
                 "in_port", "out_port", "pool", "counts", "reth", "recut")

    def __init__(self, ring_id: str, rank: int, src_ip: str, dst_ip: str, src_qpn: int,
                 dst_qpn: int, psn0: int, in_port: int, out_port: int, pool: AggregatorPool):
        self.ring_id = ring_id
        self.rank = rank
        self.src_ip = src_ip
        self.dst_ip = dst_ip
        self.src_qpn = src_qpn
        self.dst_qpn = dst_qpn
        self.psn0 = psn0
        self.in_port = in_port
        self.out_port = out_port
        self.pool = pool
        self.counts = dict.fromkeys(OUTCOMES + ("messages", "recuts"), 0)
        self.reth: Optional[tuple[int, int, int]] = None  # of the current message
        self.recut = pool.recut_of(rank)

    def as_dict(self) -> dict[str, Any]:
        va_rkey_len = dict(zip(("va", "rkey", "dma_len"), self.reth)) if self.reth else None
        counts = {**self.counts, "packets": sum(self.counts[o] for o in OUTCOMES)}
        return {"rank": self.rank, "src_ip": self.src_ip, "dst_ip": self.dst_ip,
                "dst_qpn": self.dst_qpn, "psn0": self.psn0, "in_port": self.in_port,
                "out_port": self.out_port, "reth": va_rkey_len,
                "counters": {name: counts[name] for name in CONN_COUNTERS}}


def response_key(e: ConnEntry) -> int:
    """The key (`packets.conn_key`) of the frames the responder of `e` sends its requester
    (ACK/NAK, ...): ⟨responder's IP, requester's IP, requester's QPN⟩."""
    return conn_key(e.dst_ip, e.src_ip, e.src_qpn)


class ConnectionTable:
    """⟨SrcIP, DstIP, DestQP⟩ (as `packets.conn_key`) → ConnEntry: `entries` by the
    requester's packets' key, `responses` by the key of its responder's answers
    (`response_key`).

    Copy-on-write: both dicts are replaced, never mutated, so a reader on another thread
    sees all of a ring's connections or none.
    """

    def __init__(self) -> None:
        self.entries: dict[int, ConnEntry] = {}
        self.responses: dict[int, ConnEntry] = {}

    def add(self, new: dict[int, ConnEntry]) -> None:
        answers: dict[int, ConnEntry] = {}
        for e in new.values():
            if answers.setdefault(response_key(e), e) is not e:
                raise ValueError(f"ring {e.ring_id}: two connections from {e.src_ip} QPN "
                                 f"{e.src_qpn} to {e.dst_ip}")
        taken = [e for k, e in self.entries.items() if k in new] \
            + [e for k, e in self.responses.items() if k in answers]
        if taken:
            e = taken[0]
            raise ValueError(f"connection {e.src_ip} -> {e.dst_ip} (QPN {e.src_qpn} -> "
                             f"DestQP {e.dst_qpn}) is already registered by ring {e.ring_id}")
        self.entries = {**self.entries, **new}
        self.responses = {**self.responses, **answers}

    def remove(self, keys: Sequence[int]) -> None:
        gone = set(keys)
        answers = {response_key(self.entries[k]) for k in gone if k in self.entries}
        self.entries = {k: e for k, e in self.entries.items() if k not in gone}
        self.responses = {k: e for k, e in self.responses.items() if k not in answers}


def connection_entries(spec: RingSpec, conns: Sequence[Connection], ports: dict[str, int],
                       pool: AggregatorPool) -> dict[int, ConnEntry]:
    """Table entries (by `conn_key`) for `conns` of `spec`, aggregated into `pool`."""
    return {conn_key(c.src_ip, c.dst_ip, c.dst_qpn):
            ConnEntry(spec.ring_id, c.rank, c.src_ip, c.dst_ip, c.src_qpn, c.dst_qpn, c.psn0,
                      ports[c.src_ip], ports[c.dst_ip], pool)
            for c in conns}


@dataclass(frozen=True)
class _Ring:
    """A registered ring: its registration arguments, pool and connections by key."""

    spec: RingSpec
    ports: dict[str, int]
    slots: int
    conns: dict[int, ConnEntry]
    pool: AggregatorPool


class AggregationPipeline:
    """The software target's pipeline: registration (control thread) and `process` (data).

    Control methods serialise on a lock and publish by replacing dicts, so `process`
    runs lock-free on the dataplane thread.
    """

    max_ranks = MAX_RANKS        # per ring (the ToR role aggregates only its rack's share)

    def __init__(self) -> None:
        self.table = ConnectionTable()
        self._rings: dict[str, _Ring] = {}
        self._lock = threading.Lock()

    def register_ring(self, spec: RingSpec, ports: dict[str, int],
                      slots: int = DEFAULT_SLOTS) -> None:
        """Install a ring; `ports` maps each rank's IP to its switch port.

        Registering the same ring again with the same spec, ports and slots is a no-op.
        """
        check_ring(spec, slots, self.max_ranks)
        missing = sorted({c.src_ip for c in spec.connections} - ports.keys())
        if missing:
            raise ValueError(f"ring {spec.ring_id}: no switch port for {', '.join(missing)}")
        with self._lock:
            old = self._rings.get(spec.ring_id)
            if old is not None:
                if (old.spec, old.ports, old.slots) == (spec, ports, slots):
                    return
                raise ValueError(f"ring {spec.ring_id} is already registered differently")
            pool, conns = self._install(spec, ports, slots)
            self.table.add(conns)
            self._rings = {**self._rings, spec.ring_id: _Ring(spec, dict(ports), slots,
                                                               conns, pool)}

    def _install(self, spec: RingSpec, ports: dict[str, int], slots: int
                 ) -> tuple[AggregatorPool, dict[int, ConnEntry]]:
        """A new ring's pool and the entries of the connections it aggregates (all here)."""
        pool = AggregatorPool(spec.world_size, slots, spec.mtu,
                              [ports[c.dst_ip] for c in spec.connections],
                              [c.psn0 for c in spec.connections])
        return pool, connection_entries(spec, spec.connections, ports, pool)

    def unregister_ring(self, ring_id: str) -> None:
        """Remove a ring; its connections' traffic is forwarded from then on."""
        with self._lock:
            ring = self._rings.get(ring_id)
            if ring is None:
                raise KeyError(f"ring {ring_id} is not registered")
            self.table.remove(list(ring.conns))
            self._rings = {r: v for r, v in self._rings.items() if r != ring_id}

    def counters(self) -> dict[str, Any]:
        """Per ring: its counters, slots, next_emit and per-connection state (JSON-able).

        A ring's outcome counters are the sums of its connections'.
        """
        out = {}
        for rid, ring in self._rings.items():
            conns = [e.as_dict() for e in ring.conns.values()]
            totals = {"completed": ring.pool.completed, "results_sent": ring.pool.results_sent}
            out[rid] = {"world_size": ring.spec.world_size, "slots": ring.slots,
                        "next_emit": ring.pool.next_emit, "connections": conns,
                        "counters": {name: totals[name] if name in totals else
                                     sum(c["counters"][name] for c in conns)
                                     for name in RING_COUNTERS}}
        return out

    def process(self, frame: memoryview, in_port: int, emit: Emit) -> bool:
        """Rules 1-8 of docs/pipeline.md for one frame."""
        fields = parse(frame)
        if fields is None:
            return False
        key, udp_len, opcode, pad, psn, frag = fields
        conn = self.table.entries.get(key)
        if conn is None:
            answered = self.table.responses.get(key)
            if answered is None or in_port == answered.out_port:
                return False            # rule 1, or a response from the responder (rule 2r)
            answered.counts["drop_wrong_port"] += 1
            return True
        pool = conn.pool
        if in_port != conn.in_port:
            outcome = "drop_wrong_port"
        elif not ipv4_header_ok(frame):
            outcome = "drop_bad_ipcsum"
        elif is_fragment(frag):
            outcome = "drop_fragment"
        elif opcode not in WRITE_OPCODES:
            outcome = "drop_bad_opcode"
        else:
            hdr_end = EXT_OFF + EXT_LEN[opcode]
            plen = payload_len(udp_len, opcode, pad)
            if pad or plen & 3 or not 0 <= plen <= pool.mtu or UDP_OFF + udp_len > len(frame):
                outcome = "drop_bad_length"
            elif not icrc_valid(frame, hdr_end, hdr_end + plen,
                                hcrc := icrc_state(frame, hdr_end)):
                outcome = "drop_bad_icrc"
            elif plen == 0 and opcode in ONLY_WRITES:     # rule 7a: a re-cut, passed on
                emit(conn.out_port, (frame,))
                conn.counts["recuts"] += conn.recut.follow((psn - conn.psn0) & PSN_MASK)
                outcome = "empties_forwarded"
            else:
                outcome = pool.offer(conn.rank, (psn - conn.psn0 - conn.recut.shift) & PSN_MASK,
                                     frame, hdr_end, plen, opcode, hcrc, emit)
                if outcome == "aggregated" and opcode in MESSAGE_START_WRITES:
                    conn.counts["messages"] += 1
                    conn.reth = reth(frame)
        conn.counts[outcome] += 1
        return True
