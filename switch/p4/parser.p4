/* Parser: Ethernet / IPv4 (IHL 5) / UDP 4791 / BTH / RETH, ImmDt or AETH / payload / ICRC.
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
            default: accept;
        }
    }

    state parse_bth {
        pkt.extract(hdr.bth);
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

    state parse_words_start {
        meta.len_ok = 1;
        meta.words = (bit<8>)(meta.pl_bytes >> 2);
        meta.words_left = meta.words;
        transition parse_words;
    }

    state parse_words {
        transition select(meta.words_left) {
            0: parse_icrc;
            default: parse_word;
        }
    }

    state parse_word {
        pkt.extract(hdr.pl.next);
        meta.words_left = meta.words_left - 1;
        transition parse_words;
    }

    state parse_icrc {
        pkt.extract(hdr.icrc);
        transition accept;
    }
}

#endif  /* NR_PARSER_P4 */
