"""The BMv2 target: the controller's Target, programming switch/p4 over P4Runtime.

A ring registration becomes, in install order: the ring's multicast group (one replica
per rank r on the port of its responder, rid r, plus the continuation replica), its
ring_table entry (epoch, N - 1, full bitmap), one replica_table entry per rank (egress
rewrite), one conn_table entry per connection and one response_table entry per connection
(its responder's answers pass only from the responder's port, rule 2r); unregistering
removes them in reverse.
`plan_ring` computes all of it as plain data (unit-tested without BMv2); a `Session`
writes it. `ShellSession` is the real one, over p4runtime-shell (the optional extra
`bmv2`, imported only when a session is opened).

Invariants: ring indices 0 .. NR_MAX_RINGS-1 are handed out lowest free first; every
registration of an index gets a new epoch (1..65535), so the data plane treats slot state
left by an earlier ring as empty; counters of a re-used index are reported relative to
their values at registration. BMv2's P4Runtime server cannot read registers, so the
informational per-connection RETH comes from BMv2's Thrift CLI when a `RegisterReader`
(`switch.control.bmv2_registers.ThriftRegisters`) is given, else it is None.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from nr_contract.spec import (CONN_COUNTERS, PSN_MASK, RING_COUNTERS, Connection, RingSpec,
                             check_ring)
from switch.control.target import Target, normalize_mac, resolve_ports
from switch.p4.program import Build, Contract, contract

Value = int | str                        # an IPv4 / MAC string or an integer
RegisterReader = Callable[[str, int], Optional[int]]
EPOCHS = 0xFFFF                          # epochs run 1..65535, then wrap to 1


@dataclass(frozen=True)
class TableEntry:
    table: str
    match: tuple[tuple[str, Value], ...]
    action: str
    params: tuple[tuple[str, Value], ...]


@dataclass(frozen=True)
class McGroup:
    group_id: int
    replicas: tuple[tuple[int, int], ...]   # (egress port, instance = egress_rid)


@dataclass(frozen=True)
class RingPlan:
    """What one ring installs: its multicast group, then `install_order`."""

    group: McGroup
    ring: TableEntry
    replicas: tuple[TableEntry, ...]
    conns: tuple[TableEntry, ...]
    responses: tuple[TableEntry, ...]

    @property
    def install_order(self) -> tuple[TableEntry, ...]:
        """Ring, then replicas, then connections and their responses: a packet matches a
        connection only once everything it needs is in place."""
        return (self.ring, *self.replicas, *self.conns, *self.responses)


def check_bmv2_ring(spec: RingSpec, slots: int, c: Contract) -> None:
    """Raise ValueError unless the ring fits the v1model program's limits (limits.p4)."""
    rid = spec.ring_id
    if slots > c.slots:
        raise ValueError(f"ring {rid}: {slots} slots, the BMv2 program has {c.slots} per ring")
    if spec.world_size > c.max_ranks:
        raise ValueError(f"ring {rid}: {spec.world_size} ranks, the BMv2 program takes "
                         f"{c.max_ranks}")
    if spec.mtu > c.max_payload:
        raise ValueError(f"ring {rid}: path MTU {spec.mtu}; through the BMv2 switch a ring "
                         f"must use path MTU {c.max_payload} ({c.max_elems} int32 per packet)")


def plan_ring(spec: RingSpec, ports: dict[str, int], slots: int, index: int, epoch: int,
              c: Contract) -> RingPlan:
    """The group and table entries of ring `index` (ports: each rank's IP -> switch port)."""
    conns = spec.connections
    ring = TableEntry("NrIngress.ring_table", (("ring", index),), "NrIngress.set_ring",
                      (("epoch", epoch), ("slot_mask", slots - 1),
                       ("full", (1 << spec.world_size) - 1)))
    replicas = tuple(
        TableEntry("NrEgress.replica_table", (("ring", index), ("rank", x.rank)),
                   "NrEgress.set_replica",
                   (("src_ip", x.src_ip), ("dst_ip", x.dst_ip), ("dest_qp", x.dst_qpn),
                    ("psn0", x.psn0)))
        for x in conns)
    conn_entries = tuple(
        TableEntry("NrIngress.conn_table",
                   (("src_ip", x.src_ip), ("dst_ip", x.dst_ip), ("dest_qp", x.dst_qpn)),
                   "NrIngress.set_conn",
                   (("ring", index), ("rank", x.rank), ("psn0", x.psn0),
                    ("in_port", ports[x.src_ip]), ("out_port", ports[x.dst_ip])))
        for x in conns)
    responses = tuple(
        TableEntry("NrIngress.response_table",
                   (("src_ip", x.dst_ip), ("dst_ip", x.src_ip), ("dest_qp", x.src_qpn)),
                   "NrIngress.set_response",
                   (("ring", index), ("rank", x.rank), ("port", ports[x.dst_ip])))
        for x in conns)
    group = McGroup(c.ring_group_base + index,
                    tuple((ports[x.dst_ip], x.rank) for x in conns)
                    + ((ports[conns[0].dst_ip], c.cont_rid),))
    return RingPlan(group, ring, replicas, conn_entries, responses)


def l2_entry(mac: str, port: int, ingress: str = "NrIngress") -> TableEntry:
    """The static L2 entry of `mac` in the program whose ingress control is `ingress`."""
    return TableEntry(f"{ingress}.l2", (("dst_mac", normalize_mac(mac)),),
                      f"{ingress}.l2_forward", (("port", port),))


def flood_group(ports: list[int], c: Contract) -> McGroup:
    return McGroup(c.flood_group, tuple((p, 0) for p in sorted(ports)))


class Session(Protocol):
    """The P4Runtime operations the target needs (one device, pipeline already pushed)."""

    def insert(self, entry: TableEntry) -> None: ...
    def delete(self, entry: TableEntry) -> None: ...
    def insert_group(self, group: McGroup) -> None: ...
    def delete_group(self, group_id: int) -> None: ...

    def read_counter(self, name: str) -> dict[int, tuple[int, int]]:
        """Every index of counter `name` -> (packets, bytes)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class _Ring:
    spec: RingSpec
    ports: dict[str, int]
    slots: int
    index: int
    plan: RingPlan
    baseline: dict[str, Any]      # counter values at registration (see _ring_counts)


class Bmv2Device:
    """What every program's target shares on one simple_switch_grpc: the P4Runtime session,
    the static MAC table and flood group (installed at once), ring indices with their
    epochs, writes that roll back, the port counters.

    `ports`: switch port -> interface name; `macs`: the static MAC table (MAC -> port),
    the only one the programs have (they do not learn addresses; unknown ones are flooded);
    `ingress`: the name of the program's ingress control (its `l2` table).
    Invariant: ring indices 0 .. NR_MAX_RINGS-1 are handed out lowest free first, each
    registration of an index with a new epoch (1..65535).
    """

    _rings: dict[str, Any]        # each program's target's: ring id -> ring (.plan.group)

    def __init__(self, session: Session, ports: dict[int, str], macs: dict[str, int],
                 read_register: Optional[RegisterReader] = None,
                 c: Optional[Contract] = None, ingress: str = "NrIngress"):
        self.session = session
        self.c = c or contract()
        self._ports = dict(sorted(ports.items()))
        self._macs = {normalize_mac(m): p for m, p in macs.items()}
        self._read_register = read_register
        self._epochs = [0] * self.c.max_rings
        self._lock = threading.Lock()
        unknown = sorted(set(self._macs.values()) - set(self._ports))
        if unknown:
            raise ValueError(f"static MACs on unknown ports {unknown}")
        session.insert_group(flood_group(list(self._ports), self.c))
        for mac, port in self._macs.items():
            session.insert(l2_entry(mac, port, ingress))

    def port_of_mac(self, mac: str) -> Optional[int]:
        return self._macs.get(normalize_mac(mac))

    def macs(self) -> dict[str, int]:
        """The static MAC table (MAC -> port)."""
        return dict(self._macs)

    def _new_index(self, used: set[int], ring_id: str) -> tuple[int, int]:
        """The lowest free ring index and its new epoch; ValueError when none is free."""
        free = [i for i in range(self.c.max_rings) if i not in used]
        if not free:
            raise ValueError(f"ring {ring_id}: the BMv2 program holds "
                             f"{self.c.max_rings} rings and all are registered")
        index = free[0]
        self._epochs[index] = self._epochs[index] % EPOCHS + 1
        return index, self._epochs[index]

    def _write(self, group: McGroup, entries: tuple[TableEntry, ...]) -> None:
        """Insert the group, then the entries in order; on a failure remove what was
        written, then re-raise."""
        self.session.insert_group(group)
        done: list[TableEntry] = []
        try:
            for entry in entries:
                self.session.insert(entry)
                done.append(entry)
        except Exception:
            for entry in reversed(done):
                self.session.delete(entry)
            self.session.delete_group(group.group_id)
            raise

    def _remove(self, group: McGroup, entries: tuple[TableEntry, ...]) -> None:
        """Undo `_write(group, entries)`: the entries in reverse order, then the group."""
        for entry in reversed(entries):
            self.session.delete(entry)
        self.session.delete_group(group.group_id)

    def _unregister(self, rings: dict[str, Any], ring_id: str, where: str) -> None:
        """Remove ring `ring_id` of `rings` (whose `plan` has `group`, `install_order`);
        KeyError (saying `where`) when it is not there."""
        with self._lock:
            ring = rings.pop(ring_id, None)
            if ring is None:
                raise KeyError(f"ring {ring_id} is not registered{where}")
            self._remove(ring.plan.group, ring.plan.install_order)

    def _counts(self, name: str, index: dict[str, int]) -> dict[str, int]:
        """Packets of counter `name` at each named index (0 where never counted)."""
        values = self.session.read_counter(name)
        return {n: values.get(i, (0, 0))[0] for n, i in index.items()}

    def _port_view(self) -> dict[str, dict[str, Any]]:
        rx, tx = self.session.read_counter("port_rx"), self.session.read_counter("port_tx")
        roce, flooded = (self.session.read_counter("port_roce"),
                         self.session.read_counter("port_flooded"))
        out: dict[str, dict[str, Any]] = {}
        for port, ifname in self._ports.items():
            (rxp, rxb), (txp, txb) = rx.get(port, (0, 0)), tx.get(port, (0, 0))
            out[str(port)] = {"ifname": ifname, "rx_packets": rxp, "rx_bytes": rxb,
                              "tx_packets": txp, "tx_bytes": txb,
                              "roce_packets": roce.get(port, (0, 0))[0],
                              "flooded": flooded.get(port, (0, 0))[0], "tx_errors": 0}
        return out

    def _ring_counts(self, index: int, lanes: int) -> dict[str, Any]:
        """Raw counter values of ring `index` of a program with the single switch's ring and
        connection counters: {"ring": {name: n}, "conns": [{name: n}] per rank (lane)}."""
        c = self.c
        conn_ctr = self.session.read_counter("conn_ctr")
        return {"ring": self._counts("ring_ctr", {n: c.ring_counter_index(index, n)
                                                  for n in RING_COUNTERS}),
                "conns": [{n: conn_ctr.get(c.conn_counter_index(index, r, n), (0, 0))[0]
                           for n in CONN_COUNTERS} for r in range(lanes)]}

    def _reth(self, index: int, rank: int) -> Optional[dict[str, int]]:
        """The informational RETH of connection `rank` (lane) of ring `index`, over Thrift."""
        value = (self._read_register("conn_reth", index * self.c.max_ranks + rank)
                 if self._read_register else None)
        if not value:
            return None
        return {"va": value >> 64, "rkey": value >> 32 & 0xFFFFFFFF, "dma_len": value & 0xFFFFFFFF}

    def _connection_view(self, x: Connection, index: int, lane: int, in_port: int,
                         out_port: int, now: dict[str, int], base: dict[str, int]
                         ) -> dict[str, Any]:
        """A connection as the software target reports it (ConnEntry.as_dict)."""
        return {"rank": x.rank, "src_ip": x.src_ip, "dst_ip": x.dst_ip, "dst_qpn": x.dst_qpn,
                "psn0": x.psn0, "in_port": in_port, "out_port": out_port,
                "reth": self._reth(index, lane),
                "counters": {n: v - base[n] for n, v in now.items()}}

    def remove_groups(self) -> None:
        """Delete every multicast group this target installed (its rings' and the flood
        group), leaving the rest: what BMv2 keeps of a device when the program is pushed
        again (labswitches/bmv2_lab.py, Bmv2Switch.reset). The target is to be closed after it."""
        with self._lock:
            for ring in self._rings.values():
                self.session.delete_group(ring.plan.group.group_id)
            self._rings.clear()
            self.session.delete_group(self.c.flood_group)

    def close(self) -> None:
        self.session.close()


class Bmv2Target(Bmv2Device, Target):
    """The controller's Target for a BMv2 simple_switch_grpc running switch/p4
    (netreduce.p4); the arguments are Bmv2Device's."""

    name = "bmv2"

    def __init__(self, session: Session, ports: dict[int, str], macs: dict[str, int],
                 read_register: Optional[RegisterReader] = None,
                 c: Optional[Contract] = None):
        super().__init__(session, ports, macs, read_register, c)
        self._rings: dict[str, _Ring] = {}

    def limits(self) -> dict[str, Any]:
        """limits.p4's: path MTU 256 only (64 int32 per packet), its slots, ranks, rings."""
        return {"path_mtus": [self.c.max_payload], "max_slots": self.c.slots,
                "max_ranks": self.c.max_ranks, "max_rings": self.c.max_rings}

    def register_ring(self, spec: RingSpec, slots: int) -> dict[str, Any]:
        check_ring(spec, slots)
        check_bmv2_ring(spec, slots, self.c)
        ports = resolve_ports(spec, self.port_of_mac)
        result = {"ring_id": spec.ring_id, "slots": slots, "ports": ports}
        with self._lock:
            old = self._rings.get(spec.ring_id)
            if old is not None:
                if (old.spec, old.ports, old.slots) == (spec, ports, slots):
                    return result
                raise ValueError(f"ring {spec.ring_id} is already registered differently")
            self._check_free_connections(spec)
            index, epoch = self._new_index({r.index for r in self._rings.values()},
                                           spec.ring_id)
            plan = plan_ring(spec, ports, slots, index, epoch, self.c)
            baseline = self._ring_counts(index, spec.world_size)
            self._write(plan.group, plan.install_order)
            self._rings[spec.ring_id] = _Ring(spec, dict(ports), slots, index, plan, baseline)
        return result

    def _check_free_connections(self, spec: RingSpec) -> None:
        """ValueError unless every conn_table and response_table key of `spec` is free."""
        answers = {(x.dst_ip, x.src_ip, x.src_qpn) for x in spec.connections}
        if len(answers) != spec.world_size:
            raise ValueError(f"ring {spec.ring_id}: two connections from one host and QPN "
                             "to the same responder")
        mine = {(x.src_ip, x.dst_ip, x.dst_qpn) for x in spec.connections}
        for ring in self._rings.values():
            for x in ring.spec.connections:
                if (x.src_ip, x.dst_ip, x.dst_qpn) in mine \
                        or (x.dst_ip, x.src_ip, x.src_qpn) in answers:
                    raise ValueError(f"connection {x.src_ip} -> {x.dst_ip} (QPN {x.src_qpn} -> "
                                     f"DestQP {x.dst_qpn}) is already registered by ring "
                                     f"{ring.spec.ring_id}")

    def unregister_ring(self, ring_id: str) -> None:
        self._unregister(self._rings, ring_id, "")

    def counters(self) -> dict[str, Any]:
        with self._lock:
            rings = {rid: self._ring_view(ring) for rid, ring in self._rings.items()}
        return {"target": self.name, "rings": rings, "ports": self._port_view()}

    def _ring_view(self, ring: _Ring) -> dict[str, Any]:
        """The software target's shape (AggregationPipeline.counters) for one ring."""
        now = self._ring_counts(ring.index, ring.spec.world_size)
        base = ring.baseline
        counts = {n: v - base["ring"][n] for n, v in now["ring"].items()}
        conns = [self._connection_view(x, ring.index, x.rank, ring.ports[x.src_ip],
                                       ring.ports[x.dst_ip], cnow, cbase)
                 for x, cnow, cbase in zip(ring.spec.connections, now["conns"], base["conns"])]
        # every emission advances next_emit by one, from 0 at registration
        return {"world_size": ring.spec.world_size, "slots": ring.slots,
                "next_emit": counts["completed"] & PSN_MASK, "counters": counts,
                "connections": conns}



class ShellSession:
    """A Session over p4runtime-shell: connects, pushes the compiled program (which resets
    every table, register and counter of the device), then writes entities one by one."""

    def __init__(self, grpc_addr: str, build: Build, device_id: int = 0,
                 election_id: tuple[int, int] = (0, 1)):
        try:
            import p4runtime_sh.shell as sh
        except ImportError as e:
            raise RuntimeError("the BMv2 target needs p4runtime-shell: pip install "
                               "'netreduce[bmv2]' (see switch/p4/README.md)") from e
        self._sh = sh
        try:
            sh.setup(device_id=device_id, grpc_addr=grpc_addr, election_id=election_id,
                     config=sh.FwdPipeConfig(str(build.p4info), str(build.json)),
                     verbose=False)
        except SystemExit as e:      # p4runtime-shell exits on a failed setup
            raise RuntimeError(f"P4Runtime setup of {grpc_addr} failed (see the log above)") from e

    def _entry(self, e: TableEntry) -> Any:
        te = self._sh.TableEntry(e.table)(action=e.action)
        for name, value in e.match:
            te.match[name] = str(value)
        for name, value in e.params:
            te.action[name] = str(value)
        return te

    def insert(self, entry: TableEntry) -> None:
        self._entry(entry).insert()

    def delete(self, entry: TableEntry) -> None:
        self._entry(entry).delete()

    def insert_group(self, group: McGroup) -> None:
        mg = self._sh.MulticastGroupEntry(group.group_id)
        for port, instance in group.replicas:
            mg.add(port, instance)
        mg.insert()

    def delete_group(self, group_id: int) -> None:
        self._sh.MulticastGroupEntry(group_id).delete()

    def read_counter(self, name: str) -> dict[int, tuple[int, int]]:
        out = {}
        for ce in self._sh.CounterEntry(name).read():
            msg = ce.msg()
            out[msg.index.index] = (msg.data.packet_count, msg.data.byte_count)
        return out

    def close(self) -> None:
        self._sh.teardown()
