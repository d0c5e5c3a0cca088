"""RoCEv2 over IPv4, by hand: header offsets, RC opcode tables, a fast parse, the ICRC.

The one place of the data path that knows header layouts. A RoCEv2 frame is
``Ethernet II (14) | IPv4 (20, no options) | UDP (8, dport 4791) | BTH (12) | [RETH 16]
[ImmDt 4] or [AETH 4] | payload | pad (0-3) | ICRC (4)``, every field big-endian except
the ICRC, which is zlib's CRC-32 stored little-endian (see docs/pipeline.md, "ICRC"), and
the payload's int32 words, little-endian (the wire format of netreduce.algorithms.switch).
The checks a packet must pass before the switch adds it (docs/pipeline.md rules 3 and 6:
`ipv4_header_ok`, `is_fragment`, `icrc_valid`) live here too.
Invariant: nothing here copies a payload; per packet it allocates only the tuples and ints
a parse or check returns and the masked 48-byte header copy an ICRC state needs.
"""
from __future__ import annotations

import socket
import struct
import zlib
from enum import IntEnum
from functools import lru_cache
from typing import Optional, Sequence

from nr_contract.spec import PSN_MASK

ETH_LEN = 14
ETHERTYPE_IPV4 = 0x0800
IPV4_LEN = 20
IPV4_VERSION_IHL = 0x45          # version 4, 5 words: the only IPv4 header RoCE hosts send
IPPROTO_UDP = 17
UDP_LEN = 8
ROCE_UDP_PORT = 4791
BTH_LEN = 12
RETH_LEN = 16
IMMDT_LEN = 4
AETH_LEN = 4
ICRC_LEN = 4

IP_OFF = ETH_LEN                  # 14
UDP_OFF = IP_OFF + IPV4_LEN       # 34
BTH_OFF = UDP_OFF + UDP_LEN       # 42
EXT_OFF = BTH_OFF + BTH_LEN       # 54: first byte after the BTH
PSN_OFF = BTH_OFF + 9             # 51: the BTH's 24-bit PSN
MIN_FRAME = EXT_OFF + ICRC_LEN    # the shortest frame that can be RoCEv2
UDP_OVERHEAD = UDP_LEN + BTH_LEN + ICRC_LEN   # UDP length minus ext. headers, payload, pad



class Op(IntEnum):
    """BTH opcodes of the RC transport (IBTA Vol. 1 Table 38)."""

    SEND_FIRST = 0x00
    SEND_MIDDLE = 0x01
    SEND_LAST = 0x02
    SEND_LAST_WITH_IMM = 0x03
    SEND_ONLY = 0x04
    SEND_ONLY_WITH_IMM = 0x05
    WRITE_FIRST = 0x06
    WRITE_MIDDLE = 0x07
    WRITE_LAST = 0x08
    WRITE_LAST_WITH_IMM = 0x09
    WRITE_ONLY = 0x0A
    WRITE_ONLY_WITH_IMM = 0x0B
    READ_REQUEST = 0x0C
    READ_RESPONSE_FIRST = 0x0D
    READ_RESPONSE_MIDDLE = 0x0E
    READ_RESPONSE_LAST = 0x0F
    READ_RESPONSE_ONLY = 0x10
    ACKNOWLEDGE = 0x11


WRITE_OPCODES = frozenset(range(Op.WRITE_FIRST, Op.WRITE_ONLY_WITH_IMM + 1))
RETH_OPCODES = frozenset({Op.WRITE_FIRST, Op.WRITE_ONLY, Op.WRITE_ONLY_WITH_IMM, Op.READ_REQUEST})
IMMDT_OPCODES = frozenset({Op.SEND_LAST_WITH_IMM, Op.SEND_ONLY_WITH_IMM,
                           Op.WRITE_LAST_WITH_IMM, Op.WRITE_ONLY_WITH_IMM})
AETH_OPCODES = frozenset({Op.READ_RESPONSE_FIRST, Op.READ_RESPONSE_LAST,
                          Op.READ_RESPONSE_ONLY, Op.ACKNOWLEDGE})
FIRST_OPCODES = frozenset({Op.SEND_FIRST, Op.WRITE_FIRST, Op.READ_RESPONSE_FIRST})
MIDDLE_OPCODES = frozenset({Op.SEND_MIDDLE, Op.WRITE_MIDDLE, Op.READ_RESPONSE_MIDDLE})
LAST_OPCODES = frozenset({Op.SEND_LAST, Op.SEND_LAST_WITH_IMM, Op.WRITE_LAST,
                          Op.WRITE_LAST_WITH_IMM, Op.READ_RESPONSE_LAST})
ONLY_OPCODES = frozenset({Op.SEND_ONLY, Op.SEND_ONLY_WITH_IMM, Op.WRITE_ONLY,
                          Op.WRITE_ONLY_WITH_IMM, Op.READ_RESPONSE_ONLY})
#: WRITE opcodes that open a message (and carry its RETH).
MESSAGE_START_WRITES = WRITE_OPCODES & (FIRST_OPCODES | ONLY_OPCODES)
#: WRITE opcodes of a one-packet message (the only ones that may carry no payload).
ONLY_WRITES = WRITE_OPCODES & ONLY_OPCODES

#: Extension-header bytes between BTH and payload, indexed by opcode (atomics not modelled).
EXT_LEN: tuple[int, ...] = tuple(
    RETH_LEN * (op in RETH_OPCODES) + IMMDT_LEN * (op in IMMDT_OPCODES)
    + AETH_LEN * (op in AETH_OPCODES) for op in range(256))

# Bytes 12..53 of a frame: ethertype, version/IHL, flags|fragment offset, protocol,
# src+dst address (one u64), UDP dport, UDP length, opcode, SE|M|PadCnt|TVer,
# (FECN byte|DestQP), (AckReq byte|PSN).
_HDR = struct.Struct("!HB5xHxB2xQ2xHH2xBB2xII")
_RETH = struct.Struct("!QII")
_IMMDT = struct.Struct("!I")
_BTH = struct.Struct("!BBHII")
_UDP = struct.Struct("!HHHH")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
pack_icrc = struct.Struct("<I").pack
_unpack_icrc = struct.Struct("<I").unpack_from
_CRC_MASK32 = 0xFFFFFFFF


def _ones_at(offsets: list[int]) -> int:
    """An int over frame bytes IP_OFF-8..EXT_OFF-1 with 0xFF at the given frame offsets."""
    return sum(0xFF << 8 * (EXT_OFF - 1 - off) for off in offsets)


_ICRC_MASK = _ones_at(list(range(IP_OFF - 8, IP_OFF))                 # pseudo-LRH
                      + [IP_OFF + 1, IP_OFF + 8, IP_OFF + 10, IP_OFF + 11]  # TOS, TTL, csum
                      + [UDP_OFF + 6, UDP_OFF + 7, BTH_OFF + 4])      # UDP csum, FECN byte

UDP_CSUM_OFF = UDP_OFF + 6        # the UDP checksum: a rewritten packet gets 0 there
IPV4_MF = 0x2000                  # in the flags|fragment offset word: more fragments
IPV4_FRAG_OFFSET = 0x1FFF

#: (connection key, UDP length, opcode, PadCnt, PSN, IPv4 flags|fragment offset), see `parse`.
RoceFields = tuple[int, int, int, int, int, int]


def conn_key(src_ip: str, dst_ip: str, dest_qp: int) -> int:
    """The connection key ⟨SrcIP, DstIP, DestQP⟩ as the int `parse` computes from a frame."""
    addrs = int.from_bytes(socket.inet_aton(src_ip) + socket.inet_aton(dst_ip), "big")
    return addrs << 24 | dest_qp & PSN_MASK


def parse(frame: memoryview | bytes) -> Optional[RoceFields]:
    """The fields the pipeline needs, or None when the frame is not IPv4/UDP 4791.

    Returns (key, udp_len, opcode, pad, psn, frag); `key` equals `conn_key` of the frame's
    addresses and DestQP, `frag` is the IPv4 flags|fragment offset word (`is_fragment`).
    Lengths and checksums are not checked here.
    """
    if len(frame) < MIN_FRAME:
        return None
    eth, vihl, frag, proto, addrs, dport, udp_len, opcode, flags, fecn_dqp, ack_psn = \
        _HDR.unpack_from(frame, 12)
    if eth != ETHERTYPE_IPV4 or vihl != IPV4_VERSION_IHL or proto != IPPROTO_UDP \
            or dport != ROCE_UDP_PORT:
        return None
    return (addrs << 24 | fecn_dqp & PSN_MASK, udp_len, opcode, flags >> 4 & 3,
            ack_psn & PSN_MASK, frag)


def payload_len(udp_len: int, opcode: int, pad: int) -> int:
    """The payload bytes a RoCE packet's UDP length leaves for opcode's headers and pad."""
    return udp_len - UDP_OVERHEAD - EXT_LEN[opcode] - pad


def is_fragment(frag: int) -> bool:
    """Is a packet whose IPv4 flags|fragment offset word is `frag` a fragment (MF or offset)?"""
    return bool(frag & (IPV4_MF | IPV4_FRAG_OFFSET))


def ipv4_header_ok(frame: memoryview | bytes) -> bool:
    """Is the IPv4 checksum of the frame's (IHL 5) header right?

    The one's-complement sum of a valid header's 16-bit words is 0xFFFF, i.e. their sum is
    0 mod 0xFFFF, and so is the header read as one big-endian integer (2^16 = 1 mod 0xFFFF).
    """
    return int.from_bytes(frame[IP_OFF:UDP_OFF], "big") % 0xFFFF == 0


def reth(frame: memoryview | bytes) -> tuple[int, int, int]:
    """(VA, R_Key, DMA length) of a frame whose opcode carries a RETH."""
    return _RETH.unpack_from(frame, EXT_OFF)


def icrc_state(frame: memoryview | bytes, end: int) -> int:
    """The running CRC-32 of the ICRC over frame[IP_OFF:end] (end >= EXT_OFF).

    Continue it with zlib.crc32(more, state); `pack_icrc(state)` is the wire ICRC once
    every byte up to the ICRC is in. The 8 bytes before the IPv4 header stand in for the
    pseudo-LRH of ones; IPv4 TOS, TTL, checksum, UDP checksum and BTH byte 4 count as ones.
    """
    masked = (int.from_bytes(frame[IP_OFF - 8:EXT_OFF], "big") | _ICRC_MASK).to_bytes(
        EXT_OFF - IP_OFF + 8, "big")
    return zlib.crc32(frame[EXT_OFF:end], zlib.crc32(masked))


def icrc_valid(frame: memoryview | bytes, hdr_end: int, end: int, state: int) -> bool:
    """Is frame[end:end+4] the ICRC of a frame whose bytes up to hdr_end have ICRC state
    `state` and whose covered bytes end at `end` (pad 0)?"""
    return zlib.crc32(frame[hdr_end:end], state) == _unpack_icrc(frame, end)[0]


def icrc_after(state: int, tail: memoryview | bytes) -> bytes:
    """The wire ICRC of a frame whose bytes up to `tail` have ICRC state `state`."""
    return pack_icrc(zlib.crc32(tail, state))


def icrc(frame_without_icrc: memoryview | bytes) -> bytes:
    """The 4 ICRC bytes of a RoCEv2 frame given without them."""
    return icrc_after(icrc_state(frame_without_icrc, EXT_OFF), frame_without_icrc[EXT_OFF:])


@lru_cache(maxsize=16)
def _crc_shift_tables(length: int) -> tuple[list[int], ...]:
    """Byte tables of the linear map A: crc32(d, a) ^ crc32(d, b) == A(a ^ b), len(d) = length."""
    zeros = bytes(length)
    basis = [~zlib.crc32(zeros, ~(1 << b) & _CRC_MASK32) & _CRC_MASK32 for b in range(32)]
    tables = []
    for j in range(4):
        table = [0] * 256
        for v in range(1, 256):
            low = v & -v
            table[v] = table[v ^ low] ^ basis[8 * j + low.bit_length() - 1]
        tables.append(table)
    return tuple(tables)


def icrcs(payload: memoryview | bytes, states: Sequence[int]) -> list[bytes]:
    """The wire ICRCs of the same `payload` behind headers whose `icrc_state`s are given.

    One CRC pass over the payload serves all headers (CRC-32 is affine in its start state).
    """
    t0, t1, t2, t3 = _crc_shift_tables(len(payload))
    s0 = states[0]
    c0 = zlib.crc32(payload, s0)
    out = []
    for s in states:
        x = s ^ s0
        out.append(pack_icrc(c0 ^ t0[x & 255] ^ t1[x >> 8 & 255] ^ t2[x >> 16 & 255]
                             ^ t3[x >> 24]))
    return out


def ipv4_checksum(header: bytes | memoryview) -> int:
    """Internet checksum of an IPv4 header whose checksum field is zero (or: 0 if valid)."""
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def mac_bytes(mac: str) -> bytes:
    """b'\\x02NR\\x00\\x00\\x01' for '02:4e:52:00:00:01'."""
    return bytes.fromhex(mac.replace(":", ""))


def build_frame(*, dst_mac: str, src_mac: str, src_ip: str, dst_ip: str, dest_qp: int,
                psn: int, opcode: int, payload: bytes, ackreq: bool = False,
                reth_fields: Optional[tuple[int, int, int]] = None,
                imm: Optional[int] = None, pad: int = 0, src_port: int = 0xC000,
                ip_id: int = 0, ttl: int = 64) -> bytes:
    """A complete RoCEv2 frame as rxe sends it: UDP checksum 0, IPv4 checksum and ICRC set.

    `reth_fields` and `imm` must be given exactly when the opcode carries them; `pad` bytes
    of zeros follow the payload (PadCnt = pad).
    """
    if (reth_fields is not None) != (opcode in RETH_OPCODES) \
            or (imm is not None) != (opcode in IMMDT_OPCODES):
        raise ValueError(f"opcode {opcode:#x}: RETH/ImmDt given {reth_fields}/{imm}")
    ext = (_RETH.pack(*reth_fields) if reth_fields is not None else b"") \
        + (_IMMDT.pack(imm) if imm is not None else b"")
    bth = _BTH.pack(opcode, (pad & 3) << 4, 0xFFFF, dest_qp & PSN_MASK,
                    ackreq << 31 | psn & PSN_MASK)
    body = bth + ext + payload + bytes(pad)
    udp_len = UDP_LEN + len(body) + ICRC_LEN
    udp = _UDP.pack(src_port, ROCE_UDP_PORT, udp_len, 0)
    ip = _IPV4.pack(IPV4_VERSION_IHL, 0, IPV4_LEN + udp_len, ip_id, 0x4000, ttl, IPPROTO_UDP,
                    0, socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
    ip = ip[:10] + struct.pack("!H", ipv4_checksum(ip)) + ip[12:]
    frame = mac_bytes(dst_mac) + mac_bytes(src_mac) + struct.pack("!H", ETHERTYPE_IPV4) \
        + ip + udp + body
    return frame + icrc(frame)
