"""Packets between the switches of a two-tier fabric: a ToR's partial up, the spine's total down.

``Ethernet II (14) | IPv4 (20, no options) | UDP (8, both ports 4792, checksum 0) |
header (16) | payload | CRC32 (4)``. The header, big-endian:

    version u8 (= 1) | kind u8 (1 partial, 2 total) | tor u8 | flags u8 (= 0) |
    ring u32 (`ring_tag` of the ring id) | k u32 (relative PSN, 24-bit) |
    length u16 (payload bytes, a multiple of 4) | reserved u16 (= 0)

The payload is the slot's wrapping int32 sum in wire order (little-endian, as the hosts
send it); the CRC32 (zlib) covers header and payload and is stored little-endian.
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

from switch.packets import (ETH_LEN, ETHERTYPE_IPV4, IPPROTO_UDP, IPV4_LEN, IPV4_VERSION_IHL,
                            PSN_MASK, UDP_LEN, icrcs, ipv4_checksum, mac_bytes, pack_icrc)

PORT = 4792
VERSION = 1
HEADER = struct.Struct("!BBBBIIHH")
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


class Corrupt(ValueError):
    """An inter-switch packet that fails a check: the message says which."""


def is_interswitch(frame: memoryview | bytes) -> bool:
    """IPv4 (no options), UDP, destination port 4792."""
    return (len(frame) >= OFF and frame[12] == 0x08 and frame[13] == 0x00
            and frame[14] == IPV4_VERSION_IHL and frame[23] == IPPROTO_UDP
            and frame[36] == PORT >> 8 and frame[37] == PORT & 0xFF)


@lru_cache(maxsize=256)
def _l2_l3(src: Endpoint, dst: Endpoint, payload_len: int) -> bytes:
    """Ethernet, IPv4 (checksum set, ID 0, DF) and UDP headers of a message of that size."""
    udp_len = UDP_LEN + HEADER.size + payload_len + CRC_LEN
    fields = [mac_bytes(dst.mac), mac_bytes(src.mac), ETHERTYPE_IPV4, IPV4_VERSION_IHL, 0,
              IPV4_LEN + udp_len, 0, 0x4000, 64, IPPROTO_UDP, 0, socket.inet_aton(src.ip),
              socket.inet_aton(dst.ip), PORT, PORT, udp_len, 0]
    raw = _ETH_IP_UDP.pack(*fields)
    fields[10] = ipv4_checksum(raw[ETH_LEN:ETH_LEN + IPV4_LEN])
    return _ETH_IP_UDP.pack(*fields)


def header(kind: Kind, tor: int, ring: int, k: int, payload_len: int) -> bytes:
    return HEADER.pack(VERSION, kind, tor, 0, ring, k & PSN_MASK, payload_len, 0)


def frames(src: Endpoint, kind: Kind, ring: int, k: int, payload: memoryview | bytes,
           to: Sequence[tuple[int, Endpoint]]) -> list[tuple[bytes, bytes]]:
    """Per (tor, dst) of `to`: (headers, CRC) of the message around `payload`.

    The frame is headers ‖ payload ‖ CRC; one CRC pass over the payload serves every
    destination (CRC-32 is affine in its start state, see packets.icrcs).
    """
    heads = [header(kind, tor, ring, k, len(payload)) for tor, _ in to]
    crcs = icrcs(payload, [zlib.crc32(h) for h in heads])
    return [(_l2_l3(src, dst, len(payload)) + h, crc)
            for (_, dst), h, crc in zip(to, heads, crcs)]


def encode(src: Endpoint, dst: Endpoint, kind: Kind, tor: int, ring: int, k: int,
           payload: memoryview | bytes) -> bytes:
    """One whole message frame (tests, tools)."""
    (head, crc), = frames(src, kind, ring, k, payload, [(tor, dst)])
    return head + bytes(payload) + crc


def decode(frame: memoryview) -> Message:
    """The message of an `is_interswitch` frame; Corrupt names the first check it fails."""
    if len(frame) < PAYLOAD_OFF + CRC_LEN:
        raise Corrupt(f"{len(frame)} bytes, shorter than an empty message")
    udp_len = int.from_bytes(frame[38:40], "big")
    end = OFF - UDP_LEN + udp_len
    if end > len(frame) or udp_len < UDP_LEN + HEADER.size + CRC_LEN:
        raise Corrupt(f"UDP length {udp_len} does not fit the {len(frame)}-byte frame")
    version, kind, tor, flags, ring, k, length, reserved = HEADER.unpack_from(frame, OFF)
    if pack_icrc(zlib.crc32(frame[OFF:end - CRC_LEN])) != frame[end - CRC_LEN:end]:
        raise Corrupt("CRC32 mismatch")
    if version != VERSION or flags or reserved or k > PSN_MASK:
        raise Corrupt(f"version {version}, flags {flags}, reserved {reserved}, k {k}")
    if kind not in (Kind.PARTIAL, Kind.TOTAL):
        raise Corrupt(f"kind {kind}")
    if length != end - CRC_LEN - PAYLOAD_OFF or length & 3:
        raise Corrupt(f"length {length} for a {end - CRC_LEN - PAYLOAD_OFF}-byte payload")
    return Message(Kind(kind), tor, ring, k, frame[PAYLOAD_OFF:PAYLOAD_OFF + length])
