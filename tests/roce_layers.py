"""Test helpers: scapy RETH/ImmDt layers, RoCE WRITE frames crafted with scapy, lab rings.

Everything here builds packets with scapy (scapy.contrib.roce BTH and its ICRC), never
with switch.dataplane.packets, so tests check the switch against an independent implementation.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from scapy.compat import raw
from scapy.contrib.roce import BTH
from scapy.fields import IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw, bind_layers

from nr_contract.spec import Connection, RingSpec

WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM = range(6, 12)
RETH_OPS = (WRITE_FIRST, WRITE_ONLY, WRITE_ONLY_IMM)
IMM_OPS = (WRITE_LAST_IMM, WRITE_ONLY_IMM)


class RETH(Packet):
    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dlen", 0)]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        if isinstance(self.underlayer, BTH) and self.underlayer.opcode == WRITE_ONLY_IMM:
            return ImmDt
        return Raw


class ImmDt(Packet):
    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]


for _op in RETH_OPS:
    bind_layers(BTH, RETH, opcode=_op)
bind_layers(BTH, ImmDt, opcode=WRITE_LAST_IMM)


def lab_mac(host: int) -> str:
    return f"02:4e:52:00:00:{host + 1:02x}"


def lab_ip(host: int) -> str:
    return f"10.77.0.{host + 1}"


def lab_port(host: int) -> int:
    """Switch port of lab host I (docs/pipeline.md: port I+1)."""
    return host + 1


def make_ring(n: int, *, ring_id: str = "ring", mtu: int = 256, msg_size: Optional[int] = None,
              window: int = 2, hosts: Optional[Sequence[int]] = None, qpn_base: int = 0x11,
              psn0: Sequence[int] = ()) -> RingSpec:
    """A ring over lab hosts `hosts` (default 0..n-1).

    Rank r sends on QPN qpn_base + 2r and receives on QPN qpn_base + 2r + 1.
    """
    hosts = list(range(n)) if hosts is None else list(hosts)
    psns = list(psn0) or [0x1000 * (r + 1) for r in range(n)]
    conns = tuple(Connection(rank=r, src_ip=lab_ip(hosts[r]), dst_ip=lab_ip(hosts[(r + 1) % n]),
                             src_mac=lab_mac(hosts[r]), dst_mac=lab_mac(hosts[(r + 1) % n]),
                             src_qpn=qpn_base + 2 * r, dst_qpn=qpn_base + 2 * ((r + 1) % n) + 1,
                             psn0=psns[r])
                  for r in range(n))
    return RingSpec(ring_id, n, mtu, msg_size or 4 * mtu, window, conns)


def mac_ports(hosts: int) -> dict[str, int]:
    """The lab's MAC -> switch port table for `hosts` hosts."""
    return {lab_mac(h): lab_port(h) for h in range(hosts)}


def ip_ports(spec: RingSpec) -> dict[str, int]:
    """Each rank's IP -> its lab switch port (what the controller resolves from MACs)."""
    return {c.src_ip: lab_port(int(c.src_ip.rsplit(".", 1)[1]) - 1) for c in spec.connections}


def write_frame(c: Connection, k: int, opcode: int, payload: bytes | np.ndarray, *,
                ackreq: bool = False, reth: tuple[int, int, int] = (0x7F00AA000000, 0x2A, 1024),
                imm: int = 0xC0FFEE, ip_id: int = 0, pad: int = 0, psn: Optional[int] = None,
                udp_sport: Optional[int] = None) -> bytes:
    """Connection c's packet at relative PSN k, as rxe would send it, built by scapy.

    A numpy payload goes on the wire as little-endian int32 (the wire format). RETH/ImmDt are added exactly
    when the opcode carries them.
    """
    data = payload.astype("<i4").tobytes() if isinstance(payload, np.ndarray) else payload
    pkt = (Ether(src=c.src_mac, dst=c.dst_mac)
           / IP(src=c.src_ip, dst=c.dst_ip, id=ip_id, flags="DF", ttl=64)
           / UDP(sport=0xC000 | c.src_qpn & 0x3FFF if udp_sport is None else udp_sport,
                 dport=4791, chksum=0)
           / BTH(opcode=opcode, padcount=pad, pkey=0xFFFF, dqpn=c.dst_qpn, ackreq=int(ackreq),
                 psn=(c.psn0 + k) & 0xFFFFFF if psn is None else psn))
    if opcode in RETH_OPS:
        pkt = pkt / RETH(va=reth[0], rkey=reth[1], dlen=reth[2])
    if opcode in IMM_OPS:
        pkt = pkt / ImmDt(imm=imm)
    return raw(pkt / Raw(data + bytes(pad)))


def icrc_ok(frame: bytes) -> bool:
    """Does the frame's ICRC match the one scapy computes for it?"""
    pkt = Ether(frame)
    wire = pkt[BTH].icrc
    pkt[BTH].icrc = None
    return Ether(raw(pkt))[BTH].icrc == wire


def wrapping_sum(payloads: Sequence[np.ndarray]) -> np.ndarray:
    """Element-wise int32 sum with two's-complement wrap, computed in int64."""
    total = np.sum(np.stack(payloads).astype(np.int64), axis=0)
    return ((total + 2**31) % 2**32 - 2**31).astype(np.int32)
