/* Checksum controls and the deparser.
 *
 * The IPv4 checksum is recomputed only for rebuilt results (meta.fix_ipv4): forwarded and
 * served packets keep the IPv4 header they came with, checksum included. The deparser
 * emits headers in wire order; invalid ones (and payload words beyond the packet's) are
 * skipped by emit.
 */
#ifndef NR_DEPARSER_P4
#define NR_DEPARSER_P4

#include "headers.p4"

control NrVerifyChecksum(inout headers_t hdr, inout meta_t meta) {
    apply { }
}

control NrComputeChecksum(inout headers_t hdr, inout meta_t meta) {
    apply {
        update_checksum(
            meta.fix_ipv4 == 1,
            { hdr.ipv4.version, hdr.ipv4.ihl, hdr.ipv4.tos, hdr.ipv4.total_len, hdr.ipv4.id,
              hdr.ipv4.flags, hdr.ipv4.frag, hdr.ipv4.ttl, hdr.ipv4.protocol,
              hdr.ipv4.src, hdr.ipv4.dst },
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
        pkt.emit(hdr.pl);
        pkt.emit(hdr.icrc);
    }
}

#endif  /* NR_DEPARSER_P4 */
