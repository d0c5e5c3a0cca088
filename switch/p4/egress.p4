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
#include "result.p4"

control NrEgress(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    NrIcrc() icrc;
    NrResultHeaders() result_headers;
    NrResult() result;

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
            result_headers.apply(hdr);
            if (replica_table.apply().hit) {
                result.apply(hdr, meta);
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
