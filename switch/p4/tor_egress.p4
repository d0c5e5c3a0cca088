/* ToR egress (tor.p4). A ring's multicast group at a ToR holds, in this order: one result
 * replica per lane whose responder is in the rack (rid = lane, its responder's port), the
 * continuation (rid NR_CONT_RID), the partial of next_emit (rid NR_PART_A_RID, uplink), the
 * partial of the packet's k (NR_PART_B_RID, uplink) and, with an entering connection, its
 * transit copy (NR_FWD_RID, the responder's port). A pass asks for some of them (meta.emit,
 * part_a, part_b, fwd); the others are dropped here.
 *   result replicas and the continuation, served retransmissions, L2: the single switch's
 *   egress (NrEgress, egress.p4) as it is;
 *   a partial: interswitch.encode(ToR, spine, PARTIAL, tor id, ring, k, the slot's sums, the
 *   leaving connection's header at k) byte for byte: NrIsHeaders, the addresses, the sums
 *   read from slot_sum, the header kept by ingress (tor_lv_*), NrIsSign;
 *   a transit copy: untouched.
 */
#ifndef NR_TOR_EGRESS_P4
#define NR_TOR_EGRESS_P4

#include "tor_state.p4"
#include "payload.p4"
#include "interswitch.p4"
#include "egress.p4"

control NrTorEgress(inout headers_t hdr, inout meta_t meta, inout standard_metadata_t sm) {
    NrEgress() results;
    NrIsHeaders() headers;
    NrIsSign() sign;
#include "generated/pl_valid.p4"

    apply {
        bit<16> rid = sm.egress_rid;
        bool part = (rid == NR_PART_A_RID && meta.part_a == 1)
                    || (rid == NR_PART_B_RID && meta.part_b == 1);
        bool ours = rid == NR_PART_A_RID || rid == NR_PART_B_RID || rid == NR_FWD_RID;
        if (meta.mcast == 1 && part) {
            bit<24> k = meta.part_b_k;
            if (rid == NR_PART_A_RID) {
                k = meta.part_a_k;
            }
            bit<32> gslot = (bit<32>)meta.ring * NR_SLOTS + (bit<32>)(k & meta.slot_mask);
            bit<64> head;
            slot_head.read(head, gslot);
            meta.emit_words = head[31:24];
            pl_valid.apply();
            bit<32> base = gslot * NR_MAX_ELEMS;
            NR_FOR_EACH_ELEM(NR_LOAD_ELEM)
            headers.apply(hdr, IS_PARTIAL);
            hdr.eth.dst = meta.spine_mac;
            hdr.eth.src = meta.me_mac;
            hdr.ipv4.src = meta.me_ip;
            hdr.ipv4.dst = meta.spine_ip;
            hdr.bth.setInvalid();
            hdr.reth.setInvalid();
            hdr.immdt.setInvalid();
            hdr.aeth.setInvalid();
            hdr.nr_is.tor = meta.tor_id;
            hdr.nr_is.ring = meta.tag;
            hdr.nr_is.k = 8w0 ++ k;
            hdr.nr_is.length = (bit<16>)head[31:24] << 2;
            if (meta.has_leave == 1) {
                bit<8> op = head[39:32];
                hdr.nr_is.carried = 1;
                hdr.nr_carried.setValid();
                hdr.nr_carried.rank = meta.leave_rank;
                hdr.nr_carried.hlen = 54;
                hdr.rh_base.setValid();
                tor_lv_base.read(hdr.rh_base.b, gslot);
                if (op == OP_WRITE_FIRST || op == OP_WRITE_ONLY || op == OP_WRITE_ONLY_IMM) {
                    hdr.rh_e16.setValid();
                    tor_lv_e16.read(hdr.rh_e16.b, gslot);
                    hdr.nr_carried.hlen = hdr.nr_carried.hlen + RETH_LEN;
                }
                if (op == OP_WRITE_LAST_IMM || op == OP_WRITE_ONLY_IMM) {
                    hdr.rh_e4.setValid();
                    tor_lv_e4.read(hdr.rh_e4.b, gslot);
                    hdr.nr_carried.hlen = hdr.nr_carried.hlen + IMMDT_LEN;
                }
            }
            sign.apply(hdr, meta, head[31:24]);
            port_tx.count((bit<32>)sm.egress_port);
        } else if (meta.mcast == 1 && rid == NR_FWD_RID && meta.fwd == 1) {
            port_tx.count((bit<32>)sm.egress_port);
        } else if (meta.mcast == 1 && (ours || meta.emit == 0)) {
            mark_to_drop(sm);              // a replica this pass did not ask for
        } else {
            results.apply(hdr, meta, sm);
        }
    }
}

#endif  /* NR_TOR_EGRESS_P4 */
