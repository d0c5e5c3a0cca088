/* The CRC32 of an inter-switch message (switch/dataplane/interswitch.py): zlib.crc32 over
 * header (16 bytes) | payload (n words) | carried (rank, hlen, hlen bytes), stored
 * little-endian. One control, used to verify a message (NrIsVerify below: a partial at the
 * spine, a total at a ToR) and to sign one (a total in spine egress, a partial in ToR egress).
 *
 * v1model's hash(HashAlgorithm.crc32) is zlib.crc32 of its fields packed back to back (as
 * icrc.p4 relies on). Two facts of the reflected CRC-32 make it compute this one:
 *  1. Processing a 32-bit word d from register r equals processing d XOR r (the register's
 *     low byte against the first byte) from register 0; 4 bytes of ones take the initial
 *     register 0xFFFFFFFF to 0, and zero bytes keep it 0. So hash(ones | zero words | X')
 *     = zlib.crc32(X) when X' is X with its FIRST word XORed with 0xFFFFFFFF. The header
 *     (w0..w3, w0 so XORed) and the n payload words are right-aligned in the buffer
 *     b0..b67 by the generated per-length actions of iscrc_words.p4, as for the ICRC:
 *     h1 = zlib.crc32(header | payload).
 *  2. Chaining: after h1 the register is r = ~h1. The carried part (4 + hlen bytes, a
 *     fixed size per hlen: 54, 58, 70, 74) is hashed as ones | (its first 4 bytes XOR r
 *     byte-reversed: wire byte 0 is a bit<32>'s MSB, r's low byte is processed first) |
 *     the rest: the CRC of the whole, one struct per hlen.
 * Checked in Python before it was written (zlib), and by the spine's conformance vectors.
 */
#ifndef NR_ISCRC_P4
#define NR_ISCRC_P4

#include "headers.p4"

struct iscrc_buf_t {
    bit<32> ones;
    bit<32> b0; bit<32> b1; bit<32> b2; bit<32> b3; bit<32> b4; bit<32> b5; bit<32> b6; bit<32> b7;
    bit<32> b8; bit<32> b9; bit<32> b10; bit<32> b11; bit<32> b12; bit<32> b13; bit<32> b14; bit<32> b15;
    bit<32> b16; bit<32> b17; bit<32> b18; bit<32> b19; bit<32> b20; bit<32> b21; bit<32> b22; bit<32> b23;
    bit<32> b24; bit<32> b25; bit<32> b26; bit<32> b27; bit<32> b28; bit<32> b29; bit<32> b30; bit<32> b31;
    bit<32> b32; bit<32> b33; bit<32> b34; bit<32> b35; bit<32> b36; bit<32> b37; bit<32> b38; bit<32> b39;
    bit<32> b40; bit<32> b41; bit<32> b42; bit<32> b43; bit<32> b44; bit<32> b45; bit<32> b46; bit<32> b47;
    bit<32> b48; bit<32> b49; bit<32> b50; bit<32> b51; bit<32> b52; bit<32> b53; bit<32> b54; bit<32> b55;
    bit<32> b56; bit<32> b57; bit<32> b58; bit<32> b59; bit<32> b60; bit<32> b61; bit<32> b62; bit<32> b63;
    bit<32> b64; bit<32> b65; bit<32> b66; bit<32> b67;
}

/* the carried part after the 4 bytes of ones: c0 = (rank | hlen) XOR byte-reversed ~h1 */
struct iscrc_c54_t { bit<32> ones; bit<32> c0; bit<432> base; }
struct iscrc_c58_t { bit<32> ones; bit<32> c0; bit<432> base; bit<32> e4; }
struct iscrc_c70_t { bit<32> ones; bit<32> c0; bit<432> base; bit<128> e16; }
struct iscrc_c74_t { bit<32> ones; bit<32> c0; bit<432> base; bit<128> e16; bit<32> e4; }

control NrIsCrc(in headers_t hdr, in bit<8> words, out bit<32> crc_le) {
    bit<32> w0; bit<32> w1; bit<32> w2; bit<32> w3;
    iscrc_buf_t buf;     // the hashed buffer (iscrc_words.p4 fills b0..b67)
    iscrc_c54_t c54;
    iscrc_c58_t c58;
    iscrc_c70_t c70;
    iscrc_c74_t c74;

#include "generated/iscrc_words.p4"

    apply {
        bit<32> ones = 32w0xFFFFFFFF;
        w0 = (hdr.nr_is.version ++ hdr.nr_is.kind ++ hdr.nr_is.tor ++ hdr.nr_is.carried) ^ ones;
        w1 = hdr.nr_is.ring;
        w2 = hdr.nr_is.k;
        w3 = hdr.nr_is.length ++ hdr.nr_is.reserved;
        by_words.apply();    // an entry for every word count the parser accepts (0 .. 64)
        buf.ones = ones;
        bit<32> crc;
        hash(crc, HashAlgorithm.crc32, 32w0, buf, 64w0x100000000);
        if (hdr.nr_carried.isValid() && hdr.rh_base.isValid()) {   // valid together
            bit<32> r = ~crc;
            bit<32> c0 = (hdr.nr_carried.rank ++ hdr.nr_carried.hlen)
                         ^ (r[7:0] ++ r[15:8] ++ r[23:16] ++ r[31:24]);
            if (hdr.rh_e16.isValid() && hdr.rh_e4.isValid()) {
                c74.ones = ones; c74.c0 = c0; c74.base = hdr.rh_base.b;
                c74.e16 = hdr.rh_e16.b; c74.e4 = hdr.rh_e4.b;
                hash(crc, HashAlgorithm.crc32, 32w0, c74, 64w0x100000000);
            } else if (hdr.rh_e16.isValid()) {
                c70.ones = ones; c70.c0 = c0; c70.base = hdr.rh_base.b; c70.e16 = hdr.rh_e16.b;
                hash(crc, HashAlgorithm.crc32, 32w0, c70, 64w0x100000000);
            } else if (hdr.rh_e4.isValid()) {
                c58.ones = ones; c58.c0 = c0; c58.base = hdr.rh_base.b; c58.e4 = hdr.rh_e4.b;
                hash(crc, HashAlgorithm.crc32, 32w0, c58, 64w0x100000000);
            } else {
                c54.ones = ones; c54.c0 = c0; c54.base = hdr.rh_base.b;
                hash(crc, HashAlgorithm.crc32, 32w0, c54, 64w0x100000000);
            }
        }
        crc_le = crc[7:0] ++ crc[15:8] ++ crc[23:16] ++ crc[31:24];   // little-endian on the wire
    }
}

/* The checks interswitch.decode makes, in its order, as far as the program parses a message
 * (shared by the spine's and the ToR's ingress). verdict: IS_CORRUPT for a frame shorter
 * than its header, payload or carried header, a bad version, reserved field, k, kind or
 * length, a UDP length unlike what was parsed, or a wrong CRC32; IS_UNSUPPORTED for one
 * that checks out as far as parsed but was not parsed whole (a payload above
 * NR_MAX_PL_BYTES, more than one carried header or another hlen: its CRC32 is beyond what
 * this program hashes); IS_OK otherwise. */
control NrIsVerify(in headers_t hdr, in meta_t meta, in standard_metadata_t sm,
                   out bit<2> verdict) {
    NrIsCrc() crc;

    apply {
        verdict = IS_OK;
        if (sm.parser_error != error.NoError) {
            verdict = IS_CORRUPT;    // shorter than its header, payload or carried header
        } else if (hdr.nr_is.version != IS_VERSION || hdr.nr_is.reserved != 0
                   || hdr.nr_is.k[31:24] != 0 || hdr.nr_is.length[1:0] != 0
                   || (hdr.nr_is.kind != IS_PARTIAL && hdr.nr_is.kind != IS_TOTAL)) {
            verdict = IS_CORRUPT;
        } else if (meta.is_parsed == 0) {
            if ((bit<32>)hdr.udp.len + (bit<32>)(IPV4_LEN + 14) > sm.packet_length) {
                verdict = IS_CORRUPT;
            } else {
                verdict = IS_UNSUPPORTED;
            }
        } else {
            bit<16> carried_len = 0;
            if (hdr.nr_carried.isValid()) {
                carried_len = IS_CARRIED_LEN + hdr.nr_carried.hlen;
            }
            if (hdr.udp.len != UDP_LEN + IS_HEADER_LEN + hdr.nr_is.length + carried_len
                               + ICRC_LEN) {
                verdict = IS_CORRUPT;    // bytes before the CRC32 that are none of the above
            } else {
                bit<32> want;
                crc.apply(hdr, meta.words, want);
                if (want != hdr.icrc.v) {
                    verdict = IS_CORRUPT;
                }
            }
        }
    }
}

#endif  /* NR_ISCRC_P4 */
