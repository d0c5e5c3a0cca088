/* The ICRC of a RoCEv2 WRITE as rxe computes and checks it (docs/pipeline.md, "ICRC"):
 * CRC-32 over 8 bytes of ones | IPv4 header with TOS, TTL, checksum as ones | UDP header
 * with checksum as ones | BTH with byte 4 as ones | RETH | ImmDt | payload (no pad: ring
 * packets have none). One control, one set of field lists, used twice: to verify a
 * contribution (ingress, aggregate.p4) and to sign a result or a served retransmission
 * (egress).
 *
 * Why it is built this way. v1model's hash() hashes every field of its list, and BMv2
 * reads a field of an invalid header (an absent RETH or ImmDt, a payload word beyond the
 * packet's) as whatever it holds: one fixed list over all headers hashes bytes rxe never
 * sees. So the list holds only what the packet has:
 *  - the header part (the second 4 bytes of ones, the masked IPv4, UDP and BTH, and the
 *    RETH and ImmDt the packet has: 11 to 16 words) is copied into the 16 words w0..w15,
 *    right-aligned, the words before it 0. It is hashed right behind 4 bytes of ones:
 *    after those the CRC-32 register is 0 (they cancel its initial value) and zero bytes
 *    keep a zero register at 0, so the leading zero words change nothing;
 *  - the payload: one hash() per payload length 0 .. NR_MAX_ELEMS words, each listing
 *    exactly that many words, run by the const table `by_words` (icrc_words.p4, generated
 *    by `python -m switch.p4program --generate`).
 * Alternatives measured or tried: the header part as one right-aligned 512-bit field
 * (wide-integer arithmetic made BMv2 about 1.5x slower per packet); one hash() per
 * extension-header combination and length (4x the actions: p4c took 4x as long and
 * warned on every RETH/ImmDt read in them); a variable shift of the payload (does not
 * compile: BMv2 shifts by at most 8 bits, p4c types are at most 2048 bits wide).
 */
#ifndef NR_ICRC_P4
#define NR_ICRC_P4

#include "headers.p4"

/* The 16 header-part words, in hash order (used by icrc_words.p4). */
#define NR_ICRC_PRE w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10, w11, w12, w13, w14, w15

#define NR_ICRC_SET_PRE(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15) \
    w0 = a0; w1 = a1; w2 = a2; w3 = a3; w4 = a4; w5 = a5; w6 = a6; w7 = a7;                   \
    w8 = a8; w9 = a9; w10 = a10; w11 = a11; w12 = a12; w13 = a13; w14 = a14; w15 = a15;

control NrIcrc(in headers_t hdr, in bit<8> words, out bit<32> icrc) {
    bit<32> w0;  bit<32> w1;  bit<32> w2;  bit<32> w3;
    bit<32> w4;  bit<32> w5;  bit<32> w6;  bit<32> w7;
    bit<32> w8;  bit<32> w9;  bit<32> w10; bit<32> w11;
    bit<32> w12; bit<32> w13; bit<32> w14; bit<32> w15;
    bit<32> crc;

#include "icrc_words.p4"

    apply {
        /* the 4 bytes of ones and the masked IPv4 (5 words), UDP (2) and BTH (3) */
        bit<32> ones = 32w0xFFFFFFFF;
        bit<32> ip0 = hdr.ipv4.version ++ hdr.ipv4.ihl ++ 8w0xFF ++ hdr.ipv4.total_len;
        bit<32> ip1 = hdr.ipv4.id ++ hdr.ipv4.flags ++ hdr.ipv4.frag;
        bit<32> ip2 = 8w0xFF ++ hdr.ipv4.protocol ++ 16w0xFFFF;
        bit<32> ip3 = hdr.ipv4.src;
        bit<32> ip4 = hdr.ipv4.dst;
        bit<32> udp0 = hdr.udp.sport ++ hdr.udp.dport;
        bit<32> udp1 = hdr.udp.len ++ 16w0xFFFF;
        bit<32> bth0 = hdr.bth.opcode ++ hdr.bth.se ++ hdr.bth.mig ++ hdr.bth.pad
                       ++ hdr.bth.tver ++ hdr.bth.pkey;
        bit<32> bth1 = 8w0xFF ++ hdr.bth.dqpn;
        bit<32> bth2 = hdr.bth.ackreq ++ hdr.bth.resv7 ++ hdr.bth.psn;
        if (hdr.reth.isValid() && hdr.immdt.isValid()) {
            NR_ICRC_SET_PRE(ones, ip0, ip1, ip2, ip3, ip4, udp0, udp1, bth0, bth1, bth2,
                            hdr.reth.va[63:32], hdr.reth.va[31:0], hdr.reth.rkey,
                            hdr.reth.dma_len, hdr.immdt.imm)
        } else if (hdr.reth.isValid()) {
            NR_ICRC_SET_PRE(0, ones, ip0, ip1, ip2, ip3, ip4, udp0, udp1, bth0, bth1, bth2,
                            hdr.reth.va[63:32], hdr.reth.va[31:0], hdr.reth.rkey,
                            hdr.reth.dma_len)
        } else if (hdr.immdt.isValid()) {
            NR_ICRC_SET_PRE(0, 0, 0, 0, ones, ip0, ip1, ip2, ip3, ip4, udp0, udp1, bth0, bth1,
                            bth2, hdr.immdt.imm)
        } else {
            NR_ICRC_SET_PRE(0, 0, 0, 0, 0, ones, ip0, ip1, ip2, ip3, ip4, udp0, udp1, bth0,
                            bth1, bth2)
        }
        crc = 0;         // by_words has an entry for every word count the parser accepts
        by_words.apply();
        icrc = crc[7:0] ++ crc[15:8] ++ crc[23:16] ++ crc[31:24];   // little-endian on the wire
    }
}

#endif  /* NR_ICRC_P4 */
