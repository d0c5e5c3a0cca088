"""Packets between the switches of a two-tier fabric: a ToR's partial up, the spine's total down.

``Ethernet II (14) | IPv4 (20, no options) | UDP (8, both ports 4792, checksum 0) |
header (16) | payload | carried RoCE headers | CRC32 (4)``. The header, big-endian:

    version u8 (= 1) | kind u8 (1 partial, 2 total) | tor u8 | carried u8 |
    ring u32 (`ring_tag` of the ring id) | k u32 (relative PSN, 24-bit) |
    length u16 (payload bytes, a multiple of 4) | reserved u16 (= 0)

The payload is the slot's wrapping int32 sum in wire order (little-endian, as the hosts
send it). `carried` entries follow it, each ``rank u16 | hlen u16 | hlen bytes``: the
RoCE headers (Ethernet up to the payload) of rank r's packet at k for connections that
leave the rack (in a partial) or enter it (in a total), so that the responder's ToR builds
their results itself. The CRC32 (zlib) covers everything from the header on and is stored
little-endian.
Invariant: `decode` returns a message only when every field above checks out, so a
corrupted packet is refused (`Corrupt`, counted by the receiver) and never added.
"""
from __future__ import annotations

import socket
import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache
from typing import Sequence

from nr_contract.spec import PSN_MASK
from switch.dataplane.packets import (ETH_LEN, ETHERTYPE_IPV4, IPPROTO_UDP, IPV4_LEN,
                                      IPV4_VERSION_IHL, UDP_LEN, ipv4_checksum, mac_bytes,
                                      pack_icrc)

PORT = 4792
VERSION = 1
HEADER = struct.Struct("!BBBBIIHH")
_CARRIED = struct.Struct("!HH")
OFF = ETH_LEN + IPV4_LEN + UDP_LEN          # 42: first byte of the header
PAYLOAD_OFF = OFF + HEADER.size             # 58
CRC_LEN = 4
_ETH_IP_UDP = struct.Struct("!6s6sHBBHHHBBH4s4sHHHH")


class Kind(IntEnum):
    PARTIAL = 1      # ToR -> spine: the sum of the rack's contributions to slot k
    TOTAL = 2        # spine -> ToR: the sum of every rack's partial for slot k


def ring_tag(ring_id: str) -> int:
    """The 32-bit ring field of the ring `ring_id` (the controller refuses collisions)."""
    return zlib.crc32(ring_id.encode())


@dataclass(frozen=True)
class Endpoint:
    """A switch's own addresses on the inter-switch links."""

    mac: str
    ip: str


@dataclass(frozen=True)
class Message:
    kind: Kind
    tor: int
    ring: int
    k: int
    payload: memoryview      # valid as long as the frame it was decoded from
    carried: list[tuple[int, memoryview]]   # (rank, RoCE header), likewise


class Corrupt(ValueError):
    """An inter-switch packet that fails a check: the message says which."""


def is_interswitch(frame: memoryview | bytes) -> bool:
    """IPv4 (no options), UDP, destination port 4792."""
    return (len(frame) >= OFF and frame[12] == 0x08 and frame[13] == 0x00
            and frame[14] == IPV4_VERSION_IHL and frame[23] == IPPROTO_UDP
            and frame[36] == PORT >> 8 and frame[37] == PORT & 0xFF)


@lru_cache(maxsize=256)
def _l2_l3(src: Endpoint, dst: Endpoint, body_len: int) -> bytes:
    """Ethernet, IPv4 (checksum set, ID 0, DF) and UDP headers of a message of that size."""
    udp_len = UDP_LEN + HEADER.size + body_len + CRC_LEN
    fields = [mac_bytes(dst.mac), mac_bytes(src.mac), ETHERTYPE_IPV4, IPV4_VERSION_IHL, 0,
              IPV4_LEN + udp_len, 0, 0x4000, 64, IPPROTO_UDP, 0, socket.inet_aton(src.ip),
              socket.inet_aton(dst.ip), PORT, PORT, udp_len, 0]
    raw = _ETH_IP_UDP.pack(*fields)
    fields[10] = ipv4_checksum(raw[ETH_LEN:ETH_LEN + IPV4_LEN])
    return _ETH_IP_UDP.pack(*fields)


Carried = Sequence[tuple[int, bytes]]      # (rank, RoCE header of its packet at k)


def frame_parts(src: Endpoint, dst: Endpoint, kind: Kind, tor: int, ring: int, k: int,
                payload: memoryview | bytes, carried: Carried = ()) -> tuple[bytes, bytes]:
    """(head, tail) of the message: the frame is head ‖ payload ‖ tail."""
    extra = b"".join(_CARRIED.pack(rank, len(h)) + h for rank, h in carried)
    head = HEADER.pack(VERSION, kind, tor, len(carried), ring, k & PSN_MASK, len(payload), 0)
    crc = zlib.crc32(extra, zlib.crc32(payload, zlib.crc32(head)))
    return _l2_l3(src, dst, len(payload) + len(extra)) + head, extra + pack_icrc(crc)


def encode(src: Endpoint, dst: Endpoint, kind: Kind, tor: int, ring: int, k: int,
           payload: memoryview | bytes, carried: Carried = ()) -> bytes:
    """One whole message frame (tests, tools)."""
    head, tail = frame_parts(src, dst, kind, tor, ring, k, payload, carried)
    return head + bytes(payload) + tail


def decode(frame: memoryview) -> Message:
    """The message of an `is_interswitch` frame; Corrupt names the first check it fails."""
    if len(frame) < PAYLOAD_OFF + CRC_LEN:
        raise Corrupt(f"{len(frame)} bytes, shorter than an empty message")
    udp_len = int.from_bytes(frame[38:40], "big")
    end = OFF - UDP_LEN + udp_len
    if end > len(frame) or udp_len < UDP_LEN + HEADER.size + CRC_LEN:
        raise Corrupt(f"UDP length {udp_len} does not fit the {len(frame)}-byte frame")
    version, kind, tor, count, ring, k, length, reserved = HEADER.unpack_from(frame, OFF)
    body_end = end - CRC_LEN
    if pack_icrc(zlib.crc32(frame[OFF:body_end])) != frame[body_end:end]:
        raise Corrupt("CRC32 mismatch")
    if version != VERSION or reserved or k > PSN_MASK:
        raise Corrupt(f"version {version}, reserved {reserved}, k {k}")
    if kind not in (Kind.PARTIAL, Kind.TOTAL):
        raise Corrupt(f"kind {kind}")
    at = PAYLOAD_OFF + length
    if at > body_end or length & 3:
        raise Corrupt(f"length {length} for a {body_end - PAYLOAD_OFF}-byte body")
    carried = []
    for _ in range(count):
        if at + _CARRIED.size > body_end:
            raise Corrupt(f"{count} carried headers do not fit")
        rank, hlen = _CARRIED.unpack_from(frame, at)
        at += _CARRIED.size + hlen
        if at > body_end:
            raise Corrupt(f"carried header of rank {rank} ({hlen} bytes) does not fit")
        carried.append((rank, frame[at - hlen:at]))
    if at != body_end:
        raise Corrupt(f"{body_end - at} bytes after the carried headers")
    return Message(Kind(kind), tor, ring, k, frame[PAYLOAD_OFF:PAYLOAD_OFF + length], carried)
