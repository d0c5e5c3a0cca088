/* Checksum controls and the deparser.
 *
 * The IPv4 checksum of every IPv4 packet is verified (sets checksum_error, see
 * NrVerifyChecksum) and recomputed only for rebuilt results (meta.fix_ipv4): forwarded and
 * served packets keep the IPv4 header they came with, checksum included. The deparser
 * emits headers in wire order; invalid ones (and payload words beyond the packet's) are
 * skipped by emit.
 */
#ifndef NR_DEPARSER_P4
#define NR_DEPARSER_P4

#include "headers.p4"

/* The IPv4 header's 16-bit words but the checksum (IHL 5: the parser takes no options). */
#define NR_IPV4_CSUM_FIELDS                                                              \
    { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.tos, hdr.ipv4.total_len, hdr.ipv4.id,     \
      hdr.ipv4.flags, hdr.ipv4.frag, hdr.ipv4.ttl, hdr.ipv4.protocol,                    \
      hdr.ipv4.src, hdr.ipv4.dst }

/* Sets standard_metadata.checksum_error for an IPv4 header whose checksum is wrong; only
 * a packet of a registered connection is dropped for it (aggregate.p4, drop_bad_ipcsum),
 * everything else is forwarded as it came. */
control NrVerifyChecksum(inout headers_t hdr, inout meta_t meta) {
    apply {
        verify_checksum(
            hdr.ipv4.isValid(),
            NR_IPV4_CSUM_FIELDS,
            hdr.ipv4.csum,
            HashAlgorithm.csum16);
    }
}

control NrComputeChecksum(inout headers_t hdr, inout meta_t meta) {
    apply {
        update_checksum(
            meta.fix_ipv4 == 1,
            NR_IPV4_CSUM_FIELDS,
            hdr.ipv4.csum,
            HashAlgorithm.csum16);
    }
}

control NrDeparser(packet_out pkt, in headers_t hdr) {
    apply {
        pkt.emit(hdr.eth);
        pkt.emit(hdr.ipv4);
        pkt.emit(hdr.udp);
        pkt.emit(hdr.bth);
        pkt.emit(hdr.reth);
        pkt.emit(hdr.immdt);
        pkt.emit(hdr.aeth);
#ifdef NR_INTERSWITCH
        pkt.emit(hdr.nr_is);
#endif
        pkt.emit(hdr.pl);
#ifdef NR_INTERSWITCH
        pkt.emit(hdr.nr_carried);
        pkt.emit(hdr.rh_base);
        pkt.emit(hdr.rh_e16);
        pkt.emit(hdr.rh_e4);
#endif
        pkt.emit(hdr.icrc);
    }
}

#endif  /* NR_DEPARSER_P4 */
