/* Egress: per-replica rewrite of an emitted result, the continuation, the ICRC.
 *
 * A ring's multicast group holds one replica per rank r (port: the responder of
 * connection r, rid r) and one continuation replica (rid NR_CONT_RID). Replica r is
 * rebuilt as rank r's own contribution to the emitted slot: addresses, DestQP and psn0
 * from replica_table, what differs per packet from the contrib_* registers, the
 * opcode/length from the slot, PSN = psn0 + k; the payload (the sums) was set in
 * ingress. The result: rank r's packet at k byte for byte, payload and ICRC replaced and
 * UDP checksum 0 (as rxe sends it; the ICRC masks it); the IPv4 checksum is recomputed
 * over an unchanged header. The continuation replica is rebuilt as rank 0's result too,
 * so that the packet it recirculates is well formed (lengths matching its payload) and
 * parses whole again; it is never sent.
 *
 * Table (programmed by switch/control/bmv2.py):
 *   replica_table <ring, rank> -> set_replica(src_ip, dst_ip, dest_qp, psn0)
 */
#ifndef NR_EGRESS_P4
#define NR_EGRESS_P4

#include "state.p4"
#include "payload.p4"
#include "icrc.p4"

control NrEgress(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    NrIcrc() icrc;

    action set_replica(bit<32> src_ip, bit<32> dst_ip, bit<24> dest_qp, bit<24> psn0) {
        hdr.ipv4.src = src_ip;
        hdr.ipv4.dst = dst_ip;
        hdr.bth.dqpn = dest_qp;
        hdr.bth.psn = psn0 + meta.emit_k;
    }

    table replica_table {
        key = {
            meta.ring: exact @name("ring");
            meta.replica: exact @name("rank");
        }
        actions = { set_replica; @defaultonly NoAction; }
        default_action = NoAction();
        size = NR_CONNS;
    }

    apply {
        bool sent = true;
        if (meta.emit == 1) {
            meta.replica = sm.egress_rid;
            if (sm.egress_rid == NR_CONT_RID) {
                meta.replica = 0;
            }
            hdr.eth.setValid();
            hdr.ipv4.setValid();
            hdr.udp.setValid();
            hdr.bth.setValid();
            hdr.aeth.setInvalid();
            hdr.icrc.setValid();
            if (replica_table.apply().hit) {
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
                if (sm.egress_rid != NR_CONT_RID) {
                    meta.fix_icrc = 1;     // a continuation is never sent: no ICRC needed
                }
            } else {
                mark_to_drop(sm);          // the ring was unregistered meanwhile
                sent = false;
            }
            if (sm.egress_rid == NR_CONT_RID) {
                if (sent && meta.cont == 1) {
                    recirculate_preserving_field_list(NR_FL_CONTINUE);
                } else {
                    mark_to_drop(sm);
                }
                sent = false;
            } else if (sent) {
                ring_ctr.count((bit<32>)meta.ring * NR_CTRS + NR_CTR_RESULTS_SENT);
            }
        } else if (meta.flood == 1 && sm.egress_port == sm.ingress_port) {
            mark_to_drop(sm);
            sent = false;
        }

        if (meta.fix_icrc == 1) {
            /* into a local: with hdr.icrc.v as the out argument p4c copied all of hdr (an
             * `in` argument it aliases) into a second set of 71 headers per packet */
            bit<32> signed;
            icrc.apply(hdr, meta.emit == 1 ? meta.emit_words : meta.words, signed);
            hdr.icrc.v = signed;
        }

        if (sent) {
            port_tx.count((bit<32>)sm.egress_port);
        }
    }
}

#endif  /* NR_EGRESS_P4 */
