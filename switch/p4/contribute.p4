/* Rule 7's "add": a verified packet's contribution to its slot. Shared by the single switch
 * (aggregate.p4) and the ToR (tor_ingress.p4).
 *
 * Adds the packet's words to the slot's sums (meta.fresh: the packet (re)opened the slot,
 * its words start them), sets its bit in the slot's bitmap and keeps what differs per
 * packet and per connection in the contrib_* registers (egress rebuilds the rank's result
 * from them, result.p4); a FIRST or ONLY also opens a message (conn_reth, `messages`).
 * Needs meta.ring, rank, conn (ingress); the caller counts the outcome.
 */
#ifndef NR_CONTRIBUTE_P4
#define NR_CONTRIBUTE_P4

#include "state.p4"
#include "payload.p4"


control NrContribute(inout headers_t hdr, inout meta_t meta, in bit<32> gslot,
                     in bit<32> bitmap) {
    apply {
        bit<32> base = gslot * NR_MAX_ELEMS;
        bit<32> acc;
        bit<32> keep = 32w0xFFFFFFFF;
        if (meta.fresh == 1) {
            keep = 0;
        }
        NR_FOR_EACH_ELEM(NR_ADD_ELEM)
        slot_bitmap.write(gslot, bitmap | (32w1 << meta.rank));
        bit<32> c = gslot * NR_MAX_RANKS + (bit<32>)meta.rank;
        contrib_eth.write(c, hdr.eth.dst ++ hdr.eth.src);
        contrib_ip.write(c, hdr.ipv4.tos ++ hdr.ipv4.id ++ hdr.ipv4.flags
                            ++ hdr.ipv4.frag ++ hdr.ipv4.ttl);
        contrib_udp.write(c, hdr.udp.sport);
        contrib_bth.write(c, hdr.bth.se ++ hdr.bth.mig ++ hdr.bth.pad ++ hdr.bth.tver
                             ++ hdr.bth.pkey ++ hdr.bth.fb ++ hdr.bth.ackreq
                             ++ hdr.bth.resv7);
        if (hdr.reth.isValid()) {
            bit<128> reth = hdr.reth.va ++ hdr.reth.rkey ++ hdr.reth.dma_len;
            contrib_reth.write(c, reth);
            /* a FIRST or ONLY opens a message */
            conn_reth.write(meta.conn, reth);
            conn_ctr.count(meta.conn * NR_CTRS + NR_CTR_MESSAGES);
        }
        if (hdr.immdt.isValid()) {
            contrib_imm.write(c, hdr.immdt.imm);
        }
    }
}

#endif  /* NR_CONTRIBUTE_P4 */
