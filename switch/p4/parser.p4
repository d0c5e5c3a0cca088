/* Parser: Ethernet / IPv4 (IHL 5) / UDP 4791 / BTH / RETH, ImmDt or AETH / payload / ICRC.
 * The spine build (NR_ROLE_SPINE, spine.p4): UDP 4791 / BTH only, and UDP 4792 / inter-switch
 * header / payload / carried header / CRC32. The ToR build (NR_ROLE_TOR, tor.p4): both, in
 * full (the payload words of either kind of packet go into hdr.pl).
 *
 * Invariants: only RC RDMA WRITEs get their payload parsed, and only when it is pad-free,
 * a multiple of 4 and at most NR_MAX_ELEMS words (meta.len_ok = 1); anything not parsed
 * stays in the packet as is, so what the deparser emits for an untouched packet is the
 * packet received, byte for byte. A frame shorter than its UDP length ends with a parser
 * error (PacketTooShort), which ingress treats like a bad length.
 */
#ifndef NR_PARSER_P4
#define NR_PARSER_P4

#include "headers.p4"

parser NrParser(packet_in pkt, out headers_t hdr, inout meta_t meta,
                inout standard_metadata_t sm) {
    state start {
        pkt.extract(hdr.eth);
        transition select(hdr.eth.ether_type) {
            ETHERTYPE_IPV4: parse_ipv4;
            default: accept;
        }
    }

    state parse_ipv4 {
        pkt.extract(hdr.ipv4);
        transition select(hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.protocol) {
            (4, 5, IPPROTO_UDP): parse_udp;
            default: accept;
        }
    }

    state parse_udp {
        pkt.extract(hdr.udp);
        transition select(hdr.udp.dport) {
            ROCE_UDP_PORT: parse_bth;
#ifdef NR_INTERSWITCH
            IS_UDP_PORT: parse_is;
#endif
            default: accept;
        }
    }

    state parse_bth {
        pkt.extract(hdr.bth);
#ifdef NR_ROLE_SPINE
        transition accept;     // the spine looks up transit by the BTH's DestQP, no more
    }
#else
        meta.pl_bytes = hdr.udp.len - (UDP_LEN + BTH_LEN + ICRC_LEN);
        transition select(hdr.bth.opcode) {
            OP_WRITE_FIRST: parse_reth;
            OP_WRITE_ONLY: parse_reth;
            OP_WRITE_ONLY_IMM: parse_reth;
            OP_WRITE_LAST_IMM: parse_immdt;
            OP_WRITE_MIDDLE: parse_payload;
            OP_WRITE_LAST: parse_payload;
            OP_ACKNOWLEDGE: parse_aeth;
            default: accept;
        }
    }

    state parse_reth {
        pkt.extract(hdr.reth);
        meta.pl_bytes = meta.pl_bytes - RETH_LEN;
        transition select(hdr.bth.opcode) {
            OP_WRITE_ONLY_IMM: parse_immdt;
            default: parse_payload;
        }
    }

    state parse_immdt {
        pkt.extract(hdr.immdt);
        meta.pl_bytes = meta.pl_bytes - IMMDT_LEN;
        transition parse_payload;
    }

    state parse_aeth {
        pkt.extract(hdr.aeth);
        transition accept;
    }

    /* A UDP length too small for the headers wraps pl_bytes around: not accepted either. */
    state parse_payload {
        transition select(hdr.bth.pad, meta.pl_bytes) {
            (0, MAX_PL_BYTES): parse_words_start;
            (0, 0 &&& PL_SHORT_MASK): parse_words_start;
            default: accept;
        }
    }

#endif  /* NR_ROLE_SPINE */

#ifdef NR_INTERSWITCH
    /* An inter-switch message: its payload words (same loop as a WRITE's), at most one
     * carried header of a RoCE WRITE's lengths, the CRC32 (into hdr.icrc). Anything else
     * (a length not a multiple of 4 or above NR_MAX_PL_BYTES, more than one carried header,
     * another hlen) stops with meta.is_parsed = 0: ingress counts and drops it. */
    state parse_is {
        pkt.extract(hdr.nr_is);
        meta.is_carried = hdr.nr_is.carried;
#ifdef NR_ROLE_TOR
        meta.is_msg = 1;
#endif
        meta.pl_bytes = hdr.nr_is.length;
        transition select(hdr.nr_is.length) {
            MAX_PL_BYTES: parse_words_start;
            0 &&& PL_SHORT_MASK: parse_words_start;
            default: accept;
        }
    }

    state parse_is_tail {
        transition select(meta.is_carried) {
            0: parse_is_crc;
            1: parse_carried;
            default: accept;
        }
    }

    state parse_carried {
        pkt.extract(hdr.nr_carried);
        pkt.extract(hdr.rh_base);
        transition select(hdr.nr_carried.hlen) {
            54: parse_is_crc;
            58: parse_rh_e4;
            70: parse_rh_e16;
            74: parse_rh_e16;
            default: accept;
        }
    }

    state parse_rh_e16 {
        pkt.extract(hdr.rh_e16);
        transition select(hdr.nr_carried.hlen) {
            74: parse_rh_e4;
            default: parse_is_crc;
        }
    }

    state parse_rh_e4 {
        pkt.extract(hdr.rh_e4);
        transition parse_is_crc;
    }

    state parse_is_crc {
        pkt.extract(hdr.icrc);
        meta.is_parsed = 1;
        transition accept;
    }
#endif  /* NR_INTERSWITCH */

    state parse_words_start {
        meta.len_ok = 1;
        meta.words = (bit<8>)(meta.pl_bytes >> 2);
        meta.words_left = meta.words;
        transition parse_words;
    }

    state parse_words {
        transition select(meta.words_left) {
#if defined(NR_ROLE_SPINE)
            0: parse_is_tail;  // the spine parses the payload words of messages only
#elif defined(NR_ROLE_TOR)
            0: parse_words_end;
#else
            0: parse_icrc;
#endif
            default: parse_word;
        }
    }

    state parse_word {
        pkt.extract(hdr.pl.next);
        meta.words_left = meta.words_left - 1;
        transition parse_words;
    }

#ifdef NR_ROLE_TOR
    /* the words of a message are followed by its carried part, a WRITE's by its ICRC */
    state parse_words_end {
        transition select(meta.is_msg) {
            1: parse_is_tail;
            default: parse_icrc;
        }
    }
#endif

#ifndef NR_ROLE_SPINE
    state parse_icrc {
        pkt.extract(hdr.icrc);
        transition accept;
    }
#endif
}

#endif  /* NR_PARSER_P4 */
