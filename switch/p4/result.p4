/* A result replica rebuilt as the contribution of rank (lane) meta.replica to the emitted
 * slot meta.emit_gslot: what differs per packet from the contrib_* registers (written by
 * contribute.p4, or from a total's carried header at the ToR), the opcode and length from
 * the slot, every other field constant; addresses, DestQP and PSN are the replica table's
 * (PSN psn0 + k, moved on by the lane's re-cuts: conn_recut, rule 7a)
 * (applied by the caller before, after NrResultHeaders). The payload (the sums) is already in hdr.pl. Shared by the
 * single switch's egress (egress.p4) and the ToR's (tor_egress.p4).
 * Invariant: every header field of Ethernet, IPv4 (but the checksum: meta.fix_ipv4 has the
 * deparser recompute it), UDP (checksum 0, as rxe sends it; the ICRC masks it), BTH, RETH
 * and ImmDt is set here or by the replica table; RETH and ImmDt are valid exactly when the
 * slot's opcode has them.
 */
#ifndef NR_RESULT_P4
#define NR_RESULT_P4

#include "state.p4"

/* A result's headers, valid before the replica table writes into them (BMv2 drops writes to
 * an invalid header's fields: a ToR's total carries no BTH). */
control NrResultHeaders(inout headers_t hdr) {
    apply {
        hdr.eth.setValid();
        hdr.ipv4.setValid();
        hdr.udp.setValid();
        hdr.bth.setValid();
        hdr.aeth.setInvalid();
        hdr.icrc.setValid();
#ifdef NR_INTERSWITCH
        hdr.nr_is.setInvalid();        // a ToR's total that carries an emission
        hdr.nr_carried.setInvalid();
        hdr.rh_base.setInvalid();
        hdr.rh_e16.setInvalid();
        hdr.rh_e4.setInvalid();
#endif
    }
}

control NrResult(inout headers_t hdr, inout meta_t meta) {
    apply {
        bit<32> c = meta.emit_gslot * NR_MAX_RANKS + (bit<32>)meta.replica;
        bit<96> eth;
        contrib_eth.read(eth, c);
        bit<48> ip;
        contrib_ip.read(ip, c);
        bit<40> bth;
        contrib_bth.read(bth, c);

        hdr.eth.dst = eth[95:48];
        hdr.eth.src = eth[47:0];
        hdr.eth.ether_type = ETHERTYPE_IPV4;

        hdr.ipv4.version = 4;
        hdr.ipv4.ihl = 5;
        hdr.ipv4.tos = ip[47:40];
        hdr.ipv4.id = ip[39:24];
        hdr.ipv4.flags = ip[23:21];
        hdr.ipv4.frag = ip[20:8];
        hdr.ipv4.ttl = ip[7:0];
        hdr.ipv4.protocol = IPPROTO_UDP;

        contrib_udp.read(hdr.udp.sport, c);
        hdr.udp.dport = ROCE_UDP_PORT;
        hdr.udp.csum = 0;              // as rxe sends it; the ICRC masks it

        hdr.bth.opcode = meta.emit_opcode;
        hdr.bth.se = bth[39:39];
        hdr.bth.mig = bth[38:38];
        hdr.bth.pad = bth[37:36];
        hdr.bth.tver = bth[35:32];
        hdr.bth.pkey = bth[31:16];
        hdr.bth.fb = bth[15:8];
        hdr.bth.ackreq = bth[7:7];
        hdr.bth.resv7 = bth[6:0];
        /* rule 7a: the lane's re-cuts so far move its results on (the replica table's PSN
         * is psn0 + k) */
        bit<64> rc;
        conn_recut.read(rc, (bit<32>)meta.ring * NR_MAX_RANKS + (bit<32>)meta.replica);
        if (rc[63:48] == meta.epoch) {
            hdr.bth.psn = hdr.bth.psn + rc[47:24];
        }

        bit<16> ext = 0;
        bit<8> op = meta.emit_opcode;
        if (op == OP_WRITE_FIRST || op == OP_WRITE_ONLY || op == OP_WRITE_ONLY_IMM) {
            bit<128> reth;
            contrib_reth.read(reth, c);
            hdr.reth.setValid();
            hdr.reth.va = reth[127:64];
            hdr.reth.rkey = reth[63:32];
            hdr.reth.dma_len = reth[31:0];
            ext = ext + RETH_LEN;
        } else {
            hdr.reth.setInvalid();
        }
        if (op == OP_WRITE_LAST_IMM || op == OP_WRITE_ONLY_IMM) {
            hdr.immdt.setValid();
            contrib_imm.read(hdr.immdt.imm, c);
            ext = ext + IMMDT_LEN;
        } else {
            hdr.immdt.setInvalid();
        }
        hdr.udp.len = UDP_LEN + BTH_LEN + ext + ((bit<16>)meta.emit_words << 2) + ICRC_LEN;
        hdr.ipv4.total_len = IPV4_LEN + hdr.udp.len;
        meta.fix_ipv4 = 1;
    }
}

#endif  /* NR_RESULT_P4 */
