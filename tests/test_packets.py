"""switch.dataplane.packets against scapy: the ICRC on scapy's known vectors, parse and build of frames."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from scapy.compat import raw
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw
from scapy.utils import import_hexcap

from switch.dataplane import packets as P
from tests.roce_layers import IMM_OPS, RETH_OPS, icrc_ok, make_ring, write_frame


def scapy_rc_vector() -> bytes:
    """scapy test/contrib/roce.uts 'RoCE layer': a UC SEND_ONLY with ICRC 0x78f353f3."""
    pkt = (Ether(dst="24:8a:07:a8:fa:22", src="24:8a:07:a8:fa:22")
           / IP(version=4, ihl=5, tos=0x1, id=1144, flags="DF", frag=0, ttl=64,
                src="192.168.0.7", dst="192.168.0.7", len=64)
           / UDP(sport=49152, dport=4791, len=44)
           / BTH(opcode="UC_SEND_ONLY", migreq=1, padcount=2, pkey=0xFFFF, dqpn=211,
                 psn=13571856)
           / Raw(b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00"))
    return pkt.build()


def test_icrc_of_scapy_uc_vector() -> None:
    frame = scapy_rc_vector()
    pkt = Ether(frame + b"\x00" * 4)           # the .uts adds an Ethernet trailer
    assert pkt[IP].chksum == 0xB4D5 and pkt[UDP].chksum == 0xACA2   # as the .uts asserts
    assert pkt[BTH].icrc == 0x78F353F3
    assert P.icrc(frame[:-4]) == bytes.fromhex("78f353f3")
    assert frame[-4:] == bytes.fromhex("78f353f3")


def test_icrc_of_connectx4_cnp_capture() -> None:
    """scapy's ConnectX-4 Lx CNP capture: a real NIC's ICRC, 0x82fd002a."""
    frame = raw(Ether(import_hexcap(
        "0x0000:  e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2\n"
        "0x0010:  003c 718c 4000 4011 9161 0a00 1101 0a00\n"
        "0x0020:  1201 0000 12b7 0028 0000 8100 ffff 4000\n"
        "0x0030:  0118 0000 0000 0000 0000 0000 0000 0000\n"
        "0x0040:  0000 0000 0000 82fd 002a\n")))
    assert P.icrc(frame[:-4]) == bytes.fromhex("82fd002a")


def test_icrc_ignores_masked_fields_only() -> None:
    frame = bytearray(write_frame(make_ring(2).connections[0], 3, 7, bytes(range(256))))
    want = P.icrc(frame[:-4])
    for off in (15, 22, 24, 25, 40, 41, 46, 0, 6, 12, 13):   # TOS, TTL, csums, FECN, Ethernet
        frame[off] ^= 0x5A
    assert P.icrc(frame[:-4]) == want
    for off in (18, 26, 36, 38, 42, 43, 47, 50, 53, 60):     # ID, addr, ports, len, BTH, payload
        changed = bytearray(frame)
        changed[off] ^= 0x01
        assert P.icrc(changed[:-4]) != want, off


@pytest.mark.parametrize("opcode", range(6, 12))
def test_build_frame_matches_scapy(opcode: int) -> None:
    c = make_ring(3).connections[2]
    payload = np.arange(-32, 32, dtype=np.int32)
    want = write_frame(c, 9, opcode, payload, ackreq=True, ip_id=77)
    got = P.build_frame(dst_mac=c.dst_mac, src_mac=c.src_mac, src_ip=c.src_ip, dst_ip=c.dst_ip,
                        dest_qp=c.dst_qpn, psn=c.psn0 + 9, opcode=opcode, ackreq=True,
                        payload=payload.astype("<i4").tobytes(), ip_id=77,
                        src_port=0xC000 | c.src_qpn,
                        reth_fields=(0x7F00AA000000, 0x2A, 1024) if opcode in RETH_OPS else None,
                        imm=0xC0FFEE if opcode in IMM_OPS else None)
    assert got == want
    assert P.ipv4_checksum(got[P.IP_OFF:P.UDP_OFF]) == 0


def test_build_frame_rejects_missing_reth() -> None:
    with pytest.raises(ValueError, match="RETH"):
        P.build_frame(dst_mac="02:00:00:00:00:01", src_mac="02:00:00:00:00:02", src_ip="1.1.1.1",
                      dst_ip="2.2.2.2", dest_qp=1, psn=0, opcode=P.Op.WRITE_FIRST, payload=b"")


def test_every_data_opcode_has_one_position() -> None:
    data_ops = set(range(P.Op.SEND_FIRST, P.Op.WRITE_ONLY_WITH_IMM + 1)) | \
        set(range(P.Op.READ_RESPONSE_FIRST, P.Op.READ_RESPONSE_ONLY + 1))
    positions = (P.FIRST_OPCODES, P.MIDDLE_OPCODES, P.LAST_OPCODES, P.ONLY_OPCODES)
    for op in data_ops:
        assert sum(op in pos for pos in positions) == 1, hex(op)
    assert P.MESSAGE_START_WRITES == {P.Op.WRITE_FIRST, P.Op.WRITE_ONLY, P.Op.WRITE_ONLY_WITH_IMM}
    assert P.MESSAGE_START_WRITES <= P.RETH_OPCODES


@pytest.mark.parametrize("opcode,ext", [(6, 16), (7, 0), (8, 0), (9, 4), (10, 16), (11, 20)])
def test_parse_write_frames(opcode: int, ext: int) -> None:
    c = make_ring(4, psn0=[0xFFFFFE, 5, 6, 7]).connections[0]
    frame = write_frame(c, 3, opcode, bytes(512), ackreq=True)
    key, udp_len, op, pad, psn, frag = P.parse(memoryview(frame))
    assert key == P.conn_key(c.src_ip, c.dst_ip, c.dst_qpn)
    assert (op, pad, psn) == (opcode, 0, 1)                      # 0xFFFFFE + 3 wraps to 1
    assert frag == 0x4000 and not P.is_fragment(frag)           # DF only
    assert udp_len == Ether(frame)[UDP].len == P.UDP_OVERHEAD + ext + 512
    assert P.EXT_LEN[opcode] == ext
    if opcode in RETH_OPS:
        assert P.reth(frame) == (0x7F00AA000000, 0x2A, 1024)


def test_parse_reads_pad_count() -> None:
    frame = write_frame(make_ring(2).connections[1], 0, 8, bytes(250), pad=2)
    assert P.parse(frame)[3] == 2 and icrc_ok(frame)


def test_parse_ack_keys_on_the_requester() -> None:
    c = make_ring(2).connections[0]
    ack = raw(Ether(src=c.dst_mac, dst=c.src_mac) / IP(src=c.dst_ip, dst=c.src_ip)
              / UDP(sport=0xC001, dport=4791, chksum=0)
              / BTH(opcode=0x11, dqpn=c.src_qpn, psn=c.psn0) / AETH(syndrome=0x1F, msn=1))
    key, _, op, _, _, _ = P.parse(ack)
    assert op == P.Op.ACKNOWLEDGE and P.EXT_LEN[op] == P.AETH_LEN
    assert key == P.conn_key(c.dst_ip, c.src_ip, c.src_qpn)


@pytest.mark.parametrize("frame", [
    raw(Ether() / ARP()),
    raw(Ether() / IP(src="10.77.0.1", dst="10.77.0.2") / TCP(dport=4791) / Raw(bytes(64))),
    raw(Ether() / IP(src="10.77.0.1", dst="10.77.0.2") / UDP(dport=4792) / Raw(bytes(64))),
    raw(Ether() / IP(src="10.77.0.1", dst="10.77.0.2", options=b"\x01" * 4)
        / UDP(dport=4791) / Raw(bytes(64))),
    bytes(57),
], ids=["arp", "tcp", "udp-other-port", "ip-options", "runt"])
def test_parse_rejects_non_roce(frame: bytes) -> None:
    assert P.parse(frame) is None


@pytest.mark.parametrize("length", [0, 4, 256, 1024, 4096, 1000])
def test_icrcs_match_one_crc_per_header(length: int) -> None:
    rng = np.random.default_rng(length)
    payload = rng.bytes(length)
    states = [int(s) for s in rng.integers(0, 2**32, 5)]
    assert P.icrcs(payload, states) == [P.pack_icrc(zlib.crc32(payload, s)) for s in states]


@pytest.mark.parametrize("flags,offset,fragment", [("DF", 0, False), ("", 0, False),
                                                    ("MF", 0, True), ("", 185, True),
                                                    ("MF", 1, True)])
def test_parse_reads_the_fragment_word(flags: str, offset: int, fragment: bool) -> None:
    pkt = Ether(write_frame(make_ring(2).connections[0], 0, 7, bytes(64)))
    pkt[IP].flags, pkt[IP].frag, pkt[IP].chksum = flags, offset, None
    frag = P.parse(raw(pkt))[5]
    assert frag == int(Ether(raw(pkt))[IP].flags) << 13 | offset
    assert P.is_fragment(frag) == fragment


@pytest.mark.parametrize("ip_id", [0, 1, 0x1234, 0xFFFF])
def test_ipv4_header_ok_agrees_with_the_checksum(ip_id: int) -> None:
    frame = bytearray(write_frame(make_ring(2).connections[1], 0, 7, bytes(64), ip_id=ip_id))
    assert P.ipv4_header_ok(frame)
    assert P.ipv4_checksum(frame[P.IP_OFF:P.UDP_OFF]) == 0      # scapy's checksum, summed
    for byte in range(P.IP_OFF, P.UDP_OFF):
        bad = bytearray(frame)
        bad[byte] ^= 0x10
        assert not P.ipv4_header_ok(bad), byte


@pytest.mark.parametrize("opcode,size", [(6, 256), (7, 0), (9, 4), (11, 128)])
def test_icrc_valid_checks_every_covered_byte(opcode: int, size: int) -> None:
    frame = write_frame(make_ring(2).connections[0], 0, opcode, bytes(range(size % 256))
                        if size < 256 else bytes(size))
    hdr_end = P.EXT_OFF + P.EXT_LEN[opcode]
    end = len(frame) - P.ICRC_LEN

    def valid(f: bytes | bytearray) -> bool:
        return P.icrc_valid(memoryview(f), hdr_end, end, P.icrc_state(f, hdr_end))

    assert valid(frame)
    masked = {P.IP_OFF + 1, P.IP_OFF + 8, P.IP_OFF + 10, P.IP_OFF + 11, P.UDP_OFF + 6,
              P.UDP_OFF + 7, P.BTH_OFF + 4}                      # TOS, TTL, checksums, FECN
    for byte in range(P.IP_OFF, len(frame)):
        bad = bytearray(frame)
        bad[byte] ^= 0x01
        assert valid(bad) == (byte in masked), byte
