"""Checks of the controller's requests, value by value, before anything reaches a target.

Every check raises `InvalidArgument` whose message starts with the field's path, e.g.
`spec.connections[2].psn0: 16777216 is not a 24-bit value`. Invariant: a RingSpec that
`ring_spec` returns has every field of the right type and in range, rank r's connection at
index r, connection r ending where connection r+1 starts, and `slots` / `lease_ms` that the
target's limits allow; what only a target can judge (ports, free connections) is left to it.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Iterator

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from nr_contract import control_pb2 as pb
from nr_contract.spec import MAX_RACKS, RXE_MAX_INFLIGHT, Connection, RingSpec, required_slots

MAX_RING_ID = 128
MAX_LEASE_MS = 3_600_000
MIN_LEASE_MS = 100
U24 = 0xFFFFFF
_RING_ID = re.compile(r"[\x20-\x7e]{1,%d}" % MAX_RING_ID)
_MAC = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


class InvalidArgument(ValueError):
    """A malformed request value; the message names the field."""


def parse(message_type: type[Message], data: bytes) -> Any:
    """Decode a request, refusing bytes that are no such message or that the decoder
    would bend into one: a field the proto does not declare, a value of the wrong wire type
    (a float where an integer belongs), an integer beyond its field's 32 bits, a singular
    field given twice (each refusal names the field)."""
    try:
        msg = message_type.FromString(data)
    except (DecodeError, UnicodeDecodeError, ValueError, RuntimeError) as e:
        raise InvalidArgument(f"request: not a valid {message_type.DESCRIPTOR.name}: "
                              f"{type(e).__name__}: {e}") from None
    try:
        _check_wire(data, message_type.DESCRIPTOR, "")
    except IndexError:
        raise InvalidArgument(f"request: not a valid {message_type.DESCRIPTOR.name}: "
                              "truncated") from None
    return msg


def _wire_fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each top-level field of a serialized message:
    the integer of a varint, the bytes of anything else."""
    i, n = 0, len(data)

    def varint() -> int:
        nonlocal i
        value = shift = 0
        while True:
            b = data[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    while i < n:
        tag = varint()
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            yield number, wire, varint()
            continue
        if wire == 2:
            size = varint()
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:                          # groups: never valid in proto3
            yield number, wire, b""
            return
        if i + size > n:
            raise IndexError("truncated")
        yield number, wire, data[i:i + size]
        i += size


def _check_wire(data: bytes, descriptor: Any, path: str) -> None:
    fields = descriptor.fields_by_number
    seen: dict[int, int] = {}
    for number, wire, value in _wire_fields(data):
        field = fields.get(number)
        if field is None:
            raise InvalidArgument(f"{path or descriptor.name}: field number {number} is not "
                                  f"part of {descriptor.name}")
        name = f"{path + '.' if path else ''}{field.name}"
        index = seen[number] = seen.get(number, -1) + 1
        if wire != _wire_type(field):
            raise InvalidArgument(f"{name}: a value of the wrong type (wire type {wire}) "
                                  f"where {_type_name(field)} belongs")
        repeated = _repeated(field)
        if index and not repeated:
            raise InvalidArgument(f"{name}: given more than once")
        if isinstance(value, int) and value >> _BITS.get(field.type, 64):
            raise InvalidArgument(f"{name}: {value} is not {_type_name(field)}")
        if field.type == field.TYPE_MESSAGE and not field.message_type.GetOptions().map_entry:
            _check_wire(value, field.message_type, f"{name}[{index}]" if repeated else name)


def _repeated(field: Any) -> bool:
    """protobuf >= 7 has only `is_repeated`, protobuf 3.20 only `label`."""
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return field.label == field.LABEL_REPEATED


def _wire_type(field: Any) -> int:
    """The wire type a field is serialized with: 0 varint, 1 fixed64, 2 length-delimited
    (also packed repeated scalars), 5 fixed32."""
    if field.type in (field.TYPE_STRING, field.TYPE_BYTES, field.TYPE_MESSAGE) \
            or _repeated(field):
        return 2
    if field.type in (field.TYPE_DOUBLE, field.TYPE_FIXED64, field.TYPE_SFIXED64):
        return 1
    if field.type in (field.TYPE_FLOAT, field.TYPE_FIXED32, field.TYPE_SFIXED32):
        return 5
    return 0


_BITS = {FieldDescriptor.TYPE_BOOL: 1, FieldDescriptor.TYPE_UINT32: 32}   # bits a varint may use


def _type_name(field: Any) -> str:
    return {field.TYPE_UINT32: "an unsigned 32-bit integer",
            field.TYPE_UINT64: "an unsigned 64-bit integer", field.TYPE_BOOL: "a bool",
            field.TYPE_STRING: "a string", field.TYPE_MESSAGE: "a message"
            }.get(field.type, f"type {field.type}")


def ring_id(value: str, field: str = "ring_id") -> str:
    if not _RING_ID.fullmatch(value):
        raise InvalidArgument(f"{field}: {value[:MAX_RING_ID + 8]!r} is not 1..{MAX_RING_ID} "
                              "printable ASCII characters")
    return value


def _ipv4(value: str, field: str) -> str:
    try:
        addr = ipaddress.IPv4Address(value)
    except ValueError:
        raise InvalidArgument(f"{field}: {value[:64]!r} is not an IPv4 address") from None
    if addr.is_multicast or addr.is_unspecified or addr == _BROADCAST:
        raise InvalidArgument(f"{field}: {value} is not a unicast IPv4 address")
    return value


def _mac(value: str, field: str) -> str:
    if not _MAC.fullmatch(value):
        raise InvalidArgument(f"{field}: {value[:64]!r} is not a MAC address "
                              "(xx:xx:xx:xx:xx:xx)")
    if int(value[:2], 16) & 1:
        raise InvalidArgument(f"{field}: {value} is a multicast MAC address")
    return value.lower()


def _u24(value: int, field: str) -> int:
    if value > U24:
        raise InvalidArgument(f"{field}: {value} is not a 24-bit value")
    return value


@dataclass(frozen=True)
class Registration:
    """A validated RegisterRing request: the spec, its slots, the lease it asks for, and
    (from a fabric's controller only) every rank's rack, () for a single switch."""

    spec: RingSpec
    slots: int
    lease_ms: int
    racks: tuple[int, ...] = ()


def registration(req: pb.RegisterRingRequest, limits: dict[str, Any], default_slots: int,
                 default_lease_ms: int) -> Registration:
    """Check every field of `req` against the proto's rules and the target's `limits`
    (path_mtus, max_slots, max_ranks); 0 slots: the default or, when the ring needs more, its
    `required_slots` (a max_slots refusal then names it); 0 lease: the default."""
    if not req.HasField("spec"):
        raise InvalidArgument("spec: missing")
    spec = ring_spec(req.spec, limits)
    need = required_slots(spec)
    slots = req.slots or max(default_slots, need)   # 0: the default, grown to what the ring needs
    if slots & (slots - 1) or slots > limits["max_slots"]:
        raise InvalidArgument(f"slots: {slots} is not a power of two <= {limits['max_slots']}")
    if slots < need:
        raise InvalidArgument(f"slots: {slots} < {need} (2 x the packets one connection can "
                              f"have in flight: window {spec.window} x "
                              f"{spec.window_packets // spec.window} packets per message, "
                              f"capped at rxe's {RXE_MAX_INFLIGHT}, rounded up to a power of "
                              "two)")
    lease_ms = req.lease_ms or default_lease_ms
    if not MIN_LEASE_MS <= lease_ms <= MAX_LEASE_MS:
        raise InvalidArgument(f"lease_ms: {lease_ms} is not in {MIN_LEASE_MS}..{MAX_LEASE_MS}")
    racks = tuple(req.racks)
    if racks and len(racks) != spec.world_size:
        raise InvalidArgument(f"racks: {len(racks)} entries for spec.world_size "
                              f"{spec.world_size} (one per rank, or none)")
    for rank, rack in enumerate(racks):
        if rack >= MAX_RACKS:
            raise InvalidArgument(f"racks[{rank}]: ToR id {rack} >= {MAX_RACKS}")
    return Registration(spec, slots, lease_ms, racks)


def ring_spec(m: pb.RingSpec, limits: dict[str, Any]) -> RingSpec:
    rid = ring_id(m.ring_id, "spec.ring_id")
    n = m.world_size
    if not 2 <= n <= limits["max_ranks"]:
        raise InvalidArgument(f"spec.world_size: {n} ranks, this switch aggregates "
                              f"2..{limits['max_ranks']}")
    if len(m.connections) != n:
        raise InvalidArgument(f"spec.connections: {len(m.connections)} connections for "
                              f"spec.world_size {n} (one per rank)")
    if m.mtu not in limits["path_mtus"]:
        raise InvalidArgument(f"spec.mtu: path MTU {m.mtu} is not one of "
                              f"{tuple(limits['path_mtus'])}")
    if m.msg_size == 0 or m.msg_size % m.mtu:
        raise InvalidArgument(f"spec.msg_size: {m.msg_size} is not a positive multiple of "
                              f"spec.mtu {m.mtu}")
    if m.window == 0:
        raise InvalidArgument("spec.window: 0 messages (at least 1)")
    conns = []
    for r, c in enumerate(m.connections):
        f = f"spec.connections[{r}]"
        if c.rank != r:
            raise InvalidArgument(f"{f}.rank: {c.rank}, but connection {r} is rank {r}'s")
        conns.append(Connection(rank=r, src_ip=_ipv4(c.src_ip, f"{f}.src_ip"),
                                dst_ip=_ipv4(c.dst_ip, f"{f}.dst_ip"),
                                src_mac=_mac(c.src_mac, f"{f}.src_mac"),
                                dst_mac=_mac(c.dst_mac, f"{f}.dst_mac"),
                                src_qpn=_u24(c.src_qpn, f"{f}.src_qpn"),
                                dst_qpn=_u24(c.dst_qpn, f"{f}.dst_qpn"),
                                psn0=_u24(c.psn0, f"{f}.psn0")))
    for r, c in enumerate(conns):
        nxt = conns[(r + 1) % n]
        for end in ("ip", "mac"):
            if getattr(c, f"dst_{end}") != getattr(nxt, f"src_{end}"):
                raise InvalidArgument(
                    f"spec.connections[{r}].dst_{end}: {getattr(c, f'dst_{end}')} is not "
                    f"spec.connections[{(r + 1) % n}].src_{end} {getattr(nxt, f'src_{end}')} "
                    "(connection r goes from rank r to rank r+1)")
    keys: dict[tuple[str, str, int], int] = {}
    for r, c in enumerate(conns):
        other = keys.setdefault((c.src_ip, c.dst_ip, c.dst_qpn), r)
        if other != r:
            raise InvalidArgument(f"spec.connections[{r}]: same <src_ip, dst_ip, dst_qpn> as "
                                  f"spec.connections[{other}]")
    return RingSpec(ring_id=rid, world_size=n, mtu=m.mtu, msg_size=m.msg_size,
                    window=m.window, connections=tuple(conns))
