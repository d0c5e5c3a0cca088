/* What every inter-switch message a switch sends has (switch/dataplane/interswitch.py
 * `frame_parts`), shared by the spine's totals (spine_egress.p4) and the ToR's partials
 * (tor_egress.p4): NrIsHeaders sets the constant fields, the caller the addresses, ToR id,
 * ring, k, length and carried part; NrIsSign then sets the lengths and signs the message.
 * Ethernet (IPv4), IPv4 (ToS 0, ID 0, DF, TTL 64, UDP; its checksum recomputed by
 * NrComputeChecksum), UDP 4792 -> 4792 with checksum 0, the header (version 1, reserved 0).
 */
#ifndef NR_INTERSWITCH_P4
#define NR_INTERSWITCH_P4

#include "headers.p4"
#include "iscrc.p4"

control NrIsHeaders(inout headers_t hdr, in bit<8> kind) {
    apply {
        hdr.eth.setValid();
        hdr.eth.ether_type = ETHERTYPE_IPV4;
        hdr.ipv4.setValid();
        hdr.ipv4.version = 4;
        hdr.ipv4.ihl = 5;
        hdr.ipv4.tos = 0;
        hdr.ipv4.id = 0;
        hdr.ipv4.flags = 2;        // DF
        hdr.ipv4.frag = 0;
        hdr.ipv4.ttl = 64;
        hdr.ipv4.protocol = IPPROTO_UDP;
        hdr.udp.setValid();
        hdr.udp.sport = IS_UDP_PORT;
        hdr.udp.dport = IS_UDP_PORT;
        hdr.udp.csum = 0;
        hdr.nr_is.setValid();
        hdr.nr_is.version = IS_VERSION;
        hdr.nr_is.kind = kind;
        hdr.nr_is.carried = 0;
        hdr.nr_is.reserved = 0;
        hdr.nr_carried.setInvalid();
        hdr.rh_base.setInvalid();
        hdr.rh_e16.setInvalid();
        hdr.rh_e4.setInvalid();
    }
}

/* The UDP and IPv4 lengths of a message of `words` payload words and its carried part (as
 * the headers say), and its CRC32 (the IPv4 checksum: meta.fix_ipv4). */
control NrIsSign(inout headers_t hdr, inout meta_t meta, in bit<8> words) {
    NrIsCrc() crc;

    apply {
        bit<16> carried_len = 0;
        if (hdr.nr_carried.isValid()) {
            carried_len = IS_CARRIED_LEN + hdr.nr_carried.hlen;
        }
        hdr.udp.len = UDP_LEN + IS_HEADER_LEN + hdr.nr_is.length + carried_len + ICRC_LEN;
        hdr.ipv4.total_len = IPV4_LEN + hdr.udp.len;
        meta.fix_ipv4 = 1;
        bit<32> signed;
        crc.apply(hdr, words, signed);
        hdr.icrc.setValid();
        hdr.icrc.v = signed;
    }
}

#endif  /* NR_INTERSWITCH_P4 */
